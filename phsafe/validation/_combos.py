"""Distinct combinations of values with their number of rows: what the suites are evaluated on.

A rule's verdict on a row depends only on the values of the columns the rule reads, so a suite's
rules are grouped by the columns they read (:func:`rule_groups`) and each group is evaluated on
the *distinct combinations* of its columns, each with its number of rows -- its weight. Great
Expectations then judges every combination once, and the number of failing rows is the sum of
the weights of the failing combinations (see :func:`phsafe.validation._gx.evaluate`): exact, with
a frame of a few hundred rows where the file has millions (a million persons rows hold some
thousand distinct (QAGE, RELSHIP) pairs).

Values are counted as non-negative integer *classes* (see :class:`phsafe.reader.ClassBook`): two
rows have the same class exactly when validation sees the same value in them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from phsafe.validation._suites import Rule, Suite

DENSE_MAX_BINS = 1 << 22
"""Combinations are counted in a dense array of bins up to this many possible combinations (one
pass over the rows); beyond, by sorting their packed keys."""
_PACK_LIMIT = 1 << 62


def _pack(columns: Sequence[npt.NDArray[np.int64]]) -> tuple[npt.NDArray[np.int64], list[int]] | None:
    """Each row's combination as one int64 (mixed radix), or None if the radices overflow."""
    radices = [int(c.max()) + 1 if len(c) else 1 for c in columns]
    total = 1
    for r in radices:
        total *= r
    if total >= _PACK_LIMIT:
        return None
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for c, r in zip(columns, radices):
        key *= r
        key += c
    return key, radices


def _unpack(key: npt.NDArray[np.int64], radices: list[int]) -> list[npt.NDArray[np.int64]]:
    out: list[npt.NDArray[np.int64]] = []
    key = key.copy()
    for r in reversed(radices):
        out.append(key % r)
        key //= r
    return out[::-1]


def distinct(columns: Sequence[npt.NDArray[np.integer]], weights: npt.NDArray[np.integer] | None = None
             ) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    """The distinct combinations of ``columns`` (non-negative integers, one value per row) and
    the number of rows -- or the sum of ``weights`` -- of each.

    Returns:
        (one array per column of the distinct combinations, their weights), combinations sorted.
    """
    cols = [np.asarray(c, dtype=np.int64) for c in columns]
    n = len(cols[0]) if cols else 0
    if n == 0:
        return [np.empty(0, np.int64) for _ in cols], np.empty(0, np.int64)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    packed = _pack(cols)
    if packed is None:
        # Some class is large (e.g. an irregular number): count on dense ids of each column.
        uniques, dense = zip(*(np.unique(c, return_inverse=True) for c in cols))
        combos, counts = distinct(list(dense), weights)
        return [u[d] for u, d in zip(uniques, combos)], counts
    key, radices = packed
    total = 1
    for r in radices:
        total *= r
    if total <= DENSE_MAX_BINS:
        binned = np.bincount(key, weights=w, minlength=total)
        present = np.flatnonzero(binned)
        counts = binned[present]
        keys = present.astype(np.int64)
    else:
        keys, inverse = np.unique(key, return_inverse=True)
        counts = np.bincount(inverse, weights=w, minlength=len(keys))
    return _unpack(keys, radices), np.rint(counts).astype(np.int64) if w is not None else counts.astype(np.int64)


@dataclass
class ComboCounter:
    """Adds up the distinct combinations of some columns over many batches."""

    n_columns: int
    _parts: list[tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]] = field(default_factory=list)
    _pending_rows: int = 0

    def add(self, columns: Sequence[npt.NDArray[np.integer]], weights: npt.NDArray[np.integer] | None = None) -> None:
        if not len(columns[0]):
            return
        combos, counts = distinct(columns, weights)
        self._parts.append((combos, counts))
        self._pending_rows += len(counts)
        if len(self._parts) > 32 or self._pending_rows > 4_000_000:
            self._parts = [self._merged()]
            self._pending_rows = len(self._parts[0][1])

    def add_counted(self, columns: Sequence[npt.NDArray[np.integer]], counts: npt.NDArray[np.integer]) -> None:
        """Add combinations already counted (e.g. per MAFID key)."""
        self.add(columns, counts)

    def _merged(self) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
        if not self._parts:
            return [np.empty(0, np.int64) for _ in range(self.n_columns)], np.empty(0, np.int64)
        if len(self._parts) == 1:
            return self._parts[0]
        columns = [np.concatenate([p[0][i] for p in self._parts]) for i in range(self.n_columns)]
        return distinct(columns, np.concatenate([p[1] for p in self._parts]))

    def result(self) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
        """The distinct combinations so far and their weights."""
        merged = self._merged()
        self._parts = [merged] if len(merged[1]) else []
        return merged

    def merge(self, other: "ComboCounter") -> None:
        combos, counts = other.result()
        if len(counts):
            self.add(combos, counts)

    @property
    def empty(self) -> bool:
        return not self._parts


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
