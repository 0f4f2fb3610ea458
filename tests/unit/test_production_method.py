"""The re-implementation of the Census Bureau's production method (accuracy comparison only),
and the comparison's verdicts.

* the truncated-normal mean, quantiles and draws against scipy's truncnorm, and the production's
  formula failing where the spec says it does (Z far below 0);
* the truncated standard normal sampler far in a tail;
* the Gibbs sampler against exact answers: independent truncated normals (a box), and a wedge
  (PH8's polytope) against rejection sampling of the untruncated normal;
* a model whose polytope is empty is marked failed, the others fitted;
* a count table: marginal PRED = the sum of rounded internal PREDs, floor/ceiling intervals;
* the comparison's coverage, length, out-of-bounds and failed verdicts on planted rows.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from phsafe.accuracy import production as prod
from phsafe.accuracy.comparison import compare_trial, comparison_metrics, side_by_side
from phsafe.postprocess.polytope import own_denominator_polytope, shared_denominator_polytope


def test_truncated_normal_mean_and_quantiles_equal_scipy() -> None:
    z = np.array([-30.0, -5.0, 0.0, 7.0, 120.0])
    sigma = np.array([10.0, 4.0, 3.0, 2.0, 50.0])
    a = -z / sigma
    dist = stats.truncnorm(a, np.inf, loc=z, scale=sigma)
    np.testing.assert_allclose(prod.truncated_normal_mean(z, sigma), dist.mean(), rtol=1e-9)
    for p in (0.05, 0.5, 0.95):
        np.testing.assert_allclose(prod.truncated_normal_quantile(z, sigma, p), dist.ppf(p), rtol=1e-8, atol=1e-9)
    # far in the tail the quantile stays exact -- N(-200, 10^2) on [0, inf) is nearly exponential
    # with rate 200 / 10^2, its 95% quantile ln(20) / 2 -- the production's mean formula does not
    far = prod.truncated_normal_quantile(np.array([-200.0]), np.array([10.0]), 0.95)
    assert far[0] == pytest.approx(math.log(20) / 2, rel=0.01)
    assert not np.isfinite(prod.truncated_normal_mean(np.array([-200.0]), np.array([10.0]))).all()


def test_truncated_normal_draws_follow_their_law() -> None:
    rng = np.random.default_rng(3)
    z, sigma = np.array([-12.0, 40.0]), np.array([6.0, 9.0])
    draws = prod.sample_truncated_normal(z, sigma, 40_000, rng)
    assert (draws >= 0).all()
    for i in range(2):
        law = stats.truncnorm(-z[i] / sigma[i], np.inf, loc=z[i], scale=sigma[i])
        assert stats.kstest(draws[i], law.cdf).pvalue > 1e-4


def test_truncated_standard_normal_far_in_a_tail() -> None:
    rng = np.random.default_rng(4)
    u = rng.random(20_000)
    for lo, hi in ((40.0, 41.0), (-41.0, -40.0), (-1.0, 2.0), (3.0, np.inf), (-np.inf, -3.0)):
        x = prod._truncated_standard_normal(np.full(u.size, lo), np.full(u.size, hi), u)
        assert np.isfinite(x).all() and (x >= lo).all() and (x <= hi).all(), (lo, hi)
        assert stats.kstest(x, stats.truncnorm(lo, hi).cdf).pvalue > 1e-4, (lo, hi)


def test_gibbs_on_a_box_equals_independent_truncated_normals() -> None:
    """Rows y1 >= 0, 1 <= y2 <= 6: the coordinates are independent truncated normals."""
    z = np.array([[-2.0, 4.0], [5.0, 0.5]])
    v = np.array([[9.0, 4.0], [1.0, 1.0]])
    A = np.broadcast_to(np.array([[1.0, 0.0], [0.0, 1.0]]), (2, 2, 2))
    lower, upper = np.array([[0.0, 1.0]] * 2), np.array([[np.inf, 6.0]] * 2)
    start = np.array([[1.0, 3.0], [5.0, 1.5]])
    y = prod.gibbs_truncated_normal(z, np.sqrt(v), A, lower, upper, start, np.random.default_rng(5), draws=8000)
    assert y.shape == (8000, 2, 2)
    for g in range(2):
        for j, (lo, hi) in enumerate(((0.0, np.inf), (1.0, 6.0))):
            s = math.sqrt(v[g, j])
            law = stats.truncnorm((lo - z[g, j]) / s, (hi - z[g, j]) / s, loc=z[g, j], scale=s)
            assert abs(y[:, g, j].mean() - law.mean()) <= 5 * law.std() / math.sqrt(8000 / 4)


def test_gibbs_on_the_wedge_equals_rejection_sampling() -> None:
    """PH8's polytope (U >= 1, U <= P <= 10 U) with noisy values that press on it: the ratio's
    mean and 5%/95% quantiles from the Gibbs draws against exact rejection draws."""
    num, vn, den, vd = np.array([6.0]), np.array([16.0]), np.array([5.0]), np.array([9.0])
    poly = own_denominator_polytope(num, vn, den, vd, 10)
    [y] = prod.fit_models([(np.stack([num, den], 1), np.stack([vn, vd], 1), poly)], np.random.default_rng(6),
                          draws=6000)
    ratio = y[:, 0, 0] / y[:, 0, 1]
    rng = np.random.default_rng(7)
    p = rng.normal(num[0], 4.0, 3_000_000)
    u = rng.normal(den[0], 3.0, 3_000_000)
    ok = (poly.lower[0, None, :] <= np.stack([u, p - u, 10 * u - p], 1)).all(1) & \
        (np.stack([u, p - u, 10 * u - p], 1) <= poly.upper[0, None, :]).all(1)
    exact = p[ok] / u[ok]
    spread = exact.std()
    assert abs(ratio.mean() - exact.mean()) <= 0.1 * spread
    for q in (0.05, 0.95):
        assert abs(np.quantile(ratio, q) - np.quantile(exact, q)) <= 0.15 * spread
    assert (ratio >= 1 - 1e-9).all() and (ratio <= 10 + 1e-9).all()


def test_an_empty_polytope_is_a_failed_model_and_the_others_are_fitted() -> None:
    """PH5 with a numerator far below two persons per family (the production stops on it)."""
    n2, n3, d = np.array([-80.0, 15.0]), np.array([-40.0, 40.0]), np.array([90.0, 20.0])
    v, vd = np.array([100.0, 100.0]), np.array([4.0, 4.0])
    poly = shared_denominator_polytope(n2, v, n3, v, d, vd, 2, 10)
    [y] = prod.fit_models([(np.stack([n2, n3, d], 1), np.stack([v, v, vd], 1), poly)], np.random.default_rng(8),
                          draws=500)
    assert np.isnan(y[:, 0]).all() and np.isfinite(y[:, 1]).all()
    ratio = (y[:, 1, 0] + y[:, 1, 1]) / y[:, 1, 2]
    assert (ratio >= 2 - 1e-9).all() and (ratio <= 10 + 1e-9).all()


def test_count_table_marginals_sum_rounded_parts() -> None:
    frame = pd.DataFrame({
        "REGION_ID": ["01"] * 3 + ["06"] * 3, "REGION_TYPE": "STATE", "ITERATION_CODE": "*",
        "PH7_DATA_CELL": [2, 3, 4] * 2, "COUNT": [10, -3, 250, 0, 1, 2], "NOISE_DISTRIBUTION": "Discrete Gaussian",
        "VARIANCE": [25.0, 25.0, 25.0, 400.0, 400.0, 400.0],
    })
    out = prod.count_table_estimates(frame, "PH7", np.random.default_rng(9), draws=20_000)
    released, built = out[~out["MARGINAL"]], out[out["MARGINAL"]]
    assert len(built) == 2 and (built["PH7_DATA_CELL"] == 1).all()
    for (_, parts), (_, total) in zip(released.groupby("REGION_ID"), built.groupby("REGION_ID")):
        assert total["ESTIMATE"].iloc[0] == parts["ESTIMATE"].sum()
        assert total["COUNT"].iloc[0] == parts["COUNT"].sum()
    z, s = -3.0, 5.0  # cell 3 of 01
    law = stats.truncnorm(-z / s, np.inf, loc=z, scale=s)
    row = released.iloc[1]
    assert row["ESTIMATE"] == np.round(law.mean())
    assert (row["CI90_ET_LOWER"], row["CI90_ET_UPPER"]) == (math.floor(law.ppf(0.05)), math.ceil(law.ppf(0.95)))
    assert (out[["ESTIMATE", "CI90_ET_LOWER", "CI90_ET_UPPER"]] >= 0).all().all()


def _census(table: str, cells: list[int], est: list[float], lo: list[float], hi: list[float]) -> pd.DataFrame:
    n = len(cells)
    columns = ("RATIO_PRED", "RATIO_PRED_LO", "RATIO_PRED_HI") if table in ("PH1", "PH5", "PH8") else \
        ("PRED", "PRED_LO", "PRED_HI")
    return pd.DataFrame({"GEOID": ["01"] * n, "REGION_TYPE": "STATE", "ITERATION_CODE": "*", "DATA_CELL": cells,
                         columns[0]: est, columns[1]: lo, columns[2]: hi})


def test_comparison_verdicts_on_planted_rows() -> None:
    ours = {"PH5": _census("PH5", [1, 2, 3], [2.5, 0.4, 2.1], [2.0, 0.1, 1.5], [3.0, 0.8, 2.6]),
            "PH4": _census("PH4", [1, 2, 3], [50, 20, 30], [40, 10, 25], [60, 30, 35])}
    production = {"PH5": _census("PH5", [1, 2, 3], [1.8, np.nan, 11.0], [1.5, np.nan, 9.0], [2.2, np.nan, 12.0]),
                  "PH4": _census("PH4", [1, 2, 3], [50, 20, np.inf], [40, 10, 25], [60, 30, 35])}
    truth = pd.DataFrame({"TABLE": ["PH5"] * 3 + ["PH4"] * 3, "GEOID": "01", "REGION_TYPE": "STATE",
                          "ITERATION_CODE": "*", "DATA_CELL": [1, 2, 3] * 2, "TRUTH": [2.9, 0.5, 2.0, 70, 20, 30]})
    rows = compare_trial(1, ours, production, truth, {"PH4": 10})
    got = rows.set_index(["METHOD", "TABLE", "DATA_CELL"])
    assert got.loc[("ours", "PH5", 1), "COVERED"] and not got.loc[("production", "PH5", 1), "COVERED"]
    assert got.loc[("production", "PH5", 1), "OUT_OF_BOUNDS"]  # a family average below 2
    assert got.loc[("production", "PH5", 2), "FAILED"] and not got.loc[("production", "PH5", 2), "OUT_OF_BOUNDS"]
    assert got.loc[("production", "PH5", 3), "OUT_OF_BOUNDS"]  # above tau
    assert got.loc[("production", "PH4", 3), "OUT_OF_BOUNDS"]  # not finite
    assert not got.loc[("ours", "PH4", 1), "COVERED"]  # 70 outside [40, 60]
    assert not rows.loc[rows.METHOD == "ours", "OUT_OF_BOUNDS"].any()
    metrics = comparison_metrics(rows).set_index(["TABLE", "LEVEL", "METHOD"])
    ph5 = metrics.loc[("PH5", "state_*", "production")]
    assert ph5["FAILED"] == pytest.approx(1 / 3) and ph5["OUT_OF_BOUNDS"] == pytest.approx(1.0)
    assert ph5["COVERAGE"] == pytest.approx(0.0) and ph5["MEAN_LENGTH"] == pytest.approx((0.7 + 3.0) / 2)
    assert metrics.loc[("PH4", "state_*", "ours"), "COVERAGE"] == pytest.approx(2 / 3)
    wide = side_by_side(comparison_metrics(rows))
    assert {"COVERAGE_OURS", "COVERAGE_PRODUCTION", "OUT_OF_BOUNDS_PRODUCTION", "FAILED_PRODUCTION"} <= set(wide)


def test_models_sampled_together_keep_their_own_polytopes(monkeypatch: pytest.MonkeyPatch) -> None:
    """PH1 (ratio >= 1) and PH5 (ratio >= 2) models of one dimension are sampled in one Gibbs run,
    in chunks that straddle them (CHUNK 1 and 2 here): each group's draws come back to its model,
    inside its own polytope, and an unfit group stays NaN."""
    n2, n3, d = np.array([30.0, -80.0, 12.0]), np.array([40.0, -40.0, 9.0]), np.array([20.0, 90.0, 10.0])
    v, vd = np.full(3, 25.0), np.full(3, 4.0)
    models = [(np.stack([n2, n3, d], 1), np.stack([v, v, vd], 1),
               shared_denominator_polytope(n2, v, n3, v, d, vd, b, 10)) for b in (1, 2)]
    for chunk in (1, 2):
        monkeypatch.setattr(prod, "CHUNK", chunk)
        ph1, ph5 = prod.fit_models(models, np.random.default_rng(10), draws=300)
        for y, b in ((ph1, 1), (ph5, 2)):
            assert np.isnan(y[:, 1]).all()  # noisy persons far below the families/households: no start
            for g in (0, 2):
                ratio = (y[:, g, 0] + y[:, g, 1]) / y[:, g, 2]
                assert np.isfinite(ratio).all() and (ratio >= b - 1e-9).all() and (ratio <= 10 + 1e-9).all()
        assert abs(np.mean(ph1[:, 0, 2]) - np.mean(ph1[:, 2, 2])) > 3  # the groups were not mixed up (H ~ 20 vs ~ 10)


# --------------------------------------------------------------------------------------------
# The sweep, vectorised: the same draws as the sampler written one chunk at a time
# --------------------------------------------------------------------------------------------


def _reference_truncated_standard_normal(lo: np.ndarray, hi: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The sampler as first written: both formulas for every element, one kept."""
    from scipy.special import log_ndtr, ndtr, ndtri, ndtri_exp

    with np.errstate(divide="ignore", invalid="ignore"):
        upper = lo + hi >= 0
        a, b = np.where(upper, lo, -hi), np.where(upper, hi, -lo)
        la, lb = log_ndtr(-a), log_ndtr(-b)
        x = -ndtri_exp(la + np.log1p(-u * -np.expm1(lb - la)))
        mid = (a < 0) & (b > 0)
        pa, pb = ndtr(a), ndtr(b)
        x = np.clip(np.where(mid, ndtri(pa + u * (pb - pa)), x), a, b)
    return np.where(upper, x, -x)


def _reference_gibbs(z, sd, A, lower, upper, start, rng, draws):  # type: ignore[no-untyped-def]
    """One chunk of one dimension, one coordinate of every group at a time (the production's
    sweep as first written here): the reference of the vectorised sweep."""
    groups, d = z.shape
    coef = A * sd[:, None, :]
    low, high = lower - np.einsum("grd,gd->gr", A, z), upper - np.einsum("grd,gd->gr", A, z)
    x = (start - z) / sd
    ax = np.einsum("grd,gd->gr", coef, x)
    out = np.empty((draws, groups, d))
    first = prod.GIBBS_BURN + prod.GIBBS_THIN + 1
    kept = 0
    for sweep in range(1, first + (draws - 1) * (prod.GIBBS_THIN + 1) + 1):
        u = rng.random((d, groups))
        for j in range(d):
            c = coef[:, :, j]
            rest = ax - c * x[:, j, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                a, b = (low - rest) / c, (high - rest) / c
            lo = np.max(np.where(c > 0, a, np.where(c < 0, b, -np.inf)), axis=1)
            hi = np.min(np.where(c > 0, b, np.where(c < 0, a, np.inf)), axis=1)
            new = _reference_truncated_standard_normal(lo, hi, u[j])
            ax = rest + c * new[:, None]
            x[:, j] = new
        if sweep >= first and (sweep - first) % (prod.GIBBS_THIN + 1) == 0:
            out[kept] = z + sd * x
            kept += 1
    return out


def _reference_fit(models, rng, draws):  # type: ignore[no-untyped-def]
    """fit_models as first written: each dimension in turn, its groups in chunks, each chunk
    sampled alone from the next uniforms of ``rng``."""
    from phsafe.postprocess.polytope import project

    results = [np.full((draws, *z.shape), np.nan) for z, _, _ in models]
    for d in sorted({z.shape[1] for z, _, _ in models}):
        rows = []
        for i, (z, v, poly) in enumerate(models):
            if z.shape[1] != d:
                continue
            start, feasible = project(z, poly.A, poly.lower + 0.5, poly.upper - 0.5)
            ok = np.all(poly.lower < poly.upper, axis=1) & np.all(np.isfinite(poly.upper), axis=1) & feasible
            rows += [(i, g, z[g], v[g], poly.A, poly.lower[g], poly.upper[g], start[g]) for g in np.flatnonzero(ok)]
        for first in range(0, len(rows), prod.CHUNK):  # (sd, not the variance: _sd_models)
            chunk = rows[first:first + prod.CHUNK]
            y = _reference_gibbs(*(np.stack([r[k] for r in chunk]) for k in range(2, 8)), rng=rng, draws=draws)
            for n, r in enumerate(chunk):
                results[r[0]][:, r[1]] = y[:, n]
    return results


def _mixed_models() -> list:
    """PH1 and PH5 (3 dimensions) and PH8's three models (2), with groups far inside their
    polytopes, pressing on them (negative and contradictory noisy counts: the tail formula),
    and outside the production's reach (NaN)."""
    n2 = np.array([30.0, -6.0, 12.0, 400.0, -80.0, 2.0, 0.0])
    n3 = np.array([40.0, 3.0, 9.0, 350.0, -40.0, 1.0, -2.0])
    den = np.array([20.0, 4.0, 10.0, 300.0, 90.0, 3.0, 1.0])
    v, vd = np.array([25.0, 9.0, 4.0, 400.0, 100.0, 16.0, 1.0]), np.array([4.0, 2.0, 1.0, 100.0, 4.0, 4.0, 1.0])
    models = [(np.stack([n2, n3, den], 1), np.stack([v, v, vd], 1),
               shared_denominator_polytope(n2, v, n3, v, den, vd, b, 10)) for b in (1, 2)]
    for num, d in ((n2 + n3, den), (n2, den - 1), (n3, den + 2)):
        models.append((np.stack([num, d], 1), np.stack([2 * v, vd], 1), own_denominator_polytope(num, 2 * v, d, vd, 10)))
    return models


def _sd_models(models):  # type: ignore[no-untyped-def]
    """The reference takes the sd where fit_models takes the variance."""
    return [(z, np.sqrt(v), poly) for z, v, poly in models]


@pytest.mark.parametrize("chunk", [3, 512])
def test_the_vectorised_sweep_draws_what_the_sampler_one_chunk_at_a_time_draws(monkeypatch: pytest.MonkeyPatch,
                                                                                chunk: int) -> None:
    """For a fixed seed the vectorised sweep (both dimensions and every chunk in one loop, each
    chunk with its own piece of the stream, each element's formula evaluated for it alone) gives
    the same draws, bit for bit, as the sampler as first written -- each chunk sampled alone in
    turn -- and leaves the generator where that one left it. With a bit generator that cannot
    jump ahead, the chunks are sampled one after the other: the same again."""
    monkeypatch.setattr(prod, "CHUNK", chunk)
    models = _mixed_models()
    for bit_generator in (np.random.PCG64, np.random.MT19937):
        ours_rng, reference_rng = np.random.Generator(bit_generator(21)), np.random.Generator(bit_generator(21))
        ours = prod.fit_models(models, ours_rng, draws=120)
        reference = _reference_fit(_sd_models(models), reference_rng, draws=120)
        for got, want in zip(ours, reference):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)  # NaN where the production cannot start, as the reference
        assert np.isnan(ours[0][:, 4]).all() and np.isfinite(ours[0][:, 0]).all()
        assert ours_rng.random() == reference_rng.random()


def test_the_truncated_standard_normal_evaluates_each_formula_where_it_is_used() -> None:
    """The same numbers as evaluating both formulas everywhere, on intervals on both sides of 0,
    straddling it, far in a tail and unbounded."""
    rng = np.random.default_rng(22)
    lo = rng.normal(0, 3, 3000)
    hi = lo + rng.exponential(2, 3000)
    lo = np.concatenate([lo, [-np.inf, 40.0, -41.0, 5.0, -np.inf]])
    hi = np.concatenate([hi, [np.inf, 41.0, -40.0, np.inf, -6.0]])
    u = rng.random(lo.size)
    np.testing.assert_array_equal(prod._truncated_standard_normal(lo, hi, u),
                                  _reference_truncated_standard_normal(lo, hi, u))
