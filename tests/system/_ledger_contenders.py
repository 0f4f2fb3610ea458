"""The processes of tests/system/test_ledger_concurrency.py: what each spawned child runs.

A spawned child imports the module its target lives in; kept here, apart from the test module
(which imports pytest and the ledger unit tests), a child imports only the ledger, the noise and
tests._ledgers. The plan and the published files come from the parent, pickled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phsafe.accounting import RunPlan
from phsafe.errors import BudgetError
from phsafe.noise import measure
from phsafe.publog import open_ledger
from tests._ledgers import start


def contender(path: str, plan: RunPlan, files: dict[str, str], run_id: str, out: str, barrier, results) -> None:
    """Start ``run_id`` (a new version) at the barrier; measure and publish if the ledger lets it."""
    ledger = open_ledger(Path(path))
    barrier.wait()
    try:
        rec = start(ledger, plan, run_id)
    except BudgetError:
        results.put((run_id, "refused"))
        return
    for m in plan.measurements:
        measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
    rec.record_published(files, Path(out))
    results.put((run_id, "ran"))


def writer(path: str, plan: RunPlan, files: dict[str, str], i: int, barrier) -> None:
    """Run the whole plan for a dataset of its own, started at the barrier."""
    ledger = open_ledger(Path(path))
    barrier.wait()
    rec = start(ledger, plan, f"w{i}", dataset=f"data-{i}", fingerprint=f"{i}" * 64)
    for m in plan.measurements:
        measure(m, np.arange(m.n_cells, dtype=np.int64), rec)
    rec.record_published(files, Path(path).parent / f"out-{i}")
