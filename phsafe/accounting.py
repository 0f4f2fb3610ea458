"""The measurement plan of a run, in exact arithmetic (spec §5-§6).

Before any noise is drawn, a run knows every measurement it will make: one per measured table and
population-group level with a positive budget. Each carries its budget (rho or epsilon, exact),
its sensitivity -- the spec's 2*tau + 2 for person tables and 2 for unit tables, or, with the
config's ``"sensitivity": "exact"``, the exact sensitivity proven in ``docs/sensitivity.md``
(:mod:`phsafe.sensitivity`); never inferred from data --, the noise distribution and its
variance, and the number of cells of its full public domain. The run's privacy loss is the exact
sum of the budgets (sequential composition).

An exact L2 sensitivity may be irrational (tau sqrt 2): it is carried as its square, an integer,
so that sigma^2 = Delta^2 / (2 rho) stays an exact rational.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from phsafe.config import INFINITE, MEASURED_TABLES, PHSafeConfig, PrivacyDefinition
from phsafe.iterations import PopulationGroupLevel
from phsafe.sensitivity import Encoded, SensitivityBound, squared
from phsafe.sensitivity import value as sensitivity_value
from phsafe.tables import TABLES


class NoiseDistribution(enum.Enum):
    DISCRETE_GAUSSIAN = "Discrete Gaussian"
    TWO_SIDED_GEOMETRIC = "Two-Sided Geometric"


def sensitivity(table: str, config: PHSafeConfig, level: PopulationGroupLevel | None = None) -> Encoded:
    """The sensitivity ``config`` calibrates ``table`` (at ``level``) to, as the ledger writes it.

    With the paper's bound (the default): 2*tau+2 (person tables) or 2 (unit tables), whatever
    the level. For zCDP this bounds the L2 norm of the change of the count vector under adding or
    removing one person (paper, Lemma 6 -- it bounds the L1 norm, which bounds L2); for pure DP it
    bounds the L1 norm. With ``"sensitivity": "exact"``: the proven L2 (zCDP) or L1 (pure DP)
    sensitivity of the measurement, which depends on the level (required then).
    """
    if level is None:
        if config.sensitivity is not SensitivityBound.PAPER:
            raise ValueError(f"{table}: the exact sensitivity depends on the level; give it")
        level = TABLES[table].levels[0]
    return config.sensitivity_of(table, level)


@dataclass(frozen=True)
class PlannedMeasurement:
    """One noisy measurement: a table at one population-group level.

    Attributes:
        table: Measured table name, e.g. ``PH1_num``.
        level: The population-group level.
        privacy_defn: zCDP (budget is rho) or pure DP (budget is epsilon).
        budget: The exact budget; ``Decimal('Infinity')`` means no noise (test runs only).
        sensitivity: Delta in the norm of ``privacy_defn`` (L2 for zCDP, L1 for pure DP), as the
            ledger writes it: a positive integer, or ``"sqrt(N)"`` for an irrational exact L2
            sensitivity (:mod:`phsafe.sensitivity`; exact arithmetic uses
            :attr:`sensitivity_squared`).
        tau: Truncation threshold of a person table, else None.
        n_cells: Cells of the full public domain (regions x iteration codes x basis cells).
        bound: Which bound ``sensitivity`` is: the paper's (2*tau+2, 2) or the exact one.
    """

    table: str
    level: PopulationGroupLevel
    privacy_defn: PrivacyDefinition
    budget: Decimal
    sensitivity: Encoded
    tau: int | None
    n_cells: int
    bound: SensitivityBound = SensitivityBound.PAPER

    @property
    def key(self) -> str:
        return f"{self.table}/{self.level.config_key}"

    @property
    def sensitivity_squared(self) -> int:
        """Delta^2, exactly (an integer)."""
        return squared(self.sensitivity)

    @property
    def sensitivity_value(self) -> float:
        """Delta as a float (display; exact work uses :attr:`sensitivity_squared`)."""
        return sensitivity_value(self.sensitivity)

    @property
    def is_noiseless(self) -> bool:
        return self.budget == INFINITE

    @property
    def budget_fraction(self) -> Fraction:
        if self.is_noiseless:
            raise ValueError("an Infinity budget has no exact fraction")
        return Fraction(self.budget)

    @property
    def distribution(self) -> NoiseDistribution:
        if self.privacy_defn is PrivacyDefinition.ZCDP:
            return NoiseDistribution.DISCRETE_GAUSSIAN
        return NoiseDistribution.TWO_SIDED_GEOMETRIC

    @property
    def gaussian_sigma_squared(self) -> Fraction:
        """sigma^2 = Delta^2 / (2 rho), exact (zCDP only)."""
        assert self.privacy_defn is PrivacyDefinition.ZCDP and not self.is_noiseless
        return Fraction(self.sensitivity_squared) / (2 * self.budget_fraction)

    @property
    def geometric_scale(self) -> Fraction:
        """s = Delta / epsilon, exact (pure DP only)."""
        assert self.privacy_defn is PrivacyDefinition.PUREDP and not self.is_noiseless
        assert isinstance(self.sensitivity, int), "an L1 sensitivity is an integer"
        return Fraction(self.sensitivity) / self.budget_fraction

    @property
    def variance(self) -> float:
        """The per-cell noise variance reported in ``VARIANCE`` (spec §6)."""
        if self.is_noiseless:
            return 0.0
        if self.privacy_defn is PrivacyDefinition.ZCDP:
            return float(self.gaussian_sigma_squared)
        return geometric_variance(self.geometric_scale)

    @property
    def moe90(self) -> float:
        """90% margin of error, 1.645 * sigma."""
        return 1.645 * math.sqrt(self.variance)


def geometric_variance(scale: Fraction | float) -> float:
    """Variance 2e^(-1/s) / (1 - e^(-1/s))^2 of the two-sided geometric with scale s."""
    q = math.exp(-1.0 / float(scale))
    return 2.0 * q / (1.0 - q) ** 2


@dataclass(frozen=True)
class RunPlan:
    """Every measurement of a run, fixed from the config before any data-dependent step."""

    privacy_defn: PrivacyDefinition
    measurements: tuple[PlannedMeasurement, ...]
    bound: SensitivityBound = SensitivityBound.PAPER

    @property
    def total(self) -> Fraction | Decimal:
        """The run's privacy loss, exact: Infinity if any budget is infinite."""
        if any(m.is_noiseless for m in self.measurements):
            return INFINITE
        return sum((m.budget_fraction for m in self.measurements), Fraction(0))

    def for_table(self, table: str) -> tuple[PlannedMeasurement, ...]:
        return tuple(m for m in self.measurements if m.table == table)


def plan_run(config: PHSafeConfig) -> RunPlan:
    """Plan every measurement of the run described by ``config``.

    Levels with budget 0 are not measured; Puerto Rico's USA budgets are 0 by config rule.
    """
    from phsafe.domain import domain_size  # local: domain imports tables, tables is light

    measurements = []
    for table in MEASURED_TABLES:
        spec = TABLES[table]
        for level in config.measured_levels(table):
            measurements.append(
                PlannedMeasurement(
                    table=table,
                    level=level,
                    privacy_defn=config.privacy_defn,
                    budget=config.budget(table, level),
                    sensitivity=config.sensitivity_of(table, level),
                    tau=config.tau[spec.tau_key] if spec.tau_key else None,
                    n_cells=domain_size(spec, level, config),
                    bound=config.sensitivity,
                )
            )
    return RunPlan(privacy_defn=config.privacy_defn, measurements=tuple(measurements), bound=config.sensitivity)
