"""The auditor's own exact counts of the audit's records: what a correct release's noise is added to.

The audit must know the exact count vector of every run *without the run's truncation key*
(the key is fresh, secret, and never leaves the mechanism). It can, because every household of
the audit's data is *key-invariant* for every table: either it has at most tau persons in the
table's universe (truncation keeps them all), or all of them are identical in everything the
table counts them by -- their basis cell and their iteration code at every level -- so any tau
of them count the same. :func:`expected_counts` checks that and refuses a household that is not
(:class:`KeyDependentHousehold`).

This is a second implementation of spec §4-§5, written apart from :mod:`phsafe.tabulate` on
purpose (plain masks and group counts instead of lookup tables and keyed hashes), from the same
table definitions (:mod:`phsafe.tables`, which are the spec's tables as data). A release whose
exact counts differ from these is caught by the audit's residuals, whatever the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from phsafe.iterations import IterationLevel
from phsafe.tables import Condition, IterationSource, Source, TableKind, TableSpec

__all__ = ["KeyDependentHousehold", "NOT_TABULATED", "expected_counts", "iteration_codes", "unit_states"]

NOT_TABULATED = -1
Columns = Mapping[str, np.ndarray]


class KeyDependentHousehold(ValueError):
    """A household whose truncated counts would depend on the truncation key."""


def iteration_codes(level: IterationLevel, race: np.ndarray, hispanic: np.ndarray) -> np.ndarray:
    """Index of each record's code at ``level`` (spec §3), or -1 when it is in no group.

    ``*``: 0. ``A-G``: races 01..06 are A..F, 07..63 are G. ``H,I``: Hispanic is H (0); White
    alone and not Hispanic is I (1); anyone else is in no group of the level.
    """
    race = np.asarray(race, dtype=np.int64)
    hispanic = np.asarray(hispanic, dtype=np.int64)
    if level is IterationLevel.TOTAL:
        return np.zeros(race.shape, dtype=np.int64)
    if level is IterationLevel.RACE_ALONE:
        return np.where(race >= 7, 6, race - 1)
    codes = np.full(race.shape, -1, dtype=np.int64)
    codes[(race == 1) & (hispanic == 1)] = 1
    codes[hispanic == 2] = 0
    return codes


def unit_states(geo: Columns, units: Columns, states: Sequence[str]) -> np.ndarray:
    """State index of each unit row for the tables, or ``NOT_TABULATED`` (spec §4).

    A unit is tabulated in state s when its MAFID has exactly one geo row, that row is a housing
    unit's (RTYPE 2) and its TABBLKST is s, one of the run's ``states`` (sorted).
    """
    index_of = np.full(100, NOT_TABULATED, dtype=np.int64)
    for i, code in enumerate(states):
        index_of[int(code)] = i
    geo_mafid = np.asarray(geo["MAFID"], dtype=np.int64)
    mafids, first, count = np.unique(geo_mafid, return_index=True, return_counts=True)
    state = index_of[np.asarray(geo["TABBLKST"], dtype=np.int64)[first]]
    state[(count != 1) | (np.asarray(geo["RTYPE"])[first] != 2)] = NOT_TABULATED
    unit_mafid = np.asarray(units["MAFID"], dtype=np.int64)
    out = np.full(len(unit_mafid), NOT_TABULATED, dtype=np.int64)
    if len(mafids):
        where = np.minimum(np.searchsorted(mafids, unit_mafid), len(mafids) - 1)
        found = mafids[where] == unit_mafid
        out[found] = state[where[found]]
    return out


def _holds(conditions: Sequence[Condition], source: Source, columns: Columns, n: int) -> np.ndarray:
    mask = np.ones(n, dtype=bool)
    for c in conditions:
        if c.source is source:
            mask &= np.isin(np.asarray(columns[c.column], dtype=np.int64), sorted(c.values))
    return mask


def expected_counts(
    spec: TableSpec,
    tau: int | None,
    persons: Columns,
    units: Columns,
    unit_state: np.ndarray,
    n_states: int,
) -> dict[IterationLevel, npt.NDArray[np.int64]]:
    """Exact counts of ``spec`` by state x iteration code x basis cell, at each iteration level.

    Args:
        spec: The table.
        tau: Its truncation threshold (person tables), or None for no truncation.
        persons, units: The records (compact integer columns, as :mod:`phsafe.reader` keeps them).
        unit_state: State index of each unit row, or ``NOT_TABULATED`` (:func:`unit_states`).
        n_states: Number of released states.

    Raises:
        KeyDependentHousehold: A household holds more than ``tau`` persons of the universe that
            do not all count alike: its truncated counts would depend on the key.
        ValueError: A record of the universe falls in no basis cell, or in a race group outside
            the code lists.
    """
    n_units = len(units["MAFID"])
    unit_ok = _holds(spec.unit_universe, Source.UNIT, units, n_units)
    unit_mafid = np.asarray(units["MAFID"], dtype=np.int64)
    # Algorithm 3, step 2: a MAFID with two in-universe unit rows is dropped.
    in_universe = np.flatnonzero(unit_ok)
    mafids, counts = np.unique(unit_mafid[in_universe], return_counts=True)
    kept_units = in_universe[np.isin(unit_mafid[in_universe], mafids[counts == 1])
                             & (unit_state[in_universe] >= 0)]

    def unit_column(name: str, rows: np.ndarray) -> np.ndarray:
        return np.asarray(units[name], dtype=np.int64)[rows]

    out: dict[IterationLevel, np.ndarray] = {}
    if spec.kind is TableKind.UNIT:
        rows = kept_units
        cell = _cell_of(spec, {c: unit_column(c, rows) for c in _columns(spec, Source.UNIT)}, {}, len(rows))
        race, hisp = unit_column("HHRACE", rows), unit_column("HHSPAN", rows)
        state = unit_state[rows]
        weight = np.ones(len(rows), dtype=np.int64)
        for level in spec.iteration_levels:
            out[level] = _cube(state, _codes(spec, level, race, hisp), cell, weight, n_states, level, spec)
        return out

    n_persons = len(persons["MAFID"])
    person_ok = _holds(spec.person_universe, Source.PERSON, persons, n_persons)
    person_mafid = np.asarray(persons["MAFID"], dtype=np.int64)
    kept_mafid = unit_mafid[kept_units]
    order = np.argsort(kept_mafid)
    sorted_mafid, sorted_rows = kept_mafid[order], kept_units[order]
    where = np.searchsorted(sorted_mafid, person_mafid)
    where = np.minimum(where, max(len(sorted_mafid) - 1, 0))
    has_unit = (sorted_mafid[where] == person_mafid) if len(sorted_mafid) else np.zeros(n_persons, dtype=bool)
    rows = np.flatnonzero(person_ok & has_unit)
    unit_rows = sorted_rows[where[rows]]

    person_cols = {c: np.asarray(persons[c], dtype=np.int64)[rows] for c in _columns(spec, Source.PERSON)}
    unit_cols = {c: unit_column(c, unit_rows) for c in _columns(spec, Source.UNIT)}
    cell = _cell_of(spec, unit_cols, person_cols, len(rows))
    if spec.iteration_source is IterationSource.PERSON:
        race = np.asarray(persons["CENRACE"], dtype=np.int64)[rows]
        hisp = np.asarray(persons["CENHISP"], dtype=np.int64)[rows]
    else:
        race, hisp = unit_column("HHRACE", unit_rows), unit_column("HHSPAN", unit_rows)
    state = unit_state[unit_rows]
    codes = {level: _codes(spec, level, race, hisp) for level in spec.iteration_levels}
    weight = _truncated_weights(person_mafid[rows], cell, codes, tau)
    for level in spec.iteration_levels:
        out[level] = _cube(state, codes[level], cell, weight, n_states, level, spec)
    return out


def _columns(spec: TableSpec, source: Source) -> list[str]:
    return sorted({c.column for cell in spec.basis for c in cell.conditions if c.source is source})


def _cell_of(spec: TableSpec, unit_cols: Mapping[str, np.ndarray], person_cols: Mapping[str, np.ndarray],
             n: int) -> np.ndarray:
    cell = np.full(n, -1, dtype=np.int64)
    for index, basis_cell in enumerate(spec.basis):
        match = np.ones(n, dtype=bool)
        for c in basis_cell.conditions:
            values = person_cols[c.column] if c.source is Source.PERSON else unit_cols[c.column]
            match &= np.isin(values, sorted(c.values))
        if (cell[match] >= 0).any():
            raise AssertionError(f"{spec.name}: basis cells overlap")
        cell[match] = index
    if (cell < 0).any():
        raise ValueError(f"{spec.name}: {int((cell < 0).sum())} record(s) of the universe fall in no basis cell")
    return cell


def _codes(spec: TableSpec, level: IterationLevel, race: np.ndarray, hisp: np.ndarray) -> np.ndarray:
    if level is not IterationLevel.TOTAL and (
            (race < 1).any() or (race > 63).any() or not np.isin(hisp, (1, 2)).all()):
        raise ValueError(f"{spec.name}: a record of the universe has no race or ethnicity group")
    return iteration_codes(level, race, hisp)


def _truncated_weights(mafid: np.ndarray, cell: np.ndarray, codes: Mapping[IterationLevel, np.ndarray],
                       tau: int | None) -> np.ndarray:
    """How many times each record counts after truncation: 1, except in a MAFID with more than
    tau records, where the first record counts tau and the others 0 -- valid only because all of
    them count alike (checked)."""
    n = len(mafid)
    weight = np.ones(n, dtype=np.int64)
    if tau is None or n == 0:
        return weight
    groups, inverse, size = np.unique(mafid, return_inverse=True, return_counts=True)
    over = size[inverse] > tau
    if not over.any():
        return weight
    key = cell.copy()
    for level_codes in codes.values():
        key = key * 16 + (level_codes + 1)
    rows = np.flatnonzero(over)
    g = inverse[rows]
    lo = np.full(len(groups), np.iinfo(np.int64).max)
    hi = np.full(len(groups), np.iinfo(np.int64).min)
    np.minimum.at(lo, g, key[rows])
    np.maximum.at(hi, g, key[rows])
    if (lo[g] != hi[g]).any():
        raise KeyDependentHousehold(
            "a household has more than tau persons in the universe that are not counted alike: "
            "which of them truncation keeps (and so the counts) would depend on the key")
    weight[rows] = 0
    first = np.full(len(groups), -1)
    first[g[::-1]] = rows[::-1]
    weight[first[first >= 0]] = tau
    return weight


def _cube(state: np.ndarray, codes: np.ndarray, cell: np.ndarray, weight: np.ndarray, n_states: int,
          level: IterationLevel, spec: TableSpec) -> np.ndarray:
    n_codes, n_cells = len(level.codes), len(spec.basis)
    inside = codes >= 0
    flat = (state[inside] * n_codes + codes[inside]) * n_cells + cell[inside]
    counts = np.bincount(flat, weights=weight[inside], minlength=n_states * n_codes * n_cells)
    return np.rint(counts).astype(np.int64).reshape(n_states, n_codes, n_cells)
