"""The audit's records: a generated background population and one table's canaries.

Everything is generated in process from the audit's seed -- :func:`phsafe.synthetic.generate`
for the background, :mod:`.canaries` for the canaries -- and never read from a file: the audit
runs on data it made, so nothing it publishes can be a function of confidential records.

The background is kept *key-invariant*: households with more persons than the smallest tau of
the config are left out (the generator's households go up to 20 persons), so that every
record's truncated count is known without the key. Vacant units and group quarters stay.

:class:`TableRecords` assembles a run's records from a vector ``included`` (one flag per canary:
its "in" version or its "out" one) and gives the exact count vector of every measured level for
the same vector (:meth:`TableRecords.expected`), from :mod:`.oracle`'s counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from phsafe.accounting import PlannedMeasurement
from phsafe.iterations import GeographyLevel
from phsafe.reader import InputTables
from phsafe.schema import FILES, MAFID_MIN
from phsafe.tables import TABLES

from phsafe.audit.empirical.canaries import Layout, household_records
from phsafe.audit.empirical.oracle import expected_counts, unit_states

__all__ = ["Records", "generated_background", "free_mafids", "TableRecords", "expected_vectors"]

Columns = dict[str, np.ndarray]


def _dtypes(stem: str) -> dict[str, type]:
    return {c.name: c.dtype for c in FILES[stem] if c.dtype is not None}


@dataclass(frozen=True)
class Records:
    """Persons, units and geo as the engine's compact integer columns."""

    persons: Columns
    units: Columns
    geo: Columns

    @property
    def n_persons(self) -> int:
        return len(self.persons["MAFID"])


def _columns(frame: pd.DataFrame, stem: str) -> Columns:
    return {name: pd.to_numeric(frame[name]).to_numpy().astype(dtype) for name, dtype in _dtypes(stem).items()}


def generated_background(states: Sequence[str], persons: int, seed: int, max_household: int) -> Records:
    """A synthetic population over ``states`` (about ``persons`` persons), key-invariant.

    Args:
        max_household: Households of more persons than this are left out, with their unit and
            geo rows (the smallest tau of the config: then no household is ever truncated).
    """
    from phsafe.synthetic import generate

    data = generate(max(persons, 1), list(states), seed=seed)
    p, u, g = _columns(data.persons, "persons"), _columns(data.units, "units"), _columns(data.geo, "geo")
    mafids, size = np.unique(p["MAFID"][p["RTYPE"] == 3], return_counts=True)
    too_big = mafids[size > max_household]
    keep_p, keep_u, keep_g = (~np.isin(cols["MAFID"], too_big) for cols in (p, u, g))
    p, u, g = ({k: v[keep] for k, v in cols.items()} for cols, keep in ((p, keep_p), (u, keep_u), (g, keep_g)))
    # MAFIDs are identifiers: renumbered consecutively from MAFID_MIN (same order), so that the
    # release path's MAFID look-ups see a span of a few thousand instead of 800 million -- the
    # generator spreads them over the whole range, and a run would spend most of its time
    # building a rank bitmap over that span, once per run.
    used = np.union1d(u["MAFID"], g["MAFID"])
    for cols in (p, u, g):
        cols["MAFID"] = (MAFID_MIN + np.searchsorted(used, cols["MAFID"])).astype(cols["MAFID"].dtype)
    return Records(p, u, g)


def _concat(parts: Sequence[Columns], stem: str) -> Columns:
    return {name: np.concatenate([np.asarray(part[name]) for part in parts]).astype(dtype)
            for name, dtype in _dtypes(stem).items()}


def free_mafids(background: Records, count: int) -> np.ndarray:
    """``count`` MAFIDs that no background unit or geo row uses, in increasing order."""
    used = np.union1d(background.units["MAFID"], background.geo["MAFID"])
    pool = np.setdiff1d(np.arange(MAFID_MIN, MAFID_MIN + len(used) + count, dtype=np.int64), used)
    return pool[:count]


class TableRecords:
    """One table's runs: the background, its canaries, and their exact counts.

    Args:
        background: The background population (key-invariant).
        layout: The table's canaries (their MAFIDs must be free in the background).
        states: The run's states, sorted (their codes).
        measurements: The table's measured levels (the plan).
        tau: The table's truncation threshold (None for unit tables).
    """

    def __init__(self, background: Records, layout: Layout, states: Sequence[str],
                 measurements: Sequence[PlannedMeasurement], tau: int | None) -> None:
        self.layout = layout
        self.measurements = tuple(measurements)
        self.states = tuple(states)
        self.n_canaries = len(layout.canaries)
        spec = TABLES[layout.table]
        out_p, out_u, in_p, in_u, out_g, in_g = [], [], [], [], [], []
        for c in layout.canaries:
            for inside, persons_, units_, geo_ in ((False, out_p, out_u, out_g), (True, in_p, in_u, in_g)):
                p, u = household_records(c.template, c.size, inside, c.mafid)
                persons_.append(p)
                units_.append(u)
                # A version without a household has no geo row either (units and geo hold the
                # same MAFIDs).
                geo_.append({"RTYPE": np.full(len(u["MAFID"]), 2), "MAFID": np.asarray(u["MAFID"]),
                             "TABBLKST": np.full(len(u["MAFID"]), int(self.states[c.state]))})
        empty = {stem: {k: np.empty(0, dt) for k, dt in _dtypes(stem).items()} for stem in FILES}
        if self.n_canaries:
            self._out_persons, self._in_persons = _concat(out_p, "persons"), _concat(in_p, "persons")
            self._out_units, self._in_units = _concat(out_u, "units"), _concat(in_u, "units")
            self._out_geo, self._in_geo = _concat(out_g, "geo"), _concat(in_g, "geo")
        else:
            self._out_persons = self._in_persons = empty["persons"]
            self._out_units = self._in_units = empty["units"]
            self._out_geo = self._in_geo = empty["geo"]

        def owner(parts: list[dict]) -> np.ndarray:
            return np.repeat(np.arange(self.n_canaries), [len(p["MAFID"]) for p in parts]).astype(np.int64)

        self._out_owner, self._in_owner = owner(out_p), owner(in_p)
        self._out_unit_owner, self._in_unit_owner = owner(out_u), owner(in_u)
        self._background = background

        # The exact counts of the "all out" records, and each canary's change, per level.
        none = np.zeros(self.n_canaries, dtype=bool)
        self._base = self._oracle(spec, tau, none)
        self._change_cells: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for m in self.measurements:
            key = m.level.config_key
            cells = [(k, cell, value) for k, change in enumerate(layout.change) for cell, value in change[key].items()]
            arr = np.array(cells, dtype=np.int64).reshape(-1, 3)
            self._change_cells[key] = (arr[:, 0], arr[:, 1], arr[:, 2])
        # The sum of the changes must be what the oracle counts on the "all in" records: the
        # canaries' changes add up, and none depends on another canary.
        every = np.ones(self.n_canaries, dtype=bool)
        direct = self._oracle(spec, tau, every)
        for key, vector in self.expected(every).items():
            if not np.array_equal(vector, direct[key]):
                raise AssertionError(f"{layout.table}/{key}: the canaries' changes do not add up")

    def records(self, included: np.ndarray) -> Records:
        """The run's records: the background, and each canary in or out as ``included`` says."""
        included = np.asarray(included, dtype=bool)
        keep_out_p, keep_in_p = ~included[self._out_owner], included[self._in_owner]
        keep_out_u, keep_in_u = ~included[self._out_unit_owner], included[self._in_unit_owner]
        b = self._background

        def merged(stem: str, out: Columns, inside: Columns, keep_out: np.ndarray, keep_in: np.ndarray) -> Columns:
            return {k: np.concatenate([getattr(b, stem)[k], out[k][keep_out], inside[k][keep_in]])
                    for k in getattr(b, stem)}

        return Records(merged("persons", self._out_persons, self._in_persons, keep_out_p, keep_in_p),
                       merged("units", self._out_units, self._in_units, keep_out_u, keep_in_u),
                       merged("geo", self._out_geo, self._in_geo, keep_out_u, keep_in_u))

    def inputs(self, included: np.ndarray) -> InputTables:
        r = self.records(included)
        return InputTables(r.persons, r.units, r.geo)

    def expected(self, included: np.ndarray) -> dict[str, np.ndarray]:
        """The exact count vector of each measured level (config key) for ``included``."""
        included = np.asarray(included, dtype=np.int64)
        out = {}
        for m in self.measurements:
            key = m.level.config_key
            canary, cell, value = self._change_cells[key]
            vector = self._base[key].copy()
            vector += np.bincount(cell, weights=value * included[canary], minlength=len(vector)).astype(np.int64)
            out[key] = vector
        return out

    def _oracle(self, spec, tau: int | None, included: np.ndarray) -> dict[str, np.ndarray]:  # noqa: ANN001
        r = self.records(included)
        states = unit_states(r.geo, r.units, self.states)
        cubes = expected_counts(spec, tau, r.persons, r.units, states, len(self.states))
        return {m.level.config_key: _level_vector(cubes[m.level.iteration], m) for m in self.measurements}


def _level_vector(cube: np.ndarray, m: PlannedMeasurement) -> np.ndarray:
    if m.level.geography is GeographyLevel.USA:
        cube = cube.sum(axis=0, keepdims=True)
    vector = np.ascontiguousarray(cube).reshape(-1)
    if vector.size != m.n_cells:
        raise AssertionError(f"{m.key}: {vector.size} cells, the plan says {m.n_cells}")
    return vector


def expected_vectors(spec_name: str, tau: int | None, records: Records, states: Sequence[str],
                     measurements: Sequence[PlannedMeasurement]) -> dict[str, np.ndarray]:
    """The oracle's exact count vectors of ``records`` (for the key-invariance check)."""
    unit_state = unit_states(records.geo, records.units, states)
    cubes = expected_counts(TABLES[spec_name], tau, records.persons, records.units, unit_state, len(states))
    return {m.level.config_key: _level_vector(cubes[m.level.iteration], m) for m in measurements}
