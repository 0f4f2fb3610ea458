"""A piece of the input pass done elsewhere -- and the one place pieces are merged.

A pass can be cut into pieces done in other processes: the worker processes of this machine
(:class:`~phsafe.intake.workers.WorkerProcesses`) or the tasks of a cluster
(:func:`~phsafe.intake.cluster.run_cluster_pass`). Each piece -- a block of a national file read
and spilled, a MAFID range joined and counted, a state's folders read and counted -- returns a
:class:`Piece`, and :func:`merge` adds pieces up into the pass's :class:`~phsafe.intake.parts.PassResult`:
counts summed, the validation's value-free tallies absorbed, reading problems and rows set aside
gathered, the layout across state folders checked.

Every count is decided per MAFID and every rule's verdict on the whole is the conjunction of its
verdicts on the pieces (its counts their sums; the suites have no ``mostly`` rule), so the merge
of a pass's pieces, in any order, is what the pass finds in one process. What a piece carries is
value-free but for its exact count cubes and, with validation, the distinct combinations it
counted -- confidential, as on one machine: pieces stay inside the data's trust boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from phsafe.counting import Counts
from phsafe.errors import InputError
from phsafe.intake.parts import STEMS, Layout, PassObserver, PassResult
from phsafe.reader import Problems, ReadProblem
from phsafe.validation import ValidationPiece

__all__ = ["ErrorFields", "Piece", "error_fields", "merge"]

ErrorFields = tuple[str, str, str, "int | None"]
"""An :class:`~phsafe.errors.InputError` as its file, column, rule and rows (it pickles as such)."""


def error_fields(exc: InputError) -> ErrorFields:
    return exc.file, exc.column, exc.rule, exc.rows


@dataclass
class Piece:
    """What one piece of a pass found.

    Attributes:
        label: Public name (``"geo-3"``, ``"range 4"``, ``"state 06"``).
        order: Where the piece's rows are in the order the pass reads them: problems are
            reported, and the first error raised, in that order whatever the order of arrival.
        stem: The file a block piece read (None for other pieces).
        counts: Exact count cubes and content digest (counting pieces).
        count_error: Why the counting refused the piece's records (with validation).
        error: The input problem that stopped the piece (without validation: the pass stops).
        validation: What the piece's validation found (with validation).
        read_files: The piece read whole files (a state's folders): what its validation saw of
            them -- header, columns, every row read -- counts as the file's.
        problems: Value-free reading problems, per file.
        set_aside: Rows the state filter set aside, per file.
        misplaced: Geo rows stored under another state's folder.
        layout: The distinct MAFIDs of units and geo of a state's folders (the layout check
            across folders).
        bucket_rows: Rows a block wrote to each bucket (sizes the buckets' look-ups).
        aside_found: A geo block found rows the state filter sets aside.
        digests: The SHA-256 of the files the piece read (path -> hex; a state's folders).
    """

    label: str
    order: tuple[int, ...]
    stem: str | None = None
    counts: Counts | None = None
    count_error: ErrorFields | None = None
    error: ErrorFields | None = None
    validation: ValidationPiece | None = None
    read_files: bool = False
    problems: dict[str, list[ReadProblem]] = field(default_factory=dict)
    set_aside: dict[str, int] = field(default_factory=dict)
    misplaced: int = 0
    layout: dict[str, list[np.ndarray]] = field(default_factory=dict)
    bucket_rows: np.ndarray | None = None
    aside_found: bool = False
    digests: dict[str, str] = field(default_factory=dict)


def merge(pieces: Iterable[Piece], *, result: PassResult | None = None, validation: PassObserver | None = None,
          layout: Layout | None = None, each: Callable[[Piece], None] | None = None) -> PassResult:
    """Add pieces up into a pass's result.

    Pieces given as a sequence are merged in the pass's order (:attr:`Piece.order`); pieces given
    as an iterator (a stream of results) are merged as they come, and must come in that order.

    Args:
        result: The pass's result to add to (default: a new one).
        validation: The pass's validation, which absorbs each piece's tallies.
        layout: The layout check across state folders, fed each piece's MAFIDs.
        each: Called with each piece once merged (progress).

    Raises:
        InputError: A piece stopped on an input problem (the first in the pass's order).
    """
    if result is None:
        result = PassResult(problems={stem: Problems(strict=False) for stem in STEMS})
    ordered = sorted(pieces, key=lambda p: p.order) if isinstance(pieces, Sequence) else pieces
    for piece in ordered:
        if piece.error is not None:
            raise InputError(*piece.error)
        for stem, found in piece.problems.items():
            result.problems[stem].found.extend(found)
        result.misplaced += piece.misplaced
        result.digests.update(piece.digests)
        for stem, n in piece.set_aside.items():
            result.set_aside[stem] += n
        if layout is not None:
            for stem in ("units", "geo"):
                for mafids in piece.layout.get(stem, ()):
                    layout.add(stem, piece.label, mafids)
        if validation is not None and piece.validation is not None:
            validation.absorb(piece.validation, files_read=piece.read_files)
        if piece.count_error is not None and result.count_error is None:
            result.count_error = InputError(*piece.count_error)
            result.counts = None  # the records cannot be counted: no count is kept
        if piece.counts is not None and result.count_error is None:
            result.add_counts(piece.counts)
        if each is not None:
            each(piece)
    return result
