"""Long checks of the estimates: their logical bounds never violated over random noisy inputs, and
the coverage of their intervals within binomial tolerance."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from phsafe import postprocess as pp
from phsafe.accounting import geometric_variance
from phsafe.postprocess.counts import count_estimates
from phsafe.postprocess.noise import NoiseModel
from phsafe.postprocess.ratios import Count, own_denominator_cell, ratio_table, shared_denominator_group
from phsafe.postprocess.shells import RATIO_SHELLS
from tests._noisy_tables import DG, GEO, opendp_noise


# --------------------------------------------------------------------------------------------
# The constraints hold, whatever the noisy values
# --------------------------------------------------------------------------------------------


def _assert_in_bounds(result, lower: float, tau: int) -> None:
    values = (result.lower, result.median, result.estimate, result.upper)
    assert all(math.isfinite(v) for v in values), result
    assert lower - 1e-9 <= result.lower <= result.median <= result.upper <= tau + 1e-9, result
    assert lower - 1e-9 <= result.estimate <= tau + 1e-9, result  # (not always inside the interval: atoms)
    assert result.denominator >= 1 - 1e-9 and 0 <= result.p_positive <= 1


def test_constraints_never_violated_over_random_noisy_inputs() -> None:
    rng = np.random.default_rng(2024)
    scales = [(DG, 3.0), (DG, 14783.0), (GEO, geometric_variance(2.0)), (GEO, geometric_variance(40.0))]
    extremes = [-10**6, -5000, -1, 0, 3, 10**6]
    for trial in range(36):
        dist, var = scales[trial % len(scales)]
        model = NoiseModel.of(dist, var)
        sd = math.sqrt(var)

        def y() -> int:
            return int(rng.choice(extremes)) if rng.random() < 0.3 else int(rng.normal(0, 30 * sd))

        b, tau = int(rng.choice([1, 2])), int(rng.choice([2, 6, 10]))
        n2, n3, h = Count(model, y()), Count(model, y()), Count(model, y())
        total, part2, part3 = shared_denominator_group(n2, n3, h, b, tau, draws=2000, rng=rng, exact_limit=2_000_000)
        _assert_in_bounds(total, b, tau)
        _assert_in_bounds(part2, 0, tau)
        _assert_in_bounds(part3, 0, tau)
        assert total.numerator >= b * total.denominator - 1e-6 * max(1.0, total.numerator)
        assert part2.numerator + part3.numerator == pytest.approx(total.numerator, rel=1e-9, abs=1e-6)
        cell = own_denominator_cell([Count(NoiseModel.of(dist, var, 2), y())], [Count(model, y())], tau, rng=rng)
        _assert_in_bounds(cell, 1, tau)
        cell = own_denominator_cell([Count(model, y()), Count(model, y())], [Count(model, y()), Count(model, y())], tau,
                                    rng=rng)
        _assert_in_bounds(cell, 1, tau)
    # counts: never negative, whatever the released value
    frame = pd.DataFrame({"REGION_ID": "01", "REGION_TYPE": "STATE", "ITERATION_CODE": "*", "PH4_DATA_CELL": [2, 3],
                          "COUNT": [-10**6, 10**6], "NOISE_DISTRIBUTION": DG, "VARIANCE": 14783.0})
    out = count_estimates(frame, "PH4")
    assert (out[["ESTIMATE", "CI90_LOWER", "CI90_ET_LOWER"]] >= 0).all().all()


# --------------------------------------------------------------------------------------------
# Coverage on synthetic data, within its binomial tolerance
# --------------------------------------------------------------------------------------------


def _binomial_interval(n: int, p: float, alpha: float = 1e-4) -> tuple[int, int]:
    from scipy.stats import binom

    return int(binom.ppf(alpha / 2, n, p)), int(binom.isf(alpha / 2, n, p))


def test_count_interval_coverage_within_its_binomial_tolerance() -> None:
    """Far from 0 the equal-tailed interval of a count is y + [q05, q95] of the noise: it covers
    the truth exactly when the noise lies in a fixed set, whose probability the noise pmf gives.
    4,000 cells, OpenDP noise, each distribution within the central 1 - 1e-6 of its binomial
    (a correct computation fails this 1.7 times in a million runs; at alpha 1e-4, the bound
    before, 1.7e-4). Power: intervals covering 3 points less than the noise law says (0.896
    instead of 0.926 for the discrete Gaussian, 0.889 instead of 0.919 for the geometric) fail
    with probability 0.97 and 0.95, 2.5 points more with 0.94 and 0.90."""
    rng = np.random.default_rng(11)
    for dist, scale, var in ((DG, 7.0, 49.0), (GEO, 3.0, geometric_variance(3.0))):
        truths = rng.integers(2000, 9000, 4000)
        y = truths + opendp_noise(dist, scale, truths.size)
        post = pp.posterior_for(NoiseModel.of(dist, var))
        s = post.summarize(y)
        covered = int(((s.et_lower <= truths) & (truths <= s.et_upper)).sum())
        # covered iff y - truth = Z in [-(upper - y), (y - lower)] = [-q95, -q05] (q of n - y)
        q05, q95 = int(s.et_lower[0] - y[0]), int(s.et_upper[0] - y[0])
        expected = float(post.pmf[(post.x >= -q95) & (post.x <= -q05)].sum())
        lo, hi = _binomial_interval(truths.size, expected, alpha=1e-6)
        # false-alarm rate: 1.7e-06 per run -- exact: Binomial(4000, expected) outside [ppf(5e-7), isf(5e-7)], summed
        # over the two distributions (8.1e-7 at expected 0.926, 9.3e-7 at 0.919)
        assert lo <= covered <= hi, (dist, covered / truths.size, expected)


def test_average_interval_coverage_within_its_binomial_tolerance() -> None:
    """Truths drawn from the constrained lattice (households 1-120, PH1's band), the noise from
    OpenDP, 600 groups: each cell's 90% equal-tailed interval covers about 90% of the truths
    (0.903-0.907, Monte Carlo) -- within 0.83-0.97. The tolerance before (at least the binomial
    tolerance of 0.9 at alpha 1e-4, 0.85, and at most 0.94) sat 3 standard errors above the
    coverage: about 1% per run. It catches intervals that cover 80% or 100%; the full simulation
    tests the 90% more finely."""
    rng = np.random.default_rng(12)
    groups, b, tau = 600, 1, 10
    h = rng.integers(1, 120, groups)
    s = np.array([rng.integers(b * v, tau * v + 1) for v in h])
    n2 = np.array([rng.integers(0, v + 1) for v in s])
    from tests._noisy_tables import average_frames

    num, _ = average_frames(np.stack([n2, s - n2], 1), h[:, None], 3.0)
    _, den = average_frames(np.stack([n2, s - n2], 1), h[:, None], 2.0)
    out = ratio_table(RATIO_SHELLS["PH1"], num, den, {"PH1_num": tau}, rng=np.random.default_rng(4))
    truth = np.stack([s / h, n2 / h, (s - n2) / h], 1).ravel()
    covered = ((out["CI90_LOWER"] <= truth) & (truth <= out["CI90_UPPER"])).to_numpy()
    for cell in range(3):
        # false-alarm rate: 8.9e-08 per run -- monte carlo: each cell's covered count is a sum over independent groups,
        # whose tails the binomial at its mean bounds (Hoeffding 1956), the mean at the ends of its 99.9% interval
        # from 70 seeded replications (0.9006-0.9119), outside 0.83-0.97 of 600, summed over the three cells
        assert 0.83 * groups <= covered[cell::3].sum() <= 0.97 * groups, (cell, covered[cell::3].mean())
