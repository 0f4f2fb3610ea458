"""Preprocessing: state filter, geography and group quarters (spec §4), and state partitions.

* Geo rows are kept when their TABBLKST is in ``state_filter``; a MAFID listed more than once in
  geo is ambiguous (its state is not known) and is dropped.
* A unit, and the persons in it, is tabulated only when its geo row has RTYPE 2: GQ facilities'
  geo rows (RTYPE 4) are dropped first, so GQ records never reach a table even when the unit file
  disagrees.
* Units keep every row whose MAFID has a kept geo row -- duplicates included: whether a MAFID is
  unique is decided per table *after* its universe filter (Algorithm 3, steps 1-2), see
  :mod:`phsafe.truncation`.

Memory: records stay in file order in their compact columns; preprocessing only adds one byte
per record, its state (or "not tabulated"). :func:`partitions` then cuts the tabulated records
into MAFID ranges and builds, per partition, the MAFID grouping that truncate-join-count needs.
Truncation and unit uniqueness are decided per MAFID and counts add up, so any MAFID-disjoint
split gives the same exact counts -- cutting by MAFID range (rather than by state) bounds the
temporaries of the data path by the partition size even for the largest state. Count vectors are
kept per state; the nation's vector is the sum of the exact state vectors before any noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import numpy.typing as npt
import pandas as pd

from phsafe.reader import Columns, InputTables
from phsafe.schema import MAFID_MAX, MAFID_MIN, RTYPE_UNIT_HU

NOT_TABULATED = np.uint8(255)
_CHUNK = 8_000_000  # rows per step of the MAFID look-ups, to bound temporaries


@dataclass
class PreparedData:
    """Records in file order, each tagged with the index of its state.

    Attributes:
        states: Released state codes (sorted); state indices point into it.
        units: Unit columns, file order.
        unit_state: State index of each unit, or ``NOT_TABULATED``.
        persons: Person columns, file order.
        person_state: State index of each person's MAFID, or ``NOT_TABULATED``.
    """

    states: tuple[str, ...]
    units: Columns
    unit_state: npt.NDArray[np.uint8]
    persons: Columns
    person_state: npt.NDArray[np.uint8]


@dataclass
class Partition:
    """The records of one MAFID range, grouped by MAFID.

    Attributes:
        units: Unit columns, rows sorted by MAFID.
        unit_state: State index (into the run's states) of each unit row.
        unit_group: MAFID group of each unit row (rows sharing a MAFID share a group).
        persons: Person columns of persons whose MAFID has a unit in the partition.
        person_group: MAFID group of each person.
        n_groups: Number of MAFID groups.
    """

    units: Columns
    unit_state: npt.NDArray[np.uint8]
    unit_group: npt.NDArray[np.int64]
    persons: Columns
    person_group: npt.NDArray[np.int64]
    n_groups: int


def _take(cols: Columns, index: npt.NDArray[np.integer] | slice) -> Columns:
    return {k: v[index] for k, v in cols.items()}


def _duplicated(values: npt.NDArray[np.integer]) -> npt.NDArray[np.bool_]:
    """True where a value occurs more than once."""
    order = np.argsort(values, kind="stable")
    s = values[order]
    dup_sorted = np.zeros(len(s), dtype=bool)
    if len(s) > 1:
        eq = s[1:] == s[:-1]
        dup_sorted[1:] |= eq
        dup_sorted[:-1] |= eq
    out = np.empty(len(s), dtype=bool)
    out[order] = dup_sorted
    return out


DIRECT_TABLE_MIN_LOOKUPS = 2_000_000
"""From this many look-ups on, states are found with a direct-address table instead of a binary
search: the table costs a fixed 800 MB fill, a binary search ~20 cache misses per look-up."""


class StateLookup:
    """The state index of a MAFID (``NOT_TABULATED`` for MAFIDs with no tabulated geo row).

    Args:
        geo_mafid: MAFIDs of the tabulated geo rows (unique).
        geo_state: Their state indices.
        direct: Use a direct-address table over the whole MAFID range (one byte per possible
            MAFID, 800 MB) rather than a binary search over the sorted geo MAFIDs.
    """

    def __init__(self, geo_mafid: npt.NDArray[np.integer], geo_state: npt.NDArray[np.uint8], *, direct: bool) -> None:
        self.direct = direct
        if direct:
            self.table = np.full(MAFID_MAX - MAFID_MIN + 1, NOT_TABULATED, dtype=np.uint8)
            self.table[geo_mafid.astype(np.int64) - MAFID_MIN] = geo_state
        else:
            order = np.argsort(geo_mafid, kind="stable")
            self.sorted_mafid, self.sorted_state = geo_mafid[order], geo_state[order]

    def __call__(self, mafid: npt.NDArray[np.integer]) -> npt.NDArray[np.uint8]:
        if len(mafid) and (mafid.min() < MAFID_MIN or mafid.max() > MAFID_MAX):
            raise ValueError(f"MAFID outside {MAFID_MIN}..{MAFID_MAX}")  # the reader checks this
        out = np.full(len(mafid), NOT_TABULATED, dtype=np.uint8)
        for start in range(0, len(mafid), _CHUNK):
            chunk = mafid[start : start + _CHUNK]
            if self.direct:
                out[start : start + _CHUNK] = self.table[chunk.astype(np.int64) - MAFID_MIN]
            elif len(self.sorted_mafid):
                pos = np.minimum(np.searchsorted(self.sorted_mafid, chunk), len(self.sorted_mafid) - 1)
                found = self.sorted_mafid[pos] == chunk
                out[start : start + _CHUNK] = np.where(found, self.sorted_state[pos], NOT_TABULATED)
        return out


def prepare(inputs: InputTables, states: tuple[str, ...]) -> PreparedData:
    """Apply the state filter and the geography rules: tag each record with its state."""
    state_index = np.full(256, NOT_TABULATED, dtype=np.uint8)
    for i, code in enumerate(states):
        state_index[int(code)] = i
    geo = inputs.geo
    geo_state = state_index[geo["TABBLKST"]]
    keep = (geo_state != NOT_TABULATED) & ~_duplicated(geo["MAFID"]) & (geo["RTYPE"] == RTYPE_UNIT_HU)
    lookups = len(inputs.units["MAFID"]) + len(inputs.persons["MAFID"])
    state_of = StateLookup(geo["MAFID"][keep], geo_state[keep], direct=lookups >= DIRECT_TABLE_MIN_LOOKUPS)
    return PreparedData(
        states=states,
        units=inputs.units,
        unit_state=state_of(inputs.units["MAFID"]),
        persons=inputs.persons,
        person_state=state_of(inputs.persons["MAFID"]),
    )


def _mafid_ranges(person_mafid: npt.NDArray[np.integer], max_persons: int) -> list[tuple[int, int]]:
    """Cut the MAFID range into consecutive ranges of about ``max_persons`` persons each.

    The cut points come from a histogram of the tabulated persons' MAFIDs (one pass); a range
    exceeds ``max_persons`` only if a single histogram bin does.
    """
    n = len(person_mafid)
    k = max(1, -(-n // max_persons))
    if k == 1:
        return [(MAFID_MIN, MAFID_MAX + 1)]
    edges = np.linspace(MAFID_MIN, MAFID_MAX + 1, 64 * k + 1).astype(np.int64)
    per_bin, _ = np.histogram(person_mafid, bins=edges)
    cumulative = np.cumsum(per_bin)
    targets = np.arange(1, k) * (n / k)
    cuts = edges[1:][np.searchsorted(cumulative, targets)]
    bounds = np.unique(np.concatenate([[MAFID_MIN], cuts, [MAFID_MAX + 1]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def partitions(data: PreparedData, max_persons: int = 8_000_000) -> Iterator[Partition]:
    """Yield the tabulated records by MAFID range, about ``max_persons`` persons at a time."""
    tabulated_persons = data.person_state != NOT_TABULATED
    ranges = _mafid_ranges(data.persons["MAFID"][tabulated_persons], max_persons)
    for lo, hi in ranges:
        whole = len(ranges) == 1
        unit_mafid = data.units["MAFID"]
        in_range = data.unit_state != NOT_TABULATED
        if not whole:
            in_range &= (unit_mafid >= lo) & (unit_mafid < hi)
        unit_rows = np.flatnonzero(in_range)
        del in_range
        order = np.argsort(unit_mafid[unit_rows], kind="stable")
        unit_rows = unit_rows[order]
        units = _take(data.units, unit_rows)
        unit_state = data.unit_state[unit_rows]
        mafid = units["MAFID"]
        new_group = np.ones(len(mafid), dtype=bool)
        if len(mafid) > 1:
            new_group[1:] = mafid[1:] != mafid[:-1]
        unit_group = np.cumsum(new_group, dtype=np.int64) - 1
        group_mafid = mafid[new_group]

        in_range = tabulated_persons.copy() if not whole else tabulated_persons
        if not whole:
            person_mafid = data.persons["MAFID"]
            in_range &= (person_mafid >= lo) & (person_mafid < hi)
        person_rows = np.flatnonzero(in_range)
        del in_range
        # Hash look-up of each person's MAFID among the partition's (unique) group MAFIDs.
        group = pd.Index(group_mafid).get_indexer(data.persons["MAFID"][person_rows])
        found = group >= 0
        person_rows, person_group = person_rows[found], group[found].astype(np.int64)
        yield Partition(
            units=units,
            unit_state=unit_state,
            unit_group=unit_group,
            persons=_take(data.persons, person_rows),
            person_group=person_group,
            n_groups=len(group_mafid),
        )
