"""Validation of input stored by state (``persons/TABBLKST=06/part-0.parquet``), state by state.

* The report of data stored by state equals the report of the same records in one CSV, however
  the states are grouped and on whichever process they are validated;
* records join only within their state's folders, as the counting reads them: a unit stored
  under another state than its persons and its geo row is reported even when both states are
  validated together;
* what no state's folders show alone is reported across them: a MAFID of units or geo stored
  under two states, a geo row stored under another state than its own TABBLKST.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phsafe import reader, synthetic
from phsafe.config import load_config
from phsafe.intake import exact_counts, validate_inputs
from phsafe.errors import InputError
from phsafe.tables import TABLES
from phsafe.validation import ValidationReport
from phsafe.validation import _inputs, _worker
from tests.conftest import US_CONFIG

STATES = ["01", "06", "11"]


@pytest.fixture(scope="module")
def small() -> synthetic.SyntheticData:
    return synthetic.generate(4000, STATES, seed=11)


def _config(directory: Path) -> Path:
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    path = directory / "config.json"
    path.write_text(json.dumps(raw))
    return path


def _state_of_mafid(data: synthetic.SyntheticData) -> pd.Series:
    return data.geo.drop_duplicates("MAFID").set_index("MAFID")["TABBLKST"]


def _write_by_state(data: synthetic.SyntheticData, directory: Path,
                    folder_of: dict[str, pd.Series] | None = None) -> Path:
    """Each file as ``<stem>/TABBLKST=<state>/part-0.parquet``; a record's folder is its geo
    row's state unless ``folder_of[stem]`` (indexed like the file's rows) says otherwise."""
    states = _state_of_mafid(data)
    for stem in ("persons", "units", "geo"):
        frame = getattr(data, stem)
        folder = frame["MAFID"].map(states) if folder_of is None or stem not in folder_of else folder_of[stem]
        for state, rows in frame.groupby(folder.to_numpy(), sort=True):
            path = directory / stem / f"TABBLKST={state}" / "part-0.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(synthetic._arrow_table(rows.reset_index(drop=True), stem, pa.string()), path)
    _config(directory)
    return directory


def _broken(data: synthetic.SyntheticData) -> synthetic.SyntheticData:
    persons = data.persons.copy()
    persons["QAGE"] = persons["QAGE"].astype(int)
    persons.loc[persons.index[persons.RELSHIP == "34"][:4], "QAGE"] = 120  # out of range
    persons.loc[persons.index[persons.RELSHIP == "25"][:3], "CENRACE"] = "00"  # not a race code
    units = data.units.copy()
    occupied = units.index[units.HHT != "0"]
    units.loc[occupied[:2], "TEN"] = "0"  # occupied without tenure
    return synthetic.SyntheticData(persons=persons, units=units, geo=data.geo)


def _summary(report: ValidationReport) -> set[tuple[str | None, str, int | None]]:
    return {(f.rule_id, f.rule, f.failing_rows) for f in report.failures}


@pytest.fixture(scope="module")
def broken_by_state(small: synthetic.SyntheticData,
                    tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ValidationReport]:
    """The broken records stored by state, and their report with the default settings (two cases
    only read it: validated once, not twice)."""
    by_state = _write_by_state(_broken(small), tmp_path_factory.mktemp("broken") / "by_state")
    return by_state, validate_inputs(by_state / "config.json", by_state)


def _failure(report: ValidationReport, rule_id: str) -> int | None:
    (failure,) = [f for f in report.failures if f.rule_id == rule_id]
    return failure.failing_rows


def test_stored_by_state_gives_the_report_of_one_csv(small: synthetic.SyntheticData,
                                                     broken_by_state: tuple[Path, ValidationReport], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data = _broken(small)
    csv_dir = tmp_path / "csv"
    synthetic.write(data, csv_dir)
    whole = validate_inputs(_config(csv_dir), csv_dir)
    by_state, together = broken_by_state  # each state's folders in one batch
    monkeypatch.setattr(reader, "PARQUET_BATCH_ROWS", 97)  # and in many
    apart = validate_inputs(by_state / "config.json", by_state)

    assert not whole.ok
    assert _summary(together) == _summary(whole) == _summary(apart)
    assert {f.file for f in together.failures} == {"persons", "units"}
    assert [r["statistics"] for r in together.results] == [r["statistics"] for r in whole.results]
    assert any("stored by state (3 TABBLKST=<state> folders)" in n for n in together.notes)
    assert not any("stored by state" in n for n in whole.notes)


def test_valid_data_stored_by_state_passes(small: synthetic.SyntheticData, tmp_path: Path) -> None:
    by_state = _write_by_state(small, tmp_path / "by_state")
    report = validate_inputs(by_state / "config.json", by_state)
    assert report.ok, report.to_text()


def _move_household(data: synthetic.SyntheticData, *, units_to: str | None = None,
                    geo_to: str | None = None) -> tuple[dict[str, pd.Series], int, int]:
    """Folders with one occupied household of Alabama stored elsewhere; its MAFID and persons."""
    states = _state_of_mafid(data)
    persons_per_unit = data.persons.groupby("MAFID").size()
    mafid = next(m for m in data.units.MAFID[data.units.HHT != "0"]
                 if states[m] == "01" and persons_per_unit.get(m, 0) >= 2)
    folders = {stem: getattr(data, stem)["MAFID"].map(states) for stem in ("persons", "units", "geo")}
    if units_to:
        folders["units"] = folders["units"].where(data.units.MAFID != mafid, units_to)
    if geo_to:
        folders["geo"] = folders["geo"].where(data.geo.MAFID != mafid, geo_to)
    return folders, mafid, int(persons_per_unit[mafid])


def test_records_join_only_within_their_states_folders(small: synthetic.SyntheticData, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Alabama's household: persons under 01, its unit under 06, its geo row under 01.
    folders, _, n_persons = _move_household(small, units_to="06")
    by_state = _write_by_state(small, tmp_path / "by_state", folders)
    for batch_rows in (reader.PARQUET_BATCH_ROWS, 97):  # whole files, then small batches
        monkeypatch.setattr(reader, "PARQUET_BATCH_ROWS", batch_rows)
        report = validate_inputs(by_state / "config.json", by_state)
        assert _failure(report, "persons_in_units.unit_exists") == n_persons
        assert _failure(report, "units_geo.unit_in_geo") == 1  # the unit, under 06
        assert _failure(report, "units_geo.geo_in_units") == 1  # its geo row, under 01
    # The counting refuses the same layout (before any budget is spent).
    config = load_config(by_state / "config.json")
    with pytest.raises(InputError):
        exact_counts(config, by_state, list(TABLES.values()), key=bytes(16))


def test_a_mafid_stored_under_two_states_is_reported(small: synthetic.SyntheticData, tmp_path: Path) -> None:
    states = _state_of_mafid(small)
    mafid = int(small.units.MAFID[small.units.MAFID.map(states) == "06"].iloc[0])
    twice = synthetic.SyntheticData(
        persons=small.persons,
        units=pd.concat([small.units, small.units[small.units.MAFID == mafid]], ignore_index=True),
        geo=pd.concat([small.geo, small.geo[small.geo.MAFID == mafid]], ignore_index=True),
    )
    folders = {stem: getattr(twice, stem)["MAFID"].map(states) for stem in ("units", "geo")}
    for stem in ("units", "geo"):
        folders[stem].iloc[-1] = "11"  # the copy, under the District of Columbia
    by_state = _write_by_state(twice, tmp_path / "by_state", folders)
    report = validate_inputs(by_state / "config.json", by_state)
    layout = {(f.file, f.columns, f.failing_rows, f.row_noun) for f in report.failures if f.rule_id is None}
    assert ("units", ("MAFID",), 1, "MAFID") in layout
    assert ("geo", ("MAFID",), 1, "MAFID") in layout
    assert any("also stored under another state" in f.rule for f in report.failures)
    # The geo row under 11 says TABBLKST 06: stored under another state than its own.
    assert ("geo", ("TABBLKST",), 1, "row") in layout


def test_a_geo_row_under_another_state_is_reported(small: synthetic.SyntheticData, tmp_path: Path) -> None:
    folders, _, _ = _move_household(small, geo_to="06")
    by_state = _write_by_state(small, tmp_path / "by_state", folders)
    report = validate_inputs(by_state / "config.json", by_state)
    (misplaced,) = [f for f in report.failures if f.columns == ("TABBLKST",) and f.rule_id is None]
    assert misplaced.file == "geo" and misplaced.failing_rows == 1
    assert "of its own TABBLKST" in misplaced.rule
    assert _failure(report, "units_geo.unit_in_geo") == 1


def test_a_state_missing_from_a_file_holds_no_rows_of_it(small: synthetic.SyntheticData, tmp_path: Path) -> None:
    by_state = _write_by_state(small, tmp_path / "by_state")
    for path in (by_state / "units" / "TABBLKST=11").iterdir():
        path.unlink()
    (by_state / "units" / "TABBLKST=11").rmdir()
    report = validate_inputs(by_state / "config.json", by_state)
    dc_persons = int((small.persons.MAFID.map(_state_of_mafid(small)) == "11").sum())
    assert _failure(report, "persons_in_units.unit_exists") == dc_persons


def test_states_on_a_second_process_give_the_same_report(broken_by_state: tuple[Path, ValidationReport],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    by_state, here = broken_by_state
    started: list[int] = []

    def second_process(rows: int) -> _worker.Evaluator:
        started.append(rows)
        return _worker.SecondProcess()

    monkeypatch.setattr(_inputs, "evaluator", second_process)
    there = validate_inputs(by_state / "config.json", by_state)
    assert started
    assert _summary(there) == _summary(here)
    assert there.to_text() == here.to_text()


# ------------------------------------------------------------------------------ one read
def _count_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the data reads of each input file: CSV parsers opened, Parquet batches iterated."""
    import collections

    import pyarrow.csv as pacsv

    reads: dict[str, int] = collections.Counter()
    open_csv, parquet_file = pacsv.open_csv, pq.ParquetFile

    opened: list[str] = []

    class HashingReader(reader._HashingReader):
        """The reader opens CSV files itself (to hash them and show its position), just before it
        hands them to the parser: remember which."""

        def __init__(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(path, *args, **kwargs)
            opened.append(str(path))

    def counted_open_csv(source, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads[opened.pop() if isinstance(source, reader.pa.PythonFile) else str(source)] += 1
        return open_csv(source, *args, **kwargs)

    class CountedParquetFile(parquet_file):  # type: ignore[misc,valid-type]
        def __init__(self, source, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(source, *args, **kwargs)
            self._counted_path = str(source)

        def iter_batches(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            reads[self._counted_path] += 1
            return super().iter_batches(*args, **kwargs)

    monkeypatch.setattr(reader, "_HashingReader", HashingReader)
    monkeypatch.setattr(reader.pacsv, "open_csv", counted_open_csv)
    monkeypatch.setattr(reader.pq, "ParquetFile", CountedParquetFile)
    return reads


@pytest.mark.parametrize("fmt", ["csv", "parquet", "by_state"])
def test_validation_and_counting_read_each_file_once(small: synthetic.SyntheticData, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    from phsafe.intake import validated_counts

    if fmt == "by_state":
        data = _write_by_state(small, tmp_path / "data")
    else:
        synthetic.write(small, tmp_path / "data", fmt=fmt)
        data = tmp_path / "data"
        _config(data)
    files = sorted(str(p) for p in data.rglob(f"*.{'csv' if fmt == 'csv' else 'parquet'}"))
    reads = _count_reads(monkeypatch)
    counts, report = validated_counts(data / "config.json", data, list(TABLES.values()), key=bytes(16))
    assert report is not None and report.ok, report.to_text()
    assert counts is not None and counts.content.persons > 0
    assert dict(reads) == {f: 1 for f in files}
    # The counts are those of the counting alone.
    alone = exact_counts(load_config(data / "config.json"), data, list(TABLES.values()), key=bytes(16))
    assert counts.content == alone.content
    for name, table in alone.items():
        for level, cube in table.by_level.items():
            assert (counts[name].by_level[level] == cube).all(), (name, level)


def test_folders_outside_the_state_filter_are_set_aside_persons_unread(
        small: synthetic.SyntheticData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_state = _write_by_state(small, tmp_path / "by_state")
    raw = json.loads((by_state / "config.json").read_text())
    raw["state_filter"] = ["06"]
    (by_state / "config.json").write_text(json.dumps(raw))
    reads = _count_reads(monkeypatch)
    report = validate_inputs(by_state / "config.json", by_state)
    assert report.ok, report.to_text()
    states = _state_of_mafid(small)
    outside = {stem: int((getattr(small, stem)["MAFID"].map(states) != "06").sum())
               for stem in ("persons", "units", "geo")}
    assert report.set_aside == outside
    # Their units and geo MAFIDs are read for the layout check (once); their persons never.
    assert not any("/persons/TABBLKST=01/" in f or "/persons/TABBLKST=11/" in f for f in reads)
    assert max(reads.values()) == 1


# ------------------------------------------------------------------------------ worker processes
def test_states_validated_in_worker_processes_largest_first_give_the_same_report(
        broken_by_state: tuple[Path, ValidationReport], monkeypatch: pytest.MonkeyPatch) -> None:
    # States in the pass's two worker processes, largest first, with a budget that holds
    # California beside DC but not beside Alabama: DC passes Alabama (the schedule's choice, not
    # the machine's speed) and the states are merged in that order. The report is that of one
    # process, every state in turn. (Counts in worker processes: test_partitioned.)
    from phsafe import memory
    from phsafe.intake import input_pass, workers

    by_state, here = broken_by_state
    choose = workers.next_job
    picks: list[int | None] = []

    def spied_next_job(*args, **kwargs):  # type: ignore[no-untyped-def]
        picks.append(choose(*args, **kwargs))
        return picks[-1]

    def budget_of(parts, limit, *, validate, target=None):  # type: ignore[no-untyped-def]
        largest, _, smallest = sorted((memory.state_bytes(p) for p in parts), reverse=True)
        return largest + smallest  # California beside DC, not beside Alabama

    monkeypatch.setattr(memory, "WORKERS_MIN_PERSONS", 1000)
    monkeypatch.setattr(input_pass, "parallel_budget", budget_of)
    monkeypatch.setattr(workers, "next_job", spied_next_job)
    there = validate_inputs(by_state / "config.json", by_state)
    assert picks[:2] == [0, 1]  # California, then DC before Alabama (what waits: [Alabama, DC])
    assert there.to_text() == here.to_text()
    assert there.failures == here.failures
