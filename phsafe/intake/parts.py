"""The parts the input pass is made of: its partitions, the rows it keeps, what it found.

* :class:`PassPart` -- a partition of the pass (a state's folders, or the whole input, or a MAFID
  range of it): where its rows are, never the rows;
* :class:`FileRows` -- the kept rows of one file of a partition, as compact columns;
* :class:`Reading` -- what the pass holds of the partition it is reading (its rows, its join, its
  spill);
* :class:`PassResult` -- what a pass (or a piece of one) found;
* :class:`Layout` -- the check that a MAFID of units or geo is stored under one state's folders;
* :class:`PassObserver` -- what the pass tells the validation (:mod:`phsafe.validation`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from phsafe.errors import InputError
from phsafe.preprocess import AsideMafids, GeoSide, Join, Joiner, sorted_distinct
from phsafe.reader import INVALID, OK, PARTITION_KEY, ClassBook, Columns, Encoded, InputFile, MafidRange, Problems, SourceReader
from phsafe.schema import FILES, MAFID_MAX, MAFID_MIN, Column
from phsafe.config import ConfigFile
from phsafe.counting import Counting, Counts, combine_counts
from phsafe.intake.spill import BucketPlan
from phsafe.validation import FileSeen, ValidationPiece

STEMS = ("persons", "units", "geo")
READ_ORDER = ("geo", "units", "persons")
"""The order a partition's files are read in: geo says which MAFIDs the state filter sets aside."""
ENGINE_COLUMNS: dict[str, tuple[Column, ...]] = {stem: tuple(c for c in FILES[stem] if c.dtype is not None)
                                                 for stem in STEMS}
"""The columns the pass keeps of each file (the engine's and the cross-file rules')."""
COLUMN = {(stem, c.name): c for stem in STEMS for c in FILES[stem]}

StageTimer = Callable[[str], AbstractContextManager[None]]
"""Called with a stage name; times and logs the ``with`` block (see ``phsafe.engine``)."""


def no_timer(name: str) -> AbstractContextManager[None]:
    return nullcontext()


class StageTotals:
    """A stage timer adding up the time of each stage over many partitions."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def add(self, other: "StageTotals") -> None:
        for name, seconds in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds


@dataclass(frozen=True)
class PassPart:
    """A partition of a pass: a state's folders (data stored by state) or the whole input.

    Attributes:
        label: Public name for logs and messages (``"06"``, ``"all"``, ``"all [3/22]"``).
        state: The state of the folders, for data stored by state.
        files: The persons, units and geo inputs restricted to the partition's files.
        mafid_range: Only rows with ``lo <= MAFID < hi``.
    """

    label: str
    state: str | None
    files: Mapping[str, InputFile]
    mafid_range: MafidRange | None = None

    def rows(self) -> dict[str, int]:
        """Estimated rows of each file (the memory plan's input)."""
        return {stem: self.files[stem].estimated_rows() for stem in STEMS if stem in self.files}

    def bytes_of(self, stem: str) -> int:
        """Bytes of one input's files (progress)."""
        total = 0
        for path in self.files[stem].files:
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total


class FileRows:
    """The kept rows of one file of a partition: compact columns gathered batch by batch."""

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self.schema = ENGINE_COLUMNS[stem]
        self._values: dict[str, list[np.ndarray]] = {c.name: [] for c in self.schema}
        self._bad: dict[str, list[np.ndarray | None]] = {c.name: [] for c in self.schema}
        self.missing: set[str] = set()
        self.columns: Columns = {}
        self.bad: dict[str, np.ndarray] = {}
        self._compact: dict[str, np.ndarray] = {}

    def add(self, encoded: Mapping[str, Encoded], rows: int) -> None:
        for c in self.schema:
            e = encoded.get(c.name)
            if e is None:  # a column the file does not have: no valid value
                self.missing.add(c.name)
                self._values[c.name].append(np.zeros(rows, dtype=c.dtype))
                self._bad[c.name].append(np.ones(rows, dtype=bool))
                continue
            self._values[c.name].append(e.values)
            self._bad[c.name].append(None if e.kind is None else e.kind != OK)

    def finish(self) -> "FileRows":
        """Concatenate the batches (one column at a time: peak is data + one column)."""
        for c in self.schema:
            chunks = self._values.pop(c.name)
            self.columns[c.name] = np.concatenate(chunks) if chunks else np.empty(0, dtype=c.dtype)
            masks = self._bad.pop(c.name)
            if any(m is not None for m in masks):
                self.bad[c.name] = np.concatenate([np.zeros(len(v), bool) if m is None else m
                                                   for m, v in zip(masks, chunks)])
            del chunks
        return self

    @property
    def rows(self) -> int:
        return len(self.columns["MAFID"])

    def compact(self, name: str) -> np.ndarray:
        """The values of ``name``, ``INVALID`` where a row breaks a per-file rule: the values
        themselves when no row does, else a signed copy (computed once)."""
        if name not in self.bad:
            return self.columns[name]
        if name not in self._compact:
            values = self.columns[name]
            out = values.astype(np.int16 if values.dtype.itemsize == 1 else np.int32)
            out[self.bad[name]] = INVALID
            self._compact[name] = out
        return self._compact[name]

    def ok(self, name: str) -> np.ndarray | None:
        """Rows whose value of ``name`` is valid (None: every row)."""
        return None if name not in self.bad else ~self.bad[name]

    @property
    def clean(self) -> bool:
        """Every kept value is valid: the tables can be counted from these rows."""
        return not self.bad and not self.missing

    def release_compact(self) -> None:
        self._compact.clear()


@dataclass
class Spilled:
    """A partition being spilled: its folder and buckets, and the rows written to each."""

    folder: Path
    plan: BucketPlan
    rows: dict[str, np.ndarray] = field(default_factory=dict)


class AsideCollector:
    """Collects the valid MAFIDs of set-aside geo rows (a geo block read on a cluster)."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []

    def add_aside(self, mafids: np.ndarray) -> None:
        self.parts.append(np.asarray(mafids, dtype=np.int32))

    def distinct(self) -> np.ndarray:
        return sorted_distinct(np.concatenate(self.parts)) if self.parts else np.empty(0, np.int32)


@dataclass
class Reading:
    """What the pass holds of the partition it is reading: the kept rows of each file (or, for a
    spilled partition, the spill they go to), the join as it is built, and the stage times."""

    timer: StageTotals = field(default_factory=StageTotals)
    geo: FileRows | None = field(default_factory=lambda: FileRows("geo"))
    units: FileRows = field(default_factory=lambda: FileRows("units"))
    persons: FileRows = field(default_factory=lambda: FileRows("persons"))
    person_keys: list[np.ndarray] = field(default_factory=list)
    spilled: Spilled | None = None
    aside: AsideMafids | AsideCollector | None = None
    """The MAFIDs of set-aside geo rows (a spilled partition's geo, as it streams)."""
    joiner: Joiner | AsideMafids | None = None
    """What units and persons are looked up in as they stream: the partition's join in memory,
    or the set-aside MAFIDs of a spilled partition."""
    join: Join | None = None
    bytes_read: dict[str, int] = field(default_factory=dict)

    def rows(self, stem: str) -> FileRows:
        rows = self.geo if stem == "geo" else self.units if stem == "units" else self.persons
        assert rows is not None, "geo's rows were let go"
        return rows

    def all_rows(self) -> dict[str, FileRows]:
        return {stem: self.rows(stem) for stem in STEMS}


class PassObserver(Protocol):
    """What a pass tells the validation, and asks of it (see :mod:`phsafe.validation`)."""

    file_names: dict[str, str]
    state_filter: list[str] | None

    def book(self, stem: str, column: Column) -> ClassBook: ...

    def batch(self, stem: str, name: str, encoded: Mapping[str, Encoded], kept: np.ndarray | None) -> None: ...

    def file_read(self, stem: str, part: PassPart, reader: SourceReader, last: bool) -> None: ...

    def partition(self, part: PassPart, geo: GeoSide, join: Join, rows: Mapping[str, FileRows], last: bool) -> None: ...

    def finish_block(self, stem: str) -> None: ...

    def partition_end(self) -> None: ...

    def seen(self) -> Mapping[str, FileSeen]: ...

    def absorb(self, piece: ValidationPiece, *, files_read: bool = False) -> None: ...


@dataclass
class PassResult:
    """What a pass found.

    Attributes:
        counts: The exact counts (when counting, and nothing refused them).
        count_error: Why the counting refused the records (validation mode only; without
            validation the error is raised).
        problems: What reading found wrong, per file stem (validation mode).
        set_aside: Rows the state filter set aside, per file stem.
        misplaced: For data stored by state: geo rows stored under another state's folder.
        repeated: For data stored by state: MAFIDs of units or geo stored under two states'
            folders (stem -> count).
        by_state: The data is stored by state.
        states_found: Number of ``TABBLKST=<state>`` folders (data stored by state).
        digests: SHA-256 of each file read whole as it was read (path -> hex; CSV files).
    """

    counts: Counts | None = None
    count_error: InputError | None = None
    problems: dict[str, Problems] = field(default_factory=dict)
    set_aside: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STEMS, 0))
    misplaced: int = 0
    repeated: dict[str, int] = field(default_factory=dict)
    by_state: bool = False
    states_found: int = 0
    digests: dict[str, str] = field(default_factory=dict)

    def add_counts(self, counts: Counts) -> None:
        """Add a partition's counts (kept summed: one set of cubes in memory)."""
        self.counts = counts if self.counts is None else combine_counts([self.counts, counts])


class Layout:
    """The layout of data stored by state: a MAFID of units or geo stored under more than one
    state's folders is counted (one bit per possible MAFID and file: 200 MB).

    Args:
        names: Stem -> the file's name in messages.
        strict: Raise at the first MAFID of geo stored under two states (a pass without
            validation), and at :meth:`check` for units; else count them for the report.
    """

    def __init__(self, names: Mapping[str, str], *, strict: bool) -> None:
        self.names = dict(names)
        self.strict = strict
        self.seen = {stem: np.zeros(((MAFID_MAX - MAFID_MIN) >> 3) + 1, dtype=np.uint8) for stem in ("units", "geo")}
        self.repeated = {"units": 0, "geo": 0}

    def add(self, stem: str, state: str | None, mafids: np.ndarray) -> None:
        """Add one state's distinct valid MAFIDs of ``stem``.

        Raises:
            InputError: Strict, and another state's geo already had one of them.
        """
        again = self._add(stem, mafids)
        if again and self.strict and stem == "geo":
            raise InputError(f"{self.names[stem]}/{PARTITION_KEY}={state}", "MAFID",
                             "a MAFID has geo rows in more than one state partition", rows=again)

    def _add(self, stem: str, mafids: np.ndarray) -> int:
        if not len(mafids):
            return 0
        offset = mafids.astype(np.int64) - MAFID_MIN
        if len(offset) > 1 and not bool((offset[1:] > offset[:-1]).all()):
            offset.sort()
        byte = offset >> 3
        bit = np.left_shift(np.uint8(1), (offset & 7).astype(np.uint8))
        seen = self.seen[stem]
        again = int(np.count_nonzero(seen[byte] & bit))
        starts = np.flatnonzero(np.concatenate([[True], byte[1:] != byte[:-1]]))
        seen[byte[starts]] |= np.bitwise_or.reduceat(bit, starts)
        self.repeated[stem] += again
        return again

    def found(self) -> dict[str, int]:
        """MAFIDs stored under two states, per file (only files that have some).

        Raises:
            InputError: Strict, and a file has some.
        """
        found = {k: v for k, v in self.repeated.items() if v}
        if self.strict:
            for stem, n in found.items():
                raise InputError(self.names[stem], "MAFID", f"a MAFID has {stem} rows in more than one state partition",
                                 rows=n)
        return found


class LayoutCollector:
    """Stands for the layout check in a piece that reads one state's folders: keeps each file's
    MAFIDs for the process that checks the layout across the folders (:func:`phsafe.intake.merge`)."""

    def __init__(self) -> None:
        self.mafids: dict[str, list[np.ndarray]] = {"units": [], "geo": []}

    def add(self, stem: str, state: str | None, mafids: np.ndarray) -> None:
        self.mafids[stem].append(np.asarray(mafids, dtype=np.int32))


@dataclass(frozen=True)
class Block:
    """One task's share of one file: ``span`` bytes of a CSV file or row groups of a Parquet file."""

    stem: str
    index: int
    span: tuple[int, int]

    @property
    def label(self) -> str:
        return f"{self.stem}-{self.index + 1}"


@dataclass(frozen=True)
class ClusterPlan:
    """Everything a task needs: where the inputs and the spill folder are, the buckets, what to
    count (picklable; never data).

    Attributes:
        config: The run's one read of its config (None in a worker process of one machine's
            pass: its pieces need no config).
        data_dir: The inputs' folder.
        files: The located inputs.
        states: The released states (sorted), or None (validation of a config without a usable
            state filter).
        validate: The tasks validate.
        counting: What to count (None: validate only).
        file_names: Stem -> the name reports give the file.
        state_filter: The config's state filter as validation reads it (a parameter of geo's rules).
        buckets: MAFID ranges of a national input's spill.
        folder: The spill folder (national input).
        blocks: The blocks of a national input's files.
        parts: The state partitions of data stored by state.
        aside_parts: The state folders outside the state filter.
        states_found: How many state folders data stored by state has (None: not stored by state).
    """

    config: ConfigFile | None
    data_dir: Path
    files: Mapping[str, InputFile]
    states: tuple[str, ...] | None
    validate: bool
    counting: Counting | None
    file_names: Mapping[str, str] = field(default_factory=dict)
    state_filter: list[str] | None = None
    buckets: BucketPlan = BucketPlan(())
    folder: Path = Path()
    blocks: tuple[Block, ...] = ()
    parts: tuple[PassPart, ...] = ()
    aside_parts: tuple[PassPart, ...] = ()
    states_found: int | None = None

    @property
    def by_state(self) -> bool:
        return self.states_found is not None

    def blocks_of(self, stem: str) -> list[Block]:
        return [b for b in self.blocks if b.stem == stem]

    @property
    def aside_folder(self) -> Path:
        return self.folder / "aside"

    @classmethod
    def for_worker(cls, files: Mapping[str, InputFile], states: tuple[str, ...] | None, counting: Counting | None,
                   observer: PassObserver | None, *, spilled: Spilled | None = None) -> "ClusterPlan":
        """The plan of the pieces one machine's pass hands its worker processes."""
        return cls(None, Path(), dict(files), states, observer is not None, counting,
                   dict(observer.file_names) if observer is not None else {},
                   observer.state_filter if observer is not None else None,
                   buckets=spilled.plan if spilled is not None else BucketPlan(()),
                   folder=spilled.folder if spilled is not None else Path())
