# The README's two commands are `make demo` and `make test`; both build the environment first.
PYTHON ?= python3
VENV := .venv
UV_VERSION := 0.13.9
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast env clean bench chromium provenance

# A service user must be able to run the venv's python: in production build it with the
# system's (`make env PYTHON=/usr/bin/python3`), never one under a home folder others cannot
# enter (pyenv's under /root); `make env` says so when the venv's python is out of their reach.
env: $(STAMP) provenance

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode -r requirements.lock
	$(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode --no-deps -e .
	touch $(STAMP)

# The install stamp: which commit this is and whether the tracked code differs from it, written
# into the package (phsafe/_stamp.json) for runs to record -- every time, as the checkout's
# owner, since a checkout moves on without the dependencies changing (phsafe/provenance.py).
provenance: $(STAMP)
	@$(VENV)/bin/python -m phsafe.provenance stamp

demo: env
	$(VENV)/bin/python demo/run_demo.py

# --dist loadscope: a module's tests on one worker, so that its module-scoped fixtures (a release,
# a ledger with its log and witnesses, a folder of reports) are built once, not once per worker;
# --no-loadscope-reorder: modules in collection order, the longest first (tests/conftest.py).
test: env chromium
	$(VENV)/bin/python -m pytest -n 2 --dist loadscope --no-loadscope-reorder --durations=15

# The unit lane alone: no subprocess, no server, no command run end to end (at most a minute on
# the quiet 2-core machine). --dist loadscope, as `make test`: a module's tests on one worker, so
# that each worker imports only its modules' libraries (Great Expectations, OpenDP) and builds their
# module fixtures once -- 6-8 CPU-s and 4-7 s less than tests spread one by one.
test-fast: env
	$(VENV)/bin/python -m pytest -n 2 --dist loadscope tests/unit

# The browser tests drive Debian's chromium (Playwright cannot download its own browser here).
# Installed when missing and we are root; otherwise those tests fail saying what to install.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  { echo "installing Debian's chromium for the browser tests ..."; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null; }; } ; } || true

bench: env
	$(VENV)/bin/python benchmarks/bench_private.py --persons 1000000

clean:
	rm -rf $(VENV)
