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

pytestmark = pytest.mark.usefixtures("prefect_server")


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
                           persons=20_000, pr_persons=4_000, trials=2, keep=2, alpha=1e-6, return_state=True)
    # (The noise is unseeded, as in production: alpha bounds the chance that this correct run is
    # called a failure, per dataset -- 1e-6 here instead of the weekly default of 1%.)
    # false-alarm rate: 2.0e-06 per run -- bound: the two datasets' verdicts at family-wise alpha 1e-6 each (Bonferroni
    # over the rows, a Poisson-binomial count inside its binomial tolerance)
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

    # Signed with a throwaway key of its own, made in its folder, and verified as auditors do.
    assert sorted(p.name for p in (folder / "keys").iterdir()) == ["public-key.pem", "signing-key.pem"]
    assert ((folder / "keys" / "signing-key.pem").stat().st_mode & 0o777) == 0o600
    from phsafe.signing import public_key_fingerprint

    fingerprint = public_key_fingerprint((folder / "keys" / "public-key.pem").read_bytes())
    assert result["verified"] == {label: f"verified with the throwaway public key {fingerprint[:16]}"
                                  for label in ("us", "pr")}
    for manifest in (folder / "runs").glob("*/manifest.json"):
        checkpoint = json.loads(manifest.read_text())["checkpoint"]
        assert checkpoint["signature"] and "BEGIN PUBLIC KEY" in checkpoint["public_key"]
    for label in ("us", "pr"):
        synth = json.loads((folder / "inputs" / label / "synth.json").read_text())
        config = json.loads(Path(US_CONFIG if label == "us" else PR_CONFIG).read_text())
        assert sorted(synth["states"]) == sorted(config["state_filter"])
        assert (folder / "accuracy" / label / "plots" / "coverage.png").is_file()

    # The coverage table: every table x level of both datasets, against 0.90, within tolerance.
    artifacts = {a.key: a for a in _artifacts(_flow_run_id(state))}
    assert set(artifacts) == {"rehearsal-moe-coverage", "rehearsal-accuracy-errors", "rehearsal-accuracy-report"}
    coverage = artifacts["rehearsal-moe-coverage"]
    assert "non-confidential" in coverage.description and "every table and level within tolerance" in coverage.description
    assert "nominal 0.90" in coverage.description
    rows = _rows(coverage)
    # Few columns, so that the table fits the UI's artifact pane (the errors are a table of their own).
    assert all(list(r) == ["dataset", "table", "level", "n", "coverage", "expected", "tolerance", "verdict"]
               for r in rows)
    us_levels = {(r["table"], r["level"]) for r in rows if r["dataset"] == "us"}
    assert ("PH1_num", "usa_*") in us_levels and ("PH8_num", "state_A-G") in us_levels
    assert not any(lv.startswith("usa") for t, lv in ((r["table"], r["level"]) for r in rows if r["dataset"] == "pr"))
    assert all(r["verdict"] == "ok" for r in rows)
    for r in rows:
        low, high = (float(x) for x in r["tolerance"].strip("[]").split(","))
        assert low <= float(r["coverage"]) <= high
        assert abs(float(r["expected"]) - 0.9) < 0.03
    pooled = {r["dataset"]: float(r["coverage"]) for r in rows if r["table"] == "ALL"}
    # About 90%: the US pools 21,216 cells x trials; Puerto Rico 408, whose standard error (0.015) put a correct run
    # outside 0.85-0.95 about once in 1,650 runs (6.0e-4): its band is wider (the verdict's tolerance is the test).
    # false-alarm rate: 5.7e-10 per run -- exact: the Poisson-binomial laws of the pooled counts (every cell's exact
    # MOE coverage) outside 0.85-0.95 (US, 2.8e-124) and 0.80-0.98 (Puerto Rico, 5.7e-10)
    assert len(pooled) == 2 and 0.85 < pooled["us"] < 0.95 and 0.80 < pooled["pr"] < 0.98
    errors = _rows(artifacts["rehearsal-accuracy-errors"])
    assert {(r["dataset"], r["table"], r["level"]) for r in errors if r["table"] != "ALL"} == \
        {(r["dataset"], r["table"], r["level"]) for r in rows if r["table"] != "ALL"}
    assert [(r["dataset"], r["level"]) for r in errors if r["table"] == "ALL"] == [("us", "ALL"), ("pr", "ALL")]
    # Every error a number; the pooled rows positive. (A row of one unit-table cell at sigma 301.5 has MAE 0 when
    # both trials drew 0 noise: 2.5e-5 per run summed over the rows, too often to assert MAE > 0 on every row.)
    # false-alarm rate: 1.0e-300 per run -- bound: a pooled row's MAE is 0 only if all its noises are 0
    assert all(len(r) == 7 and float(r["MAE"]) >= 0 for r in errors)
    assert all(float(r["MAE"]) > 0 for r in errors if r["table"] == "ALL")

    # The report shows the plots inside the UI (data: URIs), never links the UI cannot open.
    report = artifacts["rehearsal-accuracy-report"].data
    assert "file://" not in report and "non-confidential" in report
    assert report.count("](data:image/png;base64,") >= 2 * 4  # coverage, MAE, errors, |errors| per dataset
    assert "us: MOE coverage per table and level" in report and "pr: Mean absolute error" in report
    assert f"verified with the throwaway public key {fingerprint[:16]}" in report
    assert str(folder / "accuracy" / "us" / "report.html") in report

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
    assert state.is_failed()  # (the US pooled row outside its tolerance: below)
    assert "outside its binomial tolerance" in state.message and "ALL (measured tables)" in state.message
    rows = _rows(next(a for a in _artifacts(_flow_run_id(state)) if a.key == "rehearsal-moe-coverage"))
    pooled = {r["dataset"]: r for r in rows if r["table"] == "ALL"}
    # Twice the variance: coverage P(|Z| < 1.645/sqrt 2) = 0.755 instead of 0.90. The US row pools
    # 10K cells: certainly outside. Puerto Rico's pools 200, whose tolerance at the rehearsal's
    # family-wise alpha is wide enough to hold 0.755 now and then (unseeded noise): not asserted.
    # false-alarm rate: 1.2e-07 per run -- exact: Poisson-binomial laws at every cell's coverage under twice its
    # variance: P(US pooled >= 0.8) = 1.1e-25 (it is then also inside its tolerance, the flow's only way to pass), P(Puerto
    # Rico pooled >= 0.9) = 1.2e-7
    assert pooled["us"]["verdict"] == "OUTSIDE" and float(pooled["us"]["coverage"]) < 0.8, pooled["us"]
    assert float(pooled["pr"]["coverage"]) < 0.9, pooled["pr"]


def test_rehearsal_fails_when_a_release_does_not_verify(tmp_path, monkeypatch):
    """A release the auditors' check rejects fails the rehearsal, naming the dataset and why: here
    a released table altered between publication and the check."""
    from flows.rehearsal import rehearsal_flow
    from phsafe.audit import verify as audit_verify

    original = audit_verify.verify

    def after_someone_edits_a_table(ledger, *, outputs=None, **kwargs):
        table = sorted(Path(outputs).rglob("*.csv"))[0]
        table.write_text(table.read_text() + "\n")
        return original(ledger, outputs=outputs, **kwargs)

    monkeypatch.setattr(audit_verify, "verify", after_someone_edits_a_table)
    state = rehearsal_flow(us_config=str(US_CONFIG), pr_config=str(PR_CONFIG), work_root=str(tmp_path),
                           persons=5_000, pr_persons=2_000, trials=1, return_state=True)
    assert state.is_failed()
    for label in ("us", "pr"):
        assert (f"{label}: its release does not verify as the auditors check it (phsafe audit verify --outputs "
                "--public-key)") in state.message, state.message
    assert "SHA-256 differs from the digest logged" in state.message
    report = next(a for a in _artifacts(_flow_run_id(state)) if a.key == "rehearsal-accuracy-report").data
    assert "DOES NOT VERIFY" in report and "not measured" in report  # no accuracy on a broken release
