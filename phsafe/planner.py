"""Budget planning: from 90% margins of error to privacy-loss budgets, and back (``phsafe plan``).

For every measured table and population-group level the planner relates three numbers: the
sensitivity Delta (from :func:`phsafe.accounting.sensitivity`: ``2*tau + 2`` for person tables,
2 for unit tables), the budget (zCDP rho or pure-DP epsilon) and the 90% margin of error (MOE)
of the noise added to each released cell.

How the MOE is defined
----------------------
*zCDP (discrete Gaussian, sigma^2 = Delta^2 / (2 rho))*: MOE = 1.645 sigma, the convention of the
PHSafe paper's Table 10, of spec §6 and of :attr:`phsafe.accounting.PlannedMeasurement.moe90`.
Solving for rho gives ``rho = 1.645^2 Delta^2 / (2 MOE^2)``, exactly (1.645 = 329/200, so rho
is a rational number). Table 10 is this rho rounded half-up to 6 decimals. The planner also
reports the *exact discrete* 90% half-width of the discrete Gaussian (below), for information.

*Pure DP (two-sided geometric, P(k) proportional to exp(-epsilon |k| / Delta))*: the noise is
integer-valued, so "half the width of the 90% interval" (paper, Definition 10) is made precise as

    MOE = the smallest integer m >= 0 with P(|X| <= m) >= 0.9,

computed exactly from the closed form of the geometric tail (:func:`geometric_halfwidth`); the
budget for a target MOE T is the smallest epsilon whose MOE is at most floor(T)
(:func:`epsilon_for_halfwidth`). :mod:`phsafe.accounting` reports ``1.645 * sd`` for pure-DP
measurements instead (``moe90``); the planner shows that figure alongside so the two reconcile.

Budgets written to ``config.json`` are rounded *up* (never down) to ``digits`` significant
digits, so every MOE target is met; the exact rho is kept in the report.

Totals are sums over levels (sequential composition, exact). Bounded-neighbour totals are twice
the unbounded ones: for zCDP by the PHSafe paper §5.3 (Theorems 3 and 4: Algorithms 1 and 2
satisfy bounded 2 rho-zCDP, better than the generic 4 rho); for pure DP because an arbitrary
change of one record is a removal followed by an addition (group privacy of size 2). The
(epsilon, delta) figures of a zCDP total come from :mod:`phsafe.audit.report` (analytic bound and
the Renyi bound minimised over alpha).
"""

from __future__ import annotations

import csv
import enum
import io
import json
import math
from dataclasses import dataclass, replace
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from phsafe.accounting import plan_run, sensitivity
from phsafe.config import INFINITE, PHSafeConfig, PrivacyDefinition, load_config, parse_config
from phsafe.errors import ConfigError, PlanningError
from phsafe.iterations import GeographyLevel, IterationLevel, PopulationGroupLevel
from phsafe.schema import PUERTO_RICO, STATE_CODES
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TABLES, TAU_TABLES

Z90 = Fraction(329, 200)
"""1.645, the two-sided 90% normal quantile as used by Table 10 and spec §6 (exact)."""

DEFAULT_DIGITS = 6
DEFAULT_DELTA = 1e-10

CONFIG_JSON = "config.json"
PLAN_JSON = "plan.json"
REPORT_MD = "plan_report.md"
REPORT_HTML = "plan_report.html"
MOE_RHO_PNG = "moe_vs_rho.png"
MOE_EPS_PNG = "moe_vs_epsilon.png"
SPLIT_PNG = "budget_split.png"

_MAX_TERMS = 5_000_000


# --------------------------------------------------------------------------------------------
# Exact arithmetic helpers
# --------------------------------------------------------------------------------------------


def _decimal_exponent(x: Fraction) -> int:
    """floor(log10 x) for x > 0, exactly."""
    e = len(str(x.numerator)) - len(str(x.denominator))
    while Fraction(10) ** e > x:
        e -= 1
    while Fraction(10) ** (e + 1) <= x:
        e += 1
    return e


def round_up(x: Fraction, digits: int) -> Decimal:
    """The smallest decimal with at most ``digits`` significant digits that is >= ``x``.

    Args:
        x: A non-negative rational.
        digits: Significant digits (>= 1).
    """
    if digits < 1:
        raise ValueError("digits must be at least 1")
    if x < 0:
        raise ValueError("cannot round a negative budget")
    if x == 0:
        return Decimal(0)
    exp = _decimal_exponent(x) - digits + 1
    scaled = x / Fraction(10) ** exp
    n = -((-scaled.numerator) // scaled.denominator)  # ceil
    return Decimal(n).scaleb(exp)


def _as_fraction(x: Fraction | Decimal | int) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(x)


def _decimal_text(x: Decimal) -> str:
    """Plain decimal notation (no exponent), e.g. ``0.0000216483``."""
    text = format(x, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def fraction_text(x: Fraction, significant: int = 10) -> str:
    """A rational as decimal text with ``significant`` digits (exact if it terminates sooner)."""
    if x == 0:
        return "0"
    with localcontext() as ctx:
        ctx.prec = significant
        d = Decimal(x.numerator) / Decimal(x.denominator)
    return _decimal_text(d)


# --------------------------------------------------------------------------------------------
# zCDP: discrete Gaussian
# --------------------------------------------------------------------------------------------


def rho_for_moe(moe: Fraction | Decimal | int, delta: int) -> Fraction:
    """rho = 1.645^2 Delta^2 / (2 MOE^2), exactly.

    Derivation: the discrete Gaussian of Algorithm 5 has sigma^2 = Delta^2 / (2 rho) and the
    Table 10 convention is MOE = 1.645 sigma; squaring, MOE^2 = 1.645^2 Delta^2 / (2 rho).
    """
    moe = _as_fraction(moe)
    if moe <= 0:
        raise ValueError("an MOE target must be positive")
    return Z90**2 * delta**2 / (2 * moe**2)


def gaussian_sigma2(rho: Fraction | Decimal, delta: int) -> Fraction:
    """sigma^2 = Delta^2 / (2 rho), exactly."""
    return Fraction(delta**2) / (2 * _as_fraction(rho))


def gaussian_moe(rho: Fraction | Decimal, delta: int) -> float:
    """MOE = 1.645 sigma of the discrete Gaussian with budget ``rho`` and sensitivity ``delta``."""
    return 1.645 * math.sqrt(float(gaussian_sigma2(rho, delta)))


def gaussian_moe_met(rho: Fraction | Decimal, delta: int, target: Fraction | Decimal | int) -> bool:
    """Exactly: is 1.645 sigma <= target, i.e. 1.645^2 Delta^2 / (2 rho) <= target^2?"""
    return Z90**2 * gaussian_sigma2(rho, delta) <= _as_fraction(target) ** 2


def discrete_gaussian_halfwidth(sigma2: Fraction | float) -> int | None:
    """The smallest integer m with P(|X| <= m) >= 0.9 for X ~ N_Z(sigma^2) (paper, eq. 5).

    The normalising constant and the partial sums are computed by summing the pmf in float64
    over |x| <= 15 sigma + 2 (the neglected tail is below e^-112 of the mass); the decision
    ``>= 0.9`` is therefore exact unless P(|X| <= m) lies within about 1e-12 of 0.9. Returns
    ``None`` when sigma is too large to sum (more than 5 million terms).
    """
    s2 = float(sigma2)
    if s2 <= 0:
        return 0
    k = int(math.ceil(15.0 * math.sqrt(s2))) + 2
    if k > _MAX_TERMS:
        return None
    import numpy as np

    y = np.arange(k + 1, dtype=np.float64)
    w = np.exp(-(y * y) / (2.0 * s2))
    z = w[0] + 2.0 * w[1:].sum()
    cover = (w[0] + 2.0 * np.concatenate(([0.0], np.cumsum(w[1:])))) / z
    return int(np.argmax(cover >= 0.9))


# --------------------------------------------------------------------------------------------
# Pure DP: two-sided geometric
# --------------------------------------------------------------------------------------------


def _geometric_covers(t: Fraction, m: int) -> bool:
    """Exactly: P(|X| <= m) >= 0.9 for P(X = k) proportional to q^|k|, q = e^-t, rational t > 0.

    Closed form: P(X = k) = (1-q)/(1+q) q^|k|, so P(X >= m+1) = q^(m+1)/(1+q) and

        P(|X| <= m) >= 9/10  <=>  2 q^(m+1) / (1+q) <= 1/10  <=>  20 q^(m+1) <= 1 + q
                             <=>  D := ln(1 + e^-t) - ln 20 + (m+1) t >= 0.

    D is evaluated with :mod:`decimal` at precision P: every operation is correctly rounded, so
    the accumulated error is below 10^(3-P) (10 + (m+2) t), and the sign of D is decided once
    |D| exceeds that bound; otherwise P is doubled. D = 0 is impossible: it would make
    q = e^-t, transcendental for rational t != 0 (Lindemann-Weierstrass), a root of the integer
    polynomial 20 X^(m+1) - X - 1. So the loop ends.
    """
    if t <= 0:
        raise ValueError("epsilon must be positive")
    prec = 40
    while prec <= 20_000:
        with localcontext() as ctx:
            ctx.prec = prec
            td = Decimal(t.numerator) / Decimal(t.denominator)
            d = (1 + (-td).exp()).ln() - Decimal(20).ln() + (m + 1) * td
            bound = Decimal(10) ** (3 - prec) * (10 + (m + 2) * td)
        if abs(d) > bound:
            return d > 0
        prec *= 2
    raise ArithmeticError("could not decide the geometric tail inequality")  # pragma: no cover


def geometric_halfwidth(epsilon: Fraction | Decimal, delta: int) -> int:
    """Exact 90% MOE of the two-sided geometric with scale Delta/epsilon (see :func:`_geometric_covers`).

    A float estimate m+1 = ceil((ln 20 - ln(1+q)) / t) is corrected by exact decisions, so the
    result is the smallest integer m with P(|X| <= m) >= 0.9.
    """
    eps = _as_fraction(epsilon)
    if eps <= 0:
        raise ValueError("epsilon must be positive")
    t = eps / delta
    tf = float(t)
    est = math.ceil((math.log(20.0) - math.log1p(math.exp(-tf))) / tf) - 1 if tf > 0 else 0
    m = max(0, min(est, 10**12))
    while m > 0 and _geometric_covers(t, m - 1):
        m -= 1
    while not _geometric_covers(t, m):
        m += 1
    return m


def geometric_sd_moe(epsilon: Fraction | Decimal, delta: int) -> float:
    """1.645 * sd of the two-sided geometric: what :mod:`phsafe.accounting` reports as ``moe90``."""
    from phsafe.accounting import geometric_variance

    return 1.645 * math.sqrt(geometric_variance(Fraction(delta) / _as_fraction(epsilon)))


def epsilon_for_halfwidth(m: int, delta: int, digits: int = DEFAULT_DIGITS) -> Decimal:
    """The smallest epsilon with ``digits`` significant digits whose exact 90% MOE is <= ``m``.

    With t = epsilon / Delta, D(t) = ln(1 + e^-t) - ln 20 + (m+1) t is strictly increasing
    (D'(t) = (m+1) - e^-t/(1+e^-t) > m >= 0), negative at t = 0 (ln 2 - ln 20) and positive at
    t = ln 20 / (m+1); so the MOE is <= m exactly for t >= t*, the unique root. t* is found in
    floating point, rounded up to ``digits`` significant digits, then moved by one unit of the
    last digit until the exact test of :func:`_geometric_covers` holds for it and fails for the
    next smaller candidate.
    """
    if m < 0:
        raise ValueError("the MOE must be non-negative")
    lo, hi = 0.0, math.log(20.0) / (m + 1)
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.log1p(math.exp(-mid)) - math.log(20.0) + (m + 1) * mid >= 0:
            hi = mid
        else:
            lo = mid
    eps = round_up(Fraction(hi) * delta, digits)

    def ok(e: Decimal) -> bool:
        return e > 0 and _geometric_covers(Fraction(e) / delta, m)

    def ulp(e: Decimal) -> Decimal:
        return Decimal(1).scaleb(_decimal_exponent(Fraction(e)) - digits + 1)

    while not ok(eps):
        eps = round_up(Fraction(eps + ulp(eps)), digits)
    while True:
        lower = eps - ulp(eps)
        if lower > 0 and _decimal_exponent(Fraction(lower)) < _decimal_exponent(Fraction(eps)):
            lower = eps - ulp(lower)  # crossing a power of ten: the finer step below it
        if lower <= 0 or not ok(lower):
            return eps
        eps = lower


# --------------------------------------------------------------------------------------------
# Targets file
# --------------------------------------------------------------------------------------------

_GEOGRAPHY_ALIASES = {"usa": GeographyLevel.USA, "us": GeographyLevel.USA, "nation": GeographyLevel.USA,
                      "state": GeographyLevel.STATE}
_ITERATION_ALIASES = {"*": IterationLevel.TOTAL, "unattributed": IterationLevel.TOTAL,
                      "total": IterationLevel.TOTAL, "a-g": IterationLevel.RACE_ALONE,
                      "h,i": IterationLevel.HISPANIC, "h-i": IterationLevel.HISPANIC}
_COLUMNS = ("table", "geography", "iteration", "moe")

Targets = dict[tuple[str, PopulationGroupLevel], Fraction]


def _parse_target(where: str, row: Mapping[str, Any], targets: Targets) -> None:
    missing = [c for c in _COLUMNS if c not in row or row[c] in (None, "")]
    if missing:
        raise PlanningError(f"{where}: missing {', '.join(missing)}")
    table = str(row["table"]).strip()
    if table not in TABLE_LEVELS:
        raise PlanningError(f"{where}: {table!r} is not a measured table ({', '.join(MEASURED_TABLES)})")
    geo = _GEOGRAPHY_ALIASES.get(str(row["geography"]).strip().lower())
    if geo is None:
        raise PlanningError(f"{where}: geography must be USA (or Nation) or STATE")
    it = _ITERATION_ALIASES.get(str(row["iteration"]).strip().lower())
    if it is None:
        raise PlanningError(f"{where}: iteration must be *, A-G or H,I (also: Unattributed, H-I)")
    level = PopulationGroupLevel(geo, it)
    if level not in TABLE_LEVELS[table]:
        raise PlanningError(f"{where}: {table} has no level {level.config_key}")
    raw = row["moe"]
    try:
        if isinstance(raw, bool):
            raise ValueError
        moe = Fraction(Decimal(str(raw).strip()) if not isinstance(raw, (int, Decimal)) else raw)
    except (ArithmeticError, ValueError):
        raise PlanningError(f"{where}: moe must be a positive decimal number") from None
    if moe <= 0:
        raise PlanningError(f"{where}: moe must be a positive decimal number")
    if (table, level) in targets:
        raise PlanningError(f"{where}: {table} {level.config_key} is listed twice")
    targets[(table, level)] = moe


def read_targets(path: str | Path) -> tuple[Targets, dict[str, int]]:
    """Read MOE targets from a CSV or JSON file.

    CSV: a header row with the columns ``table,geography,iteration,moe`` (any order, other
    columns ignored); lines starting with ``#`` are comments. JSON: a list of objects with the
    same keys, or ``{"targets": [...], "tau": {"PH1_num": 10, ...}}``. ``geography`` is ``USA``
    (or ``Nation``) or ``STATE``; ``iteration`` is ``*`` (or ``Unattributed``), ``A-G`` or
    ``H,I`` (or ``H-I``, which needs no quoting in CSV); ``moe`` is a positive decimal. Levels
    not listed are not measured (budget 0).

    Returns:
        The targets by (table, level), and the tau given in a JSON file (else empty).

    Raises:
        PlanningError: The file is missing or malformed; the message names the row and rule.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanningError(f"cannot read targets file {path}: {exc}") from None
    targets: Targets = {}
    tau: dict[str, int] = {}
    if path.suffix.lower() == ".json":
        try:
            raw = json.loads(text, parse_float=Decimal)
        except json.JSONDecodeError as exc:
            raise PlanningError(f"{path.name} is not valid JSON (line {exc.lineno})") from None
        rows = raw
        if isinstance(raw, dict):
            rows = raw.get("targets")
            tau_raw = raw.get("tau", {})
            if not isinstance(tau_raw, dict):
                raise PlanningError(f"{path.name}: tau must be an object")
            tau = {str(k): v for k, v in tau_raw.items()}
        if not isinstance(rows, list):
            raise PlanningError(f"{path.name}: expected a list of targets (or an object with 'targets')")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise PlanningError(f"{path.name}: target {i} must be an object")
            _parse_target(f"{path.name}: target {i}", row, targets)
    else:
        lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
        reader = csv.DictReader(io.StringIO("\n".join(lines)))
        header = [h.strip().lower() for h in (reader.fieldnames or [])]
        if not set(_COLUMNS) <= set(header):
            raise PlanningError(f"{path.name}: the header must name the columns {','.join(_COLUMNS)}")
        reader.fieldnames = header
        for i, row in enumerate(reader, start=2):
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue
            _parse_target(f"{path.name}: data row {i - 1}", row, targets)
    if not targets:
        raise PlanningError(f"{path.name}: no MOE targets")
    return targets, tau


def parse_tau(specs: Iterable[str], base: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Truncation thresholds from ``--tau`` values.

    Each spec is ``TABLE=N`` (e.g. ``PH3=6``), several of them comma-separated, or a bare ``N``
    that sets every person table; later specs override earlier ones and ``base`` (the tau of a
    JSON targets file).
    """
    out: dict[str, int] = {}
    for table, value in (base or {}).items():
        out[table] = _tau_value(table, value)
    for spec in specs:
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            if "=" in part:
                table, value = (s.strip() for s in part.split("=", 1))
                out[table] = _tau_value(table, value)
            else:
                n = _tau_value("--tau", part)
                out.update({t: n for t in TAU_TABLES})
    return out


def _tau_value(table: str, value: Any) -> int:
    if table != "--tau" and table not in TAU_TABLES:
        raise PlanningError(f"tau: {table!r} is not a person table ({', '.join(TAU_TABLES)})")
    try:
        if isinstance(value, bool):
            raise ValueError
        n = int(str(value))
    except ValueError:
        raise PlanningError(f"tau for {table}: must be an integer >= 1") from None
    if n < 1:
        raise PlanningError(f"tau for {table}: must be an integer >= 1")
    return n


def parse_state_filter(value: str) -> list[str]:
    """``us`` (the 50 states and DC), ``pr`` (Puerto Rico) or comma-separated FIPS codes."""
    v = value.strip().lower()
    if v == "us":
        return sorted(STATE_CODES)
    if v == "pr":
        return [PUERTO_RICO]
    return [s.strip() for s in value.split(",") if s.strip()]


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


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
        sensitivity: Delta, from :func:`phsafe.accounting.sensitivity`.
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
    """

    table: str
    level: PopulationGroupLevel
    tau: int | None
    sensitivity: int
    n_cells: int
    moe_target: Fraction | None
    rho_exact: Fraction | None
    rho: Decimal | None
    epsilon: Decimal | None
    gaussian_moe: float | None
    gaussian_halfwidth: int | None
    geometric_halfwidth: int | None
    geometric_sd_moe: float | None

    @property
    def key(self) -> str:
        return f"{self.table}/{self.level.config_key}"


@dataclass(frozen=True)
class Plan:
    """A complete plan: the config it describes (or writes) and every measured level."""

    mode: PlanMode
    privacy_defn: PrivacyDefinition
    config: PHSafeConfig
    config_json: dict[str, Any] | None
    levels: tuple[LevelPlan, ...]
    digits: int
    delta: float
    source: str
    notes: tuple[str, ...] = ()

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
    delta = sensitivity(table, config)
    spec = TABLES[table]
    tau = config.tau[spec.tau_key] if spec.tau_key else None
    rho_exact: Fraction | None = None
    if moe_target is not None:
        rho_exact = rho_for_moe(moe_target, delta)
        rho = round_up(rho_exact, digits)
        epsilon = epsilon_for_halfwidth(math.floor(moe_target), delta, digits)
    elif rho is not None and rho != INFINITE:
        # From a zCDP budget: the pure-DP epsilon whose exact MOE is at most floor(1.645 sigma).
        epsilon = epsilon_for_halfwidth(math.floor(gaussian_moe(rho, delta)), delta, digits)
    elif epsilon is not None and epsilon != INFINITE:
        # From a pure-DP budget: the rho with 1.645 sigma equal to the exact geometric MOE.
        m = geometric_halfwidth(epsilon, delta)
        if m > 0:
            rho_exact = rho_for_moe(m, delta)
            rho = round_up(rho_exact, digits)
    finite_rho = rho is not None and rho != INFINITE
    finite_eps = epsilon is not None and epsilon != INFINITE
    return LevelPlan(
        table=table,
        level=level,
        tau=tau,
        sensitivity=delta,
        n_cells=n_cells,
        moe_target=moe_target,
        rho_exact=rho_exact,
        rho=rho,
        epsilon=epsilon,
        gaussian_moe=gaussian_moe(rho, delta) if finite_rho else (0.0 if rho == INFINITE else None),
        gaussian_halfwidth=(discrete_gaussian_halfwidth(gaussian_sigma2(rho, delta)) if finite_rho
                            else (0 if rho == INFINITE else None)),
        geometric_halfwidth=(geometric_halfwidth(epsilon, delta) if finite_eps
                             else (0 if epsilon == INFINITE else None)),
        geometric_sd_moe=(geometric_sd_moe(epsilon, delta) if finite_eps
                          else (0.0 if epsilon == INFINITE else None)),
    )


def _skeleton(privacy_defn: PrivacyDefinition, tau: Mapping[str, int], states: Sequence[str]) -> dict[str, Any]:
    """A config mapping with the production key set and every budget 0."""
    return {
        "privacy_budget": {t: {lv.config_key: Decimal(0) for lv in TABLE_LEVELS[t]} for t in MEASURED_TABLES},
        "tau": {t: tau[t] for t in TAU_TABLES},
        "state_filter": list(states),
        "reader": "csv",
        "privacy_defn": privacy_defn.value,
    }


def plan_from_targets(
    targets: Mapping[tuple[str, PopulationGroupLevel], Fraction],
    tau: Mapping[str, int],
    *,
    privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP,
    state_filter: Sequence[str] | None = None,
    digits: int = DEFAULT_DIGITS,
    delta: float = DEFAULT_DELTA,
    source: str = "targets",
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
        base = parse_config(_skeleton(privacy_defn, tau, states))
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
    raw = _skeleton(privacy_defn, tau, states)
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
    return Plan(PlanMode.TARGETS, privacy_defn, config, raw, tuple(levels), digits, delta, source, tuple(notes))


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


def plan(
    targets: str | Path | None = None,
    *,
    config: PHSafeConfig | str | Path | None = None,
    tau: int | Mapping[str, int] | Sequence[str] | None = None,
    privacy_defn: PrivacyDefinition | str = PrivacyDefinition.ZCDP,
    state_filter: str | Sequence[str] = "us",
    digits: int = DEFAULT_DIGITS,
    delta: float = DEFAULT_DELTA,
    out: str | Path | None = None,
    overwrite: bool = False,
) -> Plan:
    """Plan budgets for 90% MOE targets, or the MOEs of a config's budgets (``phsafe plan``).

    Give exactly one of ``targets`` (a targets file, see ``docs/planning_and_risk.md``) and
    ``config``. The paper's Table 10::

        p = plan("docs/table10_moe_targets.csv", tau=["10", "PH3=6,PH6=6"])
        p.total("rho")                     # Fraction(6286441129, 5000000000): 1.2572882258

    Args:
        targets: MOE targets file (CSV or JSON).
        config: Instead of targets: a config (or its path) whose MOEs to report.
        tau: Truncation thresholds (targets only): an int for every person table, a mapping
            table -> int, or ``--tau`` specs (``"10"``, ``"PH3=6,PH6=6"``; later ones win).
        privacy_defn: Which budgets go into the planned config (both are reported).
        state_filter: ``"us"``, ``"pr"``, comma-separated FIPS codes, or a list of them.
        digits: Significant digits of the budgets (rounded up).
        delta: delta of the (epsilon, delta) conversions.
        out: Also write the plan there (:func:`write_plan`): config.json, plan.json, report, plots.
        overwrite: Replace the files of an existing ``out`` folder.

    Raises:
        PlanningError: Neither or both of targets and config, or a bad target or tau.
    """
    if (targets is None) == (config is None):
        raise PlanningError("give exactly one of targets and config")
    if config is not None:
        result = plan_from_config(config, digits=digits, delta=delta)
    else:
        table_targets, file_tau = read_targets(targets)  # type: ignore[arg-type]
        if isinstance(tau, int):
            specs: list[str] = [str(tau)]
        elif isinstance(tau, Mapping):
            specs = [f"{t}={n}" for t, n in tau.items()]
        else:
            specs = list(tau or [])
        states = parse_state_filter(state_filter) if isinstance(state_filter, str) else list(state_filter)
        result = plan_from_targets(table_targets, parse_tau(specs, base=file_tau),
                                   privacy_defn=PrivacyDefinition(privacy_defn), state_filter=states,
                                   digits=digits, delta=delta, source=str(targets))
    if out is not None:
        write_plan(result, out, overwrite=overwrite)
    return result


# --------------------------------------------------------------------------------------------
# Conversions of totals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TotalsRow:
    """A total in one definition, unbounded and bounded, with (epsilon, delta) for zCDP."""

    measure: str  # "rho" or "epsilon"
    unbounded: Fraction | Decimal | None
    bounded: Fraction | Decimal | None
    eps_analytic: tuple[float, float] | None = None  # (unbounded, bounded)
    eps_renyi: tuple[float, float] | None = None


def totals_row(measure: str, total: Fraction | Decimal | None, delta: float) -> TotalsRow:
    """Bounded = 2 x unbounded; for rho also epsilon at ``delta`` (reusing the audit report's bounds)."""
    from phsafe.audit.report import epsilon_analytic, epsilon_renyi

    if total is None:
        return TotalsRow(measure, None, None)
    bounded = total if total == INFINITE else 2 * total
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


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def config_text(raw: Mapping[str, Any]) -> str:
    """``config.json`` text with every budget written as its exact decimal (never a float)."""
    marks: dict[str, str] = {}

    def mark(value: Decimal) -> str:
        token = f"@@budget{len(marks)}@@"
        text = _decimal_text(value)
        marks[f'"{token}"'] = text if "." in text else text + ".0"
        return token

    doc = dict(raw)
    doc["privacy_budget"] = {
        t: {k: mark(Decimal(v)) for k, v in levels.items()} for t, levels in raw["privacy_budget"].items()
    }
    text = json.dumps(doc, indent=4)
    for token, value in marks.items():
        text = text.replace(token, value)
    return text + "\n"


def amount_text(x: Fraction | Decimal | None, significant: int = 10) -> str:
    """An exact amount as text: terminating decimals exactly, others as ``≈`` ``significant`` digits."""
    if x is None:
        return "n/a"
    if isinstance(x, Decimal):
        return "Infinity" if x == INFINITE else _decimal_text(x)
    from phsafe.amounts import format_exact

    exact = format_exact(x)
    return exact if "/" not in exact else "≈ " + fraction_text(x, significant)


def _exact_text(x: Fraction) -> str:
    """Exact text of a rational: terminating decimal, or ``numerator/denominator``."""
    from phsafe.amounts import format_exact

    return format_exact(x)


def _num(x: float | None, fmt: str = "{:.4f}") -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "Infinity"
    return fmt.format(x)


def _int(x: int | None) -> str:
    return "n/a" if x is None else str(x)


def plan_json(plan: Plan) -> dict[str, Any]:
    """Every number of the plan, budgets as exact strings."""
    def level(lp: LevelPlan) -> dict[str, Any]:
        return {
            "table": lp.table,
            "level": lp.level.config_key,
            "tau": lp.tau,
            "sensitivity": lp.sensitivity,
            "cells": lp.n_cells,
            "moe_target": None if lp.moe_target is None else amount_text(lp.moe_target),
            "rho_exact": None if lp.rho_exact is None else _exact_text(lp.rho_exact),
            "rho_exact_approx": None if lp.rho_exact is None else fraction_text(lp.rho_exact, 16),
            "rho": None if lp.rho is None else amount_text(lp.rho),
            "epsilon": None if lp.epsilon is None else amount_text(lp.epsilon),
            "gaussian_moe_1645_sigma": lp.gaussian_moe,
            "gaussian_exact_halfwidth": lp.gaussian_halfwidth,
            "geometric_exact_halfwidth": lp.geometric_halfwidth,
            "geometric_1645_sd": lp.geometric_sd_moe,
        }

    def totals(measure: str) -> dict[str, Any]:
        row = totals_row(measure, plan.total(measure), plan.delta)
        out: dict[str, Any] = {
            "per_table": {t: None if v is None else amount_text(v, 16) for t, v in plan.table_totals(measure).items()},
            "unbounded": None if row.unbounded is None else amount_text(row.unbounded, 16),
            "bounded": None if row.bounded is None else amount_text(row.bounded, 16),
        }
        if row.eps_analytic:
            out["epsilon_at_delta"] = {
                "delta": plan.delta,
                "analytic": {"unbounded": row.eps_analytic[0], "bounded": row.eps_analytic[1]},
                "renyi": {"unbounded": row.eps_renyi[0], "bounded": row.eps_renyi[1]} if row.eps_renyi else None,
            }
        return out

    return {
        "mode": plan.mode.value,
        "source": plan.source,
        "privacy_defn": plan.privacy_defn.value,
        "digits": plan.digits,
        "delta": plan.delta,
        "tau": dict(plan.config.tau),
        "state_filter": list(plan.config.state_filter),
        "levels": [level(lp) for lp in plan.levels],
        "totals": {"rho": totals("rho"), "epsilon": totals("epsilon")},
        "notes": list(plan.notes),
    }


def _moe_chart(plan: Plan, path: Path) -> Path:
    """MOE against rho (log-log) for each distinct Delta of the plan, with its levels marked."""
    from phsafe._plots import Series, line_chart

    by_delta: dict[int, list[LevelPlan]] = {}
    for lp in plan.levels:
        by_delta.setdefault(lp.sensitivity, []).append(lp)
    rhos = [float(lp.rho) for lp in plan.levels if lp.rho is not None and lp.rho != INFINITE]
    lo = min(rhos, default=1e-5) / 10
    hi = max(rhos, default=1.0) * 10
    grid = [lo * (hi / lo) ** (i / 120) for i in range(121)]
    series = []
    for d, lps in sorted(by_delta.items()):
        taus = sorted({lp.tau for lp in lps if lp.tau is not None})
        label = f"tau = {', '.join(map(str, taus))} (Delta = {d})" if taus else f"unit tables (Delta = {d})"
        series.append(Series(label, grid, [1.645 * d / math.sqrt(2 * r) for r in grid], "-"))
        pts = [(float(lp.rho), lp.gaussian_moe) for lp in lps
               if lp.rho is not None and lp.rho != INFINITE and lp.gaussian_moe]
        if pts:
            series.append(Series(f"planned levels, Delta = {d}", [p[0] for p in pts], [p[1] for p in pts], "o"))
    return line_chart(path, series, title="90% MOE (1.645 sigma) against rho, discrete Gaussian",
                      xlabel="rho (zCDP budget of a population-group level)", ylabel="90% MOE",
                      logx=True, logy=True)


def _moe_eps_chart(plan: Plan, path: Path) -> Path:
    """Exact geometric MOE against epsilon for each distinct Delta of the plan."""
    from phsafe._plots import Series, line_chart

    by_delta: dict[int, list[LevelPlan]] = {}
    for lp in plan.levels:
        by_delta.setdefault(lp.sensitivity, []).append(lp)
    eps = [float(lp.epsilon) for lp in plan.levels if lp.epsilon is not None and lp.epsilon != INFINITE]
    lo = min(eps, default=1e-3) / 5
    hi = max(eps, default=1.0) * 5
    grid = [lo * (hi / lo) ** (i / 80) for i in range(81)]
    series = []
    for d, lps in sorted(by_delta.items()):
        taus = sorted({lp.tau for lp in lps if lp.tau is not None})
        label = f"tau = {', '.join(map(str, taus))} (Delta = {d})" if taus else f"unit tables (Delta = {d})"
        ys = [max(geometric_halfwidth(Fraction(e), d), 0.5) for e in grid]  # 0 shown at 0.5 (log axis)
        series.append(Series(label, grid, ys, "-"))
        pts = [(float(lp.epsilon), max(lp.geometric_halfwidth, 0.5)) for lp in lps
               if lp.epsilon is not None and lp.epsilon != INFINITE and lp.geometric_halfwidth is not None]
        if pts:
            series.append(Series(f"planned levels, Delta = {d}", [p[0] for p in pts], [p[1] for p in pts], "o"))
    return line_chart(path, series, title="Exact 90% MOE against epsilon, two-sided geometric",
                      xlabel="epsilon (pure-DP budget of a population-group level)", ylabel="90% MOE",
                      logx=True, logy=True)


def _split_chart(plan: Plan, path: Path) -> Path:
    from phsafe._plots import stacked_barh

    tables = [t for t in MEASURED_TABLES if any(lp.table == t for lp in plan.levels)]
    levels = sorted({lp.level for lp in plan.levels}, key=lambda lv: (lv.geography.value != "USA", lv.iteration.value))
    budgets = {(lp.table, lp.level): plan.budget_of(lp) for lp in plan.levels}

    def val(t: str, lv: PopulationGroupLevel) -> float:
        b = budgets.get((t, lv))
        return 0.0 if b is None or b == INFINITE else float(b)

    segments = [(lv.config_key, [val(t, lv) for t in tables]) for lv in levels]
    measure = "rho" if plan.privacy_defn is PrivacyDefinition.ZCDP else "epsilon"
    total = plan.total(measure)
    return stacked_barh(path, tables, segments,
                        title=f"Budget split of the run (total {measure} = {amount_text(total, 7)})",
                        xlabel=f"{measure} (unbounded)")


def write_plan(plan: Plan, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """Write ``config.json`` (targets mode), ``plan.json``, the Markdown/HTML report and the PNGs.

    ``out_dir`` must be a new or empty folder unless ``overwrite`` (see
    :func:`phsafe._plots.report_folder`). The written config is read back with
    :func:`phsafe.config.load_config` and must plan the same budgets, or nothing is reported as
    written.
    """
    from phsafe._plots import report_folder

    out = report_folder(out_dir, overwrite=overwrite)
    paths: dict[str, Path] = {}
    if plan.config_json is not None:
        cfg_path = out / CONFIG_JSON
        cfg_path.write_text(config_text(plan.config_json), encoding="utf-8")
        reread = load_config(cfg_path)
        if reread.privacy_budget != plan.config.privacy_budget or reread.tau != plan.config.tau:
            raise PlanningError("the written config does not read back to the planned budgets")  # pragma: no cover
        paths["config"] = cfg_path
    paths["plan"] = out / PLAN_JSON
    paths["plan"].write_text(json.dumps(plan_json(plan), indent=2) + "\n", encoding="utf-8")
    if plan.levels:
        paths["moe_chart"] = _moe_chart(plan, out / MOE_RHO_PNG)
        if plan.privacy_defn is PrivacyDefinition.PUREDP:
            paths["moe_eps_chart"] = _moe_eps_chart(plan, out / MOE_EPS_PNG)
        paths["split_chart"] = _split_chart(plan, out / SPLIT_PNG)
    md, page = build_report(plan, {k: p.name for k, p in paths.items()}).write(out / REPORT_MD, out / REPORT_HTML)
    paths["report_md"], paths["report_html"] = md, page
    return paths


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def build_report(plan: Plan, files: Mapping[str, str]):  # type: ignore[no-untyped-def]
    """The plan as a :class:`phsafe._plots.Document`."""
    from phsafe._plots import Bullets, Document, Heading, Image, Para, Table

    zcdp = plan.privacy_defn is PrivacyDefinition.ZCDP
    measure = "rho" if zcdp else "epsilon"
    cfg = plan.config
    doc = Document("PHSafe budget plan")
    run = ("Puerto Rico" if cfg.is_puerto_rico else
           f"{len(cfg.state_filter)} states" + (" (the 50 states and DC)" if set(cfg.state_filter) == STATE_CODES else ""))
    doc.add(Table(("Field", "Value"), [
        ["Mode", "MOE targets -> budgets" if plan.mode is PlanMode.TARGETS else "config budgets -> MOEs"],
        ["Source", f"`{plan.source}`"],
        ["Privacy definition of the config", "zCDP (rho, discrete Gaussian)" if zcdp else "pure DP (epsilon, two-sided geometric)"],
        ["Run", run],
        ["tau", ", ".join(f"{t} {n}" for t, n in cfg.tau.items())],
        ["Budgets rounded up to", f"{plan.digits} significant digits"],
        ["delta for (epsilon, delta)", f"{plan.delta:g}"],
        ["Written config", f"`{files['config']}`" if "config" in files else "none (the input config is the plan)"],
    ]))
    if plan.notes:
        doc.add(Bullets(list(plan.notes)))

    doc.add(Heading(2, "How the margin of error is defined"), Bullets([
        "zCDP: MOE = 1.645 sigma with sigma^2 = Delta^2 / (2 rho), so rho = 1.645^2 Delta^2 / (2 MOE^2) "
        "(PHSafe paper Table 10, spec §6, `phsafe.accounting` `moe90`). Delta = 2 tau + 2 for person "
        "tables, 2 for unit tables.",
        "Both noise distributions are integer-valued. Their exact 90% MOE is the smallest integer m "
        "with P(|X| <= m) >= 0.9 (half the width of the narrowest symmetric integer interval holding "
        "the noise with probability at least 90%).",
        "Pure DP: the planned epsilon is the smallest one (at the stated digits) whose exact MOE, "
        "computed from the closed form P(|X| <= m) = 1 - 2 q^(m+1)/(1+q), q = exp(-epsilon/Delta), "
        "is at most the target (rounded down to an integer). `phsafe.accounting` (and `phsafe audit "
        "report`) show 1.645 sd for pure DP instead; that column is included for reconciliation.",
        "For the discrete Gaussian the exact MOE (summing its pmf) is shown for information; the "
        "budgets follow the 1.645 sigma convention.",
        "Budgets are rounded up, never down, so every MOE is at most its target. (The production "
        "config rounds Table 10 to the nearest 6th decimal, so some of its MOEs exceed their targets "
        "slightly, e.g. 500.04 for rho 0.002619 at Delta 22.)",
    ]))

    doc.add(Heading(2, "Population-group levels"))
    header = ["Table", "Level", "tau", "Delta", "Cells", "MOE target", "rho (exact)", "rho", "1.645 sigma",
              "exact MOE (DG)", "epsilon", "exact MOE (geom.)", "1.645 sd (geom.)", "target met"]
    rows = []
    for lp in plan.levels:
        met = ""
        if lp.moe_target is not None:
            ok = (gaussian_moe_met(lp.rho, lp.sensitivity, lp.moe_target) if zcdp and lp.rho is not None
                  else lp.geometric_halfwidth is not None and lp.geometric_halfwidth <= math.floor(lp.moe_target))
            met = "yes" if ok else "NO"
        rows.append([
            lp.table, f"`{lp.level.config_key}`", "-" if lp.tau is None else str(lp.tau), str(lp.sensitivity),
            str(lp.n_cells), "-" if lp.moe_target is None else amount_text(lp.moe_target),
            "-" if lp.rho_exact is None else amount_text(lp.rho_exact, 10),
            amount_text(lp.rho), _num(lp.gaussian_moe, "{:.3f}"), _int(lp.gaussian_halfwidth),
            amount_text(lp.epsilon), _int(lp.geometric_halfwidth), _num(lp.geometric_sd_moe, "{:.3f}"), met,
        ])
    if plan.mode is not PlanMode.TARGETS:
        header, rows = header[:-1], [r[:-1] for r in rows]
    doc.add(Table(header, rows))
    doc.add(Para(
        f"The config's budgets are the {measure} column. "
        + ("The epsilon column is the pure-DP budget that would give the same MOE. " if zcdp else
           "The rho column is the zCDP budget whose 1.645 sigma equals the exact geometric MOE. ")
        + "rho (exact) is the unrounded rho for the MOE target."
    ))

    doc.add(Heading(2, "Totals per table"))
    rho_t, eps_t = plan.table_totals("rho"), plan.table_totals("epsilon")
    doc.add(Table(
        ("Table", "rho unbounded", "rho bounded (2x)", "epsilon unbounded", "epsilon bounded (2x)"),
        [[t, amount_text(rho_t[t], 12), amount_text(None if rho_t[t] is None else (rho_t[t] if rho_t[t] == INFINITE else 2 * rho_t[t]), 12),
          amount_text(eps_t[t], 12), amount_text(None if eps_t[t] is None else (eps_t[t] if eps_t[t] == INFINITE else 2 * eps_t[t]), 12)]
         for t in rho_t],
    ))

    doc.add(Heading(2, "Totals of the run"))
    rows = []
    for m in ("rho", "epsilon"):
        row = totals_row(m, plan.total(m), plan.delta)
        own = " (this config)" if m == measure else " (equivalent, same MOEs)"
        if m == "rho":
            rows.append([f"zCDP rho{own}", amount_text(row.unbounded, 12), amount_text(row.bounded, 12),
                         "n/a" if not row.eps_analytic else f"{_num(row.eps_analytic[0])} / {_num(row.eps_analytic[1])}",
                         "n/a" if not row.eps_renyi else f"{_num(row.eps_renyi[0])} / {_num(row.eps_renyi[1])}"])
        else:
            rows.append([f"pure-DP epsilon{own}", amount_text(row.unbounded, 12), amount_text(row.bounded, 12),
                         "delta = 0", "delta = 0"])
    doc.add(Table(("Measure", "Unbounded", "Bounded", f"epsilon at delta={plan.delta:g}, analytic (unb. / bounded)",
                   f"epsilon at delta={plan.delta:g}, Renyi (unb. / bounded)"), rows))
    doc.add(Para(
        "Totals are exact sums over levels (sequential composition). Bounded = 2 x unbounded: for zCDP "
        "by the PHSafe paper §5.3 (Theorems 3-4, bounded 2 rho rather than the generic 4 rho); for pure "
        "DP because changing a record is removing one and adding one. (epsilon, delta): analytic "
        "epsilon = rho + 2 sqrt(rho ln(1/delta)), and the Renyi bound inf over alpha > 1 of "
        "rho alpha + (ln(1/delta) + (alpha-1) ln(1-1/alpha) - ln alpha)/(alpha-1) (SafeTab paper eq. 7; "
        "Kazan-Reiter Theorem 3), both from `phsafe.audit.report`."
    ))
    if "moe_chart" in files or "split_chart" in files:
        doc.add(Heading(2, "Plots"))
        if "moe_chart" in files:
            doc.add(Image(files["moe_chart"], "90% MOE against rho for each tau"))
        if "moe_eps_chart" in files:
            doc.add(Image(files["moe_eps_chart"], "exact 90% MOE against epsilon for each tau"))
        if "split_chart" in files:
            doc.add(Image(files["split_chart"], "budget split of the run"))
    return doc
