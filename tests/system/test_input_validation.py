"""The input suites over files: CSV and Parquet alike, batches and distinct combinations, the second
process, CRLF and quoted files, the report files, and the import of the CLI without Great
Expectations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phsafe import synthetic
from phsafe import reader
from phsafe.validation import (
    ValidationReport,
    _combos,
    _inputs,
    _worker,
)
from phsafe.intake import validate_inputs
from tests.conftest import US_CONFIG


# ------------------------------------------------------------------------------ input files
@pytest.fixture(scope="module")
def small() -> synthetic.SyntheticData:
    return synthetic.generate(3000, ["01", "06"], seed=5)


def _write(data: synthetic.SyntheticData, directory: Path, fmt: str = "csv") -> Path:
    synthetic.write(data, directory, fmt=fmt)
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = ["01", "06"]
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


def _broken(data: synthetic.SyntheticData) -> synthetic.SyntheticData:
    persons = data.persons.copy()
    persons["QAGE"] = persons["QAGE"].astype(int)
    rows = persons.index[persons.RELSHIP == "34"][:4]
    persons.loc[rows, "QAGE"] = 120  # out of range
    kids = persons.index[persons.RELSHIP == "25"][:3]
    persons.loc[kids, "CENRACE"] = "00"  # not a race code
    return synthetic.SyntheticData(persons=persons, units=data.units, geo=data.geo)


def _summary(report: ValidationReport) -> set[tuple[str, str | None, int | None]]:
    return {(f.file, f.rule_id, f.failing_rows) for f in report.failures}


@pytest.fixture(scope="module")
def broken_csv(small: synthetic.SyntheticData, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ValidationReport]:
    """The broken records as plain CSV files, and their report with the default settings: the
    reference four cases compare against (they only read it; validated once, not four times)."""
    data = _write(_broken(small), tmp_path_factory.mktemp("broken") / "csv")
    return data, validate_inputs(data / "config.json", data)


def test_parquet_inputs_are_validated_like_csv(small: synthetic.SyntheticData, broken_csv: tuple[Path, ValidationReport],
                                               tmp_path: Path) -> None:
    pq_dir = _write(_broken(small), tmp_path / "parquet", fmt="parquet")
    _, csv_report = broken_csv
    pq_report = validate_inputs(pq_dir / "config.json", pq_dir)
    assert {(r, n) for _, r, n in _summary(csv_report)} == {(r, n) for _, r, n in _summary(pq_report)}
    assert {f for f, _, _ in _summary(pq_report)} == {"persons.parquet"}
    assert ("persons.csv", "persons.QAGE.range", 4) in _summary(csv_report)
    assert ("persons.csv", "persons.CENRACE.domain", 3) in _summary(csv_report)


def test_batches_and_distinct_combinations_do_not_change_the_report(
    broken_csv: tuple[Path, ValidationReport], monkeypatch: pytest.MonkeyPatch
) -> None:
    data, whole = broken_csv
    # Many small batches, whose distinct combinations are added up; combinations counted by
    # sorting their keys rather than in dense bins.
    monkeypatch.setattr(reader, "CSV_BLOCK_BYTES", 16 << 10)
    monkeypatch.setattr(_combos, "DENSE_MAX_BINS", 1)
    monkeypatch.setattr(_inputs, "SLICE_ROWS", 97)  # derived frames built a few rows at a time
    monkeypatch.setattr(_inputs, "MAFID_JOB_ROWS", 500)
    batched = validate_inputs(data / "config.json", data)
    assert _summary(batched) == _summary(whole)
    assert [r["statistics"] for r in batched.results] == [r["statistics"] for r in whole.results]
    assert not whole.ok


def test_geo_values_checked_column_by_column_give_exact_counts(
    small: synthetic.SyntheticData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    geo = small.geo.copy()
    geo.loc[geo.index[:3], "TABBLK"] = "12"  # too short
    geo.loc[geo.index[10:12], "REGIONCE"] = "7"  # not a region
    geo.loc[geo.index[20], "PLACEFP"] = None  # empty
    data = _write(synthetic.SyntheticData(small.persons, small.units, geo), tmp_path / "data")
    one_batch = validate_inputs(data / "config.json", data)
    monkeypatch.setattr(reader, "CSV_BLOCK_BYTES", 16 << 10)
    many_batches = validate_inputs(data / "config.json", data)
    assert _summary(many_batches) == _summary(one_batch) == {
        ("geo.csv", "geo.TABBLK.format", 3), ("geo.csv", "geo.REGIONCE.domain", 2),
        ("geo.csv", "geo.PLACEFP.present", 1)}


def test_second_process_gives_the_same_report(
    broken_csv: tuple[Path, ValidationReport], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, here = broken_csv
    started = []

    def second_process(rows: int) -> _worker.Evaluator:
        started.append(rows)
        return _worker.SecondProcess()

    monkeypatch.setattr(_inputs, "evaluator", second_process)
    there = validate_inputs(data / "config.json", data, report_dir=tmp_path / "report")
    assert started
    assert _summary(there) == _summary(here)
    assert there.to_text() == here.to_text()
    # The report's files are written by the second process (its Data Docs pages by GX there).
    folder = tmp_path / "report" / "inputs"
    assert (folder / "report.txt").read_text().strip() == there.to_text()
    assert "DHC edit constraint" in (folder / "data_docs" / "persons.html").read_text()


def test_report_files(small: synthetic.SyntheticData, tmp_path: Path) -> None:
    data = _write(_broken(small), tmp_path / "data")
    report = validate_inputs(data / "config.json", data, report_dir=tmp_path / "report")
    folder = tmp_path / "report" / "inputs"
    assert (folder / "report.txt").read_text().startswith("inputs: 2 rules failed")
    saved = json.loads((folder / "report.json").read_text())
    assert saved["ok"] is False and len(saved["failures"]) == len(report.failures)
    result = json.loads((folder / "results" / "persons.json").read_text())
    assert result["suite_name"] == "persons" and result["success"] is False
    index = (folder / "index.html").read_text()
    assert "http" not in index  # self-contained
    assert "DHC edit constraint" in (folder / "data_docs" / "persons.html").read_text()


# ------------------------------------------------------------------------------ laziness
def test_importing_the_cli_and_validation_does_not_import_great_expectations() -> None:
    code = "import sys, phsafe.cli, phsafe.validation; print('great_expectations' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_crlf_quoted_and_blank_line_files_are_validated_like_plain_ones(broken_csv: tuple[Path, ValidationReport],
                                                                        tmp_path: Path) -> None:
    """Validation reads the files the counting reads -- quoted header and fields, CRLF line
    endings, a trailing blank line -- and reports the same."""
    plain, plain_report = broken_csv
    edited = tmp_path / "edited"
    edited.mkdir()
    for path in plain.iterdir():
        text = path.read_text()
        if path.suffix == ".csv":
            lines = text.splitlines()
            text = "\r\n".join(",".join(f'"{f}"' for f in line.split(",")) for line in lines) + "\r\n\r\n"
        (edited / path.name).write_text(text, newline="")
    assert _summary(validate_inputs(edited / "config.json", edited)) == _summary(plain_report)
