"""The ledger's check-and-record is atomic across processes: simultaneous runs and appends from
several processes keep one valid chain."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from phsafe.ledger import (
    RunStatus,
    read_ledger,
)

from tests._ledgers import new_ledger

# The small plan is the ledger unit tests' own. The children's code is in a module that imports
# only what they run (tests/system/_ledger_contenders.py): a spawned child imports its target's module.
from tests.system._ledger_contenders import contender, writer
from tests.unit.test_ledger import DATASET, FILES, PLAN  # noqa: E402


@pytest.mark.parametrize("round_", range(3))
def test_two_simultaneous_runs_exactly_one_proceeds(tmp_path: Path, round_: int) -> None:
    """Both declare the same new version; exactly one DATASET_VERSION and one run are recorded."""
    ctx = mp.get_context("spawn")  # a clean process: forking a worker with threads (Prefect, Dask) is unsafe
    path = new_ledger(tmp_path, cap=PLAN.total).path
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=contender,
                         args=(str(path), PLAN, FILES, f"run-{i}", str(tmp_path / f"out-{i}"), barrier, results))
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


def test_concurrent_appends_keep_one_valid_chain(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")  # a clean process: forking a worker with threads (Prefect, Dask) is unsafe
    path = new_ledger(tmp_path).path
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=writer, args=(str(path), PLAN, FILES, i, barrier)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    state = read_ledger(path)
    assert {r.run_id for r in state.runs.values() if r.status is RunStatus.FINISHED} == {"w0", "w1", "w2"}
    # LEDGER_INIT, then per run: DATASET_VERSION, RUN_STARTED, INTENT+COMMITTED each, published, finished.
    assert state.size == 1 + 3 * (2 * len(PLAN.measurements) + 4)
