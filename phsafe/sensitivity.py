"""The sensitivity of every measurement: the PHSafe paper's bound, or the exact one.

A run calibrates each measurement's noise to a sensitivity Delta (config key ``sensitivity``):

* ``"paper"`` (the default, and the production release's): Delta = 2*tau + 2 for the person
  tables and 2 for the unit tables, the same in L1 and L2 (PHSafe paper, Lemma 6 and Theorems
  1-2; spec §5). It bounds the number of joined rows that change, as if all of them could land
  in one cell.
* ``"exact"``: the exact L2 (zCDP) or L1 (pure DP) sensitivity of each measurement, table by
  table and level by level, proven in ``docs/sensitivity.md`` and checked exhaustively against
  the production code path by ``tests/unit/test_sensitivity_exhaustive.py``.

Every measurement falls in one of five cases of the proof (:class:`MeasurementCase`), decided
from the table's definition (:mod:`phsafe.tables`) alone: which columns its cells and its
iteration codes read, and whether its unit universe is restricted. With tau the table's
truncation threshold, the exact sensitivities under the paper's unbounded neighbours (one
person of the base person dataframe added or removed) are:

=================================  ==================  ==============  ===================
case                               measurements        L1              L2 (squared)
=================================  ==================  ==============  ===================
person, a unit change moves rows   PH1_num, PH4 at     2 tau           2 tau^2 (tau sqrt2)
                                   A-G and H,I; PH2,
                                   PH3, PH6, PH7
person, cells by the person,       PH1_num at ``*``    2               2 (sqrt 2)
every unit joins
person, cells by the person,       PH4 at ``*``        max(tau, 2)     max(tau^2, 2)
units filtered
unit, the cell can change          PH8_denom; PH1_,    2               2 (sqrt 2)
                                   PH5_denom at A-G
                                   and H,I
unit, one cell                     PH1_denom,          1               1
                                   PH5_denom at ``*``
=================================  ==================  ==============  ===================

Under bounded neighbours (one record changed) every one of them doubles (L2 squared x4): a
change is a removal and an addition, in two households that can each take their worst case in
the same direction. So a zCDP run calibrated to the exact sensitivities is rho-zCDP for unbounded
neighbours and 4 rho-zCDP for bounded ones, where the paper's calibration gives 2 rho (its
Theorems 3-4): :func:`bounded_factor`.

Squared L2 sensitivities are integers; an L2 sensitivity is carried exactly as its square, and
written (ledger, public log, manifest) as an integer when it is one, else as ``"sqrt(N)"``
(:func:`encode_l2`, :func:`squared`) -- never as a rounded float.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

from phsafe.iterations import IterationLevel, PopulationGroupLevel
from phsafe.tables import TABLES, IterationSource, Source, TableKind, TableSpec

Encoded = Union[int, str]
"""A sensitivity as the ledger writes it: a positive integer, or ``"sqrt(N)"`` (N not a square)."""

DOCUMENT = "docs/sensitivity.md"
"""Where the exact sensitivities are proven (named in releases that use them)."""

_SQRT = re.compile(r"sqrt\(([1-9][0-9]*)\)")


class SensitivityBound(enum.Enum):
    """Which sensitivity a run calibrates its noise to (config key ``sensitivity``)."""

    PAPER = "paper"
    EXACT = "exact"

    @property
    def description(self) -> str:
        if self is SensitivityBound.PAPER:
            return ("the PHSafe paper's bound (Lemma 6): Delta = 2 tau + 2 for person tables, 2 for unit "
                    "tables, in L1 and L2")
        return (f"the exact sensitivity of each measurement (L2 for zCDP, L1 for pure DP), proven in "
                f"{DOCUMENT}")


class MeasurementCase(enum.Enum):
    """The cases of the proof (``docs/sensitivity.md``, section "The five cases")."""

    PERSON_MOVES = "person table: a change of the household's unit record can move its kept rows to other cells"
    PERSON_FIXED = "person table: cells read the person only, and every unit joins"
    PERSON_FIXED_FILTERED = "person table: cells read the person only, and units are filtered"
    UNIT_MOVES = "unit table: a change of the unit record can move it to another cell"
    UNIT_SINGLE = "unit table: one cell per region"


@dataclass(frozen=True)
class Sensitivities:
    """The four sensitivities of one measurement, exact (L2 as its square).

    Attributes:
        l1: Unbounded neighbours (one person added or removed), L1 norm.
        l2_squared: Unbounded neighbours, squared L2 norm.
        bounded_l1: Bounded neighbours (one record changed), L1 norm.
        bounded_l2_squared: Bounded neighbours, squared L2 norm.
    """

    l1: int
    l2_squared: int
    bounded_l1: int
    bounded_l2_squared: int


def _reads_unit(conditions) -> bool:  # type: ignore[no-untyped-def]
    return any(c.source is Source.UNIT for c in conditions)


def measurement_case(spec: TableSpec, level: PopulationGroupLevel | IterationLevel) -> MeasurementCase:
    """The case of the proof that ``spec`` at ``level`` falls in, from its definition alone."""
    iteration = level.iteration if isinstance(level, PopulationGroupLevel) else level
    iterates = iteration is not IterationLevel.TOTAL and spec.iteration_source is not IterationSource.NONE
    if spec.kind is TableKind.UNIT:
        return MeasurementCase.UNIT_MOVES if iterates or len(spec.basis) > 1 else MeasurementCase.UNIT_SINGLE
    cells_read_unit = any(_reads_unit(cell.conditions) for cell in spec.basis)
    code_reads_unit = iterates and spec.iteration_source is IterationSource.HOUSEHOLDER
    if cells_read_unit or code_reads_unit:
        return MeasurementCase.PERSON_MOVES
    if spec.unit_universe or _reads_unit(spec.person_universe):
        return MeasurementCase.PERSON_FIXED_FILTERED
    return MeasurementCase.PERSON_FIXED


def _spec(table: str | TableSpec) -> TableSpec:
    return table if isinstance(table, TableSpec) else TABLES[table]


def _tau(spec: TableSpec, tau: int | None) -> int:
    if spec.kind is TableKind.PERSON:
        if tau is None or isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"{spec.name}: a person table needs tau >= 1")
        return tau
    if tau is not None:
        raise ValueError(f"{spec.name}: a unit table has no tau")
    return 0


def exact(table: str | TableSpec, level: PopulationGroupLevel | IterationLevel, tau: int | None) -> Sensitivities:
    """The exact sensitivities of ``table`` at ``level`` (proven in ``docs/sensitivity.md``)."""
    spec = _spec(table)
    t = _tau(spec, tau)
    case = measurement_case(spec, level)
    l1, l2_squared = {
        MeasurementCase.PERSON_MOVES: (2 * t, 2 * t * t),
        MeasurementCase.PERSON_FIXED: (2, 2),
        MeasurementCase.PERSON_FIXED_FILTERED: (max(t, 2), max(t * t, 2)),
        MeasurementCase.UNIT_MOVES: (2, 2),
        MeasurementCase.UNIT_SINGLE: (1, 1),
    }[case]
    # A bounded change is a removal and an addition (triangle inequality: at most twice), and
    # two households can each take their worst case in the same direction (attained).
    return Sensitivities(l1, l2_squared, 2 * l1, 4 * l2_squared)


def paper(table: str | TableSpec, tau: int | None) -> Sensitivities:
    """The PHSafe paper's bounds: Delta = 2 tau + 2 (person) or 2 (unit) in L1 and L2 (Lemma 6,
    Theorems 1-2); bounded: sqrt(2) Delta in L2 (Theorems 3-4) and 2 Delta in L1."""
    spec = _spec(table)
    t = _tau(spec, tau)
    delta = 2 * t + 2 if spec.kind is TableKind.PERSON else 2
    return Sensitivities(delta, delta * delta, 2 * delta, 2 * delta * delta)


def sensitivities(table: str | TableSpec, level: PopulationGroupLevel | IterationLevel, tau: int | None,
                  bound: SensitivityBound) -> Sensitivities:
    """The sensitivities ``bound`` gives ``table`` at ``level``."""
    return exact(table, level, tau) if bound is SensitivityBound.EXACT else paper(table, tau)


def declared(table: str | TableSpec, level: PopulationGroupLevel | IterationLevel, tau: int | None,
             bound: SensitivityBound, *, l2: bool) -> Encoded:
    """The sensitivity a run declares for a measurement, as the ledger writes it: the L2 norm's
    (zCDP, ``l2=True``: :func:`encode_l2` of its square) or the L1 norm's (pure DP)."""
    s = sensitivities(table, level, tau, bound)
    return encode_l2(s.l2_squared) if l2 else s.l1


def encode_l2(squared_value: int) -> Encoded:
    """An L2 sensitivity given by its square: the integer root when there is one, else ``"sqrt(N)"``."""
    if isinstance(squared_value, bool) or not isinstance(squared_value, int) or squared_value < 1:
        raise ValueError("a squared sensitivity is an integer >= 1")
    root = math.isqrt(squared_value)
    return root if root * root == squared_value else f"sqrt({squared_value})"


def squared(value: Encoded) -> int:
    """The exact square of an encoded sensitivity (see :func:`encode_l2`).

    Raises:
        ValueError: Not a positive integer, nor ``"sqrt(N)"`` with N >= 2 not a square (the one
            canonical spelling: ``"sqrt(4)"`` is written ``2``).
    """
    if isinstance(value, bool):
        raise ValueError("a sensitivity is not a boolean")
    if isinstance(value, int):
        if value < 1:
            raise ValueError("a sensitivity is at least 1")
        return value * value
    if isinstance(value, str):
        match = _SQRT.fullmatch(value)
        if match:
            n = int(match.group(1))
            if math.isqrt(n) ** 2 != n:
                return n
    raise ValueError(f"{value!r} is not a sensitivity (a positive integer, or \"sqrt(N)\" with N not a square)")


def value(encoded: Encoded) -> float:
    """The sensitivity as a float (for display and plots; exact work uses :func:`squared`)."""
    return math.sqrt(squared(encoded)) if isinstance(encoded, str) else float(encoded)


def text(encoded: Encoded) -> str:
    """For people: ``22``, or ``sqrt(200) = 14.142``."""
    if isinstance(encoded, str):
        return f"{encoded} = {value(encoded):.3f}"
    return str(encoded)


def bounded_factor(bound: SensitivityBound, *, zcdp: bool) -> Fraction:
    """Bounded-neighbour privacy loss of a run over its unbounded loss (the ledger's).

    zCDP: 2 with the paper's calibration (its Theorems 3-4), 4 with the exact one (every
    measurement's bounded L2 sensitivity is twice its unbounded one, and attained). Pure DP: 2
    either way (bounded L1 is twice unbounded).
    """
    if not zcdp:
        return Fraction(2)
    return Fraction(4) if bound is SensitivityBound.EXACT else Fraction(2)


__all__ = [
    "DOCUMENT", "Encoded", "MeasurementCase", "SensitivityBound", "Sensitivities", "bounded_factor", "declared",
    "encode_l2", "exact", "measurement_case", "paper", "sensitivities", "squared", "text", "value",
]
