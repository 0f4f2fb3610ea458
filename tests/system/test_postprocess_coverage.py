"""Long simulations of the estimates' coverage: the stated MOE, the credible intervals and the
averages, over many noisy draws from OpenDP's samplers."""

from __future__ import annotations

import math

import numpy as np

from phsafe import postprocess as pp
from phsafe.accounting import geometric_variance, plan_run
from phsafe.config import load_config
from phsafe.postprocess import RATIO_SHELLS, NoiseModel, posterior_for, ratio_table
from tests._noisy_tables import DG, GEO, average_frames, opendp_noise
from tests.conftest import US_CONFIG


DRAWS = 120_000
"""Draws per noise law (standard error 0.0009): at 30,000 the exact 0.9083 of sigma 12.2 sat 4.0
standard errors below the band's top, 2.4e-5 per run."""


def test_moe_coverage_full_simulation() -> None:
    """OpenDP noise at every distinct production variance (zCDP) and at pure-DP scales."""
    results = {}
    for config in (US_CONFIG,):
        for v in sorted({m.variance for m in plan_run(load_config(config)).measurements}):
            z = opendp_noise(DG, math.sqrt(v), DRAWS)
            results[f"DG sigma={math.sqrt(v):.1f}"] = float((np.abs(z) <= 1.645 * math.sqrt(v)).mean())
    for s in (2.0, 10.0, 55.0):
        v = geometric_variance(s)
        z = opendp_noise(GEO, s, DRAWS)
        results[f"geometric s={s}"] = float((np.abs(z) <= 1.645 * math.sqrt(v)).mean())
    print(results)
    for key, cov in results.items():
        # false-alarm rate: 2.5e-16 per run -- exact: Binomial(120000, p) outside 0.888-0.915, p each law's exact
        # coverage (0.8975-0.9083), summed over the 12 laws
        assert 0.888 <= cov <= 0.915, (key, cov)  # exact values 0.8975-0.9083, SE 0.0009


FAR = 40_000
"""Truths far from 0 per noise law (standard error 0.0015): at 10,000 the band exact +- 0.012 was
4 standard errors wide, 1.5e-4 per run over the four laws."""


def test_credible_interval_coverage_full_simulation() -> None:
    """Count intervals for truths spread over the range where the boundary at 0 matters, and far
    from it, for the discrete Gaussian (one and two parts) and the geometric."""
    rng = np.random.default_rng(7)
    results = {}
    for distribution, scale, variance, parts in ((DG, 41.345, 41.345**2, 1), (DG, 3.0, 9.0, 1), (GEO, 12.0, geometric_variance(12.0), 1),
                                                 (DG, 41.345, 2 * 41.345**2, 2)):
        sd = math.sqrt(variance)
        truths = np.concatenate([np.zeros(6000, np.int64), rng.integers(0, int(4 * sd) + 1, 24_000),
                                 rng.integers(int(6 * sd), int(40 * sd), FAR)])
        noise = opendp_noise(distribution, scale, truths.size * parts).reshape(parts, -1).sum(0)
        y = truths + noise
        post = posterior_for(NoiseModel.of(distribution, variance, parts))
        s = post.summarize(y)
        hit = (s.lower <= truths) & (truths <= s.upper)
        # Far from 0 the interval is y +- h: its coverage is exactly P(|Z| <= h) >= 0.9 (more
        # for a small sigma, where the integers are coarse).
        lo, hi = pp.hpd_rows(post.pmf)
        exact_far = float(post.pmf[lo[0]: hi[0] + 1].sum())
        key = f"{distribution} scale={scale} parts={parts}"
        results[key] = (float(hit.mean()), float(hit[:6000].mean()), float(hit[6000:30_000].mean()),
                        float(hit[30_000:].mean()), exact_far)
    print(results)
    for key, (pooled, zero, near, far, exact_far) in results.items():
        # false-alarm rate: 5.0e-10 per run -- exact: per law, the Poisson-binomial laws of the covered counts (every
        # seeded truth at its exact coverage under the noise pmf) outside each band, summed over bands and laws
        assert 0.89 <= pooled <= 0.95, (key, pooled)
        assert zero >= 0.89, (key, zero)
        assert 0.88 <= near <= 0.96, (key, near)
        assert 0.9 <= exact_far <= 0.94 and abs(far - exact_far) <= 0.012, (key, far, exact_far)


def test_average_coverage_full_simulation() -> None:
    """The averages' 90% equal-tailed intervals on 1,500 groups (4,500 intervals), small and large
    households counts, sigma 41 (the production's state-level PH1 sigma is 122)."""
    rng = np.random.default_rng(9)
    groups, sigma = 1500, 41.345
    den = np.concatenate([rng.integers(1, 50, groups // 2), rng.integers(50, 3000, groups // 2)])
    kids = rng.binomial(den * 2, 0.3)
    adults = np.minimum(den + rng.binomial(den, 0.8), 10 * den - kids)
    num, denom = average_frames(np.stack([kids, adults], 1), den[:, None], sigma)
    out = ratio_table(RATIO_SHELLS["PH1"], num, denom, {"PH1_num": 10}, rng=np.random.default_rng(10))
    truth = np.stack([(kids + adults) / den, kids / den, adults / den], 1).ravel()
    covered = ((out["CI90_LOWER"] <= truth) & (truth <= out["CI90_UPPER"])).to_numpy()
    small = np.repeat(den < 50, 3)
    print({"pooled": covered.mean(), "small denominators": covered[small].mean(), "large": covered[~small].mean()})
    # Where the counts dominate (50 to 3,000 households) the intervals cover about 90% (0.902, sd 0.0073). Where
    # the constraints dominate (under 50 households, sigma 41: the posterior is mostly the band
    # 1 <= S / H <= 10) they over-cover, about 97% (0.968, sd 0.0039), but are not vacuous. The pooled figure is
    # their mean, 0.935 (sd 0.0038): it once had 0.94 as its upper bound and failed a correct run at 0.9422.
    # The bands 0.87-0.94 and 0.93-0.99 failed a correct run with up to 1.7% and 8e-5 (the bound below): they are
    # 0.85-0.96 and 0.92-0.995, which still catch intervals covering 83% where the counts dominate, or always.
    # false-alarm rate: 8.6e-06 per run -- monte carlo: Bennett's inequality over the independent groups (covered
    # count 0-3 each) with their variance sum and the mean at the 99.9% limits of 20 seeded replications of the
    # test: 8.0e-6 (large), 5.4e-7 (small), 1.2e-9 (pooled)
    assert 0.85 <= covered[~small].mean() <= 0.96
    assert 0.92 <= covered[small].mean() <= 0.995
    assert 0.87 <= covered.mean() <= 0.97
