"""The empirical privacy audit: many runs of the real release path on neighbouring datasets.

For each audited calibration (the sensitivities the noise is calibrated to: the paper's or the
exact ones, ``--sensitivity``) and table: pack its canaries (:mod:`.canaries`), generate the
background (:mod:`.population`), fix the number of runs and every threshold *before any run*
(from the config and the canaries only), then run the mechanism (:mod:`.mechanism`) again and
again, each run with every canary in or out by a fair coin (seeded: the audit is reproducible)
and a fresh truncation key, and score each canary's owned cells. The runs are cut into chunks of
:data:`CHUNK_RUNS` (each with its own seeded coins, so the result does not depend on how many
processes ran them) and run in a process pool (``workers``).

The statistic (zCDP) of canary k in a run: with r' the released vector minus the exact counts
the auditor knows for every *other* canary's coin and canary k out, and d_k its known change,

    T_k = sum over k's owned cells of r'_c d_c / sigma_c^2, divided by mu_k,
    mu_k = sqrt(sum over the same cells of d_c^2 / sigma_c^2)

(the likelihood-ratio statistic of the Gaussian shift d_k), which is N(0, 1) when k is out and
N(mu_k, 1) when k is in, for correct code. The test says "in" when T_k > mu_k / 2 -- a threshold
fixed before the data. Over all runs and canaries of a *family* (the canaries owning a level, or
the whole-table canaries), its false positives and false negatives give Clopper-Pearson bounds
and mu_lb, mu_ub (:func:`.bounds.gdp_bounds`). Pure DP: the event "every owned cell moved by at
least the canary's change, in its direction" (its likelihood ratio is e^(epsilon reachable) for
correct code) and the bounds on its ratio (:func:`.bounds.pure_dp_bounds`).

Rows (one per calibration, table and family) and their verdicts:

* VIOLATION -- mu_lb > mu_declared (sqrt(2 rho) of what the row measures): the release loses
  more privacy than its plan says;
* EXCESS -- mu_lb above what correct code can show with these canaries (mu_reach: the change
  the canaries make over the declared noise; exact for integer noise): a bug even if within the
  budget;
* WEAK -- mu_ub below it: less signal than correct code gives (e.g. more noise than declared);
* INCONCLUSIVE -- none of these, and [mu_lb, mu_ub] holds both 0 and mu_declared: the runs tell
  nothing about this row (the row says how many runs would separate them);
* PASS -- none of these.

Multiple testing: Bonferroni, per calibration (each is its own mechanism, with its own
family-wise alpha). Half of ``alpha`` goes to the whole-table rows, half to the level rows,
evenly within each half; the lower bounds (VIOLATION, EXCESS) and the upper bounds (WEAK) each
have their own ``alpha``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import resource
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from phsafe.accounting import PlannedMeasurement
from phsafe.config import PHSafeConfig, PrivacyDefinition, parse_config
from phsafe.iterations import PopulationGroupLevel
from phsafe.sensitivity import SensitivityBound
from phsafe.tables import DERIVED_TABLES, MEASURED_TABLES, TABLES, TableKind

from phsafe.audit.empirical.bounds import (
    epsilon_gdp, exact_threshold_mu, gdp_bounds, lattice_allowance, pooled_mu, pure_dp_bounds,
)
from phsafe.audit.empirical.canaries import Layout, Shape, change_norm, pack
from phsafe.audit.empirical.checks import (
    FAIL, INCONCLUSIVE, OPENDP_FIXED, PASS, Check, LevelResiduals, opendp_version, version_at_least,
)
from phsafe.audit.empirical.mechanism import ReleaseMechanism
from phsafe.audit.empirical.population import Records, TableRecords, free_mafids, generated_background

if TYPE_CHECKING:
    from phsafe.progress import Progress, Task

__all__ = [
    "AuditSettings", "AuditResult", "Row", "TableAudit", "run_audit", "plan_audit", "audit_table", "conclude",
    "QUICK_SCALES", "MODES", "SENSITIVITIES", "VIOLATION", "EXCESS", "WEAK", "INCONCLUSIVE_ROW", "PASS_VERDICT",
    "production_config", "default_workers", "children_cpu",
]

VIOLATION, EXCESS, WEAK, INCONCLUSIVE_ROW, PASS_VERDICT = "VIOLATION", "EXCESS", "WEAK", "INCONCLUSIVE", "PASS"
MODES = ("quick", "full")
SENSITIVITIES = ("paper", "exact", "both")
"""What ``--sensitivity`` may say: one calibration, or both side by side."""
QUICK_SCALES: dict[str, dict[str, int]] = {
    "paper": {"PH6": 10, "PH1_denom": 100, "PH5_denom": 100, "PH8_denom": 100},
    "exact": {"PH1_denom": 100, "PH5_denom": 100, "PH8_denom": 100},
}
"""Quick mode's budget scale, per calibration, of the tables whose production budgets need too
many runs: with the exact sensitivities PH6 is audited at its production budgets (its canaries
reach the whole declared sensitivity, so far fewer runs show it)."""
MAX_RUNS = {"quick": 12_000, "full": 400_000}
MIN_RUNS = 30
CHUNK_RUNS = 40
"""Runs per chunk: the unit of work of a process (each chunk's coins have their own seed)."""
TARGET_RATIO = 0.5
"""The runs of a table are enough for epsilon_hat / epsilon >= this on its whole-table row ..."""
TARGET_POWER = 0.97
"""... with this probability, for correct code (planning figures) ..."""
LEVEL_TARGET_RATIO = 0.85
"""... and, where the calibration is tight (a level's ceiling at least :data:`TIGHT_CEILING`), for
epsilon_hat / epsilon >= this on its best-audited level ..."""
LEVEL_TARGET_POWER = 0.999
"""... with this probability (so that all nine tables reach it together in 99 audits in 100)."""
TIGHT_CEILING = 0.95
WHOLE_TABLE = "all"
_SCORES_KEPT = 20_000  # test statistics kept per family and side, for the report's histograms

PRODUCTION_US_CONFIG = {
    "privacy_defn": "zcdp",
    "reader": "csv",
    "tau": {"PH1_num": 10, "PH2": 10, "PH3": 6, "PH4": 10, "PH6": 6, "PH7": 10},
    "state_filter": ["09", "23", "25", "33", "44", "50", "34", "36", "42", "17", "18", "26", "39", "55", "19",
                     "20", "27", "29", "31", "38", "46", "10", "11", "12", "13", "24", "37", "45", "51", "54",
                     "01", "21", "28", "47", "05", "22", "40", "48", "04", "08", "16", "30", "32", "35", "49",
                     "56", "02", "06", "15", "41", "53"],
    "privacy_budget": {
        **{t: {"usa_A-G": "0.002619", "usa_H,I": "0.002619", "usa_*": "0.002619", "state_A-G": "0.141622",
               "state_H,I": "0.016371", "state_*": "0.016371"} for t in ("PH1_num", "PH4", "PH7")},
        **{t: {"usa_A-G": "0.000022", "usa_H,I": "0.000022", "usa_*": "0.000022", "state_A-G": "0.00117",
               "state_H,I": "0.000135", "state_*": "0.000135"} for t in ("PH1_denom", "PH5_denom", "PH8_denom")},
        "PH2": {"usa_*": "0.002619", "state_*": "0.016371"},
        "PH3": {"usa_A-G": "0.001061", "usa_H,I": "0.001061", "usa_*": "0.001061", "state_A-G": "0.662976",
                "state_H,I": "0.00663", "state_*": "0.00663"},
        "PH6": {"usa_*": "0.001061", "state_*": "0.00663"},
    },
}
"""The production US run's parameters (the PHSafe paper's Table 10, unbounded column; spec §6)."""


def production_config() -> PHSafeConfig:
    """The production US config (every budget exact, as the decimal text above)."""
    raw = {**PRODUCTION_US_CONFIG, "privacy_budget": {
        t: {k: Decimal(v) for k, v in levels.items()} for t, levels in PRODUCTION_US_CONFIG["privacy_budget"].items()}}
    return parse_config(raw)


def default_workers() -> int:
    """Processes the audit uses by default: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------------------------
# Settings and plan
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditSettings:
    """What to audit and how.

    Attributes:
        config: The declared config (budgets, tau, states, sensitivity); the production US one
            by default.
        tables: The measured tables to audit.
        mode: ``quick`` (production budgets, some tables scaled: :data:`QUICK_SCALES`) or ``full``.
        sensitivity: The calibration audited: ``paper``, ``exact`` or ``both`` (each audited on
            its own, reported side by side); None: the config's.
        budget_scale: One budget scale for every audited table, overriding the mode's.
        seed: Seeds the generated data and the canaries' coins -- never the noise, never a key.
        runs: Runs of every table, overriding the planned number.
        alpha: Family-wise probability of a false VIOLATION or EXCESS (and, separately, of a
            false WEAK) over all rows of one calibration.
        check_alpha: Family-wise probability that a correct release fails a statistical check.
        delta: The delta of epsilon_hat and epsilon_declared (zCDP).
        background_persons: Persons of the generated background population.
        release_checks: Runs (the first of each table) whose release tables are checked.
        workers: Processes running the chunks of runs at once (1: all in this process).
    """

    config: PHSafeConfig = field(default_factory=production_config)
    tables: tuple[str, ...] = MEASURED_TABLES
    mode: str = "quick"
    sensitivity: str | None = None
    budget_scale: float | None = None
    seed: int = 0
    runs: int | None = None
    alpha: float = 0.05
    check_alpha: float = 1e-3
    delta: float = 1e-10
    background_persons: int = 2_000
    release_checks: int = 5
    workers: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if self.sensitivity is not None and self.sensitivity not in SENSITIVITIES:
            raise ValueError(f"sensitivity must be one of {', '.join(SENSITIVITIES)}")
        unknown = [t for t in self.tables if t not in TABLES]
        if unknown:
            raise ValueError(f"not a measured table: {', '.join(unknown)} (the tables: {', '.join(MEASURED_TABLES)})")
        if self.budget_scale is not None and not self.budget_scale > 0:
            raise ValueError("the budget scale must be positive")
        if self.runs is not None and self.runs < 2:
            raise ValueError("at least 2 runs")
        if self.workers < 1:
            raise ValueError("at least 1 worker")
        if self.config.has_infinite_budget:
            raise ValueError("the config has an Infinity budget (no noise): there is no privacy loss to audit "
                             "there, and its exact counts would be released; give finite budgets")

    @property
    def calibrations(self) -> tuple[SensitivityBound, ...]:
        """The calibrations audited, in report order."""
        if self.sensitivity is None:
            return (self.config.sensitivity,)
        if self.sensitivity == "both":
            return (SensitivityBound.PAPER, SensitivityBound.EXACT)
        return (SensitivityBound(self.sensitivity),)

    def scale(self, table: str, bound: SensitivityBound | None = None) -> float:
        if self.budget_scale is not None:
            return float(self.budget_scale)
        bound = bound or self.calibrations[0]
        return float(QUICK_SCALES[bound.value].get(table, 1)) if self.mode == "quick" else 1.0

    def scaled_config(self, table: str, bound: SensitivityBound | None = None) -> PHSafeConfig:
        """The config calibrated to ``bound``, with ``table``'s budgets multiplied by its scale
        (exactly)."""
        bound = bound or self.calibrations[0]
        config = self.config if self.config.sensitivity is bound else self.config.model_copy(
            update={"sensitivity": bound})
        k = self.scale(table, bound)
        if k == 1:
            return config
        factor = Decimal(repr(k))
        budgets = {t: dict(levels) for t, levels in config.privacy_budget.items()}
        budgets[table] = {lv: b * factor for lv, b in budgets[table].items()}
        return config.model_copy(update={"privacy_budget": budgets})

    def calibrated_config(self, bound: SensitivityBound) -> PHSafeConfig:
        """The config (production budgets) calibrated to ``bound``."""
        return self.config if self.config.sensitivity is bound else self.config.model_copy(
            update={"sensitivity": bound})

    def tau(self, table: str) -> int | None:
        key = TABLES[table].tau_key
        return self.config.tau[key] if key else None


@dataclass(frozen=True)
class Family:
    """A set of canaries scored together: the owners of one level, or the whole-table canaries.

    Attributes:
        shapes: Per level of the family, the distinct changes (sorted values) its members make
            there.
    """

    table: str
    name: str
    levels: tuple[str, ...]
    members: tuple[int, ...]
    mus: tuple[float, ...]
    shapes: tuple[tuple[str, tuple[Shape, ...]], ...] = ()
    reach_epsilon: float = math.nan
    event_in: float = math.nan
    event_out: float = math.nan


@dataclass(frozen=True)
class TablePlan:
    """Everything fixed about a table's audit (under one calibration) before its first run."""

    table: str
    sensitivity: str
    scale: float
    measurements: tuple[PlannedMeasurement, ...]
    layout: Layout
    families: tuple[Family, ...]
    not_audited: tuple[tuple[str, str], ...]
    runs: int
    index: int
    lead: str = WHOLE_TABLE

    @property
    def key(self) -> tuple[str, str]:
        return (self.sensitivity, self.table)

    @property
    def chunks(self) -> int:
        return math.ceil(self.runs / CHUNK_RUNS)


@dataclass(frozen=True)
class AuditPlan:
    settings: AuditSettings
    tables: tuple[TablePlan, ...]
    alpha_row: dict[tuple[str, str, str], float]
    check_alpha_each: float


def _sigma(m: PlannedMeasurement) -> float:
    """The declared noise scale: sigma (zCDP) or s (pure DP)."""
    if m.privacy_defn is PrivacyDefinition.ZCDP:
        return math.sqrt(float(m.gaussian_sigma_squared))
    return float(m.geometric_scale)


def _sigmas(measurements: Sequence[PlannedMeasurement]) -> dict[str, float]:
    """Each measurement's :func:`_sigma`, by its level's config key (computed once per use: the
    exact Fractions behind them are slow to ask per canary or per run)."""
    return {m.level.config_key: _sigma(m) for m in measurements}


def _delta_squared(m: PlannedMeasurement) -> Fraction:
    """The plan's sensitivity squared, exactly -- an integer Delta, or an exact L2 one carried as
    its square (a plan calibrated to exact sensitivities)."""
    squared = getattr(m, "sensitivity_squared", None)
    return Fraction(squared if squared is not None else m.sensitivity ** 2)


def _declared_norm(m: PlannedMeasurement) -> float:
    """The declared sensitivity in the measurement's norm (L2 zCDP, L1 pure DP), as a float."""
    return math.sqrt(float(_delta_squared(m)))


_PLANNING_ALPHA = 0.05 / 18
"""The per-row alpha the choice of whole-table canaries plans with (the rows are not counted yet)."""


def _families(table: str, layout: Layout, measurements: Sequence[PlannedMeasurement], delta: float
              ) -> tuple[list[Family], list[tuple[str, str]]]:
    by_key = {m.level.config_key: m for m in measurements}
    pure = measurements[0].privacy_defn is PrivacyDefinition.PUREDP if measurements else False

    sigma_of = _sigmas(measurements)

    def mu_of(canary_index: int, levels: Sequence[str]) -> float:
        total = 0.0
        for key in levels:
            change = layout.change[canary_index][key]
            total += sum(v * v for v in change.values()) / sigma_of[key] ** 2
        return math.sqrt(total)

    def shapes_of(members: Sequence[int], levels_of: Callable[[int], Sequence[str]]
                  ) -> tuple[tuple[str, tuple[Shape, ...]], ...]:
        found: dict[str, set[Shape]] = {}
        for k in members:
            for key in levels_of(k):
                found.setdefault(key, set()).add(layout.shape(k, key))
        return tuple((key, tuple(sorted(found[key]))) for key in sorted(found))

    def events(members: Sequence[int], levels_of: Callable[[int], Sequence[str]]) -> dict[str, float]:
        """Pure DP: the event's mean probability with and without the canary, and their log ratio."""
        if not pure:
            return {}
        p_in, p_out = [], []
        for k in members:
            pin = pout = 1.0
            for key in levels_of(k):
                q = math.exp(-1.0 / sigma_of[key])
                for v in layout.change[k][key].values():
                    pin *= 1.0 / (1.0 + q)  # P(n >= 0): the cell moved by at least its change
                    pout *= q ** abs(v) / (1.0 + q)  # P(n >= |v|) without the canary
            p_in.append(pin)
            p_out.append(pout)
        return {"reach_epsilon": math.log(sum(p_in) / sum(p_out)), "event_in": sum(p_in) / len(p_in),
                "event_out": sum(p_out) / len(p_out)}

    def family(name: str, levels: tuple[str, ...], members: Sequence[int],
               levels_of: Callable[[int], Sequence[str]]) -> Family:
        return Family(table, name, levels, tuple(members), tuple(mu_of(k, levels_of(k)) for k in members),
                      shapes_of(members, levels_of), **events(members, levels_of))

    families: list[Family] = []
    # The whole table: the canaries scored on every level whose cells they own. Canaries owning
    # fewer levels have a smaller mu; pooling them adds trials but lowers the pooled mu. Which to
    # pool is fixed here from the config and the canaries alone: the canaries of largest mu, as
    # many as make the fewest runs for the planning target (see :func:`_per_side_needed`); all of
    # them if no choice reaches the target.
    levels = tuple(m.level.config_key for m in measurements)
    owned = {c.index: [k for k in levels if k in c.owns] for c in layout.canaries if c.owns}
    if owned:
        mus = {k: mu_of(k, owned[k]) for k in owned}
        strength = {k: (events([k], owned.__getitem__)["reach_epsilon"] if pure else mus[k]) for k in owned}
        ranked = sorted(owned, key=lambda k: (-round(strength[k], 12), k))
        best: tuple[float, int] | None = None
        for size in sorted({i + 1 for i in range(len(ranked)) if i + 1 == len(ranked)
                            or round(strength[ranked[i]], 12) != round(strength[ranked[i + 1]], 12)}):
            trial = family(WHOLE_TABLE, levels, ranked[:size], owned.__getitem__)
            needed = _per_side_needed(trial, measurements, _PLANNING_ALPHA, delta, pure) / size
            if best is None or needed < best[0]:
                best = (needed, size)
        assert best is not None
        members = sorted(ranked[:best[1]] if math.isfinite(best[0]) else ranked)
        families.append(family(WHOLE_TABLE, levels, members, owned.__getitem__))
    not_audited = []
    for m in measurements:
        key = m.level.config_key
        owners = layout.owners(key)
        if not owners:
            not_audited.append((key, "no key-invariant canary moves this level"))
            continue
        families.append(family(key, (key,), [c.index for c in owners], lambda _k, key=key: [key]))
    if not owned:
        not_audited.insert(0, (WHOLE_TABLE, "no canary owns any level"))
    return families, not_audited


def _ceiling(family: Family, measurements: Sequence[PlannedMeasurement], delta: float, pure: bool) -> float:
    """epsilon of what correct code shows with these canaries over the declared epsilon."""
    if pure:
        return family.reach_epsilon / sum(float(m.budget) for m in measurements)
    mu_decl = math.sqrt(sum(2 * float(m.budget) for m in measurements))
    return epsilon_gdp(pooled_mu(family.mus), delta) / epsilon_gdp(mu_decl, delta)


def _rate_spread(mu: float) -> float:
    """How far Phi^-1 of a threshold test's rate moves per unit of the rate's standard error, at
    mu (the test at mu / 2): sqrt(p (1 - p)) / phi(mu / 2) with p = Phi(-mu / 2)."""
    p = float(stats.norm.cdf(-mu / 2))
    return math.sqrt(p * (1 - p)) / float(stats.norm.pdf(mu / 2))


def _per_side_needed(family: Family, measurements: Sequence[PlannedMeasurement], alpha_row: float, delta: float,
                     pure: bool, ratio: float = TARGET_RATIO, power: float = TARGET_POWER) -> float:
    """Trials per side for epsilon_hat / epsilon >= ``ratio`` with probability ``power``
    (correct code; infinite if the canaries cannot reach it).

    Planning arithmetic (normal approximations of the Clopper-Pearson limits), fixed from the
    config and the canaries before any run: the limit of a rate estimated from n trials is about
    z sqrt(p (1 - p) / n) from it, and mu (or epsilon) moves by that over the rate's derivative.
    """
    z = float(stats.norm.isf(alpha_row / 2))
    z_power = float(stats.norm.ppf(power))
    if pure:
        eps_decl = sum(float(m.budget) for m in measurements)
        gap = family.reach_epsilon - ratio * eps_decl
        a = math.sqrt((1 - family.event_in) / family.event_in)
        b = math.sqrt((1 - family.event_out) / family.event_out)
        spread = z * (a + b) + z_power * math.sqrt(a * a + b * b)
    else:
        mu_decl = math.sqrt(sum(2 * float(m.budget) for m in measurements))
        target = _mu_for_epsilon(ratio * epsilon_gdp(mu_decl, delta), delta)
        mu = pooled_mu(family.mus)
        gap = mu - target
        s = _rate_spread(mu)
        spread = 2 * z * s + z_power * math.sqrt(2) * s
    return math.inf if gap <= 0 else (spread / gap) ** 2


def _runs_for(family: Family, measurements: Sequence[PlannedMeasurement], alpha_row: float, delta: float,
              mode: str, pure: bool, ratio: float = TARGET_RATIO, power: float = TARGET_POWER) -> int:
    """Runs for a planning target (:func:`_per_side_needed`), within the mode's limits."""
    n = _per_side_needed(family, measurements, alpha_row, delta, pure, ratio, power)
    if not math.isfinite(n):
        return MAX_RUNS[mode]
    return int(min(MAX_RUNS[mode], max(MIN_RUNS, math.ceil(n / (len(family.members) / 2.0)))))


def _runs_to_separate(family: Family, measurements: Sequence[PlannedMeasurement], alpha: float,
                      pure: bool) -> int | None:
    """Runs after which correct code's [lower, upper] bound would, in expectation, no longer hold
    both 0 and the declared value (normal approximations, as the plan's)."""
    z = float(stats.norm.isf(alpha / 2))
    members = max(len(family.members), 1)
    if pure:
        eps_decl = sum(float(m.budget) for m in measurements)
        a = math.sqrt((1 - family.event_in) / family.event_in)
        b = math.sqrt((1 - family.event_out) / family.event_out)
        room = max(family.reach_epsilon, eps_decl - family.reach_epsilon)
        spread = z * (a + b)
    else:
        mu_decl = math.sqrt(sum(2 * float(m.budget) for m in measurements))
        mu = pooled_mu(family.mus)
        room = max(mu, mu_decl - mu)
        spread = 2 * z * _rate_spread(mu)
    if room <= 0:
        return None
    return max(1, math.ceil((spread / room) ** 2 / (members / 2.0)))


def _mu_for_epsilon(epsilon: float, delta: float) -> float:
    from scipy import optimize

    if epsilon <= 0:
        return 0.0
    return float(optimize.brentq(lambda m: epsilon_gdp(m, delta) - epsilon, 1e-9, 100.0, xtol=1e-12))


@lru_cache(maxsize=64)
def _packed(table: str, levels: tuple[PopulationGroupLevel, ...], tau: int | None, n_states: int,
            first_mafid: int) -> Layout:
    """:func:`~phsafe.audit.empirical.canaries.pack`, once per table, levels, tau and number of
    states in a process: a pure function of them (the public table definitions), read only
    after, and the same for every audit (and calibration) that asks."""
    return pack(table, list(levels), tau, n_states, first_mafid)


def plan_audit(settings: AuditSettings, mechanism: ReleaseMechanism | None = None) -> AuditPlan:
    """Fix the canaries, the families, the alphas and the runs of every calibration and table
    (no data yet)."""
    mechanism = mechanism or ReleaseMechanism()
    tables: list[TablePlan] = []
    first_mafid = 800_000_001  # provisional; the real ones come with the background
    layouts: dict[tuple[str, tuple[str, ...]], Layout] = {}
    for bound in settings.calibrations:
        for table in settings.tables:
            config = settings.scaled_config(table, bound)
            measurements = mechanism.plan(config, table)
            if not measurements:
                continue
            tau = settings.tau(table)
            levels = tuple(m.level.config_key for m in measurements)
            if (table, levels) not in layouts:  # the packing does not depend on the calibration
                layouts[(table, levels)] = _packed(table, tuple(m.level for m in measurements), tau,
                                                   len(config.states), first_mafid)
            layout = layouts[(table, levels)]
            families, not_audited = _families(table, layout, measurements, settings.delta)
            tables.append(TablePlan(table, bound.value, settings.scale(table, bound), measurements, layout,
                                    tuple(families), tuple(not_audited), 0, MEASURED_TABLES.index(table)))
    alpha_row: dict[tuple[str, str, str], float] = {}
    for bound in settings.calibrations:
        mine = [t for t in tables if t.sensitivity == bound.value]
        whole = [(t.sensitivity, t.table, f.name) for t in mine for f in t.families if f.name == WHOLE_TABLE]
        levels_ = [(t.sensitivity, t.table, f.name) for t in mine for f in t.families if f.name != WHOLE_TABLE]
        for group in (whole, levels_):
            share = settings.alpha / (2 if whole and levels_ else 1) / max(len(group), 1)
            alpha_row.update({key: share for key in group})
    planned = []
    for t in tables:
        pure = t.measurements[0].privacy_defn is PrivacyDefinition.PUREDP

        def of(family: Family) -> list[PlannedMeasurement]:
            return [m for m in t.measurements if m.level.config_key in family.levels]

        whole_family = [f for f in t.families if f.name == WHOLE_TABLE]
        level_families = [f for f in t.families if f.name != WHOLE_TABLE]
        # The lead level: among the levels whose ceiling is tight, the one that needs the fewest
        # runs for LEVEL_TARGET_RATIO -- the best-audited level, chosen before any run.
        tight = [f for f in level_families if _ceiling(f, of(f), settings.delta, pure) >= TIGHT_CEILING]
        lead_level = min(tight, key=lambda f: _runs_for(f, of(f), alpha_row[(t.sensitivity, t.table, f.name)],
                                                        settings.delta, settings.mode, pure, LEVEL_TARGET_RATIO,
                                                        LEVEL_TARGET_POWER), default=None)
        if settings.runs is not None:
            runs = settings.runs
        else:
            lead = whole_family[0] if whole_family else max(
                t.families, key=lambda f: f.reach_epsilon if pure else pooled_mu(f.mus), default=None)
            runs = MIN_RUNS if lead is None else _runs_for(
                lead, of(lead), alpha_row[(t.sensitivity, t.table, lead.name)], settings.delta, settings.mode, pure)
            if lead_level is not None:
                runs = max(runs, _runs_for(lead_level, of(lead_level),
                                           alpha_row[(t.sensitivity, t.table, lead_level.name)], settings.delta,
                                           settings.mode, pure, LEVEL_TARGET_RATIO, LEVEL_TARGET_POWER))
        planned.append(replace(t, runs=runs, lead=lead_level.name if lead_level is not None else WHOLE_TABLE))
    n_levels = sum(len(t.measurements) for t in planned)
    # Residual checks: five per level; release checks: one per table; four white-box checks per
    # calibration.
    check_alpha_each = settings.check_alpha / max(1, 5 * n_levels + len(planned) + 4 * len(settings.calibrations))
    return AuditPlan(settings, tuple(planned), alpha_row, check_alpha_each)


# --------------------------------------------------------------------------------------------
# Running one table
# --------------------------------------------------------------------------------------------


@dataclass
class FamilyTally:
    """A family's tallies over the runs (and a sample of its statistics, for the report)."""

    family: Family
    negatives: int = 0
    positives: int = 0
    false_positives: int = 0
    false_negatives: int = 0
    hits_out: int = 0
    hits_in: int = 0
    scores_out: list[np.ndarray] = field(default_factory=list)
    scores_in: list[np.ndarray] = field(default_factory=list)

    def merge(self, other: FamilyTally) -> None:
        """Add another chunk's tallies of the same family."""
        for name in ("negatives", "positives", "false_positives", "false_negatives", "hits_out", "hits_in"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.scores_out, other.scores_out), (self.scores_in, other.scores_in)):
            room = _SCORES_KEPT - sum(len(a) for a in mine)
            for a in theirs:
                if room <= 0:
                    break
                mine.append(a[:room])
                room -= len(a[:room])


@dataclass
class TableAudit:
    """What the runs of one table found (all the conclusion needs; picklable, no records)."""

    plan: TablePlan
    tallies: list[FamilyTally]
    residuals: list[LevelResiduals]
    release_problems: list[str]
    releases_checked: int
    commitments: list[str]
    runs: int
    seconds: float
    cpu_seconds: float
    canary_norms: dict[str, float]

    def merge(self, other: TableAudit) -> None:
        """Add another chunk of the same table's runs."""
        for mine, theirs in zip(self.tallies, other.tallies):
            mine.merge(theirs)
        for mine, theirs in zip(self.residuals, other.residuals):
            mine.merge(theirs)
        self.release_problems += other.release_problems
        self.releases_checked += other.releases_checked
        self.commitments += other.commitments
        self.runs += other.runs
        self.seconds += other.seconds
        self.cpu_seconds += other.cpu_seconds


class _Scorer:
    """A family's entries as flat arrays over the run's concatenated residual vector."""

    def __init__(self, family: Family, layout: Layout, offsets: dict[str, int],
                 sigmas: dict[str, float], pure: bool) -> None:
        self.family = family
        self.pure = pure
        position, cell, value, weight = [], [], [], []
        for pos, k in enumerate(family.members):
            canary = layout.canaries[k]
            for key in family.levels:
                if key not in canary.owns:
                    continue
                for c, v in layout.change[k][key].items():
                    position.append(pos)
                    cell.append(offsets[key] + c)
                    value.append(v)
                    weight.append(1.0 / sigmas[key] ** 2)
        self.position = np.array(position, dtype=np.int64)
        self.cell = np.array(cell, dtype=np.int64)
        self.value = np.array(value, dtype=np.int64)
        self.weight = np.array(weight)
        self.canary = np.array(family.members, dtype=np.int64)
        self.mu = np.array(family.mus)
        self.single = len(family.levels) == 1
        n = len(family.members)
        # One level: compare integers exactly (the exact profile of the test assumes it).
        self.half_norm = np.bincount(self.position, weights=self.value.astype(float) ** 2, minlength=n) / 2

    def score(self, residual: np.ndarray, included: np.ndarray, tally: FamilyTally) -> None:
        n = len(self.family.members)
        inside = included[self.canary]
        r = residual[self.cell] + inside[self.position].astype(np.int64) * self.value  # k's own shift removed
        if self.pure:
            ok = np.where(self.value < 0, r <= self.value, r >= self.value)
            fails = np.bincount(self.position, weights=~ok, minlength=n)
            said_in = fails == 0
            tally.hits_out += int((said_in & ~inside).sum())
            tally.hits_in += int((said_in & inside).sum())
            scores = None
        else:
            if self.single:
                projection = np.bincount(self.position, weights=(r * self.value).astype(float), minlength=n)
                said_in = projection > self.half_norm
                scores = projection * self.weight[0] / self.mu if len(self.weight) else projection
            else:
                projection = np.bincount(self.position, weights=r * self.value * self.weight, minlength=n)
                said_in = projection > self.mu ** 2 / 2
                scores = projection / self.mu
            tally.false_positives += int((said_in & ~inside).sum())
            tally.false_negatives += int((~said_in & inside).sum())
        tally.negatives += int((~inside).sum())
        tally.positives += int(inside.sum())
        if scores is not None:
            kept_out = sum(len(a) for a in tally.scores_out)
            kept_in = sum(len(a) for a in tally.scores_in)
            if kept_out < _SCORES_KEPT:
                tally.scores_out.append(scores[~inside][: _SCORES_KEPT - kept_out].astype(np.float32))
            if kept_in < _SCORES_KEPT:
                tally.scores_in.append(scores[inside][: _SCORES_KEPT - kept_in].astype(np.float32))


def table_records(settings: AuditSettings, plan: TablePlan, background: Records) -> TableRecords:
    """A table's runs' records: the background and the canaries (MAFIDs no background record uses)."""
    return TableRecords(background, _renumbered(plan.layout, background), settings.config.states, plan.measurements,
                        settings.tau(plan.table))


def run_chunk(settings: AuditSettings, plan: TablePlan, mechanism: ReleaseMechanism, salt: bytes, chunk: int,
              records: TableRecords, task: "Task | None" = None) -> TableAudit:
    """The runs ``chunk * CHUNK_RUNS ...`` of a table's audit (each chunk's coins seeded apart).

    Args:
        salt: Key of the runs' truncation-key commitments (the same for every table of an audit).
        records: The table's records (:func:`table_records`).
        task: Advanced by one after each run (progress).
    """
    wall, cpu = time.perf_counter(), time.process_time()
    table = plan.table
    config = settings.scaled_config(table, SensitivityBound(plan.sensitivity))
    layout = records.layout
    pure = config.privacy_defn is PrivacyDefinition.PUREDP
    sigmas = _sigmas(plan.measurements)
    offsets, total = {}, 0
    for m in plan.measurements:
        offsets[m.level.config_key] = total
        total += m.n_cells
    scorers = [_Scorer(f, layout, offsets, sigmas, pure) for f in plan.families]
    tallies = [FamilyTally(f) for f in plan.families]
    residuals = [LevelResiduals(table, m.level.config_key, "geometric" if pure else "gaussian", sigmas[m.level.config_key],
                                m.n_cells) for m in plan.measurements]
    rng = np.random.default_rng([settings.seed, plan.index, 2, chunk])  # the canaries' coins: never the noise
    commit = _committer(salt)
    commitments: list[str] = []
    release_problems: list[str] = []
    checked = 0
    first = chunk * CHUNK_RUNS
    runs = max(0, min(CHUNK_RUNS, plan.runs - first))
    with mechanism.drawing():  # each planned measurement built once, drawn from in every run
        for run in range(first, first + runs):
            included = rng.integers(0, 2, records.n_canaries).astype(bool)
            release = mechanism.release(records.inputs(included), config, table, plan.measurements, commit)
            commitments.append(release.key_commitment)
            exact = records.expected(included)
            parts = []
            for m, acc in zip(plan.measurements, residuals):
                residual = np.asarray(release.noisy[m.key]) - exact[m.level.config_key]
                acc.add(residual)  # notes a non-integer release
                parts.append(np.rint(residual).astype(np.int64))
            residual_all = np.concatenate(parts)
            for scorer, tally in zip(scorers, tallies):
                scorer.score(residual_all, included, tally)
            if run < settings.release_checks:
                release_problems += _release_problems(mechanism, config, plan.measurements, release.noisy)
                checked += 1
            if task is not None:
                task.advance(item=f"{plan.table} ({plan.sensitivity})")
    norms = {}
    for m in plan.measurements:
        key = m.level.config_key
        norms[key] = max((change_norm(ch[key].values(), l2=not pure) for ch in layout.change if ch[key]), default=0.0)
    return TableAudit(plan, tallies, residuals, release_problems, checked, commitments, runs,
                      time.perf_counter() - wall, time.process_time() - cpu, norms)


def _merged(parts: Sequence[TableAudit]) -> TableAudit:
    whole = parts[0]
    for part in parts[1:]:
        whole.merge(part)
    return whole


def audit_table(settings: AuditSettings, plan: TablePlan, mechanism: ReleaseMechanism, salt: bytes,
                background: Records | None = None, task: "Task | None" = None, workers: int = 1) -> TableAudit:
    """Run one table's audit: ``plan.runs`` runs of the mechanism on the table's canaries, chunk
    by chunk, in this process or (``workers`` > 1) in a pool of processes."""
    wall, cpu = time.perf_counter(), time.process_time()
    if workers > 1 and plan.chunks > 1:
        audits = _run_in_pool(settings, [plan], mechanism, salt, workers, task)
        audit = audits[plan.key]
    else:
        background = background if background is not None else audit_background(settings)
        records = table_records(settings, plan, background)
        audit = _merged([run_chunk(settings, plan, mechanism, salt, c, records, task) for c in range(plan.chunks)])
        audit.cpu_seconds = time.process_time() - cpu
    audit.seconds = time.perf_counter() - wall
    return audit


def audit_background(settings: AuditSettings) -> Records:
    """The generated background population of the audit (the same for every table)."""
    return generated_background(settings.config.states, settings.background_persons, settings.seed,
                                max_household=min(settings.config.tau.values()))


def _renumbered(layout: Layout, background: Records) -> Layout:
    """The layout with MAFIDs no background record uses."""
    mafids = free_mafids(background, len(layout.canaries))
    canaries = tuple(replace(c, mafid=int(m)) for c, m in zip(layout.canaries, mafids))
    return replace(layout, canaries=canaries)


def _committer(salt: bytes) -> Callable[[bytes], str]:
    def commit(key: bytes) -> str:
        return hmac.new(salt, key, hashlib.sha256).hexdigest()

    return commit


# --------------------------------------------------------------------------------------------
# The process pool: every chunk of every table, shared out between the workers
# --------------------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(settings: AuditSettings, plans: Sequence[TablePlan], mechanism: ReleaseMechanism,
                 salt: bytes) -> None:
    _WORKER.clear()
    _WORKER.update(settings=settings, plans={p.key: p for p in plans}, mechanism=mechanism, salt=salt,
                   records={})


def _chunk_in_worker(key: tuple[str, str], chunk: int) -> TableAudit:
    settings, plan = _WORKER["settings"], _WORKER["plans"][key]
    if "background" not in _WORKER:
        _WORKER["background"] = audit_background(settings)
    records = _WORKER["records"]
    if plan.table not in records:  # the same records under every calibration
        records[plan.table] = table_records(settings, plan, _WORKER["background"])
    return run_chunk(settings, plan, _WORKER["mechanism"], _WORKER["salt"], chunk, records[plan.table])


def children_cpu() -> float:
    """CPU-seconds of this process's finished child processes (the pools' workers, once the pool
    is shut down)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_in_pool(settings: AuditSettings, plans: Sequence[TablePlan], mechanism: ReleaseMechanism, salt: bytes,
                 workers: int, task: "Task | None" = None) -> dict[tuple[str, str], TableAudit]:
    """Every chunk of ``plans`` in a pool of ``workers`` processes; per table, its chunks merged.

    A table's ``cpu_seconds`` is the CPU its chunks took in the workers (and the time to build
    its records there is counted in the run's total, :func:`run_audit`)."""
    jobs = sorted(((p.key, c) for p in plans for c in range(p.chunks)),
                  key=lambda job: job[1])  # round robin over the tables: the long ones start at once
    parts: dict[tuple[str, str], list[TableAudit]] = {p.key: [] for p in plans}
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), initializer=_init_worker,
                             initargs=(settings, tuple(plans), mechanism, salt)) as pool:
        pending = {pool.submit(_chunk_in_worker, key, chunk): key for key, chunk in jobs}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                key = pending.pop(future)
                part = future.result()
                parts[key].append(part)
                if task is not None:
                    task.advance(part.runs, item=f"{key[1]} ({key[0]})")
    audits = {}
    for plan in plans:
        audits[plan.key] = _merged(parts[plan.key])
    return audits


def _release_problems(mechanism: ReleaseMechanism, config: PHSafeConfig, measurements: Sequence[PlannedMeasurement],
                      noisy: dict[str, np.ndarray]) -> list[str]:
    """What is wrong with the release tables of one run (nothing, for correct code)."""
    problems = []
    table = measurements[0].table
    frames = mechanism.tables(config, measurements, noisy)
    measured = np.concatenate([np.asarray(noisy[m.key], dtype=np.int64) for m in measurements])
    variances = np.concatenate([np.full(m.n_cells, m.variance) for m in measurements])
    frame = frames.get(table)
    if frame is None:
        return [f"{table}: no release table"]
    if not np.array_equal(frame["COUNT"].to_numpy(dtype=np.int64), measured):
        problems.append(f"{table}: the released counts are not the measured noisy vector")
    if not np.allclose(frame["VARIANCE"].to_numpy(dtype=float), variances, rtol=1e-12, atol=0):
        problems.append(f"{table}: the released variances are not the plan's")
    for name, derived in DERIVED_TABLES.items():
        if derived.source != table:
            continue
        spec = TABLES[table]
        position = {n: i for i, n in enumerate(spec.basis_numbers)}
        expected_counts, expected_var = [], []
        for m in measurements:
            cube = np.asarray(noisy[m.key], dtype=np.int64).reshape(-1, len(spec.basis))
            expected_counts.append(np.stack([cube[:, [position[s] for s in sources]].sum(1)
                                             for _, sources in derived.cells], 1).reshape(-1))
            expected_var.append(np.repeat([[m.variance * len(sources) for _, sources in derived.cells]],
                                          cube.shape[0], 0).reshape(-1))
        got = frames.get(name)
        if got is None:
            problems.append(f"{name}: not released with {table}")
        elif not np.array_equal(got["COUNT"].to_numpy(dtype=np.int64), np.concatenate(expected_counts)):
            problems.append(f"{name}: an aggregate is not the sum of the measured {table} cells it is made of")
        elif not np.allclose(got["VARIANCE"].to_numpy(dtype=float), np.concatenate(expected_var), rtol=1e-12):
            problems.append(f"{name}: a variance is not the sum of its {table} cells' variances")
    return problems




# --------------------------------------------------------------------------------------------
# Conclusion: rows, verdicts, checks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One audited calibration, table and level (``all``: the whole table) -- the report's unit.

    Attributes:
        sensitivity: The calibration the release's noise was drawn for (``paper`` or ``exact``).
        ceiling: mu_reach / mu_declared (pure DP: epsilon_reach / epsilon_declared): the most a
            perfect audit of correct code shows with these canaries, as a fraction.
        conclusive: False when [mu_lb, mu_ub] holds both 0 and mu_declared (the verdict is then
            INCONCLUSIVE, not PASS).
        runs_to_separate: The runs after which correct code's bounds would, in expectation, no
            longer hold both (normal approximation).
        lead: This level is the table's best-audited level, chosen in the plan.
        declared_sensitivity: The level's declared Delta (None for a whole-table row).
        canary_change: The largest change of the level's canaries in the same norm.
        reach_note: Why the canaries cannot move the level by the whole declared Delta.
    """

    table: str
    level: str
    sensitivity: str
    privacy_defn: str
    budget_scale: float
    runs: int
    seconds: float
    cpu_seconds: float
    canaries_per_run: int
    negatives: int
    positives: int
    false_positives: int  # pure DP: times the event happened without the canary
    false_negatives: int  # pure DP: times the event happened with the canary
    mu_lb: float | None
    mu_ub: float | None
    mu_hat: float | None
    mu_reach: float | None
    mu_declared: float | None
    excess_threshold: float
    weak_threshold: float
    epsilon_hat: float
    epsilon_ub: float | None
    epsilon_declared: float
    epsilon_reach: float
    delta: float
    alpha: float
    verdict: str
    ceiling: float = math.nan
    conclusive: bool = True
    runs_to_separate: int | None = None
    lead: bool = False
    declared_sensitivity: str | None = None
    canary_change: float | None = None
    reach_note: str | None = None

    @property
    def ratio(self) -> float:
        return self.epsilon_hat / self.epsilon_declared if self.epsilon_declared > 0 else math.nan

    @property
    def epsilon_ceiling(self) -> float:
        return self.epsilon_reach / self.epsilon_declared if self.epsilon_declared > 0 else math.nan

    def as_dict(self) -> dict:
        def num(x: float | None) -> float | None:  # JSON has no infinity: null (the report says so)
            return None if x is None or not math.isfinite(x) else float(x)

        return {
            "table": self.table, "level": self.level, "sensitivity": self.sensitivity,
            "privacy_defn": self.privacy_defn,
            "mu_lb": num(self.mu_lb), "mu_ub": num(self.mu_ub), "mu_hat": num(self.mu_hat),
            "mu_reach": num(self.mu_reach), "mu_declared": num(self.mu_declared), "ceiling": num(self.ceiling),
            "epsilon_hat": num(self.epsilon_hat), "epsilon_ub": num(self.epsilon_ub),
            "epsilon_declared": num(self.epsilon_declared), "epsilon_reach": num(self.epsilon_reach),
            "epsilon_ratio": num(self.ratio), "epsilon_ceiling": num(self.epsilon_ceiling), "delta": self.delta,
            "budget_scale": self.budget_scale, "verdict": self.verdict, "conclusive": self.conclusive,
            "runs_to_separate": self.runs_to_separate, "lead": self.lead,
            "declared_sensitivity": self.declared_sensitivity, "canary_change": num(self.canary_change),
            "reach_note": self.reach_note,
            "runs": self.runs, "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3), "canaries_per_run": self.canaries_per_run,
            "trials_out": self.negatives, "trials_in": self.positives,
            **({"events_out": self.false_positives, "events_in": self.false_negatives} if self.mu_lb is None else
               {"false_positives": self.false_positives, "false_negatives": self.false_negatives}),
            "excess_threshold": num(self.excess_threshold),
            "weak_threshold": num(self.weak_threshold), "alpha": self.alpha,
        }


@dataclass
class AuditResult:
    """The audit's conclusion (see :mod:`.report` for its files)."""

    settings: AuditSettings
    rows: list[Row]
    checks: list[Check]
    not_audited: list[dict]
    canaries: dict[str, dict]
    tallies: dict[tuple[str, str, str], FamilyTally]
    seconds: float
    cpu_seconds: float
    started: str
    opendp: str

    @property
    def verdict(self) -> str:
        """The worst outcome: VIOLATION, EXCESS, CHECK FAILED, WEAK or PASS (INCONCLUSIVE rows
        are counted in the report, and fail nothing)."""
        verdicts = {r.verdict for r in self.rows}
        for v in (VIOLATION, EXCESS):
            if v in verdicts:
                return v
        if any(c.status == FAIL for c in self.checks):
            return "CHECK FAILED"
        return WEAK if WEAK in verdicts else PASS_VERDICT

    @property
    def failed(self) -> bool:
        """A VIOLATION, an EXCESS or a failed check (WEAK is reported, not failed)."""
        return self.verdict in (VIOLATION, EXCESS, "CHECK FAILED")

    @property
    def calibrations(self) -> tuple[str, ...]:
        return tuple(b.value for b in self.settings.calibrations)


def reach_note(table: str, level: str, bound: SensitivityBound, pure: bool, declared: float, reached: float,
               tau: int | None) -> str | None:
    """Why the canaries move a level by less than its declared sensitivity (None if they do not).

    The exact sensitivity quoted is the one proven in ``docs/sensitivity.md``; it only explains
    the ceiling, never enters a verdict.
    """
    from phsafe.sensitivity import MeasurementCase, exact, measurement_case

    if reached >= declared * (1 - 1e-12):
        return None
    norm = "L1" if pure else "L2"
    spec = TABLES[table]
    pg = next(lv for lv in spec.levels if lv.config_key == level)
    s = exact(spec, pg, tau)
    proven = float(s.l1) if pure else math.sqrt(s.l2_squared)
    parts = [f"the canaries move this level by {reached:.4g} of the declared {declared:.4g} ({norm}, "
             f"{reached / declared:.3f} of it)"]
    if declared > proven * (1 + 1e-12):
        parts.append(f"the {bound.value} bound is not attained: no neighbour moves the level by more than its exact "
                     f"sensitivity {proven:.4g} (docs/sensitivity.md)")
    if reached < proven * (1 - 1e-12):
        case = measurement_case(spec, pg)
        if case is MeasurementCase.PERSON_FIXED:
            parts.append(f"the exact {proven:.4g} is attained only when the added person enters the kept set and "
                         "pushes a kept person of another cell out, and which one truncation pushes out depends on "
                         "the key; a key-invariant canary adds one person to a household of at most tau (+1)")
        else:
            parts.append(f"no key-invariant canary moves it by the exact {proven:.4g}")
    return "; ".join(parts)


def _row(settings: AuditSettings, plan: AuditPlan, audit: TableAudit, tally: FamilyTally) -> Row:
    family = tally.family
    t = audit.plan
    measurements = [m for m in t.measurements if m.level.config_key in family.levels]
    sigma_of = _sigmas(measurements)
    alpha = plan.alpha_row[(t.sensitivity, t.table, family.name)]
    pure = measurements[0].privacy_defn is PrivacyDefinition.PUREDP
    single = len(measurements) == 1
    bound = SensitivityBound(t.sensitivity)
    note = declared_text = change = None
    if single:
        m = measurements[0]
        declared_text = str(m.sensitivity)
        declared = _declared_norm(m)
        change = max(change_norm(values, l2=not pure) for _, shapes in family.shapes for values in shapes)
        note = reach_note(t.table, m.level.config_key, bound, pure, declared, change, settings.tau(t.table))
    common = dict(table=t.table, level=family.name, sensitivity=t.sensitivity,
                  privacy_defn=measurements[0].privacy_defn.value, budget_scale=t.scale, runs=audit.runs,
                  seconds=audit.seconds, cpu_seconds=audit.cpu_seconds, canaries_per_run=len(family.members),
                  negatives=tally.negatives, positives=tally.positives,
                  delta=0.0 if pure else settings.delta, alpha=alpha, lead=family.name == t.lead,
                  declared_sensitivity=declared_text, canary_change=change, reach_note=note)
    if pure:
        b = pure_dp_bounds(tally.hits_out, tally.negatives, tally.hits_in, tally.positives,
                           alpha_lower=alpha, alpha_upper=alpha)
        eps_decl = sum(float(m.budget) for m in measurements)
        reach = family.reach_epsilon
        verdict = (VIOLATION if b.epsilon_lb > eps_decl else EXCESS if b.epsilon_lb > reach
                   else WEAK if b.epsilon_ub < reach else PASS_VERDICT)
        conclusive = not (b.epsilon_lb <= 0 and b.epsilon_ub >= eps_decl)
        if verdict == PASS_VERDICT and not conclusive:
            verdict = INCONCLUSIVE_ROW
        return Row(**common, false_positives=tally.hits_out, false_negatives=tally.hits_in, mu_lb=None, mu_ub=None,
                   mu_hat=None, mu_reach=None, mu_declared=None, excess_threshold=reach, weak_threshold=reach,
                   epsilon_hat=b.epsilon_lb, epsilon_ub=b.epsilon_ub, epsilon_declared=eps_decl,
                   epsilon_reach=reach, verdict=verdict, ceiling=reach / eps_decl, conclusive=conclusive,
                   runs_to_separate=None if conclusive else _runs_to_separate(family, measurements, alpha, pure))
    b = gdp_bounds(tally.false_positives, tally.negatives, tally.false_negatives, tally.positives,
                   alpha_lower=alpha, alpha_upper=alpha)
    mu_decl = math.sqrt(sum(2 * float(m.budget) for m in measurements))
    mu_reach = pooled_mu(family.mus)
    level_shapes = [(sigma_of[key], values) for key, shapes in family.shapes for values in shapes]
    if single and len(level_shapes) == 1:
        # One level, one kind of change: the test's exact rates under the discrete Gaussian.
        exact, _ = exact_threshold_mu(*level_shapes[0])
        excess = weak = exact
    else:
        kappa = lattice_allowance([s for s, _ in level_shapes], [v for _, v in level_shapes])
        excess, weak = mu_reach * (1 + kappa), mu_reach * (1 - kappa)
    verdict = (VIOLATION if b.mu_lb > mu_decl else EXCESS if b.mu_lb > excess
               else WEAK if b.mu_ub < weak else PASS_VERDICT)
    conclusive = not (b.mu_lb <= 0 and b.mu_ub >= mu_decl)
    if verdict == PASS_VERDICT and not conclusive:
        verdict = INCONCLUSIVE_ROW
    return Row(**common, false_positives=b.false_positives, false_negatives=b.false_negatives, mu_lb=b.mu_lb,
               mu_ub=b.mu_ub, mu_hat=b.mu_hat, mu_reach=mu_reach, mu_declared=mu_decl, excess_threshold=excess,
               weak_threshold=weak, epsilon_hat=epsilon_gdp(max(b.mu_lb, 0.0), settings.delta),
               epsilon_ub=epsilon_gdp(b.mu_ub, settings.delta) if math.isfinite(b.mu_ub) else math.inf,
               epsilon_declared=epsilon_gdp(mu_decl, settings.delta),
               epsilon_reach=epsilon_gdp(mu_reach, settings.delta), verdict=verdict, ceiling=mu_reach / mu_decl,
               conclusive=conclusive,
               runs_to_separate=None if conclusive else _runs_to_separate(family, measurements, alpha, pure))


def white_box_checks(settings: AuditSettings, audits: Sequence[TableAudit], mechanism: ReleaseMechanism
                     ) -> list[Check]:
    """The checks made from inside: keys, sampler, noise scales, declared sensitivities."""
    checks = []
    commitments = [c for a in audits for c in a.commitments]
    repeats = len(commitments) - len(set(commitments))
    if not commitments:
        checks.append(Check("truncation key fresh", "white-box", "*", "*", INCONCLUSIVE, "no run"))
    else:
        checks.append(Check("truncation key fresh", "white-box", "*", "*", FAIL if repeats else PASS,
                            f"{len(set(commitments))} distinct key commitments in {len(commitments)} runs"
                            + (f": {repeats} run(s) reused a key" if repeats else "")))
    version = opendp_version()
    integral = all(r.integral for a in audits for r in a.residuals)
    fixed = version_at_least(version, OPENDP_FIXED)
    checks.append(Check(
        "OpenDP exact sampler", "white-box", "*", "*", PASS if fixed and integral else FAIL,
        f"opendp {version} ({'at or after' if fixed else 'BEFORE'} 0.14.2, the discrete-sampler fix); "
        + ("every released count an integer" if integral else "a released count is not an integer")))

    for bound in settings.calibrations:
        mine = [a for a in audits if a.plan.sensitivity == bound.value]
        bad = []
        seen = 0
        for table in MEASURED_TABLES:
            for level_config, label in ((settings.calibrated_config(bound), "production"),) + tuple(
                    (settings.scaled_config(a.plan.table, bound), f"x{a.plan.scale:g}") for a in mine
                    if a.plan.table == table and a.plan.scale != 1):
                for m in mechanism.plan(level_config, table):
                    if m.is_noiseless:
                        bad.append(f"{m.key} ({label}): no noise")
                        continue
                    budget = Fraction(m.budget)
                    want = (math.sqrt(float(_delta_squared(m) / (2 * budget)))
                            if m.privacy_defn is PrivacyDefinition.ZCDP else math.sqrt(float(_delta_squared(m))) / float(budget))
                    got = mechanism.noise_scale(m)
                    seen += 1
                    if not abs(got - want) <= 1e-9 * want:
                        bad.append(f"{m.key} ({label}): scale {got:.6g}, Delta/{'sqrt(2 rho)' if m.privacy_defn is PrivacyDefinition.ZCDP else 'epsilon'} = {want:.6g}")
        what = ("sigma = Delta / sqrt(2 rho)" if settings.config.privacy_defn is PrivacyDefinition.ZCDP
                else "s = Delta / epsilon")
        checks.append(Check("noise scale", "white-box", "*", "*", FAIL if bad else PASS,
                            f"{bound.value} sensitivities: {what} at {seen - len(bad)} of {seen} levels"
                            + (f"; wrong: {'; '.join(bad[:4])}" if bad else ""), sensitivity=bound.value))

        short = []
        for a in mine:
            for m in a.plan.measurements:
                norm = a.canary_norms.get(m.level.config_key, 0.0)
                delta = _declared_norm(m)
                if norm > delta * (1 + 1e-12):
                    short.append(f"{m.key}: Delta {delta:.4g} < a neighbour's change {norm:.4g}")
        checks.append(Check("sensitivity covers a neighbour", "white-box", "*", "*", FAIL if short else PASS,
                            f"{bound.value} sensitivities: every declared Delta is at least the change of a real pair "
                            "of neighbours (the canaries)" if not short else "; ".join(short[:4]),
                            sensitivity=bound.value))
    return checks


def conclude(plan: AuditPlan, audits: Sequence[TableAudit], mechanism: ReleaseMechanism, *,
             seconds: float, cpu_seconds: float, started: str) -> AuditResult:
    settings = plan.settings
    rows, checks, tallies = [], [], {}
    not_audited, canaries = [], {}
    for audit in audits:
        t = audit.plan
        for tally in audit.tallies:
            rows.append(_row(settings, plan, audit, tally))
            tallies[(t.sensitivity, t.table, tally.family.name)] = tally
        for level, reason in t.not_audited:
            not_audited.append({"sensitivity": t.sensitivity, "table": t.table, "level": level, "reason": reason})
        for residual in audit.residuals:
            for check in residual.checks(plan.check_alpha_each):
                checks.append(replace(check, sensitivity=t.sensitivity))
        checks.append(Check("release tables", "release", t.table, "*",
                            FAIL if audit.release_problems else PASS,
                            "; ".join(sorted(set(audit.release_problems))[:3]) if audit.release_problems else
                            f"{audit.releases_checked} run(s): the released tables hold the measured vectors, and "
                            "every derived cell the sum of its measured cells", sensitivity=t.sensitivity))
        whole = next((f for f in t.families if f.name == WHOLE_TABLE), None)
        entry = canaries.setdefault(t.table, {
            "per_run": len(t.layout.canaries), "whole_table_per_run": len(whole.members) if whole else 0,
            "per_state": [{"canary": c.template.name,
                           "owns": sorted(c.owns - {k for k in c.owns if k.startswith("usa")})}
                          for c in t.layout.canaries if c.state == 0],
            "reach": {k: list(v) for k, v in t.layout.reach.items()},
            "runs": {},
        })
        entry["runs"][t.sensitivity] = audit.runs
    checks += white_box_checks(settings, audits, mechanism)
    independence = [c for c in checks if c.name == "noise independence"]
    failed = [f"{c.table} {c.level} ({c.sensitivity})" for c in independence if c.status == FAIL]
    checks.append(Check("noise independent across cells", "white-box", "*", "*", FAIL if failed else PASS,
                        (f"residuals correlated at {', '.join(failed[:6])}" if failed else
                         f"no correlation of neighbouring cells or consecutive runs at {len(independence)} levels "
                         "(the noise independence checks)")))
    return AuditResult(settings, rows, checks, not_audited, canaries, tallies, seconds, cpu_seconds, started,
                       opendp_version())


# --------------------------------------------------------------------------------------------
# The whole audit
# --------------------------------------------------------------------------------------------


def run_audit(settings: AuditSettings, mechanism: ReleaseMechanism | None = None,
              progress: "Progress | None" = None) -> AuditResult:
    """Plan, run and conclude the audit of ``settings`` on ``mechanism`` (the release path).

    Args:
        mechanism: The mechanism under audit; the production release path by default (the
            command line never passes another).
        progress: Shows the runs (with workers: as their chunks finish).

    The result's ``cpu_seconds`` is the whole process tree's: this process and every worker.
    """
    from datetime import datetime, timezone

    from phsafe.progress import NULL

    progress = progress or NULL
    mechanism = mechanism or ReleaseMechanism()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    wall, cpu, children = time.perf_counter(), time.process_time(), children_cpu()
    with progress.stage("plan the audit"):
        plan = plan_audit(settings, mechanism)
    salt = secrets.token_bytes(32)  # commitments comparable within this audit only; never stored
    total = sum(t.runs for t in plan.tables)
    chunks = sum(t.chunks for t in plan.tables)
    if settings.workers > 1 and chunks > 1:
        with progress.stage(f"audit {len(plan.tables)} tables in {min(settings.workers, chunks)} processes"), \
                progress.task("runs", total=total, unit="runs") as task:
            by_key = _run_in_pool(settings, plan.tables, mechanism, salt, settings.workers, task)
        audits = [by_key[t.key] for t in plan.tables]
    else:
        background = audit_background(settings)
        audits = []
        records: dict[str, TableRecords] = {}
        for t in plan.tables:
            started_table, cpu_table = time.perf_counter(), time.process_time()
            with progress.stage(f"audit {t.table} ({t.sensitivity} sensitivities)"), \
                    progress.task(f"{t.table} runs", total=t.runs, unit="runs") as task:
                if t.table not in records:
                    records[t.table] = table_records(settings, t, background)
                audit = _merged([run_chunk(settings, t, mechanism, salt, c, records[t.table], task)
                                 for c in range(t.chunks)])
            audit.seconds, audit.cpu_seconds = time.perf_counter() - started_table, time.process_time() - cpu_table
            audits.append(audit)
    return conclude(plan, audits, mechanism, seconds=time.perf_counter() - wall,
                    cpu_seconds=time.process_time() - cpu + children_cpu() - children, started=started)
