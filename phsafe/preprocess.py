"""Preprocessing: state filter, geography and group quarters (spec §4), and MAFID-range partitions.

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

The same argument lets :mod:`phsafe.counting` read data stored by state one state at a time
(``prepare(..., require_geo=...)`` then checks that every record's geo row is in its partition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import numpy.typing as npt
import pandas as pd

from phsafe.errors import InputError
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
    if len(values) < 2 or bool((values[1:] > values[:-1]).all()):
        return np.zeros(len(values), dtype=bool)  # strictly increasing (files sorted by MAFID)
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
search: the table costs a fill of up to 800 MB, a binary search ~20 cache misses per look-up."""
DIRECT_TABLE_BYTES_PER_LOOKUP = 64
"""Below this many table bytes per look-up the direct table wins whatever the number of
look-ups (e.g. one state's MAFIDs, when they are clustered)."""


def use_direct_table(geo_mafid: npt.NDArray[np.integer], lookups: int) -> bool:
    """Whether a :class:`StateLookup` over ``geo_mafid`` should be a direct-address table."""
    if len(geo_mafid) == 0:
        return False
    span = int(geo_mafid.max()) - int(geo_mafid.min()) + 1
    return lookups >= DIRECT_TABLE_MIN_LOOKUPS or span <= DIRECT_TABLE_BYTES_PER_LOOKUP * lookups


class StateLookup:
    """The state index of a MAFID (``missing`` for MAFIDs with no geo row).

    Args:
        geo_mafid: MAFIDs of the geo rows (a MAFID listed twice must have the same state on
            both rows, e.g. ``NOT_TABULATED``).
        geo_state: Their state indices, or ``NOT_TABULATED``.
        direct: Use a direct-address table (one byte per possible MAFID between the smallest
            and the largest geo MAFID: at most 800 MB, much less for one state's MAFIDs when
            they are clustered) rather than a binary search over the sorted geo MAFIDs.
        missing: The value of a MAFID with no geo row.
    """

    def __init__(self, geo_mafid: npt.NDArray[np.integer], geo_state: npt.NDArray[np.uint8], *, direct: bool,
                 missing: np.uint8 = NOT_TABULATED) -> None:
        self.direct = direct
        self.missing = np.uint8(missing)
        if direct:
            self.lo = int(geo_mafid.min()) if len(geo_mafid) else MAFID_MIN
            hi = int(geo_mafid.max()) if len(geo_mafid) else MAFID_MIN
            self.table = np.full(hi - self.lo + 2, self.missing, dtype=np.uint8)  # last: off the range
            self.table[geo_mafid.astype(np.int64) - self.lo] = geo_state
        else:
            order = np.argsort(geo_mafid, kind="stable")
            self.sorted_mafid, self.sorted_state = geo_mafid[order], geo_state[order]

    def __call__(self, mafid: npt.NDArray[np.integer]) -> npt.NDArray[np.uint8]:
        if len(mafid) and (mafid.min() < MAFID_MIN or mafid.max() > MAFID_MAX):
            raise ValueError(f"MAFID outside {MAFID_MIN}..{MAFID_MAX}")  # the reader checks this
        out = np.full(len(mafid), self.missing, dtype=np.uint8)
        for start in range(0, len(mafid), _CHUNK):
            chunk = mafid[start : start + _CHUNK]
            if self.direct:
                # MAFIDs off the table's range read its last entry, which is always missing
                index = np.clip(chunk.astype(np.int64) - self.lo, -1, len(self.table) - 1)
                out[start : start + _CHUNK] = self.table[index]
            elif len(self.sorted_mafid):
                pos = np.minimum(np.searchsorted(self.sorted_mafid, chunk), len(self.sorted_mafid) - 1)
                found = self.sorted_mafid[pos] == chunk
                out[start : start + _CHUNK] = np.where(found, self.sorted_state[pos], self.missing)
        return out


NO_GEO = np.uint8(254)
"""Internal: a record whose MAFID has no geo row at all (see ``prepare(require_geo=True)``)."""


def prepare(inputs: InputTables, states: tuple[str, ...], *, require_geo: str | None = None) -> PreparedData:
    """Apply the state filter and the geography rules: tag each record with its state.

    Args:
        inputs: The records.
        states: The released states (``state_filter``, sorted).
        require_geo: If given (the name of the data partition, for messages), every person and
            unit must have a geo row among ``inputs.geo`` -- as they do when the data is stored
            by state and each record is in its state's partition. Without it a record with no
            geo row is simply not tabulated (spec §4).

    Raises:
        InputError: ``require_geo`` is given and a person or unit has no geo row.
    """
    if len(states) >= NO_GEO:
        raise ValueError("too many states")
    state_index = np.full(256, NOT_TABULATED, dtype=np.uint8)
    for i, code in enumerate(states):
        state_index[int(code)] = i
    geo = inputs.geo
    geo_state = state_index[geo["TABBLKST"]]
    keep = (geo_state != NOT_TABULATED) & ~_duplicated(geo["MAFID"]) & (geo["RTYPE"] == RTYPE_UNIT_HU)
    lookups = len(inputs.units["MAFID"]) + len(inputs.persons["MAFID"])
    missing = NO_GEO if require_geo is not None else NOT_TABULATED
    state_of = StateLookup(geo["MAFID"], np.where(keep, geo_state, NOT_TABULATED).astype(np.uint8),
                           direct=use_direct_table(geo["MAFID"], lookups), missing=missing)
    del geo_state, keep
    unit_state = state_of(inputs.units["MAFID"])
    person_state = state_of(inputs.persons["MAFID"])
    del state_of
    if require_geo is not None:
        for stem, tagged in (("units", unit_state), ("persons", person_state)):
            orphans = tagged == NO_GEO
            n = int(np.count_nonzero(orphans))
            if n:
                raise InputError(
                    f"{stem} ({require_geo})", "MAFID",
                    "every record is stored in the partition of its unit's state: this MAFID has no "
                    "geo row in the same partition", rows=n)
    return PreparedData(
        states=states,
        units=inputs.units,
        unit_state=unit_state,
        persons=inputs.persons,
        person_state=person_state,
    )


def _mafid_ranges(person_mafid: npt.NDArray[np.integer], max_persons: int) -> list[tuple[int, int]]:
    """Cut the MAFID range into consecutive ranges of about ``max_persons`` persons each.

    The cut points come from a histogram of the tabulated persons' MAFIDs over their own span
    (one pass); a range exceeds ``max_persons`` only if a single histogram bin does. The first
    and last ranges reach the ends of the MAFID domain, so the ranges cover it.
    """
    n = len(person_mafid)
    k = max(1, -(-n // max_persons))
    if k == 1:
        return [(MAFID_MIN, MAFID_MAX + 1)]
    lo, hi = int(person_mafid.min()), int(person_mafid.max()) + 1
    edges = np.unique(np.linspace(lo, hi, 64 * k + 1).astype(np.int64))
    per_bin, _ = np.histogram(person_mafid, bins=edges)
    cumulative = np.cumsum(per_bin)
    targets = np.arange(1, k) * (n / k)
    cuts = edges[1:][np.minimum(np.searchsorted(cumulative, targets), len(cumulative) - 1)]
    bounds = np.unique(np.concatenate([[MAFID_MIN], cuts, [MAFID_MAX + 1]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


MAX_PERSONS_PER_PARTITION = 2_000_000
"""Persons tabulated at once: small enough that a partition's MAFID groups stay in the CPU
caches (at 331M persons, 2M-person ranges tabulate California 1.4x faster than 8M ones)."""
_GROUP_TABLE_SLOTS_PER_RECORD = 16  # a direct MAFID -> group table up to this many slots a record


def _range_ids(mafid: npt.NDArray[np.integer], tabulated: npt.NDArray[np.bool_],
               cuts: npt.NDArray[np.int64]) -> npt.NDArray[np.unsignedinteger]:
    """Index of each record's MAFID range (``len(cuts) + 1`` for records not tabulated)."""
    k = len(cuts) + 1
    dtype = np.uint8 if k < 255 else np.uint16 if k < 65535 else np.uint32
    out = np.empty(len(mafid), dtype=dtype)
    for start in range(0, len(mafid), _CHUNK):  # bounded temporaries
        chunk = slice(start, start + _CHUNK)
        out[chunk] = np.searchsorted(cuts, mafid[chunk], side="right")
    out[~tabulated] = k
    return out


def _group_of(group_mafid: npt.NDArray[np.integer], mafid: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Index of each ``mafid`` in the sorted, unique ``group_mafid`` (-1 if absent).

    A direct table over the groups' MAFID span when it is small (the usual case: a range of a
    few million persons), else a hash look-up.
    """
    if len(group_mafid) == 0:
        return np.full(len(mafid), -1, dtype=np.int64)
    lo = int(group_mafid[0])
    span = int(group_mafid[-1]) - lo + 1
    if span > _GROUP_TABLE_SLOTS_PER_RECORD * (len(mafid) + len(group_mafid)):
        return pd.Index(group_mafid).get_indexer(mafid).astype(np.int64)
    table = np.full(span + 1, -1, dtype=np.int32)  # the last slot: off the span
    table[group_mafid.astype(np.int64) - lo] = np.arange(len(group_mafid), dtype=np.int32)
    return table[np.clip(mafid.astype(np.int64) - lo, -1, span)].astype(np.int64)


def partitions(data: PreparedData, max_persons: int = MAX_PERSONS_PER_PARTITION) -> Iterator[Partition]:
    """Yield the tabulated records by MAFID range, about ``max_persons`` persons at a time.

    Each record's range is found once (one byte a record); each range then takes its rows with
    one pass over those bytes, so the cost grows with the records, not records x ranges.
    """
    tabulated_units = data.unit_state != NOT_TABULATED
    tabulated_persons = data.person_state != NOT_TABULATED
    unit_mafid, person_mafid = data.units["MAFID"], data.persons["MAFID"]
    ranges = _mafid_ranges(person_mafid[tabulated_persons], max_persons)
    if len(ranges) > 1:
        cuts = np.array([lo for lo, _ in ranges[1:]], dtype=np.int64)
        unit_range = _range_ids(unit_mafid, tabulated_units, cuts)
        person_range = _range_ids(person_mafid, tabulated_persons, cuts)
    del tabulated_persons
    for r in range(len(ranges)):
        if len(ranges) > 1:
            unit_rows = np.flatnonzero(unit_range == r)
            person_rows = np.flatnonzero(person_range == r)
        else:
            unit_rows = np.flatnonzero(tabulated_units)
            person_rows = np.flatnonzero(data.person_state != NOT_TABULATED)
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
        group = _group_of(group_mafid, person_mafid[person_rows])
        found = group >= 0
        person_rows, person_group = person_rows[found], group[found]
        yield Partition(
            units=units,
            unit_state=unit_state,
            unit_group=unit_group,
            persons=_take(data.persons, person_rows),
            person_group=person_group,
            n_groups=len(group_mafid),
        )
