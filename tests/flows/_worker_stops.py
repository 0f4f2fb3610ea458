"""The worker stopped in the middle of a release's spends, every way it is stopped, on the
production stack (tests/flows/test_server_e2e.py): what the ledger holds afterwards, and what a
Retry of the stopped flow run spends.

Each case runs a dataset deployment on a ledger of its own, with a worker started the way the
case says, and stops it while the run is measuring. To stop it *at* a spend, whatever the
machine's speed, the test holds the ledger's lock (as an append does) once some spends are
recorded (:func:`held_at_a_spend`): every measurement thread then waits at its next append, the
signal is sent, and the lock is released only once the flow run's process has said "stop
requested" in its confidential log -- so the stop request certainly precedes every later append,
and "no INTENT after the request" is exact: the INTENTs are counted under the lock.

* SIGTERM from the service unit: ``systemctl stop prefect-worker`` -- SIGTERM to the unit's main
  process (deployments/worker.py, KillMode=mixed).
* SIGTERM from a shell: the worker started by an operator's shell in the background (``... &``:
  a non-interactive shell starts it with SIGINT ignored), then ``kill PID``.
* SIGINT: Ctrl-C in the terminal the worker runs in -- SIGINT to its process group.
* SIGKILL: everything of the unit killed at once (``systemctl kill -s KILL``, TimeoutStopSec
  expired, the host lost power): the flow run's process vanishes mid-spend; the no-heartbeat
  automation marks its run Crashed; a Retry re-spends what was recorded and not committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tests._cli import phsafe  # the auditors' copy (this process's), not the stack's
from tests.flows.conftest import Stack, stop_worker


@dataclass
class StopCase:
    how: str
    deployment: str
    run_id: str = ""
    flow_run_id: str = ""
    state_after_stop: str = ""
    message: str = ""
    intents_at_signal: int = 0
    intents_at_stop: int = 0
    uncommitted_at_stop: int = 0
    ledger_reason: str = ""
    worker_stop_seconds: float = 0.0
    intents_after_retry: int = 0
    planned: int = 0
    charge: str = ""
    planned_total: str = ""
    verify: str = ""


def _entries(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]


def _intents(ledger: Path) -> int:
    return sum(e["kind"] == "INTENT" for e in _entries(ledger))


def _uncommitted(ledger: Path) -> int:
    """INTENTs whose measurement has no COMMITTED naming them (noise possibly drawn and lost)."""
    entries = _entries(ledger)
    committed = {e["intent_seq"] for e in entries if e["kind"] == "COMMITTED"}
    return sum(e["kind"] == "INTENT" and e["seq"] not in committed for e in entries)


@contextlib.contextmanager
def held_at_a_spend(ledger: Path, spends: int = 3, timeout: float = 600) -> Iterator[None]:
    """The ledger's file lock, held by this process once the run has recorded at least
    ``spends`` INTENTs, whatever the machine's speed: every append of the run waits for the lock,
    and this process takes it back after each of the run's appends (a turnstile), so between two
    of its holds the run appends at most once per thread waiting for the lock -- far fewer than
    the 46 or 23 spends and commits a run has to make. Inside the block the run is stopped at
    its next append; the lock is released when the block ends."""
    fd = os.open(f"{ledger}.lock", os.O_RDWR)  # made by `ledger init`, never by this process
    deadline = time.monotonic() + timeout
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        while _intents(ledger) < spends:
            size = ledger.stat().st_size
            fcntl.flock(fd, fcntl.LOCK_UN)
            while ledger.stat().st_size == size:  # let the run make one more append
                if time.monotonic() > deadline:
                    raise AssertionError(f"{ledger}: fewer than {spends} spends within {timeout} s")
                time.sleep(0.01)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _wait(condition, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def _api(stack: Stack, call):
    from prefect.client.orchestration import PrefectClient

    async def go():
        async with PrefectClient(api=stack.api) as client:
            return await call(client)

    return asyncio.run(go())


def _new_ledger(stack: Stack, name: str) -> Path:
    """A dataset ledger of the case's own, made as the document makes one (as phsafe)."""
    folder = stack.layout.enclave / name
    folder.mkdir(mode=0o700)
    os.chown(folder, stack.layout.uid, stack.layout.gid)
    ledger = folder / "ledger.jsonl"
    made = stack.phsafe("ledger", "init", str(ledger), "--lifetime-cap", "2.6", "--reason", f"test: {name}")
    assert made.returncode == 0, made.stderr
    return ledger


def _trigger(stack: Stack, deployment: str, ledger: Path) -> Any:
    # How the worker stops and what the ledger holds depend on neither validation: the input suites
    # and the output suites (each a Great Expectations import and evaluation in the flow run's
    # process, for the stopped run and again for its Retry) are proven by the stack's releases.
    parameters = {"ledger": str(ledger), "new_version": "the demo's records, a dataset of their own",
                  "validate": False, "validate_private_output": False}

    async def create(client):
        found = await client.read_deployment_by_name(deployment)
        return await client.create_flow_run_from_deployment(found.id, parameters=parameters)

    return _api(stack, create)


def final_state(stack: Stack, flow_run_id: Any, timeout: float, runs_before: int = 0) -> Any:
    async def wait(client):
        deadline = time.monotonic() + timeout
        while True:
            run = await client.read_flow_run(flow_run_id)
            if run.run_count > runs_before and run.state is not None and run.state.is_final():
                return run
            if time.monotonic() > deadline:
                raise AssertionError(f"flow run {flow_run_id} not final within {timeout} s: {run.state}")
            await asyncio.sleep(1)

    return _api(stack, wait)


def retry(stack: Stack, flow_run: Any) -> Any:
    """What the UI's Retry does (POST set_state: AwaitingRetry, forced); the run once final again."""
    from prefect.states import AwaitingRetry

    runs_before = _api(stack, lambda client: client.read_flow_run(flow_run.id)).run_count
    _api(stack, lambda client: client.set_flow_run_state(flow_run.id, AwaitingRetry(message="Retry from the test"),
                                                          force=True))
    return final_state(stack, flow_run.id, 600, runs_before)


def _stop_requested_said(ledger: Path) -> bool:
    log = ledger.parent / "phsafe-log.jsonl"
    return log.exists() and "stop requested by a signal" in log.read_text()


def _unit_processes(main_pid: int) -> list[int]:
    from deployments.worker import descendants

    return [main_pid, *descendants(main_pid)]


def stop_mid_spend(stack: Stack, how: str, deployment: str, tmp_path: Path) -> tuple[StopCase, Any, Path]:
    """Start a worker as ``how`` says (one of the three signals), run ``deployment`` on a new
    ledger, stop the worker while the run spends; the case so far, the flow run and its ledger."""
    label = deployment.split("/")[1]
    case = StopCase(how, deployment)
    ledger = _new_ledger(stack, f"{label}-{how.split()[0].lower()}-{how.split()[-1]}")
    log = stack.folder / f"worker-{how.replace(' ', '-')}.log"
    shell = None
    if how == "SIGTERM from a shell":
        shell, main_pid = stack.start_worker_from_a_shell(log)
        worker = None
    else:
        worker = stack.start_worker(log)
        main_pid = worker.pid
    run = _trigger(stack, deployment, ledger)
    with held_at_a_spend(ledger):
        case.intents_at_signal = _intents(ledger)
        clock = time.monotonic()
        if how == "SIGTERM from the service unit":
            worker.send_signal(signal.SIGTERM)  # systemctl stop: the main process only (KillMode=mixed)
        elif how == "SIGTERM from a shell":
            os.kill(main_pid, signal.SIGTERM)  # kill PID
        else:
            os.killpg(worker.pid, signal.SIGINT)  # Ctrl-C: the terminal's foreground process group
        # The flow run's process has the request: from here every append that waits for the lock
        # is refused if it is an INTENT.
        _wait(lambda: _stop_requested_said(ledger), f"{how}: the flow run saying it was asked to stop", 120)
    if worker is not None:
        worker.wait(timeout=120)
    else:
        shell.wait(timeout=120)
    case.worker_stop_seconds = time.monotonic() - clock
    case.flow_run_id = str(run.id)
    stopped = final_state(stack, run.id, 120)
    case.state_after_stop, case.message = stopped.state.name, (stopped.state.message or "").splitlines()[0]
    case.intents_at_stop, case.uncommitted_at_stop = _intents(ledger), _uncommitted(ledger)
    (case.run_id,) = {e["run_id"] for e in _entries(ledger) if e["kind"] == "RUN_STARTED"}
    failed = [e for e in _entries(ledger) if e["kind"] == "RUN_FAILED"]
    case.ledger_reason = failed[-1]["reason"] if failed else "(no RUN_FAILED)"
    return case, stopped, ledger


def check_a_safe_stop(case: StopCase, ledger: Path) -> None:
    """The run stopped at a safe point: Failed saying so, RUN_FAILED "stopped by a signal", no
    INTENT after the request, every recorded spend committed."""
    assert case.state_after_stop == "Failed", case
    assert case.message.startswith("stopped by a signal (SIGTERM) at a safe point (no spend after it) -- "), case
    assert "Retry this flow run to resume it" in case.message, case
    assert case.ledger_reason.startswith("stopped by a signal (SIGTERM)"), case
    assert case.intents_at_stop == case.intents_at_signal, case  # not one INTENT after the request
    assert case.uncommitted_at_stop == 0, case  # the measurements in flight were drawn and committed
    assert case.worker_stop_seconds < 85, case  # within the worker's grace: nothing was SIGKILLed


def complete_by_retry(stack: Stack, case: StopCase, stopped: Any, ledger: Path) -> None:
    """Retry the stopped flow run (a worker started as the unit starts it); the run completes;
    the ledger's account of it; the auditors' check."""
    final = retry(stack, stopped)
    assert final.state.is_completed(), (case, final.state)
    entries = _entries(ledger)
    case.intents_after_retry = _intents(ledger)
    case.charge = [e for e in entries if e["kind"] == "RUN_FINISHED"][-1]["spent"]
    from phsafe.amounts import format_exact
    from phsafe.ledger import read_ledger

    run = read_ledger(ledger).runs[case.run_id]
    case.planned_total = format_exact(run.planned_total)
    case.planned = len(run.planned)
    (out,) = Path(stack.settings["output_root"]).glob(f"{case.run_id}")
    verified = phsafe("audit", "verify", ledger, "--outputs", out, "--public-key", stack.settings["public_key"])
    assert verified.returncode == 0 and verified.stdout.rstrip().endswith("OK"), verified.stdout + verified.stderr
    case.verify = next(line.strip() for line in verified.stdout.splitlines() if f"run {case.run_id}: " in line)


def stop_the_worker_every_way(stack: Stack, tmp_path: Path) -> list[StopCase]:
    """The four cases; the runs left by each completed by a Retry; the ledgers' accounts."""
    stop_worker(stack.worker)  # the stack's own worker would take the runs: each case starts its own
    cases: list[tuple[StopCase, Any, Path]] = []
    # SIGKILL first, on Puerto Rico: its run holds the pr deployment's slot until the no-heartbeat
    # automation marks it Crashed (five missed heartbeats), while the US cases go on.
    killed = _start_the_sigkill_case(stack, tmp_path)
    for how in ("SIGTERM from the service unit", "SIGTERM from a shell", "SIGINT"):
        case, stopped, ledger = stop_mid_spend(stack, how, "sdhc-us/us", tmp_path)
        check_a_safe_stop(case, ledger)
        cases.append((case, stopped, ledger))
    stack.worker = stack.start_worker(stack.folder / "worker-for-retries.log")
    for case, stopped, ledger in cases:
        complete_by_retry(stack, case, stopped, ledger)
        # Nothing spent twice: one INTENT per planned measurement; the charge is the plan's.
        assert case.intents_after_retry == case.planned, case
        assert case.charge == case.planned_total, case
        assert re.search(r": 2 attempts \(1 failed or crashed\), 0 measurement\(s\) spent more than once", case.verify), case
    cases.append(_finish_the_sigkill_case(stack, *killed))
    return [case for case, _, _ in cases]


def _start_the_sigkill_case(stack: Stack, tmp_path: Path) -> tuple[StopCase, Any, Path]:
    """SIGKILL to every process of the unit mid-spend; the flow run is left Running, its process gone."""
    case = StopCase("SIGKILL", "sdhc-pr/pr")
    ledger = _new_ledger(stack, "pr-sigkill")
    worker = stack.start_worker(stack.folder / "worker-SIGKILL.log")
    run = _trigger(stack, case.deployment, ledger)
    with held_at_a_spend(ledger):
        case.intents_at_signal = _intents(ledger)
        for pid in _unit_processes(worker.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    worker.wait(timeout=60)
    return case, run, ledger


def _finish_the_sigkill_case(stack: Stack, case: StopCase, run: Any, ledger: Path) -> tuple[StopCase, Any, Path]:
    """The automation marks the run Crashed; Retry re-spends exactly what SIGKILL cut between a
    spend and its commit."""
    from tests.flows.conftest import HEARTBEAT_TIMEOUT

    case.flow_run_id = str(run.id)
    stopped = final_state(stack, run.id, HEARTBEAT_TIMEOUT + 240)
    case.worker_stop_seconds = 0.0
    case.state_after_stop, case.message = stopped.state.name, (stopped.state.message or "").splitlines()[0]
    assert stopped.state.is_crashed(), stopped.state
    assert case.message.startswith("No heartbeat from the flow's process"), case.message
    case.intents_at_stop, case.uncommitted_at_stop = _intents(ledger), _uncommitted(ledger)
    (case.run_id,) = {e["run_id"] for e in _entries(ledger) if e["kind"] == "RUN_STARTED"}
    assert not [e for e in _entries(ledger) if e["kind"] == "RUN_FAILED"]  # the process had no chance to say
    case.ledger_reason = "(none: the process was killed)"
    complete_by_retry(stack, case, stopped, ledger)
    # What SIGKILL cut between a spend and its commit is spent again, visibly; nothing else.
    assert case.intents_after_retry == case.planned + case.uncommitted_at_stop, case
    assert f"{case.uncommitted_at_stop} measurement(s) spent more than once" in case.verify, case
    return case, stopped, ledger


def print_case_table(cases: list[StopCase]) -> None:
    print("\n| how the worker was stopped | flow run after the stop | INTENTs at the signal | at the stop "
          "(uncommitted) | RUN_FAILED reason | after Retry (planned) | charge (planned) | audit verify |")
    print("|---|---|---|---|---|---|---|---|")
    for c in cases:
        print(f"| {c.how} | {c.state_after_stop}: {c.message[:90]} | {c.intents_at_signal} | {c.intents_at_stop} "
              f"({c.uncommitted_at_stop}) | {c.ledger_reason[:70]} | {c.intents_after_retry} ({c.planned}) "
              f"| {c.charge} ({c.planned_total}) | {c.verify} |")
