"""The Census Bureau's estimate files from real releases: names, columns, formats and row order as
MODEL_BASED_ESTIMATES.md lists them, the production's checks and summary metrics, and reading
them back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import phsafe
from phsafe import postprocess as pp
from phsafe.postprocess import census, checks
from tests.conftest import PR_CONFIG, US_CONFIG


# --------------------------------------------------------------------------------------------
# The Census files of a real release
# --------------------------------------------------------------------------------------------

SPEC_COLUMNS = {
    "count": '"GEOID"|"REGION_TYPE"|"ITERATION_CODE"|"DATA_CELL"|"COUNT_NOISY"|"VARIANCE"|"MOE_NOISY"|"PRED"|"PRED_LO"|'
             '"PRED_HI"',
    "PH1": '"GEOID"|"REGION_TYPE"|"ITERATION_CODE"|"DATA_CELL"|"COUNT_NOISY_NUM"|"VARIANCE_NUM"|"MOE_NOISY_NUM"|'
           '"COUNT_NOISY_DENOM"|"VARIANCE_DENOM"|"MOE_NOISY_DENOM"|"RATIO_NOISY"|"RATIO_PRED"|"PRED_NUM"|"PRED_DENOM"|'
           '"RATIO_PRED_LO"|"RATIO_PRED_HI"',
    "PH8": '"GEOID"|"REGION_TYPE"|"ITERATION_CODE"|"DATA_CELL"|"COUNT_NOISY_DENOM"|"VARIANCE_DENOM"|"MOE_NOISY_DENOM"|'
           '"COUNT_NOISY_NUM"|"VARIANCE_NUM"|"MOE_NOISY_NUM"|"RATIO_NOISY"|"RATIO_PRED"|"RATIO_PRED_LO"|"RATIO_PRED_HI"',
}
ROWS_PER_GROUP = {"PH1": 3, "PH2": 13, "PH3": 10, "PH4": 3, "PH5": 3, "PH6": 21, "PH7": 4, "PH8": 3}


def _release(root: Path, config: Path, states: list[str], persons: int, seed: int, budgets) -> Path:
    """A published private release of synthetic data, its budgets replaced by ``budgets(key, b)``."""
    from phsafe import synthetic
    from phsafe import run_private

    data = root / "data"
    synthetic.write(synthetic.generate(persons, states, seed=seed), data)
    raw = json.loads(config.read_text())
    raw["state_filter"] = states
    for levels in raw["privacy_budget"].values():
        for key in levels:
            levels[key] = budgets(key, levels[key])
    if config == PR_CONFIG:
        raw["privacy_defn"] = "puredp"  # Puerto Rico in pure DP: the geometric noise
    (root / "config.json").write_text(json.dumps(raw))
    run_private(root / "config.json", data, root / "out", ledger=root / "ledger.jsonl", non_confidential=True,
                validate=False)  # the synthetic records are valid; the estimate files are what is tested
    return root / "out"


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A US release (zCDP, two states, the production budgets x 40: sigma about 19 at state
    level) and a Puerto Rico one (pure DP, epsilon 2 per level), each post-processed."""
    out = {}
    for label, config, states, budgets in (
            ("us", US_CONFIG, ["01", "06"], lambda key, b: 40 * b),
            ("pr", PR_CONFIG, ["72"], lambda key, b: 0 if key.startswith("usa") else 2.0)):
        root = tmp_path_factory.mktemp(label)
        out[label] = _release(root, config, states, 900, 21, budgets)
        out[label + "-pp"] = pp.postprocess(out[label], root / "pp", seed=3).destination
    return out


def test_file_names_and_columns_exactly_as_the_spec_lists_them(releases: dict[str, Path]) -> None:
    us, pr = releases["us-pp"], releases["pr-pp"]
    expected_us = {f"PH{k}/estimates/PH{k}_{level}_trunc_normal.csv" for k in range(1, 9) for level in ("nation", "state")}
    expected_pr = {f"PH{k}/estimates/PH{k}_PR_state_trunc_normal.csv" for k in range(1, 9)}
    assert {str(p.relative_to(us)) for p in us.glob("PH*/estimates/*.csv")} == expected_us
    assert {str(p.relative_to(pr)) for p in pr.glob("PH*/estimates/*.csv")} == expected_pr
    for folder in (us, pr):
        for path in folder.glob("PH*/estimates/*.csv"):
            table = path.parent.parent.name
            header = path.read_text().splitlines()[0]
            expected = SPEC_COLUMNS["PH1"] if table in ("PH1", "PH5") else SPEC_COLUMNS.get(table, SPEC_COLUMNS["count"])
            assert header == expected, path


def test_census_files_format_and_row_order(releases: dict[str, Path]) -> None:
    release, dest = releases["us"], releases["us-pp"]
    text = (dest / "PH2/estimates/PH2_nation_trunc_normal.csv").read_text().splitlines()
    first = text[1].split("|")
    assert first[0] == '"1"' and first[1] == '"USA"' and first[2] == '"*"'  # the nation's GEOID: our departure
    assert not first[3].startswith('"') and first[3] == "2"  # numbers unquoted; the first built marginal
    for path in dest.glob("PH*/estimates/*.csv"):
        for line in path.read_text().splitlines()[1:]:
            fields = line.split("|")
            assert all(f.startswith('"') and f.endswith('"') for f in fields[:3]), line
            assert not any(f.startswith('"') for f in fields[3:]), line
            assert not any(f.endswith(".0") or ("." in f and f.endswith("0") and "e" not in f) for f in fields[3:]), line
    frames = {t: census.read_file(dest / f"{t}/estimates/{t}_state_trunc_normal.csv") for t in ROWS_PER_GROUP}
    for table, frame in frames.items():
        groups = frame.groupby(["GEOID", "ITERATION_CODE"]).size()
        assert (groups == ROWS_PER_GROUP[table]).all(), table
    # Count tables: the marginal rows first, by marginal in the spec's order, each sorted by
    # (GEOID, ITERATION_CODE); then the released rows in the private file's order.
    ph3 = frames["PH3"]
    private = pd.read_csv(release / "PH3" / "PH3.csv", sep="|", dtype=str)
    private = private[private.REGION_TYPE == "STATE"]
    built = ph3.iloc[: len(ph3) - len(private)]
    assert list(built["DATA_CELL"].drop_duplicates()) == [3, 8, 1]
    for _, block in built.groupby("DATA_CELL", sort=False):
        keys = list(zip(block["GEOID"], block["ITERATION_CODE"]))
        assert keys == sorted(keys)
    released = ph3.iloc[len(built):]
    assert list(zip(released["GEOID"], released["ITERATION_CODE"], released["DATA_CELL"])) == \
        list(zip(private["REGION_ID"], private["ITERATION_CODE"], private["PH3_DATA_CELL"].astype(int)))
    # marginal rows sum their parts' noisy counts and variances
    key = ["GEOID", "ITERATION_CODE"]
    parts = released[released["DATA_CELL"].isin([4, 5, 6, 7])].groupby(key)[["COUNT_NOISY", "VARIANCE"]].sum()
    own = built[built["DATA_CELL"] == 3].set_index(key)[["COUNT_NOISY", "VARIANCE"]]
    pd.testing.assert_frame_equal(own.sort_index(), parts.sort_index(), check_exact=False, rtol=1e-12)
    assert np.allclose(ph3["MOE_NOISY"], 1.6448536269514722 * np.sqrt(ph3["VARIANCE"]), rtol=1e-12)
    # PH1: the numerator rows (cells 2, 3), then the built totals; PH8: the denominator rows, then the totals
    for table in ("PH1", "PH5", "PH8"):
        cells = frames[table]["DATA_CELL"].to_numpy()
        n = len(cells) // 3
        assert set(cells[: 2 * n]) == {2, 3} and set(cells[2 * n:]) == {1}
    ph1 = frames["PH1"]
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.allclose(ph1["RATIO_NOISY"], ph1["COUNT_NOISY_NUM"] / ph1["COUNT_NOISY_DENOM"], equal_nan=True)
    # PRED is our posterior mean rounded, PRED_LO/HI our equal-tailed interval
    ours = pd.read_parquet(dest / "PH3.parquet")
    ours = ours[ours.REGION_TYPE == "STATE"].rename(columns={"REGION_ID": "GEOID", "PH3_DATA_CELL": "DATA_CELL"})
    merged = ph3.merge(ours, on=["GEOID", "ITERATION_CODE", "DATA_CELL"], validate="one_to_one")
    assert len(merged) == len(ph3)
    assert (merged["PRED"] == np.rint(merged["ESTIMATE"])).all()
    assert (merged["PRED_LO"] == merged["CI90_ET_LOWER"]).all() and (merged["PRED_HI"] == merged["CI90_ET_UPPER"]).all()


def test_read_estimates_labels_like_read_release(releases: dict[str, Path]) -> None:
    dest = releases["us-pp"]
    estimates = phsafe.read_estimates(dest)
    assert list(estimates) == ["PH1", "PH2", "PH3", "PH4", "PH5", "PH6", "PH7", "PH8"]
    ph3 = estimates["PH3"]
    assert list(ph3.columns[:8]) == ["GEOID", "GEOID_LABEL", "REGION_TYPE", "REGION_TYPE_LABEL", "ITERATION_CODE",
                                     "ITERATION_CODE_LABEL", "DATA_CELL", "DATA_CELL_LABEL"]
    assert str(ph3["PRED"].dtype) == "Int64" and ph3["DATA_CELL"].dtype == "int64"
    assert isinstance(ph3["GEOID"].dtype, pd.CategoricalDtype) and ph3["GEOID"].dtype.ordered
    nation = ph3[ph3.REGION_TYPE == "USA"]
    assert set(nation["GEOID"]) == {"1"} and set(nation["GEOID_LABEL"]) == {"United States"}
    row = ph3[(ph3.GEOID == "01") & (ph3.ITERATION_CODE == "D") & (ph3.DATA_CELL == 3)].iloc[0]
    assert row.GEOID_LABEL == "Alabama" and row.ITERATION_CODE_LABEL == "Asian alone" and row.DATA_CELL_LABEL == "Own child"
    state_file = census.read_file(dest / "PH3/estimates/PH3_state_trunc_normal.csv")
    assert ph3[ph3.REGION_TYPE == "STATE"]["PRED"].astype(int).tolist() == state_file["PRED"].astype(int).tolist()
    ours = phsafe.read_estimates(dest, files="ours", labels=False)
    assert {"PH1", "PH5", "PH8", "PH2", "PH8_denom"} <= set(ours) and "REGION_ID_LABEL" not in ours["PH2"]
    (dest / "PH3/estimates/PH3_state_trunc_normal.csv").write_text("tampered\n")
    with pytest.raises(phsafe.PHSafeError, match="differs from its SHA-256"):
        phsafe.read_estimates(dest)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def _files(dest: Path) -> dict[str, tuple[pd.DataFrame, list[str]]]:
    return {str(p.relative_to(dest)): (census.read_file(p), checks.read_header(p))
            for p in sorted(dest.glob("PH*/estimates/*.csv"))}


def test_checks_pass_on_our_files_and_fail_on_planted_violations(releases: dict[str, Path]) -> None:
    dest = releases["pr-pp"]
    bounds = checks.ratio_bounds({"PH1_num": 10, "PH4": 10, "PH7": 10})
    files = _files(dest)
    clean = checks.check_estimates(files, bounds)
    assert clean[clean.SEVERITY == checks.ERROR]["PASSED"].all()
    written = pd.read_csv(dest / "checks.csv")
    assert len(written) == len(clean) and set(written["CHECK"]) == set(clean["CHECK"])

    def failed(rel: str, plant) -> set[str]:  # the checks that fail once ``plant`` modifies a copy
        frame, header = files[rel]
        frame, header = frame.copy(), list(header)
        plant(frame, header)
        result = checks.check_estimates({rel: (frame, header)}, bounds)
        return set(result.loc[~result["PASSED"], "CHECK"])

    count = "PH3/estimates/PH3_PR_state_trunc_normal.csv"
    ratio = "PH5/estimates/PH5_PR_state_trunc_normal.csv"
    own = "PH8/estimates/PH8_PR_state_trunc_normal.csv"
    assert "pred_integer" in failed(count, lambda f, h: f.__setitem__("PRED", f["PRED"].where(f.index != 3, -2.0)))
    assert "pred_integer" in failed(count, lambda f, h: f.__setitem__("PRED", f["PRED"].where(f.index != 3, 7.5)))
    assert "within_6_sigma" in failed(count, lambda f, h: f.__setitem__(
        "PRED", f["PRED"].where(f.index != 0, f["COUNT_NOISY"] + 7 * np.sqrt(f["VARIANCE"]) + 1).round()))
    assert "interval" in failed(count, lambda f, h: f.__setitem__("PRED_LO", f["PRED_HI"] + 1))
    assert failed(count, lambda f, h: h.reverse()) == {"columns"}
    assert "ratio_range" in failed(ratio, lambda f, h: f.__setitem__("RATIO_PRED", f["RATIO_PRED"].where(f.index != 1, 11.0)))
    # a family average below 2, within the production's looser rule (>= 0): ours flags it
    below = failed(ratio, lambda f, h: f.__setitem__("RATIO_PRED_LO", f["RATIO_PRED_LO"].where(f["DATA_CELL"] != 1, 1.5)))
    assert below == {"ratio_bounds"}
    assert "ratio_range" in failed(own, lambda f, h: f.__setitem__("RATIO_PRED", f["RATIO_PRED"] * 0 + 0.5))


def test_a_failing_check_publishes_nothing(releases: dict[str, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from phsafe.postprocess import command

    real = command.count_file_frame

    def broken(table: str, estimates: pd.DataFrame) -> pd.DataFrame:
        frame = real(table, estimates)
        if table == "PH4":
            frame.loc[0, "PRED"] = -1.0  # a defect: a negative count estimate
        return frame

    monkeypatch.setattr(command, "count_file_frame", broken)
    with pytest.raises(pp.EstimateChecksFailed, match="pred_integer.*PH4"):
        pp.postprocess(releases["pr"], tmp_path / "never", seed=1)
    assert not (tmp_path / "never").exists() and not list(tmp_path.glob(".never*"))


def test_the_summary_metrics(releases: dict[str, Path]) -> None:
    dest = releases["us-pp"]
    summary = pd.read_csv(dest / "summary.csv")
    files = _files(dest)
    assert set(summary["FILE"]) == set(files) and set(summary["SOURCE"]) == {"NM", "PRED"}
    ours = summary[summary.SOURCE == "PRED"]
    assert (ours["PERCENT_OUT_OF_BOUNDS"][ours.TABLE.isin(["PH1", "PH5", "PH8"])] == 0).all()
    ph2 = files["PH2/estimates/PH2_state_trunc_normal.csv"][0]
    row = summary[(summary.FILE == "PH2/estimates/PH2_state_trunc_normal.csv") & (summary.SOURCE == "NM")].iloc[0]
    assert row["MIN"] == ph2["COUNT_NOISY"].min() and row["PERCENT_OUT_OF_BOUNDS"] == pytest.approx(
        100 * (ph2["COUNT_NOISY"] <= 0).mean())
    assert row["INTERVAL_LENGTH"] == pytest.approx(np.median(2 * ph2["MOE_NOISY"]))
    long = pd.read_csv(dest / "summary" / "out_ratio.csv")
    assert list(long.columns) == ["table", "variable", "harden"]
    assert {"ph1_nm", "ph1_pred", "ph8_pred"} <= set(long["table"]) and set(long["variable"]) == {"min", "max", "p_bad", "len"}
    report = (dest / "report.md").read_text()
    assert "Checks of the estimate files" in report and "Summary metrics" in report
