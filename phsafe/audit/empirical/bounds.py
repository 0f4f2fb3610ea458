"""The statistics of the empirical audit: error-rate bounds and what they say about privacy loss.

Everything here is arithmetic on counts (no data, no randomness):

* :func:`clopper_pearson_upper`, :func:`clopper_pearson_lower` -- exact one-sided binomial
  confidence limits (the Beta quantiles of Clopper and Pearson, 1934);
* :func:`mu_from_rates` -- the Gaussian-DP parameter a test's false-positive and false-negative
  rates imply: mu = Phi^-1(1 - FNR) - Phi^-1(FPR). A mechanism that is mu*-GDP has, for every
  test, FNR >= Phi(Phi^-1(1 - FPR) - mu*) (Dong, Roth and Su 2022), so the mu a test's *true*
  rates imply is at most mu*; evaluated at the Clopper-Pearson upper limits of both rates it is
  a lower bound on mu* that holds with the limits' confidence (Nasr et al., "Tight auditing",
  USENIX Security 2023);
* :func:`epsilon_gdp` -- epsilon of the Gaussian mechanism with parameter mu at a given delta:
  the root in epsilon of Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) = delta, solved on the
  logarithm of both sides (delta = 1e-10 is far below double precision's 1 - x resolution);
* :func:`pure_dp_bounds` -- pure DP: the likelihood ratio of one event under the two neighbours,
  bounded by the ratio of the Clopper-Pearson limits of its two frequencies;
* :func:`discrete_gaussian_pmf`, :func:`exact_threshold_mu`, :func:`lattice_allowance` -- the
  exact behaviour of the audit's threshold test on *integer* noise, which can differ from the
  continuous Gaussian's by up to 0.2% of mu at sigma = 3.6 (so that the EXCESS and WEAK
  thresholds are the mu correct code really gives, not its continuous approximation).

Pooling: when the trials of one test come from several canaries whose mu_k differ, the pooled
rates are averages of each canary's rates; trade-off functions are convex, so the averaged
point still lies above the mechanism's trade-off curve and the pooled bound stays valid. For
correct code with per-canary thresholds mu_k / 2, the pooled rates imply
:func:`pooled_mu` (between the smallest and the largest mu_k).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, special, stats

__all__ = [
    "RateBounds", "clopper_pearson_upper", "clopper_pearson_lower", "mu_from_rates", "gdp_bounds",
    "log_delta_gdp", "epsilon_gdp", "pure_dp_bounds", "pooled_mu", "discrete_gaussian_pmf",
    "exact_threshold_mu", "lattice_allowance", "tail_weights", "two_sided_geometric_pmf",
]

_NORMAL = stats.norm


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """The one-sided ``1 - alpha`` upper confidence limit of a binomial proportion (k of n)."""
    _check(k, n, alpha)
    if n == 0 or k >= n:
        return 1.0
    return float(special.betaincinv(k + 1, n - k, 1.0 - alpha))


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """The one-sided ``1 - alpha`` lower confidence limit of a binomial proportion (k of n)."""
    _check(k, n, alpha)
    if n == 0 or k <= 0:
        return 0.0
    return float(special.betaincinv(k, n - k + 1, alpha))


def _check(k: int, n: int, alpha: float) -> None:
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def mu_from_rates(fpr: float, fnr: float) -> float:
    """mu = Phi^-1(1 - FNR) - Phi^-1(FPR); +inf when either rate is 0 and the other below 1."""
    if fpr >= 1.0 or fnr >= 1.0:
        return -math.inf
    return float(_NORMAL.isf(fnr) - _NORMAL.ppf(fpr))


@dataclass(frozen=True)
class RateBounds:
    """A threshold test's tallies and the Gaussian-DP bounds they give.

    Attributes:
        false_positives: Trials without the canary that the test called "in".
        negatives: Trials without the canary.
        false_negatives: Trials with the canary that the test called "out".
        positives: Trials with the canary.
        mu_lb: Lower confidence bound on mu (each rate at its upper limit).
        mu_ub: Upper confidence bound on mu (each rate at its lower limit; +inf if a rate is 0).
        mu_hat: The point estimate from the observed rates.
    """

    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    mu_lb: float
    mu_ub: float
    mu_hat: float


def gdp_bounds(false_positives: int, negatives: int, false_negatives: int, positives: int, *,
               alpha_lower: float, alpha_upper: float) -> RateBounds:
    """Bounds on mu from a test's tallies.

    Args:
        alpha_lower: Probability that ``mu_lb`` exceeds the mu the test's true rates imply
            (split evenly between the two rates' upper limits).
        alpha_upper: Probability that ``mu_ub`` falls below it (the two lower limits).
    """
    fpr_hi = clopper_pearson_upper(false_positives, negatives, alpha_lower / 2)
    fnr_hi = clopper_pearson_upper(false_negatives, positives, alpha_lower / 2)
    fpr_lo = clopper_pearson_lower(false_positives, negatives, alpha_upper / 2)
    fnr_lo = clopper_pearson_lower(false_negatives, positives, alpha_upper / 2)
    hat = (mu_from_rates(false_positives / negatives, false_negatives / positives)
           if negatives and positives else math.nan)
    return RateBounds(false_positives, negatives, false_negatives, positives,
                      mu_lb=mu_from_rates(fpr_hi, fnr_hi), mu_ub=mu_from_rates(fpr_lo, fnr_lo), mu_hat=hat)


def pooled_mu(mus: Sequence[float]) -> float:
    """The mu pooled trials imply for correct (continuous Gaussian) code: canaries with
    parameters ``mus`` (each equally often in and out), each tested at the threshold mu_k / 2."""
    tails = np.asarray(_NORMAL.cdf(-np.asarray(mus, dtype=float) / 2.0))
    return float(-2.0 * _NORMAL.ppf(tails.mean()))


# --------------------------------------------------------------------------------------------
# Gaussian DP -> (epsilon, delta)
# --------------------------------------------------------------------------------------------


def log_delta_gdp(epsilon: float, mu: float) -> float:
    """log of delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), for mu-GDP.

    Computed as log Phi(a) + log1p(-exp(eps + log Phi(b) - log Phi(a))): no term is formed
    outside the logarithm, so deltas down to 1e-300 keep their relative precision.
    """
    if mu <= 0:
        return -math.inf
    a = float(special.log_ndtr(-epsilon / mu + mu / 2.0))
    b = epsilon + float(special.log_ndtr(-epsilon / mu - mu / 2.0))
    if b >= a:
        return -math.inf
    return a + math.log1p(-math.exp(b - a))


def epsilon_gdp(mu: float, delta: float) -> float:
    """epsilon of the Gaussian mechanism with parameter ``mu`` at ``delta`` (0 if mu <= 0).

    The smallest epsilon with delta(eps) <= delta: delta(eps) decreases in eps, so the root is
    found by Brent's method on log delta(eps) - log delta, bracketed by 0 and the classical
    bound mu^2/2 + mu sqrt(2 ln(1/delta)) + 1 (which always over-covers).
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isnan(mu) or mu <= 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    target = math.log(delta)
    if log_delta_gdp(0.0, mu) <= target:
        return 0.0

    def f(epsilon: float) -> float:
        value = log_delta_gdp(epsilon, mu)
        return (value if value > -1e300 else -1e300) - target

    high = mu * mu / 2.0 + mu * math.sqrt(2.0 * math.log(1.0 / delta)) + 1.0
    while f(high) > 0:  # never taken for delta < 0.5; kept so the bracket is always right
        high *= 2.0
    return float(optimize.brentq(f, 0.0, high, xtol=1e-13, rtol=1e-13, maxiter=500))


# --------------------------------------------------------------------------------------------
# Pure DP
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventBounds:
    """A tail event's tallies and the bounds on epsilon they give.

    Attributes:
        hits_out, negatives: The event's count and the trials without the canary.
        hits_in, positives: The event's count and the trials with the canary.
        epsilon_lb: ln(P_in lower limit / P_out upper limit), at least 0.
        epsilon_ub: ln(P_in upper limit / P_out lower limit) (+inf if the event never happened
            without the canary).
        epsilon_hat: ln of the ratio of the observed frequencies.
    """

    hits_out: int
    negatives: int
    hits_in: int
    positives: int
    epsilon_lb: float
    epsilon_ub: float
    epsilon_hat: float


def pure_dp_bounds(hits_out: int, negatives: int, hits_in: int, positives: int, *,
                   alpha_lower: float, alpha_upper: float) -> EventBounds:
    """Bounds on the likelihood ratio of an event: e^eps >= P_in / P_out for an eps-DP mechanism."""
    p_out_hi = clopper_pearson_upper(hits_out, negatives, alpha_lower / 2)
    p_in_lo = clopper_pearson_lower(hits_in, positives, alpha_lower / 2)
    p_out_lo = clopper_pearson_lower(hits_out, negatives, alpha_upper / 2)
    p_in_hi = clopper_pearson_upper(hits_in, positives, alpha_upper / 2)
    lb = math.log(p_in_lo / p_out_hi) if p_in_lo > 0 else -math.inf
    ub = math.log(p_in_hi / p_out_lo) if p_out_lo > 0 else math.inf
    if hits_out and hits_in and negatives and positives:
        hat = math.log((hits_in / positives) / (hits_out / negatives))
    else:
        hat = math.nan
    return EventBounds(hits_out, negatives, hits_in, positives, max(lb, 0.0), ub, hat)


# --------------------------------------------------------------------------------------------
# Integer noise: exact laws and the threshold test's exact behaviour
# --------------------------------------------------------------------------------------------

_TAIL_SIGMAS = 14.0  # beyond 14 sigma a discrete Gaussian has less than 1e-44 of its mass


@lru_cache(maxsize=256)
def discrete_gaussian_pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of the discrete Gaussian N_Z(0, sigma^2): P(k) ∝ exp(-k^2 / (2 sigma^2))."""
    half = int(math.ceil(_TAIL_SIGMAS * sigma)) + 2
    k = np.arange(-half, half + 1)
    w = np.exp(-(k.astype(float) ** 2) / (2.0 * sigma * sigma))
    return k, w / w.sum()


@lru_cache(maxsize=256)
def two_sided_geometric_pmf(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of the two-sided geometric P(k) ∝ exp(-|k| / scale), mass beyond kept < 1e-30."""
    q = math.exp(-1.0 / scale)
    half = int(math.ceil(70.0 * scale)) + 2
    k = np.arange(-half, half + 1)
    w = q ** np.abs(k).astype(float)
    return k, w / w.sum()


_EXACT_SIGMA_LIMIT = 60.0
"""Above this sigma the lattice effect is below 1e-5 of mu (measured): the continuous value is used."""


def _shape(change: int | tuple[int, ...]) -> tuple[int, ...]:
    """A change's values (sorted); an int ``step`` is the two-cell move (-step, +step)."""
    if isinstance(change, (int, np.integer)):
        return (-int(change), int(change))
    return tuple(sorted(int(v) for v in change))


def exact_threshold_mu(sigma: float, change: int | tuple[int, ...]) -> tuple[float, float]:
    """The threshold test of one canary's change at one level on discrete Gaussian noise, exactly.

    A canary changes the cells it owns by ``change`` (its values d_c, e.g. (-step, +step) when
    ``step`` records move from one cell to another, (+1,) when one person is added; an int is
    that two-cell move). The audit's statistic is the integer S = sum of r_c d_c over the cells,
    and the test says "in" when S exceeds |d|^2 / 2. With S = sum of d_c n_c for independent
    n_c ~ N_Z(0, sigma^2): FPR = P(S > |d|^2 / 2) and FNR = P(S + |d|^2 <= |d|^2 / 2).

    Returns:
        ``(mu_at_threshold, mu_max)``: the mu those exact rates imply, and the largest mu any
        deterministic threshold on S implies (the discrete mechanism's own profile: its
        trade-off curve is the chords between those points).
    """
    return _exact_threshold_mu(float(sigma), _shape(change))


@lru_cache(maxsize=512)
def _exact_threshold_mu(sigma: float, values: tuple[int, ...]) -> tuple[float, float]:
    norm2 = sum(v * v for v in values)
    if sigma > _EXACT_SIGMA_LIMIT:
        mu = math.sqrt(norm2) / sigma
        return mu, mu
    g = math.gcd(*(abs(v) for v in values))
    k, p = discrete_gaussian_pmf(sigma)
    # The pmf of S / g on its lattice: each cell's noise scaled by d_c / g, convolved.
    pmf, low = np.ones(1), 0
    for v in values:
        step = v // g
        scaled = np.zeros(abs(step) * (len(k) - 1) + 1)
        scaled[::abs(step)] = p if step > 0 else p[::-1]
        pmf = np.convolve(pmf, scaled)
        low += abs(step) * int(k[0])
    support = np.arange(low, low + len(pmf))  # values of S / g
    above = np.cumsum(pmf[::-1])[::-1]  # P(S/g >= support[i])
    half = norm2 / (2 * g)  # the threshold, in units of g
    shift = norm2 // g  # |d|^2 / g: S moves by this when the canary is in

    def sf(x: float) -> float:  # P(S/g > x)
        i = int(np.searchsorted(support, x, side="right"))
        return float(above[i]) if i < len(above) else 0.0

    def implied(threshold: float) -> float:
        fpr = sf(threshold)
        fnr = 1.0 - sf(threshold - shift)
        if min(fpr, fnr) < 1e-14:
            return -math.inf
        return mu_from_rates(fpr, fnr)

    at = implied(half)
    reach = int(4 * sigma * math.sqrt(norm2) / g) + shift + 2
    # implied(t + 0.5) at every t at once: the same rates and the same normal quantiles, elementwise
    thresholds = np.arange(-reach, reach + 1) + 0.5

    def sf_all(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(support, x, side="right")
        return np.where(i < len(above), above[np.minimum(i, len(above) - 1)], 0.0)

    fpr = sf_all(thresholds)
    fnr = 1.0 - sf_all(thresholds - shift)
    usable = (np.minimum(fpr, fnr) >= 1e-14) & (fpr < 1.0) & (fnr < 1.0)
    mus = _NORMAL.isf(fnr[usable]) - _NORMAL.ppf(fpr[usable])
    best = float(mus.max()) if mus.size else -math.inf
    return at, max(best, at)


def lattice_allowance(sigmas: Sequence[float], changes: Sequence[int | tuple[int, ...]]) -> float:
    """The largest relative excess of a discrete mechanism's profile over the continuous mu,
    over the canaries' changes (``changes``, each at its level's ``sigma``; an int is a two-cell
    move of that step); 0 for a continuous mechanism.

    A composition of mechanisms each of whose trade-off curves lies above G_{mu_i (1 + kappa)}
    lies above G_{mu (1 + kappa)}, mu = sqrt(sum mu_i^2) (tensor products of trade-off functions
    are monotone): so ``mu (1 + kappa)`` bounds what any threshold test of the composed
    statistic can show for correct code.
    """
    kappa = 0.0
    for sigma, change in zip(sigmas, changes):
        values = _shape(change)
        continuous = math.sqrt(sum(v * v for v in values)) / float(sigma)
        _, best = exact_threshold_mu(float(sigma), values)
        kappa = max(kappa, best / continuous - 1.0)
    return kappa


def tail_weights(bins: int, sigma: float | None = None, *, scale: float | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Integer bin edges of (about) equal probability under a noise law, and each bin's mass.

    Give ``sigma`` (discrete Gaussian) or ``scale`` (two-sided geometric). Bin i holds the
    integers ``edges[i] <= k < edges[i + 1]`` (the outer bins are open-ended); used by the
    chi-squared test of the noise's shape.
    """
    k, p = discrete_gaussian_pmf(sigma) if sigma is not None else two_sided_geometric_pmf(float(scale))
    cdf = np.cumsum(p)
    cuts = np.searchsorted(cdf, np.arange(1, bins) / bins)
    edges = np.unique(k[np.clip(cuts, 0, len(k) - 1)])
    edges = edges[(edges > k[0]) & (edges <= k[-1])]
    index = np.searchsorted(edges, k, side="right")
    mass = np.bincount(index, weights=p, minlength=len(edges) + 1)
    return edges, mass
