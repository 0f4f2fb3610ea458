"""The input pass: each input file read once, checked, filtered, joined; validated and counted.

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
(:mod:`phsafe.intake.spill`), then the ranges joined, validated and counted, two at a time in
worker processes (:mod:`phsafe.intake.workers`). States of data stored by state are counted in
the same two worker processes, a state started only while the states in flight fit the limit.
What the worker processes find comes back as :class:`~phsafe.intake.pieces.Piece` s, merged by
:func:`~phsafe.intake.pieces.merge`.

Within a partition, geo, then units, then persons are read batch by batch while a background
thread reads ahead; each batch is checked column by column on its raw bytes
(:func:`phsafe.reader.encode`), filtered -- geo rows outside ``state_filter`` and the units and
persons of their MAFIDs are set aside first (spec §1) -- and kept as compact columns; at the end of
the partition its records are joined on MAFID once (:mod:`phsafe.preprocess`), handed to the
validation and counted (:func:`phsafe.counting.count_join`). The next partition is read while
this one is counted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from phsafe import memory
from phsafe.counting import Counting, count_join, zero_counts
from phsafe.errors import InputError
from phsafe.intake.parts import (
    COLUMN,
    ENGINE_COLUMNS,
    READ_ORDER,
    STEMS,
    AsideCollector,
    ClusterPlan,
    FileRows,
    Layout,
    LayoutCollector,
    PassObserver,
    PassPart,
    PassResult,
    Reading,
    Spilled,
    StageTimer,
    StageTotals,
    no_timer,
)
from phsafe.intake.pieces import Piece, error_fields, merge
from phsafe.intake.spill import SpillArea, SpillWriter, plan_buckets, read_bucket, remove_partition
from phsafe.intake.workers import release_memory
from phsafe.logs import get_logger
from phsafe.memory import (
    BYTES_PER_ROW,
    MemoryPlan,
    check_memory,
    default_memory_limit,
    needed_limit,
    parallel_budget,
    plan_part,
    plan_target,
    state_bytes,
    worker_processes,
)
from phsafe.preprocess import NOT_TABULATED, AsideMafids, Joiner, geo_side, sorted_distinct, state_indices
from phsafe.progress import BYTES
from phsafe.reader import (
    OK,
    Encoded,
    FileBatch,
    InputFile,
    Problems,
    SourceReader,
    digests_of,
    encode,
    file_digest,
    raise_value_problems,
)
from phsafe.schema import FILES
from phsafe.validation import FileSeen, InputValidation, piece_validation

if TYPE_CHECKING:
    from phsafe.intake.workers import WorkerProcesses
    from phsafe.progress import Progress, Task

log = get_logger("phsafe.intake")


def plan_parts(files: Mapping[str, InputFile], states: tuple[str, ...] | None
               ) -> tuple[list[PassPart], list[PassPart], int | None]:
    """The partitions of a pass over ``files``, the state folders outside the state filter, and
    the number of state folders (None: the data is not stored by state).

    Reads file listings only."""
    inputs = [files[s] for s in STEMS if s in files]
    if len(inputs) < len(STEMS) or not all(f.partitioned for f in inputs):
        return [PassPart("all", None, dict(files))], [], None
    by_stem = {f.stem: f.partitions() for f in inputs}
    found = sorted({k for parts in by_stem.values() for k in parts if k is not None})
    released = set(states) if states is not None else set(found)

    def part(state: str) -> PassPart:
        return PassPart(state, state, {f.stem: f.subset(by_stem[f.stem].get(state, ())) for f in inputs})

    parts = [part(s) for s in found if s in released]
    return (parts or [PassPart("empty", None, {f.stem: f.subset(()) for f in inputs})],
            [part(s) for s in found if s not in released], len(found))


def plan_memory(parts: Sequence[PassPart], limit: int, *, validate: bool, by_state: bool,
                target: int | None = None) -> MemoryPlan | None:
    """The memory plan of a pass over ``parts``: each partition in memory or spilled into
    buckets (:func:`phsafe.memory.plan_part`), the buckets aimed at ``target`` (default:
    ``limit``); None if some partition cannot fit in ``limit``."""
    plans = {}
    for part in parts:
        rows = part.rows()
        # National partitions count their MAFID ranges in worker processes, one per core.
        parallel = worker_processes() if part.state is None and rows.get("persons", 0) >= memory.WORKERS_MIN_PERSONS \
            else 1
        plan = plan_part(rows, limit, validate=validate, by_state=by_state, parallel=parallel, target=target)
        if plan is None:
            return None
        plans[part.label] = plan
    return MemoryPlan(limit, plans)


def smallest_limit(parts: Sequence[PassPart], *, validate: bool, by_state: bool) -> int:
    """The smallest memory limit a pass over ``parts`` can run within."""
    return max(needed_limit(p.rows(), validate=validate, by_state=by_state) for p in parts)


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
        layout: Stands for the layout check across state folders (a piece that reads one
            state's folders collects their MAFIDs for the process that checks them).
        strict: Raise at the first problem (default: when there is no observer).

    A partition whose records do not fit in ``memory_limit`` (:func:`phsafe.memory.plan_part`)
    is *spilled*: its files are streamed once -- each batch checked, validated and filtered as
    above -- and its compact rows routed by MAFID range to bucket files (:mod:`phsafe.intake.spill`);
    the buckets are then joined, validated and counted one at a time, exactly as partitions of
    their own (every rule is decided per MAFID). The units and persons of MAFIDs whose every geo
    row the state filter sets aside are set aside as they stream
    (:class:`~phsafe.preprocess.AsideMafids`), so that validation sees exactly the rows it sees
    when the partition is held in memory.
    """

    def __init__(self, files: Mapping[str, InputFile], states: tuple[str, ...] | None, *,
                 observer: PassObserver | None = None, counting: Counting | None = None,
                 parts: list[PassPart] | None = None, stage: StageTimer = no_timer,
                 reads: Callable[[Path], None] | None = None, progress: "Progress | None" = None,
                 memory_limit: int | None = None, spill_dir: Path | None = None,
                 layout: LayoutCollector | None = None, strict: bool | None = None) -> None:
        self.files = dict(files)
        self.strict = observer is None if strict is None else strict
        """Raise at the first problem (default: without validation)."""
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
        self._aside_folders: list[PassPart] = []
        self._layout: Layout | LayoutCollector | None = layout
        if parts is None:
            parts, self._aside_folders, states_found = plan_parts(self.files, states)
            if states_found is not None:
                self.result.by_state = True
                self.result.states_found = states_found
                if self._layout is None:
                    self._layout = Layout({s: f.name for s, f in self.files.items()}, strict=observer is None)
        self.parts = parts
        self.memory_limit = memory_limit if memory_limit is not None else default_memory_limit()
        self.memory_target = plan_target(memory_limit)
        """What the pass aims at (:func:`phsafe.memory.plan_target`): the limit when one is given."""
        self.spill_dir = spill_dir
        self.memory = plan_memory(self.parts, self.memory_limit, validate=observer is not None,
                                  by_state=self.result.by_state, target=self.memory_target)
        self._spill: SpillArea | None = None
        self._bytes_read: dict[str, Task] = {}
        self._buckets_done: Task | None = None
        self._ranges_total = self._ranges_done = 0
        self._workers: WorkerProcesses | None = None

    def needed_limit(self) -> int:
        """The smallest memory limit the pass can run within."""
        return smallest_limit(self.parts, validate=self.observer is not None, by_state=self.result.by_state)

    # ------------------------------------------------------------------------------------- run
    def run(self) -> PassResult:
        """Read, check, join, validate and count every partition (see the class docstring)."""
        from phsafe.intake.workers import WorkerProcesses
        from phsafe.progress import NULL

        if self.memory is None:
            check_memory(None, self.needed_limit(), None)
        assert self.memory is not None
        totals = StageTotals()
        self._spill = SpillArea(self.spill_dir) if self.spill_dir is not None or self.memory.spills else None
        progress = self.progress or NULL
        state_budget = None
        if self.result.by_state and not self.memory.spills and isinstance(self._layout, Layout):
            # Data stored by state: states counted two at a time in worker processes, as many as
            # the memory limit holds at once.
            state_budget = parallel_budget([p.rows() for p in self.parts], self.memory_limit,
                                           validate=self.observer is not None, target=self.memory_target)
        if state_budget is not None or (self.memory.workers > 1 and any(
                self.memory.parts[part.label].spilled and part.state is None for part in self.parts)):
            self._workers = WorkerProcesses(worker_processes(), validation=self.observer is not None)
        try:
            with self.stage("read, check, join and count" if self.counting is not None else "read, check and join"), \
                    progress.task("input files", total=len(self.parts) * len(STEMS), unit="files") as files_read, \
                    contextlib.ExitStack() as bars:
                self._bytes_read = {stem: bars.enter_context(progress.task(
                    self.files[stem].name, total=sum(p.bytes_of(stem) for p in self.parts), unit=BYTES))
                    for stem in READ_ORDER if stem in self.files}
                if self.memory.spills:
                    self._ranges_total = sum(p.buckets for p in self.memory.parts.values() if p.spilled)
                    self._buckets_done = bars.enter_context(progress.task("MAFID ranges", total=self._ranges_total,
                                                                          unit="ranges"))
                if state_budget is not None:
                    self._states_in_workers(files_read, totals, state_budget)
                for number, (part, reading, last) in enumerate(
                        self._partitions(files_read, totals) if state_budget is None else (), start=1):
                    started = time.perf_counter()
                    self._finish_partition(part, reading, last, totals)
                    log.debug("partition done", partition=part.label, number=number,
                              seconds=round(time.perf_counter() - started, 3))
                for part in self._aside_folders:
                    with totals("layout of folders outside the state filter"):
                        self.aside_folder(part)
        finally:
            if self._workers is not None:
                self._workers.close()
            if self._spill is not None:
                self._spill.close()
        log.info("partition stages", **{k.replace(", ", "_").replace(" ", "_"): round(v, 3)
                                        for k, v in totals.seconds.items()})
        if isinstance(self._layout, Layout):
            self.result.repeated = self._layout.found()
        if self.result.count_error is not None:
            self.result.counts = None
        if self.counting is not None and self.result.count_error is None and self.result.counts is None:
            self.result.counts = zero_counts(self.counting, self.states or ())
        if self.result.counts is not None:
            # Every input file hashed as the pass read it (national CSV files, as they stream;
            # a state's folders, by the worker process that read them): the run need not read
            # them again for the ledger's digests.
            self.result.counts.input_digests = digests_of(self.files, self.result.digests)
        return self.result

    def _partitions(self, files_read: "Task", totals: StageTotals) -> Iterator[tuple[PassPart, Reading, bool]]:
        """Each partition (or bucket of a spilled partition) with its kept rows, and whether it
        is the last; read ahead on a background thread. ``files_read`` advances as each file (of
        each partition) has been read."""
        from phsafe.reader import prefetched

        assert self.memory is not None
        reading = Reading()
        writers: dict[str, SpillWriter] = {}
        try:
            for kind, part, stem, reader, item in prefetched(self._events(), depth=4):
                plan = self.memory.parts[part.label]
                if kind == "start":
                    if stem == "geo":
                        reading = Reading()
                        if plan.spilled:
                            reading.spilled = self._start_spill(part, plan.buckets)
                    if reading.spilled is not None:
                        writers[stem] = SpillWriter(reading.spilled.folder, stem, reading.spilled.plan)
                    continue
                spilled = reading.spilled
                bar = self._bytes_read.get(stem)
                if kind == "batch":
                    assert item is not None
                    with reading.timer("read and check"):
                        self._batch(part, stem, item, writers[stem] if spilled is not None else reading.rows(stem),
                                    reading)
                    reading.bytes_read[stem] = reading.bytes_read.get(stem, 0) + item.nbytes
                    if bar is not None:
                        bar.advance(item.nbytes, item=part.label if part.state is not None else "")
                    continue
                # the file's end
                if bar is not None:  # what the batches did not account for (e.g. an unreadable file)
                    bar.advance(max(0, part.bytes_of(stem) - reading.bytes_read.get(stem, 0)))
                files_read.advance(item=self.files[stem].name if part.state is None else f"{stem}, state {part.label}")
                self.result.digests.update(reader.digests)
                last_part = part is self.parts[-1]
                if self.observer is not None:
                    self.observer.file_read(stem, part, reader, last_part)
                if spilled is not None:
                    with reading.timer("spill"):
                        writer = writers.pop(stem)
                        writer.close()
                        spilled.rows[stem] = writer.rows
                    if stem == "geo":
                        with reading.timer("state filter of the spilled rows"):
                            reading.joiner = self._spilled_aside(spilled, reading.aside)
                    elif stem == "persons":
                        yield from self._spilled_buckets(part, reading, spilled, last_part, totals)
                        reading = Reading()
                    continue
                rows = reading.rows(stem).finish()
                if stem == "geo":
                    with reading.timer("join"):
                        reading.joiner = self._joiner(part, rows)
                elif stem == "persons":
                    with reading.timer("join"):
                        joiner = reading.joiner
                        assert isinstance(joiner, Joiner)
                        reading.join = joiner.finish(reading.person_keys)
                        reading.person_keys = []  # in the join now: not kept twice
                        for s in ("units", "persons"):
                            self.result.set_aside[s] += joiner.set_aside[s]
                    yield part, reading, last_part
                    reading = Reading()
        finally:
            for writer in writers.values():
                writer.abort()

    def _spilled_buckets(self, part: PassPart, reading: Reading, spilled: Spilled, last_part: bool,
                         totals: StageTotals) -> Iterator[tuple[PassPart, Reading, bool]]:
        """A spilled partition's files are on disk: its buckets, read back and joined one at a
        time (or joined, validated and counted in the worker processes)."""
        assert self.memory is not None
        aside = reading.joiner
        assert isinstance(aside, AsideMafids)
        for s in ("units", "persons"):
            self.result.set_aside[s] += aside.set_aside[s]
        totals.add(reading.timer)
        # What the streaming held (parsed batches, the spill writers' buffers) goes back to the
        # system before the buckets are counted: pyarrow's allocator keeps freed memory otherwise.
        release_memory()
        planned = self.memory.parts[part.label].buckets
        try:
            if self._workers is not None and part.state is None:
                self._count_in_workers(part, spilled, last_part, totals)
                return
            if spilled.plan.buckets < planned and self._buckets_done is not None:
                self._ranges_total -= planned - spilled.plan.buckets
                self._buckets_done.update(self._ranges_done, total=self._ranges_total)
            for b in range(spilled.plan.buckets):
                bucket_timer = StageTotals()
                with bucket_timer("read the spill and join"):
                    bucket_part, bucket_reading = self._load_bucket(part, spilled, b)
                bucket_reading.timer = bucket_timer
                yield bucket_part, bucket_reading, last_part and b == spilled.plan.buckets - 1
                if self._buckets_done is not None:
                    self._ranges_done += 1
                    self._buckets_done.advance(item=bucket_part.label)
        finally:
            remove_partition(spilled.folder)

    def _events(self) -> Iterator[tuple[str, PassPart, str, SourceReader, FileBatch | None]]:
        for part in self.parts:
            for stem in READ_ORDER:
                reader = SourceReader(part.files[stem], self.problems[stem], columns=self.wanted(stem),
                                      reads=self.reads)
                yield "start", part, stem, reader, None
                for item in reader.batches():
                    yield "batch", part, stem, reader, item
                yield "end", part, stem, reader, None

    # --------------------------------------------------------------------------- spilled parts
    def _start_spill(self, part: PassPart, buckets: int) -> Spilled:
        assert self._spill is not None
        plan = plan_buckets(part.files, buckets, BYTES_PER_ROW)
        log.info("spilling a partition", partition=part.label, buckets=plan.buckets)
        return Spilled(self._spill.part_folder(), plan)

    def _states_in_workers(self, files_read: "Task", totals: StageTotals, budget: int) -> None:
        """Data stored by state: each released state's folders read, validated and counted in a
        worker process, as many at once as ``budget`` bytes hold
        (:func:`count_state`: the code of this pass, with a validation
        observer of its own); their pieces merged here (:func:`phsafe.intake.pieces.merge`)."""
        assert self._workers is not None and isinstance(self._layout, Layout)
        plan = ClusterPlan.for_worker(self.files, self.states, self.counting, self.observer)
        # Largest first, and smaller states may pass one that waits for memory: California
        # (counted alone) starts at once, and a free process counts small states beside a large
        # one instead of waiting for it. The states are merged in this order -- a function of
        # their folders' row counts, so the pass is the same run after run.
        order = sorted(range(len(self.parts)), key=lambda i: -state_bytes(self.parts[i].rows()))
        costs = [state_bytes(self.parts[i].rows()) for i in order]
        by_label = {p.label: p for p in self.parts}

        def advance(piece: Piece) -> None:
            part = by_label[piece.label]
            for stem in STEMS:
                bar = self._bytes_read.get(stem)
                if bar is not None:
                    bar.advance(part.bytes_of(stem), item=part.label)
                files_read.advance(item=f"{stem}, state {part.label}")

        with totals("read, check, join, validate and count states (worker processes)"):
            pieces = self._workers.map(count_state, [(plan, k, self.parts[i]) for k, i in enumerate(order)],
                                       costs=costs, budget=budget, smaller_may_pass=True)
            merge(pieces, result=self.result, validation=self.observer, layout=self._layout, each=advance)
        if self.observer is not None:
            self.observer.partition_end()

    def _count_in_workers(self, part: PassPart, spilled: Spilled, last_part: bool, totals: StageTotals) -> None:
        """Join, validate and count a national partition's buckets in worker processes, as many
        at once as there are processes (:class:`phsafe.intake.workers.WorkerProcesses`): each runs
        the code of :meth:`count_bucket` with a validation observer of its own; their pieces are
        merged here (:func:`phsafe.intake.pieces.merge`)."""
        assert self._workers is not None
        plan = ClusterPlan.for_worker(part.files, self.states, self.counting, self.observer, spilled=spilled)
        seen = self.observer.seen() if self.observer is not None else {}

        def advance(piece: Piece) -> None:
            if self._buckets_done is not None:
                self._ranges_done += 1
                self._buckets_done.advance(item=f"{part.label} [{piece.order[-1] + 1}/{spilled.plan.buckets}]")

        with totals("join, validate and count MAFID ranges (worker processes)"):
            pieces = self._workers.map(count_bucket, [(plan, b, seen, spilled.rows) for b in range(spilled.plan.buckets)])
            merge(pieces, result=self.result, validation=self.observer, each=advance)
        if last_part and self.observer is not None:
            self.observer.partition_end()

    def _spilled_aside(self, spilled: Spilled, aside: AsideMafids | AsideCollector | None) -> AsideMafids:
        """The set-aside MAFIDs of a spilled partition, once its geo is read: MAFIDs of set-aside
        geo rows that also have a kept geo row are taken out (one read of the geo spill's MAFID
        and TABBLKST, only when a row was set aside)."""
        out = aside if isinstance(aside, AsideMafids) else AsideMafids()
        if not out.any:
            return out
        for b in range(spilled.plan.buckets):
            for values in self.kept_geo_mafids(spilled, b):
                out.add_kept(values)
        return out

    def kept_geo_mafids(self, spilled: Spilled, bucket: int) -> Iterator[np.ndarray]:
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

    def load_bucket(self, part: PassPart, spilled: Spilled, bucket: int) -> tuple[PassPart, Reading]:
        """One bucket of a spilled partition, read back and joined (what :meth:`_partitions`
        gives for a partition held in memory)."""
        return self._load_bucket(part, spilled, bucket)

    def _load_bucket(self, part: PassPart, spilled: Spilled, bucket: int) -> tuple[PassPart, Reading]:
        n = spilled.plan.buckets
        bucket_part = PassPart(f"{part.label} [{bucket + 1}/{n}]", part.state, part.files)
        reading = Reading()
        geo = reading.rows("geo")
        for encoded, rows in read_bucket(spilled.folder, "geo", bucket):
            geo.add(encoded, rows)
        geo.finish()
        joiner = self._joiner(bucket_part, geo, lookups=int(spilled.rows["units"][bucket] + spilled.rows["persons"][bucket]))
        for stem in ("units", "persons"):
            rows_of = reading.rows(stem)
            for encoded, rows in read_bucket(spilled.folder, stem, bucket):
                m = encoded["MAFID"]
                ok = None if m.kind is None else m.kind == OK
                if stem == "units":
                    keep = joiner.units(m.values, ok)
                else:
                    keep, key = joiner.persons(m.values, ok)
                    reading.person_keys.append(key)
                if keep is not None:  # never: set-aside rows were not spilled
                    encoded = {k: e.take(keep) for k, e in encoded.items()}
                    rows = int(np.count_nonzero(keep))
                rows_of.add(encoded, rows)
            rows_of.finish()
        reading.joiner = joiner
        reading.join = joiner.finish(reading.person_keys)
        reading.person_keys = []  # in the join now: not kept twice
        for s in ("units", "persons"):
            self.result.set_aside[s] += joiner.set_aside[s]
        return bucket_part, reading

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

    def wanted(self, stem: str) -> tuple[str, ...]:
        """The columns the pass reads of a file: every column with validation, else the engine's."""
        if self.observer is not None:
            return tuple(c.name for c in FILES[stem])
        return tuple(c.name for c in ENGINE_COLUMNS[stem])

    def _batch(self, part: PassPart, stem: str, item: FileBatch, rows: FileRows | SpillWriter,
               reading: Reading) -> None:
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
            encoded = self._encode(stem, batch, [n for n in self.wanted(stem) if n != "MAFID"])
            if mafid is not None:
                encoded["MAFID"] = mafid
            kept = self._geo_kept(part, item.name, encoded)
            if strict:
                for e in encoded.values():
                    raise_value_problems(item.name, e, kept)
            if kept is not None and mafid is not None and reading.spilled is not None:
                aside = ~kept if mafid.kind is None else ~kept & (mafid.kind == OK)
                if aside.any():
                    if reading.aside is None:
                        reading.aside = AsideMafids()
                    reading.aside.add_aside(mafid.values[aside])
            if self.observer is not None:
                self.observer.batch(stem, item.name, encoded, kept)
            rows.add(encoded, batch.num_rows)
            return
        joiner = reading.joiner
        assert joiner is not None
        n = batch.num_rows
        ok: np.ndarray | None
        if mafid is None:  # no MAFID column (reported): nothing joins
            values, ok = np.zeros(n, np.int32), np.zeros(n, bool)
        else:
            values, ok = mafid.values, None if mafid.kind is None else mafid.kind == OK
        if keep is not None:
            batch, mafid = _take_rows(batch, mafid, keep)
            values, ok = values[keep], None if ok is None else ok[keep]
        person_key: np.ndarray | None = None
        if stem == "units":
            aside_rows = joiner.units(values, ok)
        else:
            aside_rows, person_key = joiner.persons(values, ok)
            if person_key is not None:
                reading.person_keys.append(person_key)
        if aside_rows is not None:
            batch, mafid = _take_rows(batch, mafid, aside_rows)
        encoded = self._encode(stem, batch, [n for n in self.wanted(stem) if n != "MAFID"])
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
                if self.strict:
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
    def _finish_partition(self, part: PassPart, reading: Reading, last: bool, totals: StageTotals) -> None:
        join = reading.join
        assert join is not None
        # The partition is read: what pyarrow's allocator keeps of the freed batches goes back to
        # the system before the join's temporaries.
        release_memory()
        rows = reading.all_rows()
        geo_clean = rows["geo"].clean
        totals.add(reading.timer)
        if self._layout is not None:
            self._layout.add("units", part.state, join.mafid[join.unit_rows > 0])
            self._layout.add("geo", part.state, join.geo.index.keys)
        if self.observer is not None:
            with totals("validate"):
                self.observer.partition(part, join.geo, join, rows, last)
        # What only validation reads is let go before the tables are counted.
        for r in rows.values():
            r.release_compact()
        reading.geo = None
        del rows
        if self.counting is None or self.result.count_error is not None:
            return
        units, persons = reading.units, reading.persons
        if not (units.clean and persons.clean and geo_clean):
            if self.observer is None:  # pragma: no cover -- strict reading raised already
                raise AssertionError("strict reading kept an invalid value")
            self.result.count_error = InputError(part.label, "", "holds values that break their column's rules")
            return
        structure = None
        if self.observer is None:  # unvalidated: the structure the counting needs, still
            structure = {s: self.files[s].name + (f" ({part.label})" if part.state is not None else "") for s in STEMS}
        try:
            with totals(self.counting.stage):
                counts = count_join(self.counting, join, units.columns, persons.columns, self.states or (),
                                    require_geo=part.label if part.state is not None else None,
                                    structure_names=structure)
        except InputError as exc:
            if self.observer is None:
                raise
            self.result.count_error = exc
            return
        self.result.add_counts(counts)

    # ------------------------------------------------------------ pieces of a pass (cluster)
    # The cluster's tasks (``phsafe.intake.cluster``) run a spilled partition's two halves:
    # each block of a file streamed into the buckets, then each bucket joined, validated and
    # counted -- with the same code as the pass on one machine.
    def spill_block(self, stem: str, reader: SourceReader, spilled: Spilled, *, block: int,
                    aside: AsideMafids | AsideCollector | None = None) -> np.ndarray:
        """Stream one block of one file (``reader``) into ``spilled``'s buckets; the rows
        written to each bucket. For geo, ``aside`` collects the MAFIDs of set-aside rows; for
        units and persons it holds the partition's set-aside MAFIDs."""
        part = self.parts[0]
        reading = Reading(spilled=spilled)
        if stem == "geo":
            reading.aside = aside
        else:
            reading.joiner = aside if isinstance(aside, AsideMafids) else AsideMafids()
        writer = SpillWriter(spilled.folder, stem, spilled.plan, block=block)
        try:
            for item in reader.batches():
                self._batch(part, stem, item, writer, reading)
            writer.close()
        finally:
            writer.abort()
        if isinstance(reading.joiner, AsideMafids):
            for s in ("units", "persons"):
                self.result.set_aside[s] += reading.joiner.set_aside[s]
        if self.observer is not None:
            self.observer.file_read(stem, part, reader, False)
            self.observer.finish_block(stem)
        return writer.rows

    def settle_aside(self, spilled: Spilled, bucket: int, aside: np.ndarray) -> np.ndarray:
        """The set-aside MAFIDs of one bucket (``aside``: MAFIDs of its set-aside geo rows, sorted
        and distinct) less those that also have a kept geo row."""
        if not len(aside):
            return aside
        kept_too: list[np.ndarray] = []
        for values in self.kept_geo_mafids(spilled, bucket):
            pos = np.minimum(np.searchsorted(aside, values), len(aside) - 1)
            kept_too.append(values[aside[pos] == values])
        if not kept_too:
            return aside
        return np.setdiff1d(aside, np.concatenate(kept_too), assume_unique=False)

    def count_bucket(self, spilled: Spilled, bucket: int) -> PassResult:
        """Join, validate and count one bucket of a spilled partition (the last piece for its
        observer: the cross-file frames are submitted)."""
        part, reading = self._load_bucket(self.parts[0], spilled, bucket)
        self._finish_partition(part, reading, True, StageTotals())
        if self.counting is not None and self.result.count_error is None and self.result.counts is None:
            self.result.counts = zero_counts(self.counting, self.states or ())
        return self.result

    def aside_folder(self, part: PassPart) -> None:
        """A state folder outside the state filter: set aside; only its layout is checked (the
        MAFIDs of units and geo, geo's TABBLKST); its persons are never read."""
        self.result.set_aside["persons"] += part.files["persons"].estimated_rows()
        self.result.digests.update(_digests(part))
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
            if mafids and self._layout is not None:
                self._layout.add(stem, part.state, sorted_distinct(np.concatenate(mafids).astype(np.int32)))

    @staticmethod
    def _layout_encode(stem: str, batch: pa.RecordBatch, names: Sequence[str]) -> dict[str, Encoded]:
        out = {}
        for name in names:
            i = batch.schema.get_field_index(name)
            if i >= 0:
                out[name] = encode(COLUMN[stem, name], batch.column(i))
        return out


def _digests(part: PassPart) -> dict[str, str]:
    """The SHA-256 of each of a partition's files (path -> hex), for the ledger's input digests
    (:func:`phsafe.reader.digests_of`); a file that cannot be read is left out (the run then
    hashes the inputs itself, and says what it could not read)."""
    out = {}
    for f in part.files.values():
        for path in f.files:
            try:
                out[str(path)] = file_digest(path)
            except OSError:
                pass
    return out


def _take_rows(batch: pa.RecordBatch, mafid: Encoded | None, rows: np.ndarray) -> tuple[pa.RecordBatch, Encoded | None]:
    return batch.filter(pa.array(rows)), None if mafid is None else mafid.take(rows)


# --------------------------------------------------------------------------------------------
# Pieces of the pass: the code of this pass on a part of the inputs, in a worker process of this
# machine (:class:`~phsafe.intake.workers.WorkerProcesses`) or a task of a cluster
# (:mod:`phsafe.intake.cluster`); each returns a :class:`~phsafe.intake.pieces.Piece`.
# --------------------------------------------------------------------------------------------
def piece_observer(plan: ClusterPlan) -> InputValidation | None:
    return piece_validation(plan.file_names, plan.state_filter) if plan.validate else None


def piece_pass(plan: ClusterPlan, observer: PassObserver | None, part: PassPart | None = None,
          layout: LayoutCollector | None = None, *, strict: bool | None = None) -> InputPass:
    part = part or PassPart("all", None, dict(plan.files))
    return InputPass(part.files, plan.states, observer=observer, counting=plan.counting, parts=[part],
                     memory_limit=1 << 62, layout=layout, strict=strict)


def spilled_of(plan: ClusterPlan, rows: Mapping[str, np.ndarray] | None = None) -> Spilled:
    return Spilled(plan.folder, plan.buckets, dict(rows or {}))


def count_bucket(plan: ClusterPlan, bucket: int, seen: Mapping[str, FileSeen], rows: Mapping[str, np.ndarray]
                 ) -> Piece:
    """Join, validate and count one bucket (see the module docstring).

    Args:
        seen: What the blocks saw of each file (header, columns, every row read).
        rows: Rows written to each bucket, per file (sizes the join's look-ups).
    """
    observer = piece_observer(plan)
    piece = Piece(f"count-range-{bucket}", (2, bucket))
    try:
        if observer is not None:
            observer.assume_files(seen)
        inputs = piece_pass(plan, observer)
        try:
            result = inputs.count_bucket(spilled_of(plan, rows), bucket)
        except InputError as exc:
            piece.error = error_fields(exc)
            return piece
        piece.counts = result.counts if result.count_error is None else None
        piece.count_error = error_fields(result.count_error) if result.count_error is not None else None
        piece.set_aside = dict(result.set_aside)
        piece.validation = observer.piece() if observer is not None else None
        return piece
    finally:
        if observer is not None:
            observer.close()


def count_state(plan: ClusterPlan, index: int, part: PassPart) -> Piece:
    """Read, check, validate, join and count one state's folders (data stored by state), as the
    pass on one machine does: counts, value-free validation tallies and reading problems, and
    the MAFIDs of its units and geo for the layout check across the folders."""
    observer = piece_observer(plan)
    piece = Piece(part.label, (0, index), read_files=True)
    try:
        layout = LayoutCollector()
        inputs = piece_pass(plan, observer, part, layout)
        try:
            result = inputs.run()
        except InputError as exc:
            piece.error = error_fields(exc)
            return piece
        piece.counts = result.counts
        piece.count_error = error_fields(result.count_error) if result.count_error is not None else None
        piece.validation = observer.piece() if observer is not None else None
        piece.set_aside = dict(result.set_aside)
        piece.misplaced = result.misplaced
        piece.problems = {stem: list(p.found) for stem, p in result.problems.items()}
        piece.layout = layout.mafids
        # Hashed here, just read (in the page cache), on this process's core: the ledger's
        # digests need not read the nation's folders again after the pass.
        piece.digests = _digests(part)
        return piece
    finally:
        if observer is not None:
            observer.close()
