"""Bad inputs are rejected before any budget is spent, by a report that quotes no value.

Each case of :mod:`tests.system._bad_inputs` is validated with the library; a handful also go
through ``phsafe private --validate`` (run in this process as a subprocess would see it:
tests/_cli.py), which must exit non-zero, name the file, column and rule, create no output
directory and record no spend in the ledger. ``phsafe validate`` on the reference fixture is a
real process (the installed command's exit status).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from phsafe.intake import validate_inputs
from phsafe.validation import ValidationReport
from tests._cli import PHSAFE, phsafe
from tests._ledgers import new_ledger
from tests.conftest import END_TO_END
from tests.system._bad_inputs import CASES, DEMO_US, Case, Dataset, base_dataset, build

_PUBLIC_NUMBERS = {"100000001", "900000000"}  # MAFID bounds, quoted by the range rule


@pytest.fixture(scope="module")
def base() -> Dataset:
    return base_dataset()


def _report_texts(report: ValidationReport) -> list[str]:
    return [report.to_text(), json.dumps(report.to_dict()), json.dumps(report.results)]


def assert_value_free(texts: list[str], ds: Dataset, secrets: tuple[str, ...]) -> None:
    """No MAFID of the data and no injected value appears in any of ``texts``."""
    mafids = ds.mafids() - _PUBLIC_NUMBERS
    for text in texts:
        leaked = set(re.findall(r"(?<![0-9])[0-9]{9}(?![0-9])", text)) & mafids
        assert not leaked, "a MAFID appears in the report"
        for secret in secrets:
            pattern = r"(?<![0-9.])" + re.escape(secret) + r"(?![0-9])"
            assert not re.search(pattern, text), f"the injected value {secret!r} appears in the report"


def matching(report: ValidationReport, case: Case) -> list:
    return [
        f for f in report.failures
        if f.file == case.file and set(case.columns) <= set(f.columns) and case.rule.lower() in f.rule.lower()
    ]


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


def test_base_dataset_is_valid(base: Dataset, tmp_path: Path) -> None:
    data = base.copy().write(tmp_path / "data")
    report = validate_inputs(data / "config.json", data)
    assert report.ok, report.to_text()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_rejected(case: Case, base: Dataset, tmp_path: Path) -> None:
    data = tmp_path / "data"
    ds = build(case, base, data)
    report = validate_inputs(data / "config.json", data)
    assert not report.ok
    assert matching(report, case), f"expected {case.file} {case.columns} '{case.rule}' in:\n{report.to_text()}"
    assert_value_free(_report_texts(report), ds, case.secrets)


@pytest.mark.parametrize("name", ["orphan_person", "age_out_of_range", "malformed_csv_row"])
def test_report_files_are_value_free(name: str, base: Dataset, tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == name)
    data = tmp_path / "data"
    ds = build(case, base, data)
    report = validate_inputs(data / "config.json", data, report_dir=tmp_path / "report")
    assert not report.ok
    files = [p for p in (tmp_path / "report").rglob("*") if p.is_file()]
    names = {p.relative_to(tmp_path / "report").as_posix() for p in files}
    assert {"index.html", "inputs/index.html", "inputs/report.txt", "inputs/report.json",
            "inputs/results/persons.json", "inputs/data_docs/persons.html"} <= names
    assert_value_free([p.read_text(encoding="utf-8") for p in files], ds, case.secrets)


def test_reference_fixture_is_rejected() -> None:
    report = validate_inputs(END_TO_END / "config.json", END_TO_END)
    assert not report.ok
    rules = {(f.file, f.rule_id) for f in report.failures}
    # A unit whose RTYPE disagrees with geo, a GQ facility with a household type.
    assert ("units.csv", "units_geo.hu_rtype") in rules
    assert ("units.csv", "units.gq_hht") in rules
    # The state filter comes first: the repeated unit is in a state the run sets aside, as
    # are five geo rows, six units rows and seven persons rows (counted, never shown).
    assert ("units.csv", "units_geo.units_unique") not in rules
    assert ("geo.csv", "geo.TABBLKST.state_filter") not in rules
    assert report.set_aside == {"geo": 5, "units": 6, "persons": 7}
    assert any("5 geo rows outside it set aside, with 6 units rows and 7 persons rows" in n for n in report.notes)


# ------------------------------------------------------------------------------ the state filter first
def _outside(ds: Dataset, state: str) -> tuple[set[str], int, int]:
    """MAFIDs of ``state``'s geo rows, and the number of their units and persons rows."""
    mafids = set(ds.geo.MAFID[ds.geo.TABBLKST == state])
    return mafids, int(ds.units.MAFID.isin(mafids).sum()), int(ds.persons.MAFID.isin(mafids).sum())


def test_records_outside_the_state_filter_are_set_aside_not_reported(base: Dataset, tmp_path: Path) -> None:
    ds = base.copy()
    mafid = ds.geo.MAFID.iloc[7]
    ds.geo.loc[7, "TABBLKST"] = "04"  # a state the config does not release
    n_units = int((ds.units.MAFID == mafid).sum())
    n_persons = int((ds.persons.MAFID == mafid).sum())
    data = ds.write(tmp_path / "data")
    report = validate_inputs(data / "config.json", data, report_dir=tmp_path / "report")
    assert report.ok, report.to_text()
    assert report.set_aside == {"geo": 1, "units": n_units, "persons": n_persons}
    saved = json.loads((tmp_path / "report" / "inputs" / "report.json").read_text())
    assert saved["set_aside_by_state_filter"] == report.set_aside
    assert_value_free(_report_texts(report), ds, (mafid,))


def test_a_national_file_validates_with_a_subset_state_filter(base: Dataset, tmp_path: Path) -> None:
    """``phsafe validate`` with a national file and a state filter of one state passes when the
    records the run keeps are valid -- whatever the records it sets aside hold -- and fails when a
    kept record is not."""
    ds = base.copy()
    ds.config["state_filter"] = ["06"]
    aside = {state: _outside(ds, state) for state in ("01", "11", "36", "48")}
    # A broken record in a state the run sets aside is not the run's business.
    texas = next(iter(aside["48"][0]))
    ds.persons.loc[ds.persons.index[ds.persons.MAFID == texas][:1], "QAGE"] = "131"
    data = ds.write(tmp_path / "national")
    proc = phsafe("validate", data / "config.json", data)
    assert proc.returncode == 0, proc.stderr
    report = validate_inputs(data / "config.json", data)
    assert report.ok, report.to_text()
    assert report.set_aside == {"geo": sum(len(m) for m, _, _ in aside.values()),
                                "units": sum(u for _, u, _ in aside.values()),
                                "persons": sum(p for _, _, p in aside.values())}
    # The same break in a kept (Californian) record fails.
    california = ds.geo.MAFID[ds.geo.TABBLKST == "06"]
    kept = ds.persons.index[ds.persons.MAFID.isin(california) & (ds.persons.RELSHIP == "34")][:1]
    ds.persons.loc[kept, "QAGE"] = "131"
    data = ds.write(tmp_path / "national_broken")
    report = validate_inputs(data / "config.json", data)
    assert {(f.rule_id, f.failing_rows) for f in report.failures} == {("persons.QAGE.range", 1)}


@pytest.mark.parametrize("name", ["us", "pr"])
def test_demo_data_passes(name: str) -> None:
    data = DEMO_US.parent / name
    if not (data / "config.json").exists():
        pytest.skip(f"demo data {data} has not been generated")
    report = validate_inputs(data / "config.json", data)
    assert report.ok, report.to_text()


# ------------------------------------------------------------------------------ command line
def _ledger_spends(ledger: Path) -> list[str]:
    if not ledger.exists():
        return []
    return [line for line in ledger.read_text(encoding="utf-8").splitlines() if '"kind": "INTENT"' in line
            or '"kind":"INTENT"' in line]


@pytest.mark.parametrize("case", [c for c in CASES if c.cli], ids=[c.name for c in CASES if c.cli])
def test_private_run_refuses_bad_input(case: Case, base: Dataset, tmp_path: Path) -> None:
    data = tmp_path / "data"
    ds = build(case, base, data)
    out, ledger = tmp_path / "out", new_ledger(tmp_path).path
    proc = phsafe("private", data / "config.json", data, out, "--validate", "--ledger", ledger,
                  "--new-version", "test records", env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode != 0
    message = proc.stderr + proc.stdout
    # The engine loads the config before validating, so a config error is its one-line
    # "config key 'K': rule" (the file is named by `phsafe validate`, below).
    assert case.file in message or (case.file == "config.json" and "config key" in message)
    assert all(c in message for c in case.columns)
    assert case.rule.lower() in message.lower()
    assert not out.exists()
    assert not _ledger_spends(ledger)
    assert_value_free([message], ds, case.secrets)


def test_validate_command_names_the_config_file(base: Dataset, tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "config_privacy_defn_typo")
    data = tmp_path / "data"
    build(case, base, data)
    proc = phsafe("validate", data / "config.json", data)
    assert proc.returncode == 1
    assert 'config.json [privacy_defn]: must be "zcdp" or "puredp"' in proc.stderr


def test_validate_command_rejects_reference_fixture(tmp_path: Path) -> None:
    # The installed command, in a process of its own: its exit status as a script sees it.
    proc = subprocess.run(
        [str(PHSAFE), "validate", str(END_TO_END / "config.json"), str(END_TO_END), "--report-dir",
         str(tmp_path / "report")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1
    assert "units.csv [RTYPE, geo.RTYPE]: a housing unit (units RTYPE 2) is a housing unit in geo too" in proc.stderr
    assert (tmp_path / "report" / "inputs" / "index.html").exists()
