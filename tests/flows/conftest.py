"""Flow test fixtures.

* ``prefect_server``: a temporary Prefect server on SQLite (``prefect_test_harness``), one per
  test process, for flows called in-process.
* :func:`production_stack`: what the README's production section sets up, started for real --
  a throwaway PostgreSQL cluster on a loopback port, ``prefect server start`` on it, the host's
  ledgers and signing key (``phsafe ledger init``, ``phsafe keys generate``), the deploy step
  (``deployments/deploy.py --set ...`` with the environment files of deployments/systemd), a
  process worker -- and stopped again.
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


def stop_worker(worker: subprocess.Popen, timeout: float = 90) -> None:
    """Stop a Prefect worker as ``prefect-worker.service`` does: SIGKILL the worker (its graceful
    stop would leave a flow run in progress "Running" for ever, and waits 30 s for a flow process
    that is still exiting), then SIGTERM its flow runs' processes (in sessions of their own), which
    end a run in progress Crashed; SIGKILL what is left after ``timeout`` (TimeoutStopSec)."""
    if worker.poll() is not None:
        return
    tree, todo = [], [worker.pid]
    while todo:  # the worker's descendants, before it dies and they are reparented
        pid = todo.pop()
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        tree += [int(c) for c in children]
        todo += [int(c) for c in children]
    os.killpg(worker.pid, signal.SIGKILL)  # ExecStop=/bin/kill -s KILL $MAINPID
    worker.wait()
    for pid in tree:  # KillMode=control-group, KillSignal=SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
        time.sleep(0.2)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


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
# The production stack: server, work pool, deployments, worker
# --------------------------------------------------------------------------------------------


@dataclass
class Stack:
    api: str
    env: dict[str, str]
    folder: Path
    database: PostgresCluster
    settings: dict[str, str]
    """The per-host settings the deploy step was given (``us_ledger`` -> path, ...)."""
    deploy_output: str
    """What the deploy step printed."""
    timings: dict[str, float] = field(default_factory=dict)

    def prefect(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(PREFECT), *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def deploy(self, *args: str) -> subprocess.CompletedProcess:
        """The README's deploy step: load /etc/phsafe/prefect.env and alerts.env, run deploy.py."""
        etc = self.folder / "etc-phsafe"
        script = (f"set -a; . {etc / 'prefect.env'}; . {etc / 'alerts.env'}; set +a\n"
                  f"exec {sys.executable} deployments/deploy.py " + " ".join(shlex.quote(a) for a in args))
        return subprocess.run(["bash", "-c", script], cwd=REPO, env=_without_prefect(self.env), capture_output=True,
                              text=True, timeout=600)

    def start_worker(self, log: Path, *extra: str) -> subprocess.Popen:
        """``prefect worker start --pool phsafe-process --type process`` as the worker unit runs it."""
        return start([str(PREFECT), "worker", "start", "--pool", "phsafe-process", "--type", "process", *extra],
                     self.env, log)

    @property
    def ui(self) -> str:
        return self.api.removesuffix("/api")


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#"))


def _without_prefect(env: dict[str, str]) -> dict[str, str]:
    """The environment without what the env files set: the deploy step must get it from them."""
    return {k: v for k, v in env.items() if not k.startswith(("PREFECT_", "PHSAFE_")) and k != "DO_NOT_TRACK"}


def _tree_state() -> str:
    """The checkout as git sees it: changed and untracked files, and the content of the changes."""
    status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True)
    diff = subprocess.run(["git", "-C", str(REPO), "diff", "HEAD"], capture_output=True, text=True)
    return status.stdout + diff.stdout


@contextlib.contextmanager
def production_stack(folder: Path, *, alert_url: str, running_limit: str = "3h",
                     timings: dict[str, float] | None = None) -> Iterator[Stack]:
    """The README's production setup, for real, on loopback; everything stopped on exit.

    PostgreSQL cluster; ``prefect server start`` against it; the host's ledgers (``phsafe ledger
    init``, US and Puerto Rico) and signing key pair (``phsafe keys generate``); the deploy step as
    the README gives it -- the environment files of deployments/systemd installed into
    ``<folder>/etc-phsafe`` (API URL, Prefect home, the alert webhook ``alert_url``, the running
    limit) and ``deployments/deploy.py --set ...`` for every setting; ``prefect worker start --pool
    phsafe-process --type process --limit 1``. The time of each step is in ``Stack.timings``; the
    checkout must be the same before and after the deploy step.

    The workers poll every 2 s instead of Prefect's 10 s (``PREFECT_WORKER_QUERY_SECONDS``), to
    keep the test short.
    """
    started: list[subprocess.Popen] = []
    timings = {} if timings is None else timings
    clock = time.perf_counter()
    with postgres_cluster(folder) as database:
        timings["postgresql cluster"] = time.perf_counter() - clock
        try:
            port = free_port()
            api = f"http://127.0.0.1:{port}/api"
            home = folder / "prefect-home"
            # /etc/phsafe as the README installs it, with this stack's address, home and webhook.
            etc = folder / "etc-phsafe"
            etc.mkdir()
            systemd = REPO / "deployments" / "systemd"
            shared = _env_file(systemd / "prefect.env") | {"PREFECT_API_URL": api, "PREFECT_HOME": str(home)}
            alerts = _env_file(systemd / "alerts.env") | {"PHSAFE_ALERT_WEBHOOK_URL": alert_url,
                                                          "PHSAFE_ALERT_RUNNING_LIMIT": running_limit}
            for name, values in (("prefect.env", shared), ("alerts.env", alerts)):
                (etc / name).write_text("".join(f"{k}={v}\n" for k, v in values.items()))
            env = dict(_without_prefect(dict(os.environ)), **shared, PREFECT_SERVER_API_HOST="127.0.0.1",
                       PREFECT_SERVER_API_PORT=str(port), PREFECT_WORKER_QUERY_SECONDS="2")
            clock = time.perf_counter()
            log = folder / "server.log"
            server = start([str(PREFECT), "server", "start"],
                           dict(env, PREFECT_API_DATABASE_CONNECTION_URL=database.url), log)
            started.append(server)
            wait_until(lambda: _healthy(api), "prefect server", server, log)
            timings["server start (migrations on PostgreSQL)"] = time.perf_counter() - clock

            # The host's enclave: one ledger per dataset, the signing key pair (README, Install).
            phsafe = Path(sys.executable).parent / "phsafe"
            enclave = folder / "enclave"
            settings = {
                "us_config": str(REPO / "demo" / "data" / "us" / "config.json"),
                "us_data": str(REPO / "demo" / "data" / "us"),
                "us_ledger": str(enclave / "us" / "ledger.jsonl"),
                "pr_config": str(REPO / "demo" / "data" / "pr" / "config.json"),
                "pr_data": str(REPO / "demo" / "data" / "pr"),
                "pr_ledger": str(enclave / "pr" / "ledger.jsonl"),
                "output_root": str(folder / "releases"),
                "signing_key": str(enclave / "keys" / "signing-key.pem"),
                "public_key": str(enclave / "keys" / "public-key.pem"),
                "rehearsal_root": str(folder / "rehearsals"),
            }
            clock = time.perf_counter()
            commands = [[str(phsafe), "keys", "generate", str(enclave / "keys")]]
            for label in ("us", "pr"):
                (enclave / label).mkdir(parents=True, mode=0o700)
                commands.append([str(phsafe), "ledger", "init", settings[f"{label}_ledger"], "--lifetime-cap", "2.6",
                                 "--reason", "test policy: the dataset's lifetime limit"])
            made = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
            for proc in made:  # three independent commands, run side by side
                _, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
            timings["ledgers and signing key (phsafe ledger init x2, phsafe keys generate, side by side)"] = \
                time.perf_counter() - clock

            stack = Stack(api, env, folder, database, settings, "", timings)
            before = _tree_state()
            clock = time.perf_counter()
            done = stack.deploy(*(a for name, value in settings.items() for a in ("--set", f"{name}={value}")))
            timings["deploy step (deployments/deploy.py, first time)"] = time.perf_counter() - clock
            assert done.returncode == 0, done.stdout + done.stderr
            stack.deploy_output = done.stdout
            assert _tree_state() == before, "the deploy step changed the checkout"

            worker = stack.start_worker(folder / "worker.log", "--limit", "1")
            started.append(worker)
            yield stack
        finally:
            for proc in reversed(started):
                clock = time.perf_counter()
                (stop_worker if proc.args[1:3] == ["worker", "start"] else stop)(proc)
                timings[f"stop the {proc.args[1]} (as its unit does)"] = time.perf_counter() - clock


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
