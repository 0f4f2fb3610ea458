"""Input validation: the config, the three files one batch at a time, then the cross-file rules.

Each file is streamed batch by batch: a batch is checked by its file's suite and reduced to the
compact columns the cross-file rules need (a MAFID and a few codes per row), then dropped. The
derived frames of the cross-file rules are built from those compact columns; persons are joined
to a sorted index of units in slices, so memory stays bounded by the compact form of the data.

Great Expectations is single-threaded and most of its time is Python, so on large inputs the
persons file -- the largest -- is validated in a second process while this one validates geo
and units (the machine has two cores). Small inputs are validated in-process: a second process
would spend longer importing Great Expectations than it saves.
"""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from phsafe.logs import get_logger
from phsafe.schema import FILES
from phsafe.validation import _config, _gx
from phsafe.validation._frames import (
    COMPACT_COLUMNS,
    CompactColumns,
    UnitIndex,
    compact,
    file_frame,
    header_frame,
    small_int_frames,
    units_geo,
)
from phsafe.validation._read import FileReader, SourceFile, describe_header, locate
from phsafe.validation._report import Failure, Tally, ValidationReport, write_report
from phsafe.validation._run import SuiteRun

log = get_logger("phsafe.validation")

_ROW_NOUNS = {"persons_in_units": "person", "households": "household", "units_geo": "MAFID", "config": "key"}
PARALLEL_MIN_ROWS = 4_000_000
"""Persons files of at least this many rows (estimated) are validated in a second process."""
_CSV_BYTES_PER_PERSON = 23  # "3,123456789,44,1,01,20\n"
JOIN_SLICE_ROWS = 2_000_000
"""Persons per ``persons_in_units`` frame."""


@dataclass
class FilePart:
    """What validating one file yields: its suite's tally, structural failures, compact columns."""

    stem: str
    tally: Tally
    failures: list[Failure] = field(default_factory=list)
    header: list[str] | None = None
    complete: bool = False
    columns: dict[str, npt.NDArray[np.int32]] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Every row was read and the columns the cross-file rules need are all there."""
        return self.complete and set(COMPACT_COLUMNS[self.stem]) <= set(self.columns)


DISTINCT_FILES = frozenset({"persons", "units"})
"""Files whose rows, MAFID aside, repeat few combinations of codes: their rules are evaluated on
distinct rows (see :mod:`phsafe.validation._run`). Geo rows are mostly distinct blocks."""
_KEY = "MAFID"
DISTINCT_MIN_ROWS = 50_000
"""Batches smaller than this are checked in one run on every row (distinct rows would save
less than the extra runs cost)."""


def _distinct(batch: pa.RecordBatch, names: list[str]) -> pa.RecordBatch:
    """The distinct rows of ``batch`` over ``names`` (nulls are a value like any other)."""
    table = pa.Table.from_batches([batch]).select(names)
    return table.group_by(names, use_threads=True).aggregate([]).select(names).combine_chunks().to_batches()[0] \
        if table.num_rows else batch.select(names)


@dataclass
class _Check:
    """One prepared evaluation of a file's suite (see :meth:`SuiteRun.check`)."""

    frame: pd.DataFrame
    only: set[str] | None = None
    exclude: set[str] | None = None
    every_row: Callable[[], pd.DataFrame] | None = None


class FileValidation:
    """Validation of one input file: batches are prepared (read, typed, reduced) before their
    rules are evaluated, so the first batch can be prepared while Great Expectations imports."""

    def __init__(self, source: SourceFile, parameters: dict | None = None) -> None:
        self.stem = source.stem
        self.run = SuiteRun(self.stem, parameters)
        self.reader = FileReader(source)
        self.kept = CompactColumns()
        self._pending = self._prepare()
        self._ahead: list[list[_Check]] = []

    def read_ahead(self) -> None:
        """Prepare the first batch now (one batch: memory stays bounded)."""
        for checks in self._pending:
            self._ahead.append(checks)
            break

    def finish(self) -> FilePart:
        """Evaluate the rules on every batch; return the file's part of the report."""
        for checks in itertools.chain(self._ahead, self._pending):
            for c in checks:
                self.run.check(self.stem, c.frame, only=c.only, exclude=c.exclude, every_row=c.every_row)
        self._ahead.clear()
        stem, reader = self.stem, self.reader
        columns = {name: self.kept.get(name) for name in self.kept.parts}
        if stem == "persons":  # the codes and ages fit in one byte: 7 bytes a person in all
            columns = {k: v if k == _KEY else v.astype(np.int8) for k, v in columns.items()}
        if reader.header is not None and not reader.failures and not self.kept.parts:  # no rows
            columns = {name: np.empty(0, dtype=np.int32) for name in COMPACT_COLUMNS[stem] if name in reader.header}
        return FilePart(stem, self.run.tally, reader.failures, reader.header, reader.complete, columns)

    def _prepare(self) -> Iterator[list[_Check]]:
        stem, reader = self.stem, self.reader
        header_rule = f"{stem}.header"
        key_rules = {r.rule_id for r in self.run.rules(stem) if _KEY in r.referenced_columns()}
        header_done = False
        for batch in reader.batches():
            assert reader.header is not None
            header, names = reader.header, batch.schema.names
            checks = []
            if batch.num_rows < DISTINCT_MIN_ROWS:
                # Small: one Great Expectations run, header rule included (its cost is per rule).
                checks.append(_Check(file_frame(batch, stem, header, whole_header=True),
                                     exclude={header_rule} if header_done else None))
            else:
                if not header_done:
                    checks.append(_Check(header_frame(header), only={header_rule}))
                if stem in DISTINCT_FILES and _KEY in names and len(names) > 1:
                    # MAFID is (nearly) unique per row: its rules see every row, in a one-column
                    # frame; every other rule sees the distinct rows of the other columns.
                    others = [n for n in names if n != _KEY]
                    checks.append(_Check(file_frame(batch.select([_KEY]), stem, [_KEY]), only=key_rules))
                    checks.append(_Check(
                        file_frame(_distinct(batch, others), stem, [n for n in header if n != _KEY]),
                        exclude={header_rule} | key_rules,
                        every_row=lambda b=batch, h=header: file_frame(b, stem, h),
                    ))
                else:
                    checks.append(_Check(file_frame(batch, stem, header), exclude={header_rule}))
            header_done = True
            if set(COMPACT_COLUMNS[stem]) <= set(names):
                self.kept.add(compact(batch, stem))
            yield checks
        if not header_done and reader.header is not None:  # a header and no rows
            yield [_Check(header_frame(reader.header), only={header_rule})]


def validate_file(source: SourceFile, parameters: dict | None = None) -> FilePart:
    """Validate one input file batch by batch with its suite; keep its compact columns."""
    return FileValidation(source, parameters).finish()


class _Worker:
    """``validate_file`` of one source running in a second Python process."""

    def __init__(self, source: SourceFile) -> None:
        self.source = source
        self._dir = tempfile.TemporaryDirectory(prefix="phsafe-validate-")
        self.result_path = Path(self._dir.name) / "part.pickle"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "phsafe.validation._worker"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            assert self.process.stdin is not None
            with self.process.stdin as stdin:
                pickle.dump({"source": source, "result": str(self.result_path)}, stdin)
        except BaseException:
            self.cancel()
            raise

    def result(self) -> FilePart:
        """The worker's result; raises if it failed (the caller then validates in-process)."""
        try:
            if self.process.wait() != 0:
                raise RuntimeError("validation worker failed")
            with open(self.result_path, "rb") as fh:
                part = pickle.load(fh)
            if not isinstance(part, FilePart):
                raise RuntimeError("validation worker returned no result")
            return part
        finally:
            self._dir.cleanup()

    def cancel(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._dir.cleanup()


def _estimated_rows(source: SourceFile) -> int:
    if source.format == "parquet":
        try:
            return pq.ParquetFile(source.path).metadata.num_rows
        except Exception:  # noqa: BLE001 -- unreadable: reported when it is validated
            return 0
    return source.path.stat().st_size // _CSV_BYTES_PER_PERSON


def _start_worker(source: SourceFile) -> _Worker | None:
    """Validate ``source`` in a second process if it is large and a second core exists."""
    try:
        if (os.cpu_count() or 1) < 2 or _estimated_rows(source) < PARALLEL_MIN_ROWS:
            return None
        return _Worker(source)
    except (OSError, ValueError):
        return None


def validate_inputs(config_path: Path, data_dir: Path, *, report_dir: Path | None = None) -> ValidationReport:
    """Validate ``config.json`` and the input files of ``data_dir`` (spec §1, §2).

    Spends no budget. Never raises on bad input: every problem is a :class:`Failure` of the
    returned report.

    Args:
        config_path: The run's configuration.
        data_dir: Folder holding persons, units and geo (CSV or Parquet).
        report_dir: If given, the report, the value-free Great Expectations results and their
            Data Docs are written to ``report_dir/inputs/``.
    """
    config_path, data_dir = Path(config_path), Path(data_dir)
    sources, missing = locate(data_dir)
    worker = _start_worker(sources["persons"]) if "persons" in sources else None
    try:
        report = _validate(config_path, sources, missing, worker)
    finally:
        if worker is not None:
            worker.cancel()
    if report_dir is not None:
        write_report(report, Path(report_dir))
    return report


def _validate(config_path: Path, sources: dict[str, SourceFile], missing: list[Failure],
              worker: "_Worker | None") -> ValidationReport:
    _gx.prewarm()
    config, load_failure = _config.load(config_path)
    raw = _config.read_raw(config_path)
    states = _config.state_filter(config, raw)
    file_names = {stem: (sources[stem].name if stem in sources else f"{stem}.csv") for stem in FILES}
    file_names["config"] = config_path.name

    here = [stem for stem in ("geo", "units", "persons") if stem in sources and not (stem == "persons" and worker)]
    validations = {stem: FileValidation(sources[stem], {"state_filter": states} if stem == "geo" else None)
                   for stem in here}
    for validation in validations.values():  # while Great Expectations is being imported
        validation.read_ahead()
    parts = {stem: validation.finish() for stem, validation in validations.items()}
    validations.clear()
    config_run = SuiteRun("config", row_nouns=_ROW_NOUNS)
    if raw is not None:
        config_run.check("config", _config.flatten(raw))
    if worker is not None:
        parts["persons"] = _persons_part(worker, sources["persons"])
    cross_runs, notes = _cross_file(parts, file_names)

    # The report lists, in order: the config, each file, then the cross-file rules.
    report = ValidationReport(subject="inputs")
    report.failures.extend(missing)
    if load_failure is not None:
        report.failures.append(load_failure)
    report.failures.extend(config_run.tally.failures(file_names))
    tallies = [config_run.tally]
    for stem in FILES:
        if stem in parts:
            part = parts[stem]
            report.failures.extend(part.failures)
            report.failures.extend(_explain_header(f, part) for f in part.tally.failures(file_names))
            tallies.append(part.tally)
    for run in cross_runs:
        report.failures.extend(run.tally.failures(file_names))
        tallies.append(run.tally)
    for tally in tallies:
        report.notes.extend(tally.notes())
        if tally.any_evaluated():
            report.results.append(tally.result_json())
    report.notes.extend(notes)
    return report


def _cross_file(parts: dict[str, FilePart], file_names: dict[str, str]) -> tuple[list[SuiteRun], list[str]]:
    """Evaluate the cross-file suites on derived frames, when the files they need are usable."""
    units_geo_run = SuiteRun("units_geo", row_nouns=_ROW_NOUNS)
    pin_run = SuiteRun("persons_in_units", row_nouns=_ROW_NOUNS)
    households_run = SuiteRun("households", row_nouns=_ROW_NOUNS)
    notes: list[str] = []
    usable = {stem for stem, part in parts.items() if part.usable}
    if {"units", "geo"} <= usable:
        distinct, every_row = units_geo(_compact(parts["units"]), _compact(parts["geo"]))
        units_geo_run.check("units_geo", distinct, every_row=every_row)
    else:
        notes.append(_skipped("units_geo", ("units", "geo"), usable, file_names))
    if {"units", "persons"} <= usable:
        index = UnitIndex(_compact(parts["units"]))
        persons = parts["persons"].columns
        for start in range(0, len(persons["MAFID"]), JOIN_SLICE_ROWS):
            piece = {k: v[start:start + JOIN_SLICE_ROWS].astype(np.int32) for k, v in persons.items()}
            distinct, every_row = small_int_frames(index.persons_in_units(piece))
            pin_run.check("persons_in_units", distinct, every_row=every_row)
        distinct, every_row = index.households()
        households_run.check("households", distinct, every_row=every_row)
    else:
        notes.append(_skipped("persons_in_units and households", ("units", "persons"), usable, file_names))
    return [units_geo_run, pin_run, households_run], notes


def _persons_part(worker: _Worker | None, source: SourceFile) -> FilePart:
    if worker is not None:
        try:
            return worker.result()
        except Exception as exc:  # noqa: BLE001 -- e.g. the process died: validate here instead
            log.warning("validation worker failed; validating in this process",
                        error_type=type(exc).__name__, file=source.name)
    return validate_file(source)


def _compact(part: FilePart) -> CompactColumns:
    cols = CompactColumns()
    cols.add({k: v.astype(np.int32) for k, v in part.columns.items()})
    return cols


def _explain_header(failure: Failure, part: FilePart) -> Failure:
    """Add which columns are missing, unexpected or out of order to a failed header rule."""
    if part.header is None or not (failure.rule_id or "").endswith(".header"):
        return failure
    expected = [c.name for c in FILES[part.stem]]
    detail = describe_header(part.header, expected)
    missing = tuple(n for n in expected if n not in part.header)
    return replace(failure, rule=f"{failure.rule}: {detail}" if detail else failure.rule,
                   columns=missing or failure.columns)


def _skipped(what: str, stems: tuple[str, ...], usable: set[str], file_names: dict[str, str]) -> str:
    bad = [file_names[s] for s in stems if s not in usable]
    return (f"cross-file rules of {what} not checked: they need every row and the key columns "
            f"of {', '.join(bad)}")
