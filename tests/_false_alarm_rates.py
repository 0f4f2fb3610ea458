"""How the rates of ``tests/_false_alarms.py`` were computed: each statistic's law, in code.

``python -m tests._false_alarm_rates`` recomputes the rates that follow from exact laws (binomial
and Poisson-binomial counts by convolution, the noise pmfs themselves; Chernoff and Bennett
bounds) and prints them beside the registry's. The Monte Carlo estimates (the averages' coverage,
the accuracy experiment's credible intervals, the size of the chi-square goodness-of-fit tests)
come from the seeded replications of :func:`montecarlo` (``python -m tests._false_alarm_rates mc
NAME REPS SEED``): the tests' own truths, the noise drawn from the exact pmf of OpenDP's samplers
with a seeded generator, the code under test unchanged.

Not a test module: nothing here runs in the suite (the computations take minutes).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from phsafe.accounting import geometric_variance, plan_run
from phsafe.config import load_config
from phsafe.postprocess import NoiseModel, posterior_for
from tests.conftest import PR_CONFIG, REPO, US_CONFIG

DG, GEO = "Discrete Gaussian", "Two-Sided Geometric"


def pmf(dist, var, parts=1):
    """The exact noise pmf on a window holding all but < 1e-300 of its mass (sum of ``parts``
    independent noises of variance var / parts each)."""
    part_var = var / parts
    if dist == DG:
        sigma = math.sqrt(part_var)
        K = int(math.ceil(40 * sigma)) + 20
        x = np.arange(-K, K + 1)
        w = np.exp(-(x.astype(float) ** 2) / (2 * part_var))
    else:
        from phsafe.postprocess import geometric_q
        q = geometric_q(part_var)
        K = int(math.ceil(800 / -math.log(q))) + 20
        x = np.arange(-K, K + 1)
        w = q ** np.abs(x).astype(float)
    w = w / w.sum()
    out = w
    for _ in range(parts - 1):
        out = np.convolve(out, w)
    xs = np.arange(-K * parts, K * parts + 1)
    return xs, out / out.sum()


def accept_set(n, pred):
    """Counts c in 0..n for which the test's predicate (as the test computes it) holds."""
    return np.array([bool(pred(c)) for c in range(n + 1)])


def reject_prob(dist_pmf, accept):
    return float(dist_pmf[~accept].sum())


def binom_pmf(n, p):
    return stats.binom.pmf(np.arange(n + 1), n, p)


def conv_all(pmfs):
    out = np.array([1.0])
    for q in pmfs:
        out = np.convolve(out, q)
    return out


def poisson_binomial(ps):
    """Exact pmf of a sum of independent Bernoullis (grouped by equal p: binomials convolved)."""
    ps = np.asarray(ps)
    vals, counts = np.unique(np.round(ps, 15), return_counts=True)
    out = np.array([1.0])
    for p, k in zip(vals, counts):
        out = np.convolve(out, binom_pmf(int(k), float(min(max(p, 0.0), 1.0))))
        out = np.maximum(out, 0)
    return out / out.sum()


def chernoff_upper(values, probs, n, t, lmax=50.0):
    """P(sum of n iid V >= n t) <= min_l exp(n (log E e^{lV} - l t)) (values on a finite support)."""
    from scipy.special import logsumexp
    keep = probs > 0
    v, lp = values[keep], np.log(probs[keep])
    def f(l):
        return n * float(logsumexp(lp + l * (v - t)))
    res = optimize.minimize_scalar(f, bounds=(0, lmax), method="bounded")
    return math.exp(min(0.0, res.fun))


def chernoff_lower(values, probs, n, t):
    return chernoff_upper(-values, probs, n, -t)


def noise_is_not_seeded():
    x, p = pmf(DG, 4.0)  # sigma^2 = 2^2 / (2 * 0.5)
    n = 2000
    x = x.astype(float)
    parts = {
        "a == b": float(np.sum(p**2)) ** n,
        "all zero": float(p[x == 0][0]) ** n,
        "none < 0": float(p[x >= 0].sum()) ** n,
        "none > 0": float(p[x <= 0].sum()) ** n,
        # |std - 2| < 0.3: std >= 2.3 needs mean(X^2) >= 5.29; std <= 1.7 needs mean(X^2) <= 2.89 + mean(X)^2,
        # i.e. mean(X^2) <= 3.2 or |mean(X)| >= sqrt(0.31)
        "std >= 2.3": chernoff_upper(x**2, p, n, 5.29, lmax=0.1),
        "std <= 1.7": chernoff_lower(x**2, p, n, 3.2) + 2 * chernoff_upper(x, p, n, math.sqrt(0.31)),
    }
    return sum(parts.values()), parts


def large_counts():
    q = math.exp(-1.0)  # s = Delta / epsilon = 2 / 2
    per = 2 * q**100 / (1 + q)  # P(|Z| >= 100)
    return 3 * per, {"per cell": per}


def pearson_bins(n, p):
    """The chi-square helper's bins (tests/unit/test_noise.py::chi_square_pvalue): index edges."""
    expected = n * p
    edges, acc = [0], 0.0
    for i, e in enumerate(expected):
        acc += e
        if acc >= 5:
            edges.append(i + 1)
            acc = 0.0
    if edges[-1] != len(p):
        edges[-1] = len(p)
    return np.array(edges)


def gof_power_miss(dist, var_true, factor, n=200_000, alpha=1e-6):
    """P(the test does not reject the pmf at `factor` x the scale) when the sample is of the true
    pmf: X2 >= (O_S - n q_S)^2 / (n q_S (1 - q_S)) for a union S of the test's bins (Cauchy-Schwarz:
    merging bins never raises X2), O_S ~ Binomial(n, p_S) exactly; best S among central intervals."""
    k, p = pmf(dist, var_true)
    var_wrong = var_true * factor**2 if dist == DG else None
    if dist == DG:
        k2, q = pmf(DG, var_wrong)
    else:
        # the geometric at factor x the scale s
        from phsafe.postprocess import geometric_q
        s = -1 / math.log(geometric_q(var_true))
        k2, q = pmf(GEO, geometric_variance(s * factor))
    edges = pearson_bins(n, q)
    crit = stats.chi2.isf(alpha, len(edges) - 2)
    best = 1.0
    starts = k2[edges[:-1]]  # first value of each bin
    ends = k2[edges[1:] - 1]
    p_at = dict(zip(k.tolist(), p.tolist()))
    cum_p = np.cumsum(p)
    def p_range(a, b):  # P(a <= Z <= b) under the true pmf
        i = np.searchsorted(k, a); j = np.searchsorted(k, b, side="right") - 1
        return float(cum_p[j] - (cum_p[i - 1] if i > 0 else 0.0))
    cum_q = np.cumsum(q)
    def q_range(a, b):
        i = np.searchsorted(k2, a); j = np.searchsorted(k2, b, side="right") - 1
        return float(cum_q[j] - (cum_q[i - 1] if i > 0 else 0.0))
    for m in np.unique(np.geomspace(1, max(2, ends.max()), 200).astype(int)):
        inside = (starts >= -m) & (ends <= m)
        if not inside.any():
            continue
        a, b = starts[inside].min(), ends[inside].max()
        if not np.all(np.diff(np.flatnonzero(inside)) == 1):
            continue
        qs, ps = q_range(a, b), p_range(a, b)
        if not 0 < qs < 1:
            continue
        h = math.sqrt(crit * n * qs * (1 - qs))
        lo, hi = math.ceil(n * qs - h), math.floor(n * qs + h)
        miss = float(stats.binom.cdf(hi, n, ps) - stats.binom.cdf(lo - 1, n, ps))
        best = min(best, miss)
    return best


def gof_power():
    cases = {"DG 22/0.016371": (DG, 22**2 / (2 * 0.016371)), "DG 2/0.5": (DG, 4.0),
             "GEO 12/0.33": (GEO, geometric_variance(12 / 0.33)), "GEO 2/1": (GEO, geometric_variance(2.0))}
    out = {}
    for key, (dist, var) in cases.items():
        for f in (0.7, 1.3):
            out[(key, f)] = gof_power_miss(dist, var, f)
    return sum(out.values()), out


def count_et_system(alpha=1e-6):
    """test_count_interval_coverage_within_its_binomial_tolerance: Binomial(4000, expected) outside
    [ppf(alpha/2), isf(alpha/2)], for each distribution."""
    out = {}
    for dist, var in ((DG, 49.0), (GEO, geometric_variance(3.0))):
        post = posterior_for(NoiseModel.of(dist, var))
        y = np.array([5000])
        s = post.summarize(y)
        q05, q95 = int(s.et_lower[0] - y[0]), int(s.et_upper[0] - y[0])
        expected = float(post.pmf[(post.x >= -q95) & (post.x <= -q05)].sum())
        lo, hi = int(stats.binom.ppf(alpha / 2, 4000, expected)), int(stats.binom.isf(alpha / 2, 4000, expected))
        rate = float(stats.binom.cdf(lo - 1, 4000, expected) + stats.binom.sf(hi, 4000, expected))
        out[dist] = (rate, expected, lo, hi)
    return sum(v[0] for v in out.values()), out


def moe_fast_restated(tail=5e-7):
    """The restated test: the covered count within the central interval of its exact law (a sum of
    three binomials) with at most `tail` in each tail."""
    plan = plan_run(load_config(US_CONFIG))
    variances = sorted({m.variance for m in plan.measurements})[:3]
    dist = conv_all([binom_pmf(8000, float(pmf(DG, v)[1][np.abs(pmf(DG, v)[0]) <= 1.645 * math.sqrt(v)].sum()))
                     for v in variances])
    cdf = np.cumsum(dist)
    lo = int(np.searchsorted(cdf, tail))  # smallest k with P(X <= k) >= tail: P(X < lo) < tail
    sf = 1 - cdf
    hi = int(np.argmax(sf <= tail))
    return float(cdf[lo - 1] + sf[hi]), {"lo": lo, "hi": hi, "n": 24000}


def zero_rows(config, trials=1, filter_states=None):
    """P(some table x level row has all its noise draws 0) <= sum over rows of prod P(Z = 0)."""
    import json
    from phsafe.config import parse_config
    raw = json.loads(open(config).read())
    if filter_states is not None:
        raw["state_filter"] = filter_states
    plan = plan_run(parse_config(raw))
    out = {}
    for m in plan.measurements:
        x, p = pmf(m.distribution.value, m.variance)
        out[m.key] = float(p[x == 0][0]) ** (m.n_cells * trials)
    return sum(out.values()), dict(sorted(out.items(), key=lambda kv: -kv[1])[:5])


def measured_cells(config):
    """(distribution, variance) of every measured cell of a config's release (noiseless left out)."""
    plan = plan_run(load_config(config))
    return [(m.distribution.value, m.variance, m.n_cells, m.key) for m in plan.measurements if m.variance > 0]


def moe_p(dist, var, widen=1):
    """P(|Z| <= 1.645 sqrt(var)) for Z the cell's noise, or the sum of `widen` such noises."""
    x, p = pmf(dist, var * widen, widen)
    return float(p[np.abs(x) <= 1.645 * math.sqrt(var)].sum())


def rehearsal_pooled(trials, lo, hi, widen=1, strict=True):
    out = {}
    for label, cfg in (("us", US_CONFIG), ("pr", PR_CONFIG)):
        ps = []
        for dist, var, n, _ in measured_cells(cfg):
            ps += [moe_p(dist, var, widen)] * (n * trials)
        d = poisson_binomial(ps)
        N = len(ps)
        accept = accept_set(N, (lambda c: lo < float(c / N) < hi) if strict else (lambda c: lo <= float(c / N) <= hi))
        out[label] = (reject_prob(d, accept), N, float(np.mean(ps)))
    return out


def bennett(x, V, M):
    """P(S - ES >= x) <= exp(-(V / M^2) h(M x / V)), h(u) = (1 + u) log(1 + u) - u (Bennett), for a sum of
    independent terms each at most M above its mean, with total variance at most V."""
    if x <= 0:
        return 1.0
    u = M * x / V
    return math.exp(-(V / M**2) * ((1 + u) * math.log1p(u) - u))


def moe_full2(n=120_000):
    variances = sorted({m.variance for m in plan_run(load_config(US_CONFIG)).measurements})
    cases = [(DG, v) for v in variances] + [(GEO, geometric_variance(s)) for s in (2.0, 10.0, 55.0)]
    out = {}
    ks = np.arange(n + 1)
    accept = (0.888 <= ks / n) & (ks / n <= 0.915)
    for dist, v in cases:
        x, p = pmf(dist, v)
        cov = float(p[np.abs(x) <= 1.645 * math.sqrt(v)].sum())
        out[(dist, round(v, 3))] = (float(stats.binom.pmf(ks[~accept], n, cov).sum()), cov)
    return sum(r for r, _ in out.values()), out


def window_coverage(post, truths):
    """Exact HPD coverage of each truth, over the posterior's noise window (the pmf's mass outside it,
    at most 5e-13, counted as not covering: a lower bound of each p, within 5e-13)."""
    x, p = post.x, post.pmf
    cov = {}
    for t in np.unique(truths):
        s = post.summarize(t + x)
        cov[int(t)] = float(p[(s.lower <= t) & (t <= s.upper)].sum())
    return np.array([cov[int(t)] for t in truths])


def credible_full2(far_n=40_000):
    from phsafe import postprocess as pp
    rng = np.random.default_rng(7)
    out = {}
    for distribution, scale, variance, parts in ((DG, 41.345, 41.345**2, 1), (DG, 3.0, 9.0, 1),
                                                 (GEO, 12.0, geometric_variance(12.0), 1), (DG, 41.345, 2 * 41.345**2, 2)):
        sd = math.sqrt(variance)
        truths = np.concatenate([np.zeros(6000, np.int64), rng.integers(0, int(4 * sd) + 1, 24_000),
                                 rng.integers(int(6 * sd), int(40 * sd), far_n)])
        post = posterior_for(NoiseModel.of(distribution, variance, parts))
        ps = window_coverage(post, truths)
        lo, hi = pp.hpd_rows(post.pmf)
        exact_far = float(post.pmf[lo[0]: hi[0] + 1].sum())
        r = {}
        for name, sl, pred in (("pooled", slice(None), lambda k, n: (0.89 <= k / n) & (k / n <= 0.95)),
                               ("zero", slice(0, 6000), lambda k, n: k / n >= 0.89),
                               ("near", slice(6000, 30000), lambda k, n: (0.88 <= k / n) & (k / n <= 0.96)),
                               ("far", slice(30000, None), lambda k, n: np.abs(k / n - exact_far) <= 0.012)):
            sub = ps[sl]
            d = poisson_binomial(sub)
            n = sub.size
            k = np.arange(n + 1)
            r[name] = (float(d[~pred(k, n)].sum()), float(sub.mean()))
        r["exact_far"] = exact_far
        out[f"{distribution} scale={scale} parts={parts}"] = r
    total = sum(v[0] for r in out.values() for k, v in r.items() if k != "exact_far")
    return total, out


def demo_measured(trials=8, lo=0.885, hi=0.915):
    ps = []
    for dist, var, n, _ in measured_cells(str(REPO / "demo" / "data" / "us" / "config.json")):
        ps += [moe_p(dist, var)] * (n * trials)
    d = poisson_binomial(ps)
    N = len(ps)
    k = np.arange(N + 1)
    return float(d[~((lo <= k / N) & (k / N <= hi))].sum()), N, float(np.mean(ps))


def averages_info(a, z=3.29):
    """As averages_from_mc, from an array (replicates, groups, cells)."""
    R, G, c = a.shape
    Cg = a.sum(axis=2)
    m = Cg.mean(axis=1)
    vbar = (Cg**2).mean(axis=1) - m**2
    mu_g = Cg.mean(axis=0)
    mean, se = m.mean(), m.std(ddof=1) / math.sqrt(R)
    return dict(R=R, G=G, cells=c, stat_mean=mean / c, stat_lo=(mean - z * se) / c, stat_hi=(mean + z * se) / c,
                var_per_group_hi=vbar.mean() + z * vbar.std(ddof=1) / math.sqrt(R), min_mu_g=mu_g.min(),
                max_mu_g=mu_g.max(), stat_sd=a.mean(axis=(1, 2)).std(ddof=1))


def band_rate(info, lo, hi):
    G, c = info["G"], info["cells"]
    V = G * info["var_per_group_hi"]
    low = bennett((info["stat_lo"] - lo) * G * c, V, info["max_mu_g"])
    high = bennett((hi - info["stat_hi"]) * G * c, V, c - info["min_mu_g"])
    return low + high, low, high


def per_cell_binomial(a, lo_k, hi_k, z=3.29):
    """Per cell: the covered count over independent groups, a Poisson-binomial whose tails the binomial at its
    mean dominates (Hoeffding 1956); the mean at the ends of its 99.9% interval from the replications."""
    R, G, c = a.shape
    out = []
    for j in range(c):
        per = a[:, :, j].mean(axis=1)
        m, se = per.mean(), per.std(ddof=1) / math.sqrt(R)
        plo, phi = m - z * se, m + z * se
        out.append((float(stats.binom.cdf(lo_k - 1, G, plo)), float(stats.binom.sf(hi_k, G, phi)), m, plo, phi))
    return out


# --------------------------------------------------------------------------------------------
# Monte Carlo replications (seeded)
# --------------------------------------------------------------------------------------------


def exact_sampler(rng: np.random.Generator, dist: str, var: float):  # type: ignore[no-untyped-def]
    """Draws of the exact noise law (the law of OpenDP's sampler) from a seeded generator."""
    x, p = pmf(dist, var)
    cdf = np.cumsum(p)
    return lambda size: x[np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), x.size - 1)]


def average_cases(which: str) -> dict:
    """The averages' coverage tests' truths, as each test draws them (its seeds)."""
    if which == "unit_fast":  # tests/unit/test_postprocess.py::test_average_intervals_cover_about_90_percent_fast
        rng = np.random.default_rng(3)
        den = rng.integers(1, 200, 300)
        kids = rng.binomial(den * 2, 0.3)
        adults = np.minimum(den + rng.binomial(den, 0.8), 10 * den - kids)
        return dict(num=np.stack([kids, adults], 1), den=den, s_num=10.0, s_den=10.0, rng_seed=4,
                    truth=np.stack([(kids + adults) / den, kids / den, adults / den], 1))
    if which == "system_600":  # tests/system/test_estimate_coverage.py::test_average_interval_coverage_...
        rng = np.random.default_rng(12)
        h = rng.integers(1, 120, 600)
        s = np.array([rng.integers(v, 10 * v + 1) for v in h])
        n2 = np.array([rng.integers(0, v + 1) for v in s])
        return dict(num=np.stack([n2, s - n2], 1), den=h, s_num=3.0, s_den=2.0, rng_seed=4,
                    truth=np.stack([s / h, n2 / h, (s - n2) / h], 1))
    # system_full: tests/system/test_postprocess_coverage.py::test_average_coverage_full_simulation
    rng = np.random.default_rng(9)
    den = np.concatenate([rng.integers(1, 50, 750), rng.integers(50, 3000, 750)])
    kids = rng.binomial(den * 2, 0.3)
    adults = np.minimum(den + rng.binomial(den, 0.8), 10 * den - kids)
    return dict(num=np.stack([kids, adults], 1), den=den, s_num=41.345, s_den=41.345, rng_seed=10,
                truth=np.stack([(kids + adults) / den, kids / den, adults / den], 1))


def average_replicates(which: str, reps: int, seed: int) -> np.ndarray:
    """Coverage indicators (replicate, group, cell) of an averages' test, its noise re-drawn."""
    import pandas as pd

    from phsafe.postprocess import RATIO_SHELLS, ratio_table

    case = average_cases(which)
    rng = np.random.default_rng([20261206, seed])
    g = case["den"].size
    ids = [f"{i:05d}" for i in range(g)]

    def frame(table: str, cells: list[int], truth: np.ndarray, sigma: float) -> pd.DataFrame:
        rows = len(cells) * g
        return pd.DataFrame({"REGION_ID": np.repeat(ids, len(cells)), "REGION_TYPE": "STATE", "ITERATION_CODE": "*",
                             f"{table.upper()}_DATA_CELL": np.tile(cells, g),
                             "COUNT": np.asarray(truth).ravel() + exact_sampler(rng, DG, sigma**2)(rows),
                             "NOISE_DISTRIBUTION": DG, "VARIANCE": sigma**2})

    out = []
    for _ in range(reps):
        num = frame("PH1_num", [2, 3], case["num"], case["s_num"])
        den = frame("PH1_denom", [1], case["den"][:, None], case["s_den"])
        res = ratio_table(RATIO_SHELLS["PH1"], num, den, {"PH1_num": 10}, rng=np.random.default_rng(case["rng_seed"]))
        t = case["truth"].ravel()
        out.append(((res["CI90_LOWER"] <= t) & (t <= res["CI90_UPPER"])).to_numpy().reshape(-1, 3))
    return np.array(out)


def gof_size(case: str, reps: int, seed: int) -> tuple[int, int]:
    """Exceedances of chi2.isf(1e-6) by Pearson's statistic of the goodness-of-fit tests
    (tests/unit/test_noise.py), 200,000 draws of the exact pmf binned as the test bins them."""
    cases = {"DG 22/0.016371": (DG, 22**2 / (2 * 0.016371)), "DG 2/0.5": (DG, 4.0),
             "GEO 12/0.33": (GEO, geometric_variance(12 / 0.33)), "GEO 2/1": (GEO, geometric_variance(2.0))}
    dist, var = cases[case]
    _, p = pmf(dist, var)
    n = 200_000
    edges = pearson_bins(n, p)
    probs = np.add.reduceat(p, edges[:-1])
    expected = n * probs
    crit = stats.chi2.isf(1e-6, len(expected) - 1)
    rng = np.random.default_rng([77, seed])
    exceed = done = 0
    while done < reps:
        m = min(20_000, reps - done)
        counts = rng.multinomial(n, probs / probs.sum(), size=m)
        exceed += int(((((counts - expected) ** 2) / expected).sum(axis=1) > crit).sum())
        done += m
    return exceed, done


def demo_replicates(reps: int, seed: int) -> list[dict]:
    """tests/system/test_accuracy.py::test_coverage_on_the_demo_data, one trial a replicate: the
    experiment as the test runs it, a fresh truncation key each, the noise from the exact pmfs by
    a seeded generator in place of OpenDP's (the same law)."""
    import tempfile

    from phsafe import noise
    from phsafe.accuracy import run_accuracy
    from phsafe.config import PrivacyDefinition

    rng = np.random.default_rng([424242, seed])

    def mechanism(m):  # type: ignore[no-untyped-def]
        draw = exact_sampler(rng, DG if m.privacy_defn is PrivacyDefinition.ZCDP else GEO, m.variance)
        return (lambda values: (np.asarray(values, dtype=np.int64) + draw(len(values))).tolist()), 0.0

    noise._build_mechanism = mechanism
    demo = REPO / "demo" / "data" / "us"
    rows = []
    for _ in range(reps):
        out = Path(tempfile.mkdtemp()) / "acc"
        res = run_accuracy(demo / "config.json", demo, out, trials=1, non_confidential=True, draws=1000,
                           seed=int(rng.integers(2**31)), plots=False, compare_production=False)
        rows.append(dict(ci90=float(res.metrics.set_index("TABLE").loc["ALL", "CI90_COVERAGE"]),
                         avg=float(res.average_metrics.set_index("TABLE").loc["ALL", "CI90_COVERAGE"])))
    return rows


def montecarlo(name: str, reps: int, seed: int) -> None:
    if name in ("unit_fast", "system_600", "system_full"):
        np.save(f"{name}_{seed}.npy", average_replicates(name, reps, seed))
    elif name == "demo":
        print(json.dumps(demo_replicates(reps, seed)))
    else:
        print(name, gof_size(name, reps, seed))


if __name__ == "__main__":
    if sys.argv[1:2] == ["mc"]:
        montecarlo(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        for f in (noise_is_not_seeded, large_counts, moe_fast_restated, count_et_system, moe_full2, credible_full2):
            print(f.__name__, f())
        print("rehearsal pooled", rehearsal_pooled(2, 0.85, 0.95), rehearsal_pooled(2, 0.80, 0.98))
        print("rehearsal, twice the variance", rehearsal_pooled(1, -1, 0.8, widen=2), rehearsal_pooled(1, -1, 0.9, widen=2))
        print("demo measured pooled", demo_measured(8, 0.88, 0.92))
        print("accuracy bounds: rows of zero noise", zero_rows(str(US_CONFIG), 1, ["01", "02"]))
