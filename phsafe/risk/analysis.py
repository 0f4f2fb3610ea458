"""Bayesian disclosure risk of one released cell: the analysis (pure; ``phsafe risk``).

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

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import numpy as np

from phsafe.accounting import PlannedMeasurement, plan_run
from phsafe.config import PHSafeConfig, PrivacyDefinition, load_config
from phsafe.sensitivity import squared
from phsafe.tables import TABLES, TableKind

PRIORS: tuple[Fraction, ...] = (Fraction(1, 2), Fraction(1, 5), Fraction(1, 10), Fraction(1, 50))
"""The intruders' priors of the paper (§4.2)."""

QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999)
"""Released values reported per level: these quantiles of X* when the target is in the cell."""

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
    def discrete_gaussian(cls, rho: Fraction | Decimal | str, sensitivity: int | str = 1) -> "CellNoise":
        """The noise of a zCDP level: sigma^2 = Delta^2 / (2 rho). ``sensitivity=1`` takes
        ``rho`` as the effective rho of the paper (eq. 11); an exact L2 sensitivity may be given
        as ``"sqrt(N)"`` (:mod:`phsafe.sensitivity`)."""
        rho = Fraction(rho)
        if rho <= 0:
            raise ValueError("rho must be positive")
        return cls(GAUSSIAN, sigma2=Fraction(squared(sensitivity)) / (2 * rho))

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
            return (f"discrete Gaussian, sigma^2 = {significant(float(self.sigma2))}, "
                    f"effective rho = {significant(float(self.effective_rho))}")
        if self.kind == GEOMETRIC:
            return (f"two-sided geometric, scale = {significant(float(self.scale))}, "
                    f"effective epsilon = {significant(float(self.effective_epsilon))}")
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


def noise_pmf(noise: CellNoise) -> _Pmf:
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
    return float(noise_pmf(noise).at(released - count))


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
    pmf = noise_pmf(noise)
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
    pmf = noise_pmf(noise)
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


def significant(x: float, digits: int = 6) -> str:
    if x == 0:
        return "0"
    if math.isinf(x):
        return "Infinity"
    return f"{x:.{digits}g}"
