"""The input pass cut into tasks for a cluster -- and its order, written once.

For sites that outgrow one machine (the Dask path of ``flows/counting.py``), the pass is cut into
tasks that run anywhere, each reading its share of the inputs once and returning a
:class:`~phsafe.intake.pieces.Piece`; :func:`run_cluster_pass` runs them in their order with any
``submit`` (Prefect's, on a Dask task runner; or a plain call) and merges the pieces
(:func:`~phsafe.intake.pieces.merge`). Every task runs the code of the pass on one machine
(:class:`~phsafe.intake.input_pass.InputPass`), so the cluster's report and counts are those of
the pass on one machine.

**National files** (one CSV or Parquet file per input, not stored by state) are read in *blocks*
(byte ranges of a CSV file, row groups of a Parquet file), each by one task:

1. :func:`plan_cluster` (the flow's process): blocks of each file, MAFID ranges ("buckets") from
   a sample of the files, the spill folder -- a folder of the run's confidential work folder,
   which every worker must reach at the same path;
2. :func:`read_block`, geo's blocks first: each block is parsed, checked and validated by the
   per-file rules (Great Expectations, on the worker), and its compact rows written to their
   buckets (:mod:`phsafe.intake.spill`); geo's blocks also note which MAFIDs the state filter
   sets aside, and :func:`settle_aside` (one task per bucket) takes out those that also have a
   kept geo row -- then units' and persons' blocks set those MAFIDs' rows aside as they stream;
3. :func:`count_bucket` (one task per bucket): the bucket's records joined on MAFID, validated by
   the MAFID and cross-file rules, and counted;
4. :func:`conclude` (the flow's process): the pieces merged, the value-free tallies of every
   piece made into one report.

**Data stored by state**: :func:`count_state`, one task per released state, reads, validates,
joins and counts the state's folders (once: validation and counting from the same read), and
:func:`check_folder`, one task per folder outside the state filter, reads only the MAFIDs of its
units and geo; :func:`conclude` checks the layout across the folders on the MAFIDs they return.

What goes back to the flow's process is small: rule tallies (rule id, verdict, row counts),
value-free reading problems, rows set aside, the distinct combinations the rules are evaluated on
(with the values of irregular fields, so that they are judged as on one machine), and the exact
count cubes with their content digest -- confidential, as on one machine, so the cluster must stay
inside the data's trust boundary. The spill folder is removed by the caller when the pass ends.

A CSV row that holds a quoted line break cannot be cut between blocks (a block starts after a
line break): such a file is reported as malformed, never silently misread.

The same tasks serve the pass on one machine (:class:`~phsafe.intake.workers.WorkerProcesses`):
the MAFID ranges of a spilled national partition (:func:`count_bucket`) and the states of data
stored by state (:func:`count_state`) are counted two at a time in worker processes while the
pass's process merges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from phsafe.config import ConfigFile, as_config_file
from phsafe.counting import Counting, Counts, zero_counts
from phsafe.errors import ConfigError, InputError
from phsafe.intake.input_pass import count_bucket, count_state, piece_observer, piece_pass, plan_parts, spilled_of
from phsafe.intake.parts import STEMS, AsideCollector, Block, ClusterPlan, Layout, LayoutCollector, PassPart
from phsafe.intake.pieces import Piece, error_fields, merge
from phsafe.intake.spill import plan_buckets
from phsafe.memory import BYTES_PER_ROW, MAX_BUCKET_PERSONS
from phsafe.preprocess import AsideMafids, sorted_distinct
from phsafe.reader import SourceReader, csv_blocks, digests_of, locate_inputs, parquet_blocks
from phsafe.tables import TableSpec
from phsafe.validation import (
    FileSeen,
    ValidationReport,
    ValidationSetup,
    report_of_pieces,
)

__all__ = ["BLOCK_BYTES", "BLOCK_ROWS", "Block", "ClusterPlan", "PieceCall", "check_folder", "conclude",
           "count_bucket", "count_state", "plan_cluster", "read_block", "run_cluster_pass", "settle_aside"]

BLOCK_BYTES = 256 << 20
"""CSV bytes a block task reads."""
BLOCK_ROWS = 8_000_000
"""Parquet rows (whole row groups) a block task reads."""
_READ_ORDER = {stem: i for i, stem in enumerate(("geo", "units", "persons"))}


def plan_cluster(config_source: "ConfigFile | Path", data_dir: Path, spill_folder: Path, *, specs: Sequence[TableSpec],
                 key: bytes | None, validate: bool, block_bytes: int = BLOCK_BYTES,
                 bucket_persons: int | None = None) -> ClusterPlan | None:
    """Plan the pass as tasks (see the module docstring), or None when the inputs cannot be cut
    so -- not all present, or a folder not stored by state (the caller reads them with the pass
    on one machine, which reports what is wrong).

    Raises:
        ConfigError: Without validation, the config is invalid (as on one machine).
    """
    try:
        files = locate_inputs(data_dir)
    except InputError:
        return None
    by_state = all(f.partitioned for f in files.values())
    if not by_state and any(f.directory and len(f.files) != 1 for f in files.values()):
        return None
    config_file = as_config_file(config_source)  # the run's one read, passed down (or read once here)
    counting: Counting | None
    state_filter: list[str] | None = None
    if validate:
        setup = ValidationSetup.of(config_file, data_dir)
        states, state_filter = setup.states, setup.state_list
        try:
            counting = Counting.of(config_file.model(), specs, key)
        except ConfigError:
            counting = None  # the report says what is wrong with the config
    else:
        config = config_file.model()
        states = config.states
        counting = Counting.of(config, specs, key)
    names = {stem: f.name for stem, f in files.items()}
    names["config"] = config_file.name
    base = ClusterPlan(config_file, Path(data_dir), files, states, validate, counting, names, state_filter,
                       folder=Path(spill_folder))
    if by_state:
        parts, aside, found = plan_parts(files, states)
        return replace(base, parts=tuple(parts), aside_parts=tuple(aside), states_found=found)
    persons = files["persons"].estimated_rows()
    per_bucket = bucket_persons or MAX_BUCKET_PERSONS
    buckets = plan_buckets(files, max(1, math.ceil(persons / per_bucket)), BYTES_PER_ROW)
    blocks: list[Block] = []
    for stem in _READ_ORDER:
        f = files[stem]
        path = f.files[0]
        spans = csv_blocks(path, block_bytes) if f.format == "csv" else parquet_blocks(path, BLOCK_ROWS)
        blocks.extend(Block(stem, i, span) for i, span in enumerate(spans))
    return replace(base, buckets=buckets, blocks=tuple(blocks))


# --------------------------------------------------------------------------------------------
# Tasks (run on the workers)
# --------------------------------------------------------------------------------------------
def _aside_path(plan: ClusterPlan, bucket: int, block: int | None) -> Path:
    name = f"final-{bucket:05d}.npy" if block is None else f"bucket-{bucket:05d}-block-{block:06d}.npy"
    return plan.aside_folder / name


def read_block(plan: ClusterPlan, block: Block) -> Piece:
    """Read, check, validate and spill one block of one file (see the module docstring)."""
    observer = piece_observer(plan)
    piece = Piece(f"read-{block.label}", (0, _READ_ORDER[block.stem], block.index), stem=block.stem)
    try:
        inputs = piece_pass(plan, observer)
        problems = inputs.problems[block.stem]
        reader = SourceReader(plan.files[block.stem], problems, columns=inputs.wanted(block.stem), block=block.span)
        aside: AsideMafids | AsideCollector
        if block.stem == "geo":
            aside = AsideCollector()
        else:
            aside = AsideMafids()
            finals = sorted(plan.aside_folder.glob("final-*.npy")) if plan.aside_folder.is_dir() else []
            for path in finals:
                aside.add_aside(np.load(path))
        try:
            piece.bucket_rows = inputs.spill_block(block.stem, reader, spilled_of(plan), block=block.index, aside=aside)
        except InputError as exc:
            piece.error = error_fields(exc)
            piece.bucket_rows = np.zeros(plan.buckets.buckets, np.int64)
            return piece
        if isinstance(aside, AsideCollector):
            mafids = aside.distinct()
            if len(mafids):
                piece.aside_found = True
                plan.aside_folder.mkdir(mode=0o700, exist_ok=True)
                which = plan.buckets.bucket_of(mafids)
                for b in np.unique(which).tolist():
                    np.save(_aside_path(plan, b, block.index), mafids[which == b])
        piece.validation = observer.piece() if observer is not None else None
        piece.problems = {block.stem: list(problems.found)}
        piece.set_aside = dict(inputs.result.set_aside)
        return piece
    finally:
        if observer is not None:
            observer.close()


def settle_aside(plan: ClusterPlan, bucket: int) -> Piece:
    """The final set-aside MAFIDs of one bucket, once every geo block is read: those of its
    set-aside geo rows less those that also have a kept geo row (written beside the spill; the
    piece carries nothing)."""
    parts = sorted(plan.aside_folder.glob(f"bucket-{bucket:05d}-block-*.npy"))
    if parts:
        aside = sorted_distinct(np.concatenate([np.load(p) for p in parts]).astype(np.int32))
        final = piece_pass(plan, None).settle_aside(spilled_of(plan), bucket, aside)
        np.save(_aside_path(plan, bucket, None), final)
    return Piece(f"settle-state-filter-{bucket}", (1, bucket))


def check_folder(plan: ClusterPlan, index: int, part: PassPart) -> Piece:
    """A state folder outside the state filter (data stored by state): set aside, only its
    layout read -- the MAFIDs of its units and geo, geo's TABBLKST; its persons are never read."""
    piece = Piece(part.label, (1, index))
    layout = LayoutCollector()
    inputs = piece_pass(plan, None, part, layout, strict=not plan.validate)
    try:
        inputs.aside_folder(part)
    except InputError as exc:
        piece.error = error_fields(exc)
        return piece
    piece.set_aside = dict(inputs.result.set_aside)
    piece.misplaced = inputs.result.misplaced
    piece.layout = layout.mafids
    return piece


# --------------------------------------------------------------------------------------------
# The cluster pass, in its order
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PieceCall:
    """One task of the cluster pass: ``fn(*args)``, named for the operator (``read-geo-1``,
    ``count-range-3``, ``count-06``). Picklable; calling it runs the task."""

    name: str
    fn: Callable[..., Piece]
    args: tuple[Any, ...]

    def __call__(self) -> Piece:
        return self.fn(*self.args)


class PieceFuture(Protocol):
    def result(self) -> Piece: ...


Submit = Callable[[PieceCall], "PieceFuture | Piece"]
"""Runs a task somewhere and returns its future (anything with ``result()``, e.g. Prefect's) --
or, for a plain synchronous ``submit``, the piece itself."""


def _gather(submit: Submit, calls: Sequence[PieceCall]) -> list[Piece]:
    """Submit every call, then wait for each (so they run at once where ``submit`` allows)."""
    futures = [submit(call) for call in calls]
    return [f if isinstance(f, Piece) else f.result() for f in futures]


def run_cluster_pass(plan: ClusterPlan, submit: Submit, *, report_dir: Path | None = None
                     ) -> tuple[Counts | None, ValidationReport | None]:
    """The pass as tasks, in its order (see the module docstring), each submitted with ``submit``.

    National files: geo's blocks; the state filter's set-aside MAFIDs settled per bucket (when
    geo set some aside); units' and persons' blocks; each bucket joined, validated and counted.
    Data stored by state: each state's folders counted, each folder outside the filter checked.
    Then the pieces are merged (:func:`conclude`).

    Returns:
        ``(counts, report)`` as :func:`phsafe.intake.validated_counts` returns them: counts None
        when validation failed; report None without validation.

    Raises:
        InputError: Without validation, the first problem in the pass's order (as on one
            machine); with validation, every rule held but the counting refused a record.
    """
    if plan.by_state:
        pieces = _gather(submit, [PieceCall(f"count-{p.label}", count_state, (plan, i, p))
                                  for i, p in enumerate(plan.parts)] +
                         [PieceCall(f"layout-{p.label}", check_folder, (plan, i, p))
                          for i, p in enumerate(plan.aside_parts)])
        return conclude(plan, pieces, report_dir=report_dir)
    pieces = _gather(submit, [PieceCall(f"read-{b.label}", read_block, (plan, b)) for b in plan.blocks_of("geo")])
    if any(p.aside_found for p in pieces):
        pieces += _gather(submit, [PieceCall(f"settle-state-filter-{k}", settle_aside, (plan, k))
                                   for k in range(plan.buckets.buckets)])
    pieces += _gather(submit, [PieceCall(f"read-{b.label}", read_block, (plan, b))
                               for b in plan.blocks_of("units") + plan.blocks_of("persons")])
    blocks = [p for p in pieces if p.stem is not None]
    if not any(p.error is not None for p in blocks):
        seen, rows = seen_of(blocks), rows_of(blocks, plan.buckets.buckets)
        pieces += _gather(submit, [PieceCall(f"count-range-{k}", count_bucket, (plan, k, seen, rows))
                                   for k in range(plan.buckets.buckets)])
    return conclude(plan, pieces, report_dir=report_dir)


def conclude(plan: ClusterPlan, pieces: Sequence[Piece], *, report_dir: Path | None = None
             ) -> tuple[Counts | None, ValidationReport | None]:
    """The counts and the validation report of the whole pass, from its pieces (in any order).

    Raises:
        InputError: As :func:`run_cluster_pass`.
    """
    layout = Layout(plan.file_names, strict=not plan.validate) if plan.by_state else None
    result = merge(list(pieces), layout=layout)
    if layout is not None:
        result.by_state = True
        result.states_found = plan.states_found or 0
        result.repeated = layout.found()
    counts = None
    if plan.counting is not None and result.count_error is None:
        counts = result.counts if result.counts is not None else zero_counts(plan.counting, plan.states or ())
        counts.input_digests = digests_of(plan.files, result.digests)  # None unless every file was hashed
    if not plan.validate:
        if result.count_error is not None:
            raise result.count_error
        return counts, None
    assert plan.config is not None
    report = report_of_pieces(plan.config, plan.data_dir, result, [p.validation for p in pieces if p.validation],
                              report_dir=report_dir, files_read=plan.by_state)
    if not report.ok:
        return None, report
    if result.count_error is not None:
        raise result.count_error
    return counts, report


def seen_of(blocks: Sequence[Piece]) -> dict[str, FileSeen]:
    """What the blocks saw of each file, merged (for the bucket tasks)."""
    return {stem: FileSeen.merge([b.validation.seen[stem] for b in blocks
                                  if b.stem == stem and b.validation is not None]) for stem in STEMS}


def rows_of(blocks: Sequence[Piece], buckets: int) -> dict[str, np.ndarray]:
    """Rows written to each bucket, per file."""
    out = {stem: np.zeros(buckets, np.int64) for stem in STEMS}
    for b in blocks:
        if b.stem is not None and b.bucket_rows is not None:
            out[b.stem] += b.bucket_rows
    return out


__all__ += ["PieceFuture", "Submit", "rows_of", "seen_of"]
