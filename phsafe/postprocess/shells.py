"""The table shells of the model-based estimates: which cells each estimate file holds.

The Census Bureau's model-based estimates (``shared/spec/MODEL_BASED_ESTIMATES.md`` §1-§2) have
one model per S-DHC table shell PH1 ... PH8:

* count tables PH2, PH3, PH4, PH6, PH7: every *internal* cell (the measured basis cells) and every
  *marginal* cell (a sum of internal cells, e.g. PH2 cell 2 = cells 3 + 4, cell 1 = all of them);
* ratio tables PH1, PH5 (average household and family size by age: numerator cells 2 and 3 over
  the denominator cell 1) and PH8 (average household size by tenure: numerator over denominator
  cell by cell), each with cells 1 (total), 2 and 3.

Everything here is derived from the table definitions in code (:mod:`phsafe.tables`), whose
aggregate cells are the spec's marginal cells in the spec's processing order.
"""

from __future__ import annotations

from dataclasses import dataclass

from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES, output_spec


def marginal_cells(table: str) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The marginal cells of a private output table: (cell, the released cells it sums), in the
    spec's processing order (sub-totals first, the total last).

    PH1_denom and PH5_denom have none: their non-private cells 2 and 3 repeat cell 1 (they are
    the denominators of the age averages), they are not sums.
    """
    released = released_cells(table)
    out = []
    for cell, parts in output_spec(table).aggregates:
        if len(parts) > 1 and set(parts) <= set(released):
            out.append((cell, tuple(parts)))
    return tuple(out)


def released_cells(table: str) -> tuple[int, ...]:
    """The cells a private release holds for ``table`` (spec §7): the basis cells, or a derived
    table's own cells."""
    if table in DERIVED_TABLES:
        return tuple(n for n, _ in DERIVED_TABLES[table].cells)
    return output_spec(table).basis_numbers


@dataclass(frozen=True)
class CountShell:
    """A count table of the estimates: the private table it models and its marginal cells."""

    name: str

    @property
    def marginals(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        return marginal_cells(self.name)

    @property
    def has_iteration_column(self) -> bool:
        """Whether the *private* table has one (PH2 and PH6 do not; their estimates add ``*``)."""
        return output_spec(self.name).has_iteration_column


@dataclass(frozen=True)
class RatioShell:
    """A ratio (average) table: numerator over denominator, cell by cell.

    Attributes:
        name: ``PH1``, ``PH5`` or ``PH8``.
        numerator, denominator: The private tables.
        lower_bound: The least possible average of the total cell: a household has at least one
            person (PH1, PH8), a family at least two (PH5).
        tau_table: The person table whose truncation threshold tau bounds the averages from
            above: the numerator's, or for a derived numerator its source's (PH5_num = PH4,
            PH8_num from PH7). After truncation no household holds more than tau counted persons.
        shared_denominator: PH1 and PH5 divide every numerator cell by the one denominator cell
            1 (households, families); PH8 divides each cell by its own denominator cell.
    """

    name: str
    numerator: str
    denominator: str
    lower_bound: int
    tau_table: str
    shared_denominator: bool

    @property
    def cells(self) -> tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]:
        """Average cell -> (numerator cells summed, denominator cells summed)."""
        if self.shared_denominator:
            return ((1, (2, 3), (1,)), (2, (2,), (1,)), (3, (3,), (1,)))
        return ((1, (2, 3), (2, 3)), (2, (2,), (2,)), (3, (3,), (3,)))


COUNT_SHELLS: dict[str, CountShell] = {t: CountShell(t) for t in ("PH2", "PH3", "PH4", "PH6", "PH7")}
RATIO_SHELLS: dict[str, RatioShell] = {
    "PH1": RatioShell("PH1", "PH1_num", "PH1_denom", 1, "PH1_num", True),
    "PH5": RatioShell("PH5", "PH5_num", "PH5_denom", 2, DERIVED_TABLES["PH5_num"].source, True),
    "PH8": RatioShell("PH8", "PH8_num", "PH8_denom", 1, DERIVED_TABLES["PH8_num"].source, False),
}
ESTIMATE_TABLES: tuple[str, ...] = ("PH1", "PH2", "PH3", "PH4", "PH5", "PH6", "PH7", "PH8")
"""The eight tables of the model-based estimates, in their order."""
RATIO_CELLS: tuple[int, ...] = (1, 2, 3)
"""Cells of every ratio table: 1 total, 2 and 3 the parts (under 18 / 18 and over; owner /
renter)."""

assert set(OUTPUT_TABLES) >= {s.numerator for s in RATIO_SHELLS.values()} | set(COUNT_SHELLS)
