"""Truncate-and-join (the PHSafe paper's Algorithm 3; spec §5).

For one table, on one partition:

1. filter persons and units by the table's universe;
2. drop every unit whose MAFID occurs more than once among the in-universe units;
3. keep at most tau persons per MAFID: the tau with the smallest keyed hash (SipHash-2-4 under
   a fresh per-run key) of the record's content, a tie of hashes broken by the content itself.
   The choice depends only on the record and the key -- not on file order, not on any other
   record, not on an attribute such as age;
4. inner-join persons to units on MAFID.

Why the sensitivity is 2*tau + 2 (paper, Lemma 6): adding or removing one person changes the
truncated person frame by at most 2 rows (the person, and one person pushed into or out of the
kept tau of that MAFID) and the unit frame by at most 2 rows (the household's unit record is
replaced: one removal, one addition). After truncation a MAFID has at most tau persons and one
unit, so the join changes by at most tau * 2 (unit side) + 1 * 2 (person side) = 2*tau + 2 rows.
That bound on rows is the production calibration (config ``"sensitivity": "paper"``); the
exact L1 and L2 sensitivities of each table's counts are smaller and proven in
``docs/sensitivity.md`` (:mod:`phsafe.sensitivity`, config ``"sensitivity": "exact"``).

Steps 3 and 4 commute here (both key on MAFID), so the join is done first: persons of MAFIDs with
no unique in-universe unit are dropped before counting, which selects the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phsafe._siphash import siphash24_u64
from phsafe.reader import Columns

TRUNCATION_KEY_BYTES = 16


@dataclass
class Joined:
    """Rows of a person table after truncate-and-join (or of a unit table after its filter).

    Attributes:
        person_rows: Row of each joined record in the partition's persons (None for unit tables).
        unit_rows: Row of each record's unit in the partition's units.
    """

    person_rows: npt.NDArray[np.int64] | None
    unit_rows: npt.NDArray[np.int64]


def unique_units(
    unit_group: npt.NDArray[np.int64], unit_mask: npt.NDArray[np.bool_], n_groups: int
) -> npt.NDArray[np.int64]:
    """For each MAFID group, its single in-universe unit row, or -1 if it has none or several."""
    rows = np.flatnonzero(unit_mask)
    groups = np.take(unit_group, rows)
    count = np.bincount(groups, minlength=n_groups)
    row_of_group = np.full(n_groups, -1, dtype=np.int64)
    row_of_group[groups] = rows
    row_of_group[count != 1] = -1
    return row_of_group


def record_words(persons: Columns, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """Pack each person record's content into one 64-bit word (the hashed message)."""
    w = np.take(persons["MAFID"], rows).astype(np.uint64)
    for name, bits in (("QAGE", 7), ("CENHISP", 2), ("CENRACE", 6), ("RELSHIP", 6), ("RTYPE", 3)):
        w = (w << np.uint64(bits)) | np.take(persons[name], rows).astype(np.uint64)
    return w


def truncate(
    unit_rows: npt.NDArray[np.int64],
    persons: Columns,
    person_rows: npt.NDArray[np.int64],
    tau: int,
    key: bytes,
) -> npt.NDArray[np.bool_]:
    """Which of the joined persons to keep: at most ``tau`` per unit, by keyed hash.

    Args:
        unit_rows: Unit of each candidate person.
        persons: The partition's person columns (for the record content).
        person_rows: Row of each candidate person in ``persons``.
        tau: Truncation threshold.
        key: Per-run SipHash key.

    Returns:
        A mask over the candidates.
    """
    if tau < 1:
        raise ValueError("tau must be at least 1")
    keep = np.ones(len(unit_rows), dtype=bool)
    if len(unit_rows) == 0:
        return keep
    size = np.bincount(unit_rows)
    over = np.flatnonzero(np.take(size, unit_rows) > tau)
    if len(over) == 0:
        return keep
    words = record_words(persons, np.take(person_rows, over))
    h = siphash24_u64(key, words)
    # By unit, then by keyed hash; a tie of hashes (of different records) is broken by the
    # record's content, never by its position in the file. Identical records are interchangeable.
    units_over = np.take(unit_rows, over)
    order = np.lexsort((words, h, units_over))
    u_sorted = np.take(units_over, order)
    starts = np.ones(len(u_sorted), dtype=bool)
    starts[1:] = u_sorted[1:] != u_sorted[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(len(u_sorted)), 0))
    rank = np.arange(len(u_sorted)) - first
    keep[np.take(over, np.compress(rank >= tau, order))] = False
    return keep
