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

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import phsafe
from phsafe import postprocess as pp
from phsafe.accounting import geometric_variance
from phsafe.postprocess import census, checks, lattice
from phsafe.postprocess.counts import count_estimates
from phsafe.postprocess.noise import NoiseModel
from phsafe.postprocess.ratios import Count, own_denominator_cell, ratio_table, shared_denominator_group
from phsafe.postprocess.shells import RATIO_SHELLS
from tests.conftest import PR_CONFIG, US_CONFIG
from tests.unit.test_postprocess import DG, GEO, opendp_noise

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
        _assert_cell(own_denominator_cell(ps[:1], us[:1], tau), _ratio_summary(P, U, w))
        # the total: the sums' likelihoods are the convolutions of the parts'
        gp = np.convolve(_weights(pm, p_y[0], n), _weights(pm, p_y[1], n))[:150]
        gu = np.convolve(_weights(um, u_y[0], n), _weights(um, u_y[1], n))[1:150]
        w = np.where((P >= U) & (P <= tau * U), gp[:, None] * gu[None, :], 0.0)
        _assert_cell(own_denominator_cell(ps, us, tau), _ratio_summary(P, U, w))


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
        cell = own_denominator_cell([Count(NoiseModel.of(dist, var, 2), y())], [Count(model, y())], tau)
        _assert_in_bounds(cell, 1, tau)
        cell = own_denominator_cell([Count(model, y()), Count(model, y())], [Count(model, y()), Count(model, y())], tau)
        _assert_in_bounds(cell, 1, tau)
    # counts: never negative, whatever the released value
    frame = pd.DataFrame({"REGION_ID": "01", "REGION_TYPE": "STATE", "ITERATION_CODE": "*", "PH4_DATA_CELL": [2, 3],
                          "COUNT": [-10**6, 10**6], "NOISE_DISTRIBUTION": DG, "VARIANCE": 14783.0})
    out = count_estimates(frame, "PH4")
    assert (out[["ESTIMATE", "CI90_LOWER", "CI90_ET_LOWER"]] >= 0).all().all()


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
    out = ratio_table(RATIO_SHELLS["PH5"], num, den, {"PH4": 10}).set_index("PH5_DATA_CELL")
    assert not out["PRODUCTION_FEASIBLE"].any()
    assert out.loc[1, "METHOD"] == "exact" and 2 <= out.loc[1, "CI90_LOWER"] <= out.loc[1, "ESTIMATE"] <= 10
    # and a feasible one is not flagged
    den.loc[0, "COUNT"] = 20
    num["COUNT"] = [15, 40]
    assert ratio_table(RATIO_SHELLS["PH5"], num, den, {"PH4": 10})["PRODUCTION_FEASIBLE"].all()


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

SPEC_COLUMNS = {
    "count": '"GEOID"|"REGION_TYPE"|"ITERATION_CODE"|"DATA_CELL"|"COUNT_NOISY"|"VARIANCE"|"MOE_NOISY"|"PRED"|"PRED_LO"|'
             '"PRED_HI"',
    "PH1": '"GEOID"|"REGION_TYPE"|"ITERATION_CODE"|"DATA_CELL"|"COUNT_NOISY_NUM"|"VARIANCE_NUM"|"MOE_NOISY_NUM"|'
           '"COUNT_NOISY_DENOM"|"VARIANCE_DENOM"|"MOE_NOISY_DENOM"|"RATIO_NOISY"|"RATIO_PRED"|"PRED_NUM"|"PRED_DENOM"|'
           '"RATIO_PRED_LO"|"RATIO_PRED_HI"',
    "PH8": '"GEOID"|"REGION_TYPE"|"ITERATION_CODE"|"DATA_CELL"|"COUNT_NOISY_DENOM"|"VARIANCE_DENOM"|"MOE_NOISY_DENOM"|'
           '"COUNT_NOISY_NUM"|"VARIANCE_NUM"|"MOE_NOISY_NUM"|"RATIO_NOISY"|"RATIO_PRED"|"RATIO_PRED_LO"|"RATIO_PRED_HI"',
}
ROWS_PER_GROUP = {"PH1": 3, "PH2": 13, "PH3": 10, "PH4": 3, "PH5": 3, "PH6": 21, "PH7": 4, "PH8": 3}


def _release(root: Path, config: Path, states: list[str], persons: int, seed: int, budgets) -> Path:
    """A published private release of synthetic data, its budgets replaced by ``budgets(key, b)``."""
    from phsafe import synthetic
    from phsafe import run_private

    data = root / "data"
    synthetic.write(synthetic.generate(persons, states, seed=seed), data)
    raw = json.loads(config.read_text())
    raw["state_filter"] = states
    for levels in raw["privacy_budget"].values():
        for key in levels:
            levels[key] = budgets(key, levels[key])
    if config == PR_CONFIG:
        raw["privacy_defn"] = "puredp"  # Puerto Rico in pure DP: the geometric noise
    (root / "config.json").write_text(json.dumps(raw))
    run_private(root / "config.json", data, root / "out", ledger=root / "ledger.jsonl", non_confidential=True)
    return root / "out"


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A US release (zCDP, two states, the production budgets x 40: sigma about 19 at state
    level) and a Puerto Rico one (pure DP, epsilon 2 per level), each post-processed."""
    out = {}
    for label, config, states, budgets in (
            ("us", US_CONFIG, ["01", "06"], lambda key, b: 40 * b),
            ("pr", PR_CONFIG, ["72"], lambda key, b: 0 if key.startswith("usa") else 2.0)):
        root = tmp_path_factory.mktemp(label)
        out[label] = _release(root, config, states, 900, 21, budgets)
        out[label + "-pp"] = pp.postprocess(out[label], root / "pp", seed=3).destination
    return out


def test_file_names_and_columns_exactly_as_the_spec_lists_them(releases: dict[str, Path]) -> None:
    us, pr = releases["us-pp"], releases["pr-pp"]
    expected_us = {f"PH{k}/estimates/PH{k}_{level}_trunc_normal.csv" for k in range(1, 9) for level in ("nation", "state")}
    expected_pr = {f"PH{k}/estimates/PH{k}_PR_state_trunc_normal.csv" for k in range(1, 9)}
    assert {str(p.relative_to(us)) for p in us.glob("PH*/estimates/*.csv")} == expected_us
    assert {str(p.relative_to(pr)) for p in pr.glob("PH*/estimates/*.csv")} == expected_pr
    for folder in (us, pr):
        for path in folder.glob("PH*/estimates/*.csv"):
            table = path.parent.parent.name
            header = path.read_text().splitlines()[0]
            expected = SPEC_COLUMNS["PH1"] if table in ("PH1", "PH5") else SPEC_COLUMNS.get(table, SPEC_COLUMNS["count"])
            assert header == expected, path


def test_census_files_format_and_row_order(releases: dict[str, Path]) -> None:
    release, dest = releases["us"], releases["us-pp"]
    text = (dest / "PH2/estimates/PH2_nation_trunc_normal.csv").read_text().splitlines()
    first = text[1].split("|")
    assert first[0] == '"1"' and first[1] == '"USA"' and first[2] == '"*"'  # the nation's GEOID: our departure
    assert not first[3].startswith('"') and first[3] == "2"  # numbers unquoted; the first built marginal
    for path in dest.glob("PH*/estimates/*.csv"):
        for line in path.read_text().splitlines()[1:]:
            fields = line.split("|")
            assert all(f.startswith('"') and f.endswith('"') for f in fields[:3]), line
            assert not any(f.startswith('"') for f in fields[3:]), line
            assert not any(f.endswith(".0") or ("." in f and f.endswith("0") and "e" not in f) for f in fields[3:]), line
    frames = {t: census.read_file(dest / f"{t}/estimates/{t}_state_trunc_normal.csv") for t in ROWS_PER_GROUP}
    for table, frame in frames.items():
        groups = frame.groupby(["GEOID", "ITERATION_CODE"]).size()
        assert (groups == ROWS_PER_GROUP[table]).all(), table
    # Count tables: the marginal rows first, by marginal in the spec's order, each sorted by
    # (GEOID, ITERATION_CODE); then the released rows in the private file's order.
    ph3 = frames["PH3"]
    private = pd.read_csv(release / "PH3" / "PH3.csv", sep="|", dtype=str)
    private = private[private.REGION_TYPE == "STATE"]
    built = ph3.iloc[: len(ph3) - len(private)]
    assert list(built["DATA_CELL"].drop_duplicates()) == [3, 8, 1]
    for _, block in built.groupby("DATA_CELL", sort=False):
        keys = list(zip(block["GEOID"], block["ITERATION_CODE"]))
        assert keys == sorted(keys)
    released = ph3.iloc[len(built):]
    assert list(zip(released["GEOID"], released["ITERATION_CODE"], released["DATA_CELL"])) == \
        list(zip(private["REGION_ID"], private["ITERATION_CODE"], private["PH3_DATA_CELL"].astype(int)))
    # marginal rows sum their parts' noisy counts and variances
    key = ["GEOID", "ITERATION_CODE"]
    parts = released[released["DATA_CELL"].isin([4, 5, 6, 7])].groupby(key)[["COUNT_NOISY", "VARIANCE"]].sum()
    own = built[built["DATA_CELL"] == 3].set_index(key)[["COUNT_NOISY", "VARIANCE"]]
    pd.testing.assert_frame_equal(own.sort_index(), parts.sort_index(), check_exact=False, rtol=1e-12)
    assert np.allclose(ph3["MOE_NOISY"], 1.6448536269514722 * np.sqrt(ph3["VARIANCE"]), rtol=1e-12)
    # PH1: the numerator rows (cells 2, 3), then the built totals; PH8: the denominator rows, then the totals
    for table in ("PH1", "PH5", "PH8"):
        cells = frames[table]["DATA_CELL"].to_numpy()
        n = len(cells) // 3
        assert set(cells[: 2 * n]) == {2, 3} and set(cells[2 * n:]) == {1}
    ph1 = frames["PH1"]
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.allclose(ph1["RATIO_NOISY"], ph1["COUNT_NOISY_NUM"] / ph1["COUNT_NOISY_DENOM"], equal_nan=True)
    # PRED is our posterior mean rounded, PRED_LO/HI our equal-tailed interval
    ours = pd.read_parquet(dest / "PH3.parquet")
    ours = ours[ours.REGION_TYPE == "STATE"].rename(columns={"REGION_ID": "GEOID", "PH3_DATA_CELL": "DATA_CELL"})
    merged = ph3.merge(ours, on=["GEOID", "ITERATION_CODE", "DATA_CELL"], validate="one_to_one")
    assert len(merged) == len(ph3)
    assert (merged["PRED"] == np.rint(merged["ESTIMATE"])).all()
    assert (merged["PRED_LO"] == merged["CI90_ET_LOWER"]).all() and (merged["PRED_HI"] == merged["CI90_ET_UPPER"]).all()


@pytest.mark.parametrize("value,text", [
    (100000.0, "1e+05"), (123456.0, "123456"), (0.0001, "1e-04"), (0.1, "0.1"), (-5.0, "-5"), (0.0, "0"),
    (2.5384615384615383, "2.53846153846154"), (1234567.1, "1234567.1"), (1e15, "1e+15"), (123000.0, "123000"),
    (-0.00012, "-0.00012"), (1e-300, "1e-300"), (float("nan"), "NA"), (float("inf"), "Inf"), (float("-inf"), "-Inf"),
    (29564.4737645837, "29564.4737645837"), (282.821442729410, "282.82144272941"),
])
def test_numbers_are_written_as_r_writes_them(value: float, text: str) -> None:
    assert census.r_number(value) == text


def test_read_estimates_labels_like_read_release(releases: dict[str, Path]) -> None:
    dest = releases["us-pp"]
    estimates = phsafe.read_estimates(dest)
    assert list(estimates) == ["PH1", "PH2", "PH3", "PH4", "PH5", "PH6", "PH7", "PH8"]
    ph3 = estimates["PH3"]
    assert list(ph3.columns[:8]) == ["GEOID", "GEOID_LABEL", "REGION_TYPE", "REGION_TYPE_LABEL", "ITERATION_CODE",
                                     "ITERATION_CODE_LABEL", "DATA_CELL", "DATA_CELL_LABEL"]
    assert str(ph3["PRED"].dtype) == "Int64" and ph3["DATA_CELL"].dtype == "int64"
    assert isinstance(ph3["GEOID"].dtype, pd.CategoricalDtype) and ph3["GEOID"].dtype.ordered
    nation = ph3[ph3.REGION_TYPE == "USA"]
    assert set(nation["GEOID"]) == {"1"} and set(nation["GEOID_LABEL"]) == {"United States"}
    row = ph3[(ph3.GEOID == "01") & (ph3.ITERATION_CODE == "D") & (ph3.DATA_CELL == 3)].iloc[0]
    assert row.GEOID_LABEL == "Alabama" and row.ITERATION_CODE_LABEL == "Asian alone" and row.DATA_CELL_LABEL == "Own child"
    state_file = census.read_file(dest / "PH3/estimates/PH3_state_trunc_normal.csv")
    assert ph3[ph3.REGION_TYPE == "STATE"]["PRED"].astype(int).tolist() == state_file["PRED"].astype(int).tolist()
    ours = phsafe.read_estimates(dest, files="ours", labels=False)
    assert {"PH1", "PH5", "PH8", "PH2", "PH8_denom"} <= set(ours) and "REGION_ID_LABEL" not in ours["PH2"]
    (dest / "PH3/estimates/PH3_state_trunc_normal.csv").write_text("tampered\n")
    with pytest.raises(phsafe.PHSafeError, match="differs from its SHA-256"):
        phsafe.read_estimates(dest)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def _files(dest: Path) -> dict[str, tuple[pd.DataFrame, list[str]]]:
    return {str(p.relative_to(dest)): (census.read_file(p), checks.read_header(p))
            for p in sorted(dest.glob("PH*/estimates/*.csv"))}


def test_checks_pass_on_our_files_and_fail_on_planted_violations(releases: dict[str, Path]) -> None:
    dest = releases["pr-pp"]
    bounds = checks.ratio_bounds({"PH1_num": 10, "PH4": 10, "PH7": 10})
    files = _files(dest)
    clean = checks.check_estimates(files, bounds)
    assert clean[clean.SEVERITY == checks.ERROR]["PASSED"].all()
    written = pd.read_csv(dest / "checks.csv")
    assert len(written) == len(clean) and set(written["CHECK"]) == set(clean["CHECK"])

    def failed(rel: str, plant) -> set[str]:  # the checks that fail once ``plant`` modifies a copy
        frame, header = files[rel]
        frame, header = frame.copy(), list(header)
        plant(frame, header)
        result = checks.check_estimates({rel: (frame, header)}, bounds)
        return set(result.loc[~result["PASSED"], "CHECK"])

    count = "PH3/estimates/PH3_PR_state_trunc_normal.csv"
    ratio = "PH5/estimates/PH5_PR_state_trunc_normal.csv"
    own = "PH8/estimates/PH8_PR_state_trunc_normal.csv"
    assert "pred_integer" in failed(count, lambda f, h: f.__setitem__("PRED", f["PRED"].where(f.index != 3, -2.0)))
    assert "pred_integer" in failed(count, lambda f, h: f.__setitem__("PRED", f["PRED"].where(f.index != 3, 7.5)))
    assert "within_6_sigma" in failed(count, lambda f, h: f.__setitem__(
        "PRED", f["PRED"].where(f.index != 0, f["COUNT_NOISY"] + 7 * np.sqrt(f["VARIANCE"]) + 1).round()))
    assert "interval" in failed(count, lambda f, h: f.__setitem__("PRED_LO", f["PRED_HI"] + 1))
    assert failed(count, lambda f, h: h.reverse()) == {"columns"}
    assert "ratio_range" in failed(ratio, lambda f, h: f.__setitem__("RATIO_PRED", f["RATIO_PRED"].where(f.index != 1, 11.0)))
    # a family average below 2, within the production's looser rule (>= 0): ours flags it
    below = failed(ratio, lambda f, h: f.__setitem__("RATIO_PRED_LO", f["RATIO_PRED_LO"].where(f["DATA_CELL"] != 1, 1.5)))
    assert below == {"ratio_bounds"}
    assert "ratio_range" in failed(own, lambda f, h: f.__setitem__("RATIO_PRED", f["RATIO_PRED"] * 0 + 0.5))


def test_a_failing_check_publishes_nothing(releases: dict[str, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from phsafe.postprocess import command

    real = command.count_file_frame

    def broken(table: str, estimates: pd.DataFrame) -> pd.DataFrame:
        frame = real(table, estimates)
        if table == "PH4":
            frame.loc[0, "PRED"] = -1.0  # a defect: a negative count estimate
        return frame

    monkeypatch.setattr(command, "count_file_frame", broken)
    with pytest.raises(pp.EstimateChecksFailed, match="pred_integer.*PH4"):
        pp.postprocess(releases["pr"], tmp_path / "never", seed=1)
    assert not (tmp_path / "never").exists() and not list(tmp_path.glob(".never*"))


def test_the_summary_metrics(releases: dict[str, Path]) -> None:
    dest = releases["us-pp"]
    summary = pd.read_csv(dest / "summary.csv")
    files = _files(dest)
    assert set(summary["FILE"]) == set(files) and set(summary["SOURCE"]) == {"NM", "PRED"}
    ours = summary[summary.SOURCE == "PRED"]
    assert (ours["PERCENT_OUT_OF_BOUNDS"][ours.TABLE.isin(["PH1", "PH5", "PH8"])] == 0).all()
    ph2 = files["PH2/estimates/PH2_state_trunc_normal.csv"][0]
    row = summary[(summary.FILE == "PH2/estimates/PH2_state_trunc_normal.csv") & (summary.SOURCE == "NM")].iloc[0]
    assert row["MIN"] == ph2["COUNT_NOISY"].min() and row["PERCENT_OUT_OF_BOUNDS"] == pytest.approx(
        100 * (ph2["COUNT_NOISY"] <= 0).mean())
    assert row["INTERVAL_LENGTH"] == pytest.approx(np.median(2 * ph2["MOE_NOISY"]))
    long = pd.read_csv(dest / "summary" / "out_ratio.csv")
    assert list(long.columns) == ["table", "variable", "harden"]
    assert {"ph1_nm", "ph1_pred", "ph8_pred"} <= set(long["table"]) and set(long["variable"]) == {"min", "max", "p_bad", "len"}
    report = (dest / "report.md").read_text()
    assert "Checks of the estimate files" in report and "Summary metrics" in report


# --------------------------------------------------------------------------------------------
# Coverage on synthetic data, within its binomial tolerance
# --------------------------------------------------------------------------------------------


def _binomial_interval(n: int, p: float, alpha: float = 1e-4) -> tuple[int, int]:
    from scipy.stats import binom

    return int(binom.ppf(alpha / 2, n, p)), int(binom.isf(alpha / 2, n, p))


def test_count_interval_coverage_within_its_binomial_tolerance() -> None:
    """Far from 0 the equal-tailed interval of a count is y + [q05, q95] of the noise: it covers
    the truth exactly when the noise lies in a fixed set, whose probability the noise pmf gives.
    4,000 cells, OpenDP noise; a correct computation fails this at most once in 10,000 runs."""
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
        lo, hi = _binomial_interval(truths.size, expected)
        assert lo <= covered <= hi, (dist, covered / truths.size, expected)


def test_average_interval_coverage_within_its_binomial_tolerance() -> None:
    """Truths drawn uniformly from the constrained lattice (households 1-120, PH1's band), the
    noise from OpenDP: under this prior each 90% equal-tailed interval covers with probability
    at least 0.9 (each tail holds at most 5%). 600 groups: each cell's coverage against the
    binomial tolerance of 0.9 (alpha 1e-4), and not above 0.94 (the atoms of small households
    make intervals hold a little more than 90%)."""
    rng = np.random.default_rng(12)
    groups, b, tau = 600, 1, 10
    h = rng.integers(1, 120, groups)
    s = np.array([rng.integers(b * v, tau * v + 1) for v in h])
    n2 = np.array([rng.integers(0, v + 1) for v in s])
    from tests.unit.test_postprocess import _average_frames

    num, _ = _average_frames(np.stack([n2, s - n2], 1), h[:, None], 3.0)
    _, den = _average_frames(np.stack([n2, s - n2], 1), h[:, None], 2.0)
    out = ratio_table(RATIO_SHELLS["PH1"], num, den, {"PH1_num": tau}, rng=np.random.default_rng(4))
    truth = np.stack([s / h, n2 / h, (s - n2) / h], 1).ravel()
    covered = ((out["CI90_LOWER"] <= truth) & (truth <= out["CI90_UPPER"])).to_numpy()
    lo, _ = _binomial_interval(groups, 0.9)
    for cell in range(3):
        assert lo <= covered[cell::3].sum() <= 0.94 * groups, (cell, covered[cell::3].mean())
