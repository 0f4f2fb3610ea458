"""The weekly rehearsal flow: synthetic inputs, the production flows on them, accuracy, verdict.

Small sizes here (the deployment's default is 300,000 persons and 10 trials).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import PR_CONFIG, US_CONFIG
from tests.flows.test_flows import _artifacts, _flow_run_id, _log_messages

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.slow]


def _subflow_runs(parent_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])))


def _rows(artifact) -> list[dict]:
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def test_rehearsal_runs_the_production_path_on_synthetic_inputs(tmp_path):
    from flows.rehearsal import MARKER, rehearsal_flow

    work = tmp_path / "rehearsals"
    for old in ("rehearsal-20260101T0300Z-00000001", "rehearsal-20260108T0300Z-00000002"):  # earlier weeks
        (work / old).mkdir(parents=True)
        (work / old / MARKER).write_text(json.dumps({"started": old.split("-")[1]}))
    (work / "not-a-rehearsal").mkdir()

    state = rehearsal_flow(us_config=str(US_CONFIG), pr_config=str(PR_CONFIG), work_root=str(work),
                           persons=20_000, pr_persons=4_000, trials=2, keep=2, alpha=1e-4, return_state=True)
    # (The noise is unseeded, as in production: alpha bounds the chance that this correct run is
    # called a failure -- 1e-4 here instead of the weekly default of 1%.)
    assert state.is_completed(), state.message
    result = state.result()
    folder = Path(result["folder"])
    assert set(result["pooled_moe_coverage"]) == {"us", "pr"}

    # The production flows ran as subflows on the synthetic inputs, non-confidential, with
    # throwaway ledgers inside the rehearsal's folder; their artifacts have keys of their own.
    subflows = {r.name: r for r in _subflow_runs(_flow_run_id(state))}
    assert {n.rsplit("-", 3)[0] for n in subflows} == {"rehearsal-us", "rehearsal-pr"}, subflows
    for run in subflows.values():
        assert run.state.is_completed()
        keys = {a.key for a in _artifacts(run.id)}
        label = "us" if "-us-" in run.name else "pr"
        assert keys == {f"nonconfidential-{label}-{what}" for what in
                        ("budget-spends", "input-validation", "output-validation", "output-manifest",
                         "ledger-checkpoint")}
    assert sorted(p.name for p in (folder / "ledgers").glob("*.jsonl")) == ["pr.jsonl", "us.jsonl"]
    for label in ("us", "pr"):
        synth = json.loads((folder / "inputs" / label / "synth.json").read_text())
        config = json.loads(Path(US_CONFIG if label == "us" else PR_CONFIG).read_text())
        assert sorted(synth["states"]) == sorted(config["state_filter"])
        assert (folder / "accuracy" / label / "plots" / "coverage.png").is_file()

    # The coverage table: every table x level of both datasets, against 0.90, within tolerance.
    artifacts = {a.key: a for a in _artifacts(_flow_run_id(state))}
    assert set(artifacts) == {"rehearsal-moe-coverage", "rehearsal-accuracy-report"}
    coverage = artifacts["rehearsal-moe-coverage"]
    assert "non-confidential" in coverage.description and "every table and level within tolerance" in coverage.description
    rows = _rows(coverage)
    us_levels = {(r["table"], r["level"]) for r in rows if r["dataset"] == "us"}
    assert ("PH1_num", "usa_*") in us_levels and ("PH8_num", "state_A-G") in us_levels
    assert not any(lv.startswith("usa") for t, lv in ((r["table"], r["level"]) for r in rows if r["dataset"] == "pr"))
    assert all(r["verdict"] == "ok" and r["nominal"] == "0.9000" for r in rows)
    for r in rows:
        low, high = (float(x) for x in r["tolerance"].strip("[]").split(","))
        assert low <= float(r["MOE coverage"]) <= high
        assert abs(float(r["expected"]) - 0.9) < 0.03
    pooled = [r for r in rows if r["table"] == "ALL"]
    assert len(pooled) == 2 and all(0.85 < float(r["MOE coverage"]) < 0.95 for r in pooled)
    assert all(float(r["MAE"]) > 0 for r in rows if r["table"] != "ALL")
    report = artifacts["rehearsal-accuracy-report"].data
    assert str(folder / "accuracy" / "us" / "report.html") in report and "coverage.png" in report
    assert "non-confidential" in report

    # The accuracy experiment's 2·K runs log one line a stage in the run log, not every event.
    messages = _log_messages(_flow_run_id(state))
    assert any("private runs and their truncated exact counts: 2 trials -- done" in m for m in messages)
    assert any("metrics, plots and report -- done" in m for m in messages)
    assert not [m for m in messages if m.startswith("measurement:")]

    # The two most recent rehearsals are kept (this one and last week's); older ones deleted.
    assert sorted(p.name for p in work.iterdir()) == sorted(
        [folder.name, "rehearsal-20260108T0300Z-00000002", "not-a-rehearsal"])


def test_rehearsal_fails_when_the_noise_is_wider_than_the_stated_moe(tmp_path, monkeypatch):
    """A defect the production flows cannot see (every table is valid, every spend recorded):
    noise of twice the stated variance. The rehearsal's coverage test catches it."""
    from flows.rehearsal import rehearsal_flow
    from phsafe import noise

    original = noise._build_mechanism

    def twice_the_variance(m):
        mechanism, scale = original(m)

        def draw(values):
            exact = np.asarray(values)
            return (np.asarray(mechanism(values)) + np.asarray(mechanism(values)) - exact).tolist()

        return draw, scale

    monkeypatch.setattr(noise, "_build_mechanism", twice_the_variance)
    state = rehearsal_flow(us_config=str(US_CONFIG), pr_config=str(PR_CONFIG), work_root=str(tmp_path),
                           persons=5_000, pr_persons=2_000, trials=1, return_state=True)
    assert state.is_failed()
    assert "outside its binomial tolerance" in state.message and "ALL (measured tables)" in state.message
    rows = _rows(next(a for a in _artifacts(_flow_run_id(state)) if a.key == "rehearsal-moe-coverage"))
    pooled = [r for r in rows if r["table"] == "ALL"]
    assert all(r["verdict"] == "OUTSIDE" for r in pooled)
    # Twice the variance: coverage P(|Z| < 1.645/sqrt 2) = 0.755 instead of 0.90 (the US row
    # pools 10K cells; Puerto Rico's 200 only bound it loosely).
    assert float(next(r for r in pooled if r["dataset"] == "us")["MOE coverage"]) < 0.8
