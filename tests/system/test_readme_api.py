"""The README's Python API snippet runs as written, from the repository root."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_readme_python_snippet_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python API"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", snippet], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Own child: in married couple family" in out and "PH3_DATA_CELL_LABEL" in out
    assert "refused: these records were already released: run " in out
    assert "table levels match the logged variances and noisy digests" in out
    assert "[debug" not in out and "[info" not in out  # the library is quiet until configured


def test_the_public_api_is_small_lazy_and_complete() -> None:
    """``import phsafe`` loads no heavy module; every exported name resolves."""
    code = ("import sys, phsafe; heavy = [m for m in ('phsafe.engine', 'great_expectations', 'opendp', 'pandas') "
            "if m in sys.modules]; print(heavy); print(sorted(phsafe.__all__))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "[]", done.stdout + done.stderr
    import phsafe

    for name in phsafe.__all__:
        assert getattr(phsafe, name) is not None, name
    assert callable(phsafe.run_private) and callable(phsafe.read_release)
