"""Key-invariant canaries: pairs of neighbouring datasets whose exact counts the auditor knows.

A *canary* is one household in one state, in one of two versions:

* **out** -- the household of D;
* **in** -- the household of D' = D plus one person, the unit record replaced as a household
  with that person would have it (spec §1's consistency rules kept: a spouse turns HHT2 06
  into 01 with CPLT 1 and HHT 1; an unmarried partner turns HHT2 10 into 03 with CPLT 3), so
  that the household moves at every level it can -- household type (PH2, PH3, PH6), tenure
  (PH7, PH8_denom), the householder's race and ethnicity group (HHRACE, HHSPAN: the iterated
  tables). The spec has no rule tying HHRACE to the householder person's race, so the unit
  record may say another race than before, as a replaced record may.

Its persons in the table's universe are at least tau (so the truncated count is tau in both
versions) and identical in everything the table counts them by, so *any* tau of them count the
same: the exact counts do not depend on the truncation key (:mod:`.oracle` checks it). Some
canaries have 3 tau such persons: a release that skips truncation, or keeps tau + 1, moves
three times (or (tau+1)/tau times) as much.

A canary's change d (in minus out) at a level is -tau in one cell and +tau in another: L2 norm
tau sqrt 2, the most any neighbour can move a person table at one level (the kept records before
and after are at most tau each); for unit tables -1 and +1 (sqrt 2).

**Packing.** Each run holds many canaries, each in or out independently (a fair coin per canary
and run). A canary *owns* the cells of its change at a level when no other canary of the run
owns any of them: the audit's statistic for a canary reads only the cells it owns, so the noise
it sees is independent of every other canary's (independent noise per cell), and the other
canaries' known shifts in those cells are subtracted exactly. Per state, canaries are chosen
greedily from each table's candidates, the one owning the most levels first; the same per
state. At the nation's levels every canary moves the same cells, so a nation cell pair is owned
by the first canary (in state order) moving it -- usually one canary per run.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from phsafe.iterations import GeographyLevel, IterationLevel, PopulationGroupLevel
from phsafe.tables import TABLES, TableKind, TableSpec

from phsafe.audit.empirical.oracle import expected_counts

__all__ = ["PersonGroup", "UnitRecord", "Template", "Canary", "Layout", "candidates", "pack", "reach_step",
           "household_records", "local_counts", "sizes"]

# Relationship codes (spec §1).
HOUSEHOLDER, SPOUSE, PARTNER, SAME_SEX_SPOUSE, SAME_SEX_PARTNER = 20, 21, 22, 23, 24
CHILD, OTHER_RELATIVE = 25, 33
RACE_OF_CODE = (1, 2, 3, 4, 5, 6, 7)  # a race code of each A-G group: White ... two or more races (07)
FAMILY_RELSHIP = frozenset({SPOUSE, SAME_SEX_SPOUSE, *range(25, 34)})


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
        householder: The householder.
        sized: The group repeated ``size`` times (own children, or adult relatives).
        unit_out: The unit record of the household without the added person.
        added: The person whose addition makes the neighbour.
        unit_in: The unit record of the household with the added person.
    """

    name: str
    householder: PersonGroup
    sized: PersonGroup
    unit_out: UnitRecord
    added: PersonGroup
    unit_in: UnitRecord

    def persons(self, size: int, inside: bool) -> tuple[PersonGroup, ...]:
        groups = (self.householder, replace(self.sized, count=size))
        return groups + ((self.added,) if inside else ())

    def unit(self, inside: bool) -> UnitRecord:
        return self.unit_in if inside else self.unit_out


def household_records(template: Template, size: int, inside: bool, mafid: int) -> tuple[dict, dict]:
    """The person rows and the unit row of one canary household (compact integer columns)."""
    groups = template.persons(size, inside)
    unit = template.unit(inside)
    n = sum(g.count for g in groups)
    persons = {
        "RTYPE": np.full(n, 3), "MAFID": np.full(n, mafid),
        "QAGE": np.concatenate([np.full(g.count, g.age) for g in groups]),
        "CENHISP": np.concatenate([np.full(g.count, g.hispanic) for g in groups]),
        "CENRACE": np.concatenate([np.full(g.count, g.race) for g in groups]),
        "RELSHIP": np.concatenate([np.full(g.count, g.relship) for g in groups]),
    }
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
               hht2_in: int | None = None, cplt_in: int = 5) -> Template:
    """Householder and adult relatives (an "other family"); the added person an adult."""
    return Template(
        name,
        householder=PersonGroup(HOUSEHOLDER, 45, race, hisp),
        sized=PersonGroup(OTHER_RELATIVE, 40, race, hisp),
        unit_out=UnitRecord(hht, hht2, 5, ten, race, hisp),
        added=PersonGroup(added, 40 if added == OTHER_RELATIVE else 46, race, hisp),
        unit_in=UnitRecord(hht if hht_in is None else hht_in, hht2 if hht2_in is None else hht2_in, cplt_in,
                           ten_in, race_in, hisp_in),
    )


def _group(race: int, hisp: int) -> str:
    code = "ABCDEFG"[min(race, 7) - 1]
    return f"{code}/H" if hisp == 2 else (f"{code}/I" if race == 1 else code)


# Race/ethnicity pairs a canary can start from and move to: each A-G group not Hispanic, and White
# and Black Hispanic (two Hispanic groups are all the H,I level needs: its codes are H and I).
_GROUPS = tuple((r, 1) for r in RACE_OF_CODE) + ((1, 2), (2, 2))


def _householder_moves(ten_moves: Sequence[tuple[int, int]], *, hht: int = 3, hht2: int = 7
                       ) -> list[Template]:
    out = []
    for (r, h), (r2, h2) in itertools.permutations(_GROUPS, 2):
        for ten, ten_in in ten_moves:
            tenure = f", TEN {ten}->{ten_in}" if ten != ten_in else ""
            out.append(_relatives(f"householder {_group(r, h)}->{_group(r2, h2)}{tenure}", r, h, r2, h2,
                                  ten=ten, ten_in=ten_in, hht=hht, hht2=hht2))
    for (r, h) in _GROUPS:  # tenure moves alone
        for ten, ten_in in ten_moves:
            if ten != ten_in:
                out.append(_relatives(f"householder {_group(r, h)}, TEN {ten}->{ten_in}", r, h, r, h,
                                      ten=ten, ten_in=ten_in, hht=hht, hht2=hht2))
    return out


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


def candidates(table: str) -> list[Template]:
    """The canaries the packing may choose from for ``table``, in order of preference."""
    if table in ("PH1_num", "PH4", "PH1_denom", "PH5_denom"):
        return _householder_moves(((1, 1),))
    if table in ("PH7", "PH8_denom"):
        tenures = _TENURES if table == "PH7" else ((1, 3), (3, 1), (1, 1))  # PH8_denom: owner 1|2, renter 3|4
        return _householder_moves(tenures)
    if table == "PH2":
        out = []
        for hht, hht2, who in ((3, 7, "female"), (2, 11, "male")):
            for added, hht2_in, cplt_in, what in ((SPOUSE, 2, 1, "spouse"), (SAME_SEX_SPOUSE, 2, 2, "same-sex spouse"),
                                                   (PARTNER, 4, 3, "partner"), (SAME_SEX_PARTNER, 4, 4, "same-sex partner")):
                hht_in = 1 if added in (SPOUSE, SAME_SEX_SPOUSE) else hht
                out.append(_relatives(f"{who} householder with relatives + {what} (HHT2 {hht2:02d}->{hht2_in:02d})",
                                      1, 1, 1, 1, hht=hht, hht2=hht2, added=added, hht_in=hht_in, hht2_in=hht2_in,
                                      cplt_in=cplt_in))
        return out
    if table == "PH3":
        return [_children(f"own children, {'06->01' if move == 'spouse' else '10->03'}, children {_group(r, h)}",
                          move, r, h, 8) for r, h in _GROUPS for move in ("spouse", "partner")]
    if table == "PH6":
        return [_children(f"own children aged {age}, {'06->01' if move == 'spouse' else '10->03'}", move, 1, 1, age)
                for age in (2, 4, 8, 14) for move in ("spouse", "partner")]
    raise KeyError(table)


def reach_step(table: str, tau: int | None) -> int:
    """Records one canary moves out of one cell and into another: tau, or 1 for unit tables."""
    return 1 if TABLES[table].kind is TableKind.UNIT else int(tau)  # type: ignore[arg-type]


def sizes(table: str, tau: int | None) -> tuple[int, ...]:
    """Sizes of the repeated group, cycled over a table's canaries: mostly 3 tau persons in the
    universe (truncation bugs move three times as much), every fourth exactly tau (the edge)."""
    if TABLES[table].kind is TableKind.UNIT:
        return (1,)
    assert tau is not None
    householder_counts = table in ("PH1_num", "PH2", "PH4", "PH7")  # the householder is in the universe
    edge, big = (tau - 1, 3 * tau - 1) if householder_counts else (tau, 3 * tau)
    return (big, big, big, edge)


# --------------------------------------------------------------------------------------------
# Changes and the packing
# --------------------------------------------------------------------------------------------

LocalChange = dict[IterationLevel, dict[tuple[int, int], int]]
"""(iteration code, basis cell) -> change of the count, by iteration level (one state)."""


def local_counts(spec: TableSpec, tau: int | None, template: Template, size: int, inside: bool
                 ) -> dict[IterationLevel, np.ndarray]:
    """The exact counts of one canary household alone (one state), by iteration level."""
    persons, units = household_records(template, size, inside, mafid=100_000_001)
    return expected_counts(spec, tau, persons, units, np.zeros(1, dtype=np.int64), 1)


def local_changes(spec: TableSpec, tau: int | None, templates: Sequence[Template], size: int) -> list[LocalChange]:
    """Each template's change (in minus out) in one state, computed for all of them at once: the
    oracle counts every candidate household as if it were alone in a state of its own."""
    if not templates:
        return []
    cubes = []
    for inside in (False, True):
        parts = [household_records(t, size, inside, mafid=100_000_001 + i) for i, t in enumerate(templates)]
        persons = {k: np.concatenate([p[k] for p, _ in parts]) for k in parts[0][0]}
        units = {k: np.concatenate([u[k] for _, u in parts]) for k in parts[0][1]}
        cubes.append(expected_counts(spec, tau, persons, units, np.arange(len(templates), dtype=np.int64),
                                     len(templates)))
    changes = []
    for i in range(len(templates)):
        change: LocalChange = {}
        for level in spec.iteration_levels:
            d = cubes[1][level][i] - cubes[0][level][i]
            change[level] = {(int(c), int(k)): int(d[c, k]) for c, k in zip(*np.nonzero(d))}
        changes.append(change)
    return changes


def local_change(spec: TableSpec, tau: int | None, template: Template, size: int) -> LocalChange:
    return local_changes(spec, tau, [template], size)[0]


def _full_move(change: dict[tuple[int, int], int], step: int) -> bool:
    """A change of -step in one cell and +step in another: the most one neighbour can move."""
    return sorted(change.values()) == [-step, step]


def _full_levels(levels: Sequence[PopulationGroupLevel], changes: Sequence[LocalChange], step: int
                 ) -> tuple[PopulationGroupLevel, ...]:
    """The state levels of ``levels`` some candidate moves by the full step."""
    return tuple(lv for lv in levels if lv.geography is GeographyLevel.STATE
                 and any(_full_move(c[lv.iteration], step) for c in changes))


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
        full: The state levels the table's canaries can move by the full step; a canary owning
            all of them is a *whole-table* canary.
        change: Per canary, per level (config key): {cell index in the level's vector: change}.
    """

    table: str
    canaries: tuple[Canary, ...]
    full: tuple[PopulationGroupLevel, ...]
    change: tuple[dict[str, dict[int, int]], ...]

    def whole_table(self) -> list[Canary]:
        keys = {lv.config_key for lv in self.full}
        return [c for c in self.canaries if keys and keys <= c.owns]

    def owners(self, level: str) -> list[Canary]:
        return [c for c in self.canaries if level in c.owns]


def pack(table: str, levels: Sequence[PopulationGroupLevel], tau: int | None, n_states: int,
         first_mafid: int) -> Layout:
    """Choose the canaries of ``table`` for runs over ``n_states`` states measured at ``levels``.

    Args:
        levels: The table's measured levels (budget above 0).
        tau: The table's truncation threshold (None for unit tables).
        first_mafid: MAFIDs of the canaries are ``first_mafid, first_mafid + 1, ...``.
    """
    spec, step = TABLES[table], reach_step(table, tau)
    cycle = sizes(table, tau)
    state_levels = [lv for lv in levels if lv.geography is GeographyLevel.STATE]
    nation_levels = [lv for lv in levels if lv.geography is GeographyLevel.USA]
    cache: dict[tuple[Template, int], LocalChange] = {}

    def change_of(template: Template, size: int) -> LocalChange:
        if (template, size) not in cache:
            cache[(template, size)] = local_change(spec, tau, template, size)
        return cache[(template, size)]

    pool = candidates(table)
    first_size = cycle[0]
    for size in set(cycle):
        for template, change in zip(pool, local_changes(spec, tau, pool, size)):
            cache[(template, size)] = change
    full = _full_levels(levels, [change_of(t, first_size) for t in pool], step)

    # Per state (the same choice in every state): greedily, the candidate owning most levels.
    owned: dict[str, set[tuple[int, int]]] = {lv.config_key: set() for lv in state_levels}
    chosen: list[tuple[Template, frozenset[str]]] = []
    while True:
        best: tuple[int, Template, list[PopulationGroupLevel]] | None = None
        for template in pool:
            change = change_of(template, first_size)
            own = [lv for lv in state_levels if _full_move(change[lv.iteration], step)
                   and not set(change[lv.iteration]) & owned[lv.config_key]]
            if own and (best is None or len(own) > best[0]):
                best = (len(own), template, own)
        if best is None:
            break
        _, template, own = best
        for lv in own:
            owned[lv.config_key] |= set(change_of(template, first_size)[lv.iteration])
        chosen.append((template, frozenset(lv.config_key for lv in own)))
        pool.remove(template)

    canaries: list[Canary] = []
    nation_owned: dict[str, set[tuple[int, int]]] = {lv.config_key: set() for lv in nation_levels}
    for state in range(n_states):
        for template, own in chosen:
            change = change_of(template, first_size)
            nation = set()
            for lv in nation_levels:
                cells = set(change[lv.iteration])
                if _full_move(change[lv.iteration], step) and not cells & nation_owned[lv.config_key]:
                    nation_owned[lv.config_key] |= cells
                    nation.add(lv.config_key)
            index = len(canaries)
            canaries.append(Canary(index, template, cycle[index % len(cycle)], state, first_mafid + index,
                                   own | frozenset(nation)))

    # Each canary's change, as cells of the levels' vectors (regions x codes x cells, row-major).
    placed = []
    for canary in canaries:
        change = change_of(canary.template, canary.size)
        if change != change_of(canary.template, first_size):
            raise AssertionError(f"{table}: the change of canary {canary.template.name!r} depends on its size")
        by_level: dict[str, dict[int, int]] = {}
        for lv in levels:
            n_codes, n_cells = len(lv.iteration.codes), len(spec.basis)
            region = canary.state if lv.geography is GeographyLevel.STATE else 0
            by_level[lv.config_key] = {(region * n_codes + code) * n_cells + cell: value
                                       for (code, cell), value in change[lv.iteration].items()}
        placed.append(by_level)
    return Layout(table, tuple(canaries), full, tuple(placed))


def _level(levels: Sequence[PopulationGroupLevel], key: str) -> PopulationGroupLevel:
    return next(lv for lv in levels if lv.config_key == key)
