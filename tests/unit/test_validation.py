"""The validation suites and the machinery around them (phsafe.validation).

The suites in ``expectations/`` are the reviewed statement of the rules; these tests pin them to
the facts they restate (phsafe/schema.py, the tables, the DHC paper's age table), and check that
reports count failing rows exactly and never carry a value.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phsafe.accounting import plan_run
from phsafe.config import parse_config
from phsafe.outputs import private_tables, write_tables
from phsafe.schema import FILES, PUERTO_RICO, STATE_CODES, ColumnKind
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TAU_TABLES
from phsafe.validation import (
    Failure,
    ValidationMachineryError,
    ValidationReport,
    _combos,
    _config,
    _gx,
    _inputs,
    _read,
    _worker,
    validate,
    validate_outputs,
)
from phsafe.intake import validate_inputs
from phsafe.validation._report import write_report
from phsafe.validation._run import SuiteRun
from phsafe.validation._suites import load_suite, suites_dir
from tests.conftest import END_TO_END, PR_CONFIG, US_CONFIG

SUITES = sorted(p.stem for p in suites_dir().glob("*.json"))
FILE_STEMS = ("persons", "units", "geo", "config", "output")


def _expectations(suite: str) -> list[dict]:
    return load_suite(suite).raw["expectations"]


def _by_id(suite: str) -> dict[str, dict]:
    return {e["meta"]["rule_id"]: e for e in _expectations(suite)}


# ------------------------------------------------------------------------------ the suites
def test_every_expected_suite_exists() -> None:
    assert {"persons", "units", "geo", "config", "outputs", "persons_in_units", "households",
            "units_geo"} <= set(SUITES)


@pytest.mark.parametrize("suite", SUITES)
def test_suite_metadata_is_complete(suite: str) -> None:
    s = load_suite(suite)
    frames = s.raw["meta"]["phsafe"]["frames"]
    ids = [r.rule_id for r in s.rules]
    assert len(ids) == len(set(ids))
    for rule in s.rules:
        assert rule.description and rule.description != rule.type
        assert rule.file in FILE_STEMS
        assert rule.frame in frames, f"{rule.rule_id}: frame {rule.frame} is not described"


@pytest.mark.parametrize("suite", SUITES)
def test_great_expectations_accepts_every_expectation(suite: str) -> None:
    s = load_suite(suite)
    for frame in s.frames:
        rules = s.rules_for(frame)
        # _suite refuses a suite from which GX silently dropped an expectation.
        assert len(_gx._suite(s, frame, rules).expectations) == len(rules)


@pytest.mark.parametrize("stem", list(FILES))
def test_file_suites_agree_with_schema(stem: str) -> None:
    rules = _by_id(stem)
    columns = FILES[stem]
    assert rules[f"{stem}.header"]["kwargs"]["column_list"] == [c.name for c in columns]
    for c in columns:
        assert rules[f"{stem}.{c.name}.present"]["type"] == "expect_column_values_to_not_be_null"
        if c.kind is ColumnKind.CODE:
            assert rules[f"{stem}.{c.name}.format"]["kwargs"]["regex"] == f"^[0-9]{{{c.width}}}$"
            if c.allowed is not None:
                assert rules[f"{stem}.{c.name}.domain"]["kwargs"]["value_set"] == c.allowed_strings()
            else:
                assert f"{stem}.{c.name}.domain" not in rules
        elif c.allowed is not None:
            assert rules[f"{stem}.{c.name}.domain"]["kwargs"]["value_set"] == sorted(c.allowed)
        else:
            kwargs = rules[f"{stem}.{c.name}.range"]["kwargs"]
            assert (kwargs["min_value"], kwargs["max_value"]) == (c.minimum, c.maximum)
    known = {c.name for c in columns}
    for rule in load_suite(stem).rules:
        assert rule.referenced_columns() <= known, rule.rule_id


# DHC TopDown paper, Table 2 (CEF edit constraints, constraint P3), rows about RELSHIP 20-36.
DHC_AGE_RANGES = {
    "20": (15, 115), "21": (15, 115), "22": (15, 115), "23": (15, 115), "24": (15, 115),
    "25": (0, 89), "26": (0, 89), "27": (0, 89), "28": (0, 115), "29": (30, 115), "30": (0, 74),
    "31": (30, 115), "32": (15, 89), "33": (0, 115), "34": (0, 115), "35": (0, 20), "36": (0, 115),
}


def test_age_rules_follow_the_dhc_edit_constraints() -> None:
    covered: dict[str, tuple[int, int]] = {}
    for rule_id, exp in _by_id("persons").items():
        if not rule_id.startswith("persons.age."):
            continue
        cond, kwargs = exp["kwargs"]["row_condition"], exp["kwargs"]
        codes = cond["parameter"] if cond["operator"] == "IN" else [cond["parameter"]]
        for code in codes:
            assert code not in covered
            covered[code] = (kwargs["min_value"], kwargs["max_value"])
    narrower = {k: v for k, v in DHC_AGE_RANGES.items() if v != (0, 115)}
    assert covered == narrower


def test_config_suite_agrees_with_the_tables() -> None:
    rules = _by_id("config")
    keys = [f"privacy_budget.{t}.{lv.config_key}" for t in MEASURED_TABLES for lv in TABLE_LEVELS[t]]
    keys += [f"tau.{t}" for t in TAU_TABLES]
    assert rules["config.required_keys"]["kwargs"]["value_set"] == keys
    assert rules["config.known_keys"]["kwargs"]["value_set"] == keys
    assert set(rules["config.state_code"]["kwargs"]["value_set"]) == STATE_CODES | {PUERTO_RICO}


@pytest.mark.parametrize("path", [US_CONFIG, PR_CONFIG])
def test_production_configs_pass_the_config_suite(path: Path) -> None:
    raw = json.loads(path.read_text())
    report = validate({"config": _config.flatten(raw)}, "config")
    assert report.ok, report.to_text()
    assert report.results[0]["statistics"]["evaluated_expectations"] == len(load_suite("config").rules)


def test_config_suite_reports_every_broken_rule_at_once() -> None:
    raw = json.loads(US_CONFIG.read_text())
    raw["tau"]["PH3"] = 0
    raw["privacy_budget"]["PH2"]["state_*"] = -1
    raw["privacy_budget"]["PH1_num"]["usa_all"] = raw["privacy_budget"]["PH1_num"].pop("usa_*")
    raw["state_filter"].append("72")
    report = validate({"config": _config.flatten(raw)}, "config")
    assert {f.rule_id for f in report.failures} == {
        "config.tau_positive", "config.budget_nonnegative", "config.known_keys", "config.required_keys",
        "config.pr_alone",
    }


def test_config_error_becomes_a_failure_naming_the_key(tmp_path: Path) -> None:
    raw = json.loads(US_CONFIG.read_text())
    raw["tau"]["PH3"] = 0
    path = tmp_path / "my_config.json"
    path.write_text(json.dumps(raw))
    config_file, failure = _config.load(path)
    assert config_file.config is None and config_file.data == path.read_bytes()
    assert failure == Failure("my_config.json", ("tau.PH3",), "must be at least 1", None, None, "config.load", "key")


# ------------------------------------------------------------------------------ the wrapper
def _persons_frame(n: int = 1000) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame({
        "RTYPE": pd.Series(["3"] * n, dtype="str"),
        "MAFID": rng.integers(100_000_001, 900_000_000, n).astype(float),
        "QAGE": np.full(n, 40.0),
        "CENHISP": np.full(n, 1.0),
        "CENRACE": pd.Series(["01"] * n, dtype="str"),
        "RELSHIP": pd.Series(["34"] * n, dtype="str"),
    })


def test_validate_counts_failing_rows_exactly_and_quotes_no_value() -> None:
    frame = _persons_frame()
    frame.loc[frame.index[:37], "QAGE"] = 131.0
    frame.loc[frame.index[100:103], "CENRACE"] = "7"
    report = validate({"persons": frame}, "persons", file_names={"persons": "persons.csv"})
    got = {(f.rule_id, f.failing_rows) for f in report.failures}
    assert got == {("persons.QAGE.range", 37), ("persons.CENRACE.format", 3), ("persons.CENRACE.domain", 3)}
    text = report.to_text() + json.dumps(report.to_dict()) + json.dumps(report.results)
    assert "131" not in text
    assert not any(f"{m:.0f}" in text for m in frame.MAFID)
    assert "persons.csv [QAGE]: QAGE is between 0 and 115 (37 failing rows)" in report.to_text()


def test_distinct_rows_give_the_same_counts() -> None:
    frame = pd.concat([_persons_frame()] * 5, ignore_index=True)
    frame.loc[frame.index[::7], "RELSHIP"] = "38"  # RTYPE 3 with a GQ code
    exact = SuiteRun("persons")
    exact.check("persons", frame.drop(columns=["MAFID"]), exclude={"persons.header"})
    distinct = SuiteRun("persons")
    distinct.check("persons", frame.drop(columns=["MAFID"]), exclude={"persons.header"}, distinct=True)
    counts = [{f.rule_id: f.failing_rows for f in run.tally.failures({})} for run in (exact, distinct)]
    assert counts[0] == counts[1] == {"persons.hu_relship": len(frame.index[::7])}


def test_results_hold_counts_only() -> None:
    frame = _persons_frame(50)
    frame.loc[0, "CENRACE"] = "SECRET"
    s = load_suite("persons")
    for result in _gx.run(s, "persons", frame, s.rules_for("persons"), counts=True):
        assert set(result.counts) <= set(_gx_safe_keys())
    report = validate({"persons": frame}, "persons")
    for r in report.results[0]["results"]:
        assert set(r["result"]) <= set(_gx_safe_keys()) | {"unexpected_percent"}
        assert r["exception_info"]["exception_message"] is None
    assert "SECRET" not in json.dumps(report.results)


def _gx_safe_keys() -> tuple[str, ...]:
    from phsafe.validation._report import _SAFE_RESULT_KEYS

    return _SAFE_RESULT_KEYS


def test_validate_refuses_an_unknown_frame() -> None:
    with pytest.raises(ValueError, match="no frame"):
        validate({"people": _persons_frame(3)}, "persons")


def test_a_rule_without_its_parameter_is_noted_not_skipped_silently() -> None:
    frame = pd.DataFrame({"TABBLKST": pd.Series(["01"], dtype="str")})
    report = validate({"geo": frame}, "geo")
    assert {f.rule_id for f in report.failures} == {"geo.header"}  # the frame has one column
    assert any("state_filter" in n and "geo.TABBLKST.state_filter" in n for n in report.notes)


def test_a_defect_surfaces_without_the_message_of_its_exception(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("invalid literal for int(): '123456789'")

    monkeypatch.setattr(_inputs.ValidationSetup, "of", broken)
    with pytest.raises(ValidationMachineryError) as info:
        validate_inputs(US_CONFIG, tmp_path)
    assert "123456789" not in str(info.value) and "ValueError" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_header_description_never_echoes_a_data_row() -> None:
    expected = [c.name for c in FILES["persons"]]
    text = _read.describe_header(["3", "123456789", "44", "1", "01", "20"], expected)
    assert not re.search(r"[0-9]{2,}", text.replace("6 other columns", ""))
    assert "missing RTYPE" in text
    assert _read.describe_header([*expected, "EXTRA"], expected) == "unexpected EXTRA"


def test_weighted_counts_are_the_counts_of_every_row() -> None:
    """A rule judged once per distinct combination counts each failing combination's rows --
    element, missing and unexpected counts alike -- as an evaluation of every row would."""
    frame = pd.DataFrame({"QAGE": [10.0, 40.0, np.nan, 131.0, 16.0],
                          "RELSHIP": pd.Series(["20", "20", "20", "34", "21"], dtype="str")})
    weights = np.array([3, 1000, 7, 5, 2**33 + 1], dtype=np.int64)
    every_row = frame.loc[frame.index.repeat(np.minimum(weights, 2000))].reset_index(drop=True)
    rule_ids = ("persons.QAGE.range", "persons.age.householder", "persons.RELSHIP.domain")
    weighted = _gx.evaluate(_gx.Job("persons", "persons", rule_ids, frame, weights))
    plain = _gx.evaluate(_gx.Job("persons", "persons", rule_ids, every_row, None))
    by_rule = {r.rule_id: r for r in weighted}
    assert by_rule["persons.QAGE.range"].counts == {"element_count": int(weights.sum()), "unexpected_count": 5,
                                                    "missing_count": 7}
    assert by_rule["persons.age.householder"].counts["unexpected_count"] == 3  # the 10-year-old
    assert by_rule["persons.age.householder"].counts["missing_count"] == 7
    assert by_rule["persons.RELSHIP.domain"].success
    capped = {r.rule_id: r for r in plain}
    assert capped["persons.QAGE.range"].counts["unexpected_count"] == 5
    assert capped["persons.age.householder"].counts["unexpected_count"] == 3


def test_a_large_input_is_evaluated_in_a_second_process_only_before_gx_is_imported() -> None:
    assert isinstance(_worker.evaluator(10), _worker.InProcess)
    _gx.import_gx()  # imported here (as in this test session): a second process would import it again
    assert isinstance(_worker.evaluator(10**9), _worker.InProcess)


def test_the_second_process_is_started_afresh_beside_other_threads() -> None:
    """A thread that may hold a lock (a test runner's, Prefect's) rules the fork out."""
    import threading

    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, name="someone-else", daemon=True)
    busy.start()
    try:
        assert not _worker.can_fork()
    finally:
        stop.set()
        busy.join()


def test_write_report_of_an_empty_report(tmp_path: Path) -> None:
    folder = write_report(ValidationReport(subject="inputs"), tmp_path)
    assert (folder / "index.html").exists() and (tmp_path / "index.html").exists()


def test_great_expectations_runs_without_analytics_or_progress_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    _gx.import_gx()
    # Whatever cleared the environment since (another test's patched environment), the variable
    # is there again for the processes this one starts.
    monkeypatch.delenv("GX_ANALYTICS_ENABLED", raising=False)
    state = _gx.import_gx()
    assert os.environ["GX_ANALYTICS_ENABLED"] == "False"
    context = state["context"]
    assert context.config.analytics_enabled is False
    assert context.progress_bars["globally"] is False
    assert type(context).__name__ == "EphemeralDataContext"


# ------------------------------------------------------------------------------ outputs
def _small_config(**changes: object):
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = ["01", "06"]
    for key, value in changes.items():
        raw[key] = value
    return parse_config(raw)


def _outputs(config, directory: Path) -> Path:
    plan = plan_run(config)
    noisy = {m.key: np.arange(m.n_cells, dtype=np.int64) - 3 for m in plan.measurements}
    write_tables(private_tables(config, plan, noisy), directory)
    return directory


def _edit(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    frame = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)
    frame = change(frame)
    frame.to_csv(path, sep="|", index=False, lineterminator="\n")


def test_private_outputs_pass(tmp_path: Path) -> None:
    config = _small_config()
    report = validate_outputs(config, _outputs(config, tmp_path / "out"), report_dir=tmp_path / "report")
    assert report.ok, report.to_text()
    stats = report.results[0]["statistics"]
    assert report.results[0]["suite_name"] == "outputs"
    assert stats["evaluated_expectations"] == len(load_suite("outputs").rules) == stats["successful_expectations"]
    assert (tmp_path / "report" / "outputs" / "index.html").exists()


def test_puerto_rico_outputs_pass(tmp_path: Path) -> None:
    raw = json.loads(PR_CONFIG.read_text())
    config = parse_config(raw)
    report = validate_outputs(config, _outputs(config, tmp_path / "out"))
    assert report.ok, report.to_text()


OUTPUT_BREAKS = {
    "missing_row": ("PH2", lambda f: f.iloc[1:], "outputs.domain_complete"),
    "duplicate_row": ("PH3", lambda f: pd.concat([f, f.iloc[[4]]]), "outputs.cell_unique"),
    "wrong_variance": ("PH4", lambda f: f.assign(VARIANCE=f.VARIANCE.where(f.index != 2, "1.5")),
                       "outputs.variance_planned"),
    "non_integer_count": ("PH7", lambda f: f.assign(COUNT=f.COUNT.where(f.index != 0, "2.5")),
                          "outputs.count_integer"),
    "unconfigured_state": ("PH1_num", lambda f: f.assign(REGION_ID=f.REGION_ID.where(f.index != 30, "04")),
                           "outputs.states"),
    "missing_iteration_column": ("PH8_denom", lambda f: f.drop(columns=["ITERATION_CODE"]), "outputs.header"),
    "wrong_noise": ("PH6", lambda f: f.assign(NOISE_DISTRIBUTION="Laplace"), "outputs.noise_distribution"),
    "derived_variance_not_summed": (
        "PH8_num", lambda f: f.assign(VARIANCE=f.groupby("PH8_NUM_DATA_CELL").VARIANCE.transform("min")),
        "outputs.variance_planned"),
}


@pytest.mark.parametrize("name", list(OUTPUT_BREAKS))
def test_broken_outputs_are_reported(name: str, tmp_path: Path) -> None:
    table, change, rule_id = OUTPUT_BREAKS[name]
    config = _small_config()
    out = _outputs(config, tmp_path / "out")
    _edit(out / table / f"{table}.csv", change)
    report = validate_outputs(config, out)
    assert rule_id in {f.rule_id for f in report.failures}, report.to_text()
    assert all(f.file == f"{table}/{table}.csv" for f in report.failures)


def test_usa_rows_in_a_puerto_rico_run_are_reported(tmp_path: Path) -> None:
    us = _small_config()
    pr = parse_config(json.loads(PR_CONFIG.read_text()))
    out = _outputs(pr, tmp_path / "out")
    usa = _outputs(us, tmp_path / "us")
    # Put the US run's USA rows of PH2 into the Puerto Rico table.
    frame = pd.read_csv(out / "PH2" / "PH2.csv", sep="|", dtype=str, keep_default_na=False)
    extra = pd.read_csv(usa / "PH2" / "PH2.csv", sep="|", dtype=str, keep_default_na=False)
    pd.concat([frame, extra[extra.REGION_TYPE == "USA"]]).to_csv(out / "PH2" / "PH2.csv", sep="|", index=False)
    rules = {f.rule_id for f in validate_outputs(pr, out).failures}
    assert {"outputs.region_type", "outputs.domain_only"} <= rules


def test_missing_and_unexpected_tables_are_reported(tmp_path: Path) -> None:
    config = _small_config()
    out = _outputs(config, tmp_path / "out")
    (out / "PH3" / "PH3.csv").unlink()
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = ["01", "06"]
    raw["privacy_budget"]["PH6"] = {"usa_*": 0, "state_*": 0}
    no_ph6 = parse_config(copy.deepcopy(raw))
    report = validate_outputs(no_ph6, out)
    texts = {f.to_text() for f in report.failures}
    assert "PH3/PH3.csv: the table is present (it has a measured level)" in texts
    assert "PH6/PH6.csv: is not produced: every level of PH6 has budget 0" in texts


def test_distinct_combinations_and_their_rows_are_exact() -> None:
    """Dense bins or sorted keys, small or irregular classes, with or without weights: the
    combinations and their rows are those a plain count finds."""
    rng = np.random.default_rng(11)
    for trial in range(200):
        n = int(rng.integers(1, 400))
        columns = []
        for _ in range(int(rng.integers(1, 5))):
            kind = int(rng.integers(0, 4))
            if kind == 0:
                columns.append(rng.integers(0, 5, n).astype(np.uint8))
            elif kind == 1:
                columns.append(rng.integers(-1, 40, n).astype(np.int16))
            elif kind == 2:
                columns.append(rng.integers(100_000_000, 900_000_000, n).astype(np.int64))
            else:
                columns.append(rng.integers(0, 2**53, n).astype(np.int64))
        weights = None if trial % 2 else rng.integers(1, 1 << 40, n)
        expected: dict[tuple[int, ...], int] = {}
        for i in range(n):
            row = tuple(int(c[i]) for c in columns)
            expected[row] = expected.get(row, 0) + (1 if weights is None else int(weights[i]))
        for dense in (_combos.DENSE_MAX_BINS, 1):
            _combos.DENSE_MAX_BINS = dense
            try:
                combos, counts = _combos.distinct(columns, weights)
            finally:
                _combos.DENSE_MAX_BINS = 1 << 22
            assert {tuple(int(c[i]) for c in combos): int(counts[i]) for i in range(len(counts))} == expected


def test_great_expectations_batch_fingerprints_are_off() -> None:
    from great_expectations.execution_engine import pandas_execution_engine

    _gx.import_gx()
    assert pandas_execution_engine.HASH_THRESHOLD == 0  # no MD5 of confidential data in results


def test_what_a_run_reuses_is_what_great_expectations_builds_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Great Expectations is told to reuse, within one batch.validate, each expectation's
    configuration and each row condition's rows (phsafe/validation/_gx.py): every reuse, on every
    job of the validation of the reference fixture (valid and broken rules of every suite), equals
    what Great Expectations builds afresh, and the results equal those of an unchanged run."""
    jobs: list[_gx.Job] = []
    evaluate = _worker._run

    def kept(job: object) -> object:
        if isinstance(job, _gx.Job):
            jobs.append(job)
        return evaluate(job)

    monkeypatch.setattr(_worker, "_run", kept)
    report = validate_inputs(END_TO_END / "config.json", END_TO_END)
    assert not report.ok and {r.split(".")[0] for r in (f.rule_id for f in report.failures)} >= {"persons"}
    assert _gx.import_gx()["memoized"], "the pinned Great Expectations runs without its reuse"
    assert {job.suite for job in jobs} >= {"config", "persons", "units", "geo", "units_geo", "persons_in_units"}
    _gx._memo.mismatches, _gx._memo.checked = [], 0
    try:
        reused = [_gx.evaluate(job) for job in jobs]
        assert _gx._memo.mismatches == []
        assert _gx._memo.checked > 1000  # reuses, each compared with a fresh build
    finally:
        _gx._memo.mismatches = None
    monkeypatch.setattr(_gx, "REUSE_WITHIN_A_RUN", False)
    afresh = [_gx.evaluate(job) for job in jobs]
    assert reused == afresh
    assert any(not r.success and r.counts for results in reused for r in results)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int64, bool])
def test_a_column_padded_once_reads_as_each_read_padded_it(dtype: type) -> None:
    # Derived frames read a unit column at each person's key, slice after slice: padded once
    # (_Padded), every read equals _at's -- None (-1) reads `missing`, other negative rows too.
    from phsafe.validation._inputs import INVALID, _at, _Padded

    rng = np.random.default_rng(7)  # seeded: no randomness is under test
    for n in (0, 1, 50):
        values = rng.integers(0, 2 if dtype is bool else 100, n).astype(dtype)
        for missing in ((False,) if dtype is bool else (INVALID, 0)):
            padded = _Padded(values, missing)
            within = rng.integers(-1, n, 40) if n else np.full(40, -1)  # rows of the column, or -1
            beyond = np.where(rng.random(40) < 0.2, -3, within)  # and other negative rows
            for rows in (within, beyond, np.arange(n, dtype=np.int32), np.array([], dtype=np.int64)):
                expected = _at(values, rows, missing)
                got = padded.at(rows)
                assert got.dtype == expected.dtype and (got == expected).all(), (n, missing, rows)
