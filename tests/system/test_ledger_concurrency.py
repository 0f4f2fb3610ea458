"""The ledger's check-and-record is atomic across processes: simultaneous runs and appends from
several processes keep one valid chain."""

from __future__ import annotations

import json
import multiprocessing as mp
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phsafe.accounting import RunPlan, plan_run
from phsafe.config import PHSafeConfig, parse_config
from phsafe.errors import BudgetError
from phsafe.ledger import (
    RunStatus,
    read_ledger,
)
from phsafe.publog import open_ledger
from phsafe.noise import measure

from tests._ledgers import (
    new_ledger,
    start,
)
from tests.conftest import US_CONFIG

DATASET = "test-data"  # the dataset tests._ledgers.start runs by default
FILES = {"PH2/PH2.csv": "d" * 64, "manifest.json": "e" * 64}


def small_config(defn: str = "zcdp", **budgets: Any) -> PHSafeConfig:
    """Two states; a few measured levels (others 0) so runs are quick."""
    raw = json.loads(US_CONFIG.read_text())
    for table, levels in raw["privacy_budget"].items():
        for level in levels:
            levels[level] = 0
    chosen = budgets or {
        "PH1_num": {"state_*": Decimal("0.25"), "usa_*": Decimal("0.125")},
        "PH2": {"usa_*": Decimal("0.0625")},
        "PH8_denom": {"state_A-G": Decimal("0.0625")},
    }
    for table, levels in chosen.items():
        raw["privacy_budget"][table].update(levels)
    raw["state_filter"] = ["02", "01"]
    raw["privacy_defn"] = defn
    return parse_config(raw)


PLAN = plan_run(small_config())


def run_all(recorder, plan: RunPlan) -> None:
    for m in plan.measurements:
        measure(m, np.arange(m.n_cells, dtype=np.int64), recorder)


# --------------------------------------------------------------------------------------------
# Totals
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Format: canonical JSON, chain, domain-separated hash
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Init: the policy, the lineage key, and the only way a ledger comes to exist
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Write-ahead: the INTENT is on disk (fsynced) before any noise is drawn
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# A failed append is rolled back (a full disk)
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# TAIL_REPAIRED
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Lifetime budget of a dataset: the policy cap, raises, content versions
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Publication: OUTPUTS_PUBLISHED and RUN_FINISHED, recorded after the release is in place
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Ledgers of the first format: still verified, migrated in place
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Concurrency: check-and-record is atomic across processes
# --------------------------------------------------------------------------------------------


def _contender(path: str, run_id: str, out: str, barrier, results) -> None:
    ledger = open_ledger(Path(path))
    barrier.wait()
    try:
        rec = start(ledger, PLAN, run_id)
    except BudgetError:
        results.put((run_id, "refused"))
        return
    for m in PLAN.measurements:
        measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
    rec.record_published(FILES, Path(out))
    results.put((run_id, "ran"))


@pytest.mark.parametrize("round_", range(3))
def test_two_simultaneous_runs_exactly_one_proceeds(tmp_path: Path, round_: int) -> None:
    """Both declare the same new version; exactly one DATASET_VERSION and one run are recorded."""
    ctx = mp.get_context("spawn")  # a clean process: forking a worker with threads (Prefect, Dask) is unsafe
    path = new_ledger(tmp_path, cap=PLAN.total).path
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_contender, args=(str(path), f"run-{i}", str(tmp_path / f"out-{i}"), barrier, results))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    outcome = sorted(results.get(timeout=5)[1] for _ in procs)
    assert outcome == ["ran", "refused"]
    state = read_ledger(path)
    assert len(state.runs) == 1 and next(iter(state.runs.values())).status is RunStatus.FINISHED
    assert len(state.dataset_states[DATASET].versions) == 1


def _writer(path: str, i: int, barrier) -> None:
    ledger = open_ledger(Path(path))
    barrier.wait()
    rec = start(ledger, PLAN, f"w{i}", dataset=f"data-{i}", fingerprint=f"{i}" * 64)
    run_all(rec, PLAN)
    rec.record_published(FILES, Path(path).parent / f"out-{i}")


def test_concurrent_appends_keep_one_valid_chain(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")  # a clean process: forking a worker with threads (Prefect, Dask) is unsafe
    path = new_ledger(tmp_path).path
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_writer, args=(str(path), i, barrier)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    state = read_ledger(path)
    assert {r.run_id for r in state.runs.values() if r.status is RunStatus.FINISHED} == {"w0", "w1", "w2"}
    # LEDGER_INIT, then per run: DATASET_VERSION, RUN_STARTED, INTENT+COMMITTED each, published, finished.
    assert state.size == 1 + 3 * (2 * len(PLAN.measurements) + 4)
