"""The plan of a run: every measured level's budget and margins of error (pure analysis).

:func:`plan_from_targets` turns MOE targets into budgets and the config that spends them;
:func:`plan_from_config` gives the MOEs of an existing config's budgets. Writing the plan (its
config, JSON, report and plots) is :mod:`phsafe.planner.report`'s.

Totals are sums over levels (sequential composition, exact). Bounded-neighbour totals are twice
the unbounded ones: for zCDP by the PHSafe paper §5.3 (Theorems 3 and 4: Algorithms 1 and 2
satisfy bounded 2 rho-zCDP, better than the generic 4 rho); for pure DP because an arbitrary
change of one record is a removal followed by an addition (group privacy of size 2). With the
exact sensitivities (config ``"sensitivity": "exact"``, ``docs/sensitivity.md``) a zCDP plan's
bounded total is four times the unbounded one: every exact bounded sensitivity is twice the
unbounded one (:func:`phsafe.sensitivity.bounded_factor`). The
(epsilon, delta) figures of a zCDP total come from :mod:`phsafe.audit.report` (analytic bound and
the Renyi bound minimised over alpha).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from phsafe.accounting import plan_run, sensitivity
from phsafe.config import INFINITE, PHSafeConfig, PrivacyDefinition, load_config, parse_config
from phsafe.errors import ConfigError, PlanningError
from phsafe.iterations import GeographyLevel, PopulationGroupLevel
from phsafe.planner.moe import (
    DEFAULT_DIGITS,
    discrete_gaussian_halfwidth,
    epsilon_for_halfwidth,
    gaussian_moe,
    gaussian_sigma2,
    geometric_halfwidth,
    geometric_sd_moe,
    rho_for_moe,
    round_up,
)
from phsafe.schema import STATE_CODES
from phsafe.sensitivity import SensitivityBound, bounded_factor, declared
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TABLES, TAU_TABLES

DEFAULT_DELTA = 1e-10


class PlanMode(enum.Enum):
    TARGETS = "targets"  # MOE targets -> budgets and a config.json
    CONFIG = "config"  # an existing config's budgets -> MOEs


@dataclass(frozen=True)
class LevelPlan:
    """One measured table x population-group level.

    Attributes:
        table: Measured table.
        level: Population-group level.
        tau: Truncation threshold (person tables) or None.
        sensitivity: Delta in the config's definition (L2 for zCDP, L1 for pure DP), from
            :func:`phsafe.accounting.sensitivity`: an integer, or ``"sqrt(N)"`` for an exact L2
            sensitivity.
        n_cells: Released cells of the level (regions x iteration codes x basis cells).
        moe_target: The MOE planned for (targets mode), else None.
        rho_exact: The exact rho with 1.645 sigma = the reference MOE (the target; from a
            pure-DP config, the geometric MOE), or None.
        rho: zCDP budget: the config's, or ``rho_exact`` rounded up. None if undefined.
        epsilon: Pure-DP budget: the config's, or the smallest rounded-up epsilon with the same
            MOE. None if undefined.
        gaussian_moe: 1.645 sigma at ``rho``.
        gaussian_halfwidth: Exact discrete 90% half-width of the discrete Gaussian at ``rho``.
        geometric_halfwidth: Exact discrete 90% half-width of the geometric at ``epsilon``.
        geometric_sd_moe: 1.645 sd of the geometric at ``epsilon`` (``accounting.moe90``).
        l2_sensitivity: The L2 Delta the rho figures use (the same as ``sensitivity`` with the
            paper's bound; with the exact one, the exact L2 sensitivity).
        l1_sensitivity: The L1 Delta the epsilon figures use (likewise).
    """

    table: str
    level: PopulationGroupLevel
    tau: int | None
    sensitivity: int | str
    n_cells: int
    moe_target: Fraction | None
    rho_exact: Fraction | None
    rho: Decimal | None
    epsilon: Decimal | None
    gaussian_moe: float | None
    gaussian_halfwidth: int | None
    geometric_halfwidth: int | None
    geometric_sd_moe: float | None
    l2_sensitivity: int | str = 0
    l1_sensitivity: int = 0

    @property
    def key(self) -> str:
        return f"{self.table}/{self.level.config_key}"


@dataclass(frozen=True)
class Plan:
    """A complete plan: the config it describes (or writes) and every measured level.

    ``paper`` is, for targets planned with the exact sensitivities, the plan of the same targets
    with the paper's bound (for comparison).
    """

    mode: PlanMode
    privacy_defn: PrivacyDefinition
    config: PHSafeConfig
    config_json: dict[str, Any] | None
    levels: tuple[LevelPlan, ...]
    digits: int
    delta: float
    source: str
    notes: tuple[str, ...] = ()
    paper: "Plan | None" = None

    @property
    def bound(self) -> SensitivityBound:
        """The sensitivity bound of the plan's config."""
        return self.config.sensitivity

    def bounded_factor(self, measure: str) -> Fraction:
        """Bounded-neighbour loss over unbounded, for ``"rho"`` or ``"epsilon"``."""
        return bounded_factor(self.bound, zcdp=measure == "rho")

    def budget_of(self, lp: LevelPlan) -> Decimal | None:
        """The level's budget in the plan's own privacy definition."""
        return lp.rho if self.privacy_defn is PrivacyDefinition.ZCDP else lp.epsilon

    def table_totals(self, measure: str) -> dict[str, Fraction | Decimal | None]:
        """Exact sum per table of ``measure`` (``"rho"`` or ``"epsilon"``)."""
        return {t: _sum(getattr(lp, measure) for lp in self.levels if lp.table == t)
                for t in MEASURED_TABLES if any(lp.table == t for lp in self.levels)}

    def total(self, measure: str) -> Fraction | Decimal | None:
        """Exact run total of ``measure``: None if some level has no such budget."""
        return _sum(getattr(lp, measure) for lp in self.levels)


def _sum(values: Iterable[Decimal | None]) -> Fraction | Decimal | None:
    total = Fraction(0)
    for v in values:
        if v is None:
            return None
        if v == INFINITE:
            return INFINITE
        total += Fraction(v)
    return total


def _level_plan(
    table: str,
    level: PopulationGroupLevel,
    config: PHSafeConfig,
    n_cells: int,
    digits: int,
    *,
    moe_target: Fraction | None = None,
    rho: Decimal | None = None,
    epsilon: Decimal | None = None,
) -> LevelPlan:
    spec = TABLES[table]
    tau = config.tau[spec.tau_key] if spec.tau_key else None
    # zCDP figures use the L2 sensitivity, pure-DP ones the L1: the same with the paper's bound.
    delta = declared(table, level, tau, config.sensitivity, l2=True)
    delta1 = declared(table, level, tau, config.sensitivity, l2=False)
    assert isinstance(delta1, int)
    rho_exact: Fraction | None = None
    if moe_target is not None:
        rho_exact = rho_for_moe(moe_target, delta)
        rho = round_up(rho_exact, digits)
        epsilon = epsilon_for_halfwidth(math.floor(moe_target), delta1, digits)
    elif rho is not None and rho != INFINITE:
        # From a zCDP budget: the pure-DP epsilon whose exact MOE is at most floor(1.645 sigma).
        epsilon = epsilon_for_halfwidth(math.floor(gaussian_moe(rho, delta)), delta1, digits)
    elif epsilon is not None and epsilon != INFINITE:
        # From a pure-DP budget: the rho with 1.645 sigma equal to the exact geometric MOE.
        m = geometric_halfwidth(epsilon, delta1)
        if m > 0:
            rho_exact = rho_for_moe(m, delta)
            rho = round_up(rho_exact, digits)
    finite_rho = rho is not None and rho != INFINITE
    finite_eps = epsilon is not None and epsilon != INFINITE
    return LevelPlan(
        table=table,
        level=level,
        tau=tau,
        sensitivity=sensitivity(table, config, level),
        n_cells=n_cells,
        moe_target=moe_target,
        rho_exact=rho_exact,
        rho=rho,
        epsilon=epsilon,
        gaussian_moe=gaussian_moe(rho, delta) if finite_rho else (0.0 if rho == INFINITE else None),
        gaussian_halfwidth=(discrete_gaussian_halfwidth(gaussian_sigma2(rho, delta)) if finite_rho
                            else (0 if rho == INFINITE else None)),
        geometric_halfwidth=(geometric_halfwidth(epsilon, delta1) if finite_eps
                             else (0 if epsilon == INFINITE else None)),
        geometric_sd_moe=(geometric_sd_moe(epsilon, delta1) if finite_eps
                          else (0.0 if epsilon == INFINITE else None)),
        l2_sensitivity=delta,
        l1_sensitivity=delta1,
    )


def _skeleton(privacy_defn: PrivacyDefinition, tau: Mapping[str, int], states: Sequence[str],
              bound: SensitivityBound = SensitivityBound.PAPER) -> dict[str, Any]:
    """A config mapping with the production key set and every budget 0 (and ``sensitivity``
    when it is not the default)."""
    raw: dict[str, Any] = {
        "privacy_budget": {t: {lv.config_key: Decimal(0) for lv in TABLE_LEVELS[t]} for t in MEASURED_TABLES},
        "tau": {t: tau[t] for t in TAU_TABLES},
        "state_filter": list(states),
        "reader": "csv",
        "privacy_defn": privacy_defn.value,
    }
    if bound is not SensitivityBound.PAPER:
        raw["sensitivity"] = bound.value
    return raw


def plan_from_targets(
    targets: Mapping[tuple[str, PopulationGroupLevel], Fraction],
    tau: Mapping[str, int],
    *,
    privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP,
    state_filter: Sequence[str] | None = None,
    digits: int = DEFAULT_DIGITS,
    delta: float = DEFAULT_DELTA,
    source: str = "targets",
    sensitivity: SensitivityBound = SensitivityBound.PAPER,
) -> Plan:
    """Budgets for MOE targets, and the config that spends them.

    Args:
        targets: MOE target per (table, level); levels not listed are not measured.
        tau: Truncation threshold of every person table.
        privacy_defn: Which budgets go into the config (both are reported).
        state_filter: The run's states; default the 50 states and DC. ``["72"]`` plans a Puerto
            Rico run, which has no USA level: USA targets are then dropped (and noted).
        digits: Significant digits of the budgets, rounded up.
        delta: delta of the (epsilon, delta) conversions.
        source: Where the targets came from (for the report).
        sensitivity: The bound the config calibrates its noise to: the paper's (2 tau + 2, 2)
            or the exact sensitivities (then the plan also holds, as ``paper``, the paper's plan
            of the same targets).

    Raises:
        PlanningError: A person table lacks a tau, or the resulting config is invalid.
    """
    missing = [t for t in TAU_TABLES if t not in tau]
    if missing:
        raise PlanningError(
            "tau is required for every person table; missing: " + ", ".join(missing)
            + " (e.g. --tau 10 --tau PH3=6 --tau PH6=6)"
        )
    states = list(state_filter) if state_filter is not None else sorted(STATE_CODES)
    notes: list[str] = []
    try:
        base = parse_config(_skeleton(privacy_defn, tau, states, sensitivity))
    except ConfigError as exc:
        raise PlanningError(f"invalid plan: {exc}") from None
    kept = dict(targets)
    if base.is_puerto_rico:
        dropped = sorted(f"{t}/{lv.config_key}" for (t, lv) in kept if lv.geography is GeographyLevel.USA)
        kept = {k: v for k, v in kept.items() if k[1].geography is not GeographyLevel.USA}
        if dropped:
            notes.append(
                f"Puerto Rico has no USA level: {len(dropped)} USA targets were not planned "
                "(their budgets are 0)."
            )
    raw = _skeleton(privacy_defn, tau, states, sensitivity)
    provisional: dict[tuple[str, PopulationGroupLevel], LevelPlan] = {}
    for (table, level), moe in kept.items():
        lp = _level_plan(table, level, base, 0, digits, moe_target=moe)
        provisional[(table, level)] = lp
        budget = lp.rho if privacy_defn is PrivacyDefinition.ZCDP else lp.epsilon
        raw["privacy_budget"][table][level.config_key] = budget
    try:
        config = parse_config(raw)
    except ConfigError as exc:
        raise PlanningError(f"invalid plan: {exc}") from None
    run = plan_run(config)
    levels = []
    for m in run.measurements:
        lp = provisional[(m.table, m.level)]
        assert m.sensitivity == lp.sensitivity and m.budget == (
            lp.rho if privacy_defn is PrivacyDefinition.ZCDP else lp.epsilon
        )
        levels.append(replace(lp, n_cells=m.n_cells))
    paper = None
    if sensitivity is not SensitivityBound.PAPER:
        paper = plan_from_targets(targets, tau, privacy_defn=privacy_defn, state_filter=state_filter, digits=digits,
                                  delta=delta, source=source)
    return Plan(PlanMode.TARGETS, privacy_defn, config, raw, tuple(levels), digits, delta, source, tuple(notes),
                paper)


def plan_from_config(
    config: PHSafeConfig | str | Path,
    *,
    digits: int = DEFAULT_DIGITS,
    delta: float = DEFAULT_DELTA,
    source: str | None = None,
) -> Plan:
    """MOEs of an existing config's budgets (and the other definition's equivalent budgets)."""
    if not isinstance(config, PHSafeConfig):
        source = source or str(config)
        config = load_config(config)
    levels = []
    for m in plan_run(config).measurements:
        kwargs = {"rho": m.budget} if config.privacy_defn is PrivacyDefinition.ZCDP else {"epsilon": m.budget}
        levels.append(_level_plan(m.table, m.level, config, m.n_cells, digits, **kwargs))
    notes = []
    if config.has_infinite_budget:
        notes.append("Some budgets are Infinity (no noise, test runs only): their MOE is 0 and totals are Infinity.")
    return Plan(PlanMode.CONFIG, config.privacy_defn, config, None, tuple(levels), digits, delta,
                source or "config", tuple(notes))


@dataclass(frozen=True)
class TotalsRow:
    """A total in one definition, unbounded and bounded, with (epsilon, delta) for zCDP."""

    measure: str  # "rho" or "epsilon"
    unbounded: Fraction | Decimal | None
    bounded: Fraction | Decimal | None
    eps_analytic: tuple[float, float] | None = None  # (unbounded, bounded)
    eps_renyi: tuple[float, float] | None = None


def totals_row(measure: str, total: Fraction | Decimal | None, delta: float, factor: Fraction = Fraction(2)
               ) -> TotalsRow:
    """Bounded = ``factor`` x unbounded (2; 4 for rho with the exact sensitivities:
    :meth:`Plan.bounded_factor`); for rho also epsilon at ``delta`` (the audit report's bounds)."""
    from phsafe.audit.report import epsilon_analytic, epsilon_renyi

    if total is None:
        return TotalsRow(measure, None, None)
    bounded = total if total == INFINITE else factor * total
    if measure != "rho":
        return TotalsRow(measure, total, bounded)
    u, b = float(total), float(bounded)
    return TotalsRow(
        measure,
        total,
        bounded,
        eps_analytic=(epsilon_analytic(u, delta), epsilon_analytic(b, delta)),
        eps_renyi=(epsilon_renyi(u, delta)[0], epsilon_renyi(b, delta)[0]),
    )
