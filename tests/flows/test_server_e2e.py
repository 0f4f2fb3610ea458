"""The production setup for real, installed as docs/operations.md says: the checkout built by
root with the system's python, a service user, the units' commands run as the units define
them (as that user, with their environment files), a Prefect server on PostgreSQL, the host's
ledgers and signing key, the deploy step as the service user (``deployments/deploy.py --set
...``: settings as Prefect variables, work pool, deployments with their concurrency limits and
the code version, alert block and automations), the worker -- then what an operator does and
sees with it: the UI served, two releases triggered at the same moment (one runs, the other is
refused; its Retry does what the document says), the deploy step re-run in the middle of it (it
changes nothing), the commit recorded in the ledger and the manifests, the release's US run read
back through the API and its page in a real Chromium, the documented alert test and the alert a
loopback webhook receives, a memory-limit refusal, the worker stopped mid-spend four ways and
each run retried (tests/flows/_worker_stops.py), the Prefect database scanned for figures of the
inputs, nothing persisted under $PREFECT_HOME/storage.

Everything started is stopped at the end. If the PostgreSQL server binaries are missing, the test
fails saying how to install them; if chromium is missing, likewise.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import yaml

from tests._cli import phsafe
from tests.flows._worker_stops import print_case_table, retry, stop_the_worker_every_way
from tests.flows.conftest import (
    DeploymentRun,
    Stack,
    _tree_state,
    production_stack,
    read_flow_run,
    run_deployment,
    stop_worker,
)

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"
MEASURE_TASKS = {f"measure-{t}" for t in
                 ("PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_denom", "PH6", "PH7", "PH8_denom")}
ARTIFACT_KEYS = {"us-budget-spends", "us-input-validation", "us-output-validation", "us-output-manifest",
                 "us-ledger-checkpoint"}
SPENDING = ("sdhc-release/release", "sdhc-us/us", "sdhc-pr/pr")
DEPLOYMENTS = (*SPENDING, "sdhc-rehearsal/rehearsal")
AUTOMATIONS = [a["name"] for a in yaml.safe_load((REPO / "deployments" / "automations.yaml").read_text())["automations"]]



def test_production_stack_on_postgresql(tmp_path_factory, tmp_path):
    """One stack, installed and run as docs/operations.md says (a checkout built by root, a service
    user), and what an operator does and sees with it, in order. One test rather than several
    sharing a fixture: pytest-xdist would start a stack for each worker that gets one."""
    clock = time.perf_counter()
    timings: dict[str, float] = {}
    try:
        # The alert limit for a run still Running is Prefect's minimum here, so that the release trips it.
        with alert_receiver() as alerts, production_stack(tmp_path_factory.mktemp("stack"), alert_url=alerts.url,
                                                          running_limit="10s", timings=timings) as stack:
            step = time.perf_counter()
            check_the_ui_is_served(stack, tmp_path)
            timings["chromium: the UI served by the service user's server"] = time.perf_counter() - step
            step = time.perf_counter()
            before = check_the_deploy_step(stack)
            check_deployments_schedules_and_parameter_types(stack)
            timings["checks of the deployed state"] = time.perf_counter() - step

            release, refused, redeploy = two_releases_at_once_while_redeploying(stack)
            check_one_release_ran_and_the_other_was_refused(stack, release, refused)
            check_the_deploy_step_changed_nothing(stack, redeploy, before)
            check_the_release_records_the_checkout(stack, release)
            step = time.perf_counter()
            # Task runs reach the API through the server's event pipeline: wait until the nine are there.
            us = read_flow_run(stack, subflow_run(stack, release, "sdhc-us").id,
                               until=lambda run: MEASURE_TASKS <= {t.name for t in run.task_runs
                                                                   if t.state is not None and t.state.is_completed()})
            timings["the release's US run read back"] = time.perf_counter() - step
            step = time.perf_counter()
            check_us_run_on_postgresql(stack, us)
            timings["the US run in PostgreSQL (pg_dump)"] = time.perf_counter() - step
            check_flow_run_page_in_chromium(stack, us, tmp_path)
            step = time.perf_counter()
            check_still_running_alert(alerts, release)
            timings["the still-running alert"] = time.perf_counter() - step

            # The documented alert test: a ledger path that does not exist, refused in the flow's
            # preflight in one line, no traceback, nothing stored; the operators hear of it.
            step = time.perf_counter()
            failed = check_the_documented_alert_test(stack, alerts)
            timings["the alert test (ledger=/nonexistent), trigger to its alert"] = time.perf_counter() - step

            # The release again, once the first is published: refused before any spend.
            step = time.perf_counter()
            check_a_second_trigger_is_refused_before_spending(stack)
            timings["a second trigger of the release, refused"] = time.perf_counter() - step
            # Retry on the completed release, clicked in Chromium: nothing spent, Completed again.
            step = time.perf_counter()
            check_retry_of_the_completed_release(stack, release, tmp_path)
            timings["chromium: Retry of the completed release"] = time.perf_counter() - step
            # Retry on the trigger the concurrency limit cancelled: what the document says it does.
            step = time.perf_counter()
            check_retry_of_a_run_cancelled_by_the_concurrency_limit(stack, refused)
            timings["Retry of the cancelled trigger"] = time.perf_counter() - step
            # A US run that fails after its spends; the operator fixes the cause and clicks Retry.
            step = time.perf_counter()
            check_a_run_that_failed_after_spending_is_retried(stack, tmp_path)
            timings["a US run failed after spending, fixed, Retry in chromium"] = time.perf_counter() - step
            # Inputs too large for the memory limit: refused, the figures in the enclave log only.
            step = time.perf_counter()
            check_a_memory_refusal(stack)
            timings["a memory-limit refusal"] = time.perf_counter() - step

            # The worker stopped in the middle of a spend, every way it is stopped: nothing is
            # spent twice (SIGKILL excepted: what it cut is re-spent, visibly).
            step = time.perf_counter()
            cases = stop_the_worker_every_way(stack, tmp_path)
            timings["the worker stopped mid-spend, four ways, and each run retried"] = time.perf_counter() - step
            print_case_table(cases)
            # The no-heartbeat automation fired for the run SIGKILL left behind, never for a final one.
            check_the_heartbeat_automation_skipped_final_runs(stack, failed.flow_run, cases)

            # Nothing computed from the confidential records is in the Prefect database: after
            # releases, refusals and stopped runs, no timing, memory figure, size or record count.
            step = time.perf_counter()
            check_no_input_figures_in_the_prefect_database(stack)
            timings["the Prefect database scanned for figures of the inputs"] = time.perf_counter() - step

            # Results are never persisted: after failed and successful runs, nothing under
            # PREFECT_HOME/storage (a failed flow that raised would leave its pickled exception there).
            storage = Path(stack.env["PREFECT_HOME"]) / "storage"
            persisted = sorted(p.relative_to(storage).as_posix() for p in storage.rglob("*")) if storage.exists() else []
            assert persisted == [], f"results persisted under {storage}: {persisted[:5]}"
    finally:
        timings["whole test"] = time.perf_counter() - clock
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"load average at the end: {' '.join(load)}")
        print("timings: " + "; ".join(f"{step} {seconds:.1f} s" for step, seconds in timings.items()))


# --------------------------------------------------------------------------------------------
# The alert webhook: a loopback HTTP receiver
# --------------------------------------------------------------------------------------------


class _Receiver(http.server.ThreadingHTTPServer):
    messages: list[dict[str, Any]]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/phsafe-alerts"

    def wait_for(self, predicate, what: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [m for m in list(self.messages) if predicate(m)]
            if found:
                return found[0]
            time.sleep(0.5)
        raise AssertionError(f"no alert {what} within {timeout} s; received: {self.messages}")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 -- http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.messages.append(dict(json.loads(body), path=self.path))  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def alert_receiver() -> Iterator[_Receiver]:
    """A webhook on 127.0.0.1 collecting the JSON the alert block POSTs."""
    server = _Receiver(("127.0.0.1", 0), _Handler)
    server.messages = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------------------------
# The deploy step
# --------------------------------------------------------------------------------------------


def _api(stack: Stack, read):
    """``await read(client)`` with a client of the stack's API. In a thread of its own: a sync
    Playwright page runs an event loop in this one."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect.client.orchestration import PrefectClient

    async def go():
        async with PrefectClient(api=stack.api) as client:
            return await read(client)

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


async def _deployed_state(client) -> dict[str, Any]:
    """What the deploy step makes: deployments, automations, alert blocks, settings."""
    deployments = {name: await client.read_deployment_by_name(name) for name in DEPLOYMENTS}
    automations = [a for a in await client.read_automations() if a.name.startswith("phsafe: ")]
    blocks = [b for b in await client.read_block_documents(include_secrets=False) if b.name == "phsafe-alerts"]
    variables = {v.name: v.value for v in await client.read_variables() if v.name.startswith("phsafe_")}
    return {"deployments": deployments, "automations": automations, "blocks": blocks, "variables": variables}


def code_version_of(stack: Stack) -> str:
    """The version runs of the stack's checkout must record: its commit, clean."""
    import phsafe

    return f"{phsafe.__version__}+g{stack.layout.commit[:12]}"


def check_the_ui_is_served(stack: Stack, tmp_path: Path) -> None:
    """The server runs as the service user from root's venv: it writes its copy of the UI under
    its own home (PREFECT_UI_STATIC_DIRECTORY of prefect-server.env), and the UI answers -- in
    Chromium, the Deployments page lists the deployed flows."""
    import urllib.request

    from playwright.sync_api import expect

    from tests._browser import browser_page

    package = stack.layout.checkout / ".venv" / "lib" / "python3.11" / "site-packages" / "prefect"
    assert package.stat().st_uid == 0 and not package.stat().st_mode & 0o002  # root's: not the server's to write
    static = stack.layout.path("/var/lib/phsafe/prefect/ui")
    assert (static / "v1").is_dir() and static.stat().st_uid == stack.layout.uid, static
    server_log = (stack.folder / "server.log").read_text()
    assert "Permission denied" not in server_log and "Failed to create" not in server_log, server_log[-2000:]
    with urllib.request.urlopen(stack.ui + "/", timeout=30) as response:
        assert response.status == 200 and b"<html" in response.read(4096).lower()
    with browser_page(allow=(stack.ui,), webgl=False) as page:  # no canvas on this page
        page.goto(f"{stack.ui}/deployments")
        expect(page.get_by_text("sdhc-release", exact=True).first).to_be_visible(timeout=60_000)
        expect(page.get_by_text("sdhc-us", exact=True).first).to_be_visible()
        page.screenshot(path=tmp_path / "ui-deployments.png", full_page=True)
        assert page.failed_requests == []
    assert (tmp_path / "ui-deployments.png").stat().st_size > 10_000


def check_the_deploy_step(stack: Stack) -> dict[str, Any]:
    """Settings became Prefect variables and the deployments' parameters; release, us and pr have a
    concurrency limit of 1 that cancels a colliding run; the alerts exist, through one webhook
    block; the checkout is untouched (the fixture checks) and runs will record its commit -- read
    from the install stamp, since git refuses the root-owned checkout to the service user."""
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    out = stack.deploy_output
    assert "deployed sdhc-release/release, sdhc-us/us, sdhc-pr/pr, sdhc-rehearsal/rehearsal" in out, out
    assert "automations: 3 created, 0 updated, 0 unchanged, 0 deleted" in out and "running past 10s" in out, out
    assert f"runs will record code version {code_version_of(stack)}" in out, out
    assert "warning" not in out, out
    refused = stack.layout.runuser("git", "-C", str(stack.layout.checkout), "rev-parse", "HEAD")
    assert refused.returncode != 0 and "dubious ownership" in refused.stderr, refused.stderr

    state = _api(stack, _deployed_state)
    assert state["variables"] == {f"phsafe_{name}": value for name, value in stack.settings.items()}
    deployments = state["deployments"]
    release, us = deployments["sdhc-release/release"].parameters, deployments["sdhc-us/us"].parameters
    assert release["us_ledger"] == us["ledger"] == stack.settings["us_ledger"]
    assert release["signing_key"] == us["signing_key"] == stack.settings["signing_key"]
    assert release["public_key"] == stack.settings["public_key"]
    assert deployments["sdhc-rehearsal/rehearsal"].parameters["work_root"] == stack.settings["rehearsal_root"]
    for name in DEPLOYMENTS:  # the code version the deploy step found, for each flow run to compare
        assert deployments[name].version == code_version_of(stack), (name, deployments[name].version)
    for name in SPENDING:
        d = deployments[name]
        assert d.global_concurrency_limit is not None and d.global_concurrency_limit.limit == 1, name
        assert d.concurrency_options.collision_strategy is ConcurrencyLimitStrategy.CANCEL_NEW, name
    assert deployments["sdhc-rehearsal/rehearsal"].global_concurrency_limit is None

    (block,) = state["blocks"]
    assert sorted(a.name for a in state["automations"]) == sorted(AUTOMATIONS)
    for automation in state["automations"]:
        assert automation.enabled
        notify = [a for a in automation.actions if a.type == "send-notification"]
        assert all(a.block_document_id == block.id for a in notify), automation.name
    return state


def two_releases_at_once_while_redeploying(stack: Stack) -> tuple[Any, Any, subprocess.CompletedProcess]:
    """Two triggers of the release at the same moment, a second worker polling the pool too (an
    operator's "first look" worker left running), and the deploy step re-run meanwhile."""
    second = stack.start_worker(stack.folder / "second-worker.log")
    try:
        from prefect.client.orchestration import PrefectClient

        async def both() -> list[Any]:
            async with PrefectClient(api=stack.api) as client:
                deployment = await client.read_deployment_by_name("sdhc-release/release")
                parameters = {"new_version": "the demo's synthetic records"}
                runs = await asyncio.gather(*(client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
                                              for _ in range(2)))
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    runs = [await client.read_flow_run(r.id) for r in runs]
                    if all(r.state is not None and r.state.is_final() for r in runs):
                        break
                    await asyncio.sleep(1)
                return runs

        def redeploy() -> subprocess.CompletedProcess:
            tree_before = _tree_state(stack.layout.checkout)
            done = stack.deploy()  # no --set: the settings are kept in the server
            done.tree_before, done.tree_after = tree_before, _tree_state(stack.layout.checkout)  # type: ignore[attr-defined]
            return done

        clock = time.perf_counter()
        # The US ledger's lock held for a while: the release waits on it (as it would behind a
        # long run on that ledger) and stays Running well past the 10 s alert limit, however fast
        # the machine -- the proactive alert is evaluated only every few seconds.
        with _in_thread(redeploy) as redeployed, _ledger_held(Path(stack.settings["us_ledger"]), seconds=15):
            runs = asyncio.run(both())
        stack.timings["two releases triggered at once, until both are final"] = time.perf_counter() - clock
    finally:
        stop_worker(second)
    completed = [r for r in runs if r.state.is_completed()]
    assert len(completed) == 1, [(r.name, r.state.name, r.state.message) for r in runs]
    (other,) = [r for r in runs if r is not completed[0]]
    return completed[0], other, redeployed.result


@contextlib.contextmanager
def _ledger_held(ledger: Path, *, seconds: float):
    """Hold ``ledger``'s lock (an exclusive flock, as an append does) for ``seconds`` from now."""
    import fcntl

    fd = os.open(ledger.with_name(ledger.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    timer = threading.Timer(seconds, os.close, (fd,))  # closing the descriptor releases the lock
    timer.start()
    try:
        yield
    finally:
        timer.join()


class _Result:
    result: Any = None


@contextlib.contextmanager
def _in_thread(function) -> Iterator[_Result]:
    box = _Result()
    thread = threading.Thread(target=lambda: setattr(box, "result", function()))
    thread.start()
    try:
        yield box
    finally:
        thread.join(timeout=600)


def check_one_release_ran_and_the_other_was_refused(stack: Stack, release: Any, other: Any) -> None:
    """Never two releases at once, by the states the server recorded: the second trigger was
    cancelled by the deployment's concurrency limit (CANCEL_NEW) without ever running -- or, had
    no worker tried it while the first ran, it ran only after the first ended."""
    async def history(client):
        return {r.id: await client.read_flow_run_states(r.id) for r in (release, other)}

    states = _api(stack, history)
    ran = [s.timestamp for s in states[release.id] if s.type.value == "RUNNING"]
    ended = [s.timestamp for s in states[release.id] if s.type.value == "COMPLETED"]
    assert len(ran) == 1 and len(ended) == 1
    other_ran = [s.timestamp for s in states[other.id] if s.type.value == "RUNNING"]
    if other.state.is_cancelled():
        assert other.state.message == "Deployment concurrency limit reached.", other.state.message
        assert other_ran == []  # it never ran
        assert [s.type.value for s in states[other.id]][-2:] == ["SCHEDULED", "CANCELLED"]  # refused at submission
    else:
        assert min(other_ran) >= ended[0], (states[release.id], states[other.id])


def check_the_deploy_step_changed_nothing(stack: Stack, redeploy: Any, before: dict[str, Any]) -> None:
    """Re-running the deploy step (mid-release) updates in place: same deployments, automations and
    block, nothing duplicated; the checkout is untouched."""
    assert redeploy.returncode == 0, redeploy.stdout + redeploy.stderr
    assert "automations: 0 created, 0 updated, 3 unchanged, 0 deleted" in redeploy.stdout, redeploy.stdout
    after = _api(stack, _deployed_state)
    assert {n: d.id for n, d in after["deployments"].items()} == {n: d.id for n, d in before["deployments"].items()}
    assert sorted(a.id for a in after["automations"]) == sorted(a.id for a in before["automations"])
    assert [b.id for b in after["blocks"]] == [b.id for b in before["blocks"]]
    assert after["variables"] == before["variables"]
    assert redeploy.tree_after == redeploy.tree_before, "the deploy step changed the checkout"


def check_the_release_records_the_checkout(stack: Stack, release: Any) -> None:
    """The deployed release ran the checkout as it is, as the service user (whom git refuses the
    root-owned checkout): its ledger entries and its manifests record the checkout's commit."""
    root = Path(stack.settings["output_root"])
    manifests = sorted(root.glob("*/manifest.json"))
    assert sorted(p.parent.name.split("-")[0] for p in manifests) == ["pr", "us"], manifests
    recorded = {json.loads(p.read_text())["code_version"] for p in manifests}
    assert recorded == {code_version_of(stack)}, recorded
    for ledger in _ledgers(stack).values():
        started = [json.loads(line) for line in ledger.read_text().splitlines() if '"kind":"RUN_STARTED"' in line]
        assert [e["code_version"] for e in started] == [code_version_of(stack)], started


def subflow_run(stack: Stack, parent: Any, flow_name: str) -> Any:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterParentFlowRunId

    async def read(client):
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent.id])),
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))

    (run,) = _api(stack, read)
    return run


# --------------------------------------------------------------------------------------------
# Alerts
# --------------------------------------------------------------------------------------------


def check_failure_alert(alerts: _Receiver, failed: DeploymentRun) -> None:
    """The webhook got the alert of the failed run: deployment, flow run, state and reason."""
    run = failed.flow_run
    message = alerts.wait_for(lambda m: str(run.id) in m["body"] and "is Failed" in m["subject"], "of the failed run")
    assert message["path"] == "/phsafe-alerts"
    assert message["subject"] == f"phsafe: sdhc-us/us run {run.name} is Failed"
    body = message["body"].splitlines()
    assert body[:3] == ["Deployment: sdhc-us/us", f"Flow run: {run.name} ({run.id})", "State: Failed"]
    reason = run.state.message.splitlines()[0]
    assert "/nonexistent does not exist" in reason and "ledger" in reason, reason  # why: the ledger is not there
    assert message["body"].split("Reason: ", 1)[1].startswith(reason)
    assert f"/runs/flow-run/{run.id}" in message["body"]
    assert message["text"].startswith(message["subject"] + "\n")  # what chat webhooks show


def check_still_running_alert(alerts: _Receiver, release: Any) -> None:
    """The release ran longer than the (test's) running limit of 10 s: the proactive alert."""
    message = alerts.wait_for(lambda m: str(release.id) in m["body"] and "is still" in m["subject"],
                              "of the release still running")
    assert message["subject"].startswith(f"phsafe: sdhc-release/release run {release.name} is still ")
    assert "past the time limit of 10s" in message["body"]


def _rows(artifact) -> list[dict]:
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def _database_rows(stack: Stack, sql: str) -> list:
    import asyncio

    import asyncpg

    async def query():
        connection = await asyncpg.connect(stack.database.dsn)
        try:
            return await connection.fetch(sql)
        finally:
            await connection.close()

    return asyncio.run(query())


def check_us_run_on_postgresql(stack: Stack, run: DeploymentRun) -> None:
    """The US deployment, run by the process worker: Completed, its nine measure-* tasks, five
    artifacts and readable logs read back through the API, stored in PostgreSQL, no microdata."""
    assert re.fullmatch(r"us-\d{4}-\d\d-\d\dT\d\d:\d\dZ", run.flow_run.name), run.flow_run.name
    completed = {t.name for t in run.task_runs if t.state is not None and t.state.is_completed()}
    assert MEASURE_TASKS <= completed

    # The five artifacts, read back through the API; budgets as decimals.
    artifacts = {a.key: a for a in run.artifacts}
    assert set(artifacts) == ARTIFACT_KEYS
    spends = artifacts["us-budget-spends"]
    assert "planned total 1.257281, charged 1.257281" in spends.description, spends.description
    assert "`demo-us`: spent 1.257281 of its lifetime cap 2.6 (rho); 1.342719 left" in spends.description
    rows = _rows(spends)
    assert {r["table"] for r in rows} == {t.removeprefix("measure-") for t in MEASURE_TASKS}
    assert all("/" not in str(r["rho"]) for r in rows)
    assert any(r["rho"] == "0.002619" for r in rows)

    # The run is stored in PostgreSQL, and holds no microdata: no MAFID of the inputs anywhere
    # in the Prefect database (flow runs, task runs, parameters, artifacts, logs).
    stored = _database_rows(stack, f"SELECT name FROM flow_run WHERE id = '{run.flow_run.id}'")
    assert [r["name"] for r in stored] == [run.flow_run.name]
    dump = subprocess.run(
        [str(stack.database.bindir / "pg_dump"), "--data-only", stack.database.dsn],
        capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0, dump.stderr
    assert run.flow_run.name in dump.stdout
    mafids = set(pd.read_csv(DEMO_US / "units.csv", dtype=str)["MAFID"])
    assert not mafids & set(re.findall(r"[A-Za-z0-9]+", dump.stdout))

    # Readable run logs: sentences with key fields, not JSON strings.
    messages = [entry.message for entry in run.logs]
    assert not [m for m in messages if m.lstrip().startswith("{")]
    assert any(re.fullmatch(r"measurement: table=PH\w+ level=(usa|state)_\S+ status=drawn cells=\d+", m)
               for m in messages), "\n".join(messages)
    assert any(m.startswith("plan: ") and "total=1.257281" in m for m in messages)

    published = list(Path(stack.settings["output_root"]).glob("us-*/manifest.json"))
    assert len(published) == 1


def check_deployments_schedules_and_parameter_types(stack: Stack) -> None:
    """Deployed with --no-prompt: no recurring job on confidential inputs, a weekly rehearsal,
    one ledger per dataset, typed parameters, nothing pulled from remote storage."""
    import asyncio

    from prefect.client.orchestration import PrefectClient

    async def read():
        async with PrefectClient(api=stack.api) as client:
            return {name: await client.read_deployment_by_name(name)
                    for name in ("sdhc-release/release", "sdhc-us/us", "sdhc-pr/pr", "sdhc-rehearsal/rehearsal")}

    deployments = asyncio.run(read())
    # No recurring job on the confidential inputs: release, us, pr are triggered by hand.
    for name in ("sdhc-release/release", "sdhc-us/us", "sdhc-pr/pr"):
        assert deployments[name].schedules == [], name
    # The rehearsal: weekly, New York time, active.
    (weekly,) = deployments["sdhc-rehearsal/rehearsal"].schedules
    assert weekly.active and weekly.schedule.cron == "0 3 * * 0" and weekly.schedule.timezone == "America/New_York"
    # The release and the single-dataset deployments share each dataset's one ledger.
    release, us = deployments["sdhc-release/release"].parameters, deployments["sdhc-us/us"].parameters
    assert release["us_ledger"] == us["ledger"] and release["us_config"] == us["config"]
    assert deployments["sdhc-rehearsal/rehearsal"].parameters["us_config"] == us["config"]

    # Parameters typed as operators type them: numbers and choices, not JSON-quoted strings.
    properties = deployments["sdhc-us/us"].parameter_openapi_schema["properties"]
    cap = properties["lifetime_cap"]
    assert {"type": "number", "minimum": 0} in [{k: v for k, v in s.items() if k in ("type", "minimum")}
                                                 for s in cap.get("anyOf", [cap])]
    counting = json.dumps(properties["counting"])
    assert '"local"' in counting and '"dask"' in counting and "enum" in counting
    rehearsal = deployments["sdhc-rehearsal/rehearsal"].parameter_openapi_schema["properties"]
    assert rehearsal["persons"]["type"] == "integer" and rehearsal["trials"]["type"] == "integer"
    assert rehearsal["alpha"]["type"] == "number"

    # Deployed without a terminal and without prompting: nothing to pull from remote storage.
    for deployment in deployments.values():
        assert deployment.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(stack.layout.checkout)}}]


def check_flow_run_page_in_chromium(stack: Stack, us_run: DeploymentRun, tmp_path: Path) -> None:
    """What the operator sees: the US flow run page, its nine measure-* task runs, the budget
    spends table; screenshots in the test's folder (flow-run.png, task-runs.png,
    measure-task-runs.png, budget-spends.png)."""
    from playwright.sync_api import expect

    from tests._browser import browser_page

    clock = time.perf_counter()
    with browser_page(allow=(stack.ui,)) as page:
        page.goto(f"{stack.ui}/runs/flow-run/{us_run.flow_run.id}")
        expect(page.get_by_text(us_run.flow_run.name, exact=True).first).to_be_visible(timeout=60_000)
        expect(page.get_by_text("Completed", exact=True).first).to_be_visible()
        # The Logs tab (the default): readable lines, among them the plan with its decimal total.
        expect(page.get_by_text(re.compile(r"^private run: config=")).first).to_be_visible(timeout=30_000)
        assert not page.get_by_text(re.compile(r'^\{"')).count()
        page.screenshot(path=tmp_path / "flow-run.png", full_page=True)

        page.get_by_role("tablist").get_by_text("Task Runs", exact=True).click()
        expect(page.get_by_text("measure-PH1_num", exact=True)).to_be_visible(timeout=30_000)
        panel = page.get_by_role("tabpanel", name="Task Runs")
        # plan-budget, preflight, validate-and-count, fingerprint-inputs, open-ledger-run, the
        # nine measure-*, derive-and-write-tables, validate-outputs, publish
        expect(panel.get_by_text(re.compile(r"^17 Task runs$"))).to_be_visible()
        panel.get_by_placeholder("Search by run name").fill("measure-")
        expect(panel.get_by_text(re.compile(r"^publish-"))).to_have_count(0, timeout=30_000)
        expect(panel.get_by_text(re.compile(r"^measure-PH\w+$"))).to_have_count(len(MEASURE_TASKS), timeout=30_000)
        shown = {name for name in panel.get_by_text(re.compile(r"^measure-PH\w+$")).all_inner_texts()}
        assert shown == MEASURE_TASKS, shown
        page.screenshot(path=tmp_path / "task-runs.png")  # the timeline and the filtered list
        panel.screenshot(path=tmp_path / "measure-task-runs.png")  # the nine, whole list

        page.get_by_role("tablist").get_by_text("Artifacts", exact=True).click()
        card = page.get_by_text("us-budget-spends", exact=True)
        expect(card).to_be_visible(timeout=30_000)
        expect(page.get_by_text(re.compile(r"planned total 1\.257281, charged 1\.257281\. .*1\.342719 left"))
               ).to_be_visible()
        card.click()
        table = page.get_by_role("table").first
        expect(table).to_be_visible(timeout=30_000)
        headers = {h.strip() for h in table.get_by_role("columnheader").all_inner_texts()}
        assert {"table", "level", "rho", "sensitivity", "variance", "moe90", "cells", "spends", "status"} <= headers
        expect(table.get_by_text("0.002619", exact=True).first).to_be_visible()  # rho as a decimal
        expect(table.get_by_text("PH1_num", exact=True).first).to_be_visible()
        expect(page.get_by_text("46 Items")).to_be_visible()  # 46 measurements (table x level)
        page.screenshot(path=tmp_path / "budget-spends.png", full_page=True)

        assert page.failed_requests == []  # nothing tried to leave the machine
    for shot in ("flow-run.png", "task-runs.png", "measure-task-runs.png", "budget-spends.png"):
        assert (tmp_path / shot).stat().st_size > 10_000, shot
    stack.timings["chromium: the US run's pages"] = time.perf_counter() - clock
    print(f"screenshots: {tmp_path}")


# --------------------------------------------------------------------------------------------
# One release per content version, and Retry in the UI (issue 19)
# --------------------------------------------------------------------------------------------


def _intents(ledger: Path) -> int:
    return sum('"kind":"INTENT"' in line for line in Path(ledger).read_text().splitlines())


def _ledgers(stack: Stack) -> dict[str, Path]:
    return {label: Path(stack.settings[f"{label}_ledger"]) for label in ("us", "pr")}


def check_a_second_trigger_is_refused_before_spending(stack: Stack) -> None:
    """A new trigger of the release on records already released: refused before any spend --
    the ledgers unchanged -- and the run's message says why, for each dataset, once."""
    ledgers = _ledgers(stack)
    before = {label: path.read_bytes() for label, path in ledgers.items()}
    again = run_deployment(stack, "sdhc-release/release", {})
    state = again.flow_run.state
    assert state.is_failed(), state
    for label, path in ledgers.items():
        assert path.read_bytes() == before[label], label  # not one entry, let alone an INTENT
        assert re.search(rf"{label}: these records were already released: run {label}-\S+ published them to ",
                         state.message), state.message
    assert state.message.count("No privacy-loss budget was spent.") == 2, state.message
    assert "re_release" in state.message
    summary = next(a for a in again.artifacts if a.key == "release-summary")
    assert summary.data.count("**failed**: these records were already released") == 2

    def tasks(run: DeploymentRun) -> set[str]:
        return {t.name.rsplit("-", 1)[0] for t in run.task_runs if t.state is not None and t.state.is_final()}

    # The very files of the release: each dataset refused in preflight, before any input was read
    # (task runs reach the API through the server's event pipeline: wait for the preflight's).
    for label in ledgers:
        sub = read_flow_run(stack, subflow_run(stack, again.flow_run, f"sdhc-{label}").id,
                            until=lambda run: "preflight" in tasks(run))
        assert "preflight" in tasks(sub) and "validate-and-count" not in tasks(sub), tasks(sub)


def _final(stack: Stack, flow_run_id: Any, runs_before: int, timeout: float = 300) -> Any:
    """The flow run once it ran again (run count above ``runs_before``) and is final."""
    async def wait(client):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = await client.read_flow_run(flow_run_id)
            if run.run_count > runs_before and run.state is not None and run.state.is_final():
                return run
            await asyncio.sleep(1)
        raise AssertionError(f"flow run {flow_run_id} did not run again within {timeout} s: {run.state}")

    return _api(stack, wait)


def retry_in_chromium(stack: Stack, flow_run: Any, screenshot: Path, log_line: "re.Pattern[str]") -> Any:
    """What the operator does: the flow run's page, Retry, confirm; then, once the run is final
    again, its page showing ``log_line`` of the retry (screenshot). Returns the flow run as the API
    has it then.

    The browser is closed while the retry runs (nothing is asserted in it meanwhile; Chromium
    redraws the page's run graph as it polls), and the page is opened again only once the API has
    the retry's ``log_line``: the log pane then loads every line it will show at once, instead of
    re-rendering (and dropping) lines under the scroll as they arrive. Both pages go without
    software WebGL: the run graph (proven drawn by :func:`check_flow_run_page_in_chromium`) is not
    what a Retry is about, and drawn in software it keeps Chromium's GPU process busy all along."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect

    from tests._browser import browser_page

    before = _api(stack, lambda client: client.read_flow_run(flow_run.id))
    with browser_page(allow=(stack.ui,), webgl=False) as page:  # the run graph: not looked at here
        page.goto(f"{stack.ui}/runs/flow-run/{flow_run.id}")
        expect(page.get_by_text(flow_run.name, exact=True).first).to_be_visible(timeout=60_000)
        page.get_by_role("button", name="Retry").first.click()
        expect(page.get_by_text(f"Retry {flow_run.name}?")).to_be_visible(timeout=30_000)
        page.get_by_role("button", name="Retry").last.click()  # the dialog's confirmation
        _retry_accepted(stack, page, flow_run.id, before.state.id)  # the page's request reached the server
        assert [url for url in page.failed_requests if not url.startswith(stack.ui)] == []
    final = _final(stack, flow_run.id, before.run_count)
    _log_line_stored(stack, flow_run.id, log_line)
    with browser_page(allow=(stack.ui,), webgl=False) as page:  # the run graph: not looked at here
        page.goto(f"{stack.ui}/runs/flow-run/{flow_run.id}")
        expect(page.get_by_text(flow_run.name, exact=True).first).to_be_visible(timeout=60_000)
        expect(page.get_by_text(final.state.name, exact=True).first).to_be_visible(timeout=60_000)
        # The retry's lines come last (oldest to newest): scroll down the log (its list grows as
        # it is scrolled) until the line is there.
        line = page.get_by_text(log_line).first
        page.get_by_role("tabpanel", name="Logs").hover()
        deadline = time.monotonic() + 180  # generous: the log pane loads its pages slowly on a busy machine
        while not line.is_visible() and time.monotonic() < deadline:
            page.mouse.wheel(0, 4000)
            page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
            page.wait_for_timeout(500)
        for attempt in range(5):
            try:
                line.scroll_into_view_if_needed(timeout=30_000)
                break
            except PlaywrightError:  # the log's list re-rendered (or unloaded) the line meanwhile
                if attempt == 4:
                    raise
                again = time.monotonic() + 60
                while not line.is_visible() and time.monotonic() < again:
                    page.mouse.wheel(0, 4000)
                    page.wait_for_timeout(500)
        expect(line).to_be_visible()
        page.screenshot(path=screenshot, full_page=True)
        assert [url for url in page.failed_requests if not url.startswith(stack.ui)] == []  # nothing left the machine
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")
    return final


def _retry_accepted(stack: Stack, page: Any, flow_run_id: Any, state_before: Any, timeout: float = 60) -> None:
    """Wait until the flow run's state is no longer ``state_before`` (the Retry set a new one),
    letting ``page`` run meanwhile: its requests pass the browser's route (tests/_browser.py)
    only while Playwright is called, so a wait that blocked this thread would hold the Retry's
    own request back."""
    deadline = time.monotonic() + timeout
    while True:
        run = _api(stack, lambda client: client.read_flow_run(flow_run_id))
        if run.state is not None and run.state.id != state_before:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"flow run {flow_run_id}: the Retry clicked did not reach the server within "
                                 f"{timeout} s")
        page.wait_for_timeout(500)


def _log_line_stored(stack: Stack, flow_run_id: Any, log_line: "re.Pattern[str]", timeout: float = 120) -> None:
    """Wait until the API has a log line of the flow run matching ``log_line`` (the worker ships
    the lines in batches, after the state)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def wait(client):
        log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        deadline = time.monotonic() + timeout
        while True:
            messages: list[str] = []
            while True:
                page = await client.read_logs(log_filter=log_filter, limit=200, offset=len(messages))
                messages += [entry.message for entry in page]
                if len(page) < 200:
                    break
            if any(log_line.search(m) for m in messages):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"flow run {flow_run_id}: no log line {log_line.pattern!r} within {timeout} s; "
                                     f"the last: {messages[-5:]}")
            await asyncio.sleep(1)

    _api(stack, wait)


def check_retry_of_the_completed_release(stack: Stack, release: Any, tmp_path: Path) -> None:
    """Retry on the published release: its subflows find the runs the release started, already
    published; nothing is spent, nothing new is published, the run ends Completed and says where."""
    ledgers = _ledgers(stack)
    before = {label: path.read_bytes() for label, path in ledgers.items()}
    published = sorted(p.name for p in Path(stack.settings["output_root"]).iterdir())
    final = retry_in_chromium(stack, release, tmp_path / "retry-completed-release.png",
                              re.compile(r"^pr: run pr-\S+ was already published at "))
    assert final.state.is_completed(), final.state
    assert {label: path.read_bytes() for label, path in ledgers.items()} == before  # nothing recorded
    assert sorted(p.name for p in Path(stack.settings["output_root"]).iterdir()) == published
    again = read_flow_run(stack, release.id, until=lambda run: sum(a.key == "release-summary" for a in run.artifacts) >= 2)
    summaries = sorted((a for a in again.artifacts if a.key == "release-summary"), key=lambda a: a.created)
    assert summaries[-1].data.count("already published (nothing done)") == 2, summaries[-1].data
    assert summaries[-1].data.count("| nothing spent by this attempt | 1.2") == 2, summaries[-1].data
    assert sum("was already published at" in e.message and "; nothing spent by this attempt (the run's charge 1.2"
               in e.message for e in again.logs) == 2, [e.message for e in again.logs]
    assert any(m.startswith("us: run us-") and "was already published at" in m for m in (e.message for e in again.logs))


def check_a_run_that_failed_after_spending_is_retried(stack: Stack, tmp_path: Path) -> None:
    """A US run (its own dataset ledger) loses its signing key after its first spends: it ends
    Failed saying what is recorded and that a Retry resumes it. The key is put back; Retry in the
    UI completes the run with no new INTENT, and the auditors' check of the release holds."""
    enclave = stack.layout.enclave / "us-second"
    enclave.mkdir(mode=0o700)
    os.chown(enclave, stack.layout.uid, stack.layout.gid)
    ledger = enclave / "ledger.jsonl"
    made = stack.phsafe("ledger", "init", str(ledger), "--lifetime-cap", "2.6", "--reason", "test")
    assert made.returncode == 0, made.stderr
    keys = stack.layout.enclave / "keys-second"
    shutil.copytree(Path(stack.settings["signing_key"]).parent, keys)
    for path in (keys, *keys.iterdir()):
        os.chown(path, stack.layout.uid, stack.layout.gid)
    key, away = keys / "signing-key.pem", keys / "signing-key.pem.away"
    # The key is lost after the spends, and the Retry resumes: neither depends on validating the
    # inputs or the tables (proven by the stack's releases), so this run validates neither -- a
    # Great Expectations import and evaluation less in each of its two attempts.
    parameters = {"ledger": str(ledger), "new_version": "the demo's records, a dataset of its own",
                  "signing_key": str(key), "public_key": str(keys / "public-key.pem"),
                  "validate": False, "validate_private_output": False}

    async def start(client):
        deployment = await client.read_deployment_by_name("sdhc-us/us")
        return await client.create_flow_run_from_deployment(deployment.id, parameters=parameters)

    run = _api(stack, start)
    deadline = time.monotonic() + 300
    while not (ledger.exists() and _intents(ledger)) and time.monotonic() < deadline:
        time.sleep(0.02)
    key.rename(away)  # the key is lost after the first spend: the publish cannot sign
    failed = _final(stack, run.id, 0)
    assert failed.state.is_failed(), failed.state
    spent = _intents(ledger)
    assert spent == 46, spent
    message = failed.state.message
    assert "signing key" in message and f"{spent} spend(s) of run us-" in message, message
    assert "Retry this flow run to resume it" in message and "No privacy-loss budget" not in message
    away.rename(key)  # the operator puts the key back, then clicks Retry
    final = retry_in_chromium(stack, failed, tmp_path / "retry-failed-us-run.png",
                              re.compile(r"^run published: .*\balready_published=False attempt=2\b"))
    assert final.state.is_completed(), final.state
    assert _intents(ledger) == spent  # committed measurements reused: nothing drawn again
    (out,) = [p for p in Path(stack.settings["output_root"]).glob("us-*")
              if json.loads((p / "manifest.json").read_text())["run_id"] in ledger.read_text()]
    verified = phsafe("audit", "verify", ledger, "--outputs", out, "--public-key", keys / "public-key.pem")  # the auditors' copy
    assert verified.returncode == 0 and verified.stdout.rstrip().endswith("OK"), verified.stdout + verified.stderr
    assert "2 attempts (1 failed or crashed)" in verified.stdout


# --------------------------------------------------------------------------------------------
# The documented alert test, Retry of a cancelled trigger, a memory refusal (issue 28)
# --------------------------------------------------------------------------------------------


def check_the_documented_alert_test(stack: Stack, alerts: _Receiver) -> DeploymentRun:
    """``prefect deployment run 'sdhc-us/us' --param ledger=/nonexistent``, as the document says to
    try the alerts: refused in the flow's preflight -- before the confidential log file, which
    would be ``/phsafe-log.jsonl``, is opened -- with one line in the run's log and no traceback;
    the alert arrives (nothing stored under $PREFECT_HOME/storage: checked at the end)."""
    failed = run_deployment(stack, "sdhc-us/us", {"ledger": "/nonexistent"})
    state = failed.flow_run.state
    assert state.is_failed(), state
    first, *rest = state.message.splitlines()
    assert first.startswith("the ledger /nonexistent does not exist. A ledger is created once"), state.message
    assert rest == ["No privacy-loss budget was spent."], state.message
    errors = [e.message for e in failed.logs if e.level >= 40]
    assert errors == [first], errors  # one line; Prefect's own "Finished in state Failed" is INFO
    messages = "\n".join(e.message for e in failed.logs)
    assert "Traceback" not in messages and "exception" not in messages.lower(), messages
    assert "PermissionError" not in messages and "phsafe-log.jsonl" not in messages, messages
    assert not Path("/phsafe-log.jsonl").exists()
    check_failure_alert(alerts, failed)
    return failed


def check_retry_of_a_run_cancelled_by_the_concurrency_limit(stack: Stack, refused: Any) -> None:
    """Retry on the trigger the concurrency limit cancelled (the UI offers it) runs it now, as a
    new trigger of the release with its parameters: here, on records already published, it is
    refused before any spend -- the ledgers unchanged -- exactly as docs/operations.md says."""
    if not refused.state.is_cancelled():
        return  # it ran after the first (no worker tried it meanwhile): nothing was cancelled
    ledgers = _ledgers(stack)
    before = {label: path.read_bytes() for label, path in ledgers.items()}
    final = retry(stack, refused)
    assert final.run_count == 1, final.run_count  # it ran now, for the first time
    assert final.state.is_failed(), final.state
    for label in ("us", "pr"):
        assert re.search(rf"{label}: these records were already released: run {label}-\S+ published them",
                         final.state.message), final.state.message
    assert final.state.message.count("No privacy-loss budget was spent.") == 2, final.state.message
    assert {label: path.read_bytes() for label, path in ledgers.items()} == before


def check_a_memory_refusal(stack: Stack) -> None:
    """Inputs that cannot be read within the memory limit: refused in preflight; the message --
    which reaches the Prefect database and the alerts -- says where the figures are, not what."""
    refused = run_deployment(stack, "sdhc-us/us", {"memory_limit": "1M"})
    state = refused.flow_run.state
    assert state.is_failed(), state
    log_file = Path(stack.settings["us_ledger"]).parent / "phsafe-log.jsonl"
    assert state.message.startswith("the inputs need more than the memory limit; the figures are in the enclave "
                                    f"log at {log_file} (give the flow parameter memory_limit more"), state.message
    assert not re.search(r"\d", state.message.replace(str(log_file), "")), state.message
    figures = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert any(e["event"] == "the inputs need more than the memory limit" and e["needed_bytes"] > 1 << 20
               for e in figures)


# --------------------------------------------------------------------------------------------
# The no-heartbeat automation, and what the Prefect database holds
# --------------------------------------------------------------------------------------------


def check_the_heartbeat_automation_skipped_final_runs(stack: Stack, alert_test_run: Any, cases: list) -> None:
    """The no-heartbeat automation fired for the run SIGKILL left behind (it marked it Crashed),
    and for no run that was already final -- among them the alert test's, which fails in its
    first second, long enough ago for any wait its heartbeats opened to have expired."""
    from tests.flows.conftest import HEARTBEAT_TIMEOUT

    automation = next(a for a in _api(stack, lambda client: client.read_automations())
                      if a.name == "phsafe: a run whose process died is marked Crashed")
    ended = alert_test_run.state.timestamp.timestamp()
    while time.time() < ended + HEARTBEAT_TIMEOUT + 30:  # past any wait it opened, and one evaluation
        time.sleep(1)
    rows = _database_rows(stack, "SELECT payload::text AS payload FROM events WHERE event = "
                                 f"'prefect.automation.triggered' AND resource_id = 'prefect.automation.{automation.id}'")
    fired_for = {json.loads(r["payload"])["triggering_labels"].get("prefect.resource.id") for r in rows}
    killed = [c for c in cases if c.how == "SIGKILL"]
    assert fired_for == {f"prefect.flow-run.{c.flow_run_id}" for c in killed}, (fired_for, killed)


_CONTEXT_FIELDS = {"timestamp", "log_level", "run_id", "flow_run_id", "dataset", "event", "table", "level"}
_FIGURE_NAMES = ("peak_rss_mib", "seconds=", "needed_bytes", "spill_bytes", "free_bytes", "memory_limit_bytes",
                 "suggested_limit")
_NUMBER = re.compile(r"(?<![\w.:/+-])\d+(?:\.\d+)?(?![\w.:/])")


def _confidential_figures(stack: Stack) -> dict[str, str]:
    """Numbers computed from the confidential records, as text -> where each comes from: every
    figure of the input pass and of the refusals in the enclave logs (timings, memory, sizes,
    rows), the input files' sizes (in bytes, KiB, MiB) and record counts."""
    from flows._logging import PUBLIC_FIELDS
    from phsafe.memory import format_size

    figures: dict[str, str] = {}

    def add(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        text = json.dumps(value)
        digits = len(text.replace(".", "").lstrip("0"))
        if (isinstance(value, int) and value >= 1000) or (isinstance(value, float) and digits >= 3):
            figures.setdefault(text, where)

    for log in stack.layout.enclave.rglob("phsafe-log.jsonl"):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            for key, value in event.items():
                if key not in PUBLIC_FIELDS and key not in _CONTEXT_FIELDS:
                    add(value, f"{log.parent.name}/phsafe-log.jsonl {event['event']!r} {key}")
    for label in ("us", "pr"):
        for path in sorted((stack.layout.enclave / label / "inputs").glob("*.csv")):
            size = path.stat().st_size
            add(size, f"size of {label}/{path.name}")
            for text in (f"{size / 1024:.1f}", f"{size / (1 << 20):.1f}", f"{size / (1 << 20):.2f}",
                         format_size(size).split()[0]):
                if len(text.replace(".", "").lstrip("0")) >= 3:
                    figures.setdefault(text, f"size of {label}/{path.name} ({text})")
            rows = len(path.read_text().splitlines()) - 1
            add(rows, f"records in {label}/{path.name}")
    return figures


def check_no_input_figures_in_the_prefect_database(stack: Stack) -> None:
    """Every text the phsafe runs left in the Prefect database (PostgreSQL) -- log lines,
    artifacts, state messages, parameters, run names, event payloads -- scanned for the numbers
    computed from the confidential records (:func:`_confidential_figures`) and for the names of
    the input pass's figures: none is there. The same scan finds them in the enclave logs (it is
    able to find them)."""
    figures = _confidential_figures(stack)
    assert any("'stage finished' seconds" in where for where in figures.values()), figures  # timings were taken
    assert sum("size of" in where for where in figures.values()) >= 6 and \
        any("records in" in where for where in figures.values()), figures
    enclave_text = "\n".join(log.read_text() for log in stack.layout.enclave.rglob("phsafe-log.jsonl"))
    assert set(_NUMBER.findall(enclave_text)) & set(figures)  # the scan finds them there

    texts = _database_rows(stack, """
        SELECT 'log' AS source, message AS text FROM log
        UNION ALL SELECT 'artifact', coalesce(data::text, '') || ' ' || coalesce(description, '') FROM artifact
        UNION ALL SELECT 'flow_run_state', coalesce(message, '') FROM flow_run_state
        UNION ALL SELECT 'task_run_state', coalesce(message, '') FROM task_run_state
        UNION ALL SELECT 'flow_run', name || ' ' || parameters::text FROM flow_run
        UNION ALL SELECT 'task_run', name FROM task_run
        UNION ALL SELECT 'events', payload::text FROM events""")
    assert len(texts) > 500, len(texts)  # the runs' lines are there to scan
    hits = []
    for row in texts:
        text = row["text"]
        for name in _FIGURE_NAMES:
            if name in text:
                hits.append(f"{row['source']}: the figure {name!r} in {text[:200]!r}")
        for token in set(_NUMBER.findall(text)) & set(figures):
            hits.append(f"{row['source']}: {token} ({figures[token]}) in {text[:200]!r}")
    assert not hits, "\n".join(hits[:20])
