"""Flow test fixtures.

* ``prefect_server``: a temporary Prefect server on SQLite (``prefect_test_harness``), one per
  test process, for flows called in-process.
* :func:`production_layout`: phsafe installed as docs/operations.md installs it -- a checkout
  built by root with the system's python, a service user made with ``useradd`` -- in a folder
  of its own.
* :func:`production_stack`: what docs/operations.md then sets up, started for real in that
  layout -- a throwaway PostgreSQL cluster on a loopback port, the server as its unit runs it
  (the service user, the unit's environment files), the host's ledgers and signing key
  (``runuser -u phsafe -- phsafe ...``), the deploy step as the service user, the worker as its
  unit runs it -- and stopped again as the units stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent import futures as concurrent_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.flows._systemd_files import read_unit

REPO = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"
POSTGRES_HINT = (
    "the PostgreSQL tests need the PostgreSQL server binaries (initdb, postgres, pg_isready, createdb): "
    "on Debian run `apt-get install -y postgresql` as root (PostgreSQL 15 on Debian 12); "
    "`pg_config --bindir` (package libpq-dev) or /usr/lib/postgresql/<version>/bin must name them"
)


@pytest.fixture(scope="session")
def prefect_server():
    """The harness's server, on a fresh copy of a database migrated once (see :func:`_migrated_once`)."""
    with contextlib.ExitStack() as stack:
        _migrated_once(stack)
        yield


def _migrated_once(stack: contextlib.ExitStack) -> None:
    """``prefect_test_harness`` entered on ``stack``, its SQLite database a copy of a template.

    Each test process's server migrated a new database through Prefect's 100-odd migrations
    (about 4 CPU-s of its 9 CPU-s start). The first server that finds no template migrates its
    own, as before, and leaves a copy of it (SQLite's backup, right after its start: the schema
    and the registered block types, no run) in the temporary folder, named by the Prefect version
    and its migrations; every later server starts on a fresh copy of that, which its start finds
    up to date. Each server still has a database of its own, thrown away with it.
    """
    import fcntl
    import hashlib
    import sqlite3
    from unittest import mock

    import prefect
    import prefect.server.database as server_database
    import prefect.testing.utilities as harness

    versions = Path(server_database.__file__).parent / "_migrations" / "versions" / "sqlite"
    key = hashlib.sha256("\n".join([prefect.__version__, *sorted(p.name for p in versions.glob("*.py"))])
                         .encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"phsafe-prefect-test-db-{os.getuid()}"
    cache.mkdir(exist_ok=True)
    template = cache / f"prefect-{prefect.__version__}-{key}.db"
    folder = Path(tempfile.mkdtemp(prefix="phsafe-prefect-test-server-"))
    with (cache / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process migrates; the others wait and copy
        had_template = template.is_file()
        if had_template:
            shutil.copyfile(template, folder / "prefect-test.db")  # the harness's database name
        with mock.patch.object(harness, "mkdtemp", return_value=str(folder)):
            stack.enter_context(harness.prefect_test_harness(server_startup_timeout=180))
        if not had_template:
            partial = template.with_suffix(f".{os.getpid()}.partial")
            with contextlib.closing(sqlite3.connect(folder / "prefect-test.db")) as source, \
                    contextlib.closing(sqlite3.connect(partial)) as copy:
                source.backup(copy)
            partial.replace(template)  # whole or absent


@pytest.fixture(autouse=True)
def _fresh_logging(monkeypatch):
    """Each test configures structlog for its own log file (a process configures once)."""
    import flows._logging

    monkeypatch.setattr(flows._logging, "_configured", False)
    yield
    from phsafe import logs

    logs.configure(None)


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], env: dict, log: Path, **kwargs: Any) -> subprocess.Popen:
    """A background process in a session of its own (so its children stop with it)."""
    return subprocess.Popen(cmd, cwd=kwargs.pop("cwd", REPO), env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True, **kwargs)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, *, group: bool = True, timeout: float = 90) -> None:
    """``sig`` to the process's group (systemd's KillMode=control-group) or to it alone
    (KillMode=mixed); SIGKILL to the group after ``timeout`` (TimeoutStopSec)."""
    if proc.poll() is None:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def stop_worker(worker: subprocess.Popen, timeout: float = 90) -> None:
    """Stop a worker as ``systemctl stop prefect-worker`` does: SIGTERM to its main process
    (deployments/worker.py: KillMode=mixed), which stops the Prefect worker and then its flow
    runs at their next safe point; SIGKILL to what is left after ``timeout`` (TimeoutStopSec)."""
    stop(worker, group=False, timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_until(ready, what: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if ready():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} not ready after {timeout} s:\n{log.read_text()[-3000:]}")


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------


def postgres_bindir() -> Path:
    """The folder holding initdb and postgres, or a test failure saying how to install them."""
    candidates = []
    if shutil.which("pg_config"):
        found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if found.returncode == 0:
            candidates.append(Path(found.stdout.strip()))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "postgres", "pg_isready", "createdb")):
            return bindir
    pytest.fail(POSTGRES_HINT)


@dataclass
class PostgresCluster:
    url: str
    """``postgresql+asyncpg://prefect:<password>@127.0.0.1:<port>/prefect``"""
    dsn: str
    """The same for asyncpg / libpq (``postgresql://...``)."""
    bindir: Path
    port: int
    password: str


@contextlib.contextmanager
def postgres_cluster(log_dir: Path) -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster on 127.0.0.1:<free port>, database and role ``prefect``.

    PostgreSQL refuses to run as root: as root, the cluster runs as the ``postgres`` system user
    (Debian's package creates it; else ``nobody``) in a temporary folder it owns; otherwise as
    the current user. Test settings only: no fsync (the data is thrown away).
    """
    bindir = postgres_bindir()
    as_user: dict[str, Any] = {}
    base = Path(tempfile.mkdtemp(prefix="phsafe-pg-"))
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            account = pwd.getpwnam("nobody")
        os.chown(base, account.pw_uid, account.pw_gid)
        as_user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    password = secrets.token_urlsafe(18)
    port = free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "PGPASSWORD": password}
    proc = None
    try:
        pwfile = base / "pw"
        pwfile.write_text(password + "\n")
        if as_user:
            os.chown(pwfile, as_user["user"], as_user["group"])
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(base / "data"), "-U", "prefect", f"--pwfile={pwfile}",
             "--auth=scram-sha-256", "-E", "UTF8", "--no-sync"],
            cwd=base, env=env, capture_output=True, text=True, timeout=120, **as_user)
        pwfile.unlink()
        assert init.returncode == 0, f"initdb failed:\n{init.stdout}\n{init.stderr}"
        log = log_dir / "postgres.log"
        proc = start([str(bindir / "postgres"), "-D", str(base / "data"), "-p", str(port),
                      "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={base}",
                      "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                     env, log, cwd=base, **as_user)

        def ready() -> bool:
            return subprocess.run([str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)],
                                  env=env).returncode == 0

        wait_until(ready, "postgres", proc, log, timeout=60)
        created = subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "prefect",
                                  "prefect"], env=env, capture_output=True, text=True, timeout=60)
        assert created.returncode == 0, created.stderr
        yield PostgresCluster(
            url=f"postgresql+asyncpg://prefect:{password}@127.0.0.1:{port}/prefect",
            dsn=f"postgresql://prefect:{password}@127.0.0.1:{port}/prefect",
            bindir=bindir, port=port, password=password)
    finally:
        if proc is not None:
            stop(proc, signal.SIGINT)  # PostgreSQL's fast shutdown
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The production layout and stack: the operator's document (docs/operations.md), followed
# --------------------------------------------------------------------------------------------

SYSTEM_PYTHON = "/usr/bin/python3"
"""The venv's python in production: Debian's, which every user can run (docs/operations.md)."""
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""systemd's PATH for services."""
HEARTBEAT_TIMEOUT = 150
"""Five missed heartbeats at prefect.env's PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30: when the
no-heartbeat automation marks a run whose process died Crashed."""
TEST_OVERRIDES = {"PREFECT_WORKER_QUERY_SECONDS": "2"}
"""Appended to the installed prefect.env: workers poll every 2 s instead of 10, to keep the test short."""


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=phsafe test", "-c",
                           "user.email=test@phsafe.invalid", *args], capture_output=True, text=True, check=True).stdout


def checkout_under_test(dest: Path) -> str:
    """``git clone`` of this repository at its HEAD into ``dest`` -- with the working tree's
    uncommitted changes committed on top there, so that the stack runs the code under test --
    and the commit ``dest`` is at."""
    head = _git(REPO, "rev-parse", "HEAD").strip()
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(dest)], check=True, capture_output=True)
    _git(dest, "checkout", "-q", "--detach", head)
    changed = [p for p in _git(REPO, "ls-files", "-z", "-m", "-o", "--exclude-standard").split("\0") if p]
    deleted = [p for p in _git(REPO, "ls-files", "-z", "-d").split("\0") if p]
    for path in changed:
        if (REPO / path).is_file():
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, dest / path)
    for path in deleted:
        (dest / path).unlink(missing_ok=True)
    if _git(dest, "status", "--porcelain"):
        _git(dest, "add", "-A")
        _git(dest, "commit", "-q", "-m", "the working tree under test")
    return _git(dest, "rev-parse", "HEAD").strip()


@dataclass
class Layout:
    """The production layout of docs/operations.md under one folder, for real: ``opt/phsafe``
    (the checkout, built by root with ``make env PYTHON=/usr/bin/python3``), ``etc/phsafe`` (the
    environment files), ``var/lib/phsafe`` (the service user's home, Prefect's home), and
    ``srv/sdhc`` (the enclave and the releases) -- and a system user made with ``useradd`` that
    runs every service and every command the document runs as ``phsafe``."""

    root: Path
    user: str
    uid: int
    gid: int
    commit: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    make_output: str = ""

    @property
    def checkout(self) -> Path:
        return self.root / "opt" / "phsafe"

    @property
    def etc(self) -> Path:
        return self.root / "etc" / "phsafe"

    @property
    def home(self) -> Path:
        return self.root / "var" / "lib" / "phsafe"

    @property
    def srv(self) -> Path:
        return self.root / "srv" / "sdhc"

    @property
    def enclave(self) -> Path:
        return self.srv / "enclave"

    def path(self, production: str) -> Path:
        """Where a path of the document (``/opt/phsafe/.venv/bin/python``) is in this layout."""
        for prefix, here in (("/opt/phsafe", self.checkout), ("/etc/phsafe", self.etc),
                             ("/var/lib/phsafe", self.home), ("/srv/sdhc", self.srv)):
            if production == prefix or production.startswith(prefix + "/"):
                return here / production[len(prefix):].lstrip("/")
        return Path(production)

    def text(self, production: str) -> str:
        """A text of the document with its paths mapped into this layout."""
        for prefix in ("/opt/phsafe", "/etc/phsafe", "/var/lib/phsafe", "/srv/sdhc"):
            production = production.replace(prefix, str(self.path(prefix)))
        return production

    @property
    def as_user(self) -> dict[str, Any]:
        """``subprocess`` arguments that run a command as the service user (systemd's ``User=``)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def runuser(self, *argv: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``cd /opt/phsafe && runuser -u phsafe -- ARGV``, as the document writes its commands."""
        return subprocess.run(["runuser", "-u", self.user, "--", *argv], cwd=self.checkout,
                              env=env if env is not None else _without_prefect(dict(os.environ)),
                              capture_output=True, text=True, timeout=timeout)

    def unit(self, name: str) -> tuple[list[str], dict[str, str], Path]:
        """What systemd runs for ``deployments/systemd/NAME``: its ExecStart, its environment (the
        service defaults, then each EnvironmentFile as installed in ``etc/phsafe``) and its
        WorkingDirectory -- mapped into this layout."""
        sections = read_unit(self.checkout / "deployments" / "systemd" / name)
        service = sections["Service"]
        assert service["User"] == ["phsafe"] and service["Group"] == ["phsafe"], name
        env = {"PATH": SERVICE_PATH, "LANG": "C.UTF-8", "HOME": str(self.home), "USER": self.user,
               "LOGNAME": self.user, "SHELL": "/usr/sbin/nologin"}
        for env_file in service.get("EnvironmentFile", []):
            env.update(_env_file(self.path(env_file.lstrip("-"))))
        for assignment in service.get("Environment", []):
            for pair in shlex.split(assignment):
                key, _, value = pair.partition("=")
                env[key] = value
        if service.get("PrivateTmp") == ["yes"]:  # a /tmp of its own: here, a TMPDIR of its own
            private = self.root / "tmp" / name
            private.mkdir(parents=True, exist_ok=True)
            os.chown(private, self.uid, self.gid)
            private.chmod(0o700)
            env["TMPDIR"] = str(private)
        argv = [str(self.path(word)) if word.startswith("/") else word for word in shlex.split(service["ExecStart"][0])]
        return argv, env, self.path(service["WorkingDirectory"][0])

    def start_unit(self, name: str, log: Path) -> subprocess.Popen:
        """Start ``name`` as systemd would (as the service user, its own session: its main process)."""
        argv, env, cwd = self.unit(name)
        return start(argv, env, log, cwd=cwd, **self.as_user)


@contextlib.contextmanager
def production_layout(timings: dict[str, float] | None = None) -> Iterator[Layout]:
    """Install phsafe as docs/operations.md says, on this host, under a folder of its own: the
    checkout by root (a clone of the code under test; ``make env PYTHON=/usr/bin/python3``), a
    system user (``useradd``), the enclave's and the releases' folders. Root only (useradd,
    runuser); the user and the folder are removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("the production layout needs root (useradd, runuser), as its installation does")
    timings = {} if timings is None else timings
    root = Path(tempfile.mkdtemp(prefix="phsafe-layout-"))
    root.chmod(0o755)  # the service user goes through it, as through /
    user = f"phsafe-{secrets.token_hex(4)}"  # several sessions share this host: never `phsafe` itself
    made_user = False
    try:
        layout = Layout(root, user, 0, 0, timings=timings)
        (root / "opt").mkdir()
        (root / "var" / "lib").mkdir(parents=True)
        clock = time.perf_counter()
        layout.commit = checkout_under_test(layout.checkout)
        timings["git clone and checkout"] = time.perf_counter() - clock
        clock = time.perf_counter()
        built = subprocess.run(["make", "-C", str(layout.checkout), "env", f"PYTHON={SYSTEM_PYTHON}"],
                               capture_output=True, text=True, timeout=1800,
                               env=_without_prefect(dict(os.environ)))
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        timings["make env (the venv with the system's python, from the lock)"] = time.perf_counter() - clock
        layout.make_output = built.stdout

        clock = time.perf_counter()
        subprocess.run(["useradd", "--system", "--home-dir", str(layout.home), "--create-home", "--shell",
                        "/usr/sbin/nologin", "--user-group", user], check=True, capture_output=True, text=True)
        made_user = True
        account = pwd.getpwnam(user)
        layout.uid, layout.gid = account.pw_uid, account.pw_gid
        for folder, mode in ((layout.enclave, 0o700), (layout.enclave / "us", 0o700), (layout.enclave / "pr", 0o700),
                             (layout.srv / "releases", 0o755), (layout.home / "rehearsals", 0o755)):
            folder.mkdir(parents=True, exist_ok=True)  # install -d -o phsafe -g phsafe -m MODE
            os.chown(folder, layout.uid, layout.gid)
            folder.chmod(mode)
        os.chown(layout.srv, 0, 0)
        layout.srv.chmod(0o755)
        # The production inputs, each dataset's with its config (the demo's records here).
        for label in ("us", "pr"):
            shutil.copytree(REPO / "demo" / "data" / label, layout.enclave / label / "inputs")
            shutil.copy(REPO / "demo" / "data" / label / "config.json", layout.enclave / label / "config.json")
            for path in (layout.enclave / label).rglob("*"):
                os.chown(path, layout.uid, layout.gid)
        timings["service user and folders (useradd, install -d)"] = time.perf_counter() - clock
        yield layout
    finally:
        if made_user:
            subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Stack:
    api: str
    env: dict[str, str]
    """The services' environment (prefect.env as installed)."""
    folder: Path
    """Where the test keeps its logs."""
    database: PostgresCluster
    settings: dict[str, str]
    """The per-host settings the deploy step was given (``us_ledger`` -> path, ...)."""
    deploy_output: str
    """What the deploy step printed."""
    layout: Layout
    timings: dict[str, float] = field(default_factory=dict)
    worker: subprocess.Popen | None = None
    """The worker the stack keeps running (stopped as its unit stops at the end)."""

    def deploy(self, *args: str) -> subprocess.CompletedProcess:
        """The document's deploy step: as the service user, in the checkout, with /etc/phsafe's
        prefect.env and alerts.env loaded, ``.venv/bin/python deployments/deploy.py ARGS``."""
        etc = self.layout.etc
        script = (f"set -a; . {etc / 'prefect.env'}; . {etc / 'alerts.env'}; set +a\n"
                  "exec .venv/bin/python deployments/deploy.py " + " ".join(shlex.quote(a) for a in args))
        return self.layout.runuser("bash", "-c", script)

    def start_worker(self, log: Path) -> subprocess.Popen:
        """The worker as ``prefect-worker.service`` starts it (its main process: deployments/worker.py)."""
        return self.layout.start_unit("prefect-worker.service", log)

    def start_worker_from_a_shell(self, log: Path) -> tuple[subprocess.Popen, int]:
        """The worker as an operator starts it from a shell, in the background (``... &``: a
        non-interactive shell starts it with SIGINT ignored); the shell and the worker's pid."""
        etc = self.layout.etc
        pid_file = self.layout.home / f"{log.stem}.pid"  # where the service user may write
        script = (f"set -a; . {etc / 'prefect.env'}; set +a\n"
                  ".venv/bin/python deployments/worker.py --pool phsafe-process --type process --limit 1 &\n"
                  f"echo $! > {pid_file}\nwait\n")
        shell = subprocess.Popen(["runuser", "-u", self.layout.user, "--", "bash", "-c", script],
                                 cwd=self.layout.checkout, env=_without_prefect(dict(os.environ)),
                                 stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return shell, int(pid_file.read_text())

    def phsafe(self, *args: str) -> subprocess.CompletedProcess:
        """``runuser -u phsafe -- .venv/bin/phsafe ARGS`` in the checkout."""
        return self.layout.runuser(".venv/bin/phsafe", *args)

    @property
    def ui(self) -> str:
        return self.api.removesuffix("/api")


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#"))


def _without_prefect(env: dict[str, str]) -> dict[str, str]:
    """The environment without what the env files set: the deploy step must get it from them."""
    return {k: v for k, v in env.items() if not k.startswith(("PREFECT_", "PHSAFE_")) and k != "DO_NOT_TRACK"}


def _tree_state(root: Path = REPO) -> str:
    """The checkout as git sees it: changed and untracked files, and the content of the changes."""
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    diff = subprocess.run(["git", "-C", str(root), "diff", "HEAD"], capture_output=True, text=True)
    return status.stdout + diff.stdout


def _install_env(layout: Layout, name: str, mode: int, group: int, edits: dict[str, str]) -> None:
    """``install -m MODE [-g phsafe] deployments/systemd/NAME /etc/phsafe/NAME``, then the host's
    edits (the document's ``sed``: the database password; here also the ports, the folders of
    this layout and the test's webhook)."""
    target = layout.etc / name
    lines = []
    for line in layout.text((layout.checkout / "deployments" / "systemd" / name).read_text()).splitlines():
        key = line.split("=", 1)[0]
        if not line.lstrip().startswith("#") and "=" in line and key in edits:
            line = f"{key}={edits.pop(key)}"
        lines.append(line)
    lines += [f"{key}={value}" for key, value in edits.items()]  # not in the file: appended
    target.write_text("\n".join(lines) + "\n")
    os.chown(target, 0, group)
    target.chmod(mode)


@contextlib.contextmanager
def production_stack(folder: Path, *, alert_url: str, running_limit: str = "3h",
                     timings: dict[str, float] | None = None) -> Iterator[Stack]:
    """docs/operations.md's installation, followed on this host in a layout of its own
    (:func:`production_layout`), and its services started as their units start them -- systemd
    itself cannot run here, so each unit's ExecStart is run as its User, with its
    EnvironmentFiles and WorkingDirectory: PostgreSQL (a throwaway cluster on a loopback port
    standing in for Debian's), ``prefect-server.service``, the host's ledgers and signing key pair
    (``runuser -u phsafe -- .venv/bin/phsafe ...``), the deploy step as the service user with the
    environment files loaded, ``prefect-worker.service``. Everything is stopped on exit, the
    worker as its unit stops it (SIGTERM to its main process). The time of each step is in
    ``Stack.timings``; the checkout must be the same before and after the deploy step.
    """
    started: list[tuple[str, subprocess.Popen]] = []
    timings = {} if timings is None else timings
    stack: Stack | None = None
    with production_layout(timings) as layout:
        clock = time.perf_counter()
        with postgres_cluster(folder) as database:
            timings["postgresql cluster"] = time.perf_counter() - clock
            try:
                port = free_port()
                api = f"http://127.0.0.1:{port}/api"
                # /etc/phsafe as the document installs it: root:phsafe 0750, the files 0640 / 0600.
                layout.etc.mkdir(parents=True)
                os.chown(layout.etc, 0, layout.gid)
                layout.etc.chmod(0o750)
                _install_env(layout, "prefect.env", 0o640, layout.gid, {"PREFECT_API_URL": api, **TEST_OVERRIDES})
                _install_env(layout, "prefect-server.env", 0o600, 0, {
                    "PREFECT_API_DATABASE_CONNECTION_URL": database.url, "PREFECT_SERVER_API_PORT": str(port)})
                _install_env(layout, "alerts.env", 0o640, layout.gid, {
                    "PHSAFE_ALERT_WEBHOOK_URL": alert_url, "PHSAFE_ALERT_RUNNING_LIMIT": running_limit})
                env = _env_file(layout.etc / "prefect.env")

                clock = time.perf_counter()
                log = folder / "server.log"
                server = layout.start_unit("prefect-server.service", log)
                started.append(("server", server))
                wait_until(lambda: _healthy(api), "prefect server", server, log)
                timings["prefect-server.service to healthy (migrations on PostgreSQL)"] = time.perf_counter() - clock

                # The host's enclave: one ledger per dataset, the signing key pair (as phsafe).
                settings = {
                    "us_config": "/srv/sdhc/enclave/us/config.json", "us_data": "/srv/sdhc/enclave/us/inputs",
                    "us_ledger": "/srv/sdhc/enclave/us/ledger.jsonl",
                    "pr_config": "/srv/sdhc/enclave/pr/config.json", "pr_data": "/srv/sdhc/enclave/pr/inputs",
                    "pr_ledger": "/srv/sdhc/enclave/pr/ledger.jsonl",
                    "output_root": "/srv/sdhc/releases",
                    "signing_key": "/srv/sdhc/enclave/keys/signing-key.pem",
                    "public_key": "/srv/sdhc/enclave/keys/public-key.pem",
                    "rehearsal_root": "/var/lib/phsafe/rehearsals",
                }
                settings = {name: str(layout.path(value)) for name, value in settings.items()}
                clock = time.perf_counter()
                commands = [["keys", "generate", settings["signing_key"].rsplit("/", 1)[0]]]
                for label in ("us", "pr"):
                    commands.append(["ledger", "init", settings[f"{label}_ledger"], "--lifetime-cap", "2.6",
                                     "--reason", "test policy: the dataset's lifetime limit"])
                with concurrent_futures.ThreadPoolExecutor(3) as pool:  # three independent commands
                    for done in pool.map(lambda c: layout.runuser(".venv/bin/phsafe", *c), commands):
                        assert done.returncode == 0, done.stderr
                timings["ledgers and signing key (runuser -u phsafe -- phsafe ..., side by side)"] = \
                    time.perf_counter() - clock

                stack = Stack(api, env, folder, database, settings, "", layout, timings)
                before = _tree_state(layout.checkout)
                clock = time.perf_counter()
                done = stack.deploy(*(a for name, value in settings.items() for a in ("--set", f"{name}={value}")))
                timings["deploy step (deployments/deploy.py as phsafe, first time)"] = time.perf_counter() - clock
                assert done.returncode == 0, done.stdout + done.stderr
                stack.deploy_output = done.stdout
                assert _tree_state(layout.checkout) == before, "the deploy step changed the checkout"

                stack.worker = stack.start_worker(folder / "worker.log")
                yield stack
            finally:
                if stack is not None and stack.worker is not None:
                    clock = time.perf_counter()
                    stop_worker(stack.worker)
                    timings["stop the worker (systemctl stop: SIGTERM to its main process)"] = \
                        time.perf_counter() - clock
                for what, proc in reversed(started):
                    clock = time.perf_counter()
                    stop(proc)  # KillMode=control-group (the server's default): SIGTERM to all of it
                    timings[f"stop the {what} (as its unit does)"] = time.perf_counter() - clock


def _healthy(api: str) -> bool:
    try:
        with urllib.request.urlopen(api + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class DeploymentRun:
    flow_run: Any
    artifacts: list
    task_runs: list
    logs: list
    seconds: float


def run_deployment(stack: Stack, name: str, parameters: dict, timeout: float = 600) -> DeploymentRun:
    """Create a flow run of deployment ``name`` through the API, wait until it is final (the
    worker runs it), and read back its artifacts, task runs and logs through the API."""
    return asyncio.run(_run_deployment(stack.api, name, parameters, timeout))


def read_flow_run(stack: Stack, flow_run_id: Any, until=lambda run: True, timeout: float = 60) -> DeploymentRun:
    """A final flow run (a subflow too) with its artifacts, task runs and logs, through the API,
    read again (every second, up to ``timeout``) until ``until(run)`` holds."""
    async def read() -> DeploymentRun:
        from prefect.client.orchestration import PrefectClient

        deadline = time.monotonic() + timeout
        async with PrefectClient(api=stack.api) as client:
            while True:
                run = await _read_back(client, await client.read_flow_run(flow_run_id), 0.0)
                if until(run) or time.monotonic() > deadline:
                    return run
                await asyncio.sleep(1)

    return asyncio.run(read())


async def _run_deployment(api: str, name: str, parameters: dict, timeout: float) -> DeploymentRun:
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api=api) as client:
        deployment = await client.read_deployment_by_name(name)
        clock = time.perf_counter()
        flow_run = await client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            flow_run = await client.read_flow_run(flow_run.id)
            if flow_run.state is not None and flow_run.state.is_final():
                break
            await asyncio.sleep(1)
        return await _read_back(client, flow_run, time.perf_counter() - clock)


async def _read_back(client: Any, flow_run: Any, seconds: float) -> DeploymentRun:
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    artifacts = await client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
    task_runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    # Every log line (pages of 200); the worker ships them in batches, the flow's last line
    # ("Finished in state ...") after the state: wait for it.
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id]))
    logs_deadline = time.monotonic() + 60
    while True:
        logs: list = []
        while True:
            page = await client.read_logs(log_filter=log_filter, limit=200, offset=len(logs))
            logs += page
            if len(page) < 200:
                break
        if any(entry.message.startswith("Finished in state") for entry in logs) or time.monotonic() > logs_deadline:
            break
        await asyncio.sleep(1)
    return DeploymentRun(flow_run, artifacts, task_runs, logs, seconds)
