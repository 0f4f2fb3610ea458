"""Recover instead of re-spend (issue 13): a property over failure points.

A private run is stopped -- SIGKILLed, or failed by an exception -- just after a ledger append
chosen at random (the run's first record, any INTENT or COMMITTED, its publication record), or
just after its release was renamed into place but before the ledger recorded it, or between a
ledger append and its public log's append (before it, or in the middle of its line). Then:

* the ledger verifies, and ``audit verify --outputs`` never vouches for a release the ledger
  did not record (an unrecorded folder under OUT is refused);
* ``phsafe private ... --resume RUN_ID`` completes the run: it publishes (recording a release
  already in place rather than writing another), spends no committed measurement again, and
  spends again at most the one measurement whose INTENT had no COMMITTED (its noise may have been
  drawn) -- and ``audit verify --outputs`` holds;
* the public log is then exactly the ledger's projection again, and ``audit public`` holds.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from phsafe import synthetic
from phsafe.accounting import plan_run
from phsafe.config import load_config
from phsafe.ledger import format_exact, read_ledger
from tests._cli import phsafe
from tests._ledgers import new_ledger
from tests._warm_process import WarmProcesses
from tests.conftest import US_CONFIG


REPO = Path(__file__).resolve().parents[2]
PHSAFE = Path(sys.executable).parent / "phsafe"
SEED = int(os.environ.get("PHSAFE_RECOVERY_SEED", "1313"))


def _points() -> list[tuple[str, str]]:
    plan = plan_run(load_config(US_CONFIG))
    appends = 1 + 2 * len(plan.measurements) + 1  # start, INTENT/COMMITTED pairs, the publication record
    rng = random.Random(SEED)
    chosen = sorted({1, 2, 3, appends - 1, appends} | set(rng.sample(range(4, appends - 1), 4)))
    log_appends = 1 + len(plan.measurements) + 1  # the start, each INTENT, the release (COMMITTED: none)
    return [(mode, f"append:{k}") for mode in ("kill", "raise") for k in chosen] + \
           [("kill", "renamed"), ("raise", "renamed")] + \
           [("kill", f"log-append:{k}") for k in (1, rng.randrange(2, log_appends), log_appends)] + \
           [("kill", f"log-torn:{rng.randrange(2, log_appends)}")]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recovery")
    synthetic.write(synthetic.generate(1200, ["01", "02"], seed=5), root / "data")
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"], raw["dataset"] = ["01", "02"], "recovery-test"
    (root / "config.json").write_text(json.dumps(raw))
    return {"root": root, "data": root / "data", "config": root / "config.json",
            "total": plan_run(load_config(root / "config.json")).total}


@pytest.fixture(scope="module")
def warm() -> Iterator[WarmProcesses]:
    with WarmProcesses() as processes:
        yield processes


def _phsafe(*args: object) -> subprocess.CompletedProcess:
    return phsafe(*args)  # in this process, as a subprocess would see it (tests/_cli.py); the stops stay processes


def _intents(ledger: Path, run_id: str) -> Counter:
    return Counter(e["key"] for e in map(json.loads, ledger.read_text().splitlines())
                   if e["kind"] == "INTENT" and e["run_id"] == run_id)


@pytest.mark.parametrize("mode, point", _points(), ids=lambda v: str(v))
def test_a_run_stopped_anywhere_is_completed_without_new_noise(setup: dict, warm: WarmProcesses, tmp_path: Path,
                                                               mode: str, point: str) -> None:
    label = f"{mode} at {point} (seed {SEED})"
    # A cap for one run plus one re-spent measurement of any size.
    ledger = new_ledger(tmp_path / "enclave", cap=format_exact(2 * setup["total"])).path
    out = tmp_path / "out"
    args = ["private", setup["config"], setup["data"], out, "--ledger", ledger, "--no-validate"]
    # Stopped: a process of its own (SIGKILL must end a real process), forked warm (tests/_warm_process.py).
    stopped = warm.run(*args, "--new-version", "synthetic records", fault=(mode, point), cwd=REPO)
    assert stopped.returncode != 0, label
    assert "Traceback" not in stopped.stderr, f"{label}: {stopped.stderr[-2000:]}"

    verified = _phsafe("audit", "verify", ledger)
    state = read_ledger(ledger)
    (run_id, run), = state.runs.items()
    # What the stop left for the operator is an action (exit 3), never hidden behind 0: the log
    # behind the ledger (stopped between the two appends); a finished run's missing log files and
    # leftovers (stopped after its last ledger append).
    actions = [line for line in verified.stdout.splitlines() if line.startswith("ACTION NEEDED: ")]
    expected = point.startswith(("log-append:", "log-torn:")) or run.status.value == "finished"
    assert verified.returncode == (3 if expected else 0) and bool(actions) == expected, \
        f"{label}: {verified.stdout}{verified.stderr}"
    assert all("is behind the ledger" in a or "still holds" in a or "has no privacy-loss" in a for a in actions), label
    if out.exists():  # stopped after the rename: the ledger must not vouch for it yet
        if not run.published:
            unvouched = _phsafe("audit", "verify", ledger, "--outputs", out)
            assert unvouched.returncode == 1 and "no OUTPUTS_PUBLISHED" in unvouched.stderr, label
    if run.status.value == "finished":  # stopped after its last ledger append
        assert point in (f"append:{1 + 2 * len(run.planned) + 1}", f"log-append:{len(run.planned) + 2}"), label
        assert out.exists(), label
        # Only the release's public log files may be missing: completing the run writes them.
        completed = _phsafe(*args, "--resume", run_id, "--resume-reason", "recovery test")
        assert completed.returncode == 0, f"{label}: {completed.stderr[-3000:]}"
    else:
        assert not run.published, label
        assert f"run {run_id} spent" in verified.stdout and "published nothing" in verified.stdout, label
        committed = set(run.reusable)
        dangling = set(run.intents) - committed
        assert len(dangling) <= 1, label  # write-ahead: at most the last INTENT lacks its COMMITTED
        before = _intents(ledger, run_id)
        resumed = _phsafe(*args, "--resume", run_id, "--resume-reason", "recovery test")
        assert resumed.returncode == 0, f"{label}: {resumed.stderr[-3000:]}"
        after = _intents(ledger, run_id)
        for key in committed:
            assert after[key] == before[key] == 1, f"{label}: {key} spent again"
        for key in dangling:
            assert after[key] == 2, f"{label}: {key} had no COMMITTED, so it is spent again"
        assert sum(after.values()) == len(run.planned) + len(dangling), label
    final = read_ledger(ledger).runs[run_id]
    assert final.status.value == "finished" and final.output_path == str(out), label
    published = _phsafe("audit", "verify", ledger, "--outputs", out)
    assert published.returncode == 0, f"{label}: {published.stdout}{published.stderr}"
    # The public log is in step with the ledger again -- exactly its projection, nothing behind --
    # and the release checks out for an outsider.
    assert "exactly the projection" in published.stdout and "behind the ledger" not in published.stdout, label
    assert "privacy-loss.tlog-proof proves it" in published.stdout, label
    log = Path(f"{ledger}.public-log")
    outsider = _phsafe("audit", "public", out, "--key", log / "log.vkey", "--log", log,
                       "--state", tmp_path / "seen.json", "--no-witness")
    assert outsider.returncode == 0, f"{label}: {outsider.stderr}"
