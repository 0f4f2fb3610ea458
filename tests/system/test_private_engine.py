"""The private run end to end (spec §5-§7), on synthetic data through the documented API
``run_private(config, data, out, ...)``.

* Infinity budgets: the output equals the exact truncated counts (computed with the run's
  truncation key, read back from the ledger's RUN_STARTED entry), and a replay with that key
  gives the same output;
* every household at most tau: the output equals the non-private run's basis cells;
* VARIANCE and NOISE_DISTRIBUTION follow the formulas of spec §6 (zCDP and pure DP);
* Puerto Rico has no USA rows; a zero-budget level is absent; a table whose budgets are all zero
  has no folder, and neither has the table derived from it.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from phsafe import synthetic
from phsafe.config import load_config
from phsafe.engine import run_nonprivate
from phsafe import run_private
from phsafe.preprocess import prepare
from phsafe.reader import read_inputs
from phsafe.tables import TABLES
from phsafe.tabulate import tabulate

STATES = ["01", "06", "11"]
RACE_TABLES = ("PH1_num", "PH1_denom", "PH3", "PH4", "PH5_denom", "PH7", "PH8_denom")
TOTAL_TABLES = ("PH2", "PH6")
MEASURED = ("PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_denom", "PH6", "PH7", "PH8_denom")
ELEVEN = ("PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_num", "PH5_denom", "PH6", "PH7", "PH8_num",
          "PH8_denom")
PERSON_TABLES = ("PH1_num", "PH2", "PH3", "PH4", "PH6", "PH7")
LEVELS = {t: ("usa_*", "usa_A-G", "usa_H,I", "state_*", "state_A-G", "state_H,I") for t in RACE_TABLES}
LEVELS.update({t: ("usa_*", "state_*") for t in TOTAL_TABLES})
CODES = {"*": ["*"], "A-G": list("ABCDEFG"), "H,I": ["H", "I"]}
BASIS = {"PH1_num": [2, 3], "PH1_denom": [1], "PH2": [3, 4, 6, 7, 9, 10, 12, 13],
         "PH3": [2, 4, 5, 6, 7, 9, 10], "PH4": [2, 3], "PH5_denom": [1],
         "PH6": [3, 4, 5, 6, 8, 9, 10, 11, 13, 14, 15, 16, 18, 19, 20, 21], "PH7": [2, 3, 4],
         "PH8_denom": [2, 3]}
# Derived tables (spec §5): output cell -> source cells summed.
DERIVED = {"PH5_num": ("PH4", {2: [2], 3: [3]}), "PH8_num": ("PH7", {2: [2, 3], 3: [4]})}


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def us_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("us") / "data"
    synthetic.write(synthetic.generate(3000, STATES, seed=20240611), directory)
    return directory


@pytest.fixture(scope="module")
def pr_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pr") / "data"
    synthetic.write(synthetic.generate(800, ["72"], seed=7), directory)
    return directory


def budgets(value: Any, **overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {t: {lv: value for lv in LEVELS[t]} for t in MEASURED}
    for table, levels in overrides.items():
        out[table].update(levels)
    return out


def write_config(directory: Path, budget: dict, *, tau: int | dict[str, int] = 3,
                 states: list[str] = STATES, defn: str = "zcdp") -> Path:
    taus = tau if isinstance(tau, dict) else {t: tau for t in PERSON_TABLES}
    raw = {"privacy_defn": defn, "privacy_budget": budget, "tau": taus, "state_filter": states, "reader": "csv"}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(raw, indent=1), encoding="utf-8")  # inf -> Infinity
    return path


def options(tmp: Path, **kw: Any) -> dict[str, Any]:
    # What these tests check is the tables, their variances and the ledger: the input suites
    # (Great Expectations on each run's inputs, about a CPU-second a run) are not their point and
    # are checked elsewhere on the same synthetic records (tests/system/test_bad_inputs.py).
    return dict(ledger=tmp / "ledger" / "ledger.jsonl", non_confidential=True, validate=False, **kw)


def read_output(out: Path, table: str) -> pd.DataFrame:
    return pd.read_csv(out / table / f"{table}.csv", sep="|", dtype=str, keep_default_na=False)


def cells(frame: pd.DataFrame, table: str) -> dict[tuple[str, str, str, int], int]:
    """(REGION_TYPE, REGION_ID, ITERATION_CODE, cell) -> COUNT, zeros included."""
    cell_col = f"{table.upper()}_DATA_CELL"
    codes = frame["ITERATION_CODE"] if "ITERATION_CODE" in frame else ["*"] * len(frame)
    out = {}
    for rtype, rid, code, cell, count in zip(frame.REGION_TYPE, frame.REGION_ID, codes, frame[cell_col], frame.COUNT):
        key = (rtype, rid, code, int(cell))
        assert key not in out, key
        out[key] = int(count)
    return out


def ledger_entries(tmp: Path) -> list[dict]:
    path = tmp / "ledger" / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def exact_truncated(config_path: Path, data: Path, key: bytes | None) -> dict[str, dict]:
    """Table -> (REGION_TYPE, REGION_ID, code, cell) -> exact count over every level of the
    table with a positive budget (nation = sum of states); truncated unless ``key`` is None."""
    config = load_config(config_path)
    counts = tabulate(list(TABLES.values()), prepare(read_inputs(data), config.states),
                      taus=dict(config.tau) if key is not None else None, key=key)
    out: dict[str, dict] = {}
    for table in MEASURED:
        spec = TABLES[table]
        rows = {}
        for level in config.measured_levels(table):
            cube = counts[table].by_level[level.iteration]
            if level.geography.value == "USA":
                regions, cube = ["1"], cube.sum(axis=0, keepdims=True)
            else:
                regions = list(config.states)
            for r, rid in enumerate(regions):
                for c, code in enumerate(level.iteration.codes):
                    for b, cell in enumerate(spec.basis_numbers):
                        rows[(level.geography.value, rid, code, cell)] = int(cube[r, c, b])
        out[table] = rows
    return out


def derive(rows: dict, mapping: dict[int, list[int]]) -> dict:
    out: dict = {}
    for (rtype, rid, code, cell), count in rows.items():
        for new, sources in mapping.items():
            if cell in sources:
                out[(rtype, rid, code, new)] = out.get((rtype, rid, code, new), 0) + count
    return out


def expected_domain(table: str, levels: list[str], states: list[str]) -> set[tuple[str, str, str, int]]:
    """Every cell of the full domain of ``levels`` of a private output table (spec §7)."""
    if table in DERIVED:
        source, mapping = DERIVED[table]
        basis = sorted(mapping)
    else:
        basis = {"PH1_denom": [1], "PH5_denom": [1]}.get(table, BASIS[table])
    out = set()
    for level in levels:
        geo, it = level.split("_", 1)
        regions = [("USA", "1")] if geo == "usa" else [("STATE", s) for s in sorted(states)]
        for rtype, rid in regions:
            for code in CODES[it]:
                for cell in basis:
                    out.add((rtype, rid, code, cell))
    return out


# --------------------------------------------------------------------------------------------
# Infinity budgets: exact truncated counts
# --------------------------------------------------------------------------------------------


def test_infinity_budgets_equal_the_exact_truncated_counts(tmp_path: Path, us_data: Path) -> None:
    config = write_config(tmp_path / "cfg", budgets(float("inf")), tau=2)
    out = tmp_path / "out"
    result = run_private(config, us_data, out, **options(tmp_path))
    started = [e for e in ledger_entries(tmp_path) if e["kind"] == "RUN_STARTED"]
    assert len(started) == 1 and started[0]["run_id"] == result.run_id
    key = bytes.fromhex(started[0]["truncation_key"])
    assert len(key) == 16

    exact = exact_truncated(config, us_data, key)
    untruncated = exact_truncated(config, us_data, None)
    assert any(exact[t] != untruncated[t] for t in PERSON_TABLES)  # tau = 2 does truncate here

    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "parquet") == sorted(ELEVEN)
    for table in MEASURED:
        frame = read_output(out, table)
        assert set(frame.VARIANCE.astype(float)) == {0.0}
        assert set(frame.NOISE_DISTRIBUTION) == {"Discrete Gaussian"}
        assert cells(frame, table) == exact[table], table
    for table, (source, mapping) in DERIVED.items():
        frame = read_output(out, table)
        assert cells(frame, table) == derive(exact[source], mapping), table
        assert set(frame.VARIANCE.astype(float)) == {0.0}


def test_replay_with_the_recorded_truncation_key(tmp_path: Path, us_data: Path) -> None:
    config = write_config(tmp_path / "cfg", budgets(float("inf")), tau=1)
    key = "0123456789abcdef0123456789abcdef"
    run_private(config, us_data, tmp_path / "a", **options(tmp_path, truncation_key=key))
    run_private(config, us_data, tmp_path / "b", **options(tmp_path, truncation_key=key))
    started = [e for e in ledger_entries(tmp_path) if e["kind"] == "RUN_STARTED"]
    assert [e["truncation_key"] for e in started] == [key, key]
    exact = exact_truncated(config, us_data, bytes.fromhex(key))
    for table in ELEVEN:
        a, b = read_output(tmp_path / "a", table), read_output(tmp_path / "b", table)
        assert a.equals(b), table
    for table in MEASURED:
        assert cells(read_output(tmp_path / "a", table), table) == exact[table]


def test_households_within_tau_equal_the_nonprivate_basis_cells(tmp_path: Path, us_data: Path) -> None:
    units = pd.read_csv(us_data / "units.csv", dtype=str)
    biggest = int(units.FINAL_POP.astype(int).max())
    assert biggest > 3  # the data has households larger than the tau of the other tests
    config = write_config(tmp_path / "cfg", budgets(float("inf")), tau=biggest)
    run_private(config, us_data, tmp_path / "private", **options(tmp_path))
    run_nonprivate(config, us_data, tmp_path / "nonprivate", non_confidential=True)
    for table in ELEVEN:
        private = cells(read_output(tmp_path / "private", table), table)
        truth = cells(read_output(tmp_path / "nonprivate", table), table)
        # The private tables hold basis cells over the full domain; the ground truth has
        # those and the aggregates, and a missing row means 0.
        assert private, table
        for key, count in private.items():
            assert truth.get(key, 0) == count, (table, key)
        # No non-zero basis cell of the ground truth is missing from the private output.
        basis = {k for k in truth if k[3] in {c for *_, c in private}}
        assert {k for k in basis if truth[k]} <= set(private), table


# --------------------------------------------------------------------------------------------
# VARIANCE and NOISE_DISTRIBUTION (spec §6)
# --------------------------------------------------------------------------------------------


def test_zcdp_variance_is_delta_squared_over_two_rho(tmp_path: Path, us_data: Path) -> None:
    rho = {"usa_*": "0.25", "usa_A-G": "0.5", "usa_H,I": "0.125", "state_*": "1", "state_A-G": "2",
           "state_H,I": "0.0625"}
    budget = {t: {lv: float(rho[lv]) for lv in LEVELS[t]} for t in MEASURED}
    tau = {"PH1_num": 2, "PH2": 3, "PH3": 4, "PH4": 5, "PH6": 6, "PH7": 7}
    config = write_config(tmp_path / "cfg", budget, tau=tau)
    out = tmp_path / "out"
    run_private(config, us_data, out, **options(tmp_path))

    def delta(table: str) -> int:
        return 2 * tau[table] + 2 if table in tau else 2

    for table in ELEVEN:
        frame = read_output(out, table)
        source, mapping = DERIVED.get(table, (table, None))
        assert set(frame.NOISE_DISTRIBUTION) == {"Discrete Gaussian"}
        counts = frame.COUNT.astype(np.int64)  # integers, possibly negative
        assert (counts.astype(str) == frame.COUNT).all()
        levels = list(LEVELS[source])
        assert set(cells(frame, table)) == expected_domain(table, levels, STATES), table
        for row in frame.itertuples():
            level = ("usa_" if row.REGION_TYPE == "USA" else "state_") + (
                "*" if source in TOTAL_TABLES else {"*": "*", "H": "H,I", "I": "H,I"}.get(row.ITERATION_CODE, "A-G"))
            sigma2 = Fraction(delta(source) ** 2) / (2 * Fraction(Decimal(rho[level])))
            n_summed = len(mapping[int(getattr(row, f"{table.upper()}_DATA_CELL"))]) if mapping else 1
            assert float(row.VARIANCE) == pytest.approx(float(sigma2 * n_summed), rel=1e-12), (table, row)


def test_puredp_variance_is_the_geometric_formula(tmp_path: Path, us_data: Path) -> None:
    eps = {"usa_*": 0.5, "usa_A-G": 0.25, "usa_H,I": 1.0, "state_*": 2.0, "state_A-G": 0.33, "state_H,I": 4.0}
    budget = {t: {lv: eps[lv] for lv in LEVELS[t]} for t in MEASURED}
    config = write_config(tmp_path / "cfg", budget, tau=5, defn="puredp")
    out = tmp_path / "out"
    run_private(config, us_data, out, **options(tmp_path))
    for table in ELEVEN:
        frame = read_output(out, table)
        source, mapping = DERIVED.get(table, (table, None))
        assert set(frame.NOISE_DISTRIBUTION) == {"Two-Sided Geometric"}
        for row in frame.itertuples():
            level = ("usa_" if row.REGION_TYPE == "USA" else "state_") + (
                "*" if source in TOTAL_TABLES else {"*": "*", "H": "H,I", "I": "H,I"}.get(row.ITERATION_CODE, "A-G"))
            s = (12 if source in PERSON_TABLES else 2) / eps[level]
            q = math.exp(-1 / s)
            n_summed = len(mapping[int(getattr(row, f"{table.upper()}_DATA_CELL"))]) if mapping else 1
            assert float(row.VARIANCE) == pytest.approx(n_summed * 2 * q / (1 - q) ** 2, rel=1e-12), (table, row)


# --------------------------------------------------------------------------------------------
# Which rows and folders exist
# --------------------------------------------------------------------------------------------


def test_puerto_rico_has_no_usa_rows(tmp_path: Path, pr_data: Path) -> None:
    zero_usa = {t: {lv: 0 for lv in LEVELS[t] if lv.startswith("usa")} for t in MEASURED}
    budget = budgets(0.5, **zero_usa)
    config = write_config(tmp_path / "cfg", budget, tau=4, states=["72"])
    out = tmp_path / "out"
    run_private(config, pr_data, out, **options(tmp_path))
    for table in ELEVEN:
        frame = read_output(out, table)
        assert len(frame) > 0, table
        assert set(frame.REGION_TYPE) == {"STATE"}, table
        assert set(frame.REGION_ID) == {"72"}, table
        source = DERIVED.get(table, (table,))[0]
        levels = [lv for lv in LEVELS[source] if lv.startswith("state")]
        assert set(cells(frame, table)) == expected_domain(table, levels, ["72"]), table


def test_production_pr_config_has_no_usa_rows(tmp_path: Path, pr_data: Path) -> None:
    from tests.conftest import PR_CONFIG

    out = tmp_path / "out"
    run_private(PR_CONFIG, pr_data, out, **options(tmp_path))
    for table in ELEVEN:
        frame = read_output(out, table)
        assert "USA" not in set(frame.REGION_TYPE), table
        assert set(frame.REGION_ID) == {"72"}, table


def test_zero_budget_levels_are_absent(tmp_path: Path, us_data: Path) -> None:
    budget = budgets(
        0.5,
        PH3={"state_A-G": 0, "usa_H,I": 0},
        PH2={"usa_*": 0},
        PH7={"state_*": 0, "state_A-G": 0, "state_H,I": 0},
        PH1_denom={"usa_*": 0, "usa_A-G": 0, "usa_H,I": 0, "state_*": 0, "state_H,I": 0},
    )
    config = write_config(tmp_path / "cfg", budget, tau=3)
    out = tmp_path / "out"
    run_private(config, us_data, out, **options(tmp_path))
    for table in ELEVEN:
        source = DERIVED.get(table, (table,))[0]
        measured = [lv for lv in LEVELS[source] if budget[source][lv] != 0]
        frame = read_output(out, table)
        assert set(cells(frame, table)) == expected_domain(table, measured, STATES), table
    ph3 = read_output(out, "PH3")
    assert not ((ph3.REGION_TYPE == "STATE") & ph3.ITERATION_CODE.isin(list("ABCDEFG"))).any()
    assert not ((ph3.REGION_TYPE == "USA") & ph3.ITERATION_CODE.isin(["H", "I"])).any()
    assert set(read_output(out, "PH2").REGION_TYPE) == {"STATE"}
    assert set(read_output(out, "PH8_num").REGION_TYPE) == {"USA"}
    ph1d = read_output(out, "PH1_denom")
    assert set(zip(ph1d.REGION_TYPE, ph1d.ITERATION_CODE)) == {("STATE", c) for c in "ABCDEFG"}


def test_all_zero_tables_produce_no_folder(tmp_path: Path, us_data: Path) -> None:
    zero = {lv: 0 for lv in LEVELS["PH4"]}
    budget = budgets(0.5, PH4=zero, PH8_denom=dict(zero), PH6={"usa_*": 0, "state_*": 0},
                     PH7=dict(zero))
    config = write_config(tmp_path / "cfg", budget, tau=3)
    out = tmp_path / "out"
    result = run_private(config, us_data, out, **options(tmp_path))
    absent = {"PH4", "PH5_num", "PH6", "PH7", "PH8_num", "PH8_denom"}
    present = set(ELEVEN) - absent
    folders = {p.name for p in out.iterdir() if p.is_dir() and p.name != "parquet"}
    assert folders == present
    assert not any(name.split("/")[0] in absent or Path(name).stem in absent for name in result.files)
    manifest = json.loads((out / "manifest.json").read_text())
    assert not any(Path(name).stem in absent for name in manifest["files"])
    # The plan (and the ledger) hold no measurement of those tables: no budget was spent.
    intents = [e["key"].split("/")[0] for e in ledger_entries(tmp_path) if e["kind"] == "INTENT"]
    assert intents and not set(intents) & absent
    assert result.plan is not None
    assert result.plan.total == Fraction(1, 2) * len(result.plan.measurements)


def test_state_filter_without_records_still_releases_the_full_domain(tmp_path: Path, us_data: Path) -> None:
    """The released regions come from the state filter, never from which states hold records
    (spec §4): a Puerto Rico run over data with no Puerto Rico record releases every cell."""
    from tests.conftest import PR_CONFIG

    out = tmp_path / "out"
    run_private(PR_CONFIG, us_data, out, **options(tmp_path))
    for table in ELEVEN:
        frame = read_output(out, table)
        source = DERIVED.get(table, (table,))[0]
        levels = [lv for lv in LEVELS[source] if lv.startswith("state")]
        assert set(cells(frame, table)) == expected_domain(table, levels, ["72"]), table


def test_a_ledger_made_anew_at_the_same_path_is_not_mistaken_for_the_old(tmp_path: Path) -> None:
    """The engine keeps one handle per ledger file, open; a ledger removed and made anew at the
    same path (a throwaway ledger of ``accuracy --overwrite``) is opened as what it is. While the
    old handle holds its file open, that file's inode cannot be reused by the new one."""
    import shutil

    from phsafe.config import PrivacyDefinition
    from phsafe.engine import open_ledger
    from phsafe.publog import create_ledger

    path = tmp_path / "enclave" / "ledger.jsonl"
    create_ledger(path, lifetime_cap=Fraction(3), reason="test", privacy_defn=PrivacyDefinition.ZCDP,
                  non_confidential=True, code_version="test")
    first = open_ledger(path)
    assert open_ledger(path) is first  # the same handle while the file is the same
    inode = path.stat().st_ino
    shutil.rmtree(path.parent)
    create_ledger(path, lifetime_cap=Fraction(3), reason="test", privacy_defn=PrivacyDefinition.ZCDP,
                  non_confidential=True, code_version="test")
    assert path.stat().st_ino != inode
    reopened = open_ledger(path)
    assert reopened is not first and reopened.state.policy.ledger_id != first.state.policy.ledger_id
    reopened.lineage_key()  # the key beside it is this ledger's
