"""Exact counting -- and input validation -- in one pass over the input files.

This is the one entry point the engine and the Prefect flows use to turn ``DATA`` into
:class:`~phsafe.tabulate.TableCounts`: read, check, filter by state, join on MAFID, truncate,
count. Nothing here draws noise or touches the ledger; the results are exact and confidential, so
they never leave the process except as sums handed to :mod:`phsafe.noise`.

:func:`phsafe.intake.validated_counts` is what a private run calls: it validates the config and
the inputs against the suites of ``expectations/`` *and* counts the tables in the same pass (this
module's :class:`InputPass`, observed by :mod:`phsafe.validation`) -- each input file is read
once -- and returns the counts only when every rule holds. :func:`exact_counts` counts without
validation (the checks the counting itself needs still stop a bad input).

The pass (:class:`InputPass`) works one *partition* at a time:

* **data stored by state** (``persons/TABBLKST=06/...`` for all three files, see
  :mod:`phsafe.reader`): one partition per state of ``state_filter``; memory is bounded by the
  largest state, not the nation. Folders of other states are set aside: their persons are never
  read, and only the MAFIDs of their units and geo rows (and geo's TABBLKST) are, for the layout
  check across folders -- a geo row stored under another state's folder, a MAFID of units or geo
  stored under two states. Every person and unit must have its geo row in its own partition.
* **any other input** (one CSV or Parquet file, or a folder not stored by state): one partition,
  the whole input, read into compact columns (about 23 bytes a person) and tabulated in MAFID
  ranges of 2M persons (:func:`phsafe.tabulate.tabulate`).

Memory is planned against a limit (:mod:`phsafe.memory`): a partition too large for it -- a
national file of the whole US -- is *spilled*: streamed once, checked and validated batch by
batch, its compact records written to MAFID ranges in the run's confidential work folder
(:mod:`phsafe.spill`), then the ranges joined, validated and counted, two at a time in worker
processes (:mod:`phsafe.distributed`). States of data stored by state are counted in the same
two worker processes, a state started only while the states in flight fit the limit.

Within a partition, geo, then units, then persons are read batch by batch while a background
thread reads ahead; each batch is checked column by column on its raw bytes
(:func:`phsafe.reader.encode`), filtered -- geo rows outside ``state_filter`` and the units and
persons of their MAFIDs are set aside first (spec §1) -- and kept as compact columns; at the end of
the partition its records are joined on MAFID once (:mod:`phsafe.preprocess`), handed to the
validation and counted. The next partition is read while this one is counted.

For a cluster the counting can also be cut into partitions counted independently, in any order,
on any process, and added up (the Dask path of ``flows/counting.py``):

* :func:`plan_partitions` -- small, picklable descriptions (file paths, a state, a MAFID
  range; never data);
* :func:`count_partition` -- reads only its partition's rows and returns their exact count
  cubes (states x iteration codes x cells: a few kilobytes) with the content digest of the
  records it tabulated (:mod:`phsafe.fingerprint`), as :class:`Counts`;
* :func:`combine_counts` -- adds the cubes and the digests (exact integers and sums modulo 2^64:
  the order does not matter).

Why partitions add up to the unpartitioned counts: every rule of the count is decided per MAFID
-- a MAFID's state (its geo row), whether its unit is unique in a table's universe, and which of
its persons truncation keeps (a keyed hash of each record, :mod:`phsafe.truncation`) -- so any
split that keeps each MAFID's records together gives the same exact counts: states (the layout
checks make sure a MAFID's records are in one state's folders), or MAFID ranges of the domain
(``max_persons``: each range reads the whole input and keeps its range -- less memory per
partition, and parallel on a cluster, for more reading).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from phsafe.config import PHSafeConfig
from phsafe.errors import InputError
from phsafe.fingerprint import ContentDigest, content_digest
from phsafe.invariants import check_structure
from phsafe.logs import get_logger
from phsafe import memory
from phsafe.memory import (
    BYTES_PER_ROW,
    MemoryPlan,
    check_memory,
    default_memory_limit,
    needed_limit,
    parallel_budget,
    part_bytes,
    plan_part,
    worker_processes,
)
from phsafe.progress import BYTES
from phsafe.preprocess import (
    MAX_PERSONS_PER_PARTITION,
    NOT_TABULATED,
    AsideMafids,
    GeoSide,
    Join,
    Joiner,
    geo_side,
    prepared,
    sorted_distinct,
    state_indices,
)
from phsafe.reader import (
    INVALID,
    OK,
    PARTITION_KEY,
    ClassBook,
    Columns,
    Encoded,
    FileBatch,
    InputFile,
    MafidRange,
    Problems,
    SourceReader,
    encode,
    locate_inputs,
    prefetched,
    raise_value_problems,
)
from phsafe.schema import FILES, MAFID_MAX, MAFID_MIN, Column
from phsafe.spill import BucketPlan, SpillArea, SpillWriter, plan_buckets, read_bucket, remove_partition
from phsafe.tables import TableSpec
from phsafe.tabulate import TableCounts, tabulate

if TYPE_CHECKING:
    from phsafe.progress import Progress, Task

log = get_logger("phsafe.counting")

StageTimer = Callable[[str], AbstractContextManager[None]]
"""Called with a stage name; times and logs the ``with`` block (see ``phsafe.engine``)."""

STEMS = ("persons", "units", "geo")


class Counts(Mapping[str, TableCounts]):
    """Exact count cubes by table name, with the content digest of the records counted.

    A mapping table name -> :class:`~phsafe.tabulate.TableCounts`; ``content`` identifies the
    tabulated records (see :mod:`phsafe.fingerprint`). Both are confidential.
    """

    __slots__ = ("_tables", "content", "input_digests")

    def __init__(self, tables: Mapping[str, TableCounts], content: ContentDigest) -> None:
        self._tables = dict(tables)
        self.content = content
        self.input_digests: dict[str, str] | None = None
        """The SHA-256 of each input (:func:`phsafe.reader.input_digests`' form), computed on the
        very bytes the counts were read from -- when the pass read every input whole (CSV files);
        None otherwise (the caller hashes the files)."""

    def __getitem__(self, table: str) -> TableCounts:
        return self._tables[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def __repr__(self) -> str:
        return f"Counts(tables={sorted(self._tables)})"


def _no_timer(name: str) -> AbstractContextManager[None]:
    return nullcontext()


@dataclass(frozen=True)
class CountingPartition:
    """One independently countable piece of the input: where its rows are, never the rows.

    Attributes:
        label: Public name for logs: ``"06"``, ``"06 [2/5]"``, ``"all"``, ``"all [1/4]"``.
        state: The state of a state partition (its ``TABBLKST=`` folder), or None.
        inputs: The persons, units and geo inputs, restricted to the partition's files.
        mafid_range: Only rows with ``lo <= MAFID < hi`` belong to the partition (None: all).
    """

    label: str
    state: str | None
    inputs: tuple[InputFile, InputFile, InputFile]
    mafid_range: MafidRange | None = None

    @property
    def files(self) -> dict[str, InputFile]:
        return dict(zip(STEMS, self.inputs))


def _ranges(lo: int, hi: int, k: int) -> list[MafidRange]:
    """``[lo, hi)`` cut into ``k`` consecutive ranges of (nearly) equal width."""
    bounds = np.unique(np.linspace(lo, hi, k + 1).round().astype(np.int64))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def _cut_points(mafids: np.ndarray, k: int) -> list[MafidRange]:
    """``k`` MAFID ranges holding about as many of ``mafids`` each, covering the whole domain."""
    if k <= 1 or len(mafids) == 0:
        return [(MAFID_MIN, MAFID_MAX + 1)]
    q = np.quantile(mafids, np.arange(1, k) / k, method="inverted_cdf").astype(np.int64) + 1
    bounds = np.unique(np.concatenate([[MAFID_MIN], q, [MAFID_MAX + 1]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def _split(base: CountingPartition, ranges: list[MafidRange]) -> list[CountingPartition]:
    if len(ranges) == 1:
        return [base]
    return [CountingPartition(f"{base.label} [{i}/{len(ranges)}]", base.state, base.inputs, r)
            for i, r in enumerate(ranges, start=1)]


def _geo_layout(geo: InputFile, by_state: dict[str | None, tuple[Path, ...]],
                slice_states: set[str]) -> dict[str, np.ndarray]:
    """Check the state layout of geo; return the geo MAFIDs of ``slice_states``.

    Every geo row must be in the folder of its own ``TABBLKST``, and no MAFID may have geo rows
    in two state folders (the unpartitioned reading drops a MAFID listed twice; two partitions
    could not see each other's rows). Reads only the MAFID and TABBLKST columns of every geo
    file, TABBLKST dictionary-encoded; the check keeps one bit per possible MAFID (100 MB).

    Raises:
        InputError: A geo row is stored under another state's folder, or a MAFID has geo rows
            in two state folders.
    """
    seen = np.zeros((MAFID_MAX >> 3) + 1, dtype=np.uint8)
    kept: dict[str, np.ndarray] = {}
    for state, paths in sorted(by_state.items(), key=lambda kv: str(kv[0])):
        assert state is not None
        chunks: list[np.ndarray] = []
        for path in paths:
            name = geo.file_name(path)
            try:
                pf = pq.ParquetFile(path, read_dictionary=["TABBLKST"])
                batches = pf.iter_batches(batch_size=4_000_000, columns=["MAFID", "TABBLKST"])
                for batch in batches:
                    st = batch.column(1)
                    codes = st.dictionary.to_pylist() if pa.types.is_dictionary(st.type) else None
                    if codes is not None:
                        # (bincount, not np.unique: numpy 2's hash-based unique is slow here)
                        used = np.flatnonzero(np.bincount(st.indices.fill_null(0).to_numpy(zero_copy_only=False),
                                                          minlength=len(codes)))
                        wrong = any(codes[i] != state for i in used.tolist()) or st.null_count
                    else:
                        wrong = not st.equals(pa.array([state] * len(st), st.type))
                    if wrong:
                        raise InputError(name, "TABBLKST", "every geo row is stored in the partition "
                                         "folder of its own state (TABBLKST=<its TABBLKST>)")
                    chunks.append(np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.int64))
            except InputError:
                raise
            except Exception:  # noqa: BLE001 -- unreadable or mistyped: the partition's reading says how
                continue
        m = np.concatenate(chunks) if chunks else np.empty(0, np.int64)
        m = m[(m >= MAFID_MIN) & (m <= MAFID_MAX)]  # out of range: the reader reports it
        byte, bit = m >> 3, (np.uint8(1) << (m & 7).astype(np.uint8))
        if (seen[byte] & bit).any():
            raise InputError(f"{geo.name}/{PARTITION_KEY}={state}", "MAFID",
                             "a MAFID has geo rows in more than one state partition")
        np.bitwise_or.at(seen, byte, bit)
        if state in slice_states:
            kept[state] = m.astype(np.int32)
    return kept


def plan_partitions(
    config: PHSafeConfig,
    data_dir: Path,
    *,
    max_persons: int | None = None,
    check_layout: bool = True,
) -> list[CountingPartition]:
    """Cut the counting of ``data_dir`` into independent partitions (see the module docstring).

    Cheap: reads file listings and Parquet metadata, and for data stored by state the MAFID and
    TABBLKST columns of geo (the layout check). The result is small and picklable, and never
    empty: with no rows to read there is one partition that counts zeros.

    Args:
        config: The run's config (its ``state_filter`` selects the state partitions).
        data_dir: Folder with the persons, units and geo inputs.
        max_persons: Cut partitions of more persons than this into MAFID ranges (None: whole
            states, or the whole input for data not stored by state).
        check_layout: Check the layout of data stored by state (recommended; skipping it is
            for callers that checked it already).

    Raises:
        InputError: An input is missing, ambiguous or malformed, or data stored by state is not
            stored by state.
    """
    files = locate_inputs(data_dir)
    inputs = tuple(files[s] for s in STEMS)
    if not all(f.partitioned for f in inputs):
        whole = CountingPartition("all", None, inputs)  # type: ignore[arg-type]
        n = files["persons"].estimated_rows()
        if max_persons is None or n <= max_persons:
            return [whole]
        return _split(whole, _ranges(MAFID_MIN, MAFID_MAX + 1, -(-n // max_persons)))

    by_stem = {f.stem: f.partitions() for f in inputs}
    released = set(config.states)
    present = sorted({k for parts in by_stem.values() for k in parts if k in released})  # type: ignore[misc]
    base = {state: CountingPartition(state, state, tuple(  # type: ignore[arg-type]
        f.subset(by_stem[f.stem].get(state, ())) for f in inputs)) for state in present}
    big: dict[str, int] = {}
    if max_persons is not None:
        for state, part in base.items():
            n = part.files["persons"].estimated_rows()
            if n > max_persons:
                big[state] = -(-n // max_persons)
    geo_mafids: dict[str, np.ndarray] = {}
    if check_layout:
        geo_mafids = _geo_layout(files["geo"], by_stem["geo"], set(big))  # type: ignore[arg-type]
    out: list[CountingPartition] = []
    for state in present:
        if state in big:
            if state in geo_mafids:
                ranges = _cut_points(geo_mafids.pop(state), big[state])
            else:
                ranges = _ranges(MAFID_MIN, MAFID_MAX + 1, big[state])
            out.extend(_split(base[state], ranges))
        else:
            out.append(base[state])
    if not out:  # no released state holds data: one partition that reads nothing counts zeros
        out.append(CountingPartition("empty", None, tuple(f.subset(()) for f in inputs)))  # type: ignore[arg-type]
    return out




def count_partition(
    partition: CountingPartition,
    config: PHSafeConfig,
    specs: Sequence[TableSpec],
    *,
    key: bytes | None,
    stage: StageTimer = _no_timer,
) -> Counts:
    """Exact count cubes of ``specs`` on one partition's rows, and their records' content digest.

    Memory is bounded by the partition: its compact columns (about 23 bytes a person with
    its units and geo rows) and the temporaries of 2M persons at a time.

    Args:
        partition: From :func:`plan_partitions`.
        config: The run's config (state filter and the truncation thresholds τ).
        specs: Tables to count.
        key: Truncation key; ``None`` counts without truncation (the non-private ground truth).
        stage: Stage timer for progress and logs.

    Returns:
        Table name -> exact counts over every released state (zeros outside the partition), with
        the content digest of the partition's tabulated records.

    Raises:
        InputError: An input is unreadable, has inconsistent codes, or is not stored by state
            as its layout says (nothing is spent).
    """
    part = PassPart(partition.label, partition.state, partition.files, partition.mafid_range)
    result = InputPass(partition.files, config.states, counting=Counting.of(config, specs, key),
                       parts=[part], stage=stage).run()
    assert result.counts is not None
    return result.counts


def combine_counts(results: Iterable[Mapping[str, TableCounts]]) -> Counts:
    """The sum of partitions' count cubes and content digests (exact integer sums: any order
    gives the same).

    Raises:
        ValueError: No results, or results of different tables or shapes.
    """
    total: dict[str, TableCounts] | None = None
    content = ContentDigest()
    for result in results:
        content = content + getattr(result, "content", ContentDigest())
        if total is None:
            total = {name: TableCounts(c.spec, {lvl: a.copy() for lvl, a in c.by_level.items()})
                     for name, c in result.items()}
            continue
        if set(result) != set(total):
            raise ValueError("partition results count different tables")
        for name, counts in result.items():
            mine = total[name]
            if set(counts.by_level) != set(mine.by_level) or any(
                    counts.by_level[lvl].shape != mine.by_level[lvl].shape for lvl in mine.by_level):
                raise ValueError(f"partition results of {name} have different shapes")
            mine.add(counts)
    if total is None:
        raise ValueError("no partition results to combine")
    return Counts(total, content)


class _StageTotals:
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


def exact_counts(
    config: PHSafeConfig,
    data_dir: Path,
    specs: Sequence[TableSpec],
    *,
    key: bytes | None,
    stage: StageTimer = _no_timer,
    progress: "Progress | None" = None,
    memory_limit: int | None = None,
    spill_dir: Path | None = None,
) -> Counts:
    """Exact count cubes of ``specs`` over the states of ``config``, and their content digest.

    One :class:`InputPass` without validation: each input file is read once, a partition (a
    state, for data stored by state; else the whole input) at a time, the next partition read
    while this one is counted. Peak memory is that of the largest partition.

    Args:
        config: The run's config (state filter and the truncation thresholds τ).
        data_dir: Folder with the persons, units and geo inputs.
        specs: Tables to count.
        key: Truncation key; ``None`` counts without truncation (the non-private ground truth).
        stage: Stage timer for progress and logs.
        progress: Shows a bar of the input files read (see :class:`InputPass`).
        memory_limit, spill_dir: The pass's memory budget and where it spills (see :class:`InputPass`).

    Raises:
        InputError: An input is unreadable or has inconsistent codes (nothing is spent).
        PHSafeError: The inputs cannot be processed within ``memory_limit``, or spill files
            cannot be written.
    """
    files = locate_inputs(data_dir)
    result = InputPass(files, config.states, counting=Counting.of(config, specs, key), stage=stage,
                       progress=progress, memory_limit=memory_limit, spill_dir=spill_dir).run()
    assert result.counts is not None
    return result.counts


def check_pass_memory(data_dir: Path, states: tuple[str, ...] | None, *, memory_limit: int | None = None,
                      validate: bool = True, spill_dir: Path | None = None) -> MemoryPlan | None:
    """Check, before anything is read, that the input pass can run within ``memory_limit`` and,
    if it must spill, that the spill fits on ``spill_dir``'s file system (a run's preflight).

    Cheap: file listings, Parquet metadata, a few line lengths of each CSV file.

    Returns:
        The pass's memory plan (None when the inputs cannot even be located: the pass itself
        reports that, as it reports every input problem).

    Raises:
        PHSafeError: One line that says what to do: the limit it needs, or the space the spill
            needs. Nothing is read, nothing spent.
    """
    try:
        files = locate_inputs(data_dir)
    except InputError:
        return None
    pass_ = InputPass(files, states, observer=_NoObserver() if validate else None, memory_limit=memory_limit)
    check_memory(pass_.memory, pass_.needed_limit(), spill_dir)
    return pass_.memory


class _NoObserver:
    """Stands for the validation when a pass is only planned (never run)."""


@dataclass(frozen=True)
class Counting:
    """What to count in a pass: the tables, the truncation thresholds (None: no truncation) and
    the truncation key."""

    specs: tuple[TableSpec, ...]
    taus: dict[str, int] | None
    key: bytes | None

    @classmethod
    def of(cls, config: PHSafeConfig, specs: Sequence[TableSpec], key: bytes | None) -> "Counting":
        return cls(tuple(specs), dict(config.tau) if key is not None else None, key)


@dataclass(frozen=True)
class PassPart:
    """A partition of a pass: a state's folders (data stored by state) or the whole input.

    Attributes:
        label: Public name for logs and messages (``"06"``, ``"all"``).
        state: The state of the folders, for data stored by state.
        files: The persons, units and geo inputs restricted to the partition's files.
        mafid_range: Only rows with ``lo <= MAFID < hi`` (a cluster's slice of one input).
    """

    label: str
    state: str | None
    files: dict[str, InputFile]
    mafid_range: MafidRange | None = None


_ENGINE_COLUMNS = {stem: tuple(c for c in FILES[stem] if c.dtype is not None) for stem in STEMS}


class FileRows:
    """The kept rows of one file of a partition: compact columns gathered batch by batch."""

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self.schema = _ENGINE_COLUMNS[stem]
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


class PassObserver(Protocol):
    """What a pass tells the validation (see :mod:`phsafe.validation._inputs`)."""

    def book(self, stem: str, column: Column) -> ClassBook: ...

    def batch(self, stem: str, name: str, encoded: Mapping[str, Encoded], kept: np.ndarray | None) -> None: ...

    def file_read(self, stem: str, part: PassPart, reader: SourceReader, last: bool) -> None: ...

    def partition(self, part: PassPart, geo: GeoSide, join: Join, rows: Mapping[str, FileRows], last: bool) -> None: ...


@dataclass
class PassResult:
    """What a pass found.

    Attributes:
        counts: The exact counts (when counting, and nothing refused them).
        count_error: Why the counting refused the records (validation mode only; without
            validation the error is raised).
        problems: What reading found wrong, per file stem (validation mode).
        set_aside: Rows the state filter set aside, per file stem.
        layout: For data stored by state: rows of geo stored under another state's folder, and
            MAFIDs of units or geo stored under two states' folders (stem -> count).
        by_state: The data is stored by state (and how many state folders it has).
        states_found: Number of ``TABBLKST=<state>`` folders (data stored by state).
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
    """SHA-256 of each file read whole as it was read (path -> hex; CSV files)."""


class _Layout:
    """MAFIDs of units and geo stored under more than one state's folders (one bit per possible
    MAFID and file: 200 MB)."""

    def __init__(self) -> None:
        self.seen = {stem: np.zeros(((MAFID_MAX - MAFID_MIN) >> 3) + 1, dtype=np.uint8) for stem in ("units", "geo")}
        self.repeated = {"units": 0, "geo": 0}

    def add(self, stem: str, mafids: np.ndarray) -> int:
        """Add one state's distinct valid MAFIDs; return how many another state already had."""
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


class InputPass:
    """One pass over the inputs: read each file once, check, filter, join; validate and count.

    Partitions are processed one at a time -- a state's folders for data stored by state, else
    the whole input -- and within a partition geo, then units, then persons, batch by batch,
    while a background thread reads ahead (reading releases the GIL). Each batch is checked
    column by column (:func:`phsafe.reader.encode`), filtered (the state filter comes first:
    spec §1) and kept as compact columns; at the end of a partition its records are joined on
    MAFID (:mod:`phsafe.preprocess`), handed to the validation (``observer``) and counted.

    Without an observer the pass is strict: the first problem raises an InputError (what the
    counting needs: formats and code lists of the columns it reads, the layout of data stored
    by state). With one, problems are reported to it and nothing raises on bad input.

    Args:
        files: The located inputs.
        states: The released states (sorted), or None for no state filter (validation of a
            config without a usable ``state_filter``).
        observer: The validation, if any.
        counting: What to count (None: nothing).
        parts: The partitions (default: one per released state for data stored by state,
            else one).
        stage: Stage timer.
        reads: Called with each file's path when its data is read (tests count reads).
        progress: Shows a bar ``input files`` that advances as each file of each partition has
            been read (a count of files, never of records: record counts are confidential).
        memory_limit: The memory the pass may use (bytes; default
            :func:`phsafe.memory.default_memory_limit`): a partition too large for it is spilled
            (see below).
        spill_dir: Where spill files go (a run's ``<work folder>/spill``; emptied first, removed
            at the end); None: a private folder in the system's temporary folder.

    A partition whose records do not fit in ``memory_limit`` (:func:`phsafe.memory.plan_part`)
    is *spilled*: its files are streamed once -- each batch checked, validated and filtered as
    above -- and its compact rows routed by MAFID range to bucket files (:mod:`phsafe.spill`);
    the buckets are then joined, validated and counted one at a time, exactly as partitions of
    their own (every rule is decided per MAFID). The units and persons of MAFIDs whose every geo
    row the state filter sets aside are set aside as they stream
    (:class:`~phsafe.preprocess.AsideMafids`), so that validation sees exactly the rows it sees
    when the partition is held in memory.
    """

    def __init__(self, files: Mapping[str, InputFile], states: tuple[str, ...] | None, *,
                 observer: PassObserver | None = None, counting: Counting | None = None,
                 parts: list[PassPart] | None = None, stage: StageTimer = _no_timer,
                 reads: Callable[[Path], None] | None = None, progress: "Progress | None" = None,
                 memory_limit: int | None = None, spill_dir: Path | None = None) -> None:
        self.files = dict(files)
        self.states = states
        self.observer = observer
        self.counting = counting
        self.stage = stage
        self.reads = reads
        self.progress = progress
        self.result = PassResult()
        self.problems = {stem: Problems(strict=observer is None) for stem in STEMS}
        self.result.problems = self.problems
        self._state_index = state_indices(states or ())
        self._counts: list[Counts] = []
        self._layout: _Layout | None = None
        self._aside_folders: list[PassPart] = []
        self.parts = parts if parts is not None else self._plan()
        self.memory_limit = memory_limit if memory_limit is not None else default_memory_limit()
        self.spill_dir = spill_dir
        self.memory = plan_pass(self.parts, self.memory_limit, validate=observer is not None,
                                by_state=self.result.by_state)
        self._spill: SpillArea | None = None
        self._bytes_read: dict[str, Task] = {}
        self._buckets_done: Task | None = None
        self._workers = None

    # ------------------------------------------------------------------------------------ plan
    def _plan(self) -> list[PassPart]:
        inputs = [self.files[s] for s in STEMS if s in self.files]
        if len(inputs) < len(STEMS) or not all(f.partitioned for f in inputs):
            return [PassPart("all", None, self.files)]
        self.result.by_state = True
        by_stem = {f.stem: f.partitions() for f in inputs}
        found = sorted({k for parts in by_stem.values() for k in parts if k is not None})
        self.result.states_found = len(found)
        released = set(self.states) if self.states is not None else set(found)

        def part(state: str) -> PassPart:
            return PassPart(state, state, {f.stem: f.subset(by_stem[f.stem].get(state, ())) for f in inputs})

        self._layout = _Layout()
        self._aside_folders = [part(s) for s in found if s not in released]
        parts = [part(s) for s in found if s in released]
        return parts or [PassPart("empty", None, {f.stem: f.subset(()) for f in inputs})]

    def needed_limit(self) -> int:
        """The smallest memory limit the pass can run within."""
        return max(needed_limit({stem: p.files[stem].estimated_rows() for stem in STEMS if stem in p.files},
                                validate=self.observer is not None, by_state=self.result.by_state)
                   for p in self.parts)

    # ------------------------------------------------------------------------------------- run
    def run(self) -> PassResult:
        """Read, check, join, validate and count every partition (see the class docstring)."""
        from phsafe.progress import NULL

        if self.memory is None:
            check_memory(None, self.needed_limit(), None)
        totals = _StageTotals()
        self._spill = SpillArea(self.spill_dir) if self.spill_dir is not None or self.memory.spills else None
        progress = self.progress or NULL
        state_budget = None
        if self.result.by_state and not self.memory.spills and self._layout is not None:
            # Data stored by state: states counted two at a time in worker processes, as many as
            # the memory limit holds at once.
            state_budget = parallel_budget([self._rows(p) for p in self.parts], self.memory_limit,
                                           validate=self.observer is not None)
        if state_budget is not None or (self.memory.workers > 1 and any(
                self.memory.parts[part.label].spilled and part.state is None for part in self.parts)):
            from phsafe.workers import WorkerProcesses

            self._workers = WorkerProcesses(worker_processes(), validation=self.observer is not None)
        try:
            with self.stage("read, check, join and count" if self.counting is not None else "read, check and join"), \
                    progress.task("input files", total=len(self.parts) * len(STEMS), unit="files") as files_read, \
                    contextlib.ExitStack() as bars:
                self._bytes_read = {stem: bars.enter_context(progress.task(
                    self.files[stem].name, total=sum(_size(p.files[stem]) for p in self.parts), unit=BYTES))
                    for stem in ("geo", "units", "persons") if stem in self.files}
                if self.memory.spills:
                    self._buckets_done = bars.enter_context(progress.task(
                        "MAFID ranges", total=sum(p.buckets for p in self.memory.parts.values() if p.spilled),
                        unit="ranges"))
                if state_budget is not None:
                    self._states_in_workers(files_read, totals, state_budget)
                for number, (part, files, last) in enumerate(
                        self._partitions(files_read, totals) if state_budget is None else (), start=1):
                    started = time.perf_counter()
                    self._finish_partition(part, files, last, totals)
                    log.debug("partition done", partition=part.label, number=number,
                              seconds=round(time.perf_counter() - started, 3))
                for part in self._aside_folders:
                    with totals("layout of folders outside the state filter"):
                        self._aside_folder(part)
        finally:
            if self._workers is not None:
                self._workers.close()
            if self._spill is not None:
                self._spill.close()
        log.info("partition stages", **{k.replace(", ", "_").replace(" ", "_"): round(v, 3)
                                        for k, v in totals.seconds.items()})
        if self._layout is not None:
            self.result.repeated = {k: v for k, v in self._layout.repeated.items() if v}
            if self.observer is None:
                for stem, n in self.result.repeated.items():
                    raise InputError(self.files[stem].name, "MAFID",
                                     f"a MAFID has {stem} rows in more than one state partition", rows=n)
        if self.counting is not None and self.result.count_error is None and self.result.counts is None:
            self.result.counts = self._zero_counts() if not self._counts else combine_counts(self._counts)
        if self.result.counts is not None and self.parts and self.parts[0].state is None and all(
                not f.directory and str(f.path) in self.result.digests for f in self.files.values()):
            self.result.counts.input_digests = {f.name: self.result.digests[str(f.path)] for f in self.files.values()}
        return self.result

    def _zero_counts(self) -> Counts:
        assert self.counting is not None
        n = len(self.states or ())
        return Counts({s.name: TableCounts(s, {lv: np.zeros((n, len(lv.codes), len(s.basis)), np.int64)
                                                for lv in s.iteration_levels}) for s in self.counting.specs},
                      ContentDigest())

    def _partitions(self, files_read: "Task", totals: _StageTotals
                    ) -> Iterator[tuple[PassPart, dict[str, object], bool]]:
        """Each partition (or bucket of a spilled partition) with its kept rows, and whether it
        is the last; read ahead on a background thread. ``files_read`` advances as each file (of
        each partition) has been read."""
        state: dict[str, object] = {}
        writers: dict[str, SpillWriter] = {}
        try:
            for event in prefetched(self._events(), depth=4):
                kind, part, stem, payload = event
                plan = self.memory.parts[part.label]
                if kind == "start":
                    if stem == "geo":
                        state = {"geo": FileRows("geo"), "units": FileRows("units"), "persons": FileRows("persons"),
                                 "person_keys": [], "timer": _Timer()}
                        if plan.spilled:
                            state["spilled"] = self._start_spill(part, plan.buckets)
                    spilled = state.get("spilled")
                    if isinstance(spilled, Spilled):
                        writers[stem] = SpillWriter(spilled.folder, stem, spilled.plan)
                    continue
                timer = state["timer"]
                assert isinstance(timer, _Timer)
                spilled = state.get("spilled")
                sink = writers[stem] if isinstance(spilled, Spilled) else state[stem]
                bar = self._bytes_read.get(stem)
                if kind == "batch":
                    with timer("read and check"):
                        self._batch(part, stem, payload, sink, state)  # type: ignore[arg-type]
                    state[f"{stem} bytes"] = state.get(f"{stem} bytes", 0) + payload.nbytes  # type: ignore
                    if bar is not None:
                        bar.advance(payload.nbytes, item=part.label if part.state is not None else "")  # type: ignore
                    continue
                # the file's end
                if bar is not None:  # what the batches did not account for (e.g. an unreadable file)
                    bar.advance(max(0, _size(part.files[stem]) - state.get(f"{stem} bytes", 0)))  # type: ignore
                files_read.advance(item=self.files[stem].name if part.state is None else f"{stem}, state {part.label}")
                self.result.digests.update(payload.digests)  # type: ignore[attr-defined]
                if self.observer is not None:
                    self.observer.file_read(stem, part, payload, part is self.parts[-1])  # type: ignore[arg-type]
                last_part = part is self.parts[-1]
                if isinstance(spilled, Spilled):
                    with timer("spill"):
                        writer = writers.pop(stem)
                        writer.close()
                        spilled.rows[stem] = writer.rows
                    if stem == "geo":
                        with timer("state filter of the spilled rows"):
                            state["joiner"] = self._spilled_aside(spilled, state.get("aside"))
                    elif stem == "persons":
                        aside = state["joiner"]
                        assert isinstance(aside, AsideMafids)
                        for s in ("units", "persons"):
                            self.result.set_aside[s] += aside.set_aside[s]
                        for totals_name, seconds in timer.seconds.items():
                            totals.seconds[totals_name] = totals.seconds.get(totals_name, 0.0) + seconds
                        planned = self.memory.parts[part.label].buckets
                        if self._workers is not None and part.state is None:
                            self._count_in_workers(part, spilled, last_part, totals)
                            remove_partition(spilled.folder)
                            state = {}
                            continue
                        if spilled.plan.buckets < planned and self._buckets_done is not None:
                            self._buckets_done.update(self._buckets_done.completed,  # type: ignore[attr-defined]
                                                      total=self._buckets_done.total - planned + spilled.plan.buckets)  # type: ignore
                        for b in range(spilled.plan.buckets):
                            bucket_timer = _Timer()
                            with bucket_timer("read the spill and join"):
                                bucket_part, bucket_state = self._load_bucket(part, spilled, b)
                            bucket_state["timer"] = bucket_timer
                            yield bucket_part, bucket_state, last_part and b == spilled.plan.buckets - 1
                            if self._buckets_done is not None:
                                self._buckets_done.advance(item=bucket_part.label)
                        remove_partition(spilled.folder)
                        state = {}
                    continue
                rows = state[stem]
                assert isinstance(rows, FileRows)
                rows.finish()
                if stem == "geo":
                    with timer("join"):
                        state["joiner"] = self._joiner(part, rows)
                elif stem == "persons":
                    with timer("join"):
                        joiner = state["joiner"]
                        assert isinstance(joiner, Joiner)
                        state["join"] = joiner.finish(state["person_keys"])  # type: ignore[arg-type]
                        for s in ("units", "persons"):
                            self.result.set_aside[s] += joiner.set_aside[s]
                    yield part, state, last_part
                    state = {}
        finally:
            for writer in writers.values():
                writer.abort()

    # --------------------------------------------------------------------------- spilled parts
    def _start_spill(self, part: PassPart, buckets: int) -> "Spilled":
        assert self._spill is not None
        plan = plan_buckets(part.files, buckets, BYTES_PER_ROW)
        log.info("spilling a partition", partition=part.label, buckets=plan.buckets)
        return Spilled(self._spill.part_folder(), plan)

    @staticmethod
    def _rows(part: PassPart) -> dict[str, int]:
        return {stem: part.files[stem].estimated_rows() for stem in STEMS if stem in part.files}

    def _states_in_workers(self, files_read: "Task", totals: _StageTotals, budget: int) -> None:
        """Data stored by state: each released state's folders read, validated and counted in a
        worker process, as many at once as ``budget`` bytes hold
        (:func:`phsafe.distributed.count_state`: the code of this pass, with a validation observer
        of its own); what they found merged here -- counts added, tallies and reading problems
        absorbed, and the layout across the folders checked on the MAFIDs they return."""
        from phsafe.workers import ClusterPlan

        observer = self.observer
        plan = ClusterPlan(Path(), Path(), dict(self.files), self.states, BucketPlan(()), Path(), (),
                           observer is not None, self.counting,
                           dict(getattr(observer, "file_names", {})), getattr(observer, "state_filter", None))
        costs = [part_bytes(self._rows(p)) for p in self.parts]
        assert self._workers is not None
        with totals("read, check, join, validate and count states (worker processes)"):
            results = self._workers.map("count_state", [(plan, p) for p in self.parts], costs=costs, budget=budget)
            for part, r in zip(self.parts, results):
                if r.error is not None:  # type: ignore[attr-defined]
                    raise InputError(*r.error)  # type: ignore[attr-defined]
                for stem, found in r.problems.items():  # type: ignore[attr-defined]
                    self.problems[stem].found.extend(found)
                self.result.misplaced += r.misplaced  # type: ignore[attr-defined]
                for stem, n in r.set_aside.items():  # type: ignore[attr-defined]
                    self.result.set_aside[stem] += n
                for stem in ("units", "geo"):
                    for mafids in r.layout[stem]:  # type: ignore[attr-defined]
                        self._layout_add(stem, part, mafids)
                if observer is not None and r.piece is not None:  # type: ignore[attr-defined]
                    observer.absorb(r.piece, files_read=True)  # type: ignore[attr-defined]
                if r.count_error is not None and self.result.count_error is None:  # type: ignore[attr-defined]
                    self.result.count_error = InputError(*r.count_error)  # type: ignore[attr-defined]
                if r.counts is not None and self.result.count_error is None:  # type: ignore[attr-defined]
                    self._counts.append(r.counts)  # type: ignore[attr-defined]
                    if len(self._counts) > 1:
                        self._counts = [combine_counts(self._counts)]
                for stem in STEMS:
                    bar = self._bytes_read.get(stem)
                    if bar is not None:
                        bar.advance(_size(part.files[stem]), item=part.label)
                    files_read.advance(item=f"{stem}, state {part.label}")
        if observer is not None:
            observer.partition_end()  # type: ignore[attr-defined]

    def _count_in_workers(self, part: PassPart, spilled: "Spilled", last_part: bool, totals: _StageTotals) -> None:
        """Join, validate and count a national partition's buckets in worker processes, as many
        at once as there are processes (:class:`phsafe.workers.WorkerProcesses`): each runs
        the code of :meth:`count_bucket` with a validation observer of its own, and what they
        found is merged here -- the counts added, the validation tallies absorbed."""
        from phsafe.workers import ClusterPlan

        observer = self.observer
        plan = ClusterPlan(Path(), Path(), dict(part.files), self.states, spilled.plan, spilled.folder, (),
                           observer is not None, self.counting,
                           dict(getattr(observer, "file_names", {})), getattr(observer, "state_filter", None))
        seen = observer.seen() if observer is not None else {}  # type: ignore[attr-defined]
        calls = [(plan, b, seen, spilled.rows) for b in range(spilled.plan.buckets)]
        assert self._workers is not None
        with totals("join, validate and count MAFID ranges (worker processes)"):
            for result in self._workers.map("count_bucket", calls):
                if result.error is not None:  # type: ignore[attr-defined]
                    raise InputError(*result.error)  # type: ignore[attr-defined]
                for stem, n in result.set_aside.items():  # type: ignore[attr-defined]
                    self.result.set_aside[stem] += n
                if observer is not None and result.piece is not None:  # type: ignore[attr-defined]
                    observer.absorb(result.piece)  # type: ignore[attr-defined]
                if result.count_error is not None and self.result.count_error is None:  # type: ignore[attr-defined]
                    self.result.count_error = InputError(*result.count_error)  # type: ignore[attr-defined]
                    if observer is None:
                        raise self.result.count_error
                if result.counts is not None and self.result.count_error is None:  # type: ignore[attr-defined]
                    self._counts.append(result.counts)  # type: ignore[attr-defined]
                    if len(self._counts) > 1:
                        self._counts = [combine_counts(self._counts)]
                if self._buckets_done is not None:
                    self._buckets_done.advance(item=f"{part.label} [{result.bucket + 1}/{spilled.plan.buckets}]")  # type: ignore[attr-defined]
        if last_part and observer is not None:
            observer.partition_end()  # type: ignore[attr-defined]

    def _spilled_aside(self, spilled: "Spilled", aside: object) -> AsideMafids:
        """The set-aside MAFIDs of a spilled partition, once its geo is read: MAFIDs of set-aside
        geo rows that also have a kept geo row are taken out (one read of the geo spill's MAFID
        and TABBLKST, only when a row was set aside)."""
        out = aside if isinstance(aside, AsideMafids) else AsideMafids()
        if not out.any:
            return out
        for b in range(spilled.plan.buckets):
            for values in self._kept_geo_mafids(spilled, b):
                out.add_kept(values)
        return out

    def _kept_geo_mafids(self, spilled: "Spilled", bucket: int) -> Iterator[np.ndarray]:
        """The well-formed MAFIDs of one geo bucket's rows that are kept (in a tabulated state,
        or with a malformed state, which validation reports), batch by batch."""
        for encoded, _ in read_bucket(spilled.folder, "geo", bucket, ("MAFID", "TABBLKST")):
            m, st = encoded["MAFID"], encoded["TABBLKST"]
            kept = self._state_index[st.values.astype(np.intp)] != NOT_TABULATED
            if st.kind is not None:
                kept |= st.kind != OK
            if m.kind is not None:
                kept &= m.kind == OK
            yield m.values[kept]

    def _load_bucket(self, part: PassPart, spilled: "Spilled", bucket: int) -> tuple[PassPart, dict[str, object]]:
        """One bucket of a spilled partition, read back and joined (what :meth:`_partitions`
        gives for a partition held in memory)."""
        n = spilled.plan.buckets
        bucket_part = PassPart(f"{part.label} [{bucket + 1}/{n}]", part.state, part.files)
        state: dict[str, object] = {s: FileRows(s) for s in STEMS}
        geo = state["geo"]
        assert isinstance(geo, FileRows)
        for encoded, rows in read_bucket(spilled.folder, "geo", bucket):
            geo.add(encoded, rows)
        geo.finish()
        joiner = self._joiner(bucket_part, geo, lookups=int(spilled.rows["units"][bucket] + spilled.rows["persons"][bucket]))
        person_keys: list[np.ndarray] = []
        for stem in ("units", "persons"):
            rows_of = state[stem]
            assert isinstance(rows_of, FileRows)
            for encoded, rows in read_bucket(spilled.folder, stem, bucket):
                m = encoded["MAFID"]
                ok = None if m.kind is None else m.kind == OK
                if stem == "units":
                    keep = joiner.units(m.values, ok)
                else:
                    keep, key = joiner.persons(m.values, ok)
                    person_keys.append(key)
                if keep is not None:  # never: set-aside rows were not spilled
                    encoded = {k: e.take(keep) for k, e in encoded.items()}
                    rows = int(np.count_nonzero(keep))
                rows_of.add(encoded, rows)
            rows_of.finish()
        state["join"] = joiner.finish(person_keys)
        for s in ("units", "persons"):
            self.result.set_aside[s] += joiner.set_aside[s]
        return bucket_part, state

    def _events(self) -> Iterator[tuple[str, PassPart, str, object]]:
        for part in self.parts:
            for stem in ("geo", "units", "persons"):
                reader = SourceReader(part.files[stem], self.problems[stem], columns=self._wanted(stem),
                                      reads=self.reads)
                yield "start", part, stem, reader
                for item in reader.batches():
                    yield "batch", part, stem, item
                yield "end", part, stem, reader

    # ---------------------------------------------------------------------------------- batches
    def _encode(self, stem: str, batch: pa.RecordBatch, names: Sequence[str]) -> dict[str, Encoded]:
        out = {}
        for name in names:
            i = batch.schema.get_field_index(name)
            if i < 0:
                continue
            column = COLUMN[stem, name]
            out[name] = encode(column, batch.column(i), None if self.observer is None else
                               self.observer.book(stem, column))
        return out

    def _wanted(self, stem: str) -> tuple[str, ...]:
        if self.observer is not None:
            return tuple(c.name for c in FILES[stem])
        return tuple(c.name for c in _ENGINE_COLUMNS[stem])

    def _batch(self, part: PassPart, stem: str, item: FileBatch, rows: "FileRows | SpillWriter",
               state: dict[str, object]) -> None:
        """Check one batch, filter it and hand its kept rows to ``rows`` (the partition's rows,
        or its spill writer)."""
        batch = item.batch
        strict = self.observer is None
        mafid = self._encode(stem, batch, ["MAFID"]).get("MAFID")
        keep = None
        if mafid is not None and part.mafid_range is not None:
            if strict:
                raise_value_problems(item.name, mafid)
            lo, hi = part.mafid_range
            keep = (mafid.values >= lo) & (mafid.values < hi)
        if stem == "geo":
            if keep is not None:
                batch, mafid = _take_rows(batch, mafid, keep)
            encoded = self._encode(stem, batch, [n for n in self._wanted(stem) if n != "MAFID"])
            if mafid is not None:
                encoded["MAFID"] = mafid
            kept = self._geo_kept(part, item.name, encoded)
            if strict:
                for e in encoded.values():
                    raise_value_problems(item.name, e, kept)
            if kept is not None and mafid is not None and "spilled" in state:
                aside = ~kept if mafid.kind is None else ~kept & (mafid.kind == OK)
                if aside.any():
                    if "aside" not in state:
                        state["aside"] = AsideMafids()
                    state["aside"].add_aside(mafid.values[aside])  # type: ignore[union-attr]
            if self.observer is not None:
                self.observer.batch(stem, item.name, encoded, kept)
            rows.add(encoded, batch.num_rows)
            return
        joiner = state["joiner"]
        assert isinstance(joiner, (Joiner, AsideMafids))
        n = batch.num_rows
        if mafid is None:  # no MAFID column (reported): nothing joins
            values, ok = np.zeros(n, np.int32), np.zeros(n, bool)
        else:
            values, ok = mafid.values, None if mafid.kind is None else mafid.kind == OK
        if keep is not None:
            batch, mafid = _take_rows(batch, mafid, keep)
            values, ok = values[keep], None if ok is None else ok[keep]
        if stem == "units":
            aside = joiner.units(values, ok)
        else:
            aside, person_key = joiner.persons(values, ok)
            if person_key is not None:
                state["person_keys"].append(person_key)  # type: ignore[union-attr]
        if aside is not None:
            batch, mafid = _take_rows(batch, mafid, aside)
        encoded = self._encode(stem, batch, [n for n in self._wanted(stem) if n != "MAFID"])
        if mafid is not None:
            encoded["MAFID"] = mafid
        if strict:
            for e in encoded.values():
                raise_value_problems(item.name, e)
        if self.observer is not None:
            self.observer.batch(stem, item.name, encoded, None)
        rows.add(encoded, batch.num_rows)

    def _geo_kept(self, part: PassPart, name: str, encoded: Mapping[str, Encoded]) -> np.ndarray | None:
        """Geo rows the state filter keeps (None: all); counts rows stored under another
        state's folder."""
        state = encoded.get("TABBLKST")
        if state is None:
            return None
        valid = None if state.kind is None else state.kind == OK
        code = state.values.astype(np.intp)
        if part.state is not None:
            elsewhere = code != int(part.state)
            if valid is not None:
                elsewhere &= valid
            n = int(np.count_nonzero(elsewhere))
            if n:
                self.result.misplaced += n
                if self.observer is None:
                    raise InputError(f"{part.files['geo'].name} ({part.label})", "TABBLKST",
                                     "every geo row is stored in the partition folder of its own state",
                                     rows=n)
        if self.states is None:
            return None
        kept = self._state_index[code] != NOT_TABULATED
        if valid is not None:
            kept |= ~valid  # a TABBLKST that is not a valid code cannot be placed outside the filter
        return None if kept.all() else kept

    def _joiner(self, part: PassPart, geo: FileRows, lookups: int | None = None) -> Joiner:
        if lookups is None:
            lookups = sum(part.files[s].estimated_rows() for s in ("units", "persons"))
        cols = geo.columns
        side = geo_side(cols["MAFID"], geo.ok("MAFID"), cols["RTYPE"], geo.ok("RTYPE"), cols["TABBLKST"],
                        geo.ok("TABBLKST"), self.states, expected_lookups=lookups)
        self.result.set_aside["geo"] += side.set_aside
        return Joiner(side)

    # --------------------------------------------------------------------------- partition end
    def _finish_partition(self, part: PassPart, state: dict[str, object], last: bool, totals: _StageTotals) -> None:
        join = state["join"]
        assert isinstance(join, Join)
        rows = {s: state[s] for s in STEMS}
        geo_clean = rows["geo"].clean  # type: ignore[union-attr]
        timer = state["timer"]
        assert isinstance(timer, _Timer)
        for name, seconds in timer.seconds.items():
            totals.seconds[name] = totals.seconds.get(name, 0.0) + seconds
        if self._layout is not None:
            self._layout_add("units", part, join.mafid[join.unit_rows > 0])
            self._layout_add("geo", part, join.geo.index.keys)
        if self.observer is not None:
            with totals("validate"):
                self.observer.partition(part, join.geo, join, rows, last)  # type: ignore[arg-type]
        # What only validation reads is let go before the tables are counted.
        for r in rows.values():
            r.release_compact()  # type: ignore[union-attr]
        rows["geo"] = None  # type: ignore[assignment]
        state.pop("geo", None)
        if self.counting is None or self.result.count_error is not None:
            return
        units, persons = rows["units"], rows["persons"]
        assert isinstance(units, FileRows) and isinstance(persons, FileRows)
        if not (units.clean and persons.clean and geo_clean):
            if self.observer is None:  # pragma: no cover -- strict reading raised already
                raise AssertionError("strict reading kept an invalid value")
            self.result.count_error = InputError(part.label, "", "holds values that break their column's rules")
            return
        states = self.states or ()
        try:
            with totals("fingerprint"):
                data = prepared(join, units.columns, persons.columns, states,
                                require_geo=part.label if part.state is not None else None)
                if self.observer is None:  # unvalidated: the structure the counting needs, still
                    check_structure(join, units.columns, persons.columns, {
                        s: self.files[s].name + (f" ({part.label})" if part.state is not None else "") for s in STEMS})
                content = content_digest(data.persons, data.person_state, data.units, data.unit_state,
                                         states, not_tabulated=NOT_TABULATED)
            with totals("truncate, join and count" if self.counting.key is not None else "join and count"):
                tables = tabulate(list(self.counting.specs), data, taus=self.counting.taus, key=self.counting.key,
                                  max_persons_per_partition=MAX_PERSONS_PER_PARTITION)
        except InputError as exc:
            if self.observer is None:
                raise
            self.result.count_error = exc
            return
        self._counts.append(Counts(tables, content))
        if len(self._counts) > 1:
            self._counts = [combine_counts(self._counts)]

    # ------------------------------------------------------------ pieces of a pass (cluster)
    # The Dask path (``phsafe.distributed``) runs a spilled partition's two halves as tasks:
    # each block of a file streamed into the buckets, then each bucket joined, validated and
    # counted -- with the same code as the pass on one machine.
    def spill_block(self, stem: str, reader: SourceReader, spilled: "Spilled", *, block: int,
                    aside: "AsideMafids | AsideCollector | None" = None) -> np.ndarray:
        """Stream one block of one file (``reader``) into ``spilled``'s buckets; the rows
        written to each bucket. For geo, ``aside`` collects the MAFIDs of set-aside rows; for
        units and persons it holds the partition's set-aside MAFIDs."""
        part = self.parts[0]
        state: dict[str, object] = {"spilled": spilled, "timer": _Timer()}
        if stem == "geo":
            if aside is not None:
                state["aside"] = aside
        else:
            state["joiner"] = aside if isinstance(aside, AsideMafids) else AsideMafids()
        writer = SpillWriter(spilled.folder, stem, spilled.plan, block=block)
        try:
            for item in reader.batches():
                self._batch(part, stem, item, writer, state)
            writer.close()
        finally:
            writer.abort()
        joiner = state.get("joiner")
        if isinstance(joiner, AsideMafids):
            for s in ("units", "persons"):
                self.result.set_aside[s] += joiner.set_aside[s]
        if self.observer is not None:
            self.observer.file_read(stem, part, reader, False)
            self.observer.finish_block(stem)  # type: ignore[attr-defined]
        return writer.rows

    def settle_aside(self, spilled: "Spilled", bucket: int, aside: np.ndarray) -> np.ndarray:
        """The set-aside MAFIDs of one bucket (``aside``: MAFIDs of its set-aside geo rows, sorted
        and distinct) less those that also have a kept geo row."""
        if not len(aside):
            return aside
        kept_too: list[np.ndarray] = []
        for values in self._kept_geo_mafids(spilled, bucket):
            pos = np.minimum(np.searchsorted(aside, values), len(aside) - 1)
            kept_too.append(values[aside[pos] == values])
        if not kept_too:
            return aside
        return np.setdiff1d(aside, np.concatenate(kept_too), assume_unique=False)

    def count_bucket(self, spilled: "Spilled", bucket: int) -> PassResult:
        """Join, validate and count one bucket of a spilled partition (the last piece for its
        observer: the cross-file frames are submitted)."""
        part, state = self._load_bucket(self.parts[0], spilled, bucket)
        state["timer"] = _Timer()
        self._finish_partition(part, state, True, _StageTotals())
        if self.counting is not None and self.result.count_error is None:
            self.result.counts = combine_counts(self._counts) if self._counts else self._zero_counts()
        return self.result

    def _layout_add(self, stem: str, part: PassPart, mafids: np.ndarray) -> None:
        assert self._layout is not None
        again = self._layout.add(stem, mafids)
        if again and self.observer is None and stem == "geo":
            raise InputError(f"{self.files[stem].name}/{PARTITION_KEY}={part.state}", "MAFID",
                             "a MAFID has geo rows in more than one state partition", rows=again)

    def _aside_folder(self, part: PassPart) -> None:
        """A state folder outside the state filter: set aside; only its layout is checked (the
        MAFIDs of units and geo, geo's TABBLKST); its persons are never read."""
        self.result.set_aside["persons"] += part.files["persons"].estimated_rows()
        for stem, names in (("units", ("MAFID",)), ("geo", ("MAFID", "TABBLKST"))):
            reader = SourceReader(part.files[stem], Problems(strict=False), columns=names, reads=self.reads)
            mafids = []
            for item in reader.batches():
                batch = item.batch
                self.result.set_aside[stem] += batch.num_rows
                encoded = self._layout_encode(stem, batch, names)
                m = encoded.get("MAFID")
                if m is not None:
                    mafids.append(m.values if m.kind is None else m.values[m.kind == OK])
                if "TABBLKST" in encoded:
                    self._geo_kept(part, item.name, {"TABBLKST": encoded["TABBLKST"]})
            if mafids:
                self._layout_add(stem, part, sorted_distinct(np.concatenate(mafids).astype(np.int32)))

    def _layout_encode(self, stem: str, batch: pa.RecordBatch, names: Sequence[str]) -> dict[str, Encoded]:
        out = {}
        for name in names:
            i = batch.schema.get_field_index(name)
            if i >= 0:
                out[name] = encode(COLUMN[stem, name], batch.column(i))
        return out


COLUMN = {(stem, c.name): c for stem in STEMS for c in FILES[stem]}


def _take_rows(batch: pa.RecordBatch, mafid: Encoded | None, rows: np.ndarray) -> tuple[pa.RecordBatch, Encoded | None]:
    return batch.filter(pa.array(rows)), None if mafid is None else mafid.take(rows)


class _Timer(_StageTotals):
    """Stage seconds of one partition."""


class AsideCollector:
    """Collects the valid MAFIDs of set-aside geo rows (a geo block read on a cluster)."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []

    def add_aside(self, mafids: np.ndarray) -> None:
        self.parts.append(np.asarray(mafids, dtype=np.int32))

    def distinct(self) -> np.ndarray:
        return sorted_distinct(np.concatenate(self.parts)) if self.parts else np.empty(0, np.int32)


@dataclass
class Spilled:
    """A partition being spilled: its folder and buckets, and the rows written to each."""

    folder: Path
    plan: BucketPlan
    rows: dict[str, np.ndarray] = field(default_factory=dict)


def _size(f: InputFile) -> int:
    """Bytes of an input's files (progress)."""
    total = 0
    for path in f.files:
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total


def plan_pass(parts: Sequence[PassPart], limit: int, *, validate: bool, by_state: bool) -> MemoryPlan | None:
    """The memory plan of a pass over ``parts``: each partition in memory or spilled into
    buckets (:func:`phsafe.memory.plan_part`); None if some partition cannot fit in ``limit``."""
    plans = {}
    for part in parts:
        rows = {stem: part.files[stem].estimated_rows() for stem in STEMS if stem in part.files}
        # National partitions count their MAFID ranges in worker processes, one per core.
        parallel = worker_processes() if part.state is None and rows.get("persons", 0) >= memory.WORKERS_MIN_PERSONS \
            else 1
        plan = plan_part(rows, limit, validate=validate, by_state=by_state, parallel=parallel)
        if plan is None:
            return None
        plans[part.label] = plan
    return MemoryPlan(limit, plans)
