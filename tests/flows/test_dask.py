"""Counting on Dask (prefect-dask's task runner, a LocalCluster) gives the local exact counts."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import numpy as np
import pytest
from prefect import flow

from phsafe import engine
from phsafe.parameters import PrivateRunParameters
from phsafe.tables import TABLES

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def cluster(prefect_server) -> str:  # noqa: ANN001
    """The scheduler address of one ``LocalCluster`` for the module, made with the settings the
    flows give theirs (:func:`flows.counting.dask_task_runner`: two workers of one thread each, no
    dashboard) but with its workers as threads of this process, reached over TCP: the
    comparisons and one US run use it as an existing cluster, given by address. Over TCP every
    task and every piece is serialized as for a remote cluster, and two workers run tasks at once;
    what needs worker *processes* (a fresh interpreter that reports to the flow's Prefect API,
    validates with Great Expectations and shares only the spill folder) is proven by the flow's
    own cluster (:func:`test_us_flow_counts_on_dask`), which the flow starts as in production.
    Threads rather than processes here: worker processes each import Prefect, phsafe and Great
    Expectations and tick while idle, which none of the tests given this cluster is about."""
    from distributed import LocalCluster

    from flows.counting import dask_task_runner

    kwargs = dict(dask_task_runner(None, 2).cluster_kwargs)
    kwargs.pop("env")  # (for worker processes; threads of this process talk to its Prefect API)
    with LocalCluster(**kwargs | {"processes": False, "protocol": "tcp://"}) as local:
        assert local.scheduler_address.startswith("tcp://127.0.0.1:") and len(local.workers) == 2
        yield local.scheduler_address


@flow(name="test-dask-counting")
def _compare(data: str, config: str, ledger: str, out: str, validate: bool, address: str) -> dict:
    """Validate and count data stored by state here and on the cluster at ``address`` (the
    module's cluster); the task runs' names and what each found."""
    from flows.counting import dask_task_runner, validate_and_count_on_dask

    parameters = PrivateRunParameters(config=Path(config), data=Path(data), output=Path(out), ledger=Path(ledger),
                                      non_confidential=True, validate_inputs=validate)
    run, cfg = engine.begin_private_run(parameters, run_id=engine.new_run_id(), output_dir=Path(out))
    run = dataclasses.replace(run, truncation_key=bytes(range(16)))  # a preflight draws it fresh
    run.run_dir.mkdir(parents=True)
    local, local_report = engine.validate_and_count(run)
    with dask_task_runner(address) as runner:
        on_dask, dask_report = validate_and_count_on_dask(run, cfg, runner=runner)
    assert local is not None and on_dask is not None
    assert on_dask.content == local.content  # the same content fingerprint
    if validate:
        assert local_report.to_text() == dask_report.to_text()
    else:
        assert local_report is None and dask_report is None
    compared = 0
    for table in TABLES:
        assert set(local[table].by_level) == set(on_dask[table].by_level)
        for level, cube in local[table].by_level.items():
            np.testing.assert_array_equal(cube, on_dask[table].by_level[level], err_msg=f"{table} {level}")
            compared += cube.size
    return {"compared": compared, "flow_run": str(run.run_dir)}


@pytest.mark.parametrize("validate", [True, False], ids=["validated", "unvalidated"])
def test_data_stored_by_state_is_read_once_on_dask(tmp_path, validate, cluster):
    """Each state's folders read once, by one ``count-<state>`` task that validates and counts
    them: no validation before the counting (the flow used to read the inputs twice)."""
    import json

    from phsafe.synthetic import synthesize
    from tests.flows.test_flows import _task_run_names

    data = tmp_path / "by-state"
    synthesize(data, 3_000, "01,02,11", fmt="parquet-partitioned", seed=5, chunk_persons=1_000)
    raw = json.loads((DEMO_US / "config.json").read_text())
    raw["state_filter"] = ["01", "11"]  # Alaska's folder: its layout only
    (tmp_path / "config.json").write_text(json.dumps(raw))
    state = _compare(str(data), str(tmp_path / "config.json"), str(tmp_path / "l.jsonl"), str(tmp_path / "out"),
                     validate, cluster, return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["compared"] > 100  # every cube cell of the two released states
    names = _task_run_names(state.state_details.flow_run_id)
    assert sorted(n for n in names if n.startswith("count-")) == ["count-01", "count-11"], names
    assert names.count("layout-02") == 1
    assert not any(n.startswith("validate-inputs") for n in names)


def test_us_flow_counts_on_dask(tmp_path):
    """The flow's own LocalCluster (``dask_workers``) of two worker processes, started and stopped
    by the run as in production: each worker a fresh interpreter, reporting its task runs to the
    flow's Prefect API, reading, validating (Great Expectations on the worker) and spilling blocks
    that the other may count (ranges of 10,000 persons: two)."""
    from flows.sdhc import us_flow

    from tests._ledgers import new_ledger

    ledger = new_ledger(tmp_path, cap=2, name="us-ledger.jsonl").path
    state = us_flow(config=str(DEMO_US / "config.json"), data=str(DEMO_US), output_root=str(tmp_path / "out"),
                    ledger=str(ledger), new_version="the demo's records", validate=True,
                    counting="dask", dask_workers=2, partition_persons=10_000, return_state=True)
    assert state.is_completed(), state.message
    from tests.flows.test_flows import _task_run_names, _verify

    names = _task_run_names(state.state_details.flow_run_id)
    assert {"read-geo-1", "read-units-1", "read-persons-1"} <= set(names), names
    assert sum(n.startswith("count-range-") for n in names) >= 2
    assert not any(n.startswith("validate-inputs") for n in names)  # no second read of the inputs
    assert sum(n.startswith("measure-") for n in names) == len(TABLES)
    summary = state.result()
    _verify(Path(summary["ledger"]), Path(summary["outputs"]))
    assert not (Path(summary["work_folder"]) / "spill").exists()


@flow(name="test-dask-one-read")
def _one_read(datasets: list[str], config: str, ledger: str, out: str, address: str) -> list[dict]:
    """Validate and count the same national files on this process and on the cluster at
    ``address`` (blocks of 240 kB: two of each file; ranges of 10,000 persons: two); what each
    found."""
    from flows.counting import dask_task_runner

    with dask_task_runner(address) as runner:
        return [_compare_one_read(data, config, ledger, f"{out}-{i}", runner) for i, data in enumerate(datasets)]


def _compare_one_read(data: str, config: str, ledger: str, out: str, runner) -> dict:  # noqa: ANN001
    from flows.counting import validate_and_count_on_dask

    parameters = PrivateRunParameters(config=Path(config), data=Path(data), output=Path(out), ledger=Path(ledger),
                                      non_confidential=True)
    run, cfg = engine.begin_private_run(parameters, run_id=engine.new_run_id(), output_dir=Path(out))
    run = dataclasses.replace(run, truncation_key=bytes(range(16)))
    run.run_dir.mkdir(parents=True)
    local, local_report = engine.validate_and_count(run)
    spilled = []
    import phsafe.intake.spill

    made = phsafe.intake.spill.SpillArea.path.fget

    def watch(area):  # type: ignore[no-untyped-def]
        spilled.append(made(area))
        return spilled[-1]

    phsafe.intake.spill.SpillArea.path = property(watch)  # type: ignore[method-assign]
    try:
        on_dask, dask_report = validate_and_count_on_dask(run, cfg, max_persons=10_000, block_bytes=240_000,
                                                          runner=runner)
    finally:
        phsafe.intake.spill.SpillArea.path = property(made)  # type: ignore[method-assign]
    assert local_report.to_text() == dask_report.to_text()
    assert local_report.failures == dask_report.failures
    assert spilled and all(p.is_relative_to(run.run_dir) and not p.exists() for p in spilled)
    if local is None:
        assert on_dask is None
        return {"ok": False, "report": dask_report.to_text()}
    assert on_dask.content == local.content
    for table in TABLES:
        for level, cube in local[table].by_level.items():
            np.testing.assert_array_equal(cube, on_dask[table].by_level[level], err_msg=f"{table} {level}")
    return {"ok": True, "report": dask_report.to_text()}


def test_national_files_are_read_once_in_blocks_on_the_cluster(tmp_path, cluster):
    """Validation and counting from the same blocks on the cluster: the local pass's report and
    exact counts -- with the state filter setting records aside, and with broken records."""
    import json
    import shutil

    from phsafe.reader import csv_blocks

    assert all(len(csv_blocks(DEMO_US / f"{stem}.csv", 240_000)) == 2 for stem in ("geo", "units", "persons"))
    config = tmp_path / "config.json"
    raw = json.loads((DEMO_US / "config.json").read_text())
    raw["state_filter"] = ["01", "06", "36", "48"]  # the District's records are set aside
    config.write_text(json.dumps(raw))
    bad = tmp_path / "bad"
    shutil.copytree(DEMO_US, bad)
    persons = (bad / "persons.csv").read_text().splitlines(keepends=True)
    fields = persons[len(persons) // 2].rstrip("\n").split(",")
    fields[5] = "99"  # a RELSHIP outside the code list, mid-file
    persons[len(persons) // 2] = ",".join(fields) + "\n"
    (bad / "persons.csv").write_text("".join(persons))
    good, broken = _one_read([str(DEMO_US), str(bad)], str(config), str(tmp_path / "l.jsonl"), str(tmp_path / "out"),
                              cluster)
    assert good["ok"] and "set aside" in good["report"], good["report"]
    assert not broken["ok"] and "persons.csv [RELSHIP]" in broken["report"], broken["report"]


def test_us_flow_validates_and_counts_national_files_on_the_cluster(tmp_path, cluster):
    """An existing cluster, given to the flow by its scheduler address (``dask_address``): the
    flow validates and counts on it, and leaves it running."""
    from distributed import Client

    from flows.sdhc import us_flow

    from tests._ledgers import new_ledger

    ledger = new_ledger(tmp_path, cap=2, name="us-ledger.jsonl").path
    state = us_flow(config=str(DEMO_US / "config.json"), data=str(DEMO_US), output_root=str(tmp_path / "out"),
                    ledger=str(ledger), new_version="the demo's records", validate=True,
                    counting="dask", dask_address=cluster, partition_persons=10_000, return_state=True)
    assert state.is_completed(), state.message
    from tests.flows.test_flows import _task_run_names, _verify

    names = _task_run_names(state.state_details.flow_run_id)
    assert {"read-geo-1", "read-units-1", "read-persons-1"} <= set(names), names
    assert sum(n.startswith("count-range-") for n in names) >= 2
    assert not any(n.startswith("validate-inputs") for n in names)  # no second read of the inputs
    summary = state.result()
    _verify(Path(summary["ledger"]), Path(summary["outputs"]))
    assert not (Path(summary["work_folder"]) / "spill").exists()
    with Client(cluster) as client:  # the cluster is the operator's: still there, both workers
        assert len(client.scheduler_info()["workers"]) == 2
