"""Kill and resume with witnesses over HTTP: a release SIGKILLed at 20 points, completed, audited.

Two witness services (``phsafe witness serve``, processes of their own) witness the ledger's
public log, quorum 2 of 2. One release is run as a chain of attempts, each ``phsafe private``
SIGKILLed at its own point -- before it can spend, after the K-th ledger append (between an
INTENT and its noise, after a COMMITTED, after the release was recorded), in the K-th public-log
append (before it wrote, half of a line), right after the K-th cosignature a witness gave (the
witness ahead of the published checkpoint), after the release was renamed into place -- and
resumed by the next (one prepared release: the 20 kills reuse its committed measurements). After
every kill the ledger and its log verify (the log may be behind: the next process catches it up);
the last resume completes the release; then ``phsafe audit verify`` and ``phsafe audit public``
(against both witnesses' keys) both pass and agree: the release's spends are the ledger's
INTENTs, re-spends included, and what the dataset was charged.

A witness stopped in the middle of a run stops the run before its next spend (one line, the run
recorded failed as ``witness-unreachable``, nothing spent after its last witnessed INTENT); with
the witness back (on a new port: its URL edited in the witness list, its key unchanged) the run
resumes and completes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phsafe import synthetic
from phsafe.amounts import format_exact
from phsafe.audit.verify import verify
from phsafe.ledger import RunStatus, read_ledger
from phsafe.publog import log_path, witnesses_path
from tests._cli import phsafe
from tests._warm_process import WarmProcesses
from tests.conftest import US_CONFIG
from tests.system._witness_services import Service


PHSAFE = Path(sys.executable).parent / "phsafe"
REPO = Path(__file__).resolve().parents[2]

POINTS = [
    "reading", "append:1", "append:2", "log-append:3", "cosigned:4", "append:5", "log-torn:4", "cosigned:7",
    "append:8", "log-append:6", "append:9", "cosigned:10", "log-torn:7", "append:10", "cosigned:13",
    "append:12", "log-append:9", "append:14", "renamed", "append:2",
]
"""Where each attempt is killed, in order (append:K counts the attempt's own ledger appends: its
RUN_RESUMED is the first). The last two land after every measurement: after the rename into
place, and between recording the release and writing its log files."""


def cli(*args: object) -> subprocess.CompletedProcess:
    return phsafe(*args)  # in this process, as a subprocess would see it (tests/_cli.py)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("witnessed-recovery")
    synthetic.write(synthetic.generate(900, ["01", "02"], seed=11), root / "data")
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"], raw["dataset"] = ["01", "02"], "recovery-test"
    (root / "config.json").write_text(json.dumps(raw))
    services = [Service(root, "witness1").start(), Service(root, "witness2").start()]
    try:
        with WarmProcesses() as warm:
            yield {"root": root, "data": root / "data", "config": root / "config.json", "services": services,
                   "warm": warm}
    finally:
        for service in services:
            service.stop()


def witnessed_ledger(world: dict, name: str) -> Path:
    ledger = world["root"] / name / "ledger.jsonl"
    args = ["ledger", "init", ledger, "--lifetime-cap", "20", "--reason", "recovery tests", "--dataset", dataset_of(ledger)]
    for service in world["services"]:
        args += ["--witness", service.url, service.vkey]
    made = cli(*args)
    assert made.returncode == 0, made.stderr
    for service in world["services"]:
        service.witness(log_path(ledger))
    return ledger


def dataset_of(ledger: Path) -> str:
    """Each ledger of these tests accounts a dataset of its own: the witnesses keep one log per dataset."""
    return f"recovery-{ledger.parent.name}"


def config_of(world: dict, ledger: Path) -> Path:
    """The world's config, naming the ledger's dataset."""
    path = world["root"] / f"{dataset_of(ledger)}.json"
    if not path.exists():
        raw = json.loads(Path(world["config"]).read_text())
        raw["dataset"] = dataset_of(ledger)
        path.write_text(json.dumps(raw))
    return path


def private(world: dict, ledger: Path, out: Path, *extra: str, point: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    args = ["private", str(config_of(world, ledger)), str(world["data"]), str(out), "--ledger", str(ledger),
            "--no-validate", *extra]
    if point is None:  # a plain run: in this process (tests/_cli.py)
        return phsafe(*args, cwd=REPO, env={**os.environ, **(env or {})})
    # Killed: a process of its own, forked from a helper that imported the package once (tests/_warm_process.py).
    return world["warm"].run(*args, fault=("kill", point), cwd=REPO, env={**os.environ, **(env or {})})


def check_after_kill(ledger: Path, label: str) -> None:
    """The ledger verifies (its log may be behind: a killed process stopped between them), the
    killed attempt has no terminal entry, and spends are write-ahead."""
    try:
        notes = verify(ledger).notes
    except Exception as exc:  # noqa: BLE001 -- the failure, with its point
        raise AssertionError(f"{label}: {exc}") from None
    state = read_ledger(ledger)
    for run in state.runs.values():
        assert run.status is not RunStatus.FAILED, label  # SIGKILL records nothing
        assert set(run.committed) <= set(run.intents), label
    assert any(n.startswith("public log:") for n in notes), label


def test_sigkill_at_20_points_of_a_release_then_resume_and_the_audits_agree(world: dict) -> None:
    ledger = witnessed_ledger(world, "chain")
    out = world["root"] / "chain-out"
    run_id = None
    for number, point in enumerate(POINTS, 1):
        extra = ["--new-version", "synthetic records"] if run_id is None else \
            ["--resume", run_id, "--resume-reason", f"after kill {number - 1}"]
        killed = private(world, ledger, out, *extra, point=point)
        assert killed.returncode == -9, f"kill {number} at {point}: exit {killed.returncode}: {killed.stderr[-1500:]}"
        check_after_kill(ledger, f"kill {number} at {point}")
        if run_id is None and read_ledger(ledger).runs:
            (run_id,) = read_ledger(ledger).runs
    assert run_id is not None
    done = private(world, ledger, out, "--resume", run_id, "--resume-reason", "the last one")
    assert done.returncode == 0, done.stderr[-2000:]

    state = read_ledger(ledger)
    run = state.runs[run_id]
    # (a kill before an attempt's RUN_RESUMED -- in preflight, or among the witnesses' answers to
    # the confirmation before it -- leaves no attempt behind)
    assert run.status is RunStatus.FINISHED and run.attempt > len(POINTS) // 2
    respent = sum(1 for seqs in run.intents.values() if len(seqs) > 1)
    print(f"{len(POINTS)} kills; run {run_id}: {run.attempt} attempts, {sum(map(len, run.intents.values()))} INTENTs, "
          f"{respent} measurement(s) spent more than once, charged {format_exact(run.charge())}")

    verified = cli("audit", "verify", ledger, "--outputs", out)
    assert verified.returncode == 0, verified.stderr
    assert "exactly the projection" in verified.stdout and "behind" not in verified.stdout
    published = world["root"] / "chain-published-log"
    shutil.copytree(log_path(ledger), published)
    args = ["audit", "public", out, "--key", published / "log.vkey", "--log", published,
            "--state", world["root"] / "seen.json"]
    for service in world["services"]:
        args += ["--witness-key", service.vkey]
    public = cli(*args)
    assert public.returncode == 0, public.stderr
    # They agree: the release lists the ledger's INTENTs, and the statement its charge.
    entry = json.loads((out / "privacy-loss.entry").read_bytes())
    assert {s["key"]: s["times"] for s in entry["spends"]} == {k: len(v) for k, v in run.intents.items()}
    assert entry["spent"] == format_exact(run.charge())
    assert f"1 release(s) ({run_id}) charged {format_exact(run.charge())}" in public.stdout
    assert f"spent {format_exact(state.dataset_spent(dataset_of(ledger), state.unit))} of cap 20" in public.stdout


def test_a_witness_stopped_mid_run_stops_it_before_its_next_spend(world: dict) -> None:
    ledger = witnessed_ledger(world, "stopped")
    out = world["root"] / "stopped-out"
    second = world["services"][1]
    try:
        stopped = private(world, ledger, out, "--new-version", "synthetic records", point="stop-witness:3",
                          env={"PHSAFE_TEST_WITNESS_PID": str(second.process.pid),  # type: ignore[union-attr]
                               "PHSAFE_TEST_WITNESS_URL": second.url})
        errors = [line for line in stopped.stderr.splitlines() if line.startswith("phsafe: error:")]
        assert stopped.returncode == 1 and len(errors) == 1, stopped.stderr[-2000:]
        print(f"a witness stopped mid-run: {errors[0]}")
        assert f"witness {second.name} at {second.url} cannot be reached" in errors[0]
        state = read_ledger(ledger)
        (run,) = state.runs.values()
        assert sum(map(len, run.intents.values())) == 3  # nothing spent after the witness stopped
        assert run.status is RunStatus.FAILED and run.attempts[-1].end_code == "witness-unreachable"
        failed = [json.loads(e) for e in (log_path(ledger) / "entries").read_bytes().split(b"\n")[:-1]
                  if b'"run-failed"' in e]
        assert failed[-1]["code"] == "witness-unreachable" and "reason" not in failed[-1]
    finally:
        second.stop()
        second.start()  # the witness is back, on a new port; its key and state are the same
    listed = json.loads(witnesses_path(ledger).read_text())
    for item in listed["witnesses"]:
        if item["vkey"] == second.vkey.read_text().strip():
            item["url"] = second.url  # the operator updates the URL; the bound keys are unchanged
    witnesses_path(ledger).write_text(json.dumps(listed))
    resumed = private(world, ledger, out, "--resume", run.run_id, "--resume-reason", "the witness is back")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_ledger(ledger).runs[run.run_id].status is RunStatus.FINISHED
