"""Bayesian disclosure risk of one released cell (``phsafe risk``).

This implements the analysis "without hierarchical information" of Kazan and Reiter, *Assessing
Statistical Disclosure Risk for Differentially Private, Hierarchical Count Data* (§3.1, §4.2;
``shared/reference/kazan_reiter_disclosure_risk.txt``) for the noise of every measured
population-group level of a PHSafe config.

Setting (paper §3.1). An intruder knows every record that could fall in one released cell except
the target's, so knows the count without the target, k. A priori the target is in the cell with
probability p: P[X = k+1] = p, P[X = k] = 1 - p (eq. 9). The release is X* = X + eta with eta the
cell's noise. After seeing X* = x the intruder's posterior is (eq. 10)

    P[X = k+1 | X* = x] = p L(x-k-1) / (p L(x-k-1) + (1-p) L(x-k)),

with L the pmf of eta; the risk ratio is R'(x) = posterior / p (eq. 13); the marginal posterior
averages the posterior over X* given that the target is in the cell (eq. 14) and the marginal
risk is R = that average / p (eq. 15). Under 0-1 loss the intruder says "in" when the posterior
exceeds 1/2; the probability of this correct guess is P[X* >= x~ | X = k+1] with x~ the smallest
such released value (eqs. 18-19). Nothing depends on k (paper §5.2): reported values use k = 0.

PHSafe's noise. A level with budget rho and sensitivity Delta adds discrete Gaussian noise with
sigma^2 = Delta^2 / (2 rho) to every cell (spec §6). The target moves the count by one, so for
this question the noise acts as zCDP with the *effective* rho_eff = 1 / (2 sigma^2) = rho / Delta^2
(eq. 11 with rho_1 = rho_eff). For pure DP (two-sided geometric, scale s = Delta / epsilon) the
effective epsilon is 1/s = epsilon / Delta (eq. 12).

Numerics. The pmf of the discrete Gaussian is normalised exactly by summing
exp(-j^2 / (2 sigma^2)) over |j| <= 12 sigma + 2 (the neglected tail is below 1e-30 of the
mass) -- never by the continuous approximation sqrt(2 pi) sigma. Posteriors are computed from
differences of log-likelihoods, so they never over- or underflow; the correct-guess probability
uses the exact geometric tail, or the summed discrete Gaussian tail in log space, so tiny values
are reported rather than rounded to 0. Nothing is sampled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from phsafe.accounting import PlannedMeasurement, plan_run
from phsafe.config import PHSafeConfig, PrivacyDefinition, load_config
from phsafe.tables import TABLES, TableKind

PRIORS: tuple[Fraction, ...] = (Fraction(1, 2), Fraction(1, 5), Fraction(1, 10), Fraction(1, 50))
"""The intruders' priors of the paper (§4.2)."""

QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999)
"""Released values reported per level: these quantiles of X* when the target is in the cell."""

RISK_JSON = "risk.json"
REPORT_MD = "risk_report.md"
REPORT_HTML = "risk_report.html"
RISK_PNG = "risk_ratio.png"

_TAIL = 69.1  # ln(1e30): neglected pmf tails are below e^-69 of the mass
_MAX_RADIUS = 20_000_000

GAUSSIAN = "discrete_gaussian"
GEOMETRIC = "geometric"
NONE = "none"


@dataclass(frozen=True)
class CellNoise:
    """The noise on one released count, as it bears on a one-person change of that count.

    Build with :meth:`discrete_gaussian`, :meth:`geometric` or :meth:`noiseless`.

    Attributes:
        kind: ``"discrete_gaussian"``, ``"geometric"`` or ``"none"``.
        sigma2: Discrete Gaussian variance parameter sigma^2 (exact), else None.
        scale: Geometric scale s (P(k) proportional to exp(-|k|/s)), exact, else None.
    """

    kind: str
    sigma2: Fraction | None = None
    scale: Fraction | None = None

    @classmethod
    def discrete_gaussian(cls, rho: Fraction | Decimal | str, sensitivity: int = 1) -> "CellNoise":
        """The noise of a zCDP level: sigma^2 = Delta^2 / (2 rho). ``sensitivity=1`` takes
        ``rho`` as the effective rho of the paper (eq. 11)."""
        rho = Fraction(rho)
        if rho <= 0:
            raise ValueError("rho must be positive")
        return cls(GAUSSIAN, sigma2=Fraction(sensitivity**2) / (2 * rho))

    @classmethod
    def geometric(cls, epsilon: Fraction | Decimal | str, sensitivity: int = 1) -> "CellNoise":
        """The noise of a pure-DP level: scale s = Delta / epsilon."""
        epsilon = Fraction(epsilon)
        if epsilon <= 0:
            raise ValueError("epsilon must be positive")
        return cls(GEOMETRIC, scale=Fraction(sensitivity) / epsilon)

    @classmethod
    def noiseless(cls) -> "CellNoise":
        """An ``Infinity`` budget: the count is released exactly."""
        return cls(NONE)

    @property
    def effective_rho(self) -> Fraction | None:
        """1 / (2 sigma^2): the zCDP parameter of this noise for a change of the count by one."""
        return None if self.sigma2 is None else 1 / (2 * self.sigma2)

    @property
    def effective_epsilon(self) -> Fraction | None:
        """1 / s: the pure-DP parameter of this noise for a change of the count by one."""
        return None if self.scale is None else 1 / self.scale

    @property
    def variance(self) -> float:
        if self.kind == GAUSSIAN:
            return float(self.sigma2)  # the spec's reported variance (Canonne et al.: <= sigma^2)
        if self.kind == GEOMETRIC:
            q = math.exp(-1 / float(self.scale))
            return 2 * q / (1 - q) ** 2
        return 0.0

    def describe(self) -> str:
        if self.kind == GAUSSIAN:
            return (f"discrete Gaussian, sigma^2 = {_sig(float(self.sigma2))}, "
                    f"effective rho = {_sig(float(self.effective_rho))}")
        if self.kind == GEOMETRIC:
            return (f"two-sided geometric, scale = {_sig(float(self.scale))}, "
                    f"effective epsilon = {_sig(float(self.effective_epsilon))}")
        return "no noise (Infinity budget)"

    # -- log-likelihood differences -----------------------------------------------------------

    def _log_ratio(self, d: np.ndarray) -> np.ndarray:
        """log L(d) - log L(d-1) for offsets d = x - k (vectorised).

        Discrete Gaussian: -(d^2 - (d-1)^2) / (2 sigma^2) = -(2d - 1) rho_eff.
        Geometric: -(|d| - |d-1|) / s.
        """
        d = np.asarray(d, dtype=np.float64)
        if self.kind == GAUSSIAN:
            return -(2.0 * d - 1.0) * float(self.effective_rho)
        if self.kind == GEOMETRIC:
            return -(np.abs(d) - np.abs(d - 1.0)) / float(self.scale)
        raise ValueError("no likelihood ratio without noise")


@dataclass(frozen=True)
class _Pmf:
    """The noise pmf over offsets -radius..radius, normalised by summation."""

    radius: int
    probs: np.ndarray  # probs[j + radius] = P(eta = j)

    def at(self, j: np.ndarray | int) -> np.ndarray:
        j = np.asarray(j, dtype=np.int64)
        inside = np.abs(j) <= self.radius
        out = np.zeros(j.shape, dtype=np.float64)
        out[inside] = self.probs[j[inside] + self.radius]
        return out

    def quantile(self, q: float) -> int:
        """Smallest j with P(eta <= j) >= q."""
        cdf = np.cumsum(self.probs)
        return int(np.searchsorted(cdf, q - 1e-15, side="left")) - self.radius


def _pmf(noise: CellNoise) -> _Pmf:
    if noise.kind == GAUSSIAN:
        s2 = float(noise.sigma2)
        radius = int(math.ceil(math.sqrt(2 * _TAIL * s2))) + 2
    elif noise.kind == GEOMETRIC:
        radius = int(math.ceil(_TAIL * float(noise.scale))) + 2
    else:
        return _Pmf(0, np.ones(1))
    if radius > _MAX_RADIUS:
        raise ValueError(f"noise too wide to tabulate exactly ({noise.describe()})")
    j = np.arange(-radius, radius + 1, dtype=np.float64)
    if noise.kind == GAUSSIAN:
        w = np.exp(-(j * j) / (2.0 * s2))
    else:
        w = np.exp(-np.abs(j) / float(noise.scale))
    return _Pmf(radius, w / math.fsum(w))


def _log_upper_tail(noise: CellNoise, j: int) -> float:
    """log P(eta >= j), accurate far into the tail (no underflow)."""
    if noise.kind == NONE:
        return 0.0 if j <= 0 else -math.inf
    if j <= 0:
        return math.log1p(-math.exp(_log_upper_tail(noise, 1 - j)))  # symmetry
    if noise.kind == GEOMETRIC:
        # P(eta >= j) = q^j / (1 + q), q = e^(-1/s)  (closed form of the geometric tail)
        t = 1 / float(noise.scale)
        return -j * t - math.log1p(math.exp(-t))
    # Discrete Gaussian: e^(-j^2/2s2) * sum_{i>=0} e^(-(2ji + i^2)/2s2) / Z
    s2 = float(noise.sigma2)
    i = np.arange(0, int(math.ceil(math.sqrt(2 * _TAIL * s2))) + 3, dtype=np.float64)
    inner = np.exp(-(2.0 * j * i + i * i) / (2.0 * s2))
    radius = int(math.ceil(math.sqrt(2 * _TAIL * s2))) + 2
    k = np.arange(-radius, radius + 1, dtype=np.float64)
    z = math.fsum(np.exp(-(k * k) / (2.0 * s2)))
    return -(j * j) / (2.0 * s2) + math.log(math.fsum(inner)) - math.log(z)


def _posterior_from_log_ratio(prior: float, log_ratio: np.ndarray) -> np.ndarray:
    """p L1 / (p L1 + (1-p) L0) = 1 / (1 + exp(a)), a = log((1-p)/p) + log L0 - log L1, stably."""
    a = math.log((1 - prior) / prior) + np.asarray(log_ratio, dtype=np.float64)
    out = np.empty_like(a)
    pos = a > 0
    e = np.exp(-a[pos])
    out[pos] = e / (1.0 + e)
    out[~pos] = 1.0 / (1.0 + np.exp(a[~pos]))
    return out


# --------------------------------------------------------------------------------------------
# The paper's quantities
# --------------------------------------------------------------------------------------------


def likelihood(noise: CellNoise, released: int, count: int) -> float:
    """P[X* = released | X = count]."""
    if noise.kind == NONE:
        return 1.0 if released == count else 0.0
    return float(_pmf(noise).at(released - count))


def posterior(noise: CellNoise, prior: Fraction | float, released: int | Sequence[int], known: int = 0) -> np.ndarray:
    """P[X = k+1 | X* = x] for each released x (eqs. 10-12); NaN where both likelihoods are 0."""
    x = np.atleast_1d(np.asarray(released, dtype=np.int64))
    d = x - known
    p = float(prior)
    if noise.kind == NONE:
        return np.where(d == 1, 1.0, np.where(d == 0, 0.0, np.nan))
    return _posterior_from_log_ratio(p, noise._log_ratio(d))


def risk_ratio(noise: CellNoise, prior: Fraction | float, released: int | Sequence[int], known: int = 0) -> np.ndarray:
    """R'(x) = P[X = k+1 | X* = x] / p (eq. 13)."""
    return posterior(noise, prior, released, known) / float(prior)


@dataclass(frozen=True)
class Marginal:
    """Marginal quantities for one prior.

    Attributes:
        prior: p.
        posterior: P[X = k+1 | xi = k+1], the posterior averaged over releases (eq. 14).
        risk: R = posterior / p (eq. 15).
        p_correct: Probability that a 0-1-loss intruder decides "in" when the target is in
            (eqs. 18-19).
        log10_p_correct: log10 of ``p_correct`` (finite even when the float underflows).
        threshold: x~ - k, the smallest released offset at which the intruder decides "in"
            (None if never; ``-inf`` is reported as None with ``p_correct = 1``).
    """

    prior: Fraction
    posterior: float
    risk: float
    p_correct: float
    log10_p_correct: float
    threshold: int | None


def marginal(noise: CellNoise, prior: Fraction | float) -> Marginal:
    """Marginal posterior, risk R and the probability of a correct guess for one prior."""
    p = Fraction(prior)
    pf = float(p)
    if noise.kind == NONE:
        return Marginal(p, 1.0, 1 / pf, 1.0, 0.0, 1)
    pmf = _pmf(noise)
    # Offsets d = x - k with P[X* = x | X = k+1] = pmf(d - 1) > 0.
    d = np.arange(-pmf.radius + 1, pmf.radius + 2, dtype=np.int64)
    l1 = pmf.at(d - 1)
    post = _posterior_from_log_ratio(pf, noise._log_ratio(d))
    marg = math.fsum(post * l1)
    threshold = _decision_threshold(noise, pf)
    if threshold is None:
        log_pc = -math.inf
    elif threshold == -math.inf:
        log_pc = 0.0
    else:
        log_pc = _log_upper_tail(noise, int(threshold) - 1)
    return Marginal(
        prior=p,
        posterior=marg,
        risk=marg / pf,
        p_correct=math.exp(log_pc),
        log10_p_correct=log_pc / math.log(10),
        threshold=None if threshold in (None, -math.inf) else int(threshold),
    )


def _decision_threshold(noise: CellNoise, prior: float) -> float | int | None:
    """Smallest offset d = x - k with posterior > 1/2 (the decision region is {d >= x~ - k}).

    posterior > 1/2  <=>  a(d) = log((1-p)/p) + log L(d) - log L(d-1) < 0.
    Discrete Gaussian: log L(d) - log L(d-1) = -(2d-1) rho_eff, decreasing in d, so the region
    is d > (log((1-p)/p)/rho_eff + 1)/2. Geometric: the difference is -1/s for d >= 1 and +1/s
    for d <= 0, so the region is everything, {d >= 1}, or empty. Returns ``-inf`` for
    "always", None for "never".
    """
    lg = math.log((1 - prior) / prior)
    if noise.kind == GEOMETRIC:
        t = 1 / float(noise.scale)
        if lg + t < 0:
            return -math.inf
        return 1 if lg - t < 0 else None
    rho = float(noise.effective_rho)
    d = math.floor((lg / rho + 1) / 2) + 1
    # Guard the float boundary: step to the exact first d with a(d) < 0.
    while lg - (2 * (d - 1) - 1) * rho < 0:
        d -= 1
    while lg - (2 * d - 1) * rho >= 0:
        d += 1
    return d


@dataclass(frozen=True)
class ReleasedValue:
    """The intruder's view of one released value x (with k = ``known``).

    Attributes:
        released: x.
        quantile: The quantile of X* | target in that x was chosen as (None if given).
        tail_in: P[X* >= x | X = k+1].
        mass_out: P[X* = x | X = k] -- the paper's Table 3 "Probability Mass" column.
        mass_in: P[X* = x | X = k+1].
        posterior: P[X = k+1 | X* = x] for each prior.
        risk: R'(x) for each prior.
    """

    released: int
    quantile: float | None
    tail_in: float
    mass_out: float
    mass_in: float
    posterior: tuple[float, ...]
    risk: tuple[float, ...]


def released_values(
    noise: CellNoise,
    priors: Sequence[Fraction] = PRIORS,
    values: Sequence[int] | None = None,
    known: int = 0,
) -> tuple[ReleasedValue, ...]:
    """The table of posteriors and risk ratios over released values.

    Args:
        noise: The cell's noise.
        priors: Intruders' priors p.
        values: Released values x; default the :data:`QUANTILES` of X* | target in.
        known: k, the count without the target.
    """
    pmf = _pmf(noise)
    chosen: list[tuple[int, float | None]]
    if values is None:
        seen: dict[int, float] = {}
        for q in QUANTILES:
            seen.setdefault(known + 1 + pmf.quantile(q), q)
        chosen = sorted(seen.items())
    else:
        chosen = [(int(v), None) for v in values]
    xs = np.array([v for v, _ in chosen], dtype=np.int64)
    posts = [posterior(noise, p, xs, known) for p in priors]
    mass_out = pmf.at(xs - known)
    mass_in = pmf.at(xs - known - 1)
    rows = []
    for i, (x, q) in enumerate(chosen):
        tail = math.exp(_log_upper_tail(noise, int(x - known - 1)))
        rows.append(ReleasedValue(
            released=int(x), quantile=q, tail_in=tail, mass_out=float(mass_out[i]), mass_in=float(mass_in[i]),
            posterior=tuple(float(pp[i]) for pp in posts),
            risk=tuple(float(pp[i]) / float(p) for pp, p in zip(posts, priors)),
        ))
    return tuple(rows)


# --------------------------------------------------------------------------------------------
# A config
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseRisk:
    """The risk analysis of one noise (shared by every level that has this noise)."""

    noise: CellNoise
    priors: tuple[Fraction, ...]
    marginals: tuple[Marginal, ...]
    values: tuple[ReleasedValue, ...]


def analyse(
    noise: CellNoise,
    priors: Sequence[Fraction] = PRIORS,
    values: Sequence[int] | None = None,
    known: int = 0,
) -> NoiseRisk:
    """Every quantity of the analysis for one noise."""
    priors = tuple(Fraction(p) for p in priors)
    for p in priors:
        if not 0 < p < 1:
            raise ValueError("a prior must be strictly between 0 and 1")
    return NoiseRisk(noise, priors, tuple(marginal(noise, p) for p in priors),
                     released_values(noise, priors, values, known))


def level_noise(m: PlannedMeasurement) -> CellNoise:
    """The noise of a planned measurement (budget and Delta from the config)."""
    if m.is_noiseless:
        return CellNoise.noiseless()
    if m.privacy_defn is PrivacyDefinition.ZCDP:
        return CellNoise.discrete_gaussian(m.budget_fraction, m.sensitivity)
    return CellNoise.geometric(m.budget_fraction, m.sensitivity)


@dataclass(frozen=True)
class LevelRisk:
    measurement: PlannedMeasurement
    noise: CellNoise


@dataclass(frozen=True)
class ConfigRisk:
    """The analysis of every measured level of a config.

    Attributes:
        config: The config.
        source: Where it was read from.
        levels: Every measured level with its noise.
        by_noise: The analysis per distinct noise (levels with equal noise share it).
        combined: The approximate analysis for an intruder who sees the target's cell in every
            measured level of every person table (None for pure DP or noiseless configs).
        known: k used for the released values.
    """

    config: PHSafeConfig
    source: str
    levels: tuple[LevelRisk, ...]
    by_noise: dict[CellNoise, NoiseRisk]
    combined: NoiseRisk | None
    known: int = 0


def analyse_config(
    config: PHSafeConfig | str | Path,
    priors: Sequence[Fraction] = PRIORS,
    values: Sequence[int] | None = None,
    known: int = 0,
) -> ConfigRisk:
    """Analyse every measured population-group level of ``config``."""
    source = "config"
    if not isinstance(config, PHSafeConfig):
        source = str(config)
        config = load_config(config)
    levels = tuple(LevelRisk(m, level_noise(m)) for m in plan_run(config).measurements)
    by_noise: dict[CellNoise, NoiseRisk] = {}
    for lr in levels:
        if lr.noise not in by_noise:
            by_noise[lr.noise] = analyse(lr.noise, priors, values, known)
    combined = None
    person = [lr for lr in levels if TABLES[lr.measurement.table].kind is TableKind.PERSON]
    if person and all(lr.noise.kind == GAUSSIAN for lr in person):
        rho = sum((lr.noise.effective_rho for lr in person), Fraction(0))
        combined = analyse(CellNoise.discrete_gaussian(rho, 1), priors, values, known)
    return ConfigRisk(config, source, levels, by_noise, combined, known)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _sig(x: float, digits: int = 6) -> str:
    if x == 0:
        return "0"
    if math.isinf(x):
        return "Infinity"
    return f"{x:.{digits}g}"


PROBABILITY_FLOOR = 1e-300
"""Probabilities below this are printed as "< 1e-300" (their exact log10 is in risk.json)."""


def _prob(x: float, log10: float | None = None) -> str:
    """A probability for people: six decimals, scientific below 1e-4, "< 1e-300" below that."""
    if log10 is not None and math.isfinite(log10) and log10 < math.log10(PROBABILITY_FLOOR):
        return f"< {PROBABILITY_FLOOR:.0e}"
    if x == 0:
        return "0"
    if x < PROBABILITY_FLOOR:
        return f"< {PROBABILITY_FLOOR:.0e}"
    if x < 1e-4:
        return f"{x:.3e}"
    return f"{x:.6f}"


def _prior_text(p: Fraction) -> str:
    return f"{p.numerator}/{p.denominator}"


def _noise_json(noise: CellNoise) -> dict[str, Any]:
    out: dict[str, Any] = {"distribution": noise.kind}
    if noise.kind == GAUSSIAN:
        out.update(sigma2=float(noise.sigma2), sigma2_exact=_frac(noise.sigma2),
                   effective_rho=float(noise.effective_rho), effective_rho_exact=_frac(noise.effective_rho))
    elif noise.kind == GEOMETRIC:
        out.update(scale=float(noise.scale), scale_exact=_frac(noise.scale),
                   effective_epsilon=float(noise.effective_epsilon),
                   effective_epsilon_exact=_frac(noise.effective_epsilon), variance=noise.variance)
    return out


def _frac(x: Fraction) -> str:
    from phsafe.amounts import format_exact

    return format_exact(x)


def _analysis_json(nr: NoiseRisk) -> dict[str, Any]:
    return {
        "noise": _noise_json(nr.noise),
        "marginal": [
            {"prior": _prior_text(m.prior), "posterior": m.posterior, "risk": m.risk,
             "p_correct_guess": m.p_correct,
             "log10_p_correct_guess": m.log10_p_correct if math.isfinite(m.log10_p_correct) else None,
             "decision_threshold_offset": m.threshold}
            for m in nr.marginals
        ],
        "released_values": [
            {"released": v.released, "quantile": v.quantile, "p_at_least_given_in": v.tail_in,
             "mass_given_out": v.mass_out, "mass_given_in": v.mass_in,
             "posterior": {_prior_text(p): x for p, x in zip(nr.priors, v.posterior)},
             "risk_ratio": {_prior_text(p): x for p, x in zip(nr.priors, v.risk)}}
            for v in nr.values
        ],
    }


def risk_json(cr: ConfigRisk) -> dict[str, Any]:
    """The analysis as JSON: one entry per measured level (each with its full analysis)."""
    def budget(m: PlannedMeasurement) -> str:
        return "Infinity" if m.is_noiseless else _frac(m.budget_fraction)

    return {
        "source": cr.source,
        "privacy_defn": cr.config.privacy_defn.value,
        "known_count": cr.known,
        "priors": [_prior_text(p) for p in next(iter(cr.by_noise.values())).priors] if cr.by_noise else [],
        "levels": [
            {"table": lr.measurement.table, "level": lr.measurement.level.config_key,
             "budget": budget(lr.measurement), "sensitivity": lr.measurement.sensitivity,
             **_analysis_json(cr.by_noise[lr.noise])}
            for lr in cr.levels
        ],
        "combined_person_tables": None if cr.combined is None else {
            "approximate": True, **_analysis_json(cr.combined)},
    }


def _explanation(cr: ConfigRisk):  # type: ignore[no-untyped-def]
    from phsafe._plots import Bullets, Heading, Para

    zcdp = cr.config.privacy_defn is PrivacyDefinition.ZCDP
    return [
        Heading(2, "What this report measures"),
        Para(
            "Every released cell of a population-group level carries independent noise. Picture an "
            "intruder who knows every person who could be counted in one released cell except one, "
            "the target -- so they know the count without the target, k -- and who wants to learn "
            "whether the target is in the cell too (for example: does this child live in a "
            "married-couple household in this state?). Before the release they believe it with "
            "probability p, the prior. After seeing the released count x, Bayes' rule gives their "
            "posterior. This is the worst case of Kazan and Reiter's analysis (§3.1): an intruder "
            "who knows fewer of the others learns less."
        ),
        Bullets([
            "Posterior P[in | x]: what the intruder believes after seeing x (eq. 10).",
            "Risk ratio R'(x) = posterior / prior (eq. 13): 1 means the release taught them nothing; "
            "the largest possible value is 1/p (certainty).",
            "Marginal risk R (eq. 15): R'(x) averaged over the values x that are released when the "
            "target really is in the cell -- the expected gain of confidence, before the release.",
            "Correct guess (eqs. 18-19): an intruder who must decide says \"in\" when the posterior "
            "exceeds 1/2; this is the probability that they then name the target correctly. For p = 1/2 "
            "it is at least 1/2 whatever the noise (a coin flip would do as well).",
            "P(X* = x | out) is the probability of the released value when the target is not in the "
            "cell (the paper's Table 3 'Probability Mass' column, whose caption says 'in' but whose "
            "numbers are for 'out'); P(X* = x | in) and P(X* >= x | in) are given too.",
        ]),
        Heading(2, "Which noise the intruder faces"),
        Para(
            ("A level with budget rho and sensitivity Delta adds discrete Gaussian noise with "
             "sigma^2 = Delta^2 / (2 rho) to each cell. Delta (2 tau + 2 for person tables, 2 for "
             "unit tables) is the worst-case change of a whole table when one person is added or "
             "removed; the target alone moves their own cell's count by one, so for this question the "
             "noise behaves as zCDP with the effective rho_eff = 1/(2 sigma^2) = rho / Delta^2. "
             if zcdp else
             "A level with budget epsilon and sensitivity Delta adds two-sided geometric noise with "
             "scale s = Delta / epsilon to each cell; the target moves their cell's count by one, so "
             "for this question the noise behaves as pure DP with epsilon_eff = epsilon / Delta. ")
            + "The results do not depend on k (paper §5.2); released values are shown for k = 0, "
            "a target who is unique in the cell, and shift by k otherwise."
        ),
        Heading(2, "Limits of this analysis"),
        Bullets([
            "One released cell at a time. The target is counted in one cell of every level of every "
            "table they belong to; an intruder who knew everyone else in all those cells could "
            "combine them. The last section gives an approximate figure for that (combined) case.",
            "The intruder asks about the target's own count. A person's presence can change more than "
            "one count (their household's type, tenure or size; Delta = 2 tau + 2 bounds this), and "
            "the differential-privacy guarantee -- the budgets -- covers those questions; this "
            "report does not.",
            "The priors are the intruder's; the report does not say which intruder is plausible.",
            "Post-processing of the released counts (e.g. non-negativity) cannot increase the risk.",
            "Numbers are exact sums of the noise distribution (no sampling, no continuous approximation).",
        ]),
    ]


def _analysis_blocks(nr: NoiseRisk, known: int):  # type: ignore[no-untyped-def]
    from phsafe._plots import Table

    pri = [_prior_text(p) for p in nr.priors]
    rows = []
    for v in nr.values:
        rows.append(
            [str(v.released), "-" if v.quantile is None else f"{v.quantile:g}", _prob(v.tail_in),
             _prob(v.mass_out), _prob(v.mass_in)]
            + [f"{x:.4f}" for x in v.posterior] + [f"{x:.4f}" for x in v.risk]
        )
    header = (["released x", "quantile (in)", "P(X* >= x | in)", "P(X* = x | out)", "P(X* = x | in)"]
              + [f"posterior p={p}" for p in pri] + [f"R'(x) p={p}" for p in pri])
    marg = [[_prior_text(m.prior), f"{m.posterior:.6f}", f"{m.risk:.6f}",
             _prob(m.p_correct, m.log10_p_correct),
             "never" if m.p_correct == 0 and m.threshold is None else
             ("always" if m.threshold is None else f"x >= {known + m.threshold}")]
            for m in nr.marginals]
    return [
        Table(header, rows),
        Table(("prior p", "marginal posterior (eq. 14)", "marginal risk R (eq. 15)",
               "P(correct guess) (eq. 19)", "intruder says \"in\" when"), marg),
    ]


def build_report(cr: ConfigRisk, files: Mapping[str, str]):  # type: ignore[no-untyped-def]
    """The analysis as a :class:`phsafe._plots.Document`."""
    from phsafe._plots import Document, Heading, Image, Para, Table

    doc = Document("PHSafe disclosure-risk analysis")
    zcdp = cr.config.privacy_defn is PrivacyDefinition.ZCDP
    doc.add(Table(("Field", "Value"), [
        ["Config", f"`{cr.source}`"],
        ["Privacy definition", "zCDP (discrete Gaussian)" if zcdp else "pure DP (two-sided geometric)"],
        ["Measured population-group levels", str(len(cr.levels))],
        ["Distinct noises", str(len(cr.by_noise))],
        ["Priors", ", ".join(_prior_text(p) for p in next(iter(cr.by_noise.values())).priors) if cr.by_noise else "-"],
        ["Method", "Kazan & Reiter §3.1 / §4.2 (no hierarchical information), exact sums"],
    ]))
    doc.add(*_explanation(cr))

    doc.add(Heading(2, "Summary by level"))
    priors = next(iter(cr.by_noise.values())).priors if cr.by_noise else ()
    eff = "rho_eff" if zcdp else "epsilon_eff"
    header = ["Table", "Level", "budget", "Delta", "noise variance", eff] \
        + [f"R p={_prior_text(p)}" for p in priors] + [f"P(correct) p={_prior_text(p)}" for p in priors]
    rows = []
    for lr in cr.levels:
        m, nr = lr.measurement, cr.by_noise[lr.noise]
        e = lr.noise.effective_rho if zcdp else lr.noise.effective_epsilon
        rows.append([m.table, f"`{m.level.config_key}`", "Infinity" if m.is_noiseless else _frac(m.budget_fraction),
                     str(m.sensitivity), _sig(lr.noise.variance), "-" if e is None else _sig(float(e))]
                    + [f"{mm.risk:.6f}" for mm in nr.marginals]
                    + [_prob(mm.p_correct, mm.log10_p_correct) for mm in nr.marginals])
    doc.add(Table(header, rows))
    if "chart" in files:
        doc.add(Image(files["chart"], "risk ratio against released value"))

    doc.add(Heading(2, "Detail by noise"))
    doc.add(Para("Levels with the same budget and Delta have the same noise and the same risk; each "
                 "noise is detailed once, with the levels it applies to. Released values are the "
                 "quantiles of X* when the target is in the cell (k = %d)." % cr.known))
    for i, (noise, nr) in enumerate(cr.by_noise.items(), start=1):
        applies = [f"{lr.measurement.table} `{lr.measurement.level.config_key}`" for lr in cr.levels if lr.noise == noise]
        doc.add(Heading(3, f"Noise {i}: {noise.describe()}"))
        doc.add(Para("Applies to: " + ", ".join(applies) + "."))
        doc.add(*_analysis_blocks(nr, cr.known))

    if cr.combined is not None:
        doc.add(Heading(2, "Combined: the target's cell in every person-table level (approximate)"))
        doc.add(Para(
            "If an intruder knew everyone else in the target's cell of every measured level of every "
            "person table (a far stronger intruder than above: state and national cells), they could "
            "combine the independent releases. For Gaussian noise the combined evidence is that of a "
            "single release with rho_eff equal to the sum of the levels' rho_eff; with discrete "
            "Gaussian noise this is an approximation (exact in the first two moments of the "
            f"log-likelihood ratio). Sum of rho_eff: {_sig(float(cr.combined.noise.effective_rho))}."
        ))
        doc.add(Para(f"Noise: {cr.combined.noise.describe()}."))
        doc.add(*_analysis_blocks(cr.combined, cr.known))
    return doc


def _chart(cr: ConfigRisk, path: Path) -> Path | None:
    """R'(x) against the released value for the noise with the largest effective parameter."""
    from phsafe._plots import Series, line_chart

    noisy = [n for n in cr.by_noise if n.kind != NONE]
    if not noisy:
        return None
    worst = max(noisy, key=lambda n: float(n.effective_rho if n.kind == GAUSSIAN else n.effective_epsilon))
    pmf = _pmf(worst)
    lo, hi = cr.known + 1 + pmf.quantile(0.001), cr.known + 1 + pmf.quantile(0.999)
    xs = np.unique(np.linspace(lo, hi, 200).round().astype(np.int64))
    series = [Series(f"p = {_prior_text(p)}", xs.tolist(), risk_ratio(worst, p, xs, cr.known).tolist(), "-")
              for p in cr.by_noise[worst].priors]
    eff = (f"rho_eff = {_sig(float(worst.effective_rho), 4)}" if worst.kind == GAUSSIAN
           else f"epsilon_eff = {_sig(float(worst.effective_epsilon), 4)}")
    return line_chart(path, series, title=f"Risk ratio R'(x) of the least noisy level ({eff})",
                      xlabel=f"released value x, 0.1% to 99.9% quantile when the target is in (k = {cr.known})",
                      ylabel="R'(x) = posterior / prior")


def write_risk(cr: ConfigRisk, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """Write ``risk.json``, ``risk_report.md``, ``risk_report.html`` and ``risk_ratio.png`` into
    ``out_dir``, a new or empty folder unless ``overwrite`` (:func:`phsafe._plots.report_folder`)."""
    from phsafe._plots import report_folder

    out = report_folder(out_dir, overwrite=overwrite)
    paths: dict[str, Path] = {}
    paths["json"] = out / RISK_JSON
    paths["json"].write_text(json.dumps(risk_json(cr), indent=2) + "\n", encoding="utf-8")
    chart = _chart(cr, out / RISK_PNG)
    if chart is not None:
        paths["chart"] = chart
    md, page = build_report(cr, {k: p.name for k, p in paths.items()}).write(out / REPORT_MD, out / REPORT_HTML)
    paths["report_md"], paths["report_html"] = md, page
    return paths
