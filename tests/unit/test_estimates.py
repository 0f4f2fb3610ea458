"""The model-based estimates (issue 24): marginal cells, constrained averages, the Census files.

* exact posteriors against brute-force enumeration of the whole lattice on small cases: marginal
  cells (the sum of two or three cells, two-part noise, geometric noise), the averages PH1/PH5
  (N2, N3, H), PH8 per cell and its total (four cells) -- by every path of the code: the
  one-dimensional sums, the two-dimensional lattice, the product form where the constraint cannot
  bind, and the independent exact draws (within their stated Monte Carlo error);
* the constraints are never violated, over many random noisy inputs including negative and huge
  ones, and an answer exists where the production's polytope is empty;
* the lattice's primitives (interval masses, convolutions, samplers) against direct computation;
* the Census files of a real release: names and columns exactly as the spec lists them, R's
  number format, the row order, the nation's GEOID; ``read_estimates``;
* the checks fail on planted violations, and a failing error check publishes nothing;
* coverage within its binomial tolerance on synthetic data (noise from OpenDP).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from phsafe import postprocess as pp
from phsafe.accounting import geometric_variance
from phsafe.postprocess import census, lattice
from phsafe.postprocess.counts import count_estimates
from phsafe.postprocess.noise import NoiseModel
from phsafe.postprocess.ratios import Count, own_denominator_cell, ratio_table, shared_denominator_group
from phsafe.postprocess.shells import RATIO_SHELLS
from tests._noisy_tables import DG, GEO

QUANTILES = (0.05, 0.5, 0.95)


# --------------------------------------------------------------------------------------------
# Brute force: the whole lattice
# --------------------------------------------------------------------------------------------


def _weights(model: NoiseModel, y: int, n: np.ndarray) -> np.ndarray:
    lw = model.log_pmf(y - n)
    return np.exp(lw - lw.max())


def _ratio_summary(num: np.ndarray, den: np.ndarray, w: np.ndarray) -> tuple[float, float, float, np.ndarray, np.ndarray]:
    """Posterior means of num / den, num, den, and the sorted ratio values with their cdf."""
    w = w / w.sum()
    r = (num / den).ravel()
    order = np.argsort(r, kind="stable")
    return float((w * num / den).sum()), float((w * num).sum()), float((w * den).sum()), r[order], np.cumsum(w.ravel()[order])


def _is_quantile(q: float, values: np.ndarray, cdf: np.ndarray, p: float, tolerance: float = 1e-9) -> bool:
    """Whether q = min{r : P(R <= r) >= p}: P(R <= q) >= p and P(R < q) < p (ties within
    ``tolerance`` of probability)."""
    at = cdf[np.searchsorted(values, q + 1e-12, side="right") - 1] if values[0] <= q + 1e-12 else 0.0
    below = cdf[np.searchsorted(values, q - 1e-12, side="left") - 1] if values[0] < q - 1e-12 else 0.0
    return at >= p - tolerance and below <= p + tolerance


def brute_shared(n2: Count, n3: Count, h: Count, b: int, tau: int, top: int = 110) -> list[tuple]:
    """PH1/PH5 by enumerating (N2, N3, H) on [0, top)^2 x [1, top)."""
    n = np.arange(top)
    hv = np.arange(1, top)
    A, B, C = np.meshgrid(n, n, hv, indexing="ij")
    w = _weights(n2.model, n2.y, n)[:, None, None] * _weights(n3.model, n3.y, n)[None, :, None] \
        * _weights(h.model, h.y, hv)[None, None, :]
    w = np.where((A + B >= b * C) & (A + B <= tau * C), w, 0.0)
    return [_ratio_summary(num, C, w) for num in (A + B, A, B)]


def _assert_cell(result, expected: tuple, sampled_ok: bool = False) -> None:
    mean, num, den, values, cdf = expected
    assert result.estimate == pytest.approx(mean, rel=1e-9, abs=1e-12)
    assert result.numerator == pytest.approx(num, rel=1e-9, abs=1e-12)
    assert result.denominator == pytest.approx(den, rel=1e-9, abs=1e-12)
    for q, p in zip((result.lower, result.median, result.upper), QUANTILES):
        if result.method == "sampled":
            # A sample quantile of m independent draws: its exact cdf is within a few binomial
            # standard deviations of p (in probability: the ratio's atoms make a distance in value
            # jump from one atom to the next when the cdf at an atom is near p).
            assert sampled_ok and result.draws > 0 and math.isfinite(result.mc_error)
            tolerance = 5 * math.sqrt(p * (1 - p) / result.draws)
            assert _is_quantile(q, values, cdf, p, tolerance), (q, p, result.draws)
        else:
            assert _is_quantile(q, values, cdf, p), (q, p)


SHARED_CASES = [
    # (distribution, numerator variance, denominator variance, y2, y3, yH, b, tau)
    (DG, 4.0, 2.0, 5, 9, 6, 1, 10),       # ordinary
    (DG, 6.0, 3.0, -4, -6, 7, 1, 10),     # negative numerators: the constraint binds
    (DG, 2.0, 0.5, 11, 7, 8, 2, 2),       # a band of one point per H (ratio exactly 2)
    (DG, 6.0, 3.0, 40, 35, 2, 2, 4),      # numerator far above tau * H
    (DG, 9.0, 1.0, -30, -25, 30, 2, 10),  # PH5: families far more than persons
    (GEO, 0.5, 3.0, 0, 15, 12, 1, 4),     # geometric, narrow
    (GEO, 3.0, 3.0, 2, 13, 8, 1, 4),
    (GEO, 6.0, 0.5, -5, 8, 9, 2, 4),
]


@pytest.mark.parametrize("case", SHARED_CASES, ids=lambda c: "-".join(map(str, c)))
def test_shared_denominator_posterior_equals_brute_force(case: tuple) -> None:
    dist, vn, vd, y2, y3, yh, b, tau = case
    n2, n3, h = Count(NoiseModel.of(dist, vn), y2), Count(NoiseModel.of(dist, vn), y3), Count(NoiseModel.of(dist, vd), yh)
    expected = brute_shared(n2, n3, h, b, tau)
    exact = shared_denominator_group(n2, n3, h, b, tau, draws=10, rng=np.random.default_rng(0), exact_limit=10**9)
    for result, truth in zip(exact, expected):
        assert result.method == "exact"
        _assert_cell(result, truth)
    # Beyond the lattice limit: independent exact draws, within their stated Monte Carlo error.
    sampled = shared_denominator_group(n2, n3, h, b, tau, draws=20_000, rng=np.random.default_rng(1), exact_limit=0)
    for result, truth in zip(sampled[1:], expected[1:]):
        _assert_cell(result, truth, sampled_ok=True)
    assert sampled[0].method == "exact"  # the total is always one-dimensional
    _assert_cell(sampled[0], expected[0])


def test_product_form_where_the_constraint_cannot_bind() -> None:
    """Counts far inside the band (about 2.5 persons per household, sigma 2): the constraint
    excludes nothing, the parts' averages are one-dimensional sums -- the same as brute force."""
    model, hm = NoiseModel.of(DG, 4.0), NoiseModel.of(DG, 4.0)
    n2, n3, h = Count(model, 30), Count(model, 70), Count(hm, 40)
    expected = brute_shared(n2, n3, h, 1, 10, top=130)
    results = shared_denominator_group(n2, n3, h, 1, 10, draws=10, rng=np.random.default_rng(0), exact_limit=0)
    for result, truth in zip(results, expected):
        assert result.method == "exact"  # exact_limit 0 would have forced draws on a binding constraint
        _assert_cell(result, truth)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("dist", [DG, GEO])
def test_own_denominator_posterior_equals_brute_force(parts: int, dist: str) -> None:
    """PH8: a cell (P, U) and the total (P2 + P3, U2 + U3) from four released cells."""
    rng = np.random.default_rng(parts * 7 + len(dist))
    pm, um = NoiseModel.of(dist, 3.0, parts), NoiseModel.of(dist, 1.5)
    for tau in (2, 10):
        p_y, u_y = [int(v) for v in rng.integers(-6, 25, 2)], [int(v) for v in rng.integers(-4, 10, 2)]
        ps, us = [Count(pm, y) for y in p_y], [Count(um, y) for y in u_y]
        n = np.arange(150)
        # one cell
        P, U = np.meshgrid(n, n[1:], indexing="ij")
        w = _weights(pm, p_y[0], n)[:, None] * _weights(um, u_y[0], n[1:])[None, :]
        w = np.where((P >= U) & (P <= tau * U), w, 0.0)
        _assert_cell(own_denominator_cell(ps[:1], us[:1], tau, rng=rng), _ratio_summary(P, U, w))
        # the total: the sums' likelihoods are the convolutions of the parts'
        gp = np.convolve(_weights(pm, p_y[0], n), _weights(pm, p_y[1], n))[:150]
        gu = np.convolve(_weights(um, u_y[0], n), _weights(um, u_y[1], n))[1:150]
        w = np.where((P >= U) & (P <= tau * U), gp[:, None] * gu[None, :], 0.0)
        _assert_cell(own_denominator_cell(ps, us, tau, rng=rng), _ratio_summary(P, U, w))


def test_marginal_cells_equal_brute_force() -> None:
    """A marginal cell's posterior is the distribution of the sum of its parts' posteriors: the
    summaries of PH7's total (three cells) and PH8_num's total (a two-part and a one-part noise)
    against the enumeration of every combination of the parts."""
    cases = [("PH7", [(DG, 9.0, 1), (DG, 9.0, 1), (DG, 9.0, 1)], [(-3, 4, 11), (0, 0, 0), (25, -8, 2)]),
             ("PH7", [(GEO, geometric_variance(1.5), 1)] * 3, [(-2, 5, 1), (30, 28, 40)]),
             ("PH8_num", [(DG, 8.0, 2), (DG, 4.0, 1)], [(-5, 3), (12, 0), (60, 70)])]
    for table, noises, ys_list in cases:
        cells = pp.shells.marginal_cells(table)[0][1]
        for ys in ys_list:
            frame = pd.DataFrame({
                "REGION_ID": "06", "REGION_TYPE": "STATE", "ITERATION_CODE": "*",
                f"{table.upper()}_DATA_CELL": list(cells), "COUNT": list(ys),
                "NOISE_DISTRIBUTION": [d for d, _, _ in noises], "VARIANCE": [v for _, v, _ in noises],
            })
            out = count_estimates(frame, table)
            total = out[out["MARGINAL"]].iloc[0]
            grids = [np.arange(0, max(y, 0) + 90) for y in ys]
            joint = np.ones(())
            sums = np.zeros((), dtype=np.int64)
            for (dist, var, parts), y, n in zip(noises, ys, grids):
                joint = np.multiply.outer(joint, _weights(NoiseModel.of(dist, var, parts), y, n))
                sums = np.add.outer(sums, n)
            pmf = np.bincount(sums.ravel(), weights=joint.ravel())
            pmf /= pmf.sum()
            values = np.arange(pmf.size)
            cdf = np.cumsum(pmf)
            order = np.argsort(-pmf, kind="stable")
            inside = values[pmf >= pmf[order][np.argmax(np.cumsum(pmf[order]) >= 0.9)] * (1 - 1e-9)]  # ties: as hpd_rows
            assert total["ESTIMATE"] == pytest.approx(pmf @ values, rel=1e-9)
            assert total["MEDIAN"] == np.argmax(cdf >= 0.5)
            assert (total["CI90_LOWER"], total["CI90_UPPER"]) == (inside.min(), inside.max())
            assert (total["CI90_ET_LOWER"], total["CI90_ET_UPPER"]) == (np.argmax(cdf >= 0.05), np.argmax(cdf >= 0.95))
            assert total["P_ZERO"] == pytest.approx(pmf[0], abs=1e-12)
            assert total["COUNT"] == sum(ys) and total["VARIANCE"] == pytest.approx(sum(v for _, v, _ in noises))


# --------------------------------------------------------------------------------------------
# The constraints hold, whatever the noisy values
# --------------------------------------------------------------------------------------------


def test_an_answer_where_the_production_polytope_is_empty() -> None:
    """PH5 with a noisy numerator far below two persons per family: the production's upper
    bound of N2 + N3 - 2H (noisy value + 6 sigma) is negative, its polytope empty, and it stops.
    Here: an estimate within the bounds, and the row flagged."""
    sigma = 10.0
    num = pd.DataFrame({"REGION_ID": "01", "REGION_TYPE": "STATE", "ITERATION_CODE": "*", "PH5_NUM_DATA_CELL": [2, 3],
                        "COUNT": [-80, -40], "NOISE_DISTRIBUTION": DG, "VARIANCE": sigma**2})
    den = pd.DataFrame({"REGION_ID": ["01"], "REGION_TYPE": "STATE", "ITERATION_CODE": "*", "PH5_DENOM_DATA_CELL": [1],
                        "COUNT": [90], "NOISE_DISTRIBUTION": DG, "VARIANCE": 4.0})
    u4 = -80 - 40 - 2 * 90 + 6 * math.sqrt(2 * sigma**2 + 4 * 4.0)
    assert u4 < 0  # the production's row 4: l = 0 >= u
    rng = np.random.default_rng(2)  # (exact here: no draws are made, but none unseeded either)
    out = ratio_table(RATIO_SHELLS["PH5"], num, den, {"PH4": 10}, rng=rng).set_index("PH5_DATA_CELL")
    assert not out["PRODUCTION_FEASIBLE"].any()
    assert out.loc[1, "METHOD"] == "exact" and 2 <= out.loc[1, "CI90_LOWER"] <= out.loc[1, "ESTIMATE"] <= 10
    # and a feasible one is not flagged
    den.loc[0, "COUNT"] = 20
    num["COUNT"] = [15, 40]
    assert ratio_table(RATIO_SHELLS["PH5"], num, den, {"PH4": 10}, rng=rng)["PRODUCTION_FEASIBLE"].all()


def test_averages_on_a_band_of_one_point_stay_on_it() -> None:
    """PH5 at tau = 2: every family has exactly two persons, the total's posterior sits on 2 and
    the parts' on [0, 2]. The log-space sums used to give 2.0000000000000004 on about a third of
    such groups, and the production's rule (0 <= RATIO_PRED <= tau), checked on the file as
    written, refused the release. Noisy counts as a state of the demo data gets them."""
    rng = np.random.default_rng(20261128)
    outside = []
    for _ in range(60):
        h = int(rng.integers(1, 300))
        under = int(rng.integers(0, 2 * h + 1))
        noisy = [under + int(rng.integers(-8, 9)), 2 * h - under + int(rng.integers(-8, 9)), h + int(rng.integers(-3, 4))]
        n2, n3 = (Count(NoiseModel.of(DG, 20.0), y) for y in noisy[:2])
        results = shared_denominator_group(n2, n3, Count(NoiseModel.of(DG, 3.0), noisy[2]), 2, 2, draws=50,
                                           rng=rng, exact_limit=12_000_000)
        total, parts = results[0], results[1:]
        if total.estimate != 2.0 or not all(0.0 <= p.estimate <= 2.0 for p in parts):
            outside.append((noisy, [r.estimate for r in results]))
    assert not outside


def test_a_mean_outside_its_support_by_more_than_rounding_is_an_error() -> None:
    from phsafe.postprocess.ratios import _mean_in_range

    assert _mean_in_range(2.0000000000000004, 2, 2) == 2.0
    assert _mean_in_range(-1e-17, 0, 4) == 0.0
    with pytest.raises(pp.PostprocessError, match="outside its support"):
        _mean_in_range(2.01, 0, 2)


# --------------------------------------------------------------------------------------------
# The lattice's primitives
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spread", [5.0, 2000.0])  # plain sums, and log-sums (a range beyond 600 nats)
def test_interval_masses_equal_direct_sums(spread: float) -> None:
    rng = np.random.default_rng(0)
    lw = -spread * (np.linspace(-1, 1, 301) ** 2) + rng.normal(0, 0.1, 301)
    f = lattice.Factor(-7, lw)
    cum = lattice.LogCum(f)
    assert cum.linear == (spread < lattice.LINEAR_RANGE)
    a = rng.integers(-20, 300, 400)
    b = a + rng.integers(-3, 120, 400)
    got = cum.log_mass(a, b)
    for ai, bi, g in zip(a, b, got):
        inside = lw[max(ai + 7, 0): max(min(bi + 7, 300) + 1, 0)]
        if ai > bi or inside.size == 0:
            assert g == -np.inf
        else:
            assert g == pytest.approx(lattice.logsumexp(inside), rel=1e-12, abs=1e-9)


def test_masses_from_fixed_lower_ends_are_the_masses() -> None:
    """A ratio's cdf asks for [a, b] with the same lower ends a at every point: what depends on a
    alone is computed once, the numbers are those of :meth:`LogCum.mass` exactly."""
    rng = np.random.default_rng(1)
    cum = lattice.LogCum(lattice.Factor(-7, -5.0 * (np.linspace(-1, 1, 301) ** 2) + rng.normal(0, 0.1, 301)))
    a = rng.integers(-20, 300, 60)[None, :]
    b = a + rng.integers(-3, 320, (40, 60))
    np.testing.assert_array_equal(cum.mass_from(a)(b), cum.mass(np.broadcast_to(a, b.shape), b))


def _whole_lattice_cdfs(n2: lattice.Factor, n3: lattice.Factor, h: lattice.Factor, b: int, tau: int) -> np.ndarray:
    """The row cdfs of :class:`lattice.CoupledRatio`'s plain-number path as it computed them on
    the whole lattice at once, before the lattice was filled a block of rows at a time."""
    from numpy.lib.stride_tricks import sliding_window_view

    c2, c3, ch = lattice.LogCum(n2), lattice.LogCum(n3), lattice.LogCum(h)
    hv = np.arange(h.lo, h.hi + 1, dtype=np.int64)
    m, n3len = n2.lw.size, n3.lw.size
    total = float(c3.cpre[-1])

    def reader(sums, before, after):  # type: ignore[no-untyped-def]
        pad = np.concatenate([np.full(m + 1, before), sums, np.full(m + 1, after)])
        view = sliding_window_view(pad[::-1], m)
        return lambda index: view[pad.size - 1 - (np.clip(index, -1, n3len + m - 1) + m + 1)]

    prefix, suffix = reader(c3.cpre, 0.0, total), reader(c3.csuf, total, 0.0)
    base = -n2.lo - n3.lo
    hi, lo = tau * hv + base, b * hv + base
    via_pre = prefix(hi) - prefix(lo - 1)
    use_pre = prefix(lo - 1) <= suffix(hi + 1)
    w = suffix(lo) - suffix(hi + 1)
    np.copyto(w, via_pre, where=use_pre)
    w = np.maximum(w, 0.0)
    w *= np.exp(h.lw - ch.shift)[:, None]
    w *= np.exp(n2.lw - c2.shift)[None, :]
    return np.cumsum(w, axis=1)


@pytest.mark.parametrize("block", [1, 700, lattice.LATTICE_BLOCK])  # a row, a few rows, the default
def test_the_lattice_filled_by_blocks_of_rows_is_the_whole_lattice_to_the_bit(
        block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coupled ratio's lattice, filled a block of rows at a time (to stay in the processor's
    cache), holds the very numbers of the whole-lattice computation it replaced: the same draws
    and quantiles for a fixed seed."""
    monkeypatch.setattr(lattice, "LATTICE_BLOCK", block)
    m = NoiseModel.of(DG, 30.0**2)
    for y2, y3, yh, b, tau in ((120, 300, 90, 1, 10), (-40, 15, 3, 2, 10), (900, 20, 400, 1, 3)):
        n2 = lattice.likelihood(m, y2, max(0, y2 - 150), y2 + 150)
        n3 = lattice.likelihood(m, y3, max(0, y3 - 150), y3 + 170)
        h = lattice.likelihood(m, yh, max(1, yh - 120), yh + 130)
        coupled = lattice.CoupledRatio(n2, n3, h, b, tau)
        expected = _whole_lattice_cdfs(n2, n3, h, b, tau)
        assert not coupled.empty and coupled.cum.shape == expected.shape
        np.testing.assert_array_equal(coupled.cum, expected)
        assert coupled.total == float(expected[:, -1].sum())


def test_convolution_methods_agree_and_bound_what_they_drop() -> None:
    m = NoiseModel.of(DG, 50.0)
    a = lattice.likelihood(m, 40, 0, 400)
    b = lattice.likelihood(m, -25, 0, 300)
    logs, none = lattice.convolve_factors(a, b, 0.0, "logs")
    for method in ("direct", "fft"):
        got, cut = lattice.convolve_factors(a, b, 0.3, method)
        keep = np.isfinite(got.lw)
        if method == "direct":  # every sum to its own precision
            np.testing.assert_allclose(got.lw[keep], logs.lw[keep], rtol=0, atol=1e-9)
        else:  # the FFT's round-off is relative to the largest tilted sum
            tilted = 0.3 * np.arange(logs.lw.size)
            top = (logs.lw + tilted).max()
            np.testing.assert_allclose(np.exp(got.lw[keep] + tilted[keep] - top), np.exp(logs.lw[keep] + tilted[keep] - top),
                                       rtol=1e-6, atol=1e-13)
        # what was dropped is below its stated bound
        assert np.all(logs.lw[~keep] <= cut.lw[~keep] + 1e-9)


def test_split_sampler_draws_the_exact_conditional() -> None:
    """N2 given N2 + N3 = S by rejection, against the exact conditional pmf (chi-square)."""
    m2, m3 = NoiseModel.of(DG, 30.0), NoiseModel.of(GEO, geometric_variance(3.0))
    y2, y3 = 4, 20
    rng = np.random.default_rng(5)
    for total in (0, 3, 25, 90):
        s = np.full(60_000, total)
        draws = lattice.sample_split(lambda x, t: m2.log_pmf(y2 - x) + m3.log_pmf(y3 - (t - x)), s, rng)
        n = np.arange(total + 1)
        lw = m2.log_pmf(y2 - n) + m3.log_pmf(y3 - (total - n))
        p = np.exp(lw - lw.max())
        p /= p.sum()
        counts = np.bincount(draws, minlength=total + 1)
        expected = p * draws.size
        big = expected >= 5
        chi2 = float((((counts - expected) ** 2)[big] / expected[big]).sum())
        dof = max(int(big.sum()) - 1, 1)
        assert chi2 <= dof + 6 * math.sqrt(2 * dof) + 10, (total, chi2, dof)
        assert counts[~big].sum() <= expected[~big].sum() + 6 * math.sqrt(expected[~big].sum() + 1) + 5


def _wedge_mode(x_bar: float, vx: float, y_bar: float, vy: float, b: int, tau: int) -> tuple[float, float]:
    """constrained_mode on (X, Y) in {Y >= 1, bY <= X <= tau Y}."""
    A = np.array([[0.0, 1.0], [1.0, -b], [-1.0, tau]])
    x, y = lattice.constrained_mode(np.array([x_bar, y_bar]), np.array([vx, vy]), A, np.array([1.0, 0.0, 0.0]))
    return float(x), float(y)


def test_constrained_mode_on_the_wedge() -> None:
    assert _wedge_mode(25.0, 4.0, 10.0, 4.0, 1, 10) == (25.0, 10.0)  # inside: itself
    x, y = _wedge_mode(-50.0, 4.0, 10.0, 4.0, 2, 10)  # below the band: on X = 2Y
    assert y >= 1 and x == pytest.approx(max(2 * y, 2.0))
    x, y = _wedge_mode(500.0, 1.0, 3.0, 1.0, 1, 10)  # above: near X = 10 Y
    assert x == pytest.approx(10 * y) and y > 3
    # geometric noise: the L1 fit moves the cheaper coordinate only
    A = np.array([[0.0, 1.0], [1.0, -1.0], [-1.0, 10.0]])
    x, y = lattice.constrained_mode(np.array([-40.0, 30.0]), np.array([100.0, 1.0]), A, np.array([1.0, 0.0, 0.0]),
                                    laplace=True)
    assert y == pytest.approx(30.0) and x == pytest.approx(30.0)


# --------------------------------------------------------------------------------------------
# The Census files of a real release
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,text", [
    (100000.0, "1e+05"), (123456.0, "123456"), (0.0001, "1e-04"), (0.1, "0.1"), (-5.0, "-5"), (0.0, "0"),
    (2.5384615384615383, "2.53846153846154"), (1234567.1, "1234567.1"), (1e15, "1e+15"), (123000.0, "123000"),
    (-0.00012, "-0.00012"), (1e-300, "1e-300"), (float("nan"), "NA"), (float("inf"), "Inf"), (float("-inf"), "-Inf"),
    (29564.4737645837, "29564.4737645837"), (282.821442729410, "282.82144272941"),
])
def test_numbers_are_written_as_r_writes_them(value: float, text: str) -> None:
    assert census.r_number(value) == text
