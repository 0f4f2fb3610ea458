"""The S-DHC tables as data (spec §5): one declarative definition per table.

A measured table is a universe filter (on persons and on units), an iteration source, a *basis*
of disjoint cells (every in-universe record falls in exactly one), and aggregate cells that are
sums of basis cells. Cells are conjunctions of "column in values" conditions, so a definition can
be read against the spec line by line; :mod:`phsafe.tabulate` evaluates them, and refuses a record
that falls in no cell instead of dropping it silently.

PH5_num and PH8_num are derived from PH4 and PH7 by post-processing (no further privacy loss).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from phsafe.iterations import ALL_LEVELS, TOTAL_ONLY_LEVELS, IterationLevel, PopulationGroupLevel


class Source(enum.Enum):
    """Which record a column is read from after the join."""

    PERSON = "persons"
    UNIT = "units"


class TableKind(enum.Enum):
    PERSON = "person"  # Algorithm 1: filter, truncate-and-join, map, count; Delta = 2*tau + 2
    UNIT = "unit"  # Algorithm 2: filter, map, count; Delta = 2


class IterationSource(enum.Enum):
    """Whose race and ethnicity define a record's iteration codes (spec §3)."""

    NONE = "none"  # level * only
    PERSON = "person"  # CENRACE / CENHISP
    HOUSEHOLDER = "householder"  # HHRACE / HHSPAN of the unit


@dataclass(frozen=True)
class Condition:
    """``source.column`` takes one of ``values`` (integers the codes spell)."""

    source: Source
    column: str
    values: frozenset[int]

    def __str__(self) -> str:
        return f"{self.source.value}.{self.column} in {sorted(self.values)}"


def person(column: str, *values: int | range) -> Condition:
    return Condition(Source.PERSON, column, _flatten(values))


def unit(column: str, *values: int | range) -> Condition:
    return Condition(Source.UNIT, column, _flatten(values))


def _flatten(values: tuple[int | range, ...]) -> frozenset[int]:
    out: set[int] = set()
    for v in values:
        out.update(v if isinstance(v, range) else (v,))
    return frozenset(out)


def under(age: int) -> Condition:
    return person("QAGE", range(0, age))


def aged(lo: int, hi: int) -> Condition:
    """Age from ``lo`` to ``hi`` inclusive."""
    return person("QAGE", range(lo, hi + 1))


ADULT = person("QAGE", range(18, 116))
CHILD = under(18)
OWN_CHILD = person("RELSHIP", 25, 26, 27)


@dataclass(frozen=True)
class Cell:
    """A basis cell: its output number and the conditions (ANDed) that put a record in it."""

    number: int
    conditions: tuple[Condition, ...]


@dataclass(frozen=True)
class TableSpec:
    """A measured table.

    Attributes:
        name: Output folder name, e.g. ``PH1_num``.
        kind: Person table (truncate-and-join) or unit table.
        person_universe: Conditions a person must meet (person tables).
        unit_universe: Conditions a unit must meet.
        iteration_source: Whose race/ethnicity gives the iteration codes.
        levels: The population-group levels the table is measured at.
        basis: The disjoint basis cells, measured privately.
        aggregates: Non-private aggregate cells: number -> basis cells summed.
        tau_key: Key of the truncation threshold in ``config.json``'s ``tau`` (person tables).
        weight: Unit column summed instead of counting records (non-private PH8_num only).
        title: The table's title in the S-DHC (PHSafe paper §2 table shells).
        universe: Who or what the table counts.
        cell_labels: ``<TABLE>_DATA_CELL`` number -> label, for every basis and aggregate cell
            (spec §5 and §1 code lists, worded as the paper's table shells). The data package
            of every release (:mod:`phsafe.datapackage`) is generated from these.
    """

    name: str
    kind: TableKind
    person_universe: tuple[Condition, ...]
    unit_universe: tuple[Condition, ...]
    iteration_source: IterationSource
    levels: tuple[PopulationGroupLevel, ...]
    basis: tuple[Cell, ...]
    aggregates: tuple[tuple[int, tuple[int, ...]], ...] = ()
    tau_key: str | None = None
    weight: str | None = None
    title: str = ""
    universe: str = ""
    cell_labels: tuple[tuple[int, str], ...] = ()

    def cell_label(self, number: int) -> str:
        """The label of cell ``number`` (KeyError for a cell the table does not have)."""
        return dict(self.cell_labels)[number]

    @property
    def iteration_levels(self) -> tuple[IterationLevel, ...]:
        return tuple(dict.fromkeys(lv.iteration for lv in self.levels))

    @property
    def basis_numbers(self) -> tuple[int, ...]:
        return tuple(c.number for c in self.basis)

    @property
    def nonprivate_cells(self) -> tuple[int, ...]:
        """Cells of a non-private tabulation: basis and aggregates, in cell order."""
        return tuple(sorted(set(self.basis_numbers) | {n for n, _ in self.aggregates}))

    @property
    def has_iteration_column(self) -> bool:
        return self.iteration_source is not IterationSource.NONE


@dataclass(frozen=True)
class DerivedTableSpec:
    """A table derived from a measured one by summing its cells (post-processing).

    Attributes:
        name: Output folder name.
        source: The measured table it is derived from.
        cells: Output cell -> source basis cells summed (counts and variances alike).
        nonprivate: How the non-private (ground truth) tabulation is defined.
    """

    name: str
    source: str
    cells: tuple[tuple[int, tuple[int, ...]], ...]
    nonprivate: TableSpec


def _total(basis: tuple[Cell, ...]) -> tuple[int, tuple[int, ...]]:
    return (1, tuple(c.number for c in basis))


RTYPE_HU_PERSON = person("RTYPE", 3)
HOUSEHOLD = (unit("RTYPE", 2), unit("HHT", range(1, 8)))
FAMILY = (unit("HHT", 1, 2, 3),)
_AGE_BASIS = (Cell(2, (CHILD,)), Cell(3, (ADULT,)))

_PH2_BASIS = (
    Cell(3, (unit("HHT2", 1, 2), unit("CPLT", 1))),
    Cell(4, (unit("HHT2", 1, 2), unit("CPLT", 2))),
    Cell(6, (unit("HHT2", 3, 4), unit("CPLT", 3))),
    Cell(7, (unit("HHT2", 3, 4), unit("CPLT", 4))),
    Cell(9, (unit("HHT2", 9),)),
    Cell(10, (unit("HHT2", 10, 11, 12),)),
    Cell(12, (unit("HHT2", 5),)),
    Cell(13, (unit("HHT2", 6, 7, 8),)),
)
_PH3_BASIS = (
    Cell(2, (person("RELSHIP", 20, 21, 22, 23, 24, 34, 35, 36),)),
    Cell(4, (OWN_CHILD, unit("HHT2", 1))),
    Cell(5, (OWN_CHILD, unit("HHT2", 3))),
    Cell(6, (OWN_CHILD, unit("HHT2", 10))),
    Cell(7, (OWN_CHILD, unit("HHT2", 6))),
    Cell(9, (person("RELSHIP", 30),)),
    Cell(10, (person("RELSHIP", 28, 29, 31, 32, 33),)),
)
_PH6_AGE_GROUPS = ((0, 3), (4, 5), (6, 11), (12, 17))
# Family type (HHT2) -> first basis cell of its four age groups.
_PH6_FAMILIES = ((1, 3), (3, 8), (10, 13), (6, 18))
_PH6_BASIS = tuple(
    Cell(first + i, (unit("HHT2", hht2), aged(lo, hi)))
    for hht2, first in _PH6_FAMILIES
    for i, (lo, hi) in enumerate(_PH6_AGE_GROUPS)
)
_TENURE_PERSON_BASIS = (
    Cell(2, (unit("TEN", 1),)),
    Cell(3, (unit("TEN", 2),)),
    Cell(4, (unit("TEN", 3, 4),)),
)
_TENURE_UNIT_BASIS = (Cell(2, (unit("TEN", 1, 2),)), Cell(3, (unit("TEN", 3, 4),)))
_ONE_CELL = (Cell(1, ()),)

# Cell labels (spec §5, worded as the table shells of the PHSafe paper §2). A nested cell repeats
# its parent's label ("Own child: in married couple family") so that every label reads alone.
_AGE_LABELS = ((1, "Total"), (2, "Under 18 years"), (3, "18 years and over"))
_PH2_LABELS = (
    (1, "Total"),
    (2, "In married couple household"),
    (3, "In married couple household: opposite-sex married couple"),
    (4, "In married couple household: same-sex married couple"),
    (5, "In cohabiting couple household"),
    (6, "In cohabiting couple household: opposite-sex cohabiting couple"),
    (7, "In cohabiting couple household: same-sex cohabiting couple"),
    (8, "Male householder, no spouse or partner present"),
    (9, "Male householder, no spouse or partner present: living alone"),
    (10, "Male householder, no spouse or partner present: living with others"),
    (11, "Female householder, no spouse or partner present"),
    (12, "Female householder, no spouse or partner present: living alone"),
    (13, "Female householder, no spouse or partner present: living with others"),
)
_PH3_LABELS = (
    (1, "Total"),
    (2, "Householder, spouse, unmarried partner, or nonrelative"),
    (3, "Own child"),
    (4, "Own child: in married couple family"),
    (5, "Own child: in cohabiting couple family"),
    (6, "Own child: in male householder, no spouse or partner present family"),
    (7, "Own child: in female householder, no spouse or partner present family"),
    (8, "Other relatives"),
    (9, "Other relatives: grandchild"),
    (10, "Other relatives: other relatives"),
)
_PH6_FAMILY_LABELS = {
    1: "In married couple family",
    3: "In cohabiting couple family",
    10: "Male householder, no spouse or partner present family",
    6: "Female householder, no spouse or partner present family",
}
_PH6_AGE_LABELS = ("under 4 years", "4 and 5 years", "6 to 11 years", "12 to 17 years")
_PH6_LABELS = ((1, "Total"),) + tuple(
    pair
    for hht2, first in _PH6_FAMILIES
    for pair in ((first - 1, _PH6_FAMILY_LABELS[hht2]),)
    + tuple((first + i, f"{_PH6_FAMILY_LABELS[hht2]}: {age}") for i, age in enumerate(_PH6_AGE_LABELS))
)
_PH7_LABELS = ((1, "Total"), (2, "Owned with a mortgage or a loan"), (3, "Owned free and clear"),
               (4, "Renter occupied"))
_TENURE_LABELS = ((1, "Total"), (2, "Owner occupied"), (3, "Renter occupied"))


def _denominator_labels(unit_noun: str) -> tuple[tuple[int, str], ...]:
    """PH1_denom, PH5_denom: cell 1 is measured; 2 and 3 repeat it as the denominators of the
    under-18 and 18-and-over averages (non-private tabulations, spec §7)."""
    return ((1, unit_noun), (2, f"{unit_noun} (denominator of the under 18 years average)"),
            (3, f"{unit_noun} (denominator of the 18 years and over average)"))

PH1_NUM = TableSpec(
    "PH1_num", TableKind.PERSON, (RTYPE_HU_PERSON,), (), IterationSource.HOUSEHOLDER,
    ALL_LEVELS, _AGE_BASIS, (_total(_AGE_BASIS),), tau_key="PH1_num",
    title="Average household size by age: numerator (population in households)",
    universe="Population in households", cell_labels=_AGE_LABELS,
)
PH1_DENOM = TableSpec(
    "PH1_denom", TableKind.UNIT, (), HOUSEHOLD, IterationSource.HOUSEHOLDER,
    ALL_LEVELS, _ONE_CELL, ((2, (1,)), (3, (1,))),
    title="Average household size by age: denominator (households)",
    universe="Households", cell_labels=_denominator_labels("Households"),
)
PH2 = TableSpec(
    "PH2", TableKind.PERSON, (RTYPE_HU_PERSON,), (), IterationSource.NONE,
    TOTAL_ONLY_LEVELS, _PH2_BASIS,
    ((2, (3, 4)), (5, (6, 7)), (8, (9, 10)), (11, (12, 13)), _total(_PH2_BASIS)),
    tau_key="PH2",
    title="Household type for the population in households",
    universe="Population in households", cell_labels=_PH2_LABELS,
)
PH3 = TableSpec(
    "PH3", TableKind.PERSON, (RTYPE_HU_PERSON, CHILD), (), IterationSource.PERSON,
    ALL_LEVELS, _PH3_BASIS, ((3, (4, 5, 6, 7)), (8, (9, 10)), _total(_PH3_BASIS)),
    tau_key="PH3",
    title="Household type by relationship for the population under 18 years",
    universe="Population under 18 years in households", cell_labels=_PH3_LABELS,
)
PH4 = TableSpec(
    "PH4", TableKind.PERSON, (person("RELSHIP", 20, 21, 23, range(25, 34)),), FAMILY,
    IterationSource.HOUSEHOLDER, ALL_LEVELS, _AGE_BASIS, (_total(_AGE_BASIS),), tau_key="PH4",
    title="Population in families by age", universe="Population in families", cell_labels=_AGE_LABELS,
)
PH5_DENOM = TableSpec(
    "PH5_denom", TableKind.UNIT, (), FAMILY, IterationSource.HOUSEHOLDER,
    ALL_LEVELS, _ONE_CELL, ((2, (1,)), (3, (1,))),
    title="Average family size by age: denominator (families)",
    universe="Families", cell_labels=_denominator_labels("Families"),
)
PH6 = TableSpec(
    "PH6", TableKind.PERSON, (CHILD, OWN_CHILD), (), IterationSource.NONE,
    TOTAL_ONLY_LEVELS, _PH6_BASIS,
    tuple((first - 1, tuple(range(first, first + 4))) for _, first in _PH6_FAMILIES)
    + (_total(_PH6_BASIS),),
    tau_key="PH6",
    title="Family type and age for own children under 18 years",
    universe="Own children under 18 years", cell_labels=_PH6_LABELS,
)
PH7 = TableSpec(
    "PH7", TableKind.PERSON, (RTYPE_HU_PERSON,), (), IterationSource.HOUSEHOLDER,
    ALL_LEVELS, _TENURE_PERSON_BASIS, (_total(_TENURE_PERSON_BASIS),), tau_key="PH7",
    title="Total population in occupied housing units by tenure",
    universe="Population in occupied housing units", cell_labels=_PH7_LABELS,
)
PH8_DENOM = TableSpec(
    "PH8_denom", TableKind.UNIT, (), HOUSEHOLD, IterationSource.HOUSEHOLDER,
    ALL_LEVELS, _TENURE_UNIT_BASIS, (_total(_TENURE_UNIT_BASIS),),
    title="Average household size of occupied housing units by tenure: denominator (occupied housing units)",
    universe="Occupied housing units", cell_labels=_TENURE_LABELS,
)

TABLES: dict[str, TableSpec] = {
    t.name: t for t in (PH1_NUM, PH1_DENOM, PH2, PH3, PH4, PH5_DENOM, PH6, PH7, PH8_DENOM)
}
"""The nine measured tables, in release order."""

PH5_NUM = DerivedTableSpec(
    "PH5_num", "PH4", ((2, (2,)), (3, (3,))),
    nonprivate=TableSpec(
        "PH5_num", TableKind.PERSON, PH4.person_universe, FAMILY, IterationSource.HOUSEHOLDER,
        ALL_LEVELS, _AGE_BASIS, (_total(_AGE_BASIS),),
        title="Average family size by age: numerator (population in families; PH4's counts)",
        universe="Population in families", cell_labels=_AGE_LABELS,
    ),
)
PH8_NUM = DerivedTableSpec(
    "PH8_num", "PH7", ((2, (2, 3)), (3, (4,))),
    # Ground truth: population in households by tenure, as the sum of FINAL_POP.
    nonprivate=TableSpec(
        "PH8_num", TableKind.UNIT, (), HOUSEHOLD, IterationSource.HOUSEHOLDER,
        ALL_LEVELS, _TENURE_UNIT_BASIS, (_total(_TENURE_UNIT_BASIS),), weight="FINAL_POP",
        title="Average household size of occupied housing units by tenure: numerator "
              "(population in occupied housing units; from PH7)",
        universe="Population in occupied housing units", cell_labels=_TENURE_LABELS,
    ),
)
DERIVED_TABLES: dict[str, DerivedTableSpec] = {t.name: t for t in (PH5_NUM, PH8_NUM)}

OUTPUT_TABLES: tuple[str, ...] = (
    "PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_num", "PH5_denom", "PH6", "PH7",
    "PH8_num", "PH8_denom",
)
"""The eleven output tables, in the order of the S-DHC release."""

MEASURED_TABLES: tuple[str, ...] = tuple(TABLES)
TABLE_LEVELS: dict[str, tuple[PopulationGroupLevel, ...]] = {n: t.levels for n, t in TABLES.items()}
TAU_TABLES: tuple[str, ...] = tuple(n for n, t in TABLES.items() if t.tau_key)


def output_spec(name: str) -> TableSpec:
    """The table whose layout (iteration column, levels) an output table follows."""
    if name in TABLES:
        return TABLES[name]
    return DERIVED_TABLES[name].nonprivate
