"""The exhaustive sensitivity checker: every neighbour of every small dataset, by the production code.

For one measured table and a truncation threshold tau, this builds a *universe* and computes,
with the functions a release uses, the largest L1 and L2 distance between the count vectors of
any two neighbouring datasets of one or two households -- under the paper's unbounded relation
(one person added or removed; the unit record of the person's MAFID changing to any unit record,
appearing with the household's first person, vanishing with its last) and under the bounded one
(one record changed: within its household, or moved to another household or a new one).

The universe (``docs/sensitivity.md``, "The exhaustive check"):

* person records: every class of the attributes the table reads -- the atoms of the value sets
  its universe filter, its basis cells and its iteration map distinguish on each column (so
  QAGE is split at 4, 6, 12, 18 for PH6 and at 18 for PH1_num) -- with every other column at a
  fixed value. Race and ethnicity: every (A-G code, H/I outcome) pair whose A-G code is A or B:
  the codes B..G are interchangeable (relabelling race codes permutes them in every table, a
  symmetry of every norm), and A is the one the H,I level treats apart (White alone, not
  Hispanic = I). Records outside the table's person universe never reach its join (they are
  filtered before truncation), so one of them stands for all;
* unit records: every class of the unit attributes the table reads, likewise;
* households: every multiset of up to tau + 2 person records with every unit record consistent
  with it (the tabulation refuses a record in its universe that falls in no cell), each placed
  at two MAFIDs (two orders of the keyed hash that decides which tau persons are kept);
* datasets: one or two households, the latter in the same state or in two states.

The vectors are computed by :func:`phsafe.tabulate.tabulate_partition` -- the production filter,
unique-unit rule, truncation (:func:`phsafe.truncation.truncate`, a fixed test key) and count --
on a partition in which each household has its own "state" index, so one call gives every
household's vector. A dataset's vector is the sum of its households' (the tabulation adds over
MAFIDs), so a neighbour's change is one household's change (unbounded) or two (bounded), and the
maxima are taken over every pair of household states, deduplicated by vector. The datasets that
attain each maximum are then rebuilt as input columns and run through the whole production path
-- :func:`phsafe.preprocess.prepare` (geography, state filter), :func:`phsafe.tabulate.tabulate`
and :func:`phsafe.engine.exact_vector` of the run's plan -- whose distances must be the maxima.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from phsafe.accounting import PlannedMeasurement, plan_run
from phsafe.config import PHSafeConfig, PrivacyDefinition, parse_config
from phsafe.engine import exact_vector
from phsafe.iterations import ALL_LEVELS, IterationLevel, PopulationGroupLevel, iteration_index
from phsafe.preprocess import Partition, prepare
from phsafe.reader import InputTables
from phsafe.schema import FILES
from phsafe.tabulate import cell_lookup, tabulate, tabulate_partition
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TABLES, IterationSource, Source, TableKind, TableSpec

KEY = bytes(range(16))
"""The truncation key of the check (fixed: a test, not a private run)."""
MAFIDS = (100_000_007, 100_000_123)
"""Each household composition is placed at both: two orders of the keyed hash."""
STATES = ("01", "02")
"""Two states: two households may be in one state or in two."""
CHUNK = 3000
"""Households tabulated per call (bounds the count cube: cells x households x 192 bins)."""

PERSON_COLUMNS = ("RTYPE", "QAGE", "CENHISP", "CENRACE", "RELSHIP")
UNIT_COLUMNS = ("RTYPE", "HHT", "HHT2", "CPLT", "TEN", "HHRACE", "HHSPAN")
PERSON_DEFAULT = {"RTYPE": 3, "QAGE": 30, "CENHISP": 1, "CENRACE": 1, "RELSHIP": 20}
UNIT_DEFAULT = {"RTYPE": 2, "HHT": 1, "HHT2": 1, "CPLT": 1, "TEN": 1, "HHRACE": 1, "HHSPAN": 1,
                "FINAL_POP": 1, "NPF": 2}
_RACE = {Source.PERSON: ("CENRACE", "CENHISP"), Source.UNIT: ("HHRACE", "HHSPAN")}
_FILE = {Source.PERSON: "persons", Source.UNIT: "units"}


# --------------------------------------------------------------------------------------------
# The universe of one table
# --------------------------------------------------------------------------------------------


def _domain(source: Source, column: str) -> list[int]:
    for c in FILES[_FILE[source]]:
        if c.name == column:
            if c.allowed is not None:
                return sorted(c.allowed)
            assert c.minimum is not None and c.maximum is not None
            return list(range(c.minimum, c.maximum + 1))
    raise KeyError(column)


def _atoms(values: list[int], sets: list[frozenset[int]]) -> list[int]:
    """One value (the smallest) of each class of values no set tells apart."""
    seen: dict[tuple[bool, ...], int] = {}
    for v in values:
        seen.setdefault(tuple(v in s for s in sets), v)
    return sorted(seen.values())


def race_atoms(source: Source) -> list[tuple[int, int]]:
    """(race, ethnicity) values: one per (A-G code, H/I outcome) with A-G code A or B."""
    race_col, eth_col = _RACE[source]
    races, eths = _domain(source, race_col), [1, 2]
    if source is Source.UNIT:
        races = [r for r in races if r >= 1]  # 00 is "not in universe": no iteration code
        eths = [e for e in eths if e >= 1]
    pairs = [(r, e) for r in races for e in eths]
    race = np.array([r for r, _ in pairs])
    eth = np.array([e for _, e in pairs])
    ag = iteration_index(IterationLevel.RACE_ALONE, race, eth)
    hi = iteration_index(IterationLevel.HISPANIC, race, eth)
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    for (r, e), a, h in zip(pairs, ag, hi):
        if int(a) <= 1:  # A or B
            seen.setdefault((int(a), int(h)), (r, e))
    return sorted(seen.values())


def _conditions(spec: TableSpec, source: Source) -> dict[str, list[frozenset[int]]]:
    out: dict[str, list[frozenset[int]]] = {}
    every = list(spec.person_universe) + list(spec.unit_universe) + [c for cell in spec.basis for c in cell.conditions]
    for cond in every:
        if cond.source is source:
            out.setdefault(cond.column, []).append(cond.values)
    return out


def _classes(spec: TableSpec, source: Source) -> list[dict[str, int]]:
    """Every class of records of ``source`` the table distinguishes (see the module docstring)."""
    default = PERSON_DEFAULT if source is Source.PERSON else UNIT_DEFAULT
    conds = _conditions(spec, source)
    race_col, eth_col = _RACE[source]
    axes: list[list[tuple[tuple[str, int], ...]]] = []
    for column, sets in conds.items():
        if column in (race_col, eth_col):
            raise AssertionError(f"{spec.name}: a cell reads {column}; extend the check")
        axes.append([((column, v),) for v in _atoms(_domain(source, column), sets)])
    iterates = spec.iteration_source is not IterationSource.NONE
    if iterates and (spec.iteration_source is IterationSource.PERSON) == (source is Source.PERSON):
        axes.append([((race_col, r), (eth_col, e)) for r, e in race_atoms(source)])
    out = []
    for combo in itertools.product(*axes):
        record = dict(default)
        for part in combo:
            record.update(part)
        out.append(record)
    return out


def _meets(record: dict[str, int], conditions: tuple[Any, ...], source: Source) -> bool:
    return all(record[c.column] in c.values for c in conditions if c.source is source)


@dataclass
class Universe:
    """The households of one table at one tau (see the module docstring).

    Attributes:
        persons: Person record classes (dicts of column values); the first may be the one
            record outside the table's person universe.
        units: Unit record classes.
        sizes: Largest household (tau + 2; 2 for unit tables, whose persons only make the
            household exist).
        counts: One row per household composition: how many persons of each class.
        valid: composition x unit: the tabulation accepts the household.
    """

    spec: TableSpec
    tau: int | None
    persons: list[dict[str, int]]
    units: list[dict[str, int]]
    sizes: int
    counts: np.ndarray
    valid: np.ndarray
    index: dict[tuple[int, ...], int] = field(default_factory=dict)


def universe(table: str, tau: int | None) -> Universe:
    spec = TABLES[table]
    units = _classes(spec, Source.UNIT)
    if spec.kind is TableKind.UNIT:
        persons = [dict(PERSON_DEFAULT)]  # a unit table reads no person: they make the household
        sizes = 2
    else:
        assert tau is not None
        candidates = _classes(spec, Source.PERSON)
        inside = [p for p in candidates if _meets(p, spec.person_universe, Source.PERSON)]
        outside = [p for p in candidates if not _meets(p, spec.person_universe, Source.PERSON)]
        # A class in the universe that no unit takes (RELSHIP 37 under 18 in PH3) is never in a
        # valid household: left out.
        fits = _consistency(spec, inside, units).any(axis=1)
        persons = outside[:1] + [p for p, ok in zip(inside, fits) if ok]
        sizes = tau + 2
    n_p = len(persons)
    comps = [c for k in range(sizes + 1) for c in itertools.combinations_with_replacement(range(n_p), k)]
    counts = np.zeros((len(comps), n_p), dtype=np.int64)
    for i, c in enumerate(comps):
        for p in c:
            counts[i, p] += 1
    consistent = _consistency(spec, persons, units)  # person class x unit class
    # A household is valid when every one of its persons is consistent with its unit.
    valid = np.ones((len(comps), len(units)), dtype=bool)
    for p in range(n_p):
        valid &= ~((counts[:, p] > 0)[:, None] & ~consistent[p][None, :])
    return Universe(spec, tau, persons, units, sizes, counts, valid)


def _consistency(spec: TableSpec, persons: list[dict[str, int]], units: list[dict[str, int]]) -> np.ndarray:
    """person class x unit class: a person of the class in a unit of the class is tabulated
    without error (outside a universe, or in exactly one cell -- the production lookup)."""
    lookup = cell_lookup(spec.basis)
    out = np.ones((len(persons), len(units)), dtype=bool)
    if spec.kind is TableKind.UNIT:
        for j, unit in enumerate(units):
            if _meets(unit, spec.unit_universe, Source.UNIT):
                cell = lookup.cell_index_of(lambda s, c: np.array([unit.get(c, 0)]))
                out[:, j] = cell[0] >= 0
        return out
    for i, person in enumerate(persons):
        for j, unit in enumerate(units):
            if not (_meets(person, spec.person_universe, Source.PERSON) and _meets(unit, spec.unit_universe, Source.UNIT)):
                continue
            record = {Source.PERSON: person, Source.UNIT: unit}
            cell = lookup.cell_index_of(lambda s, c: np.array([record[s].get(c, 0)]))
            out[i, j] = cell[0] >= 0
    return out


# --------------------------------------------------------------------------------------------
# Every household's vector, by the production tabulation
# --------------------------------------------------------------------------------------------


def _columns(records: list[dict[str, int]], names: tuple[str, ...], source: str) -> dict[str, np.ndarray]:
    dtypes = {c.name: (c.dtype or np.int64) for c in FILES[source]}
    return {n: np.array([r[n] for r in records], dtype=dtypes[n]) for n in names}


def _matrix(records: list[dict[str, int]], names: tuple[str, ...]) -> np.ndarray:
    return np.array([[r[n] for n in names] for r in records], dtype=np.int64).reshape(len(records), len(names))


def household_vectors(u: Universe) -> dict[IterationLevel, np.ndarray]:
    """iteration level -> (MAFID, composition, unit, codes x cells) counts of every household
    (zeros where the household is not valid)."""
    spec = u.spec
    n_c, n_u, n_m = len(u.counts), len(u.units), len(MAFIDS)
    levels = spec.iteration_levels
    dims = {lv: len(lv.codes) * len(spec.basis) for lv in levels}
    out = {lv: np.zeros((n_m, n_c, n_u, dims[lv]), dtype=np.int64) for lv in levels}
    valid = u.valid.copy()
    valid[0, :] = False  # the empty household has no unit and no rows: its vector is 0
    mm, cc, jj = np.nonzero(np.broadcast_to(valid, (n_m, n_c, n_u)))
    person_names, unit_names = PERSON_COLUMNS, UNIT_COLUMNS + ("FINAL_POP", "NPF")
    pmat, umat = _matrix(u.persons, person_names), _matrix(u.units, unit_names)
    pdtype = {c.name: (c.dtype or np.int64) for c in FILES["persons"]}
    udtype = {c.name: (c.dtype or np.int64) for c in FILES["units"]}
    mafids = np.array(MAFIDS, dtype=np.int32)
    tau = u.tau if spec.kind is TableKind.PERSON else None
    for start in range(0, len(mm), CHUNK):
        m, c, j = mm[start:start + CHUNK], cc[start:start + CHUNK], jj[start:start + CHUNK]
        n = len(m)
        per = u.counts[c]  # households x person classes
        group = np.repeat(np.repeat(np.arange(n), per.shape[1]), per.reshape(-1))
        klass = np.repeat(np.tile(np.arange(per.shape[1]), n), per.reshape(-1))
        persons = {name: pmat[klass, k].astype(pdtype[name]) for k, name in enumerate(person_names)}
        persons["MAFID"] = mafids[m[group]]
        units = {name: umat[j, k].astype(udtype[name]) for k, name in enumerate(unit_names)}
        units["MAFID"] = mafids[m]
        part = Partition(
            units=units,
            unit_state=np.arange(n, dtype=np.int64),  # each household its own "state": its own vector
            unit_group=np.arange(n, dtype=np.int64),
            persons=persons,
            person_group=group.astype(np.int64),
            n_groups=n,
        )
        counts = tabulate_partition(spec, part, n, tau=tau, key=KEY)
        for lv in levels:
            out[lv][m, c, j] = counts.by_level[lv].reshape(n, -1)
    return out


# --------------------------------------------------------------------------------------------
# Neighbours and their distances
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One household's change: composition and unit before -> after, at one MAFID."""

    mafid: int
    before: tuple[int, int]  # (composition, unit)
    after: tuple[int, int]


@dataclass
class Maximum:
    value: int = -1
    witness: tuple[Change, ...] = ()
    states: tuple[int, ...] = ()

    def offer(self, value: int, witness: tuple[Change, ...], states: tuple[int, ...] = ()) -> None:
        if value > self.value:
            self.value, self.witness, self.states = value, witness, states


@dataclass
class LevelResult:
    """The maxima of one table x iteration level (squared L2 and L1), with their witnesses."""

    l1: Maximum = field(default_factory=Maximum)
    l2_squared: Maximum = field(default_factory=Maximum)
    bounded_l1: dict[str, Maximum] = field(default_factory=lambda: {"same": Maximum(), "apart": Maximum()})
    bounded_l2_squared: dict[str, Maximum] = field(default_factory=lambda: {"same": Maximum(), "apart": Maximum()})
    neighbour_pairs: int = 0


def _transitions(u: Universe) -> tuple[np.ndarray, np.ndarray]:
    """(additions, same-household changes): pairs of compositions (before, after)."""
    n_c, n_p = u.counts.shape
    base = u.sizes + 1
    weight = base ** np.arange(n_p, dtype=np.int64)
    code = u.counts @ weight
    order = np.argsort(code)

    def find(codes: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(code[order], codes)
        assert (code[order][pos] == codes).all()
        return order[pos]

    size = u.counts.sum(axis=1)
    c, p = np.nonzero(np.broadcast_to((size < u.sizes)[:, None], (n_c, n_p)))
    add = np.stack([c, find(code[c] + weight[p])], axis=1)
    if u.spec.kind is not TableKind.PERSON:
        return add, np.zeros((0, 2), dtype=np.int64)
    # One record changed in place: q -> p, p == q included (a change of a column the table does
    # not read; the unit record may change all the same).
    c, q, p = np.nonzero(np.broadcast_to((u.counts > 0)[:, :, None], (n_c, n_p, n_p)))
    same = np.stack([c, find(code[c] - weight[q] + weight[p])], axis=1)
    return add, same


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(a, axis=0, return_index=True, return_inverse=True)`` for small integers, fast:
    (distinct rows, index of each one's first row, each row's distinct row)."""
    a = np.asarray(a, dtype=np.int64)
    n, d = a.shape
    if n == 0:
        return a, np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo = a.min(axis=0)
    span = a.max(axis=0) - lo + 1
    if math.prod(int(x) for x in span) < 2**62:  # one integer key per row
        strides = np.cumprod(np.concatenate([[1], span[:0:-1]]))[::-1].astype(np.int64)
        key = (a - lo) @ strides
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:
        order = np.lexsort(a.T[::-1])
        s = a[order]
        new = np.concatenate([[True], (s[1:] != s[:-1]).any(axis=1)])
        group = np.cumsum(new) - 1
        first = order[new]
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = group
    return a[first], first, inverse.reshape(-1)


def _vector_ids(vectors: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct vectors, id of each household: -1 where not valid)."""
    n_m, n_c, n_u, d = vectors.shape
    flat = vectors.reshape(-1, d)
    distinct, _, ids = unique_rows(flat)
    ids = ids.reshape(n_m, n_c, n_u).copy()
    ids[:, ~valid] = -1
    return distinct, ids


def _pair_changes(ids_m: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (vector before, vector after) of household changes along ``pairs`` of compositions,
    whatever the units before and after: distinct id pairs, each with one change realising it
    (composition before, unit before, composition after, unit after)."""
    n_u = ids_m.shape[1]
    # Compositions with the same row of ids (over units) behave alike: deduplicate them first.
    rows, _, sig = unique_rows(ids_m)
    sig_pairs, first, _ = unique_rows(np.stack([sig[pairs[:, 0]], sig[pairs[:, 1]]], axis=1))
    found_pairs, found_realised = [], []
    step = max(1, 2_000_000 // (n_u * n_u))
    for lo in range(0, len(sig_pairs), step):
        sp = sig_pairs[lo:lo + step]
        a = np.broadcast_to(rows[sp[:, 0]][:, :, None], (len(sp), n_u, n_u))  # (k, unit before, unit after)
        b = np.broadcast_to(rows[sp[:, 1]][:, None, :], (len(sp), n_u, n_u))
        k, ub, ua = np.nonzero((a >= 0) & (b >= 0))
        id_pairs = np.stack([a[k, ub, ua], b[k, ub, ua]], axis=1)
        uniq, where, _ = unique_rows(id_pairs)
        comp = pairs[first[lo + k[where]]]
        found_pairs.append(uniq)
        found_realised.append(np.stack([comp[:, 0], ub[where], comp[:, 1], ua[where]], axis=1))
    allp = np.concatenate(found_pairs)
    allr = np.concatenate(found_realised)
    uniq, where, _ = unique_rows(allp)
    return uniq, allr[where]


def _norms(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.abs(d).sum(axis=1), (d * d).sum(axis=1)


def _best_sum(plus: np.ndarray, minus: np.ndarray, norm: str) -> tuple[int, int, int]:
    """max over y in plus, x in minus of ||y - x|| (L1, or squared L2), exactly, with pruning:
    ||y - x|| <= ||y|| + ||x||. Returns (value, index in plus, index in minus)."""
    if norm == "l1":
        ny, nx = np.abs(plus).sum(axis=1), np.abs(minus).sum(axis=1)
        bound = lambda a, b: a + b  # noqa: E731
    else:
        ny, nx = np.sqrt((plus * plus).sum(axis=1)), np.sqrt((minus * minus).sum(axis=1))
        bound = lambda a, b: (a + b) ** 2 + 1e-6  # noqa: E731
    oy, ox = np.argsort(-ny, kind="stable"), np.argsort(-nx, kind="stable")
    best, arg = -1, (0, 0)
    for i in oy:
        if bound(ny[i], nx[ox[0]]) <= best:
            break
        cand = ox[bound(ny[i], nx[ox]) > best]
        diff = plus[i][None, :] - minus[cand]
        values = np.abs(diff).sum(axis=1) if norm == "l1" else (diff * diff).sum(axis=1)
        j = int(np.argmax(values))
        if values[j] > best:
            best, arg = int(values[j]), (int(i), int(cand[j]))
    return best, arg[0], arg[1]


def check(table: str, tau: int | None) -> dict[IterationLevel, LevelResult]:
    """The maxima of every iteration level of ``table`` at ``tau`` (see the module docstring)."""
    u = universe(table, tau)
    vectors = household_vectors(u)
    add, same = _transitions(u)
    results: dict[IterationLevel, LevelResult] = {}
    for lv, vec in vectors.items():
        res = LevelResult()
        distinct, ids = _vector_ids(vec, u.valid)
        plus: list[tuple[np.ndarray, np.ndarray, int]] = []
        for m in range(len(MAFIDS)):
            pairs, realised = _pair_changes(ids[m], add)
            res.neighbour_pairs += len(pairs)
            d = distinct[pairs[:, 1]] - distinct[pairs[:, 0]]
            l1, l2 = _norms(d)
            for values, target in ((l1, res.l1), (l2, res.l2_squared)):
                i = int(np.argmax(values))
                c0, u0, c1, u1 = realised[i]
                target.offer(int(values[i]), (Change(MAFIDS[m], (c0, u0), (c1, u1)),))
            # Distinct addition changes (a removal is one of them reversed), for two households.
            vecs, first, _ = unique_rows(d)
            plus.append((vecs, realised[first], m))
            if len(same):
                spairs, srealised = _pair_changes(ids[m], same)
                res.neighbour_pairs += len(spairs)
                sl1, sl2 = _norms(distinct[spairs[:, 1]] - distinct[spairs[:, 0]])
                for values, target in ((sl1, res.bounded_l1["same"]), (sl2, res.bounded_l2_squared["same"])):
                    i = int(np.argmax(values))
                    c0, u0, c1, u1 = srealised[i]
                    target.offer(int(values[i]), (Change(MAFIDS[m], (c0, u0), (c1, u1)),))
        # Bounded, two households at different MAFIDs: one loses the record, the other gains it.
        for (ya, ra, ma), (xb, rb, mb) in itertools.permutations(plus, 2):
            for norm, targets in (("l1", res.bounded_l1), ("l2", res.bounded_l2_squared)):
                value, i, j = _best_sum(ya, xb, norm)
                gain = Change(MAFIDS[ma], (ra[i][0], ra[i][1]), (ra[i][2], ra[i][3]))
                lose = Change(MAFIDS[mb], (rb[j][2], rb[j][3]), (rb[j][0], rb[j][1]))  # reversed
                targets["same"].offer(value, (lose, gain), (0, 0))
                # In two states the two changes are in different coordinates: norms add.
                ny, nx = _norms(ya)[0 if norm == "l1" else 1], _norms(xb)[0 if norm == "l1" else 1]
                i, j = int(np.argmax(ny)), int(np.argmax(nx))
                gain = Change(MAFIDS[ma], (ra[i][0], ra[i][1]), (ra[i][2], ra[i][3]))
                lose = Change(MAFIDS[mb], (rb[j][2], rb[j][3]), (rb[j][0], rb[j][1]))
                targets["apart"].offer(int(ny[i] + nx[j]), (lose, gain), (0, 1))
        results[lv] = res
    return results


# --------------------------------------------------------------------------------------------
# Witnesses through the whole production path
# --------------------------------------------------------------------------------------------


def witness_config(table: str, tau: int | None, *, exact: bool = True) -> PHSafeConfig:
    """A config measuring every level of ``table`` (budget 1) in the check's two states."""
    budgets = {t: {lv.config_key: Decimal(1 if t == table else 0) for lv in TABLE_LEVELS[t]} for t in MEASURED_TABLES}
    taus = {t: (tau if t == table and tau else 1) for t in MEASURED_TABLES if TABLES[t].tau_key}
    return parse_config({"privacy_defn": "zcdp", "privacy_budget": budgets, "tau": taus, "state_filter": list(STATES),
                         "reader": "csv", "sensitivity": "exact" if exact else "paper"})


def _dataset(u: Universe, households: list[tuple[int, int, int, int]]) -> InputTables:
    """Input columns of households (MAFID, composition, unit, state index)."""
    units, persons, geo = [], [], []
    for mafid, comp, unit, state in households:
        if comp == 0:
            continue  # no person, no unit
        units.append({**u.units[unit], "MAFID": mafid})
        geo.append({"RTYPE": 2, "MAFID": mafid, "TABBLKST": int(STATES[state])})
        for p, k in enumerate(u.counts[comp]):
            persons.extend({**u.persons[p], "MAFID": mafid} for _ in range(k))
    return InputTables(
        persons=_columns(persons, ("MAFID",) + PERSON_COLUMNS, "persons"),
        units=_columns(units, ("MAFID",) + UNIT_COLUMNS + ("FINAL_POP", "NPF"), "units"),
        geo=_columns(geo, ("RTYPE", "MAFID", "TABBLKST"), "geo"),
    )


def run_vectors(config: PHSafeConfig, table: str, inputs: InputTables) -> dict[str, np.ndarray]:
    """Measurement key -> exact vector, as a release computes it (preprocess, tabulate, plan)."""
    spec = TABLES[table]
    data = prepare(inputs, config.states)
    counts = tabulate([spec], data, taus=dict(config.tau), key=KEY)[table]
    return {m.key: exact_vector(m, counts) for m in plan_run(config).for_table(table)}


def witness_distances(table: str, tau: int | None, witness: tuple[Change, ...], states: tuple[int, ...]
                      ) -> dict[str, tuple[int, int]]:
    """Measurement key -> (L1, squared L2) distance between the witness's two datasets, through
    the whole production path. Two households keep distinct MAFIDs (a second copy of a
    composition is moved to a third MAFID when both changes sit at the same one)."""
    u = universe(table, tau)
    config = witness_config(table, tau)
    mafids = [c.mafid for c in witness]
    if len(mafids) == 2 and mafids[0] == mafids[1]:
        raise AssertionError("two households at one MAFID")
    states = states or (0,) * len(witness)
    before = _dataset(u, [(c.mafid, *c.before, s) for c, s in zip(witness, states)])
    after = _dataset(u, [(c.mafid, *c.after, s) for c, s in zip(witness, states)])
    x, y = run_vectors(config, table, before), run_vectors(config, table, after)
    out = {}
    for key in x:
        d = y[key] - x[key]
        out[key] = (int(np.abs(d).sum()), int((d * d).sum()))
    return out


def measurement_levels(table: str, iteration: IterationLevel) -> list[PopulationGroupLevel]:
    return [lv for lv in ALL_LEVELS if lv.iteration is iteration and lv in TABLE_LEVELS[table]]


def planned(table: str, tau: int | None) -> dict[str, PlannedMeasurement]:
    return {m.key: m for m in plan_run(witness_config(table, tau)).for_table(table)}


def is_zcdp(config: PHSafeConfig) -> bool:
    return config.privacy_defn is PrivacyDefinition.ZCDP


def l2(squared: int) -> float:
    return math.sqrt(squared)
