"""The Prefect flows on the demo data, against a temporary Prefect server.

What they must show: the US and PR flows complete with the nine measurement tasks; their
artifacts exist and hold no microdata; a validation failure ends Failed before any spend; a
failure injected after some measurements leaves a ledger that verifies, and neither a re-run nor
a flow retry re-draws a committed measurement.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from phsafe.tables import TABLES

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo" / "data"

pytestmark = pytest.mark.usefixtures("prefect_server")


def _flow_run_id(state):
    return state.state_details.flow_run_id


def _artifacts(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def _task_run_names(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [r.name for r in runs if r.state is not None and r.state.is_completed()]


def _log_messages(flow_run_id) -> list[str]:
    """The flow run's log lines in the Prefect database (its tasks' included)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # logs reach the server in batches, from a background worker
    with get_client(sync_client=True) as client:
        entries, offset = [], 0
        while True:
            page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                    limit=200, offset=offset)
            entries += page
            offset += len(page)
            if len(page) < 200:
                return [e.message for e in entries]


def _ledger_entries(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _verify(ledger: Path, outputs: Path | None = None) -> None:
    from phsafe.audit.verify import verify

    verify(ledger, outputs=outputs)  # raises VerificationFailure naming the broken rule


def _mafids(data: Path) -> set[str]:
    return set(pd.read_csv(data / "units.csv", dtype=str)["MAFID"])


def _assert_no_microdata(artifacts: list, data: Path) -> None:
    """No artifact holds an identifier of a record (MAFID) or any per-record field."""
    mafids = _mafids(data)
    for artifact in artifacts:
        text = json.dumps(artifact.data) if not isinstance(artifact.data, str) else artifact.data
        tokens = set(re.findall(r"[A-Za-z0-9]+", text))
        assert not tokens & mafids, artifact.key
        for column in ("MAFID", "QAGE", "RELSHIP", "CENRACE", "TABBLK"):
            assert column not in text, (artifact.key, column)


def _ledger(tmp_path: Path, dataset: str, cap: str = "10") -> str:
    """The dataset's ledger, made (once) as production makes it: ``phsafe ledger init``."""
    from tests._ledgers import new_ledger

    path = tmp_path / f"{dataset}-ledger.jsonl"
    if not path.exists():
        new_ledger(tmp_path, cap=cap, name=path.name)
    return str(path)


def _params(tmp_path: Path, dataset: str, **kw) -> dict:
    base = dict(
        config=str(DEMO / dataset / "config.json"),
        data=str(DEMO / dataset),
        output_root=str(tmp_path / "out"),
        ledger=_ledger(tmp_path, dataset),
        new_version="the demo's synthetic records",
    )
    base.update(kw)
    return base


@pytest.mark.parametrize("dataset", ["us", "pr"])
def test_dataset_flow_completes_with_nine_tasks_and_artifacts(tmp_path, dataset):
    from flows.sdhc import pr_flow, us_flow

    flow_fn = us_flow if dataset == "us" else pr_flow
    log_file = tmp_path / "flow-log.jsonl"
    state = flow_fn(**_params(tmp_path, dataset, log_file=str(log_file)), return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["measurements"]["reused"] == 0 and summary["measurements"]["drawn"] > 0
    run_id = summary["run_id"]
    assert re.fullmatch(rf"{dataset}-\d{{8}}T\d{{4}}Z-[0-9a-f]{{8}}", run_id)

    flow_run_id = _flow_run_id(state)
    names = _task_run_names(flow_run_id)
    assert sorted(n for n in names if n.startswith("measure-")) == sorted(f"measure-{t}" for t in TABLES)
    for stage in ("preflight", "validate-and-count", "fingerprint-inputs", "plan-budget",
                  "open-ledger-run", "derive-and-write-tables", "validate-outputs", "publish"):
        assert any(n.startswith(stage) for n in names), stage

    artifacts = _artifacts(flow_run_id)
    keys = {a.key for a in artifacts}
    assert keys == {f"{dataset}-budget-spends", f"{dataset}-input-validation", f"{dataset}-output-validation",
                    f"{dataset}-output-manifest", f"{dataset}-ledger-checkpoint"}
    _assert_no_microdata(artifacts, DEMO / dataset)
    spends = next(a for a in artifacts if a.key == f"{dataset}-budget-spends")
    rows = json.loads(spends.data) if isinstance(spends.data, str) else spends.data
    assert {r["table"] for r in rows} == set(TABLES)
    assert all(r["status"] == "committed" and r["spends"] == 1 for r in rows)
    levels = {r["level"] for r in rows}
    assert any(lv.startswith("usa") for lv in levels) is (dataset == "us")  # PR has no Nation level

    outputs = Path(summary["outputs"])
    assert (outputs / "manifest.json").exists() and not (outputs / ".measurements").exists()
    _verify(Path(summary["ledger"]), outputs)

    # Budgets as decimals (US: 1.257281, never 1257281/1000000): the config's rho, summed exactly.
    budgets = json.loads((DEMO / dataset / "config.json").read_text(), parse_float=Decimal)["privacy_budget"]
    total = str(sum(v for levels in budgets.values() for v in levels.values()).normalize())
    assert f"planned total {total}, charged {total}." in spends.description and summary["total_budget"] == total
    # Beside the plan, the dataset's account: spent, cap and what is left (exact, as decimals).
    left = str((Decimal(10) - Decimal(total)).normalize())
    assert f"`demo-{dataset}`: spent {total} of its lifetime cap 10 (rho); {left} left" in spends.description
    assert (summary["dataset_spent"], summary["lifetime_cap"], summary["left"]) == (total, "10", left)
    assert all(re.fullmatch(r"\d+\.\d+", r["rho"]) for r in rows)
    assert {Decimal(r["rho"]) for r in rows} <= {v for levels in budgets.values() for v in levels.values()}

    # The JSON-lines file keeps every field: run and flow run ids, table and population level.
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    measured = [e for e in events if e.get("event") == "measurement"]
    assert {(e["table"], e["level"]) for e in measured} == {(r["table"], r["level"]) for r in rows}
    assert all(e["run_id"] == run_id and e["flow_run_id"] == str(flow_run_id) and e["log_level"] == "info"
               for e in measured)
    # The Prefect run log: one readable line per event, key fields first, no JSON.
    messages = _log_messages(flow_run_id)
    assert not [m for m in messages if m.lstrip().startswith("{")]
    assert sum(bool(re.fullmatch(r"measurement: table=PH\w+ level=(usa|state)_\S+ status=drawn cells=\d+", m))
               for m in messages) == len(rows)
    # The input pass's stages by name and outcome only: its times and memory are functions of the
    # confidential records, and stay in the confidential file.
    assert "stage finished: stage='read, check, join and count'" in messages, messages
    assert not [m for m in messages if re.search(r"seconds=|peak_rss|bytes=|rows=", m)], messages
    finished = [e for e in events if e.get("event") == "stage finished"]
    assert finished and all(isinstance(e["seconds"], float) and e["peak_rss_mib"] > 0 for e in finished)


def test_validation_failure_ends_failed_before_any_spend(tmp_path):
    from flows.sdhc import us_flow

    data = tmp_path / "bad"
    shutil.copytree(DEMO / "us", data)
    persons = pd.read_csv(data / "persons.csv", dtype=str)
    persons.loc[persons.index[:13], "QAGE"] = "999"  # out of range: a rule of the persons suite
    persons.to_csv(data / "persons.csv", index=False)
    ledger = tmp_path / "us-ledger.jsonl"

    state = us_flow(**_params(tmp_path, "us", data=str(data)), return_state=True)
    assert state.is_failed()
    assert "input validation failed" in state.message and "QAGE" in state.message
    assert "999" not in state.message
    # The failing-row count (13) is a statistic of the confidential data: it stays in the report
    # inside the enclave, out of the Prefect database (state message, artifacts).
    message = state.message.replace(str(tmp_path), "TMP")
    assert not re.search(r"\b13\b", message) and "failing row" not in message
    assert not [e for e in _ledger_entries(ledger) if e["kind"] in ("RUN_STARTED", "INTENT")]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())

    artifacts = _artifacts(_flow_run_id(state))
    report = next(a for a in artifacts if a.key == "us-input-validation")
    rows = json.loads(report.data) if isinstance(report.data, str) else report.data
    assert any("QAGE" in r["columns"] for r in rows)
    assert "999" not in json.dumps(rows)
    assert all(set(r) == {"file", "columns", "rule"} for r in rows)
    assert not re.search(r"\b13\b", json.dumps(rows) + (report.description or ""))


class _FailAfter:
    """Makes storing the n-th noisy vector fail: the failure lands after its spend is recorded
    (INTENT) and before it is committed -- the worst place for a crash."""

    def __init__(self, monkeypatch, n: int) -> None:
        from phsafe.measurements import MeasurementStore

        self.calls = 0
        original = MeasurementStore.save

        def save(store, key, vector):
            self.calls += 1
            if self.calls == n:
                raise OSError("injected: disk went away")
            return original(store, key, vector)

        monkeypatch.setattr(MeasurementStore, "save", save)


def _intents(ledger: Path, run_id: str) -> Counter:
    return Counter(e["key"] for e in _ledger_entries(ledger) if e["kind"] == "INTENT" and e["run_id"] == run_id)


def test_injected_failure_then_resume_reuses_committed_measurements(tmp_path, monkeypatch):
    from flows.sdhc import us_flow
    from phsafe.ledger import read_ledger

    ledger = Path(_ledger(tmp_path, "us", cap="1.257281"))  # a cap of exactly one run
    injector = _FailAfter(monkeypatch, n=7)
    state = us_flow(**_params(tmp_path, "us", validate=False), return_state=True)
    assert state.is_failed()
    _verify(ledger)
    run_id = next(e["run_id"] for e in _ledger_entries(ledger) if e["kind"] == "RUN_STARTED")
    first = read_ledger(ledger).runs[run_id]
    committed_before = dict(first.reusable)
    lost = set(first.intents) - set(committed_before)
    assert len(lost) == 1 and committed_before  # one spend without its release; some committed
    monkeypatch.undo()

    # A new run on the same data is refused by the lifetime cap: no silent second spend.
    again = us_flow(**_params(tmp_path, "us", validate=False), return_state=True)
    assert again.is_failed() and "lifetime" in again.message
    assert set(_intents(ledger, run_id)) == set(first.intents)

    # Resuming re-spends the lost measurement: under the unchanged cap that is refused, loudly.
    refused = us_flow(**_params(tmp_path, "us", validate=False, resume=run_id,
                                resume_reason="disk replaced"), return_state=True)
    assert refused.is_failed() and "re-spending" in refused.message and "lifetime cap" in refused.message
    assert set(_intents(ledger, run_id)) == set(first.intents)
    _verify(ledger)

    # With the cap raised (and the reason recorded), the resume completes. Committed measurements
    # are read back, never re-drawn; the lost one is drawn again as a new, visible spend.
    resumed = us_flow(**_params(tmp_path, "us", validate=False, resume=run_id,
                                resume_reason="disk replaced", lifetime_cap=1.4,
                                cap_reason="re-spend of the measurement lost with the disk"),
                      return_state=True)
    assert resumed.is_completed(), resumed.message
    summary = resumed.result()
    assert summary["measurements"]["reused"] == len(committed_before)
    intents = _intents(ledger, run_id)
    assert all(intents[k] == 1 for k in committed_before)  # never re-spent
    assert all(intents[k] == 2 for k in lost)  # the lost one is a new, visible spend
    final = read_ledger(ledger).runs[run_id]
    for key, digest in committed_before.items():
        assert final.reusable[key] == digest
    assert final.charge() > final.planned_total  # the re-spend is charged on top of the plan
    _verify(ledger, Path(summary["outputs"]))
    assert injector.calls >= 7


def retry(flow_fn, state):  # noqa: ANN001, ANN201
    """What Retry in the UI does: the flow run is set AwaitingRetry and run again (same flow run
    id, same parameters), as a worker runs it."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import AwaitingRetry

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(_flow_run_id(state), AwaitingRetry(), force=True)
        flow_run = client.read_flow_run(_flow_run_id(state))
    return run_flow(flow_fn, flow_run=flow_run, parameters=flow_run.parameters, return_type="state")


def test_flow_retry_resumes_its_own_run_without_drawing_again(tmp_path, monkeypatch):
    from flows.sdhc import us_flow
    from phsafe import engine

    ledger = tmp_path / "us-ledger.jsonl"
    calls = []
    original = engine.check_outputs

    def flaky_check(run, config):  # fails once, after every measurement was committed
        calls.append(run.run_id)
        if len(calls) == 1:
            raise OSError("injected: report folder unavailable")
        return original(run, config)

    monkeypatch.setattr(engine, "check_outputs", flaky_check)
    failed = us_flow(**_params(tmp_path, "us", validate=False), return_state=True)
    assert failed.is_failed()
    assert "spend(s) of run us-" in failed.message and "Retry this flow run to resume it" in failed.message
    state = retry(us_flow, failed)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["measurements"]["drawn"] == 0 and summary["measurements"]["reused"] > 0
    kinds = [e["kind"] for e in _ledger_entries(ledger)]
    assert kinds.count("RUN_STARTED") == 1 and kinds.count("RUN_FAILED") == 1 and kinds.count("RUN_RESUMED") == 1
    assert set(_intents(ledger, summary["run_id"]).values()) == {1}  # nothing drawn twice
    _verify(ledger, Path(summary["outputs"]))


def test_release_flow_runs_both_datasets(tmp_path):
    from flows.sdhc import release_flow

    result = release_flow(
        us_config=str(DEMO / "us" / "config.json"), us_data=str(DEMO / "us"),
        us_ledger=_ledger(tmp_path, "us"),
        pr_config=str(DEMO / "pr" / "config.json"), pr_data=str(DEMO / "pr"),
        pr_ledger=_ledger(tmp_path, "pr"),
        output_root=str(tmp_path / "out"), validate_private_output=False, new_version="the demo's records",
    )
    assert set(result) == {"us", "pr"}
    for label, summary in result.items():
        assert summary["dataset"] == f"demo-{label}"
        _verify(Path(summary["ledger"]), Path(summary["outputs"]))


def test_us_flow_refuses_puerto_rico_config(tmp_path):
    from flows.sdhc import us_flow

    state = us_flow(**_params(tmp_path, "us", config=str(DEMO / "pr" / "config.json"), data=str(DEMO / "pr")),
                    return_state=True)
    assert state.is_failed() and "Puerto Rico" in state.message
    assert not [e for e in _ledger_entries(tmp_path / "us-ledger.jsonl") if e["kind"] != "LEDGER_INIT"]


def test_refusals_name_flow_parameters(tmp_path):
    from flows.sdhc import us_flow

    state = us_flow(**_params(tmp_path, "us", validate=False, resume="us-20260101T0000Z-00000000"),
                    return_state=True)
    assert state.is_failed()
    assert "the flow parameter resume names run us-20260101T0000Z-00000000" in state.message
    assert "--resume" not in state.message


def test_refusals_inside_tasks_name_flow_parameters(tmp_path, monkeypatch):
    """The engine's refusals are raised in tasks (threads): they too name flow parameters."""
    from flows.sdhc import us_flow
    from phsafe import engine
    from phsafe.errors import BudgetError
    from phsafe.parameters import option

    def refuse(run, plan, digests, fingerprint, sketch=None):
        raise BudgetError(f"over the lifetime cap: raise it with {option('lifetime_cap')} and {option('cap_reason')}")

    monkeypatch.setattr(engine, "open_run_in_ledger", refuse)
    state = us_flow(**_params(tmp_path, "us", validate=False), return_state=True)
    assert state.is_failed()
    assert "raise it with the flow parameter lifetime_cap and the flow parameter cap_reason" in state.message


def test_a_memory_limit_too_small_is_refused_before_any_spend(tmp_path):
    """The flow's memory_limit reaches the preflight: inputs that cannot be read within it are
    refused in one message naming the flow parameter, before the ledger's first INTENT."""
    from flows.sdhc import us_flow

    state = us_flow(**_params(tmp_path, "us", memory_limit="1M"), return_state=True)
    assert state.is_failed()
    assert "memory limit" in state.message and "the flow parameter memory_limit" in state.message
    assert "No privacy-loss budget was spent." in state.message
    # The sizes are functions of the confidential records: the message says where they are, not what.
    log_file = tmp_path / "phsafe-log.jsonl"
    assert state.message.startswith("the inputs need more than the memory limit; the figures are in the enclave "
                                    f"log at {log_file} "), state.message
    assert not re.search(r"\d", state.message.split(str(log_file))[1]), state.message
    figures = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert any(e["event"] == "the inputs need more than the memory limit" and e["needed_bytes"] > 1 << 20
               for e in figures)
    assert [e["kind"] for e in _ledger_entries(tmp_path / "us-ledger.jsonl")] == ["LEDGER_INIT"]


@pytest.mark.parametrize(("parameter", "value"), [("lifetime_cap", "a lot"), ("lifetime_cap", -1),
                                                  ("counting", "gpu"), ("dask_workers", 0),
                                                  ("memory_limit", "8 gigs"), ("memory_limit", "0G")])
def test_parameters_are_typed(tmp_path, parameter, value):
    from flows.sdhc import us_flow

    state = us_flow(**_params(tmp_path, "us", **{parameter: value}), return_state=True)
    assert state.is_failed() and parameter in state.message
    assert [e["kind"] for e in _ledger_entries(tmp_path / "us-ledger.jsonl")] == ["LEDGER_INIT"]


@pytest.mark.parametrize("flow_name", ["us", "release"])
def test_a_run_given_a_former_parameter_name_is_refused_in_one_line_naming_the_new_one(tmp_path, flow_name):
    """A deployment run as the worker runs it (Prefect's engine with the run's stored parameters,
    no Python call binding them first) given ``new_version_reason``, the flows' former name for
    ``new_version``: Failed before it starts, one line naming the new name, nothing spent."""
    from prefect.flow_engine import run_flow

    from flows.sdhc import release_flow, us_flow

    if flow_name == "us":
        flow, parameters = us_flow, _params(tmp_path, "us")
    else:
        flow, parameters = release_flow, dict(
            us_config=str(DEMO / "us" / "config.json"), us_data=str(DEMO / "us"), us_ledger=_ledger(tmp_path, "us"),
            pr_config=str(DEMO / "pr" / "config.json"), pr_data=str(DEMO / "pr"), pr_ledger=_ledger(tmp_path, "pr"),
            output_root=str(tmp_path / "out"))
    parameters.pop("new_version", None)
    parameters["new_version_reason"] = "the demo's records"
    state = run_flow(flow, parameters=parameters, return_type="state")
    assert state.is_failed(), state
    (line,) = state.message.splitlines()
    assert "new_version_reason is now new_version" in line and "deploy step" in line, line
    for label in ("us", "pr") if flow_name == "release" else ("us",):
        assert [e["kind"] for e in _ledger_entries(tmp_path / f"{label}-ledger.jsonl")] == ["LEDGER_INIT"]
    assert not (tmp_path / "out").exists()


def test_parameter_schema_has_numbers_and_choices():
    from prefect.utilities.callables import parameter_schema

    from flows.rehearsal import rehearsal_flow
    from flows.sdhc import us_flow

    schema = parameter_schema(us_flow).model_dump_for_openapi()
    properties = schema["properties"]
    cap_types = {s.get("type") for s in properties["lifetime_cap"]["anyOf"]}
    assert cap_types == {"number", "null"}
    assert properties["counting"]["enum"] == ["local", "dask"]
    assert {s.get("type") for s in properties["dask_workers"]["anyOf"]} == {"integer", "null"}
    assert any(s.get("type") == "string" and s.get("pattern") for s in properties["memory_limit"]["anyOf"])
    rehearsal = parameter_schema(rehearsal_flow).model_dump_for_openapi()["properties"]
    assert rehearsal["persons"]["type"] == "integer" and rehearsal["persons"]["minimum"] == 1
    assert rehearsal["input_format"]["enum"] == ["csv", "parquet", "parquet-partitioned"]


def test_lifetime_cap_is_exactly_the_decimal_typed():
    from fractions import Fraction

    from phsafe.parameters import PrivateRunParameters, exact_decimal

    assert exact_decimal(2.514562) == Fraction(2514562, 1000000)
    assert exact_decimal(1.4) == Fraction(14, 10)
    assert exact_decimal(3) == 3 and exact_decimal(None) is None
    given = PrivateRunParameters.from_flow({"config": "c.json", "data": "d", "lifetime_cap": 2.514562})
    assert given.lifetime_cap == Fraction(2514562, 1000000)


def _lost_signing_key(monkeypatch):  # noqa: ANN001 -- fine at preflight, unreadable at publish
    import phsafe.ledger
    from phsafe.errors import PHSafeError

    original, calls = phsafe.ledger.load_signing_key, []

    def flaky(path, public_key=None):  # noqa: ANN001
        calls.append(path)
        if len(calls) > 1:
            raise PHSafeError(f"cannot read the signing key {path}: no such file or directory (ENOENT)")
        return original(path, public_key)

    monkeypatch.setattr(phsafe.ledger, "load_signing_key", flaky)
    return "signing key"


def _full_disk_under_out(monkeypatch):  # noqa: ANN001
    import errno
    import os

    import phsafe.outputs

    def no_space(src, dst, *a, **k):  # noqa: ANN001
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(phsafe.outputs.shutil, "copyfile", no_space)
    return "ENOSPC"


def _another_run_publishes_first(monkeypatch):  # noqa: ANN001
    import phsafe.engine

    original = phsafe.engine.publish_release

    def race(release, target, run_id, manifest, **kw):  # noqa: ANN001
        shutil.copytree(release, target)
        return original(release, target, run_id, manifest, **kw)

    monkeypatch.setattr(phsafe.engine, "publish_release", race)
    return "already exists"


@pytest.mark.parametrize("fault", [_lost_signing_key, _full_disk_under_out, _another_run_publishes_first],
                         ids=["signing-key", "full-disk", "race"])
def test_a_publish_failure_ends_failed_and_resume_publishes_without_new_spends(tmp_path, monkeypatch, fault):
    """Issue 13 through the flow: a failure at publish time (after every spend) ends the flow
    Failed with the reason, records nothing as published, and a re-run with resume
    publishes -- to a new output root if the old one is unusable -- drawing nothing."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from flows.sdhc import us_flow
    from phsafe.ledger import read_ledger

    key = tmp_path / "signing.pem"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    ledger = Path(_ledger(tmp_path, "us"))
    reason = fault(monkeypatch)
    state = us_flow(**_params(tmp_path, "us", validate=False, signing_key=str(key)), return_state=True)
    assert state.is_failed() and reason in state.message, state.message
    assert "run the deployment with resume=us-" in state.message  # the reason says how to complete it
    monkeypatch.undo()
    (run_id, run), = read_ledger(ledger).runs.items()
    assert not run.published and len(run.reusable) == len(run.planned)
    spent = sum(_intents(ledger, run_id).values())
    resumed = us_flow(**_params(tmp_path, "us", validate=False, signing_key=str(key), resume=run_id,
                                resume_reason="publish failed", output_root=str(tmp_path / "out-2")),
                      return_state=True)
    assert resumed.is_completed(), resumed.message
    summary = resumed.result()
    assert summary["measurements"] == {"drawn": 0, "reused": len(run.planned), "noiseless": 0}
    assert sum(_intents(ledger, run_id).values()) == spent  # nothing spent again
    _verify(ledger, Path(summary["outputs"]))


def test_no_artifact_log_or_result_holds_a_plain_function_of_the_inputs(tmp_path):
    """Issue 12's digest attack against everything the flow puts in the Prefect database: every
    artifact, every log line of the run, the flow's result. Nothing matches any candidate's plain
    digest -- and the attack finds the hidden person in a plain digest (tests/system)."""
    from flows.sdhc import us_flow
    from phsafe import synthetic
    from tests.system.test_governance import HEX, STATES, Attack

    data = tmp_path / "data"
    synthetic.write(synthetic.generate(1500, STATES, seed=1207), data)
    raw = json.loads((DEMO / "us" / "config.json").read_text())
    raw["state_filter"], raw["dataset"] = STATES, "attack-test"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw))
    state = us_flow(**_params(tmp_path, "us", config=str(config), data=str(data)), return_state=True)
    assert state.is_completed(), state.message
    texts = [json.dumps(state.result())]
    for artifact in _artifacts(_flow_run_id(state)):
        texts += [json.dumps(artifact.data) if not isinstance(artifact.data, str) else artifact.data,
                  artifact.description or ""]
    texts += _log_messages(_flow_run_id(state))
    tokens: set[bytes] = set()
    for text in texts:
        for token in HEX.findall(text.encode()):
            tokens.update((token.lower(), token.lower()[:16]))
    assert tokens  # artifacts carry digests (of the noisy tables) and the checkpoint: material
    assert Attack(data, STATES, config).matches(tokens) == []


def test_flow_retry_does_not_record_a_file_planted_in_the_release_folder(tmp_path, monkeypatch):
    """A worker lost after the release was renamed into place, before the ledger recorded it; an
    insider drops a file into the folder. Retry goes through the publish step's check: the folder
    is refused, unrecorded; once it holds only the release, Retry records it."""
    from flows.sdhc import us_flow
    from phsafe import engine

    ledger = tmp_path / "us-ledger.jsonl"
    original = engine.publish_release

    def lost_after_rename(*args, **kwargs):  # noqa: ANN002, ANN003
        original(*args, **kwargs)
        raise OSError(5, "Input/output error")  # the worker's disk failed right after the rename

    monkeypatch.setattr(engine, "publish_release", lost_after_rename)
    failed = us_flow(**_params(tmp_path, "us", validate=False), return_state=True)
    assert failed.is_failed()
    monkeypatch.undo()
    (run_id,) = {e["run_id"] for e in _ledger_entries(ledger) if e["kind"] == "RUN_STARTED"}
    out = tmp_path / "out" / run_id
    assert (out / "manifest.json").is_file()
    (out / "PH1_num" / "LISTING.csv").write_text("MAFID,NAME\n100000001,Jane Doe\n")

    refused = retry(us_flow, failed)
    assert refused.is_failed()
    first_line = refused.message.splitlines()[0]
    assert "PH1_num/LISTING.csv" in first_line and "not part of run" in first_line, refused.message
    assert "OUTPUTS_PUBLISHED" not in {e["kind"] for e in _ledger_entries(ledger)}

    (out / "PH1_num" / "LISTING.csv").unlink()
    state = retry(us_flow, refused)
    assert state.is_completed(), state.message
    assert state.result()["measurements"]["drawn"] == 0
    assert [e["kind"] for e in _ledger_entries(ledger)].count("OUTPUTS_PUBLISHED") == 1
    _verify(ledger, out)


# --------------------------------------------------------------------------------------------
# A stop request (SIGTERM to the flow run's process) while the run spends
# --------------------------------------------------------------------------------------------


class _SignalAtACommit:
    """SIGTERM to this process right after the ``n``-th COMMITTED, as a stopping worker sends it
    to its flow run, at a moment every measurement thread waits for the ledger: this thread holds
    the ledger's file lock (a lock of its own, as another process would) until the flow's handler
    has recorded the request. So the INTENTs counted then are all there may ever be."""

    def __init__(self, monkeypatch, ledger: Path, n: int) -> None:
        import fcntl
        import os
        import signal
        import time

        from phsafe import interrupt
        from phsafe.ledger.runs import RunRecorder

        self.intents_at_signal: int | None = None
        original = RunRecorder.record_committed
        calls: list[int] = []

        def record_committed(recorder, receipt, *, noisy_digest):  # noqa: ANN001
            original(recorder, receipt, noisy_digest=noisy_digest)
            calls.append(1)
            if len(calls) == n:
                fd = os.open(f"{ledger}.lock", os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    self.intents_at_signal = _count(ledger, "INTENT")
                    os.kill(os.getpid(), signal.SIGTERM)
                    deadline = time.monotonic() + 60
                    while interrupt.requested() is None and time.monotonic() < deadline:
                        time.sleep(0.01)
                finally:
                    os.close(fd)

        monkeypatch.setattr(RunRecorder, "record_committed", record_committed)


def _count(ledger: Path, kind: str) -> int:
    return sum(e["kind"] == kind for e in _ledger_entries(ledger))


def test_sigterm_while_measuring_stops_at_a_safe_point_and_retry_resumes(tmp_path, monkeypatch):
    """The flow run's process gets SIGTERM (its worker is stopping) in the middle of the spends:
    no INTENT after the request, every recorded spend committed, RUN_FAILED "stopped by a
    signal", the flow run Failed saying so -- and its Retry completes with nothing spent twice."""
    from flows.sdhc import us_flow
    from phsafe.ledger import read_ledger

    ledger = Path(_ledger(tmp_path, "us"))
    stop = _SignalAtACommit(monkeypatch, ledger, n=5)
    log_file = tmp_path / "phsafe-log.jsonl"
    state = us_flow(**_params(tmp_path, "us", validate=False), return_state=True)
    monkeypatch.undo()
    assert state.is_failed(), state
    assert state.message.startswith("stopped by a signal (SIGTERM) at a safe point (no spend after it) -- "), \
        state.message
    assert "Retry this flow run to resume it" in state.message
    assert stop.intents_at_signal is not None and _count(ledger, "INTENT") == stop.intents_at_signal
    (run_id, run), = read_ledger(ledger).runs.items()
    assert set(run.intents) == set(run.reusable)  # the measurements in flight were committed
    assert run.failure_reason.startswith("stopped by a signal (SIGTERM)"), run.failure_reason
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [e["signal"] for e in events if e["event"].startswith("stop requested")] == ["SIGTERM"]
    messages = _log_messages(_flow_run_id(state))
    assert sum(m.startswith("stop requested by a signal") for m in messages) == 1, messages
    assert not [m for m in messages if "Traceback" in m or "Crash detected" in m], messages

    resumed = retry(us_flow, state)
    assert resumed.is_completed(), resumed.message
    final = read_ledger(ledger).runs[run_id]
    assert all(len(seqs) == 1 for seqs in final.intents.values()) and len(final.intents) == len(final.planned)
    assert final.charge() == final.planned_total
    _verify(ledger, Path(resumed.result()["outputs"]))


def test_a_stop_during_the_us_run_of_a_release_does_not_start_puerto_rico(tmp_path, monkeypatch):
    from flows.sdhc import release_flow

    us_ledger, pr_ledger = Path(_ledger(tmp_path, "us")), Path(_ledger(tmp_path, "pr"))
    _SignalAtACommit(monkeypatch, us_ledger, n=3)
    state = release_flow(
        us_config=str(DEMO / "us" / "config.json"), us_data=str(DEMO / "us"), us_ledger=str(us_ledger),
        pr_config=str(DEMO / "pr" / "config.json"), pr_data=str(DEMO / "pr"), pr_ledger=str(pr_ledger),
        output_root=str(tmp_path / "out"), new_version="the demo's records", return_state=True)
    assert state.is_failed(), state
    assert "us: stopped by a signal (SIGTERM) at a safe point" in state.message, state.message
    assert "pr: not started: stopped by a signal (SIGTERM) during the release; Retry the release to run it" \
        in state.message, state.message
    assert [e["kind"] for e in _ledger_entries(pr_ledger)] == ["LEDGER_INIT"]  # Puerto Rico untouched
    summary = next(a for a in _artifacts(_flow_run_id(state)) if a.key == "release-summary")
    assert "**failed**: not started: stopped by a signal (SIGTERM)" in summary.data


def test_an_unforeseen_error_reaches_prefect_as_its_type_only(tmp_path, monkeypatch):
    """A bug inside a stage whose message quotes a value: the flow run's state, its log lines and
    its task runs' states in the Prefect database name the error's type, never the value."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.sdhc import us_flow
    from phsafe import engine

    def broken_check(run, config):  # noqa: ANN001
        raise ValueError("unexpected MAFID 987654321012 in a row")

    monkeypatch.setattr(engine, "check_outputs", broken_check)
    state = us_flow(**_params(tmp_path, "us", validate=False), return_state=True)
    assert state.is_failed()
    assert state.message.startswith("internal error: ValueError (its frames are in the run's log file)"), \
        state.message
    messages = _log_messages(_flow_run_id(state))
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[_flow_run_id(state)])))
    texts = messages + [r.state.message or "" for r in task_runs if r.state is not None] + [state.message]
    assert any("internal error: ValueError" in t for t in texts)
    assert not [t for t in texts if "987654321012" in t], texts
