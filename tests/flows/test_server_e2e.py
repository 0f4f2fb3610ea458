"""End to end against a real Prefect server: deploy with the project's prefect.yaml to a process
work pool, start a worker, trigger the US deployment through the API, see it Completed with its
artifacts. Everything started here is stopped here."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_healthy(url: str, server: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "prefect server exited"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError("prefect server did not become healthy")


def test_us_deployment_runs_on_a_real_server_with_a_process_worker(tmp_path):
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api,
               PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port))
    started: list[subprocess.Popen] = []
    try:
        server = _start([str(PREFECT), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                        env, tmp_path / "server.log")
        started.append(server)
        _wait_healthy(api, server)
        run = lambda *args: subprocess.run([str(PREFECT), *args], cwd=REPO, env=env,  # noqa: E731
                                           capture_output=True, text=True, timeout=300)
        created = run("work-pool", "create", "phsafe-process", "--type", "process")
        assert created.returncode == 0, created.stdout + created.stderr
        deployed = run("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        worker = _start([str(PREFECT), "worker", "start", "--pool", "phsafe-process", "--limit", "1"],
                        env, tmp_path / "worker.log")
        started.append(worker)

        out = tmp_path / "out"
        state, artifacts = asyncio.run(_trigger_and_wait(api, {
            "output_root": str(out), "ledger": str(tmp_path / "us-ledger.jsonl"),
        }))
        assert state.is_completed(), (state.message, (tmp_path / "worker.log").read_text()[-4000:])
        assert {a.key for a in artifacts} >= {"us-budget-spends", "us-input-validation", "us-output-validation",
                                              "us-output-manifest", "us-ledger-checkpoint"}
        published = list(out.glob("us-*/tables/manifest.json"))
        assert len(published) == 1
    finally:
        for proc in reversed(started):
            _stop(proc)


async def _trigger_and_wait(api: str, parameters: dict):
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with PrefectClient(api=api) as client:
        deployment = await client.read_deployment_by_name("sdhc-us/us")
        assert {s.schedule.timezone for s in deployment.schedules} == {"America/New_York"}
        flow_run = await client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            flow_run = await client.read_flow_run(flow_run.id)
            if flow_run.state is not None and flow_run.state.is_final():
                break
            await asyncio.sleep(2)
        assert flow_run.name.startswith("us-"), flow_run.name
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
        return flow_run.state, artifacts
