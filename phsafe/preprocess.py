"""Preprocessing: state filter, geography and group quarters (spec §4), and state partitions.

* Geo rows are kept when their TABBLKST is in ``state_filter``; a MAFID listed more than once in
  geo is ambiguous (its state is not known) and is dropped.
* A unit, and the persons in it, is tabulated only when its geo row has RTYPE 2: GQ facilities'
  geo rows (RTYPE 4) are dropped first, so GQ records never reach a table even when the unit file
  disagrees.
* Units keep every row whose MAFID has a kept geo row -- duplicates included: whether a MAFID is
  unique is decided per table *after* its universe filter (Algorithm 3, steps 1-2), see
  :mod:`phsafe.truncation`.

Units are sorted by (state, MAFID) and persons by state, so that each state is a contiguous
slice. Truncate-join-count of one state never looks at another state; the nation's count vector
is the sum of the exact state vectors before any noise. :func:`partitions` yields the slices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import numpy.typing as npt

from phsafe.reader import Columns, InputTables
from phsafe.schema import RTYPE_UNIT_HU

_NO_STATE = np.uint8(255)


@dataclass
class PreparedData:
    """Records eligible for tabulation, grouped by MAFID and ordered by state.

    Attributes:
        states: Released state codes (sorted); ``state`` arrays index into it.
        units: Unit columns, rows sorted by (state, MAFID).
        unit_state: State index of each unit row.
        unit_group: MAFID group of each unit row (units sharing a MAFID share a group; groups
            are numbered in row order, so each state's groups form a contiguous range).
        persons: Person columns, rows ordered by state (file order within a state).
        person_group: MAFID group of each person.
        group_state: State index of each MAFID group.
    """

    states: tuple[str, ...]
    units: Columns
    unit_state: npt.NDArray[np.uint8]
    unit_group: npt.NDArray[np.int64]
    persons: Columns
    person_group: npt.NDArray[np.int64]
    group_state: npt.NDArray[np.uint8]

    @property
    def n_groups(self) -> int:
        return len(self.group_state)


@dataclass
class Partition:
    """A contiguous slice of whole states; group ids rebased to start at 0."""

    units: Columns
    unit_state: npt.NDArray[np.uint8]
    unit_group: npt.NDArray[np.int64]
    persons: Columns
    person_group: npt.NDArray[np.int64]
    n_groups: int
    n_states: int


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


def prepare(inputs: InputTables, states: tuple[str, ...]) -> PreparedData:
    """Apply the state filter and the geography rules; group records by MAFID and state."""
    state_index = np.full(256, _NO_STATE, dtype=np.uint8)
    for i, code in enumerate(states):
        state_index[int(code)] = i

    geo = inputs.geo
    geo_state = state_index[geo["TABBLKST"]]
    keep = (geo_state != _NO_STATE) & ~_duplicated(geo["MAFID"]) & (geo["RTYPE"] == RTYPE_UNIT_HU)
    geo_mafid = geo["MAFID"][keep]
    geo_state = geo_state[keep]
    order = np.argsort(geo_mafid, kind="stable")
    geo_mafid, geo_state = geo_mafid[order], geo_state[order]

    # Units with a tabulated geo row; attach its state.
    units = inputs.units
    pos = np.searchsorted(geo_mafid, units["MAFID"])
    pos_c = np.minimum(pos, max(len(geo_mafid) - 1, 0))
    has_geo = (pos < len(geo_mafid)) & (geo_mafid[pos_c] == units["MAFID"]) if len(geo_mafid) else np.zeros(len(pos), bool)
    unit_rows = np.flatnonzero(has_geo)
    unit_state = geo_state[pos_c[unit_rows]]
    order = np.lexsort((units["MAFID"][unit_rows], unit_state))
    unit_rows, unit_state = unit_rows[order], unit_state[order]
    units = _take(units, unit_rows)
    mafid = units["MAFID"]
    new_group = np.ones(len(mafid), dtype=bool)
    if len(mafid) > 1:
        new_group[1:] = mafid[1:] != mafid[:-1]
    unit_group = np.cumsum(new_group) - 1
    group_mafid = mafid[new_group]
    group_state = unit_state[new_group]

    # Persons: find their MAFID group; persons with no tabulated unit are not tabulated.
    persons = inputs.persons
    by_mafid = np.argsort(group_mafid, kind="stable")
    sorted_mafid = group_mafid[by_mafid]
    pos = np.searchsorted(sorted_mafid, persons["MAFID"])
    pos_c = np.minimum(pos, max(len(sorted_mafid) - 1, 0))
    found = (pos < len(sorted_mafid)) & (sorted_mafid[pos_c] == persons["MAFID"]) if len(sorted_mafid) else np.zeros(len(pos), bool)
    person_rows = np.flatnonzero(found)
    person_group = by_mafid[pos_c[person_rows]]
    order = np.argsort(group_state[person_group], kind="stable")
    person_rows, person_group = person_rows[order], person_group[order]

    return PreparedData(
        states=states,
        units=units,
        unit_state=unit_state,
        unit_group=unit_group.astype(np.int64),
        persons=_take(persons, person_rows),
        person_group=person_group.astype(np.int64),
        group_state=group_state,
    )


def partitions(data: PreparedData, max_persons: int = 16_000_000) -> Iterator[Partition]:
    """Yield slices of whole states, each with at most ``max_persons`` persons unless one state
    alone has more."""
    n_states = len(data.states)
    unit_bounds = np.searchsorted(data.unit_state, np.arange(n_states + 1))
    person_state = data.group_state[data.person_group] if len(data.person_group) else np.empty(0, np.uint8)
    person_bounds = np.searchsorted(person_state, np.arange(n_states + 1))
    group_bounds = np.searchsorted(data.group_state, np.arange(n_states + 1))
    start = 0
    while start < n_states:
        stop = start + 1
        while stop < n_states and person_bounds[stop + 1] - person_bounds[start] <= max_persons:
            stop += 1
        u0, u1 = unit_bounds[start], unit_bounds[stop]
        p0, p1 = person_bounds[start], person_bounds[stop]
        g0, g1 = group_bounds[start], group_bounds[stop]
        yield Partition(
            units=_take(data.units, slice(u0, u1)),
            unit_state=data.unit_state[u0:u1],
            unit_group=data.unit_group[u0:u1] - g0,
            persons=_take(data.persons, slice(p0, p1)),
            person_group=data.person_group[p0:p1] - g0,
            n_groups=int(g1 - g0),
            n_states=stop - start,
        )
        start = stop
