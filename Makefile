# The README's two commands are `make demo` and `make test`; both build the environment first.
PYTHON ?= python3
VENV := .venv
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast env clean bench chromium

env: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode -r requirements.lock
	$(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python demo/run_demo.py

test: $(STAMP) chromium
	$(VENV)/bin/python -m pytest -n 2 --durations=15

# The unit lane alone: no subprocess, no server, no command run end to end (under 2 minutes).
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 tests/unit

# The browser tests drive Debian's chromium (Playwright cannot download its own browser here).
# Installed when missing and we are root; otherwise those tests fail saying what to install.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  { echo "installing Debian's chromium for the browser tests ..."; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null; }; } ; } || true

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_private.py --persons 1000000

clean:
	rm -rf $(VENV)
