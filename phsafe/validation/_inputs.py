"""Input validation: the config, the three files one batch at a time, then the cross-file rules.

Each file is streamed batch by batch: a batch is checked by its file's suite and reduced to the
compact columns the cross-file rules need (a MAFID and a few codes per row), then dropped. The
derived frames of the cross-file rules are built from those compact columns; persons are joined
to a sorted index of units in slices, so memory stays bounded by the compact form of the data.

Input stored by state (every file a folder of ``TABBLKST=<state>`` partitions) is validated a
group of states at a time -- the three files' folders of those states, then the cross-file rules
on them, records joining only within their own state -- so memory is bounded by the largest
state (or group of small ones), as in the counting. What no group can show (a MAFID of units or
geo stored under two states, a geo row under another state's folder) is checked across the
folders on the MAFID and TABBLKST columns alone.

Great Expectations is single-threaded and most of its time is Python, so large inputs are
validated on two processes (the machine has two cores): the states are shared between this
process and a second one, or, for input not stored by state, the persons file -- the largest --
is validated in the second process while this one validates geo and units. Small inputs are
validated in-process: a second process would spend longer importing Great Expectations than it
saves.
"""

from __future__ import annotations

import itertools
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from phsafe.logs import get_logger
from phsafe.schema import FILES, MAFID_MAX, MAFID_MIN
from phsafe.validation import _config, _gx
from phsafe.validation._frames import (
    COMPACT_COLUMNS,
    CompactColumns,
    UnitIndex,
    compact,
    file_frame,
    header_frame,
    parse_integers,
    small_int_frames,
    sorted_distinct,
    units_geo,
)
from phsafe.validation._read import STATE_COLUMN, FileReader, SourceFile, describe_header, locate
from phsafe.validation._report import Failure, Tally, ValidationReport, write_report
from phsafe.validation._run import SuiteRun
from phsafe.validation._suites import Rule, load_suite

log = get_logger("phsafe.validation")

_ROW_NOUNS = {"persons_in_units": "person", "households": "household", "units_geo": "MAFID", "config": "key"}
PARALLEL_MIN_ROWS = 4_000_000
"""Persons files of at least this many rows (estimated) are validated in a second process."""
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


DISTINCT_FILES = frozenset({"persons", "units", "geo"})
"""Files whose rows, MAFID aside, repeat few combinations of codes: their rules are evaluated on
distinct rows (see :mod:`phsafe.validation._run`) -- or, when every rule of the suite is about
one column (geo's), on each column's distinct values (see :func:`_distinct_columns`)."""
_KEY = "MAFID"
DISTINCT_MIN_ROWS = 50_000
"""Batches smaller than this are checked in one run on every row (distinct rows would save
less than the extra runs cost)."""


def _distinct(batch: pa.RecordBatch, names: list[str]) -> pa.RecordBatch:
    """The distinct rows of ``batch`` over ``names`` (nulls are a value like any other)."""
    table = pa.Table.from_batches([batch]).select(names)
    return table.group_by(names, use_threads=True).aggregate([]).select(names).combine_chunks().to_batches()[0] \
        if table.num_rows else batch.select(names)


def _distinct_columns(batch: pa.RecordBatch, names: list[str]) -> pa.RecordBatch:
    """Each column's distinct values (null included), each repeated to the longest's length.

    A rule about one column with no row condition (not empty, format, code list, range) holds on
    every row exactly when it holds on each distinct value of the column, and repeating values
    does not change that; rows of this batch pair unrelated values, which such rules never see.
    A geo batch of a million rows -- a million MAFIDs but a few thousand blocks, tracts and
    places -- shrinks some twentyfold.
    """
    uniques = [pc.unique(batch.column(batch.schema.get_field_index(n))) for n in names]
    length = max(len(u) for u in uniques)
    arrays = [u if len(u) == length else u.take(pa.array(np.arange(length) % len(u))) for u in uniques]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _columnwise(rules: list[Rule]) -> bool:
    """Every rule reads one column, with no row condition and no ``mostly`` (see
    :func:`_distinct_columns`)."""
    return all(
        len(r.referenced_columns()) == 1
        and not r.config.get("kwargs", {}).get("row_condition")
        and r.config.get("kwargs", {}).get("mostly") is None
        for r in rules
    )


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
        columnwise = _columnwise(self.run.rules(stem, exclude={header_rule} | key_rules))
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
                    # frame; every other rule sees the distinct rows of the other columns (or
                    # each column's distinct values, when every rule is about one column).
                    others = [n for n in names if n not in (_KEY, STATE_COLUMN)]
                    reduced = _distinct_columns(batch, others) if columnwise else _distinct(batch, others)
                    checks.append(_Check(file_frame(batch.select([_KEY]), stem, [_KEY]), only=key_rules))
                    checks.append(_Check(
                        file_frame(reduced, stem, [n for n in header if n != _KEY]),
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
    """One validation task running in a second Python process (see :mod:`._worker`).

    Args:
        request: ``{"task": "file", "source": ...}`` (:func:`validate_file`) or
            ``{"task": "states", "sources": ..., "groups": [[...], ...], ...}`` (:func:`validate_states`).
    """

    def __init__(self, request: dict) -> None:
        self.request = request
        self._dir = tempfile.TemporaryDirectory(prefix="phsafe-validate-")
        self.result_path = Path(self._dir.name) / "part.pickle"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "phsafe.validation._worker"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            assert self.process.stdin is not None
            with self.process.stdin as stdin:
                pickle.dump({**request, "result": str(self.result_path)}, stdin)
        except BaseException:
            self.cancel()
            raise

    def result(self) -> object:
        """The worker's result; raises if it failed (the caller then validates in-process)."""
        try:
            if self.process.wait() != 0:
                raise RuntimeError("validation worker failed")
            with open(self.result_path, "rb") as fh:
                return pickle.load(fh)
        finally:
            self._dir.cleanup()

    def cancel(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._dir.cleanup()


def _second_core() -> bool:
    return (os.cpu_count() or 1) >= 2


def _start_worker(request: dict) -> _Worker | None:
    try:
        return _Worker(request)
    except (OSError, ValueError):
        return None


def validate_inputs(config_path: Path, data_dir: Path, *, report_dir: Path | None = None) -> ValidationReport:
    """Validate ``config.json`` and the input files of ``data_dir`` (spec §1, §2).

    Spends no budget. Never raises on bad input: every problem is a :class:`Failure` of the
    returned report.

    Input stored by state (``persons/TABBLKST=06/...`` for all three files, as ``phsafe synth``
    writes it) is validated a group of states at a time, as the counting reads it: memory is
    bounded by the largest state, and the groups are shared between two processes.

    Args:
        config_path: The run's configuration.
        data_dir: Folder holding persons, units and geo (CSV or Parquet).
        report_dir: If given, the report, the value-free Great Expectations results and their
            Data Docs are written to ``report_dir/inputs/``.
    """
    config_path, data_dir = Path(config_path), Path(data_dir)
    sources, missing = locate(data_dir)
    report = _validate(config_path, sources, missing)
    if report_dir is not None:
        write_report(report, Path(report_dir))
    return report


CROSS_FILE_SUITES = ("units_geo", "persons_in_units", "households")


@dataclass
class Outcome:
    """What validating the three files yields, before it is reported.

    Attributes:
        tallies: Suite name -> its results, added up (the file suites and the cross-file ones).
        failures: File stem -> structural failures (no suite can express them).
        headers: File stem -> a header read from it (one that breaks the header rule, if any
            does), to explain a failed header rule.
        notes: What was not checked and why.
    """

    tallies: dict[str, Tally] = field(default_factory=dict)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    headers: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def merge(self, other: "Outcome") -> None:
        """Add ``other`` (e.g. another state partition's outcome) to this one."""
        for name, tally in other.tallies.items():
            if name in self.tallies:
                self.tallies[name].merge(tally)
            else:
                self.tallies[name] = tally
        for stem, failures in other.failures.items():
            self.failures[stem] = _added_up(self.failures.get(stem, []) + failures)
        for stem, header in other.headers.items():
            if stem not in self.headers or self.headers[stem] == _expected_header(stem):
                self.headers[stem] = header
        self.notes.extend(n for n in other.notes if n not in self.notes)


def _expected_header(stem: str) -> list[str]:
    return [c.name for c in FILES[stem]]


def _added_up(failures: list[Failure]) -> list[Failure]:
    """One failure per file, columns and rule, counts added (the partitions of a folder each
    report their own rows)."""
    merged: dict[tuple[str, tuple[str, ...], str], Failure] = {}
    for f in failures:
        key = (f.file, f.columns, f.rule)
        if key in merged and merged[key].failing_rows is not None and f.failing_rows is not None:
            merged[key] = replace(merged[key], failing_rows=merged[key].failing_rows + f.failing_rows)
        else:
            merged.setdefault(key, f)
    return list(merged.values())


def _outcome(parts: dict[str, FilePart], file_names: dict[str, str]) -> Outcome:
    """The outcome of the files' parts and of the cross-file rules evaluated on them."""
    outcome = Outcome()
    for stem, part in parts.items():
        outcome.tallies[stem] = part.tally
        outcome.failures[stem] = list(part.failures)
        if part.header is not None:
            outcome.headers[stem] = part.header
    runs, notes = _cross_file(parts, file_names)
    for run in runs:
        outcome.tallies[run.suite.name] = run.tally
    outcome.notes.extend(notes)
    return outcome


def _file_names(sources: dict[str, SourceFile], config_path: Path) -> dict[str, str]:
    names = {stem: (sources[stem].name if stem in sources else f"{stem}.csv") for stem in FILES}
    names["config"] = config_path.name
    return names


def _validate(config_path: Path, sources: dict[str, SourceFile], missing: list[Failure]) -> ValidationReport:
    _gx.prewarm()
    config, load_failure = _config.load(config_path)
    raw = _config.read_raw(config_path)
    geo_parameters = {"state_filter": _config.state_filter(config, raw)}
    file_names = _file_names(sources, config_path)
    config_run = SuiteRun("config", row_nouns=_ROW_NOUNS)
    if len(sources) == len(FILES) and all(source.partitioned for source in sources.values()):
        outcome = _validate_by_state(sources, geo_parameters, file_names, config_run, raw)
    else:
        outcome = _validate_files(sources, geo_parameters, file_names, config_run, raw)

    # The report lists, in order: the config, each file, then the cross-file rules.
    report = ValidationReport(subject="inputs")
    report.failures.extend(missing)
    if load_failure is not None:
        report.failures.append(load_failure)
    report.failures.extend(config_run.tally.failures(file_names))
    tallies = [config_run.tally]
    for stem in FILES:
        report.failures.extend(outcome.failures.get(stem, []))
        if stem in outcome.tallies:
            header = outcome.headers.get(stem)
            report.failures.extend(_explain_header(f, stem, header)
                                   for f in outcome.tallies[stem].failures(file_names))
            tallies.append(outcome.tallies[stem])
    for name in CROSS_FILE_SUITES:
        if name in outcome.tallies:
            report.failures.extend(outcome.tallies[name].failures(file_names))
            tallies.append(outcome.tallies[name])
    for tally in tallies:
        report.notes.extend(tally.notes())
        if tally.any_evaluated():
            report.results.append(tally.result_json())
    report.notes.extend(outcome.notes)
    return report


def _check_config(config_run: SuiteRun, raw: dict | None) -> None:
    if raw is not None:
        config_run.check("config", _config.flatten(raw))


def _validate_files(sources: dict[str, SourceFile], geo_parameters: dict, file_names: dict[str, str],
                    config_run: SuiteRun, raw: dict | None) -> Outcome:
    """Each file as a whole (CSV, Parquet, or a folder not stored by state); a large persons
    file in a second process while this one validates geo and units."""
    worker = None
    if "persons" in sources and _second_core() and sources["persons"].estimated_rows() >= PARALLEL_MIN_ROWS:
        worker = _start_worker({"task": "file", "source": sources["persons"]})
    try:
        here = [stem for stem in ("geo", "units", "persons") if stem in sources and not (stem == "persons" and worker)]
        validations = {stem: FileValidation(sources[stem], geo_parameters if stem == "geo" else None)
                       for stem in here}
        for validation in validations.values():  # while Great Expectations is being imported
            validation.read_ahead()
        parts = {stem: validation.finish() for stem, validation in validations.items()}
        validations.clear()
        _check_config(config_run, raw)
        if worker is not None:
            parts["persons"] = _persons_part(worker, sources["persons"])
    finally:
        if worker is not None:
            worker.cancel()
    return _outcome(parts, file_names)


# ------------------------------------------------------------------------- input stored by state
GROUP_MIN_ROWS = 3_000_000
"""States are validated in groups of at least this many rows of persons, units and geo (a large
state alone): each Great Expectations run costs a fixed overhead, about a second per state."""


def validate_group(sources: dict[str, SourceFile], states: list[str], file_names: dict[str, str],
                   geo_parameters: dict) -> Outcome:
    """Validate the ``TABBLKST=<state>`` folders of ``states`` in each file, then the cross-file
    rules on the three files' rows of those states.

    The cross-file rules are decided per MAFID, and the counting reads a MAFID's records from its
    state's folders only; so records of different states never join here (a person whose unit
    is stored under another state has no unit), whichever states are validated together.
    """
    started = time.perf_counter()
    parts: dict[str, FilePart] = {}
    for stem in ("geo", "units", "persons"):
        partitions = sources[stem].partitions()
        files = tuple(f for state in states for f in partitions.get(state, ()))
        if not files:
            parts[stem] = _no_rows(stem)
            continue
        parts[stem] = FileValidation(sources[stem].subset(files), geo_parameters if stem == "geo" else None).finish()
    outcome = _outcome(parts, file_names)
    # States and seconds only: a count of the group's records would be an exact confidential count.
    log.info("state partitions validated", states=",".join(states), seconds=round(time.perf_counter() - started, 2))
    return outcome


def validate_states(sources: dict[str, SourceFile], groups: list[list[str]], file_names: dict[str, str],
                    geo_parameters: dict) -> dict[str, Outcome]:
    """:func:`validate_group` of each group of states, one after the other (keyed by its first state)."""
    return {group[0]: validate_group(sources, group, file_names, geo_parameters) for group in groups}


def _no_rows(stem: str) -> FilePart:
    """The part of a file that holds no rows of some states: nothing to check, nothing missing."""
    return FilePart(stem, Tally(load_suite(stem)), complete=True,
                    columns={name: np.empty(0, dtype=np.int32) for name in (*COMPACT_COLUMNS[stem], "STATE")})


def _state_rows(sources: dict[str, SourceFile]) -> dict[str, int]:
    """Rows of persons, units and geo per state (Parquet metadata): the work of each state."""
    rows: dict[str, int] = {}
    for source in sources.values():
        for state, files in source.partitions().items():
            assert state is not None
            rows[state] = rows.get(state, 0) + source.subset(files).estimated_rows()
    return rows


def _groups(rows: dict[str, int]) -> list[list[str]]:
    """States in groups of at least GROUP_MIN_ROWS rows (the last may hold fewer), in state order."""
    groups: list[list[str]] = [[]]
    size = 0
    for state in sorted(rows):
        if size >= GROUP_MIN_ROWS:
            groups.append([])
            size = 0
        groups[-1].append(state)
        size += rows[state]
    return [g for g in groups if g]


def _share(groups: list[list[str]], rows: dict[str, int], head_start: int) -> tuple[list[list[str]], list[list[str]]]:
    """Split the groups between this process and a second one, largest first, each to the
    process with less work so far (this one starts with ``head_start`` rows of other work)."""
    here: list[list[str]] = []
    there: list[list[str]] = []
    load_here, load_there = head_start, 0
    for group in sorted(groups, key=lambda g: -sum(rows[s] for s in g)):
        if load_here <= load_there:
            here.append(group)
            load_here += sum(rows[s] for s in group)
        else:
            there.append(group)
            load_there += sum(rows[s] for s in group)
    return here, there


def _validate_by_state(sources: dict[str, SourceFile], geo_parameters: dict, file_names: dict[str, str],
                       config_run: SuiteRun, raw: dict | None) -> Outcome:
    """Input stored by state: groups of states on two processes, then the checks across states."""
    rows = _state_rows(sources)
    groups = _groups(rows)
    # The layout check below reads the MAFIDs of units and geo: about a tenth of validating them.
    layout_rows = (sources["units"].estimated_rows() + sources["geo"].estimated_rows()) // 10
    here, there = groups, []
    if _second_core() and len(groups) > 1 and sum(rows.values()) >= PARALLEL_MIN_ROWS:
        here, there = _share(groups, rows, layout_rows)
    worker = None
    if there:
        worker = _start_worker({"task": "states", "sources": sources, "groups": there,
                                "geo_parameters": geo_parameters, "file_names": file_names})
        if worker is None:
            here, there = groups, []
    try:
        by_group = validate_states(sources, here, file_names, geo_parameters)
        _check_config(config_run, raw)
        layout = _layout(sources)
        if there:
            by_group.update(_states_part(worker, sources, there, file_names, geo_parameters))
    finally:
        if worker is not None:
            worker.cancel()
    outcome = Outcome()
    for first in sorted(by_group):  # the same report whichever process validated a group
        outcome.merge(by_group[first])
    outcome.merge(layout)
    outcome.notes.append(
        f"the input is stored by state ({len(rows)} TABBLKST=<state> folders): records join only "
        "within a state's folders, as the counting reads them")
    return outcome


def _states_part(worker: _Worker | None, sources: dict[str, SourceFile], groups: list[list[str]],
                 file_names: dict[str, str], geo_parameters: dict) -> dict[str, Outcome]:
    if worker is not None:
        try:
            result = worker.result()
            if isinstance(result, dict) and sorted(result) == sorted(g[0] for g in groups) \
                    and all(isinstance(v, Outcome) for v in result.values()):
                return result
            raise RuntimeError("validation worker returned no result")
        except Exception as exc:  # noqa: BLE001 -- e.g. the process died: validate here instead
            log.warning("validation worker failed; validating in this process",
                        error_type=type(exc).__name__, groups=len(groups))
    return validate_states(sources, groups, file_names, geo_parameters)


_REPEATED_RULE = ("a MAFID's {stem} rows are all in one TABBLKST=<state> folder "
                  "(this MAFID is also stored under another state)")
_MISPLACED_RULE = "a geo row is stored in the TABBLKST=<state> folder of its own TABBLKST"


def _layout(sources: dict[str, SourceFile]) -> Outcome:
    """What no group of states can see: a MAFID of units or geo stored under two states, and a
    geo row stored under another state than its own (the counting would refuse both).

    Reads only MAFID, and TABBLKST of geo; keeps two bits per possible MAFID (200 MB). Values
    that break a per-file rule are left to that rule.
    """
    outcome = Outcome()
    for stem in ("units", "geo"):
        source = sources[stem]
        seen = np.zeros((MAFID_MAX >> 3) + 1, dtype=np.uint8)
        repeated = np.zeros_like(seen)
        misplaced = 0
        for state, files in sorted(source.partitions().items(), key=lambda kv: str(kv[0])):
            assert state is not None
            mafids, other_state = _layout_columns(files, state, tabblkst=stem == "geo")
            misplaced += other_state
            mafids = sorted_distinct(mafids)
            byte, bit = mafids >> 3, np.left_shift(np.uint8(1), (mafids & 7).astype(np.uint8))
            again = (seen[byte] & bit) != 0
            np.bitwise_or.at(repeated, byte[again], bit[again])
            np.bitwise_or.at(seen, byte, bit)
        failures = []
        if misplaced:
            failures.append(Failure(source.name, ("TABBLKST",), _MISPLACED_RULE, misplaced))
        n = int(np.unpackbits(repeated[repeated != 0]).sum())
        if n:
            failures.append(Failure(source.name, ("MAFID",), _REPEATED_RULE.format(stem=stem), n, row_noun="MAFID"))
        if failures:
            outcome.failures[stem] = failures
    return outcome


def _other_state_rows(codes: pa.Array, state: str) -> int:
    """Rows whose code is a well-formed state code other than ``state`` (a malformed or missing
    code is reported by the geo suite)."""
    if pa.types.is_dictionary(codes.type):
        # Each distinct code is looked at once, then its rows are counted.
        values = codes.dictionary.to_pylist()
        other = [i for i, v in enumerate(values) if isinstance(v, str) and _STATE_CODE.fullmatch(v) and v != state]
        if not other:
            return 0
        counts = np.bincount(codes.indices.fill_null(len(values)).to_numpy(zero_copy_only=False),
                             minlength=len(values) + 1)
        return int(counts[other].sum())
    if not pa.types.is_string(codes.type):
        return 0
    well_formed = pc.match_substring_regex(codes, _STATE_CODE.pattern)
    return int(pc.sum(pc.and_(well_formed, pc.not_equal(codes, state))).as_py() or 0)


_STATE_CODE = re.compile(r"^[0-9]{2}$")


def _layout_columns(files: tuple[Path, ...], state: str, *, tabblkst: bool) -> tuple[npt.NDArray[np.int64], int]:
    """The valid MAFIDs of ``files``, and how many rows have a TABBLKST code of another state."""
    chunks, other_state = [], 0
    for path in files:
        try:
            pf = pq.ParquetFile(path, read_dictionary=["TABBLKST"] if tabblkst else None)
            names = pf.schema_arrow.names
            columns = [c for c in ("MAFID", "TABBLKST") if c in names and (c == "MAFID" or tabblkst)]
            for batch in pf.iter_batches(batch_size=4_000_000, columns=columns):
                if "MAFID" in columns:
                    values = parse_integers(batch.column(columns.index("MAFID"))).fill_null(-1)
                    values = values.to_numpy(zero_copy_only=False)
                    chunks.append(values[(values >= MAFID_MIN) & (values <= MAFID_MAX)].astype(np.int64))
                if "TABBLKST" in columns:
                    other_state += _other_state_rows(batch.column(columns.index("TABBLKST")), state)
        except Exception:  # noqa: BLE001 -- unreadable or mistyped: the file's own rules say how
            continue
    return (np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)), other_state


def _cross_file(parts: dict[str, FilePart], file_names: dict[str, str]) -> tuple[list[SuiteRun], list[str]]:
    """Evaluate the cross-file suites on derived frames, when the files they need are usable."""
    units_geo_run = SuiteRun("units_geo", row_nouns=_ROW_NOUNS)
    pin_run = SuiteRun("persons_in_units", row_nouns=_ROW_NOUNS)
    households_run = SuiteRun("households", row_nouns=_ROW_NOUNS)
    notes: list[str] = []
    usable = {stem for stem, part in parts.items() if part.usable}
    if not all("STATE" in part.columns for part in parts.values()):
        # Not every file is stored by state: records join on their MAFID alone.
        for part in parts.values():
            part.columns.pop("STATE", None)
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
            part = worker.result()
            if isinstance(part, FilePart):
                return part
            raise RuntimeError("validation worker returned no result")
        except Exception as exc:  # noqa: BLE001 -- e.g. the process died: validate here instead
            log.warning("validation worker failed; validating in this process",
                        error_type=type(exc).__name__, file=source.name)
    return validate_file(source)


def _compact(part: FilePart) -> CompactColumns:
    cols = CompactColumns()
    cols.add({k: v.astype(np.int32) for k, v in part.columns.items()})
    return cols


def _explain_header(failure: Failure, stem: str, header: list[str] | None) -> Failure:
    """Add which columns are missing, unexpected or out of order to a failed header rule."""
    if header is None or not (failure.rule_id or "").endswith(".header"):
        return failure
    expected = _expected_header(stem)
    detail = describe_header(header, expected)
    missing = tuple(n for n in expected if n not in header)
    return replace(failure, rule=f"{failure.rule}: {detail}" if detail else failure.rule,
                   columns=missing or failure.columns)


def _skipped(what: str, stems: tuple[str, ...], usable: set[str], file_names: dict[str, str]) -> str:
    bad = [file_names[s] for s in stems if s not in usable]
    return (f"cross-file rules of {what} not checked: they need every row and the key columns "
            f"of {', '.join(bad)}")
