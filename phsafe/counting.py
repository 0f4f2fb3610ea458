"""Exact counting: from the input files to the exact (truncated) count cubes of every table.

This is the one entry point the engine and the Prefect flows use to turn ``DATA`` into
:class:`~phsafe.tabulate.TableCounts`: read, preprocess (state filter, geography, group quarters),
truncate-join-count. Nothing here draws noise or touches the ledger; the results are exact and
confidential, so they never leave the process except as sums handed to :mod:`phsafe.noise`.

The work is cut into *partitions* that can be counted independently, in any order, on any
process, and added up:

* :func:`plan_partitions` -- small, picklable descriptions (file paths, a state, a MAFID
  range; never data);
* :func:`count_partition` -- reads only its partition's rows and returns their exact count
  cubes (states x iteration codes x cells: a few kilobytes) with the content digest of the
  records it tabulated (:mod:`phsafe.fingerprint`), as :class:`Counts`;
* :func:`combine_counts` -- adds the cubes and the digests (exact integers and sums modulo 2^64:
  the order does not matter).

:func:`exact_counts` runs them one after the other in this process. Only the sums reach the
noise step, which stays on the coordinating process with the budget accounting.

Why partitions add up to the unpartitioned counts: every rule of the count is decided per MAFID
-- a MAFID's state (its geo row), whether its unit is unique in a table's universe, and which of
its persons truncation keeps (a keyed hash of each record, :mod:`phsafe.truncation`) -- so any
split that keeps each MAFID's records together gives the same exact counts. Two kinds of split:

* **state partitions** of a folder input stored by state (``persons/TABBLKST=06/...``, see
  :mod:`phsafe.reader`): one partition per state of ``state_filter`` present in the data.
  Memory is bounded by the largest state, not the nation. A state may further be cut into
  MAFID ranges (``max_persons``). The layout is checked: geo rows must lie in their state's
  folder and a MAFID must not have geo rows in two states (:func:`plan_partitions`), and every
  person and unit must have its geo row in its own partition (:func:`count_partition`);
  otherwise the run stops with an :class:`~phsafe.errors.InputError` before any budget is spent.
  Partitions of states outside ``state_filter`` are not read.
* **MAFID ranges** of any input (one CSV or Parquet file, or a folder not stored by state): by
  default the whole input is one partition, read once into compact columns (about 23 bytes a
  person) and tabulated in MAFID ranges of 2M persons (:func:`phsafe.tabulate.tabulate`).
  With ``max_persons`` it is cut into MAFID ranges of the domain, each reading the whole input
  and keeping its range: less memory per partition (and parallel on a cluster) for more
  reading.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from phsafe.config import PHSafeConfig
from phsafe.errors import InputError
from phsafe.fingerprint import ContentDigest, content_digest
from phsafe.logs import get_logger
from phsafe.preprocess import MAX_PERSONS_PER_PARTITION, NOT_TABULATED, prepare
from phsafe.reader import PARTITION_KEY, InputFile, InputTables, MafidRange, locate_inputs, read_table
from phsafe.schema import MAFID_MAX, MAFID_MIN
from phsafe.tables import TableSpec
from phsafe.tabulate import TableCounts, tabulate

log = get_logger("phsafe.counting")

StageTimer = Callable[[str], AbstractContextManager[None]]
"""Called with a stage name; times and logs the ``with`` block (see ``phsafe.engine``)."""

STEMS = ("persons", "units", "geo")


class Counts(Mapping[str, TableCounts]):
    """Exact count cubes by table name, with the content digest of the records counted.

    A mapping table name -> :class:`~phsafe.tabulate.TableCounts`; ``content`` identifies the
    tabulated records (see :mod:`phsafe.fingerprint`). Both are confidential.
    """

    __slots__ = ("_tables", "content")

    def __init__(self, tables: Mapping[str, TableCounts], content: ContentDigest) -> None:
        self._tables = dict(tables)
        self.content = content

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
        stage: Stage timer for progress and logs (stages ``read``, ``preprocess`` and
            ``truncate, join and count``).

    Returns:
        Table name -> exact counts over every released state (zeros outside the partition), with
        the content digest of the partition's tabulated records.

    Raises:
        InputError: An input is unreadable, has inconsistent codes, or is not stored by state
            as its layout says (nothing is spent).
    """
    with stage("read"):
        tables = {stem: read_table(f, mafid_range=partition.mafid_range)
                  for stem, f in partition.files.items()}
        if partition.state is not None:
            wrong = int(np.count_nonzero(tables["geo"]["TABBLKST"] != int(partition.state)))
            if wrong:
                raise InputError(f"{partition.files['geo'].name} ({partition.label})", "TABBLKST",
                                 "every geo row is stored in the partition folder of its own state",
                                 rows=wrong)
    with stage("preprocess"):
        inputs = InputTables(tables["persons"], tables["units"], tables["geo"], partition.files)
        del tables
        data = prepare(inputs, config.states,
                       require_geo=partition.label if partition.state is not None else None)
        del inputs
        content = content_digest(data.persons, data.person_state, data.units, data.unit_state,
                                 data.states, not_tabulated=NOT_TABULATED)
    with stage("truncate, join and count" if key is not None else "join and count"):
        tables = tabulate(list(specs), data, taus=dict(config.tau) if key is not None else None, key=key,
                          max_persons_per_partition=MAX_PERSONS_PER_PARTITION)
    return Counts(tables, content)


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
) -> Counts:
    """Exact count cubes of ``specs`` over the states of ``config``, and their content digest.

    The combination of :func:`count_partition` over :func:`plan_partitions`, one partition at a
    time in this process: peak memory is that of the largest partition.

    Args:
        config: The run's config (state filter and the truncation thresholds τ).
        data_dir: Folder with the persons, units and geo inputs.
        specs: Tables to count.
        key: Truncation key; ``None`` counts without truncation (the non-private ground truth).
        stage: Stage timer for progress and logs.

    Raises:
        InputError: An input is unreadable or has inconsistent codes (nothing is spent).
    """
    with stage("plan partitions"):
        parts = plan_partitions(config, Path(data_dir))
    if len(parts) == 1:
        return count_partition(parts[0], config, specs, key=key, stage=stage)
    totals = _StageTotals()
    with stage("count partitions"):
        result: Counts | None = None
        for number, part in enumerate(parts, start=1):
            start = time.perf_counter()
            counts = count_partition(part, config, specs, key=key, stage=totals)
            result = counts if result is None else combine_counts([result, counts])
            del counts
            log.info("partition counted", partition=part.label, number=number, of=len(parts),
                     seconds=round(time.perf_counter() - start, 3))
    log.info("partition stages", **{k.replace(", ", "_").replace(" ", "_"): round(v, 3)
                                    for k, v in totals.seconds.items()})
    assert result is not None
    return result
