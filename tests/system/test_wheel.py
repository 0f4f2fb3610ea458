"""The built wheel, installed into a fresh virtual environment, validates the demo data.

``pip install .`` anywhere must work without the repository: the suites ship inside the
package, the templates too, and nothing but ``phsafe`` lands in site-packages (``flows`` and
``tasks`` are the repository's Prefect project, not installed packages). The environment is
built with uv from ``requirements.lock`` (the packages ``make env`` already fetched).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"
DEMO_US = REPO / "demo" / "data" / "us"
END_TO_END = REPO.parent / "shared" / "fixtures" / "reference" / "end_to_end_test1"


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    # Without PYTHONDONTWRITEBYTECODE: the fresh environment has no compiled modules, and the
    # second command would compile again every module the first one compiled (pandas, Great
    # Expectations, ...) -- seconds of CPU each, nothing this test checks.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PHSAFE_EXPECTATIONS_DIR", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_in_a_fresh_environment_validates_the_demo_data(tmp_path: Path) -> None:
    assert UV.exists(), f"uv is installed in the environment by `make env` ({UV})"
    dist, venv, elsewhere = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # sdist, then the wheel from the unpacked sdist: nothing stale from a build/ folder.
    built = _run([UV, "build", "--quiet", "--out-dir", dist, REPO], cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = list(dist.glob("phsafe-*.whl"))
    assert len(wheels) == 1
    for step in (
        [UV, "venv", "--quiet", "--python", sys.executable, venv],
        [UV, "pip", "install", "--quiet", "--python", venv / "bin" / "python", "-r", REPO / "requirements.lock"],
        [UV, "pip", "install", "--quiet", "--python", venv / "bin" / "python", "--no-deps", wheels[0]],
    ):
        done = _run(step, cwd=tmp_path)
        assert done.returncode == 0, (step, done.stderr[-3000:])

    site = next((venv / "lib").glob("python3*/site-packages"))
    installed = {p.name for p in site.iterdir()}
    assert "phsafe" in installed and not {"flows", "tasks", "deployments", "expectations"} & installed
    assert sorted(p.name for p in (site / "phsafe" / "expectations").glob("*.json")) == \
        sorted(p.name for p in (REPO / "expectations").glob("*.json"))
    top_level = next(site.glob("phsafe-*.dist-info")) / "top_level.txt"
    if top_level.exists():
        assert top_level.read_text().split() == ["phsafe"]

    where = _run([venv / "bin" / "python", "-c",
                  "from phsafe.validation._suites import suites_dir; print(suites_dir())"], cwd=elsewhere)
    assert Path(where.stdout.strip()) == site / "phsafe" / "expectations", where.stderr

    phsafe = venv / "bin" / "phsafe"
    good = _run([phsafe, "validate", DEMO_US / "config.json", DEMO_US, "--report-dir", elsewhere / "report"],
                cwd=elsewhere)
    assert good.returncode == 0, good.stderr[-3000:]
    assert "inputs are valid" in good.stdout
    assert (elsewhere / "report" / "inputs" / "data_docs" / "persons.html").read_text().startswith("<!DOCTYPE html>")
    # The installed suites really run: the reference fixture breaks their rules.
    bad = _run([phsafe, "validate", END_TO_END / "config.json", END_TO_END], cwd=elsewhere)
    assert bad.returncode == 1, bad.stderr[-3000:]
    assert "units.csv [RTYPE, HHT]" in bad.stderr and "input validation failed" in bad.stderr, bad.stderr[-3000:]
