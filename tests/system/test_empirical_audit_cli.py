"""``phsafe audit empirical`` as an auditor runs it: no inputs, a report folder, an exit status.

Tiny runs (a few states, a handful of runs): the command's shape is tested here, its power in
tests/unit/test_empirical_audit.py and benchmarks/bench_empirical_audit.py. A run of correct code
can fail only by a verdict or a statistical check at the given alphas: see each test's rate.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from click.testing import CliRunner

from phsafe.cli import main
from phsafe.schema import FILES, ColumnKind
from tests._empirical import write_config

STATES = ["01", "02", "04", "05"]


def _write_config(path: Path) -> Path:
    return write_config(path, STATES)


def test_it_refuses_input_data_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "cef"
    data.mkdir()
    (data / "persons.csv").write_text("RTYPE,MAFID,QAGE,CENHISP,CENRACE,RELSHIP\n")
    out = tmp_path / "audit"
    result = CliRunner().invoke(main, ["audit", "empirical", str(data), "--out", str(out)])
    assert result.exit_code == 2
    assert "takes no input data" in result.output and "refused" in result.output
    assert not out.exists()
    # A confidential input cannot come in by another door either: there is no such option.
    result = CliRunner().invoke(main, ["audit", "empirical", "--data", str(data), "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()


def test_a_small_audit_writes_its_report(tmp_path: Path) -> None:
    config = _write_config(tmp_path / "config.json")
    out = tmp_path / "audit"
    args = ["audit", "empirical", "--config", str(config), "--tables", "PH3,PH1_denom", "--runs", "6", "--seed",
            "12", "--alpha", "1e-6", "--check-alpha", "1e-6", "--sensitivity", "both", "--out", str(out)]
    # false-alarm rate: 1.0e-05 per run -- two audits of correct code must pass (this one and the
    # --overwrite re-run below), each of two calibrations: a false VIOLATION/EXCESS and a false
    # WEAK at most alpha = 1e-6 each per calibration (Bonferroni, Clopper-Pearson), a false check
    # at most check_alpha = 1e-6: 5e-6 per audit.
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert re.search(r"PASS: wrote .*audit\.html and audit\.json", result.output)
    document = json.loads((out / "audit.json").read_text())
    assert document["seed"] == 12 and document["mode"] == "quick" and not document["failed"]
    assert document["sensitivity"] == ["paper", "exact"] and document["config"]["sensitivity"] == "paper"
    assert "generates itself" in document["data"]
    for sensitivity in ("paper", "exact"):
        assert {(r["table"], r["level"]) for r in document["tables"] if r["sensitivity"] == sensitivity} >= {
            ("PH3", "all"), ("PH3", "state_A-G"), ("PH1_denom", "all"), ("PH1_denom", "state_*")}
    for row in document["tables"]:
        for key in ("table", "level", "mu_lb", "mu_ub", "mu_reach", "mu_declared", "epsilon_hat", "epsilon_declared",
                    "delta", "budget_scale", "verdict", "runs", "seconds", "sensitivity", "ceiling", "conclusive",
                    "runs_to_separate"):
            assert key in row
        assert row["runs"] == 6 and row["delta"] == 1e-10
        # Quick mode: PH3 at its production budgets, the unit tables at 100x (marked).
        assert row["budget_scale"] == (1 if row["table"] == "PH3" else 100)
        # Six runs tell nothing at the nation's levels: said so, with the runs that would.
        if row["level"].startswith("usa"):
            assert row["verdict"] == "INCONCLUSIVE" and row["runs_to_separate"] > 6
    assert {c["name"] for c in document["checks"]} >= {"truncation key fresh", "noise scale"}
    assert {(e["table"], e["level"]) for e in document["side_by_side"]} >= {("PH3", "state_A-G")}

    # The page opens offline: every image is a file beside it; nothing is fetched.
    page = (out / "audit.html").read_text()
    assert "PASS" in page and "x100 (scaled)" in page and "side by side" in page and "INCONCLUSIVE" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    for src in re.findall(r'<img src="([^"]+)"', page):
        assert (out / src).is_file()

    # The folder is not overwritten by accident.
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "already holds files" in again.output
    assert CliRunner().invoke(main, args + ["--overwrite", "--runs", "3"]).exit_code == 0


def test_a_pool_of_processes_runs_the_same_audit(tmp_path: Path) -> None:
    """The runs are cut into chunks whose coins are seeded apart: two processes draw the same
    canaries in and out as one (the noise and the keys are fresh either way); the CPU time counts
    the workers' too."""
    from phsafe.audit.empirical import AuditSettings, run_audit
    from phsafe.audit.empirical.audit import CHUNK_RUNS
    from phsafe.config import load_config

    settings = AuditSettings(config=load_config(_write_config(tmp_path / "config.json")), tables=("PH1_denom", "PH3"),
                             runs=2 * CHUNK_RUNS + 5, seed=8, background_persons=300, sensitivity="exact")
    # false-alarm rate: 1.0e-30 per run -- only seeded coins are compared; the one draw asserted on
    # is the truncation keys' distinctness: 170 fresh 16-byte keys collide with probability below
    # 170^2 / 2^129 (birthday bound).
    one = run_audit(settings)
    two = run_audit(replace(settings, workers=2))
    for key, tally in one.tallies.items():
        other = two.tallies[key]
        assert (tally.negatives, tally.positives) == (other.negatives, other.positives), key
    assert [r.runs for r in one.rows] == [r.runs for r in two.rows] == [2 * CHUNK_RUNS + 5] * len(one.rows)
    commitments = next(c for c in two.checks if c.name == "truncation key fresh")
    assert f"{2 * (2 * CHUNK_RUNS + 5)} distinct key commitments" in commitments.detail
    assert two.cpu_seconds >= sum(r.cpu_seconds for r in two.rows if r.level == "all") > 0


def _csv(columns: dict[str, np.ndarray], stem: str, path: Path) -> None:
    frame = {}
    n = len(columns["MAFID"])
    for c in FILES[stem]:
        if c.name in columns:
            values = columns[c.name]
            frame[c.name] = [f"{int(v):0{c.width}d}" for v in values] if c.kind is ColumnKind.CODE else values
        else:  # geography the engine does not read
            frame[c.name] = ["1" if c.name == "REGIONCE" else "0" * (c.width or 1)] * n
    pd.DataFrame(frame).to_csv(path, index=False)


def _merge(parts):  # type: ignore[no-untyped-def]
    from phsafe.audit.empirical.population import Records

    return Records(*({k: np.concatenate([getattr(p, stem)[k] for p in parts]) for k in getattr(parts[0], stem)}
                     for stem in ("persons", "units", "geo")))


def test_the_audit_data_passes_the_input_validation(tmp_path: Path) -> None:
    """Every canary of every table, in and out, with the background: valid inputs (spec §1)."""
    import phsafe
    from phsafe.audit.empirical.audit import AuditSettings, _renumbered, audit_background, plan_audit
    from phsafe.audit.empirical.population import Records, TableRecords
    from phsafe.config import load_config

    config_path = _write_config(tmp_path / "config.json")
    settings = AuditSettings(config=load_config(config_path), background_persons=500, seed=3)
    plan = plan_audit(settings)
    background = audit_background(settings)
    sizes = {stem: len(getattr(background, stem)["MAFID"]) for stem in ("persons", "units", "geo")}
    for inside in (False, True):
        merged = background
        for table_plan in plan.tables:
            layout = _renumbered(table_plan.layout, merged)  # MAFIDs no earlier record uses
            records = TableRecords(background, layout, settings.config.states, table_plan.measurements,
                                   settings.tau(table_plan.table)).records(np.full(len(layout.canaries), inside))
            canaries = Records(*({k: v[sizes[stem]:] for k, v in getattr(records, stem).items()}
                                 for stem in ("persons", "units", "geo")))
            merged = _merge([merged, canaries])
        assert len(np.unique(merged.units["MAFID"])) == len(merged.units["MAFID"])
        data = tmp_path / f"data-{'in' if inside else 'out'}"
        data.mkdir()
        for stem in ("persons", "units", "geo"):
            _csv(getattr(merged, stem), stem, data / f"{stem}.csv")
        report = phsafe.validate(config_path, data)
        assert report.ok, report.to_text()
