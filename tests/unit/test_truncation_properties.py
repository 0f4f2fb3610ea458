"""Property tests of truncate-and-join and the exact count vectors (spec §5, paper Lemma 6).

Random small, *consistent* household data is generated as Python records (households of 1..15
persons with a householder, an optional spouse or partner, relatives and nonrelatives of all ages;
vacant units; group quarters; a few states, one of them outside the state filter). The unit record
of a household (HHT, HHT2, CPLT, NPF, FINAL_POP, HHRACE, HHSPAN) is *derived* from its persons by
the rules of spec §1, so every in-universe record maps to a cell.

Properties:

* adding or removing one person, together with the change that makes to their household's unit
  record, changes every person table's exact (truncated) count vector at every population-group
  level (nation = sum of states) by at most 2*tau + 2 in L1 norm (hence L2), and every unit
  table's by at most 2;
* at most tau persons per household survive truncation -- exactly min(n, tau) of the n
  in-universe ones;
* the kept set does not depend on row order;
* with every household at most tau, truncated counts equal untruncated counts;
* untruncated counts equal an independent tabulation written here from the spec.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from phsafe.iterations import GeographyLevel
from phsafe.preprocess import partitions, prepare
from phsafe.reader import InputTables
from phsafe.tables import TABLES, TableKind
from phsafe.tabulate import _Shared as PartitionJoins  # the joins the counting runs (private: tested directly)
from phsafe import tabulate as tabulate_module
from phsafe.tabulate import tabulate
from phsafe.truncation import TRUNCATION_KEY_BYTES, truncate

PERSON_TABLES = ("PH1_num", "PH2", "PH3", "PH4", "PH6", "PH7")
UNIT_TABLES = ("PH1_denom", "PH5_denom", "PH8_denom")
STATE_POOL = ("01", "06", "11", "36", "56")
OUTSIDE_STATE = "02"  # never in the state filter: its records must never be counted

PROPERTY_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------------------------
# Records and the derivation of a unit record from its persons (spec §1)
# --------------------------------------------------------------------------------------------


@dataclass
class Person:
    rel: int
    age: int
    race: int
    eth: int

    @property
    def rtype(self) -> int:
        return 5 if self.rel in (37, 38) else 3


@dataclass
class Unit:
    kind: str  # "hh" (housing unit, occupied or vacant) or "gq"
    state: str
    ten: int  # tenure when occupied
    female: bool  # sex of the householder (chooses among HHT / HHT2 variants)
    members: list[Person] = field(default_factory=list)


RELATIVES = {21, 23, 25, 26, 27, 28, 29, 30, 31, 32, 33}


def unit_record(u: Unit) -> dict[str, int]:
    """The unit's record, derived from its persons."""
    n = len(u.members)
    if u.kind == "gq":
        return dict(RTYPE=4, FINAL_POP=n, NPF=0, HHSPAN=0, HHRACE=0, TEN=0, HHT=0, HHT2=0, CPLT=0)
    if n == 0:  # vacant
        return dict(RTYPE=2, FINAL_POP=0, NPF=0, HHSPAN=0, HHRACE=0, TEN=0, HHT=0, HHT2=0, CPLT=0)
    rels = [p.rel for p in u.members]
    householders = [p for p in u.members if p.rel == 20]
    # Without a householder (one was removed), another member stands in for HHRACE/HHSPAN.
    head = householders[0] if householders else u.members[0]
    own_child = any(p.rel in (25, 26, 27) and p.age < 18 for p in u.members)
    relatives = sum(r in RELATIVES for r in rels)
    spouse = next((r for r in rels if r in (21, 23)), None)
    partner = next((r for r in rels if r in (22, 24)), None)
    if spouse is not None:
        hht, hht2, cplt = 1, 1 if own_child else 2, 1 if spouse == 21 else 2
    else:
        if relatives:
            hht = 3 if u.female else 2
        elif n == 1:
            hht = 6 if u.female else 4
        else:
            hht = 7 if u.female else 5
        if partner is not None:
            hht2, cplt = (3 if own_child else 4), (3 if partner == 22 else 4)
        else:
            cplt = 5
            base = 5 if u.female else 9
            if own_child:
                hht2 = base + 1
            elif n == 1:
                hht2 = base
            elif relatives:
                hht2 = base + 2
            else:
                hht2 = base + 3
    npf = 1 + relatives if hht in (1, 2, 3) else 0
    return dict(RTYPE=2, FINAL_POP=n, NPF=npf, HHSPAN=head.eth, HHRACE=head.race, TEN=u.ten, HHT=hht,
                HHT2=hht2, CPLT=cplt)


@dataclass
class Dataset:
    states: tuple[str, ...]  # the state filter, sorted
    units: list[Unit]

    def inputs(self, person_order: np.ndarray | None = None, unit_order: np.ndarray | None = None) -> InputTables:
        prow: dict[str, list[int]] = {k: [] for k in ("RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP")}
        urow: dict[str, list[int]] = {k: [] for k in ("RTYPE", "MAFID", "FINAL_POP", "NPF", "HHSPAN", "HHRACE",
                                                      "TEN", "HHT", "HHT2", "CPLT")}
        grow: dict[str, list[int]] = {k: [] for k in ("RTYPE", "MAFID", "TABBLKST")}
        for i, u in enumerate(self.units):
            mafid = 100_000_001 + 7 * i
            rec = unit_record(u)
            for k in urow:
                urow[k].append(mafid if k == "MAFID" else rec[k])
            grow["RTYPE"].append(rec["RTYPE"])
            grow["MAFID"].append(mafid)
            grow["TABBLKST"].append(int(u.state))
            for p in u.members:
                for k, v in (("RTYPE", p.rtype), ("MAFID", mafid), ("QAGE", p.age), ("CENHISP", p.eth),
                             ("CENRACE", p.race), ("RELSHIP", p.rel)):
                    prow[k].append(v)

        def cols(rows: dict[str, list[int]], order: np.ndarray | None) -> dict[str, np.ndarray]:
            out = {}
            for k, v in rows.items():
                dtype = np.int32 if k == "MAFID" else np.uint32 if k == "FINAL_POP" else np.uint8
                arr = np.array(v, dtype=dtype)
                out[k] = arr[order] if order is not None else arr
            return out

        return InputTables(cols(prow, person_order), cols(urow, unit_order), cols(grow, unit_order))

    @property
    def n_persons(self) -> int:
        return sum(len(u.members) for u in self.units)


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------

races = st.one_of(st.integers(1, 8), st.integers(1, 63))
ethnicities = st.integers(1, 2)
ages = st.one_of(st.integers(0, 17), st.integers(0, 115))


@st.composite
def members_of_household(draw: st.DrawFn) -> list[Person]:
    n = draw(st.integers(1, 15))
    people = [Person(20, draw(st.integers(15, 100)), draw(races), draw(ethnicities))]
    if n >= 2 and draw(st.booleans()):
        people.append(Person(draw(st.sampled_from([21, 22, 23, 24])), draw(st.integers(15, 100)), draw(races),
                             draw(ethnicities)))
    while len(people) < n:
        people.append(Person(draw(st.integers(25, 36)), draw(ages), draw(races), draw(ethnicities)))
    return people


@st.composite
def units(draw: st.DrawFn, state: str) -> Unit:
    kind = draw(st.sampled_from(["hh", "hh", "hh", "hh", "vacant", "gq"]))
    ten, female = draw(st.integers(1, 4)), draw(st.booleans())
    if kind == "vacant":
        return Unit("hh", state, ten, female, [])
    if kind == "gq":
        n = draw(st.integers(1, 6))
        return Unit("gq", state, ten, female,
                    [Person(draw(st.sampled_from([37, 38])), draw(ages), draw(races), draw(ethnicities))
                     for _ in range(n)])
    return Unit("hh", state, ten, female, draw(members_of_household()))


@st.composite
def datasets(draw: st.DrawFn, max_units: int = 10) -> Dataset:
    states = tuple(sorted(draw(st.sets(st.sampled_from(STATE_POOL), min_size=1, max_size=3))))
    where = st.sampled_from(states + (OUTSIDE_STATE,))
    n_units = draw(st.integers(1, max_units))
    data = [draw(units(draw(where))) for _ in range(n_units)]
    # At least one housing unit is tabulated (a filter matching no record at all is the subject of
    # test_state_filter_matching_no_record_gives_zero_vectors).
    data[0].state, data[0].kind = states[0], "hh"
    return Dataset(states, data)


taus_strategy = st.fixed_dictionaries({t: st.integers(1, 6) for t in PERSON_TABLES})
keys = st.binary(min_size=TRUNCATION_KEY_BYTES, max_size=TRUNCATION_KEY_BYTES)


@st.composite
def neighbours(draw: st.DrawFn, data: Dataset) -> tuple[str, Dataset]:
    """A dataset differing from ``data`` by one person, with its unit record re-derived."""
    other = copy.deepcopy(data)
    ops = []
    if data.n_persons:
        ops += ["remove"] * 3
    if any(u.kind == "hh" and u.members for u in data.units):
        ops += ["add member"] * 3
    if any(u.kind == "hh" and not u.members for u in data.units):
        ops.append("add householder to vacant")
    if any(u.kind == "gq" for u in data.units):
        ops.append("add gq person")
    ops.append("new household")
    op = draw(st.sampled_from(ops))
    if op == "remove":
        people = [(i, j) for i, u in enumerate(other.units) for j in range(len(u.members))]
        i, j = draw(st.sampled_from(people))
        del other.units[i].members[j]  # the unit record is re-derived from the rest
    elif op == "add member":
        i = draw(st.sampled_from([i for i, u in enumerate(other.units) if u.kind == "hh" and u.members]))
        u = other.units[i]
        allowed = list(range(25, 37))
        if not any(p.rel in (21, 22, 23, 24) for p in u.members):
            allowed += [21, 22, 23, 24]
        u.members.append(Person(draw(st.sampled_from(allowed)), draw(ages), draw(races), draw(ethnicities)))
    elif op == "add householder to vacant":
        i = draw(st.sampled_from([i for i, u in enumerate(other.units) if u.kind == "hh" and not u.members]))
        other.units[i].members.append(Person(20, draw(st.integers(15, 100)), draw(races), draw(ethnicities)))
    elif op == "add gq person":
        i = draw(st.sampled_from([i for i, u in enumerate(other.units) if u.kind == "gq"]))
        other.units[i].members.append(Person(draw(st.sampled_from([37, 38])), draw(ages), draw(races),
                                             draw(ethnicities)))
    else:
        state = draw(st.sampled_from(data.states + (OUTSIDE_STATE,)))
        other.units.append(Unit("hh", state, draw(st.integers(1, 4)), draw(st.booleans()),
                                [Person(20, draw(st.integers(15, 100)), draw(races), draw(ethnicities))]))
    return op, other


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def count_vectors(data: Dataset, taus: dict[str, int] | None, key: bytes | None, **kw) -> dict[tuple[str, str], np.ndarray]:
    """(table, level) -> exact count vector of that population-group level (nation = sum of states)."""
    counts = tabulate(list(TABLES.values()), prepare(data.inputs(**kw), data.states), taus=taus, key=key)
    return cubes_to_vectors(counts)


def cubes_to_vectors(counts) -> dict[tuple[str, str], np.ndarray]:
    out = {}
    for name, tc in counts.items():
        for level in TABLES[name].levels:
            cube = tc.by_level[level.iteration]
            if level.geography is GeographyLevel.USA:
                cube = cube.sum(axis=0, keepdims=True)
            out[(name, level.config_key)] = cube.reshape(-1).copy()
    return out


PERSON_UNIVERSE: dict[str, Callable[[Person], bool]] = {
    "PH1_num": lambda p: p.rtype == 3,
    "PH2": lambda p: p.rtype == 3,
    "PH3": lambda p: p.rtype == 3 and p.age < 18,
    "PH4": lambda p: p.rel in {20, 21, 23} | set(range(25, 34)),
    "PH6": lambda p: p.age < 18 and p.rel in (25, 26, 27),
    "PH7": lambda p: p.rtype == 3,
}
UNIT_UNIVERSE: dict[str, Callable[[dict[str, int]], bool]] = {
    "PH4": lambda r: r["HHT"] in (1, 2, 3),
    "PH5_denom": lambda r: r["HHT"] in (1, 2, 3),
    "PH1_denom": lambda r: r["RTYPE"] == 2 and r["HHT"] != 0,
    "PH8_denom": lambda r: r["RTYPE"] == 2 and r["HHT"] != 0,
}


def spec_cell(table: str, p: Person | None, r: dict[str, int]) -> int:
    if table in ("PH1_num", "PH4"):
        return 2 if p.age < 18 else 3
    if table == "PH2":
        if r["HHT2"] in (1, 2):
            return {1: 3, 2: 4}[r["CPLT"]]
        if r["HHT2"] in (3, 4):
            return {3: 6, 4: 7}[r["CPLT"]]
        return {9: 9, 10: 10, 11: 10, 12: 10, 5: 12, 6: 13, 7: 13, 8: 13}[r["HHT2"]]
    if table == "PH3":
        if p.rel in (25, 26, 27):
            return {1: 4, 3: 5, 10: 6, 6: 7}[r["HHT2"]]
        return 9 if p.rel == 30 else 10 if p.rel in (28, 29, 31, 32, 33) else 2
    if table == "PH6":
        first = {1: 3, 3: 8, 10: 13, 6: 18}[r["HHT2"]]
        return first + (0 if p.age < 4 else 1 if p.age < 6 else 2 if p.age < 12 else 3)
    if table == "PH7":
        return {1: 2, 2: 3, 3: 4, 4: 4}[r["TEN"]]
    if table == "PH8_denom":
        return {1: 2, 2: 2, 3: 3, 4: 3}[r["TEN"]]
    return 1


def spec_codes(level: str, race: int, eth: int) -> str | None:
    if level == "*":
        return "*"
    if level == "A-G":
        return "ABCDEF"[race - 1] if race <= 6 else "G"
    return "H" if eth == 2 else "I" if race == 1 else None


def oracle_vectors(data: Dataset) -> dict[tuple[str, str], np.ndarray]:
    """Untruncated counts written from the spec, one record at a time."""
    out = {}
    for name, spec in TABLES.items():
        for level in spec.levels:
            geo, it = level.config_key.split("_", 1)
            regions = ["1"] if geo == "usa" else list(data.states)
            codes = level.iteration.codes
            cube = np.zeros((len(regions), len(codes), len(spec.basis)), dtype=np.int64)
            for u in data.units:
                if u.state not in data.states or u.kind == "gq":  # state filter; GQ geo RTYPE 4
                    continue
                r = unit_record(u)
                if not UNIT_UNIVERSE.get(name, lambda r: True)(r):
                    continue
                region = 0 if geo == "usa" else regions.index(u.state)
                if spec.kind is TableKind.UNIT:
                    records = [(None, r["HHRACE"], r["HHSPAN"])]
                else:
                    records = [(p, *((p.race, p.eth) if name == "PH3" else (r["HHRACE"], r["HHSPAN"])))
                               for p in u.members if PERSON_UNIVERSE[name](p)]
                for p, race, eth in records:
                    code = spec_codes(it, race, eth)
                    if code is None:
                        continue
                    cell = spec.basis_numbers.index(spec_cell(name, p, r))
                    cube[region, codes.index(code), cell] += 1
            out[(name, level.config_key)] = cube.reshape(-1)
    return out


def truncated_totals(data: Dataset, table: str, tau: int) -> dict[str, int]:
    """State -> number of records of ``table`` after truncation: sum of min(n_u, tau)."""
    totals = {s: 0 for s in data.states}
    for u in data.units:
        if u.state not in data.states or u.kind == "gq":
            continue
        if not UNIT_UNIVERSE.get(table, lambda r: True)(unit_record(u)):
            continue
        n = sum(PERSON_UNIVERSE[table](p) for p in u.members)
        totals[u.state] += min(n, tau)
    return totals


def joined_person_records(data: Dataset, taus: dict[str, int] | None, key: bytes | None, **kw):
    """Table -> (kept person records as sorted tuples, kept count per unit MAFID)."""
    prepared = prepare(data.inputs(**kw), data.states)
    (part,) = list(partitions(prepared))
    out = {}
    joins = PartitionJoins(part)
    for name in PERSON_TABLES:
        joined = joins.persons(TABLES[name], None if taus is None else taus[name], key)
        rows = joined.person_rows
        assert rows is not None
        # A joined person belongs to the unit it is joined to.
        assert (part.persons["MAFID"][rows] == part.units["MAFID"][joined.unit_rows]).all()
        records = sorted(zip(*(part.persons[c][rows].tolist()
                               for c in ("MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP", "RTYPE"))))
        mafids, per_unit = np.unique(part.units["MAFID"][joined.unit_rows], return_counts=True)
        out[name] = (records, dict(zip(mafids.tolist(), per_unit.tolist())))
    return out


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


@settings(PROPERTY_SETTINGS, max_examples=80)
@given(data=st.data(), base=datasets(), taus=taus_strategy, key=keys)
def test_neighbour_changes_counts_by_at_most_the_sensitivity(data, base: Dataset, taus, key: bytes) -> None:
    op, other = data.draw(neighbours(base), label="neighbour")
    event(op)
    event("a household is above tau" if any(len(u.members) > min(taus.values()) for u in base.units)
          else "no household above tau")
    before = count_vectors(base, taus, key)
    after = count_vectors(other, taus, key)
    assert before.keys() == after.keys()
    for (table, level), v in before.items():
        diff = np.abs(after[(table, level)] - v)
        l1 = int(diff.sum())
        bound = 2 * taus[table] + 2 if table in PERSON_TABLES else 2
        assert l1 <= bound, (op, table, level, l1, bound)
        assert float(np.sqrt((diff.astype(float) ** 2).sum())) <= bound


@PROPERTY_SETTINGS
@given(base=datasets(), taus=taus_strategy, key=keys)
def test_at_most_tau_persons_per_household_survive(base: Dataset, taus, key: bytes) -> None:
    kept = joined_person_records(base, taus, key)
    full = joined_person_records(base, None, None)
    for table in PERSON_TABLES:
        records, per_unit = kept[table]
        all_records, all_per_unit = full[table]
        tau = taus[table]
        assert all(n <= tau for n in per_unit.values()), table
        # Exactly min(n, tau) of each household's n in-universe persons are kept...
        assert per_unit == {m: min(n, tau) for m, n in all_per_unit.items()}, table
        # ...and they are some of its persons (a sub-multiset of the untruncated records).
        remaining = list(all_records)
        for rec in records:
            remaining.remove(rec)
        # Independent count: the number of kept records per state is sum of min(n, tau).
        expected_total = sum(truncated_totals(base, table, tau).values())
        assert len(records) == expected_total, table


@PROPERTY_SETTINGS
@given(base=datasets(), taus=taus_strategy, key=keys, seed=st.integers(0, 2**32 - 1))
def test_kept_set_does_not_depend_on_row_order(base: Dataset, taus, key: bytes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    person_order = rng.permutation(base.n_persons)
    unit_order = rng.permutation(len(base.units))
    ref_vectors = count_vectors(base, taus, key)
    ref_kept = joined_person_records(base, taus, key)
    for kw in ({"person_order": person_order}, {"unit_order": unit_order},
               {"person_order": person_order, "unit_order": unit_order}):
        vectors = count_vectors(base, taus, key, **kw)
        assert vectors.keys() == ref_vectors.keys()
        for k, v in ref_vectors.items():
            assert np.array_equal(vectors[k], v), (kw.keys(), k)
        kept = joined_person_records(base, taus, key, **kw)
        for table in PERSON_TABLES:
            assert kept[table][0] == ref_kept[table][0], (kw.keys(), table)


@PROPERTY_SETTINGS
@given(base=datasets(), key=keys, extra=st.integers(0, 3))
def test_no_household_above_tau_means_no_truncation(base: Dataset, key: bytes, extra: int) -> None:
    biggest = max([len(u.members) for u in base.units] + [1])
    taus = {t: biggest + extra for t in PERSON_TABLES}
    truncated = count_vectors(base, taus, key)
    untruncated = count_vectors(base, None, None)
    for k, v in untruncated.items():
        assert np.array_equal(truncated[k], v), k


@PROPERTY_SETTINGS
@given(base=datasets(), taus=taus_strategy, key=keys)
def test_truncated_totals_are_sums_of_min_n_tau(base: Dataset, taus, key: bytes) -> None:
    vectors = count_vectors(base, taus, key)
    for table in PERSON_TABLES:
        expected = truncated_totals(base, table, taus[table])
        state = vectors[(table, "state_*")].reshape(len(base.states), -1).sum(axis=1)
        assert dict(zip(base.states, state.tolist())) == expected, table
        assert int(vectors[(table, "usa_*")].sum()) == sum(expected.values()), table


@PROPERTY_SETTINGS
@given(base=datasets())
def test_untruncated_counts_equal_an_independent_tabulation(base: Dataset) -> None:
    """Both ways of counting: these few records go straight into each level's bins; forced
    through the (cell, state, race, ethnicity) cube that large inputs take, the same counts."""
    got = count_vectors(base, None, None)
    with mock.patch.object(tabulate_module, "_count_per_level", tabulate_module._count_through_cube):
        via_cube = count_vectors(base, None, None)
    expected = oracle_vectors(base)
    assert got.keys() == expected.keys() == via_cube.keys()
    for k, v in expected.items():
        assert got[k].tolist() == v.tolist(), k
        assert via_cube[k].tolist() == v.tolist(), k


@PROPERTY_SETTINGS
@given(base=datasets(max_units=14), taus=taus_strategy, key=keys, limit=st.integers(1, 40))
def test_partitioning_does_not_change_counts(base: Dataset, taus, key: bytes, limit: int) -> None:
    prepared = prepare(base.inputs(), base.states)
    one = cubes_to_vectors(tabulate(list(TABLES.values()), prepared, taus=taus, key=key))
    many = cubes_to_vectors(
        tabulate(list(TABLES.values()), prepared, taus=taus, key=key, max_persons_per_partition=limit)
    )
    for k, v in one.items():
        assert np.array_equal(many[k], v), k


# --------------------------------------------------------------------------------------------
# truncate() directly
# --------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 15), min_size=1, max_size=12),
    tau=st.integers(1, 8),
    key=keys,
    seed=st.integers(0, 2**32 - 1),
)
def test_truncate_keeps_min_n_tau_per_unit_independently_of_order(sizes, tau: int, key: bytes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    unit_rows = np.repeat(np.arange(len(sizes)), sizes).astype(np.int64)
    n = len(unit_rows)
    persons = {
        "MAFID": (100_000_001 + unit_rows).astype(np.int32),
        "QAGE": rng.integers(0, 116, n).astype(np.uint8),
        "CENHISP": rng.integers(1, 3, n).astype(np.uint8),
        "CENRACE": rng.integers(1, 64, n).astype(np.uint8),
        "RELSHIP": rng.integers(20, 37, n).astype(np.uint8),
        "RTYPE": np.full(n, 3, dtype=np.uint8),
    }
    keep = truncate(unit_rows, persons, np.arange(n, dtype=np.int64), tau, key)
    assert keep.dtype == bool and keep.shape == (n,)
    kept_per_unit = np.bincount(unit_rows[keep], minlength=len(sizes))
    assert kept_per_unit.tolist() == [min(s, tau) for s in sizes]

    def kept_records(order: np.ndarray) -> list[tuple[int, ...]]:
        permuted = {c: v[order] for c, v in persons.items()}
        k = truncate(unit_rows[order], permuted, np.arange(n, dtype=np.int64), tau, key)
        return sorted(zip(*(permuted[c][k].tolist() for c in persons)))

    assert kept_records(rng.permutation(n)) == kept_records(np.arange(n))


def test_truncate_rejects_tau_below_one() -> None:
    persons = {c: np.zeros(1, dtype=np.uint8) for c in ("QAGE", "CENHISP", "CENRACE", "RELSHIP", "RTYPE")}
    persons["MAFID"] = np.array([100_000_001], dtype=np.int32)
    with pytest.raises(ValueError):
        truncate(np.zeros(1, dtype=np.int64), persons, np.zeros(1, dtype=np.int64), 0, bytes(16))


def test_truncation_depends_on_the_key_not_on_age() -> None:
    """Over many keys, each of a household's persons is kept about equally often: the choice is
    by keyed hash, not by age or position (which would keep the same persons every time)."""
    n, tau, trials = 6, 2, 600
    unit_rows = np.zeros(n, dtype=np.int64)
    persons = {
        "MAFID": np.full(n, 100_000_001, dtype=np.int32),
        "QAGE": np.array([1, 10, 20, 40, 60, 90], dtype=np.uint8),
        "CENHISP": np.ones(n, dtype=np.uint8),
        "CENRACE": np.ones(n, dtype=np.uint8),
        "RELSHIP": np.array([20, 21, 25, 25, 29, 36], dtype=np.uint8),
        "RTYPE": np.full(n, 3, dtype=np.uint8),
    }
    rng = np.random.default_rng(5)
    kept = np.zeros(n)
    for _ in range(trials):
        key = rng.bytes(16)
        kept += truncate(unit_rows, persons, np.arange(n, dtype=np.int64), tau, key)
    # Each person kept with probability tau/n = 1/3: 200 expected of 600; sd ~ 11.5.
    assert (np.abs(kept - trials * tau / n) < 60).all(), kept


def test_state_filter_matching_no_record_gives_zero_vectors() -> None:
    """The released domain comes from the state filter, not from the records (spec §4): a run
    whose filtered states hold no tabulated unit still has the full, all-zero domain."""
    data = Dataset(("01", "06"), [
        Unit("hh", OUTSIDE_STATE, 1, False, [Person(20, 40, 1, 1), Person(25, 3, 1, 1)]),
        Unit("gq", "01", 0, False, [Person(37, 80, 2, 1)]),  # geo RTYPE 4: never tabulated
    ])
    for taus, key in ((None, None), ({t: 1 for t in PERSON_TABLES}, bytes(range(16)))):
        vectors = count_vectors(data, taus, key)
        assert set(vectors) == {(t, lv.config_key) for t, s in TABLES.items() for lv in s.levels}
        for (table, level), v in vectors.items():
            geo, iteration = level.split("_", 1)
            n_regions = 1 if geo == "usa" else 2
            n_codes = {"*": 1, "A-G": 7, "H,I": 2}[iteration]
            assert v.shape == (n_regions * n_codes * len(TABLES[table].basis),), (table, level)
            assert not v.any(), (table, level)


def test_hash_ties_are_broken_by_content_not_by_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should two records of a household hash alike, the choice between them is made by their
    content, so the kept set still does not depend on where the records stand in the file."""
    import phsafe.truncation as truncation

    monkeypatch.setattr(truncation, "siphash24_u64", lambda key, words: np.zeros(len(words), dtype=np.uint64))
    n, tau = 7, 3
    unit_rows = np.zeros(n, dtype=np.int64)
    persons = {
        "MAFID": np.full(n, 100_000_001, dtype=np.int32),
        "QAGE": np.array([50, 3, 77, 18, 3, 40, 9], dtype=np.uint8),
        "CENHISP": np.array([1, 2, 1, 1, 1, 2, 1], dtype=np.uint8),
        "CENRACE": np.array([1, 1, 6, 2, 1, 1, 3], dtype=np.uint8),
        "RELSHIP": np.array([20, 25, 29, 27, 25, 21, 30], dtype=np.uint8),
        "RTYPE": np.full(n, 3, dtype=np.uint8),
    }
    words = truncation.record_words(persons, np.arange(n, dtype=np.int64))
    expected = sorted(words.tolist())[:tau]  # every hash ties: the smallest contents stay
    rng = np.random.default_rng(11)
    for _ in range(20):
        order = rng.permutation(n)
        permuted = {c: v[order] for c, v in persons.items()}
        keep = truncate(unit_rows, permuted, np.arange(n, dtype=np.int64), tau, bytes(16))
        kept = truncation.record_words(permuted, np.flatnonzero(keep)).tolist()
        assert sorted(kept) == expected
