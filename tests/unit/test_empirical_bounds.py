"""The empirical audit's statistics against known answers and independent computations.

Deterministic: no sampling, so no false-failure probability to state.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from phsafe.audit.empirical.bounds import (
    clopper_pearson_lower, clopper_pearson_upper, discrete_gaussian_pmf, epsilon_gdp, exact_threshold_mu, gdp_bounds,
    lattice_allowance, log_delta_gdp, mu_from_rates, pooled_mu, pure_dp_bounds, tail_weights,
)

CASES = [(0, 10, 0.05), (3, 10, 0.05), (10, 10, 0.05), (0, 1000, 1e-6), (17, 1000, 1e-6), (500, 1000, 0.025),
         (999, 1000, 0.001), (123456, 250000, 1e-4)]


@pytest.mark.parametrize("k, n, alpha", CASES)
def test_clopper_pearson_limits_are_the_beta_quantiles(k: int, n: int, alpha: float) -> None:
    upper = clopper_pearson_upper(k, n, alpha)
    lower = clopper_pearson_lower(k, n, alpha)
    want_upper = 1.0 if k == n else stats.beta.ppf(1 - alpha, k + 1, n - k)
    want_lower = 0.0 if k == 0 else stats.beta.ppf(alpha, k, n - k + 1)
    assert upper == pytest.approx(want_upper, rel=1e-10, abs=1e-15)
    assert lower == pytest.approx(want_lower, rel=1e-10, abs=1e-15)
    # The defining property: at the limit, the observed count is exactly in the alpha tail.
    if k < n:
        assert stats.binom.cdf(k, n, upper) == pytest.approx(alpha, rel=1e-7)
    if k > 0:
        assert stats.binom.sf(k - 1, n, lower) == pytest.approx(alpha, rel=1e-7)


def test_clopper_pearson_closed_forms_at_the_edges() -> None:
    # k = 0: the upper limit solves (1 - p)^n = alpha; k = n: the lower limit solves p^n = alpha.
    for n, alpha in ((1, 0.05), (20, 0.01), (5000, 1e-6)):
        assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-10)
        assert clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-10)
    assert clopper_pearson_upper(0, 0, 0.05) == 1.0 and clopper_pearson_lower(0, 0, 0.05) == 0.0
    with pytest.raises(ValueError):
        clopper_pearson_upper(5, 4, 0.05)


def _delta_by_privacy_loss(epsilon: float, mu: float) -> float:
    """delta(eps) of mu-GDP by another route: E[(1 - e^(eps - L))+], L ~ N(mu^2/2, mu^2), the
    privacy-loss random variable, integrated numerically over L > eps."""
    mean, sd = mu * mu / 2, mu

    def integrand(x: float) -> float:
        return -math.expm1(epsilon - x) * stats.norm.pdf(x, mean, sd)

    top = max(epsilon, mean) + 60 * sd
    value, _ = integrate.quad(integrand, epsilon, top, epsabs=0, epsrel=1e-12, limit=500,
                              points=[epsilon + sd * k for k in (0.1, 1, 3, 10)])
    return value


@pytest.mark.parametrize("mu", [0.05, 0.7, 1.1657, 4.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-10])
def test_gaussian_dp_epsilon_against_the_privacy_loss_integral(mu: float, delta: float) -> None:
    epsilon = epsilon_gdp(mu, delta)
    assert epsilon > 0
    assert _delta_by_privacy_loss(epsilon, mu) == pytest.approx(delta, rel=1e-6)
    # Monotone, and the classical bound mu^2/2 + mu sqrt(2 ln(1/delta)) is never beaten.
    assert epsilon_gdp(mu * 1.01, delta) > epsilon
    assert epsilon < mu * mu / 2 + mu * math.sqrt(2 * math.log(1 / delta))


def test_gaussian_dp_epsilon_known_values() -> None:
    # delta(0) = 2 Phi(mu/2) - 1 (the total variation distance): below it, epsilon is 0.
    mu = 0.5
    tv = 2 * stats.norm.cdf(mu / 2) - 1
    assert math.exp(log_delta_gdp(0.0, mu)) == pytest.approx(tv, rel=1e-12)
    assert epsilon_gdp(mu, tv * 1.0001) == 0.0
    assert epsilon_gdp(mu, tv * 0.9999) > 0
    assert epsilon_gdp(0.0, 1e-10) == 0.0 and epsilon_gdp(-1.0, 1e-10) == 0.0
    # Log space keeps its precision where 1 - x in doubles would not: delta = 1e-300.
    assert _delta_by_privacy_loss(epsilon_gdp(3.0, 1e-300), 3.0) == pytest.approx(1e-300, rel=1e-5)


def test_mu_from_the_rates_of_a_gaussian_threshold_test() -> None:
    for mu in (0.1, 0.7, 2.5):
        for t in (-1.0, mu / 2, 2.0):
            fpr, fnr = stats.norm.sf(t), stats.norm.cdf(t - mu)
            assert mu_from_rates(fpr, fnr) == pytest.approx(mu, rel=1e-9)
    assert mu_from_rates(0.0, 0.3) == math.inf
    assert mu_from_rates(1.0, 0.0) == -math.inf


def test_gdp_bounds_bracket_the_estimate_and_narrow_with_samples() -> None:
    wide = gdp_bounds(300, 1000, 280, 1000, alpha_lower=0.05, alpha_upper=0.05)
    narrow = gdp_bounds(30000, 100000, 28000, 100000, alpha_lower=0.05, alpha_upper=0.05)
    for b in (wide, narrow):
        assert b.mu_lb < b.mu_hat < b.mu_ub
    assert narrow.mu_ub - narrow.mu_lb < (wide.mu_ub - wide.mu_lb) / 5
    # The lower bound is the mu of the two rates' upper limits, each at alpha / 2.
    fpr = clopper_pearson_upper(300, 1000, 0.025)
    fnr = clopper_pearson_upper(280, 1000, 0.025)
    assert wide.mu_lb == pytest.approx(stats.norm.isf(fnr) - stats.norm.ppf(fpr), rel=1e-12)


def test_pure_dp_event_bounds() -> None:
    b = pure_dp_bounds(1000, 10000, 2700, 10000, alpha_lower=0.05, alpha_upper=0.05)
    assert b.epsilon_hat == pytest.approx(math.log(2.7), rel=1e-12)
    assert b.epsilon_lb < b.epsilon_hat < b.epsilon_ub
    p_in = clopper_pearson_lower(2700, 10000, 0.025)
    p_out = clopper_pearson_upper(1000, 10000, 0.025)
    assert b.epsilon_lb == pytest.approx(math.log(p_in / p_out), rel=1e-12)
    assert pure_dp_bounds(0, 100, 5, 100, alpha_lower=0.05, alpha_upper=0.05).epsilon_ub == math.inf


def test_pooled_mu() -> None:
    assert pooled_mu([0.7] * 5) == pytest.approx(0.7, rel=1e-12)
    mixed = pooled_mu([0.5, 0.9])
    assert 0.5 < mixed < 0.9


def test_discrete_gaussian_and_the_exact_threshold_test() -> None:
    k, p = discrete_gaussian_pmf(3.0)
    assert p.sum() == pytest.approx(1.0, abs=1e-15)
    assert (k.astype(float) ** 2 * p).sum() == pytest.approx(9.0, rel=1e-9)  # sigma^2 for sigma >= 1
    # Direct enumeration of the test "D > step", D the difference of two N_Z(0, sigma^2).
    sigma, step = 2.0, 1
    k, p = discrete_gaussian_pmf(sigma)
    d = np.subtract.outer(k, k).ravel()
    w = np.multiply.outer(p, p).ravel()
    fpr = w[d > step].sum()
    fnr = w[d + 2 * step <= step].sum()
    at, best = exact_threshold_mu(sigma, step)
    assert at == pytest.approx(stats.norm.isf(fnr) - stats.norm.ppf(fpr), rel=1e-9)
    assert best >= at
    # Large sigma: the continuous mu; small sigma: integer noise shows a little more (exactly).
    assert exact_threshold_mu(100.0, 10)[0] == pytest.approx(20 / (100 * math.sqrt(2)), rel=1e-12)
    assert 0 < lattice_allowance([2.0, 100.0], [1, 10]) < 0.01


@pytest.mark.parametrize("sigma, change", [(2.0, (1,)), (3.0, (-4,)), (2.5, (-2, 2)), (1.5, (-1, 1, 2))])
def test_the_exact_threshold_test_of_any_change(sigma: float, change: tuple[int, ...]) -> None:
    """By enumeration: S = sum of d_c n_c over independent N_Z(0, sigma^2), the test "S > |d|^2 / 2"
    (the canary in shifts S by |d|^2). One cell (+1: a person added; -tau: a family leaving) or
    several."""
    k, p = discrete_gaussian_pmf(sigma)
    keep = p > 1e-18
    k, p = k[keep], p[keep]
    values, weights = np.zeros(1), np.ones(1)
    for v in change:
        values = np.add.outer(values, v * k).ravel()
        weights = np.multiply.outer(weights, p).ravel()
    norm2 = sum(v * v for v in change)
    fpr = weights[values > norm2 / 2].sum()
    fnr = weights[values + norm2 <= norm2 / 2].sum()
    at, best = exact_threshold_mu(sigma, change)
    assert at == pytest.approx(stats.norm.isf(fnr) - stats.norm.ppf(fpr), rel=1e-9)
    assert best >= at
    # The allowance of the composed test covers the excess of every change over its continuous mu.
    kappa = lattice_allowance([sigma], [change])
    assert best <= math.sqrt(norm2) / sigma * (1 + kappa) * (1 + 1e-12)


def test_equal_probability_bins_of_the_noise_law() -> None:
    edges, mass = tail_weights(20, 12.16)
    assert mass.sum() == pytest.approx(1.0, abs=1e-12)
    assert mass.max() < 0.09 and mass.min() > 0.02
    edges, mass = tail_weights(20, scale=5.0)
    assert mass.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5, 9.3])
@pytest.mark.parametrize("values", [(-1, 1), (1,), (-3, 3), (-2, -1, 3)])
def test_the_lattice_profile_is_the_best_threshold_one_at_a_time(sigma: float, values: tuple[int, ...]) -> None:
    """mu_max of the exact threshold test is the largest mu any threshold t + 1/2 implies,
    each threshold's rates from the convolved pmf of S, one threshold at a time (the same
    floats: all thresholds are taken at once in the audit)."""
    import math

    import numpy as np

    from phsafe.audit.empirical import bounds

    k, p = bounds.discrete_gaussian_pmf(sigma)
    pmf, low = np.ones(1), 0
    g = math.gcd(*(abs(v) for v in values))
    for v in values:
        step = v // g
        scaled = np.zeros(abs(step) * (len(k) - 1) + 1)
        scaled[::abs(step)] = p if step > 0 else p[::-1]
        pmf, low = np.convolve(pmf, scaled), low + abs(step) * int(k[0])
    norm2 = sum(v * v for v in values)

    support, tails = np.arange(low, low + len(pmf)), np.cumsum(pmf[::-1])[::-1]

    def above(x: float) -> float:  # P(S / g > x), the tail sums as the audit forms them
        i = int(np.searchsorted(support, x, side="right"))
        return float(tails[i]) if i < len(tails) else 0.0

    def implied(t: float) -> float:
        fpr, fnr = above(t), 1.0 - above(t - norm2 // g)
        return -math.inf if min(fpr, fnr) < 1e-14 else bounds.mu_from_rates(fpr, fnr)

    reach = int(4 * sigma * math.sqrt(norm2) / g) + norm2 // g + 2
    at = implied(norm2 / (2 * g))
    best = max(implied(t + 0.5) for t in range(-reach, reach + 1))
    got = bounds._exact_threshold_mu.__wrapped__(sigma, values)
    assert got == (at, max(best, at))
