"""Input validation: the config and the three files, on the columns the counting reads.

The files are read once, by the counting's pass (:class:`phsafe.intake.InputPass`): each batch
is checked column by column and reduced to compact columns; the state filter comes first (spec
§1) -- geo rows outside ``state_filter``, and the units and persons of their MAFIDs, are set aside
and counted, and the rules apply to the records the run keeps. This module is the pass's
*observer*: it turns what the pass sees into the frames the suites are evaluated on, and the
results into a report.

* Per-file suites: each group of rules that read the same columns (:mod:`._combos`) is evaluated
  on the distinct combinations of those columns over every kept row of the file (all batches,
  all state folders), each with its number of rows. Rules about MAFID alone read the distinct
  MAFIDs, which the join has already found (a few million a state), a state at a time.
* Cross-file suites, on frames derived from the MAFID join of each partition: ``units_geo`` (one
  row per MAFID of units or geo), ``persons_in_units`` (one row per person, next to the unit with
  its MAFID), ``households`` (one row per household with its number of householders) -- again as
  distinct combinations with their weights. Records join only within their partition: for data
  stored by state, within their state's folders, exactly as the counting reads them.
* Across the state folders of data stored by state: a geo row stored under another state's
  folder, a MAFID of units or geo stored under two states' folders.

Great Expectations evaluates every frame (:func:`phsafe.validation._gx.evaluate`), in a second
process for a large input (:mod:`._worker`), while this one goes on reading and counting. A
value that broke a per-file rule is null in the derived frames (and a household holding a person
with such a RELSHIP has an unknown number of householders), so it is reported once, by the
per-file rule, and not again by every cross-file rule it touches. A row that could not be read
at all makes the cross-file rules of its file unchecked (the report says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from phsafe.logs import get_logger
from phsafe.reader import INVALID, NOT_UTF8, OK, ClassBook, Encoded, InputFile, SourceReader
from phsafe.schema import FILES, RELSHIP_HOUSEHOLDER, RTYPE_UNIT_HU, STATE_CODES, PUERTO_RICO, Column
from phsafe.validation import _config, _gx
from phsafe.validation._combos import ComboCounter, RuleGroup, Values, distinct, joints, rule_groups
from phsafe.validation._frames import CODE, DERIVED, FLAG, INTEGER, FrameColumn
from phsafe.validation._read import describe_header, locate
from phsafe.validation._report import Failure, Tally, ValidationReport, write_report
from phsafe.validation._suites import Suite, load_suite
from phsafe.validation._worker import Evaluator, InProcess, ReportJob, evaluator

if TYPE_CHECKING:
    from phsafe.config import ConfigFile

log = get_logger("phsafe.validation")

_ROW_NOUNS = {"persons_in_units": "person", "households": "household", "units_geo": "MAFID", "config": "key"}
STEMS = ("persons", "units", "geo")
CROSS_FILE_SUITES = ("units_geo", "persons_in_units", "households")
COMPACT_COLUMNS: dict[str, tuple[str, ...]] = {
    "persons": ("MAFID", "RTYPE", "RELSHIP", "QAGE"),
    "units": ("MAFID", "RTYPE", "HHT", "HHT2"),
    "geo": ("MAFID", "RTYPE"),
}
"""Columns of each file the cross-file rules read."""
SLICE_ROWS = 2_000_000
"""Derived frames are built this many persons (or MAFIDs) at a time: bounded temporaries."""
MAFID_JOB_ROWS = 4_000_000
"""Distinct MAFIDs of several state partitions are judged together, about this many a job."""
PENDING_ROWS = 12_000_000
"""At most this many rows of frames wait for Great Expectations (about 100 MB): beyond, the pass
waits for its answers (it is far faster than the pass: a 4M-row frame takes a tenth of a
second)."""
_SMALL_MAX = 254
"""Row counts in the derived frames are capped here: every rule on a count compares it with 0 or
1, so a count of 300 and one of 254 get the same verdict."""
_REPEATED_RULE = ("a MAFID's {stem} rows are all in one TABBLKST=<state> folder "
                  "(this MAFID is also stored under another state)")
_MISPLACED_RULE = "a geo row is stored in the TABBLKST=<state> folder of its own TABBLKST"


@dataclass(frozen=True)
class ValidationSetup:
    """What a validation needs before it reads a row: the run's config read and its failure,
    the state filter, the input files found and the names the report gives them.

    Attributes:
        load_failure: Why the config is not a valid config (None: it is).
        raw: The config's JSON document (None when it could not be read).
        state_list: The config's state filter as validation reads it (a parameter of geo's rules).
        states: The state filter the pass applies first (None: no usable one).
        sources: The inputs found.
        missing: A failure for each input that is missing or ambiguous.
        file_names: Stem (and ``config``) -> the name reports give the file.
    """

    load_failure: Failure | None
    raw: Any
    state_list: list[str] | None
    states: tuple[str, ...] | None
    sources: dict[str, InputFile]
    missing: list[Failure]
    file_names: dict[str, str]
    data_dir: Path

    @classmethod
    def of(cls, config_path: "ConfigFile | Path", data_dir: Path) -> "ValidationSetup":
        config_file, load_failure = _config.load(config_path)
        raw = config_file.document
        state_list = _config.state_filter(config_file.config, raw)
        sources, missing = locate(data_dir)
        file_names = {stem: (sources[stem].name if stem in sources else f"{stem}.csv") for stem in FILES}
        file_names["config"] = config_file.name
        return cls(load_failure, raw, state_list, usable_states(state_list), sources, missing, file_names,
                   Path(data_dir))

    @property
    def all_found(self) -> bool:
        return set(FILES) <= set(self.sources)

    def files(self) -> dict[str, InputFile]:
        """Every input; one that is missing (reported) reads as a folder of no files."""
        return {stem: self.sources.get(stem, InputFile(stem, self.data_dir / stem, "parquet", True, ()))
                for stem in FILES}

    def validation(self) -> "InputValidation":
        """The validation of a pass over these inputs, Great Expectations in a second process for
        a large input (:func:`phsafe.validation._worker.evaluator`)."""
        rows = sum(s.estimated_rows() for s in self.sources.values())
        return InputValidation(self.file_names, evaluator(rows), self.state_list,
                               missing=set(FILES) - set(self.sources))


def piece_validation(file_names: Mapping[str, str], state_filter: list[str] | None) -> "InputValidation":
    """The validation of one piece of a pass (a block, a MAFID range, a state's folders, in a
    worker process or a cluster's task): Great Expectations on a thread of this process, the
    distinct combinations handed on in its :meth:`~InputValidation.piece` to be judged with
    every other piece's where the report is made."""
    return InputValidation(dict(file_names), InProcess(), state_filter, missing=set(), defer_combinations=True)


def usable_states(state_list: list[str] | None) -> tuple[str, ...] | None:
    """The state filter to apply first, or None (the config gives no usable one: nothing is set
    aside, and the report says so)."""
    if not state_list:
        return None
    valid = STATE_CODES | {PUERTO_RICO}
    if not all(isinstance(s, str) and s in valid for s in state_list):
        return None
    return tuple(sorted(set(state_list)))


# ------------------------------------------------------------------------------- frames for GX
def _narrow(values: np.ndarray) -> np.ndarray:
    """int32 when the values fit (half the bytes to send), else int64."""
    if len(values) and values.dtype.itemsize > 4 and -(1 << 31) <= int(values.min()) and int(values.max()) < (1 << 31):
        return values.astype(np.int32)
    return values


def _file_frame(books: Mapping[str, ClassBook], columns: Sequence[str],
                combos: Sequence[npt.NDArray[np.int64]]) -> list[FrameColumn]:
    return [FrameColumn(name, _narrow(classes), 0, CODE if books[name].code else INTEGER, books[name])
            for name, classes in zip(columns, combos)]


def _derived_frame(columns: Sequence[str], combos: Sequence[npt.NDArray[np.int64]]) -> list[FrameColumn]:
    """A derived frame from compact classes (value + 1; 0 for null)."""
    return [FrameColumn(name, _narrow(classes), 0, FLAG if name == "IN_UNITS" else DERIVED)
            for name, classes in zip(columns, combos)]


# ----------------------------------------------------------------------------- the observer
@dataclass
class _FileCheck:
    """Validation of one input file over every partition of the pass."""

    stem: str
    suite: Suite
    tally: Tally
    books: dict[str, ClassBook]
    header: list[str] | None = None
    headers_seen: set[tuple[str, ...]] = field(default_factory=set)
    groups: list[RuleGroup] | None = None
    counters: list[ComboCounter] = field(default_factory=list)
    mafid_group: RuleGroup | None = None
    irregular_mafids: list[npt.NDArray[np.int64]] = field(default_factory=list)
    mafids: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = field(default_factory=list)
    complete: bool = True
    columns: set[str] = field(default_factory=set)
    utf8_rows: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    submitted: bool = False

    def usable(self) -> bool:
        """Every row was read and the columns the cross-file rules need are all there."""
        return self.complete and set(COMPACT_COLUMNS[self.stem]) <= self.columns


class InputValidation:
    """The validation side of a pass (see the module docstring).

    Args:
        file_names: Stem -> the name reports give the file.
        evaluator: Where Great Expectations runs.
        state_filter: The config's state filter (the geo rule's parameter), if usable.
        missing: Stems of files that are missing (reported by :func:`locate`).
    """

    def __init__(self, file_names: Mapping[str, str], evaluator: Evaluator, state_filter: list[str] | None,
                 missing: set[str], *, defer_combinations: bool = False) -> None:
        self.defer_combinations = defer_combinations
        """A piece of a pass (:meth:`piece`): its per-file and cross-file combinations are handed
        on, to be evaluated once with every other piece's where the report is made; only the
        MAFID frames (large) and the headers are evaluated here."""
        self.file_names = dict(file_names)
        self.evaluator = evaluator
        self.state_filter = state_filter
        self.missing = missing
        self.files = {stem: _FileCheck(stem, load_suite(stem), Tally(load_suite(stem)),
                                       {c.name: ClassBook(c) for c in FILES[stem]}) for stem in STEMS}
        self.cross = {name: Tally(load_suite(name), _ROW_NOUNS) for name in CROSS_FILE_SUITES}
        self.cross_counters: dict[str, list[ComboCounter]] = {}
        self.cross_groups: dict[str, list[RuleGroup]] = {}
        self._cross_columns: dict[str, list[str]] = {}
        self._jobs: list[tuple[_gx.Job, Future[Any], Tally]] = []
        self._pending_rows = 0
        self._skipped_cross: list[str] = []

    # ----------------------------------------------------------------------------- GX jobs
    def _submit(self, tally: Tally, group: RuleGroup, frame: Any, weights: npt.NDArray[np.int64] | None,
                parameters: Mapping[str, Any] | None = None) -> None:
        params = {k: v for k, v in (parameters or {}).items() if v is not None}
        rules = []
        for rule_id in group.rule_ids:
            rule = tally.suite.rule(rule_id)
            missing = rule.parameters() - set(params)
            if missing:
                tally.skip(rule_id, f"no valid {', '.join(sorted(missing))} in the config")
            else:
                rules.append(rule_id)
        if not rules:
            return
        job = _gx.Job(group.suite, group.frame, tuple(rules), frame, None if weights is None else _narrow(weights),
                      params)
        self._add_job(job, tally)

    def _add_job(self, job: _gx.Job, tally: Tally) -> None:
        """Submit a job; keep it until it is answered (to evaluate it here should the second
        process fail), then only its value-free results. Memory stays bounded whatever the
        input's size: answered jobs are let go as the pass goes on, and the pass waits when more
        than :data:`PENDING_ROWS` rows of frames are unanswered."""
        self._jobs.append((job, self.evaluator.submit(job), tally))
        self._pending_rows += _job_rows(job)
        self._settle(wait=False)
        while self._pending_rows > PENDING_ROWS and self._jobs:
            self._settle(wait=True)

    def _settle(self, *, wait: bool) -> None:
        """Tally the answered jobs and let their frames go (``wait``: for the oldest at least)."""
        keep = []
        for i, (job, future, tally) in enumerate(self._jobs):
            if not future.done() and not (wait and i == 0):
                keep.append((job, future, tally))
                continue
            self._tally(job, future, tally)
            self._pending_rows -= _job_rows(job)
        self._jobs = keep

    def _tally(self, job: _gx.Job, future: "Future[Any]", tally: Tally) -> None:
        try:
            results = future.result()
        except Exception as exc:  # noqa: BLE001 -- e.g. the second process died: evaluate here
            log.warning("validation worker failed; evaluating in this process", error_type=type(exc).__name__)
            results = _gx.evaluate(job)
        for r in results:
            tally.add(r.rule_id, r.success, r.counts, r.raised)

    def config(self, raw: Any) -> Tally:
        """Submit the config suite on the flattened config; return its tally."""
        tally = Tally(load_suite("config"), _ROW_NOUNS)
        if raw is not None:
            suite = load_suite("config")
            group = RuleGroup("config", "config", (), tuple(r.rule_id for r in suite.rules))
            self._submit(tally, group, _config.flatten(raw), None)
        return tally

    def _parameters(self, stem: str) -> dict[str, Any]:
        return {"state_filter": self.state_filter} if stem == "geo" else {}

    # --------------------------------------------------------------------- the pass's hooks
    def book(self, stem: str, column: Column) -> ClassBook:
        return self.files[stem].books[column.name]

    def batch(self, stem: str, name: str, encoded: Mapping[str, Encoded], kept: npt.NDArray[np.bool_] | None) -> None:
        check = self.files[stem]
        if check.groups is None:
            self._setup(check, list(encoded))
        rows = kept
        for column, e in encoded.items():
            if e.kind is not None and (e.kind == NOT_UTF8).any():
                bad = e.kind == NOT_UTF8
                if kept is not None:
                    bad &= kept
                n = int(np.count_nonzero(bad))
                if n:
                    check.utf8_rows[column] = check.utf8_rows.get(column, 0) + n
                    check.complete = False
                    # Such rows are left out of every rule: their other fields cannot be trusted.
                    rows = ~bad if rows is None else rows & ~bad
        views: dict[str, Values] = {}

        def view(column: str) -> Values:
            if column not in views:
                array, offset = encoded[column].class_view()
                views[column] = (array if rows is None else array[rows], offset)
            return views[column]

        for counter in check.counters:
            counter.add([view(c) for c in counter.columns])
        if check.mafid_group is not None:
            m = encoded["MAFID"]
            if m.kind is not None:  # irregular MAFIDs; the valid ones come from the join
                irregular = m.kind != OK
                if rows is not None:
                    irregular &= rows
                if irregular.any():
                    check.irregular_mafids.append(m.class_of_rows()[irregular])

    def _setup(self, check: _FileCheck, present: list[str]) -> None:
        """Group the file's rules by the columns they read, and the groups into sets of columns
        counted together; rules of absent columns are noted."""
        check.columns = set(present)
        order = [c.name for c in FILES[check.stem]]
        groups = []
        for group in rule_groups(check.suite, check.stem, order, exclude=frozenset({f"{check.stem}.header"})):
            absent = set(group.columns) - check.columns
            if absent:
                for rule_id in group.rule_ids:
                    check.tally.skip(rule_id, f"column {', '.join(sorted(absent))} is not in the data")
            elif group.columns == ("MAFID",):
                check.mafid_group = group
            else:
                groups.append(group)
        check.groups = groups
        sizes = {c.name: _classes(c) for c in FILES[check.stem]}
        check.counters = [ComboCounter(columns) for columns in joints(groups, sizes, order)]

    def file_read(self, stem: str, part: Any, reader: SourceReader, last: bool) -> None:
        """A file of a partition is read; after the last partition's, its per-file rules are
        judged -- while the other files are still being read."""
        check = self.files[stem]
        try:
            self._header(check, stem, reader)
        finally:
            if last:
                self._submit_file(stem)

    def _header(self, check: _FileCheck, stem: str, reader: SourceReader) -> None:
        if not reader.complete:
            check.complete = False
        header = reader.header
        if header is None:
            return
        if check.header is None:
            check.header = list(header)
        if check.groups is None:  # a header and no rows (or no schema column)
            self._setup(check, [c.name for c in FILES[stem] if c.name in header])
        if tuple(header) not in check.headers_seen:
            check.headers_seen.add(tuple(header))
            frame = pd.DataFrame({name: pd.Series([], dtype="str") for name in header}, columns=header) \
                if len(set(header)) == len(header) else None
            if frame is not None:
                group = RuleGroup(stem, stem, tuple(header), (f"{stem}.header",))
                self._submit(check.tally, group, frame, None)

    def partition(self, part: Any, geo: Any, join: Any, rows: Mapping[str, Any], last: bool) -> None:
        """Frames of one joined partition: MAFID rules, cross-file rules; at the last, the rest."""
        for stem in STEMS:
            self._mafids(stem, join, rows[stem], last)
        usable = {stem for stem in STEMS if self.files[stem].usable() and stem not in self.missing}
        if {"units", "geo"} <= usable:
            self._units_geo(join, rows["units"], rows["geo"])
        if {"units", "persons"} <= usable:
            self._persons_in_units(join, rows["units"], rows["persons"])
        for name, needs in (("units_geo", ("units", "geo")), ("persons_in_units and households", ("units", "persons"))):
            if not set(needs) <= usable:
                bad = [self.file_names[s] for s in needs if s not in usable]
                note = (f"cross-file rules of {name} not checked: they need every row and the key columns "
                        f"of {', '.join(bad)}")
                if note not in self._skipped_cross:
                    self._skipped_cross.append(note)
        if last:
            self._submit_accumulated()

    def _mafids(self, stem: str, join: Any, rows: Any, last: bool) -> None:
        """The distinct MAFIDs of a file's kept rows in this partition, with their rows."""
        check = self.files[stem]
        group = check.mafid_group
        if group is None:
            return
        if stem == "geo":
            keys, weights = join.geo.index.keys, join.geo.kept
        elif stem == "units":
            keys, weights = join.mafid, join.unit_rows
        else:
            weights = np.bincount(join.person_key + 1, minlength=join.n_keys + 1)[1:]  # key -1: none
            keys = join.mafid
            valid = rows.ok("MAFID")
            orphan = join.person_key < 0
            if valid is not None:
                orphan &= valid
            if orphan.any():
                check.irregular_mafids.append(rows.columns["MAFID"][orphan].astype(np.int64) + 1)
        present = weights > 0
        check.mafids.append((np.compress(present, keys).astype(np.int64) + 1,
                             np.compress(present, weights).astype(np.int64)))
        if check.irregular_mafids:
            extra, extra_counts = distinct([np.concatenate(check.irregular_mafids)])
            check.irregular_mafids.clear()
            check.mafids.append((extra[0], extra_counts))
        if last or sum(len(c) for c, _ in check.mafids) >= MAFID_JOB_ROWS:
            self._submit_mafids(check)

    def _submit_mafids(self, check: _FileCheck) -> None:
        """The distinct MAFIDs gathered so far (a few partitions') in one job. Each partition
        holds its own MAFIDs, so no merging is needed: a MAFID stored under two states is two
        rows of the frame, each with its own rows -- the counts are the same."""
        if not check.mafids or check.mafid_group is None:
            check.mafids.clear()
            return
        classes = np.concatenate([c for c, _ in check.mafids])
        counts = np.concatenate([w for _, w in check.mafids])
        check.mafids.clear()
        for start in range(0, len(counts), MAFID_JOB_ROWS):  # bounded frames in the evaluation
            piece = slice(start, start + MAFID_JOB_ROWS)
            frame = _file_frame(check.books, ("MAFID",), [classes[piece]])
            self._submit(check.tally, check.mafid_group, frame, counts[piece])

    def _cross_add(self, suite: str, columns: dict[str, npt.NDArray[np.integer]]) -> None:
        """Add rows of a derived frame (compact values, ``INVALID`` for null) to its counters."""
        self._cross_setup(suite, list(columns))
        for counter in self.cross_counters[suite]:
            counter.add([(columns[c], 1) for c in counter.columns])

    def _cross_setup(self, suite: str, columns: list[str]) -> None:
        if suite not in self.cross_counters:
            groups = rule_groups(self.cross[suite].suite, suite, columns)
            sizes = {name: _DERIVED_CLASSES.get(name, 256) for name in columns}
            self.cross_groups[suite] = groups
            self.cross_counters[suite] = [ComboCounter(j) for j in joints(groups, sizes, columns)]
            self._cross_columns[suite] = columns

    def _units_geo(self, join: Any, units: Any, geo_rows: Any) -> None:
        """One row per MAFID of kept units or kept geo rows: rows of each, first RTYPE of each."""
        geo = join.geo
        n_geo = len(geo.index)
        unit_rtype, geo_rtype = _Padded(units.compact("RTYPE")), _Padded(geo_rows.compact("RTYPE"))
        for start in range(0, join.n_keys, SLICE_ROWS):  # bounded temporaries
            stop = min(join.n_keys, start + SLICE_ROWS)
            present = join.unit_rows[start:stop] > 0
            inside = slice(start, min(stop, n_geo))
            if inside.start < inside.stop:
                n = inside.stop - inside.start
                present[:n] |= geo.rows[inside] > 0
                present[:n] &= ~geo.aside[inside]
            keys = np.flatnonzero(present) + start
            geo_count = np.zeros(len(keys), np.int64)
            geo_first = np.full(len(keys), -1, np.int64)
            in_geo = keys < n_geo
            keys_in_geo = np.compress(in_geo, keys)
            geo_count[in_geo] = np.take(geo.rows, keys_in_geo)
            geo_first[in_geo] = np.take(geo.first, keys_in_geo)
            self._cross_add("units_geo", {
                "UNITS_ROWS": np.minimum(np.take(join.unit_rows, keys), _SMALL_MAX),
                "GEO_ROWS": np.minimum(geo_count, _SMALL_MAX),
                "UNIT_RTYPE": unit_rtype.at(np.take(join.unit_first, keys)),
                "GEO_RTYPE": geo_rtype.at(geo_first),
            })

    def _persons_in_units(self, join: Any, units: Any, persons: Any) -> None:
        """One row per person with a valid MAFID, next to the first unit row of its MAFID; and
        one row per household with its number of householders."""
        n_keys = join.n_keys
        first = join.unit_first
        # Per key: the first unit row's values (INVALID for none), read through each person's key.
        unit_rtype = _at(units.compact("RTYPE"), first)
        unit_hht = _at(units.compact("HHT"), first)
        unit_hht2 = _at(units.compact("HHT2"), first)
        has_unit = first >= 0
        # Padded once, read slice after slice (each read through :func:`_at` copies its column).
        read_rtype, read_hht, read_hht2 = _Padded(unit_rtype), _Padded(unit_hht), _Padded(unit_hht2)
        read_has_unit = _Padded(has_unit, False)
        valid = persons.ok("MAFID")
        relship_all = persons.compact("RELSHIP")
        rtype_all, age_all = persons.compact("RTYPE"), persons.compact("QAGE")
        householder_keys: list[np.ndarray] = []
        unknown_keys: list[np.ndarray] = []
        for start in range(0, persons.rows, SLICE_ROWS):  # bounded temporaries
            rows = slice(start, start + SLICE_ROWS)
            key, relship = join.person_key[rows], relship_all[rows]
            rtype, age = rtype_all[rows], age_all[rows]
            if valid is not None:
                keep = valid[rows]
                key, relship, rtype, age = (np.compress(keep, a) for a in (key, relship, rtype, age))
            at = key.astype(np.intp)  # once, not in each of the four reads (the keys kept below stay int32)
            in_units = read_has_unit.at(at)
            self._cross_add("persons_in_units", {
                "IN_UNITS": in_units.view(np.int8),
                "RTYPE": rtype,
                "RELSHIP": relship,
                "QAGE": age,
                "UNIT_RTYPE": read_rtype.at(at),
                "UNIT_HHT": read_hht.at(at),
                "UNIT_HHT2": read_hht2.at(at),
            })
            householder_keys.append(np.compress(in_units & (relship == RELSHIP_HOUSEHOLDER), key))
            unknown_keys.append(np.compress(in_units & (relship == INVALID), key))
        # Households: the first unit row of each MAFID with RTYPE 2 and HHT != 0, and its number
        # of householders (unknown when one of its persons' RELSHIP broke a per-file rule).
        households = np.flatnonzero((unit_rtype == RTYPE_UNIT_HU) & (unit_hht > 0))
        householders = np.bincount(np.concatenate(householder_keys), minlength=n_keys) if householder_keys \
            else np.zeros(n_keys, np.int64)
        counts = np.minimum(householders[households], _SMALL_MAX)
        del householders
        unknown = np.concatenate(unknown_keys) if unknown_keys else np.empty(0, np.int32)
        if len(unknown):
            counts[np.isin(households, unknown)] = INVALID
        self._cross_add("households", {"HOUSEHOLDERS": counts})

    def _submit_file(self, stem: str) -> None:
        """Submit a file's per-file rule groups (once its every partition is read)."""
        check = self.files[stem]
        if check.submitted or self.defer_combinations:
            return
        check.submitted = True
        single: dict[str, tuple[RuleGroup, npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
        for group in check.groups or ():
            counter = next(c for c in check.counters if set(group.columns) <= set(c.columns))
            combos, counts = counter.result(group.columns)
            if not len(counts):
                continue
            if len(group.columns) == 1 and _plain(check.suite, group):
                single[group.columns[0]] = (group, combos[0], counts)
            else:
                self._submit(check.tally, group, _file_frame(check.books, group.columns, combos), counts,
                             self._parameters(stem))
        if single:
            self._submit_columns(check, single, self._parameters(stem))

    def _submit_accumulated(self) -> None:
        for stem in self.files:
            self._submit_file(stem)
        if self.defer_combinations:
            return
        for suite, groups in self.cross_groups.items():
            for group in groups:
                counter = next(c for c in self.cross_counters[suite] if set(group.columns) <= set(c.columns))
                combos, counts = counter.result(group.columns)
                if len(counts):
                    self._submit(self.cross[suite], group, _derived_frame(group.columns, combos), counts)

    def _submit_columns(self, check: _FileCheck, single: dict[str, tuple[RuleGroup, Any, Any]],
                        parameters: Mapping[str, Any]) -> None:
        """Every one-column rule group of a file in one job: each column's distinct values,
        repeated to the longest list's length (see :class:`phsafe.validation._gx.Job`)."""
        length = max(len(classes) for _, classes, _ in single.values())
        columns = list(single)
        padded = [np.resize(single[c][1], length) for c in columns]
        frame = _file_frame(check.books, columns, padded)
        rule_ids = tuple(r for c in columns for r in single[c][0].rule_ids)
        group = RuleGroup(check.stem, check.stem, tuple(columns), rule_ids)
        params = {k: v for k, v in parameters.items() if v is not None}
        runnable = []
        for rule_id in rule_ids:
            missing = check.suite.rule(rule_id).parameters() - set(params)
            if missing:
                check.tally.skip(rule_id, f"no valid {', '.join(sorted(missing))} in the config")
            else:
                runnable.append(rule_id)
        if runnable:
            job = _gx.Job(group.suite, group.frame, tuple(runnable), frame, None, params,
                          column_weights={c: _narrow(single[c][2]) for c in columns})
            self._add_job(job, check.tally)

    # ------------------------------------------------------- pieces of a pass (on a cluster)
    # A pass cut into tasks (``phsafe.intake.cluster``): each block of a file and each MAFID range
    # is validated where it is read, by an observer of its own, and what that observer found
    # -- value-free tallies -- is merged where the report is made. Every rule's verdict is the
    # conjunction of its verdicts on the pieces and its counts are their sums, as when one
    # observer submits several frames of a rule (the suites have no ``mostly`` rule).
    def finish_block(self, stem: str) -> None:
        """A block of a file is read: submit its per-file frames (and its irregular MAFIDs)."""
        check = self.files[stem]
        if check.irregular_mafids and check.mafid_group is not None:
            extra, counts = distinct([np.concatenate(check.irregular_mafids)])
            check.irregular_mafids.clear()
            check.mafids.append((extra[0], counts))
            self._submit_mafids(check)
        self._submit_file(stem)

    def partition_end(self) -> None:
        """The pass's last partition was joined and counted by other observers (worker processes,
        whose pieces were absorbed): submit what this one still holds -- the irregular MAFIDs its
        batches found."""
        for check in self.files.values():
            if check.irregular_mafids and check.mafid_group is not None:
                extra, counts = distinct([np.concatenate(check.irregular_mafids)])
                check.irregular_mafids.clear()
                check.mafids.append((extra[0], counts))
            self._submit_mafids(check)
        self._submit_accumulated()

    def assume_files(self, seen: "Mapping[str, FileSeen]") -> None:
        """What the blocks saw of each file (a MAFID range's observer never reads a file whole):
        its header and columns, and whether every row could be read."""
        for stem, file_seen in seen.items():
            check = self.files[stem]
            check.header = list(file_seen.header) if file_seen.header is not None else None
            check.complete = file_seen.complete
            if check.groups is None:
                self._setup(check, list(file_seen.columns))

    def piece(self) -> "ValidationPiece":
        """Wait for this observer's evaluations; what it found (picklable): tallies, and -- when
        it defers them -- the distinct combinations it counted, with the values of the irregular
        classes they hold (confidential, like the data: they go only where the report is made)."""
        self._collect()
        combos = None
        if self.defer_combinations:
            combos = CombinationPiece(
                files={stem: [(counter.columns, *counter.result()) for counter in c.counters]
                       for stem, c in self.files.items() if c.counters},
                columns={stem: tuple(c.columns) for stem, c in self.files.items()},
                extras={stem: {name: list(book._values) for name, book in c.books.items() if book._values}  # noqa: SLF001
                        for stem, c in self.files.items()},
                cross={suite: (tuple(self._cross_columns[suite]),
                               [(counter.columns, *counter.result()) for counter in counters])
                       for suite, counters in self.cross_counters.items()},
            )
        return ValidationPiece(
            files={stem: c.tally for stem, c in self.files.items()},
            cross=dict(self.cross),
            seen=self.seen(),
            utf8_rows={stem: dict(c.utf8_rows) for stem, c in self.files.items()},
            skipped_cross=list(self._skipped_cross),
            combinations=combos,
        )

    def _absorb_combinations(self, combos: "CombinationPiece") -> None:
        """Add another observer's distinct combinations to this one's counters (its irregular
        values renumbered in this observer's class books)."""
        for stem, counters in combos.files.items():
            check = self.files[stem]
            if check.groups is None:
                present = set(combos.columns.get(stem, ()))
                self._setup(check, [c.name for c in FILES[stem] if c.name in present])
            for columns, values, counts in counters:
                if not len(counts):
                    continue
                values = [self._renumber(check.books[name], v, combos.extras.get(stem, {}).get(name))
                          for name, v in zip(columns, values)]
                mine = next((c for c in check.counters if c.columns == columns), None)
                if mine is not None:
                    mine.add([(v, 0) for v in values], counts)
                    continue
                # Another file layout (a folder whose header differs): its groups judged on their own.
                for group in check.groups or ():
                    if set(group.columns) <= set(columns):
                        sub, weights = distinct([values[columns.index(c)] for c in group.columns], counts)
                        self._submit(check.tally, group, _file_frame(check.books, group.columns, sub), weights,
                                     self._parameters(stem))
        for suite, (frame_columns, counters) in combos.cross.items():
            self._cross_setup(suite, list(frame_columns))
            for columns, values, counts in counters:
                if len(counts):
                    mine = next(c for c in self.cross_counters[suite] if c.columns == columns)
                    mine.add([(v, 0) for v in values], counts)

    @staticmethod
    def _renumber(book: ClassBook, classes: npt.NDArray[np.int64], extras: list[Any] | None) -> npt.NDArray[np.int64]:
        if not extras:
            return classes
        irregular = classes >= book.first_extra
        if not irregular.any():
            return classes
        table = book.extra(extras)
        out = classes.copy()
        out[irregular] = table[classes[irregular] - book.first_extra]
        return out

    def absorb(self, piece: "ValidationPiece", *, files_read: bool = False) -> None:
        """Add what another observer found (see :meth:`piece`); ``files_read``: it read files
        (a state's folders), so what it saw of them counts too (header, columns, complete)."""
        for stem, tally in piece.files.items():
            check = self.files[stem]
            check.tally.merge(tally)
            for column, n in piece.utf8_rows.get(stem, {}).items():
                check.utf8_rows[column] = check.utf8_rows.get(column, 0) + n
            seen = piece.seen.get(stem)
            if files_read and seen is not None:
                if check.header is None and seen.header is not None:
                    check.header = list(seen.header)
                check.columns |= set(seen.columns)
                check.complete = check.complete and seen.complete
        for name, tally in piece.cross.items():
            self.cross[name].merge(tally)
        if piece.combinations is not None:
            self._absorb_combinations(piece.combinations)
        for note in piece.skipped_cross:
            if note not in self._skipped_cross:
                self._skipped_cross.append(note)

    def seen(self) -> "dict[str, FileSeen]":
        """What this observer saw of each file (header, columns, every row read)."""
        return {stem: FileSeen(tuple(c.header) if c.header is not None else None, frozenset(c.columns), c.complete)
                for stem, c in self.files.items()}

    # --------------------------------------------------------------------------------- report
    def _collect(self) -> None:
        for job, future, tally in self._jobs:
            self._tally(job, future, tally)
        self._jobs.clear()
        self._pending_rows = 0

    def close(self) -> None:
        self.evaluator.close()

    def write_report(self, report: ValidationReport, directory: Path) -> None:
        """Write the report's files where Great Expectations runs (see :class:`._worker.ReportJob`)."""
        try:
            self.evaluator.submit(ReportJob(report, directory)).result()
        except Exception as exc:  # noqa: BLE001 -- e.g. the second process died: write here
            log.warning("validation worker failed; writing the report in this process", error_type=type(exc).__name__)
            write_report(report, directory)

    def report(self, result: Any, config_tally: Tally, load_failure: Failure | None, missing: list[Failure],
               states: tuple[str, ...] | None) -> ValidationReport:
        """Wait for every evaluation and assemble the report: the config, each file (its
        structural failures, then its rules), the cross-file rules, then the notes."""
        self._collect()
        report = ValidationReport(subject="inputs")
        report.failures.extend(missing)
        if load_failure is not None:
            report.failures.append(load_failure)
        report.failures.extend(config_tally.failures(self.file_names))
        tallies = [config_tally]
        structural = _structural(result, self.file_names)
        for stem in FILES:
            check = self.files[stem]
            report.failures.extend(structural.get(stem, []))
            report.failures.extend(Failure(self.file_names[stem], (column,), "the values are UTF-8 text", n)
                                   for column, n in check.utf8_rows.items())
            if stem in self.missing:
                continue
            report.failures.extend(_explain_header(f, stem, check.header) for f in check.tally.failures(self.file_names))
            tallies.append(check.tally)
        for name in CROSS_FILE_SUITES:
            report.failures.extend(self.cross[name].failures(self.file_names))
            tallies.append(self.cross[name])
        for tally in tallies:
            report.notes.extend(tally.notes())
            if tally.any_evaluated():
                report.results.append(tally.result_json())
        report.notes.extend(self._skipped_cross)
        report.set_aside = dict(result.set_aside)
        aside = result.set_aside
        if states is None:
            report.notes.append("the state filter was not applied (the config has no valid state_filter): "
                                "every record was checked")
        elif any(aside.values()):
            report.notes.append(
                f"state filter ({', '.join(states)}) applied first: {aside['geo']} geo rows outside it set aside, "
                f"with {aside['units']} units rows and {aside['persons']} persons rows of their MAFIDs; the "
                "rules were checked on the records the run keeps")
        if result.by_state:
            report.notes.append(
                f"the input is stored by state ({result.states_found} TABBLKST=<state> folders): records join "
                "only within a state's folders, as the counting reads them")
        return report


@dataclass(frozen=True)
class FileSeen:
    """What the blocks of a file saw: its header, the schema columns it has, whether every row
    could be read (and was UTF-8) -- the cross-file rules need the whole file."""

    header: tuple[str, ...] | None
    columns: frozenset[str]
    complete: bool

    @staticmethod
    def merge(pieces: "Sequence[FileSeen]") -> "FileSeen":
        header = next((p.header for p in pieces if p.header is not None), None)
        columns = frozenset().union(*(p.columns for p in pieces)) if pieces else frozenset()
        return FileSeen(header, columns, all(p.complete for p in pieces))


@dataclass
class CombinationPiece:
    """The distinct combinations one piece of a pass counted, to be evaluated with the others'.

    Attributes:
        files: Per file, each counter's columns, distinct combinations (classes) and row counts.
        columns: Per file, the schema columns it has.
        extras: Per file and column, the values of the irregular classes (their class is
            ``book.first_extra`` + their index).
        cross: Per cross-file suite, the frame's columns and each counter's combinations.
    """

    files: dict[str, list[tuple[tuple[str, ...], list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]]]
    columns: dict[str, tuple[str, ...]]
    extras: dict[str, dict[str, list[Any]]]
    cross: dict[str, tuple[tuple[str, ...], list[tuple[tuple[str, ...], list[npt.NDArray[np.int64]],
                                                        npt.NDArray[np.int64]]]]]


@dataclass
class ValidationPiece:
    """What validating one piece of a pass found: rule tallies and row counts, and the
    combinations it defers (:class:`CombinationPiece`)."""

    files: dict[str, Tally]
    cross: dict[str, Tally]
    seen: dict[str, FileSeen]
    utf8_rows: dict[str, dict[str, int]]
    skipped_cross: list[str]
    combinations: CombinationPiece | None = None


def report_of_pieces(config_path: "ConfigFile | Path", data_dir: Path, result: Any, pieces: Sequence[ValidationPiece], *,
                     report_dir: Path | None = None, files_read: bool = False) -> ValidationReport:
    """The validation report of a pass validated in pieces (on a cluster): the config's rules
    evaluated here, every piece's tallies merged, the report written to ``report_dir/inputs``.

    Args:
        result: The pass's merged :class:`phsafe.intake.PassResult` (reading problems, rows
            set aside).
        files_read: Each piece read whole files (a state's folders): what it saw of them counts.
    """
    setup = ValidationSetup.of(config_path, data_dir)
    observer = InputValidation(setup.file_names, evaluator(0), setup.state_list,
                               missing=set(FILES) - set(setup.sources))
    try:
        config_run = observer.config(setup.raw)
        for stem in STEMS:
            seen = FileSeen.merge([p.seen[stem] for p in pieces if stem in p.seen])
            observer.files[stem].header = list(seen.header) if seen.header is not None else None
            observer.files[stem].complete = seen.complete
        for piece in pieces:
            observer.absorb(piece, files_read=files_read)
        observer.partition_end()  # the combinations of every piece, once
        report = observer.report(result, config_run, setup.load_failure, setup.missing, setup.states)
        if report_dir is not None:
            observer.write_report(report, Path(report_dir))
    finally:
        observer.close()
    return report


def _plain(suite: Suite, group: RuleGroup) -> bool:
    """The group's rules can be judged on a list of values that repeats some (no ``mostly``)."""
    return all(suite.rule(r).config.get("kwargs", {}).get("mostly") is None for r in group.rule_ids)


def _signed(values: np.ndarray) -> np.ndarray:
    """Values that can hold ``INVALID`` (unsigned ones copied to a signed type)."""
    if values.dtype.kind == "u":
        return values.astype(np.int16 if values.dtype.itemsize == 1 else np.int64)
    return values


def _at(values: np.ndarray, rows: np.ndarray, missing: int | bool = INVALID) -> np.ndarray:
    """``values[rows]``, ``missing`` where ``rows`` is -1 (a signed type when it must hold -1)."""
    if missing == INVALID:
        values = _signed(values)
    if not len(values):
        return np.full(len(rows), missing, dtype=values.dtype)
    if len(rows) and int(rows.min()) >= -1:
        # ``missing`` appended: row -1 reads it (np.take, as Python indexing, counts from the end).
        return np.take(np.concatenate([values, np.array([missing], values.dtype)]), rows)
    out = values.take(rows, mode="clip")  # -1 reads the first value: replaced below
    absent = rows < 0
    if absent.any():
        out[absent] = missing
    return out


class _Padded:
    """A column read at rows of which some are -1 (none) -- :func:`_at`, with the column padded
    once: a frame built slice by slice reads the same column for every slice."""

    def __init__(self, values: np.ndarray, missing: int | bool = INVALID) -> None:
        if missing == INVALID:
            values = _signed(values)
        self.missing = missing
        self.empty = not len(values)
        self.padded = np.concatenate([values, np.array([missing], values.dtype)])  # row -1 reads it

    def at(self, rows: np.ndarray) -> np.ndarray:
        """``_at(values, rows, missing)``."""
        if self.empty:
            return np.full(len(rows), self.missing, dtype=self.padded.dtype)
        if len(rows) and int(rows.min()) < -1:
            return _at(self.padded[:-1], rows, self.missing)
        return np.take(self.padded, rows)


def _classes(column: Column) -> int:
    """How many classes a valid value of ``column`` can be (how combinations are grouped)."""
    if column.allowed is not None:
        return max(column.allowed) - min(column.allowed) + 1
    if column.minimum is not None:
        assert column.maximum is not None
        return column.maximum - column.minimum + 1
    assert column.width is not None
    return 10**column.width


_DERIVED_CLASSES = {"IN_UNITS": 2, "RTYPE": 7, "RELSHIP": 40, "QAGE": 117, "UNIT_RTYPE": 6, "UNIT_HHT": 9,
                    "UNIT_HHT2": 14, "GEO_RTYPE": 6}
"""Classes of the derived frames' columns (compact values and INVALID); counts have 256."""


def _structural(result: Any, file_names: Mapping[str, str]) -> dict[str, list[Failure]]:
    """Failures no suite can express: problems of reading, and the layout of data stored by state."""
    out: dict[str, list[Failure]] = {}
    for stem, problems in result.problems.items():
        merged: dict[tuple[str, tuple[str, ...], str], Failure] = {}
        for p in problems.found:
            key = (p.file, p.columns, p.rule)
            if key in merged and merged[key].failing_rows is not None and p.rows is not None:
                merged[key] = replace(merged[key], failing_rows=merged[key].failing_rows + p.rows)
            else:
                merged.setdefault(key, Failure(p.file, p.columns, p.rule, p.rows))
        # By file: the same report whatever order a pass's pieces were merged in (states
        # counted in worker processes are merged largest first).
        out[stem] = sorted(merged.values(), key=lambda f: f.file)
    if result.misplaced:
        out.setdefault("geo", []).append(Failure(file_names["geo"], ("TABBLKST",), _MISPLACED_RULE, result.misplaced))
    for stem, n in result.repeated.items():
        out.setdefault(stem, []).append(Failure(file_names[stem], ("MAFID",), _REPEATED_RULE.format(stem=stem), n,
                                                row_noun="MAFID"))
    return out


def _explain_header(failure: Failure, stem: str, header: list[str] | None) -> Failure:
    """Add which columns are missing, unexpected or out of order to a failed header rule."""
    if header is None or not (failure.rule_id or "").endswith(".header"):
        return failure
    expected = [c.name for c in FILES[stem]]
    detail = describe_header(header, expected)
    missing = tuple(n for n in expected if n not in header)
    return replace(failure, rule=f"{failure.rule}: {detail}" if detail else failure.rule,
                   columns=missing or failure.columns)


def _job_rows(job: _gx.Job) -> int:
    """Rows of a job's frame (what it holds in memory until it is answered)."""
    data = job.data
    if isinstance(data, list):
        return len(data[0].classes) if data else 0
    return len(data) if hasattr(data, "__len__") else 0
