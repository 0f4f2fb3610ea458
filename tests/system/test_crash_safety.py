"""Crash safety of the write-ahead ledger: ``phsafe private`` SIGKILLed at 20 random points.

Each run is a real ``phsafe private`` process on a small synthetic dataset, all sharing one
ledger: one killed run is the installed console script started afresh, as an operator starts it;
the others are forked from a helper that has imported the package once
(:mod:`tests._warm_process`) -- processes of their own that SIGKILL kills the same way, without a
second of imports each before the first point a kill can matter. Most kills are triggered when
the ledger has grown by a random number of entries (so they land inside the measurement phase,
between an INTENT and its noise or between a COMMITTED and the next INTENT); the others at a
random time (start-up, tabulation, writing, publishing). After every kill:

* the ledger verifies (``phsafe audit verify``) and the killed run has no terminal entry;
* every measurement whose noise may have been drawn has a spend: the run's entries are exactly
  the write-ahead pattern INTENT(m1), COMMITTED(m1), INTENT(m2), ... in plan order, so a
  COMMITTED never exists without its INTENT and at most the last INTENT lacks its COMMITTED;
* no output directory is vouched for unless it was published: the output path does not exist,
  or the run recorded RUN_FINISHED and the directory verifies against the ledger, or -- killed
  between the rename and its record -- the directory holds the run's complete release and
  ``audit verify --outputs`` refuses it (the ledger does not vouch for it until a resume records
  it; tests/system/test_recovery.py completes such runs);
* the odometer counts the spends: each RUN_STARTED records, as spent before it, exactly the plans
  of the runs before it (crashed runs keep their whole reservation), and a plan that fits the cap
  only without the crashed runs' spends is refused.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import shutil
from decimal import Decimal

from phsafe.accounting import plan_run
from phsafe.config import PrivacyDefinition, load_config, parse_config
from phsafe.errors import BudgetError
from phsafe.ledger import RunStatus, read_ledger
from phsafe.publog import open_ledger

from tests._cli import phsafe
from tests._ledgers import new_ledger
from tests._warm_process import WarmProcesses
from tests.conftest import US_CONFIG

PHSAFE = Path(sys.executable).parent / "phsafe"
KILLS = 20
ENTRY_TRIGGERED = 14
FRESH = 1
"""Which kill (in the shuffled order) is a fresh console script; the first entry-triggered one at
or after it, so that the fresh interpreter is killed while it spends, not in its imports."""
CAP = "1000"



@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from phsafe.synthetic import synthesize

    root = tmp_path_factory.mktemp("crash")
    data = root / "data"
    synthesize(data, 2000, "01,02", seed=3)
    config = json.loads(US_CONFIG.read_text())
    config["state_filter"] = ["01", "02"]
    config["dataset"] = "crash-test"
    (root / "config.json").write_text(json.dumps(config))
    ledger = new_ledger(root / "ledger", cap=CAP).path
    return {"root": root, "data": data, "config": root / "config.json", "ledger": ledger}


@pytest.fixture(scope="module")
def warm() -> Iterator[WarmProcesses]:
    with WarmProcesses() as processes:
        yield processes


def _command(setup: dict[str, Path], out: Path) -> list[str]:
    # The ledger is under test, not the inputs (they are consistent): --no-validate keeps each
    # run short, so the kills spread over the spending phase.
    return ["private", str(setup["config"]), str(setup["data"]), str(out), "--ledger", str(setup["ledger"]),
            "--no-validate"]


class _Lines:
    """The ledger's number of lines, read again only when its size changed (polled often)."""

    def __init__(self, path: Path) -> None:
        self.path, self.size, self.lines = path, -1, 0

    def __call__(self) -> int:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return 0
        if size != self.size:
            with open(self.path, "rb") as f:
                data = f.read()
            self.size, self.lines = len(data), data.count(b"\n")
        return self.lines


def _audit(*args: str) -> subprocess.CompletedProcess:
    return phsafe("audit", "verify", *args)  # in this process, as a subprocess would see it (tests/_cli.py)


def test_sigkill_at_random_points_never_loses_a_spend(setup: dict[str, Path], warm: WarmProcesses) -> None:
    seed = int(os.environ.get("PHSAFE_CRASH_SEED", "20240917"))
    rng = random.Random(seed)
    plan = plan_run(load_config(setup["config"]))
    entries_per_run = 1 + 2 * len(plan.measurements) + 2  # RUN_STARTED, INTENT/COMMITTED..., OUTPUTS, FINISHED

    # One complete run first: it times a run and is the first spend on the dataset.
    start = time.monotonic()
    done = warm.run(*_command(setup, setup["root"] / "out-full"), "--new-version", "synthetic records")
    duration = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]

    kills = [("entries", rng.randint(1, entries_per_run)) for _ in range(ENTRY_TRIGGERED)]
    kills += [("time", rng.uniform(0.05, duration * 1.1)) for _ in range(KILLS - ENTRY_TRIGGERED)]
    rng.shuffle(kills)
    fresh = next(k for k, (how, _) in enumerate(kills) if how == "entries" and k >= FRESH)
    lines = _Lines(setup["ledger"])
    for k, (how, when) in enumerate(kills):
        out = setup["root"] / f"out-{k}"
        base = lines()
        # The same records again: each run after the first declares itself a re-release (the
        # one-release rule is tested on its own; here every run must get as far as spending).
        again = ["--re-release", f"crash test: run {k + 2} on the same records"]
        if k == fresh:  # the console script, started afresh as an operator starts it
            proc: subprocess.Popen | Any = subprocess.Popen([str(PHSAFE), *_command(setup, out), *again],
                                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            proc = warm.start(*_command(setup, out), *again)
        deadline = time.monotonic() + 300
        if how == "time":
            try:
                proc.wait(timeout=when)
            except subprocess.TimeoutExpired:
                pass
        else:
            while proc.poll() is None and lines() < base + when and time.monotonic() < deadline:
                time.sleep(0.0005)  # leave the CPU to the run
        if proc.poll() is None:
            proc.kill()  # SIGKILL
        if k == fresh:
            assert proc.wait(timeout=60) in (0, -signal.SIGKILL)
        else:
            assert proc.wait().returncode in (0, -signal.SIGKILL)
        _check_after_kill(setup, out, plan, f"kill {k} ({how} {when}, seed {seed}, "
                                            f"{'a fresh console script' if k == fresh else 'forked warm'})")

    # The odometer: every crashed run keeps its whole reservation; a default-cap run is refused.
    state = read_ledger(setup["ledger"])
    runs = list(state.runs.values())
    dangling = sum(1 for r in runs if set(r.intents) - set(r.committed))
    print(f"seed {seed}: {len(runs)} runs in the ledger, {dangling} killed between an INTENT and its COMMITTED, "
          f"{sum(r.status is RunStatus.FINISHED for r in runs)} finished")
    assert len(runs) >= 2
    expected = Fraction(0)
    for run in runs:
        assert run.spent_before == expected, run.run_id
        assert run.status is not RunStatus.FAILED  # SIGKILL leaves no RUN_FAILED
        expected += plan.total  # finished or crashed: the whole plan counts
    assert state.dataset_spent("crash-test", PrivacyDefinition.ZCDP) == expected == len(runs) * plan.total
    # A plan that the cap admits only without the crashed runs' reservations is refused (on a copy
    # of the ledger: the production one keeps its history).
    shutil.copytree(setup["ledger"].parent, setup["root"] / "copy")  # the ledger with its keys and its public log
    copy = setup["root"] / "copy" / setup["ledger"].name
    raw = json.loads(setup["config"].read_text(), parse_float=Decimal)
    scale = Decimal(float((Fraction(CAP) - expected / 2) / plan.total)).quantize(Decimal("0.001"))
    for levels in raw["privacy_budget"].values():
        for level, budget in levels.items():
            levels[level] = Decimal(budget) * scale
    big = plan_run(parse_config(raw))
    assert big.total + expected > Fraction(CAP) >= big.total
    with pytest.raises(BudgetError, match=f"already spent {_decimal(expected)}"):
        open_ledger(copy).start_run(run_id="too-much", plan=big, dataset="crash-test", fingerprint=runs[0].fingerprint,
                                    config_digest="c" * 64, input_digests=runs[0].input_digests, code_version="test",
                                    truncation_key_hex="00" * 16, re_release="one run too many")


def _decimal(value: Fraction) -> str:
    from phsafe.ledger import format_exact

    return format_exact(value)


def _check_after_kill(setup: dict[str, Path], out: Path, plan, label: str) -> None:
    verified = _audit(str(setup["ledger"]))
    # A kill may leave the public log behind the ledger (between the two appends), or a finished
    # run's log files and leftovers (at its very end): an action (exit 3), each naming its command.
    actions = [line for line in verified.stdout.splitlines() if line.startswith("ACTION NEEDED: ")]
    assert verified.returncode == (3 if actions else 0), f"{label}: {verified.stdout}{verified.stderr}"
    assert all("is behind the ledger" in a or "still holds" in a or "has no privacy-loss" in a for a in actions), \
        f"{label}: {actions}"
    state = read_ledger(setup["ledger"])
    keys = [m.key for m in plan.measurements]
    for run in state.runs.values():
        entries = [e for e in state.entries if e["run_id"] == run.run_id]
        pattern = [(e["kind"], e.get("key")) for e in entries[1:]]
        expected = [x for key in keys for x in (("INTENT", key), ("COMMITTED", key))]
        measured = [p for p in pattern if p[0] in ("INTENT", "COMMITTED")]
        # Write-ahead: spends in plan order, each COMMITTED right after its INTENT.
        assert measured == expected[: len(measured)], f"{label}: {run.run_id} broke the write-ahead order"
        assert set(run.committed) <= set(run.intents)
        if run.status is RunStatus.FINISHED:
            assert measured == expected
    published = out.exists()
    run_ids = [r.run_id for r in state.runs.values()]
    if published:
        manifest = json.loads((out / "manifest.json").read_text())
        outputs = _audit(str(setup["ledger"]), "--outputs", str(out))
        if state.runs[manifest["run_id"]].status is RunStatus.FINISHED:
            assert outputs.returncode == verified.returncode, f"{label}: {outputs.stdout}{outputs.stderr}"
        else:  # killed after the rename, before the record: the ledger does not vouch for it
            assert outputs.returncode == 1 and "no OUTPUTS_PUBLISHED" in outputs.stderr, label
    else:
        # Nothing under the published name; a hidden staging directory is not a publication.
        assert not any(p.name == out.name for p in out.parent.iterdir()), label
    assert run_ids == list(dict.fromkeys(run_ids))
