"""Distinct combinations of values with their number of rows: what the suites are evaluated on.

A rule's verdict on a row depends only on the values of the columns the rule reads, so a suite's
rules are grouped by the columns they read (:func:`rule_groups`) and each group is evaluated on
the *distinct combinations* of its columns, each with its number of rows -- its weight. Great
Expectations then judges every combination once, and the number of failing rows is the sum of
the weights of the failing combinations (see :func:`phsafe.validation._gx.evaluate`): exact, with
a frame of a few hundred rows where the file has millions (a million persons rows hold some
thousand distinct (QAGE, RELSHIP) pairs).

Values are counted as non-negative integer *classes* (see :class:`phsafe.reader.ClassBook`): two
rows have the same class exactly when validation sees the same value in them. The groups of a
file are counted together where their columns' combinations fit in a dense array of bins
(:func:`joints`): one pass over a batch's rows counts several groups, whose own combinations are
the sums over the other columns at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import numpy.typing as npt

from phsafe.validation._suites import Rule, Suite

DENSE_MAX_BINS = 1 << 22
"""Combinations are counted in a dense array of bins up to this many possible combinations (one
pass over the rows); beyond, by sorting their packed keys."""
_PACK_LIMIT = 1 << 62
_DENSE_ALWAYS = 1 << 16  # bins counted densely whatever the rows (a few hundred kB)

Values = tuple[np.ndarray, int]
"""A column's classes as (array, offset): the class of row ``i`` is ``array[i] + offset``
(compact values are their classes shifted: integers' classes are ``value + 1``)."""


def _pack(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int], list[int]] | None:
    """Each row's combination as one integer (mixed radix over each column's own range), with
    the columns' minimums and radices; None if the radices overflow 62 bits."""
    mins, radices = [], []
    total = 1
    for c in columns:
        lo, hi = int(c.min()), int(c.max())
        mins.append(lo)
        radices.append(hi - lo + 1)
        total *= hi - lo + 1
    if total >= _PACK_LIMIT:
        return None
    dtype = np.uint32 if total < (1 << 32) else np.int64
    # sum((c_i - min_i) * stride_i) = sum(c_i * stride_i) - sum(min_i * stride_i): the columns are
    # folded in as they are and the constant taken off once (modular arithmetic: exact, since the
    # result is in range).
    key = columns[0].astype(dtype)
    offset = mins[0]
    for c, lo, r in zip(columns[1:], mins[1:], radices[1:]):
        key *= dtype(r)
        if c.dtype.kind in "iu" and c.dtype.itemsize < np.dtype(dtype).itemsize and (
                c.dtype.kind == "u" or dtype is np.int64):
            key += c
        else:
            key += c.astype(dtype)
        offset = offset * r + lo
    if offset:
        bits = 8 * np.dtype(dtype).itemsize
        constant = offset % (1 << bits)
        if dtype is np.int64 and constant >= 1 << 63:
            constant -= 1 << 64
        key -= dtype(constant)
    return key, mins, radices


def _unpack(key: np.ndarray, mins: list[int], radices: list[int]) -> list[npt.NDArray[np.int64]]:
    out: list[npt.NDArray[np.int64]] = []
    key = key.astype(np.int64)
    for lo, r in zip(reversed(mins), reversed(radices)):
        out.append(key % r + lo)
        key //= r
    return out[::-1]


def distinct(columns: Sequence[np.ndarray], weights: np.ndarray | None = None
             ) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    """The distinct combinations of ``columns`` (integers, one value per row) and the number of
    rows -- or the sum of ``weights`` -- of each.

    Returns:
        (one int64 array per column of the distinct combinations, their weights).
    """
    n = len(columns[0]) if columns else 0
    if n == 0:
        return [np.empty(0, np.int64) for _ in columns], np.empty(0, np.int64)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    packed = _pack(columns)
    if packed is None:
        # Some class is far from the others (e.g. an irregular number): dense ids per column.
        uniques, dense = zip(*(np.unique(c, return_inverse=True) for c in columns))
        combos, counts = distinct(list(dense), weights)
        return [u[d] for u, d in zip(uniques, combos)], counts
    key, mins, radices = packed
    total = int(np.prod(radices, dtype=object))
    if total <= DENSE_MAX_BINS and (total <= _DENSE_ALWAYS or total <= 16 * n):
        binned = np.bincount(key, weights=w, minlength=total)
        keys = np.flatnonzero(binned)
        counts = binned[keys]
    else:
        # A hash table, then its (few) distinct keys sorted: several times faster than sorting
        # every row's key (np.unique), for the same sorted result.
        codes, uniques = pd.factorize(key, sort=False)
        counts = np.bincount(codes, weights=w, minlength=len(uniques))
        order = np.argsort(uniques)
        keys, counts = np.asarray(uniques)[order], counts[order]
    counts = np.rint(counts).astype(np.int64) if w is not None else counts.astype(np.int64)
    return _unpack(keys, mins, radices), counts


@dataclass
class ComboCounter:
    """Adds up the distinct combinations of some columns (their classes) over many batches."""

    columns: tuple[str, ...]
    _parts: list[tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]] = field(default_factory=list)
    _rows: int = 0

    def add(self, values: Sequence[Values], weights: np.ndarray | None = None) -> None:
        """Add rows: each column's classes as ``(array, offset)``."""
        if not len(values[0][0]):
            return
        combos, counts = distinct([a for a, _ in values], weights)
        for combo, (_, offset) in zip(combos, values):
            combo += offset
        self._parts.append((combos, counts))
        self._rows += len(counts)
        if len(self._parts) > 32 or self._rows > 4_000_000:
            self._parts = [self._merged()]
            self._rows = len(self._parts[0][1])

    def _merged(self) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
        if not self._parts:
            return [np.empty(0, np.int64) for _ in self.columns], np.empty(0, np.int64)
        if len(self._parts) == 1:
            return self._parts[0]
        columns = [np.concatenate([p[0][i] for p in self._parts]) for i in range(len(self.columns))]
        return distinct(columns, np.concatenate([p[1] for p in self._parts]))

    def result(self, columns: Sequence[str] | None = None
               ) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
        """The distinct combinations so far (of ``columns``, a subset: summed over the others)
        and their weights."""
        merged = self._merged()
        self._parts = [merged] if len(merged[1]) else []
        if columns is None or tuple(columns) == self.columns:
            return merged
        combos, counts = merged
        if not len(counts):
            return [np.empty(0, np.int64) for _ in columns], counts
        return distinct([combos[self.columns.index(c)] for c in columns], counts)


@dataclass(frozen=True)
class RuleGroup:
    """The rules of one frame of a suite that read the same columns.

    Attributes:
        suite: Suite name.
        frame: Frame name.
        columns: The columns the rules read, in the frame's order.
        rule_ids: The rules, in suite order.
    """

    suite: str
    frame: str
    columns: tuple[str, ...]
    rule_ids: tuple[str, ...]


def rule_groups(suite: Suite, frame: str, column_order: Sequence[str], *,
                exclude: frozenset[str] = frozenset()) -> list[RuleGroup]:
    """The rules of ``frame`` (but ``exclude``), grouped by the columns they read, in suite order.

    Args:
        column_order: The frame's columns, in order (a group lists its columns in this order).
    """
    groups: dict[tuple[str, ...], list[Rule]] = {}
    position = {name: i for i, name in enumerate(column_order)}
    for rule in suite.rules_for(frame):
        if rule.rule_id in exclude:
            continue
        columns = tuple(sorted(rule.referenced_columns(), key=lambda c: (position.get(c, len(position)), c)))
        groups.setdefault(columns, []).append(rule)
    return [RuleGroup(suite.name, frame, columns, tuple(r.rule_id for r in rules))
            for columns, rules in groups.items()]


def joints(groups: Sequence[RuleGroup], sizes: Mapping[str, int], column_order: Sequence[str]
           ) -> list[tuple[str, ...]]:
    """Sets of columns to count together so that every group's columns are in one of them.

    Greedy, largest groups first: a group joins the first set whose combinations, with the
    group's columns added, still fit in :data:`DENSE_MAX_BINS` (``sizes``: how many classes a
    valid column has); otherwise it starts a set of its own.
    """
    position = {name: i for i, name in enumerate(column_order)}

    def product(columns: set[str]) -> int:
        out = 1
        for c in columns:
            out *= sizes[c]
        return out

    sets: list[set[str]] = []
    for group in sorted(groups, key=lambda g: (-product(set(g.columns)), g.columns)):
        columns = set(group.columns)
        for s in sets:
            if columns <= s or product(s | columns) <= DENSE_MAX_BINS:
                s |= columns
                break
        else:
            sets.append(columns)
    return [tuple(sorted(s, key=lambda c: position.get(c, len(position)))) for s in sets]
