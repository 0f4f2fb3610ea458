"""Flow test fixtures.

* ``prefect_server``: a temporary Prefect server on SQLite (``prefect_test_harness``), one per
  test process, for flows called in-process.
* :func:`production_stack`: what the README's production section sets up, started for real --
  a throwaway PostgreSQL cluster on a loopback port, ``prefect server start`` on it, the process
  work pool, ``prefect --no-prompt deploy --all``, a process worker -- and stopped again.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"
POSTGRES_HINT = (
    "the PostgreSQL tests need the PostgreSQL server binaries (initdb, postgres, pg_isready, createdb): "
    "on Debian run `apt-get install -y postgresql` as root (PostgreSQL 15 on Debian 12); "
    "`pg_config --bindir` (package libpq-dev) or /usr/lib/postgresql/<version>/bin must name them"
)


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


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


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
# The production stack: server, work pool, deployments, worker
# --------------------------------------------------------------------------------------------


@dataclass
class Stack:
    api: str
    env: dict[str, str]
    folder: Path
    database: PostgresCluster
    timings: dict[str, float] = field(default_factory=dict)

    def prefect(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(PREFECT), *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    @property
    def ui(self) -> str:
        return self.api.removesuffix("/api")


@contextlib.contextmanager
def production_stack(folder: Path) -> Iterator[Stack]:
    """The README's production setup, for real, on loopback; everything stopped on exit.

    PostgreSQL cluster, ``prefect server start`` against it, ``prefect work-pool create
    phsafe-process --type process``, ``prefect --no-prompt deploy --all --prefect-file
    deployments/prefect.yaml``, ``prefect worker start --pool phsafe-process``. The time of each
    step is in ``Stack.timings``.
    """
    started: list[subprocess.Popen] = []
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    with postgres_cluster(folder) as database:
        timings["postgresql cluster"] = time.perf_counter() - clock
        try:
            port = free_port()
            api = f"http://127.0.0.1:{port}/api"
            env = dict(os.environ, PREFECT_HOME=str(folder / "prefect-home"), PREFECT_API_URL=api,
                       PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
                       PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port))
            stack = Stack(api, env, folder, database, timings)
            clock = time.perf_counter()
            log = folder / "server.log"
            server = start([str(PREFECT), "server", "start"],
                           dict(env, PREFECT_API_DATABASE_CONNECTION_URL=database.url), log)
            started.append(server)
            wait_until(lambda: _healthy(api), "prefect server", server, log)
            timings["server start (migrations on PostgreSQL)"] = time.perf_counter() - clock
            for step, args in (("work pool", ("work-pool", "create", "phsafe-process", "--type", "process")),
                               ("deploy", ("--no-prompt", "deploy", "--all", "--prefect-file",
                                           "deployments/prefect.yaml"))):
                clock = time.perf_counter()
                done = stack.prefect(*args)
                assert done.returncode == 0, done.stdout + done.stderr
                timings[step] = time.perf_counter() - clock
            worker = start([str(PREFECT), "worker", "start", "--pool", "phsafe-process", "--type", "process",
                            "--limit", "1"], env, folder / "worker.log")
            started.append(worker)
            yield stack
        finally:
            for proc in reversed(started):
                stop(proc)


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


async def _run_deployment(api: str, name: str, parameters: dict, timeout: float) -> DeploymentRun:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

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
        seconds = time.perf_counter() - clock
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
