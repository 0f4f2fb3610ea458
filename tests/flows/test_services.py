"""The service definitions in deployments/systemd, checked as far as a machine without a running
systemd allows: ``systemd-analyze verify`` on the units installed into the layout the README
describes (``/opt/phsafe`` = this repository with its .venv, ``/etc/phsafe`` = the environment
files), and what the units promise: restart policies, every ExecStart binary, WorkingDirectory
and EnvironmentFile present, telemetry off, the database password for the server only."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deployments" / "systemd"
UNITS = ("prefect-server.service", "prefect-worker.service")
INSTALL_ROOT = Path("/opt/phsafe")  # README: the repository, built with `make env`
CONFIG_DIR = Path("/etc/phsafe")  # README: deployments/systemd/*.env installed here


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (systemd allows a key more than once, e.g. EnvironmentFile)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{path.name}: {line!r} outside a section"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _env(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key) and not re.search(r"[\s'\"]", value), line
            pairs[key] = value
    return pairs


def _installed(path: str, env_dir: Path) -> Path:
    """Where a path named in a unit is in this test's copy of the README's layout."""
    p = Path(path.lstrip("-"))
    if p.is_relative_to(INSTALL_ROOT):
        return REPO / p.relative_to(INSTALL_ROOT)
    if p.is_relative_to(CONFIG_DIR):
        return env_dir / p.relative_to(CONFIG_DIR)
    return p


@pytest.fixture
def env_dir(tmp_path) -> Path:
    """/etc/phsafe as the README installs it: the environment files from deployments/systemd."""
    target = tmp_path / "etc-phsafe"
    target.mkdir()
    for env_file in SYSTEMD.glob("*.env"):
        shutil.copy(env_file, target / env_file.name)
    return target


@pytest.mark.parametrize("name", UNITS)
def test_unit_names_only_what_the_layout_holds(name, env_dir):
    unit = _unit(SYSTEMD / name)
    service = unit["Service"]
    assert service["Restart"][0] in ("on-failure", "always"), "a service must restart"
    assert service["User"] == ["phsafe"] and service["Group"] == ["phsafe"]
    assert _installed(service["WorkingDirectory"][0], env_dir) == REPO
    executable = _installed(shlex.split(service["ExecStart"][0])[0], env_dir)
    assert executable.is_file() and os.access(executable, os.X_OK), executable
    env_files = [_installed(p, env_dir) for p in service["EnvironmentFile"]]
    assert all(p.is_file() for p in env_files), env_files
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    env = {k: v for p in env_files for k, v in _env(p).items()}
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and env["DO_NOT_TRACK"] == "1"
    assert env["PREFECT_API_URL"].startswith("http://127.0.0.1:")
    # Only the server holds the database password; the worker and its flow runs never see it.
    holds_database = "PREFECT_API_DATABASE_CONNECTION_URL" in env
    assert holds_database is (name == "prefect-server.service")


def test_server_and_worker_agree_with_each_other_and_with_the_deployments(env_dir):
    shared = _env(SYSTEMD / "prefect.env")
    server = _env(SYSTEMD / "prefect-server.env")
    assert server["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://prefect:")
    assert shared["PREFECT_API_URL"] == (f"http://{server['PREFECT_SERVER_API_HOST']}:"
                                         f"{server['PREFECT_SERVER_API_PORT']}/api")
    worker = shlex.split(_unit(SYSTEMD / "prefect-worker.service")["Service"]["ExecStart"][0])
    pool = worker[worker.index("--pool") + 1]
    deployments = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]
    assert {d["work_pool"]["name"] for d in deployments} == {pool}
    assert worker[worker.index("--type") + 1] == "process"
    # The environment files read the same in a shell (operators: set -a; . /etc/phsafe/prefect.env).
    for name, pairs in (("prefect.env", shared), ("prefect-server.env", server)):
        shell = subprocess.run(["bash", "-c", f"set -a; . {env_dir / name}; env -0"], capture_output=True,
                               env={"PATH": os.environ["PATH"]}, check=True).stdout.decode()
        exported = dict(item.split("=", 1) for item in shell.split("\0") if "=" in item)
        assert {k: exported.get(k) for k in pairs} == pairs


def test_systemd_analyze_verify(tmp_path, env_dir):
    """The units, with the README's paths mapped onto this checkout, pass `systemd-analyze verify`
    without a warning (syntax, unknown keys, executables)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: `apt-get install -y systemd` (Debian) to check the units")
    rendered = tmp_path / "units"
    rendered.mkdir()
    for name in UNITS:
        text = (SYSTEMD / name).read_text()
        text = text.replace(str(INSTALL_ROOT), str(REPO)).replace(str(CONFIG_DIR), str(env_dir))
        (rendered / name).write_text(text)
    result = subprocess.run([analyze, "verify", "--man=no", *(str(rendered / n) for n in UNITS)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), \
        result.stdout + result.stderr

    drop_in = _unit(SYSTEMD / "postgresql@.service.d" / "phsafe-restart.conf")
    assert drop_in["Service"]["Restart"] == ["on-failure"]


def test_readme_installs_every_file_and_orders_edit_deploy_worker():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Run it in production"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    for path in sorted(SYSTEMD.rglob("*")):
        if path.is_file():
            assert f"deployments/systemd/{path.relative_to(SYSTEMD)}" in section, path.name
    edit = section.index("deployments/prefect.yaml")
    deploy = section.index("prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml")
    worker = section.index("systemctl enable --now prefect-worker")
    assert edit < deploy < worker
    assert "five artifacts" in section.lower() and "four artifacts" not in section.lower()


def test_missing_postgresql_fails_saying_how_to_install_it(monkeypatch):
    """The PostgreSQL test installs nothing and never skips: without the binaries it fails, with
    the command that installs them."""
    from tests.flows import conftest

    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    monkeypatch.setattr(conftest.glob, "glob", lambda pattern: [])
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y postgresql"):
        conftest.postgres_bindir()
