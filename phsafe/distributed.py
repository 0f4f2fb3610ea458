"""The input pass cut into tasks for a cluster: national files read in blocks, once.

For sites that outgrow one machine (the Dask path of ``flows/counting.py``). A national input --
one CSV or Parquet file per input, not stored by state -- is read on the cluster in *blocks*
(byte ranges of a CSV file, row groups of a Parquet file), each block by one task, and each block
serves both the validation and the counting, exactly as the pass on one machine does
(:class:`phsafe.counting.InputPass`, whose code every task runs):

1. :func:`plan_cluster` (the flow's process): blocks of each file, MAFID ranges ("buckets") from
   a sample of the files, the spill folder -- a folder of the run's confidential work folder,
   which every worker must reach at the same path;
2. :func:`read_block`, geo's blocks first: each block is parsed, checked and validated by the
   per-file rules (Great Expectations, on the worker), and its compact rows written to their
   buckets (:mod:`phsafe.spill`); geo's blocks also note which MAFIDs the state filter sets
   aside, and :func:`settle_aside` (one task per bucket) takes out those that also have a kept
   geo row -- then units' and persons' blocks set those MAFIDs' rows aside as they stream;
3. :func:`count_bucket` (one task per bucket): the bucket's records joined on MAFID, validated by
   the MAFID and cross-file rules, and counted;
4. :func:`merge` (the flow's process): the count cubes added up, the value-free tallies of every
   piece merged into one report.

What goes back to the flow's process is small: rule tallies (rule id, verdict, row counts),
value-free reading problems, rows set aside, the distinct combinations the rules are evaluated on
(with the values of irregular fields, so that they are judged as on one machine), and the exact
count cubes with their content digest -- confidential, as on one machine, so the cluster must stay
inside the data's trust boundary. Every rule's verdict on the whole is the conjunction
of its verdicts on the pieces and its counts are their sums (the suites have no ``mostly``
rule), and every count is decided per MAFID, so the cluster's report and counts are those of the
pass on one machine. The spill folder is removed by the caller when the pass ends.

A CSV row that holds a quoted line break cannot be cut between blocks (a block starts after a
line break): such a file is reported as malformed, never silently misread.

The same tasks serve the pass on one machine (:class:`WorkerProcesses`): the MAFID ranges of a
spilled national partition (:func:`count_bucket`) and the states of data stored by state
(:func:`count_state`) are counted two at a time in worker processes while the pass's process
merges. Pieces validate with an observer of their own that evaluates only the MAFID frames (large)
where they are counted; the distinct combinations of the per-file and cross-file rules go back with
the piece and are evaluated once, with every other piece's, where the report is made -- so a pass
in pieces makes as many Great Expectations evaluations as a pass in one process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phsafe.config import ConfigFile, as_config_file
from phsafe.counting import (
    STEMS,
    AsideCollector,
    Counting,
    Counts,
    InputPass,
    PassPart,
    PassResult,
    Spilled,
    combine_counts,
)
from phsafe.errors import ConfigError, InputError
from phsafe.memory import BYTES_PER_ROW, MAX_BUCKET_PERSONS
from phsafe.preprocess import AsideMafids, sorted_distinct
from phsafe.reader import Problems, ReadProblem, SourceReader, csv_blocks, locate_inputs, parquet_blocks
from phsafe.spill import plan_buckets
from phsafe.tables import TableSpec
from phsafe.workers import Block, ClusterPlan, WorkerProcesses

__all__ = ["Block", "ClusterPlan", "WorkerProcesses", "BlockResult", "BucketResult", "StateResult", "plan_cluster",
           "read_block", "settle_aside", "count_bucket", "count_state", "merge", "seen_of", "rows_of",
           "BLOCK_BYTES", "BLOCK_ROWS"]

BLOCK_BYTES = 256 << 20
"""CSV bytes a block task reads."""
BLOCK_ROWS = 8_000_000
"""Parquet rows (whole row groups) a block task reads."""


def plan_cluster(config_source: "ConfigFile | Path", data_dir: Path, spill_folder: Path, *, specs: Sequence[TableSpec],
                 key: bytes | None, validate: bool, block_bytes: int = BLOCK_BYTES,
                 bucket_persons: int | None = None) -> ClusterPlan | None:
    """Plan the pass as tasks (see the module docstring), or None when the input is not a national
    one -- stored by state, or not all present (the caller's other path reads it).

    Raises:
        ConfigError: Without validation, the config is invalid (as on one machine).
    """
    try:
        files = locate_inputs(data_dir)
    except InputError:
        return None
    if all(f.partitioned for f in files.values()) or any(f.directory and len(f.files) != 1 for f in files.values()):
        return None
    counting: Counting | None = None
    states: tuple[str, ...] | None
    config_file = as_config_file(config_source)  # the run's one read, passed down (or read once here)
    if validate:
        from phsafe.validation._config import state_filter
        from phsafe.validation._inputs import usable_states

        states = usable_states(state_filter(config_file.config, config_file.document))
        try:
            counting = Counting.of(config_file.model(), specs, key)
        except ConfigError:
            counting = None  # the report says what is wrong with the config
    else:
        config = config_file.model()
        states = config.states
        counting = Counting.of(config, specs, key)
    persons = files["persons"].estimated_rows()
    per_bucket = bucket_persons or MAX_BUCKET_PERSONS
    buckets = plan_buckets(files, max(1, math.ceil(persons / per_bucket)), BYTES_PER_ROW)
    blocks: list[Block] = []
    for stem in ("geo", "units", "persons"):
        f = files[stem]
        path = f.files[0]
        spans = csv_blocks(path, block_bytes) if f.format == "csv" else parquet_blocks(path, BLOCK_ROWS)
        blocks.extend(Block(stem, i, span) for i, span in enumerate(spans))
    names = {stem: f.name for stem, f in files.items()}
    names["config"] = config_file.name
    state_list = None
    if validate:
        from phsafe.validation._config import state_filter

        state_list = state_filter(config_file.config, config_file.document)
    return ClusterPlan(config_file, Path(data_dir), files, states, buckets, Path(spill_folder), tuple(blocks),
                       validate, counting, names, state_list)


# --------------------------------------------------------------------------------------------
# Tasks (run on the workers)
# --------------------------------------------------------------------------------------------
@dataclass
class BlockResult:
    """What a block task found (value-free but for the bucket sizes, which stay on the cluster's
    side: they size the bucket tasks' look-ups)."""

    block: Block
    rows: np.ndarray
    problems: list[ReadProblem]
    set_aside: dict[str, int]
    aside: bool = False
    piece: object | None = None
    error: tuple[str, str, str, int | None] | None = None


@dataclass
class BucketResult:
    """What a bucket task found: its exact counts (confidential), its validation piece, the geo
    rows the state filter set aside."""

    bucket: int
    counts: Counts | None
    set_aside: dict[str, int]
    piece: object | None = None
    count_error: tuple[str, str, str, int | None] | None = None
    error: tuple[str, str, str, int | None] | None = None


def _error(exc: InputError) -> tuple[str, str, str, int | None]:
    return exc.file, exc.column, exc.rule, exc.rows


def _observer(plan: ClusterPlan):  # noqa: ANN202 -- phsafe.validation._inputs.InputValidation
    if not plan.validate:
        return None
    from phsafe.validation._inputs import InputValidation
    from phsafe.validation._worker import InProcess

    return InputValidation(dict(plan.file_names), InProcess(), plan.state_filter, missing=set(),
                           defer_combinations=True)


def _pass(plan: ClusterPlan, observer: object | None) -> InputPass:
    part = PassPart("all", None, dict(plan.files))
    return InputPass(plan.files, plan.states, observer=observer, counting=plan.counting,  # type: ignore[arg-type]
                     parts=[part], memory_limit=1 << 62)


def _spilled(plan: ClusterPlan, rows: Mapping[str, np.ndarray] | None = None) -> Spilled:
    return Spilled(plan.folder, plan.buckets, dict(rows or {}))


def _aside_path(plan: ClusterPlan, bucket: int, block: int | None) -> Path:
    name = f"final-{bucket:05d}.npy" if block is None else f"bucket-{bucket:05d}-block-{block:06d}.npy"
    return plan.aside_folder / name


def read_block(plan: ClusterPlan, block: Block) -> BlockResult:
    """Read, check, validate and spill one block of one file (see the module docstring)."""
    observer = _observer(plan)
    try:
        inputs = _pass(plan, observer)
        problems = inputs.problems[block.stem]
        reader = SourceReader(plan.files[block.stem], problems,
                              columns=inputs._wanted(block.stem), block=block.span)  # noqa: SLF001
        aside: AsideMafids | AsideCollector | None
        if block.stem == "geo":
            aside = AsideCollector()
        else:
            aside = AsideMafids()
            finals = sorted(plan.aside_folder.glob("final-*.npy")) if plan.aside_folder.is_dir() else []
            for path in finals:
                aside.add_aside(np.load(path))
        try:
            rows = inputs.spill_block(block.stem, reader, _spilled(plan), block=block.index, aside=aside)
        except InputError as exc:
            return BlockResult(block, np.zeros(plan.buckets.buckets, np.int64), [], {}, error=_error(exc))
        found_aside = False
        if isinstance(aside, AsideCollector):
            mafids = aside.distinct()
            if len(mafids):
                found_aside = True
                plan.aside_folder.mkdir(mode=0o700, exist_ok=True)
                which = plan.buckets.bucket_of(mafids)
                for b in np.unique(which).tolist():
                    np.save(_aside_path(plan, b, block.index), mafids[which == b])
        piece = observer.piece() if observer is not None else None
        return BlockResult(block, rows, list(problems.found), dict(inputs.result.set_aside), found_aside, piece)
    finally:
        if observer is not None:
            observer.close()


def settle_aside(plan: ClusterPlan, bucket: int) -> None:
    """The final set-aside MAFIDs of one bucket, once every geo block is read: those of its
    set-aside geo rows less those that also have a kept geo row."""
    parts = sorted(plan.aside_folder.glob(f"bucket-{bucket:05d}-block-*.npy"))
    if not parts:
        return
    aside = sorted_distinct(np.concatenate([np.load(p) for p in parts]).astype(np.int32))
    final = _pass(plan, None).settle_aside(_spilled(plan), bucket, aside)
    np.save(_aside_path(plan, bucket, None), final)


def count_bucket(plan: ClusterPlan, bucket: int, seen: Mapping[str, object], rows: Mapping[str, np.ndarray]
                 ) -> BucketResult:
    """Join, validate and count one bucket (see the module docstring).

    Args:
        seen: What the blocks saw of each file (:class:`phsafe.validation._inputs.FileSeen`).
        rows: Rows written to each bucket, per file (sizes the join's look-ups).
    """
    observer = _observer(plan)
    try:
        if observer is not None:
            observer.assume_files(seen)
        inputs = _pass(plan, observer)
        try:
            result = inputs.count_bucket(_spilled(plan, rows), bucket)
        except InputError as exc:
            return BucketResult(bucket, None, {}, error=_error(exc))
        piece = observer.piece() if observer is not None else None
        return BucketResult(bucket, result.counts, dict(result.set_aside), piece,
                            _error(result.count_error) if result.count_error is not None else None)
    finally:
        if observer is not None:
            observer.close()


# --------------------------------------------------------------------------------------------
# The flow's side
# --------------------------------------------------------------------------------------------
def merge(plan: ClusterPlan, blocks: Sequence[BlockResult], buckets: Sequence[BucketResult], *,
          report_dir: Path | None = None):  # noqa: ANN201 -- (Counts | None, ValidationReport | None)
    """The counts and the validation report of the whole pass, from its pieces.

    Returns:
        ``(counts, report)`` as :func:`phsafe.counting.validated_counts` returns them: counts
        None when validation failed; report None without validation.

    Raises:
        InputError: Without validation, the first problem in file order (as on one machine);
            with validation, every rule held but the counting refused a record.
    """
    order = {stem: i for i, stem in enumerate(("geo", "units", "persons"))}
    for b in sorted(blocks, key=lambda r: (order[r.block.stem], r.block.index)):
        if b.error is not None:
            raise InputError(*b.error)
    for k in sorted(buckets, key=lambda r: r.bucket):
        if k.error is not None:
            raise InputError(*k.error)
    result = PassResult()
    result.problems = {stem: Problems(strict=False) for stem in STEMS}
    for b in sorted(blocks, key=lambda r: (order[r.block.stem], r.block.index)):
        result.problems[b.block.stem].found.extend(b.problems)
        for stem, n in b.set_aside.items():
            result.set_aside[stem] += n
    for k in buckets:
        for stem, n in k.set_aside.items():
            result.set_aside[stem] += n
    count_error = next((k.count_error for k in sorted(buckets, key=lambda r: r.bucket) if k.count_error), None)
    counts = None
    if plan.counting is not None and count_error is None:
        counts = combine_counts([k.counts for k in buckets if k.counts is not None])
    if not plan.validate:
        if count_error is not None:
            raise InputError(*count_error)
        return counts, None
    from phsafe.validation._inputs import report_of_pieces

    pieces = [r.piece for r in (*blocks, *buckets) if r.piece is not None]
    report = report_of_pieces(plan.config, plan.data_dir, result, pieces, report_dir=report_dir)  # type: ignore[arg-type]
    if not report.ok:
        return None, report
    if count_error is not None:
        raise InputError(*count_error)
    return counts, report


def seen_of(blocks: Sequence[BlockResult]) -> dict[str, object]:
    """What the blocks saw of each file, merged (for the bucket tasks)."""
    from phsafe.validation._inputs import FileSeen

    out: dict[str, object] = {}
    for stem in STEMS:
        pieces = [b.piece.seen[stem] for b in blocks if b.block.stem == stem and b.piece is not None]  # type: ignore[attr-defined]
        out[stem] = FileSeen.merge(pieces)
    return out


def rows_of(blocks: Sequence[BlockResult], buckets: int) -> dict[str, np.ndarray]:
    """Rows written to each bucket, per file."""
    out = {stem: np.zeros(buckets, np.int64) for stem in STEMS}
    for b in blocks:
        out[b.block.stem] += b.rows
    return out


# --------------------------------------------------------------------------------------------
# Worker processes on this machine
# --------------------------------------------------------------------------------------------
@dataclass
class StateResult:
    """What counting one state's folders in a worker process found (see :func:`count_state`)."""

    counts: Counts | None
    piece: object | None
    set_aside: dict[str, int]
    misplaced: int
    problems: dict[str, list[ReadProblem]]
    layout: dict[str, list[np.ndarray]]
    count_error: tuple[str, str, str, int | None] | None = None
    error: tuple[str, str, str, int | None] | None = None


class _LayoutCollector:
    """Stands for the pass's layout check in a worker: keeps each file's MAFIDs for the process
    that checks the layout across the state folders."""

    def __init__(self) -> None:
        self.mafids: dict[str, list[np.ndarray]] = {"units": [], "geo": []}
        self.repeated: dict[str, int] = {}

    def add(self, stem: str, mafids: np.ndarray) -> int:
        self.mafids[stem].append(np.asarray(mafids, dtype=np.int32))
        return 0


def count_state(plan: ClusterPlan, part: PassPart) -> StateResult:
    """Read, check, validate, join and count one state's folders (data stored by state), as the
    pass on one machine does, and return what the pass's process needs: counts, value-free
    validation tallies and reading problems, and the MAFIDs of its units and geo for the layout
    check across the folders."""
    observer = _observer(plan)
    try:
        inputs = InputPass(part.files, plan.states, observer=observer, counting=plan.counting,  # type: ignore[arg-type]
                           parts=[part], memory_limit=1 << 62)
        layout = _LayoutCollector()
        inputs._layout = layout  # type: ignore[assignment]  # noqa: SLF001
        try:
            result = inputs.run()
        except InputError as exc:
            return StateResult(None, None, {}, 0, {}, {}, error=_error(exc))
        piece = observer.piece() if observer is not None else None
        return StateResult(result.counts, piece, dict(result.set_aside), result.misplaced,
                           {stem: list(p.found) for stem, p in result.problems.items()}, layout.mafids,
                           _error(result.count_error) if result.count_error is not None else None)
    finally:
        if observer is not None:
            observer.close()


def prewarm() -> None:
    """Import what counting with validation needs (Great Expectations: seconds), before the first
    range arrives."""
    from phsafe.validation._gx import import_gx

    import_gx()


_JOBS = {"count_bucket": count_bucket, "count_state": count_state, "read_block": read_block,
         "settle_aside": settle_aside, "prewarm": prewarm}


def main() -> int:
    """A worker process: run jobs until standard input ends."""
    import os
    import pickle
    import sys

    channel = os.fdopen(os.dup(1), "wb")  # results only; anything else printed goes nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- for the life of the process
    # This file runs as __main__; the jobs' classes are those of the package's module.
    from phsafe.distributed import _JOBS as jobs_by_name

    jobs = sys.stdin.buffer
    while True:
        try:
            _, name, args = pickle.load(jobs)
        except EOFError:
            return 0
        try:
            answer = (jobs_by_name[name](*args), None)
        except Exception as exc:  # noqa: BLE001 -- its class only: the message may quote data
            answer = (None, type(exc).__name__)
        pickle.dump(answer, channel, protocol=pickle.HIGHEST_PROTOCOL)
        channel.flush()


if __name__ == "__main__":
    import sys

    sys.exit(main())
