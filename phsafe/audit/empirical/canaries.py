"""Key-invariant canaries: pairs of neighbouring datasets whose exact counts the auditor knows.

A *canary* is one household in one state, in one of two versions:

* **out** -- the household of D (or no household at all: its MAFID is then in no file);
* **in** -- the household of D' = D plus one person, the unit record replaced as a household
  with that person would have it. The unit record may change in any way (the sensitivity proof's
  model, ``docs/sensitivity.md`` (M1): the unit record is any function of the household's
  persons), within the consistency rules of spec §1, which the input validation enforces: a
  spouse turns HHT2 06 into 01 with CPLT 1 and HHT 1, a relative turns a one-person household
  into a family, a roommate turns a family into a nonfamily household, the householder's race or
  tenure is replaced ...

Every measured level of every table has canaries that move it by the most a key-invariant
neighbour can (:data:`DESIGNS` in the docs, ``docs/empirical_audit.md``):

* **moves** -- the household's kept persons, tau of them, all change cell: -tau in one cell and
  +tau in another, L2 norm tau sqrt2 (units: -1 and +1, sqrt2). This is the exact sensitivity
  of every level whose cells or iteration codes read the unit (the proof's cases P-moves and
  U-moves), and the most any neighbour moves any level.
* **one more person** (PH1_num at ``*``): a household of at most tau persons gains one: +1 in
  one cell. The exact sensitivity there is sqrt2 (case P-fixed: the added person enters the kept
  set and pushes a kept one of another cell out), but which person truncation pushes out depends
  on the key: no key-invariant neighbour moves this level by more than 1 (1/sqrt2 of it).
* **family leaves** (PH4 at ``*``): a family of tau or more kept persons gains a roommate and the
  unit becomes a nonfamily household: -tau in one cell (case P-filtered: its exact sensitivity,
  tau).
* **a new household** (PH1_denom at ``*``) and **becomes a family** (PH5_denom at ``*``): +1 in
  the level's one cell (case U-single: its exact sensitivity, 1).

Its persons in the table's universe are either at most tau in both versions (nothing is
truncated) or at least tau and identical in everything the table counts them by, so *any* tau of
them count the same: the exact counts do not depend on the truncation key (:mod:`.oracle` checks
it). Most "moves" canaries have 3 tau such persons: a release that skips truncation, or keeps
tau + 1, moves three times (or (tau+1)/tau times) as much.

**Packing.** Each run holds many canaries, each in or out independently (a fair coin per canary
and run). A canary *owns* the cells of its change at a level when its change there is the
largest any candidate makes at that level (the level's *reach*) and no other canary of the run
owns any of them: the audit's statistic for a canary reads only the cells it owns, so the noise
it sees is independent of every other canary's (independent noise per cell), and the other
canaries' known shifts in those cells are subtracted exactly. Per state, canaries are chosen
greedily from each table's candidates, the one owning the most levels first; the same per
state. At the nation's levels every canary of a kind moves the same cells, so a nation cell
pair is owned by the first canary (in state order) moving it -- a few canaries per run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from phsafe.iterations import GeographyLevel, IterationLevel, PopulationGroupLevel
from phsafe.tables import TABLES, TableKind, TableSpec

from phsafe.audit.empirical.oracle import expected_counts

__all__ = ["PersonGroup", "UnitRecord", "Template", "Canary", "Layout", "candidates", "pack", "household_records",
           "local_counts", "sizes", "change_norm", "Shape"]

# Relationship codes (spec §1).
HOUSEHOLDER, SPOUSE, PARTNER, SAME_SEX_SPOUSE, SAME_SEX_PARTNER = 20, 21, 22, 23, 24
CHILD, OTHER_RELATIVE, ROOMMATE = 25, 33, 34
RACE_OF_CODE = (1, 2, 3, 4, 5, 6, 7)  # a race code of each A-G group: White ... two or more races (07)
FAMILY_RELSHIP = frozenset({SPOUSE, SAME_SEX_SPOUSE, *range(25, 34)})

# How a template's repeated group is sized (:func:`sizes`).
TRUNCATED = "truncated"  # tau or 3 tau alike persons in the universe: counted tau, whatever the key
SMALL = "small"  # at most tau persons in the universe in both versions: nothing is truncated
NO_GROUP = "none"  # no repeated group


@dataclass(frozen=True)
class PersonGroup:
    """``count`` identical person records (RTYPE 3)."""

    relship: int
    age: int
    race: int
    hispanic: int
    count: int = 1


@dataclass(frozen=True)
class UnitRecord:
    """The unit record's household attributes (RTYPE 2; FINAL_POP and NPF follow the persons)."""

    hht: int
    hht2: int
    cplt: int
    ten: int
    hhrace: int
    hhspan: int


@dataclass(frozen=True)
class Template:
    """A kind of canary.

    Attributes:
        name: What it is, for the report (e.g. ``own children 06->01, child A/I``).
        householder: The householder in both versions, or None (a new household: the added
            person is its householder).
        sized: The group repeated ``size`` times in both versions (own children, or relatives),
            or None.
        unit_out: The unit record of the household without the added person; None: without
            it there is no household (no person, unit or geo record).
        added: The person whose addition makes the neighbour.
        unit_in: The unit record of the household with the added person.
        sizing: How the repeated group is sized: :data:`TRUNCATED` or :data:`SMALL`
            (:func:`sizes`).
    """

    name: str
    householder: PersonGroup | None
    sized: PersonGroup | None
    unit_out: UnitRecord | None
    added: PersonGroup
    unit_in: UnitRecord
    sizing: str = TRUNCATED

    def persons(self, size: int, inside: bool) -> tuple[PersonGroup, ...]:
        if not inside and self.unit_out is None:
            return ()
        groups = tuple(g for g in (self.householder,) if g is not None)
        if self.sized is not None:
            groups += (replace(self.sized, count=size),)
        return groups + ((self.added,) if inside else ())

    def unit(self, inside: bool) -> UnitRecord | None:
        return self.unit_in if inside else self.unit_out

    def exists(self, inside: bool) -> bool:
        return inside or self.unit_out is not None


def household_records(template: Template, size: int, inside: bool, mafid: int) -> tuple[dict, dict]:
    """The person rows and the unit row of one canary household (compact integer columns; no
    row at all when the version has no household)."""
    groups = template.persons(size, inside)
    unit = template.unit(inside)
    n = sum(g.count for g in groups)

    def column(values: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(values) if values else np.empty(0, dtype=np.int64)

    persons = {
        "RTYPE": np.full(n, 3), "MAFID": np.full(n, mafid),
        "QAGE": column([np.full(g.count, g.age) for g in groups]),
        "CENHISP": column([np.full(g.count, g.hispanic) for g in groups]),
        "CENRACE": column([np.full(g.count, g.race) for g in groups]),
        "RELSHIP": column([np.full(g.count, g.relship) for g in groups]),
    }
    if unit is None:
        units = {k: np.empty(0, dtype=np.int64) for k in ("RTYPE", "MAFID", "FINAL_POP", "NPF", "HHSPAN", "HHRACE",
                                                         "TEN", "HHT", "HHT2", "CPLT")}
        return persons, units
    family = unit.hht in (1, 2, 3)
    npf = 1 + sum(g.count for g in groups if g.relship in FAMILY_RELSHIP) if family else 0
    units = {"RTYPE": np.array([2]), "MAFID": np.array([mafid]), "FINAL_POP": np.array([n]),
             "NPF": np.array([npf]), "HHSPAN": np.array([unit.hhspan]), "HHRACE": np.array([unit.hhrace]),
             "TEN": np.array([unit.ten]), "HHT": np.array([unit.hht]), "HHT2": np.array([unit.hht2]),
             "CPLT": np.array([unit.cplt])}
    return persons, units


# --------------------------------------------------------------------------------------------
# Candidates per table
# --------------------------------------------------------------------------------------------

def _relatives(name: str, race: int, hisp: int, race_in: int, hisp_in: int, *, ten: int = 1, ten_in: int = 1,
               hht: int = 3, hht2: int = 7, added: int = OTHER_RELATIVE, hht_in: int | None = None,
               hht2_in: int | None = None, cplt: int = 5, cplt_in: int = 5, age: int = 40) -> Template:
    """Householder and relatives (an "other family"); the added person a relative of the same age
    (or a spouse or partner). ``age`` under 18: a householder of 17 with relatives under 18 --
    young, but nothing in spec §1 forbids it, and it is the only way tau or more persons of a
    household are all in the under-18 cell with the householder counted."""
    head_age = 45 if age >= 18 else 17
    return Template(
        name,
        householder=PersonGroup(HOUSEHOLDER, head_age, race, hisp),
        sized=PersonGroup(OTHER_RELATIVE, age, race, hisp),
        unit_out=UnitRecord(hht, hht2, cplt, ten, race, hisp),
        added=PersonGroup(added, age if added == OTHER_RELATIVE else 46, race, hisp),
        unit_in=UnitRecord(hht if hht_in is None else hht_in, hht2 if hht2_in is None else hht2_in, cplt_in,
                           ten_in, race_in, hisp_in),
    )


def _group(race: int, hisp: int) -> str:
    code = "ABCDEFG"[min(race, 7) - 1]
    return f"{code}/H" if hisp == 2 else (f"{code}/I" if race == 1 else code)


# Race/ethnicity pairs a canary can start from and move to: each A-G group not Hispanic, and White
# and Black Hispanic (two Hispanic groups are all the H,I level needs: its codes are H and I).
_GROUPS = tuple((r, 1) for r in RACE_OF_CODE) + ((1, 2), (2, 2))


def _householder_moves(ten_moves: Sequence[tuple[int, int]], *, ages: Sequence[int] = (40,)) -> list[Template]:
    out = []
    for age in ages:
        who = "" if age >= 18 else ", all under 18"
        for (r, h), (r2, h2) in itertools.permutations(_GROUPS, 2):
            for ten, ten_in in ten_moves:
                tenure = f", TEN {ten}->{ten_in}" if ten != ten_in else ""
                out.append(_relatives(f"householder {_group(r, h)}->{_group(r2, h2)}{tenure}{who}", r, h, r2, h2,
                                      ten=ten, ten_in=ten_in, age=age))
        for (r, h) in _GROUPS:  # tenure moves alone
            for ten, ten_in in ten_moves:
                if ten != ten_in:
                    out.append(_relatives(f"householder {_group(r, h)}, TEN {ten}->{ten_in}{who}", r, h, r, h,
                                          ten=ten, ten_in=ten_in, age=age))
    return out


def _one_more_person(age: int) -> Template:
    """A family of householder and relatives, at most tau persons, gains a relative of ``age``."""
    what = "a child" if age < 18 else "an adult"
    return Template(f"{what} joins a household of at most tau (+1)",
                    householder=PersonGroup(HOUSEHOLDER, 45, 1, 1), sized=PersonGroup(OTHER_RELATIVE, 40, 1, 1),
                    unit_out=UnitRecord(3, 7, 5, 1, 1, 1), added=PersonGroup(OTHER_RELATIVE, age, 1, 1),
                    unit_in=UnitRecord(3, 7, 5, 1, 1, 1), sizing=SMALL)


def _family_leaves(age: int) -> Template:
    """A family (householder and relatives, all of one age cell) gains a roommate and becomes a
    nonfamily household (HHT 3 -> 7, HHT2 07 -> 08): its persons leave PH4's universe."""
    head_age, who = (45, "adults") if age >= 18 else (17, "all under 18")
    return Template(f"family of {who} + roommate -> nonfamily (HHT 3->7)",
                    householder=PersonGroup(HOUSEHOLDER, head_age, 1, 1), sized=PersonGroup(OTHER_RELATIVE, age, 1, 1),
                    unit_out=UnitRecord(3, 7, 5, 1, 1, 1), added=PersonGroup(ROOMMATE, 40, 1, 1),
                    unit_in=UnitRecord(7, 8, 5, 1, 1, 1))


def _new_household() -> Template:
    """No household, then a person living alone (a new MAFID: unit and geo rows appear)."""
    return Template("a new household: one person alone (no unit -> HHT 4)", householder=None, sized=None,
                    unit_out=None, added=PersonGroup(HOUSEHOLDER, 45, 1, 1), unit_in=UnitRecord(4, 9, 5, 1, 1, 1),
                    sizing=NO_GROUP)


def _becomes_family() -> Template:
    """A person living alone gains a relative: a family (HHT 4 -> 2, HHT2 09 -> 11)."""
    return Template("one person + a relative -> family (HHT 4->2)", householder=PersonGroup(HOUSEHOLDER, 45, 1, 1),
                    sized=None, unit_out=UnitRecord(4, 9, 5, 1, 1, 1), added=PersonGroup(OTHER_RELATIVE, 40, 1, 1),
                    unit_in=UnitRecord(2, 11, 5, 1, 1, 1), sizing=NO_GROUP)


def _children(name: str, move: str, race: int, hisp: int, age: int) -> Template:
    """A lone parent with own children under 18; the added person a spouse or a partner."""
    if move == "spouse":  # female householder with own children (06) + husband -> married couple (01)
        unit_out, unit_in, added = (UnitRecord(3, 6, 5, 1, race, hisp), UnitRecord(1, 1, 1, 1, race, hisp),
                                    PersonGroup(SPOUSE, 37, race, hisp))
    else:  # male householder with own children (10) + partner -> cohabiting couple with children (03)
        unit_out, unit_in, added = (UnitRecord(2, 10, 5, 1, race, hisp), UnitRecord(2, 3, 3, 1, race, hisp),
                                    PersonGroup(PARTNER, 34, race, hisp))
    return Template(name, householder=PersonGroup(HOUSEHOLDER, 35, race, hisp),
                    sized=PersonGroup(CHILD, age, race, hisp), unit_out=unit_out, added=added, unit_in=unit_in)


_TENURES = ((1, 3), (1, 2), (2, 3), (2, 1), (3, 1), (3, 2), (1, 1))  # TEN 1, 2, 3 are PH7's cells 2, 3, 4

# PH2's eight basis cells and a unit record of each (HHT, HHT2, CPLT).
_PH2_UNITS = {3: (1, 2, 1), 4: (1, 2, 2), 6: (2, 4, 3), 7: (2, 4, 4), 9: (4, 9, 5), 10: (2, 11, 5), 12: (6, 5, 5),
              13: (3, 7, 5)}


def _ph2() -> list[Template]:
    out = []
    # First what a census edit would do: a householder with relatives gains a spouse or partner.
    for hht, hht2, who in ((3, 7, "female"), (2, 11, "male")):
        for added, hht2_in, cplt_in, what in ((SPOUSE, 2, 1, "spouse"), (SAME_SEX_SPOUSE, 2, 2, "same-sex spouse"),
                                               (PARTNER, 4, 3, "partner"), (SAME_SEX_PARTNER, 4, 4, "same-sex partner")):
            hht_in = 1 if added in (SPOUSE, SAME_SEX_SPOUSE) else hht
            out.append(_relatives(f"{who} householder with relatives + {what} (HHT2 {hht2:02d}->{hht2_in:02d})",
                                  1, 1, 1, 1, hht=hht, hht2=hht2, added=added, hht_in=hht_in, hht2_in=hht2_in,
                                  cplt_in=cplt_in))
    # Then any cell to any other: the household type is a function of the persons that the
    # guarantee does not constrain (M1), and spec §1 only ties CPLT to HHT2 -- e.g. the proof's
    # own example, a married couple's household that becomes "living alone" (cell 3 -> 9).
    for a, b in itertools.permutations(sorted(_PH2_UNITS), 2):
        (hht, hht2, cplt), (hht_in, hht2_in, cplt_in) = _PH2_UNITS[a], _PH2_UNITS[b]
        out.append(_relatives(f"household type cell {a} -> {b} (HHT2 {hht2:02d} CPLT {cplt} -> {hht2_in:02d} CPLT "
                              f"{cplt_in})", 1, 1, 1, 1, hht=hht, hht2=hht2, cplt=cplt, hht_in=hht_in,
                              hht2_in=hht2_in, cplt_in=cplt_in))
    return out


def candidates(table: str) -> list[Template]:
    """The canaries the packing may choose from for ``table``, in order of preference."""
    if table in ("PH1_num", "PH4"):
        extra = [_one_more_person(8), _one_more_person(40)] if table == "PH1_num" else [_family_leaves(40),
                                                                                          _family_leaves(17)]
        return _householder_moves(((1, 1),), ages=(40, 17)) + extra
    if table == "PH1_denom":
        return _householder_moves(((1, 1),)) + [_new_household()]
    if table == "PH5_denom":
        return _householder_moves(((1, 1),)) + [_becomes_family()]
    if table in ("PH7", "PH8_denom"):
        tenures = _TENURES if table == "PH7" else ((1, 3), (3, 1), (1, 1))  # PH8_denom: owner 1|2, renter 3|4
        return _householder_moves(tenures)
    if table == "PH2":
        return _ph2()
    if table == "PH3":
        return [_children(f"own children, {'06->01' if move == 'spouse' else '10->03'}, children {_group(r, h)}",
                          move, r, h, 8) for r, h in _GROUPS for move in ("spouse", "partner")]
    if table == "PH6":
        return [_children(f"own children aged {age}, {'06->01' if move == 'spouse' else '10->03'}", move, 1, 1, age)
                for age in (2, 4, 8, 14) for move in ("spouse", "partner")]
    raise KeyError(table)


def sizes(table: str, tau: int | None, template: Template | None = None) -> tuple[int, ...]:
    """Sizes of a template's repeated group, cycled over a table's canaries of that template.

    :data:`TRUNCATED`: mostly 3 tau persons in the universe (truncation bugs move three times as
    much), every fourth exactly tau (the edge). :data:`SMALL`: tau persons in the universe with
    the added one, tau - 1 without (never truncated). Unit tables: one relative.
    """
    sizing = template.sizing if template is not None else TRUNCATED
    if sizing == NO_GROUP:
        return (0,)
    if TABLES[table].kind is TableKind.UNIT:
        return (1,)
    assert tau is not None
    householder_counts = table in ("PH1_num", "PH2", "PH4", "PH7")  # the householder is in the universe
    if sizing == SMALL:
        return (max(tau - 2, 0) if householder_counts else tau - 1,)
    edge, big = (tau - 1, 3 * tau - 1) if householder_counts else (tau, 3 * tau)
    return (big, big, big, edge)


# --------------------------------------------------------------------------------------------
# Changes and the packing
# --------------------------------------------------------------------------------------------

LocalChange = dict[IterationLevel, dict[tuple[int, int], int]]
"""(iteration code, basis cell) -> change of the count, by iteration level (one state)."""

Shape = tuple[int, ...]
"""A change's values, sorted (e.g. (-10, 10): ten records move from one cell to another)."""


def change_norm(values, l2: bool = True) -> float:  # type: ignore[no-untyped-def]
    """The L2 (or L1) norm of a change's values."""
    v = [abs(int(x)) for x in values]
    return math.sqrt(sum(x * x for x in v)) if l2 else float(sum(v))


def local_counts(spec: TableSpec, tau: int | None, template: Template, size: int, inside: bool
                 ) -> dict[IterationLevel, np.ndarray]:
    """The exact counts of one canary household alone (one state), by iteration level."""
    persons, units = household_records(template, size, inside, mafid=100_000_001)
    return expected_counts(spec, tau, persons, units, np.zeros(len(units["MAFID"]), dtype=np.int64), 1)


def local_changes(spec: TableSpec, tau: int | None, templates: Sequence[Template], sizes_of: Sequence[int]
                  ) -> list[LocalChange]:
    """Each template's change (in minus out) in one state, computed for all of them at once: the
    oracle counts every candidate household as if it were alone in a state of its own."""
    if not templates:
        return []
    cubes = []
    for inside in (False, True):
        parts = [household_records(t, size, inside, mafid=100_000_001 + i)
                 for i, (t, size) in enumerate(zip(templates, sizes_of))]
        persons = {k: np.concatenate([p[k] for p, _ in parts]) for k in parts[0][0]}
        units = {k: np.concatenate([u[k] for _, u in parts]) for k in parts[0][1]}
        state = (np.asarray(units["MAFID"], dtype=np.int64) - 100_000_001)
        cubes.append(expected_counts(spec, tau, persons, units, state, len(templates)))
    changes = []
    for i in range(len(templates)):
        change: LocalChange = {}
        for level in spec.iteration_levels:
            d = cubes[1][level][i] - cubes[0][level][i]
            change[level] = {(int(c), int(k)): int(d[c, k]) for c, k in zip(*np.nonzero(d))}
        changes.append(change)
    return changes


def local_change(spec: TableSpec, tau: int | None, template: Template, size: int) -> LocalChange:
    return local_changes(spec, tau, [template], [size])[0]


@dataclass(frozen=True)
class Canary:
    """One canary of every run.

    Attributes:
        index: Its position among the run's canaries.
        template: What it is.
        size: Records of its repeated group.
        state: Index of its state among the run's (sorted) states.
        mafid: Its unit's MAFID.
        owns: The levels (config keys) whose cells it owns.
    """

    index: int
    template: Template
    size: int
    state: int
    mafid: int
    owns: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Layout:
    """The canaries of one table's runs and the change each makes at each measured level.

    Attributes:
        table: The table.
        canaries: Every canary of a run, state by state.
        change: Per canary, per level (config key): {cell index in the level's vector: change}.
        reach: Per level (config key): the change of largest L2 norm any candidate makes there
            (its sorted values; empty: no candidate moves the level).
    """

    table: str
    canaries: tuple[Canary, ...]
    change: tuple[dict[str, dict[int, int]], ...]
    reach: dict[str, Shape] = field(default_factory=dict)

    def owners(self, level: str) -> list[Canary]:
        return [c for c in self.canaries if level in c.owns]

    def shape(self, canary: int, level: str) -> Shape:
        """The sorted values of a canary's change at a level."""
        return tuple(sorted(self.change[canary][level].values()))


def pack(table: str, levels: Sequence[PopulationGroupLevel], tau: int | None, n_states: int,
         first_mafid: int) -> Layout:
    """Choose the canaries of ``table`` for runs over ``n_states`` states measured at ``levels``.

    Args:
        levels: The table's measured levels (budget above 0).
        tau: The table's truncation threshold (None for unit tables).
        first_mafid: MAFIDs of the canaries are ``first_mafid, first_mafid + 1, ...``.
    """
    spec = TABLES[table]
    state_levels = [lv for lv in levels if lv.geography is GeographyLevel.STATE]
    nation_levels = [lv for lv in levels if lv.geography is GeographyLevel.USA]
    pool = candidates(table)
    cycles = {t: sizes(table, tau, t) for t in pool}
    changes: dict[tuple[Template, int], LocalChange] = {}
    for position in range(max(len(c) for c in cycles.values())):
        batch = [t for t in pool if position < len(cycles[t])]
        for template, change in zip(batch, local_changes(spec, tau, batch, [cycles[t][position] for t in batch])):
            changes[(template, cycles[template][position])] = change
    first = {t: changes[(t, cycles[t][0])] for t in pool}
    for t in pool:
        for size in cycles[t]:
            if changes[(t, size)] != first[t]:
                raise AssertionError(f"{table}: the change of canary {t.name!r} depends on its size")

    def norm(change: dict[tuple[int, int], int]) -> float:
        return change_norm(change.values())

    # A level's reach: the largest change any candidate makes there (the same in every state).
    reach = {lv: max((first[t][lv.iteration] for t in pool), key=norm, default={}) for lv in levels}

    # Whether a candidate's change reaches a level's reach, answered once: the greedy steps and the
    # states ask again and again, and hashing templates and levels was most of the packing's time.
    if len({t.name for t in pool}) != len(pool):
        raise AssertionError(f"{table}: two candidates share a name")
    reach_norm = {lv.config_key: norm(reach[lv]) for lv in levels}
    is_full = {(t.name, lv.config_key): bool(first[t][lv.iteration])
               and math.isclose(norm(first[t][lv.iteration]), reach_norm[lv.config_key], rel_tol=1e-12)
               for t in pool for lv in levels}

    def full(template: Template, lv: PopulationGroupLevel) -> bool:
        return is_full[(template.name, lv.config_key)]

    # Per state (the same choice in every state): greedily, the candidate owning most levels.
    owned: dict[str, set[tuple[int, int]]] = {lv.config_key: set() for lv in state_levels}
    chosen: list[tuple[Template, frozenset[str]]] = []
    remaining = list(pool)
    while True:
        best: tuple[int, Template, list[PopulationGroupLevel]] | None = None
        for template in remaining:
            change = first[template]
            own = [lv for lv in state_levels if full(template, lv)
                   and not set(change[lv.iteration]) & owned[lv.config_key]]
            if own and (best is None or len(own) > best[0]):
                best = (len(own), template, own)
        if best is None:
            break
        _, template, own = best
        for lv in own:
            owned[lv.config_key] |= set(first[template][lv.iteration])
        chosen.append((template, frozenset(lv.config_key for lv in own)))
        remaining.remove(template)

    canaries: list[Canary] = []
    nation_owned: dict[str, set[tuple[int, int]]] = {lv.config_key: set() for lv in nation_levels}
    seen: dict[Template, int] = {}
    for state in range(n_states):
        for template, own in chosen:
            nation = set()
            for lv in nation_levels:
                cells = set(first[template][lv.iteration])
                if full(template, lv) and not cells & nation_owned[lv.config_key]:
                    nation_owned[lv.config_key] |= cells
                    nation.add(lv.config_key)
            cycle = cycles[template]
            size = cycle[seen.get(template, 0) % len(cycle)]
            seen[template] = seen.get(template, 0) + 1
            canaries.append(Canary(len(canaries), template, size, state, first_mafid + len(canaries),
                                   own | frozenset(nation)))

    # Each canary's change, as cells of the levels' vectors (regions x codes x cells, row-major).
    placed = []
    for canary in canaries:
        change = first[canary.template]
        by_level: dict[str, dict[int, int]] = {}
        for lv in levels:
            n_codes, n_cells = len(lv.iteration.codes), len(spec.basis)
            region = canary.state if lv.geography is GeographyLevel.STATE else 0
            by_level[lv.config_key] = {(region * n_codes + code) * n_cells + cell: value
                                       for (code, cell), value in change[lv.iteration].items()}
        placed.append(by_level)
    return Layout(table, tuple(canaries), tuple(placed),
                  {lv.config_key: tuple(sorted(reach[lv].values())) for lv in levels})
