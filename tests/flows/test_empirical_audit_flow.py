"""The weekly empirical audit flow: one task per table, the report, its public artifacts.

A tiny audit (four states, PH3 and a unit table, a few runs, both calibrations); its alphas are
1e-6, so a correct release path fails this test with probability below 5e-6.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._empirical import write_config
from tests.flows.test_flows import _artifacts, _flow_run_id, _task_run_names

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_the_flow_audits_the_release_path_and_shows_its_report(tmp_path: Path) -> None:
    from flows.empirical_audit import FOLDER, MARKER, empirical_audit_flow

    config = write_config(tmp_path / "config.json", ["01", "02", "04", "05"])
    work = tmp_path / "work"
    old = work / FOLDER / "empirical-audit-20260101T0300Z-00000001"  # an earlier week's audit
    old.mkdir(parents=True)
    (old / MARKER).write_text("{}")
    # false-alarm rate: 5.0e-06 per run -- per calibration (two), a false VIOLATION or EXCESS and
    # a false WEAK each at most alpha = 1e-6 (Bonferroni, Clopper-Pearson); a false check at most
    # check_alpha = 1e-6 over both: 4e-6 + 1e-6.
    state = empirical_audit_flow(work_root=str(work), config=str(config), mode="quick", tables=["PH3", "PH8_denom"],
                                 runs=5, seed=4, alpha=1e-6, check_alpha=1e-6, sensitivity="both", keep=1,
                                 return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    folder = Path(result["folder"])
    assert result["verdict"] == "PASS" and result["seed"] == 4
    document = json.loads((folder / "audit.json").read_text())
    assert {(r["sensitivity"], r["table"]) for r in document["tables"]} == {
        (s, t) for s in ("paper", "exact") for t in ("PH3", "PH8_denom")}
    assert (folder / "audit.html").is_file() and (folder / "mu_bounds.png").is_file()
    assert not old.exists()  # keep=1: only this audit's folder is left

    run_id = _flow_run_id(state)
    names = _task_run_names(run_id)
    assert {"audit-PH3-paper", "audit-PH8_denom-paper", "audit-PH3-exact", "audit-PH8_denom-exact"} <= set(names)
    assert any(n.startswith("conclude-audit") for n in names)
    artifacts = {a.key: a for a in _artifacts(run_id)}
    assert set(artifacts) == {"empirical-audit-verdicts", "empirical-audit-report"}
    for artifact in artifacts.values():
        assert "Generated data only" in (artifact.description or "")
    rows = json.loads(artifacts["empirical-audit-verdicts"].data) if isinstance(
        artifacts["empirical-audit-verdicts"].data, str) else artifacts["empirical-audit-verdicts"].data
    assert {r["verdict"] for r in rows} <= {"PASS", "INCONCLUSIVE"} and all(r["runs"] == 5 for r in rows)
    assert {r["sensitivity"] for r in rows} == {"paper", "exact"}
    assert "data:image/png;base64," in artifacts["empirical-audit-report"].data
