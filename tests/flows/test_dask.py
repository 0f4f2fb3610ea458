"""Counting on Dask (prefect-dask's task runner, a LocalCluster) gives the local exact counts."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import numpy as np
import pytest
from prefect import flow

from phsafe import engine
from phsafe.tables import TABLES

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.slow]


@flow(name="test-dask-counting")
def _compare(data: str, config: str, ledger: str, out: str, partition_persons: int) -> int:
    from flows.counting import count_on_dask

    options = engine.PrivateRunOptions(ledger=Path(ledger), non_confidential=True)
    run, cfg = engine.begin_private_run(Path(config), Path(data), Path(out), options)
    run = dataclasses.replace(run, truncation_key=bytes(range(16)))  # a preflight draws it fresh
    local = engine.count_exact(run, cfg)
    on_dask = count_on_dask(run, cfg, n_workers=2, max_persons=partition_persons)
    assert on_dask.content == local.content  # the same content fingerprint, whatever the partitions
    compared = 0
    for table in TABLES:
        assert set(local[table].by_level) == set(on_dask[table].by_level)
        for level, cube in local[table].by_level.items():
            np.testing.assert_array_equal(cube, on_dask[table].by_level[level], err_msg=f"{table} {level}")
            compared += cube.size
    return compared


def test_dask_counts_equal_local_counts(tmp_path):
    compared = _compare(str(DEMO_US), str(DEMO_US / "config.json"), str(tmp_path / "l.jsonl"),
                        str(tmp_path / "out"), partition_persons=1500)
    assert compared > 1000


def test_us_flow_counts_on_dask(tmp_path):
    from flows.sdhc import us_flow

    from tests._ledgers import new_ledger

    ledger = new_ledger(tmp_path, cap=2, name="us-ledger.jsonl").path
    state = us_flow(config=str(DEMO_US / "config.json"), data=str(DEMO_US), output_root=str(tmp_path / "out"),
                    ledger=str(ledger), new_version_reason="the demo's records", validate_inputs=False,
                    counting="dask", dask_workers=2, partition_persons=1500, return_state=True)
    assert state.is_completed(), state.message
    from tests.flows.test_flows import _task_run_names, _verify

    names = _task_run_names(state.state_details.flow_run_id)
    assert sum(n.startswith("count-") for n in names) >= 2
    assert sum(n.startswith("measure-") for n in names) == len(TABLES)
    summary = state.result()
    _verify(Path(summary["ledger"]), Path(summary["outputs"]))
