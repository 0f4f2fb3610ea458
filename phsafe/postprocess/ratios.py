"""Average household and family sizes (PH1, PH5, PH8): the joint posterior of numerator and
denominator under the logical constraints, on the integer lattice.

Model
    The released numerator and denominator cells are independent noisy counts (their exact
    likelihoods, :mod:`phsafe.postprocess.noise`). The prior is flat on the lattice points that
    satisfy the constraints of the Census Bureau's production model
    (``MODEL_BASED_ESTIMATES.md`` §4), which are facts about the truncated counts:

    * PH1, PH5: Y = (N2, N3, H) -- persons under 18, persons 18 and over, households (families);
      N2, N3 >= 0, H >= 1, b H <= N2 + N3 <= tau H, with b = 1 (a household has a householder)
      or 2 (a family has at least two members) and tau the run's truncation threshold of the
      numerator's person table (after truncation no household holds more than tau counted
      persons; PH5_num is PH4's counts, so PH4's tau);
    * PH8, each cell: Y = (P, U) -- persons and occupied units; U >= 1, U <= P <= tau U with
      PH7's tau (PH8_num is PH7's counts). The total (cell 1) is P2 + P3 over U2 + U3: its
      likelihood is the exact convolution of the parts' (all four released cells are used, each
      part is >= 0), under the production's constraints on the total.

    "Denominator >= 1" means the averages are conditional on being defined;
    ``P_DENOMINATOR_POSITIVE`` gives the posterior probability of that when an empty group
    (denominator 0, numerator 0) is allowed too.

What is computed, per population group and cell
    ``ESTIMATE`` the posterior mean of the ratio (as the production's ``RATIO_PRED``, the mean of
    the ratio, not a ratio of means), ``MEDIAN``, the 90% equal-tailed interval
    [Q(0.05), Q(0.95)] (``CI90_LOWER``, ``CI90_UPPER``), and the posterior means of numerator and
    denominator. The ratio's posterior lives on the rationals X / Y, where a highest-density
    interval has no meaning, so ratio intervals are equal-tailed in every file.

How
    The constraint couples the cells only through the sum S = N2 + N3 (or through P and U), so
    almost everything is a sum over one axis (:class:`phsafe.postprocess.lattice.BandedPosterior`):
    the density of S is the exact convolution of the parts' likelihoods, and
    p(S, H) ∝ g(S) d(H) on b H <= S <= tau H gives the total's ratio, the denominator's marginal,
    and -- with E[N2 | S] by another convolution -- the means of the parts' ratios. The quantiles
    of N2 / H need the joint of (N2, H) with N3 summed out: a two-dimensional lattice
    (:class:`~phsafe.postprocess.lattice.CoupledRatio`) when the constraint matters and the
    lattice holds at most ``exact_limit`` points; beyond that, ``draws`` independent exact
    draws (H and S from their exact pmfs, N2 given S by rejection) with the Monte Carlo error of
    the quantiles reported (``MC_ERROR``: the largest 95% half-width of ``MEDIAN``,
    ``CI90_LOWER``, ``CI90_UPPER``; 0 when exact). When the constraint cannot bind -- it excludes
    less than 1e-13 of the unconstrained posterior -- the cells are independent and N2 / H is a
    one-dimensional sum too.

Windows
    Sums run over windows around the mode of a Gaussian approximation on the constrained region
    (:func:`~phsafe.postprocess.lattice.constrained_mode`, every released cell a coordinate),
    wide enough for the noise's tail bound plus two standard deviations; all in log space, so
    noisy counts that contradict the constraints by any number of standard deviations still give
    a proper posterior. While an edge of a window holds more than 1e-14 of the mass, the window
    is centred again on the posterior's mode and doubled.

The production's data-dependent upper bounds (noisy + 6 sigma) are *not* used: they are not
facts about the counts, they cut off at most 1e-9 of a posterior whose tails the exact sums
already control to 1e-12, and where they contradict the lower bounds (the polytope is empty) the
production stops. Here there is always an answer; ``PRODUCTION_FEASIBLE`` is False on the rows
where the production's polytope is empty (:mod:`phsafe.postprocess.polytope`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import numpy.typing as npt
import pandas as pd

from phsafe.accounting import NoiseDistribution
from phsafe.outputs import cell_column
from phsafe.postprocess._base import GROUP_KEYS, PostprocessError
from phsafe.postprocess.counts import cell_parts
from phsafe.postprocess.lattice import (
    BANDED_EXACT_LIMIT,
    NEG_INF,
    BandedPosterior,
    CoupledRatio,
    Factor,
    LogCum,
    constrained_mode,
    convolve_factors,
    first_method,
    likelihood,
    logsumexp,
    restrict,
    sample_from_factor,
    sample_in_band,
    sample_quantiles,
    sample_split,
)
from phsafe.postprocess.noise import NoiseModel
from phsafe.postprocess.polytope import own_denominator_polytope, production_feasible, shared_denominator_polytope
from phsafe.postprocess.posterior import posterior_for
from phsafe.postprocess.shells import RATIO_CELLS, RatioShell

DEFAULT_DRAWS = 100_000
"""Independent exact draws where a two-dimensional lattice is beyond ``exact_limit``."""
DEFAULT_EXACT_LIMIT = 12_000_000
"""Largest (N2 window x H window) lattice computed exactly (about 100 MB of float64)."""
EDGE_TOLERANCE = 1e-14
INACTIVE = 1e-13  # a constraint excluding less than this of the unconstrained posterior cannot bind
UNRESOLVED = 1e-13  # largest share of a posterior that a convolution may leave unresolved
MAX_WINDOWS = 10  # attempts at a window whose edges hold no mass (each one twice as wide)
QUANTILES = (0.05, 0.5, 0.95)

AVERAGE_COLUMNS = (
    "ESTIMATE", "MEDIAN", "CI90_LOWER", "CI90_UPPER", "NUMERATOR_ESTIMATE", "DENOMINATOR_ESTIMATE",
    "P_DENOMINATOR_POSITIVE", "LOWER_BOUND", "UPPER_BOUND", "METHOD", "MC_DRAWS", "MC_ERROR",
    "PRODUCTION_FEASIBLE",
)
"""Columns of our average tables after REGION_ID, REGION_TYPE, ITERATION_CODE, <T>_DATA_CELL."""
NOISY_COLUMNS = ("COUNT_NOISY_NUM", "VARIANCE_NUM", "COUNT_NOISY_DENOM", "VARIANCE_DENOM")
"""The released values behind each ratio row (sums for a built total), for the Census files."""


@functools.lru_cache(maxsize=1 << 16)
def _posterior_mean(model: NoiseModel, y: int) -> float:
    return float(posterior_for(model).summarize([y]).mean[0])


@dataclass(frozen=True)
class Count:
    """One released (or summed) count: its noise and its observed value."""

    model: NoiseModel
    y: int

    @property
    def mean(self) -> float:
        """Posterior mean under a flat prior on {0, 1, ...} (centre of the approximations)."""
        return _posterior_mean(self.model, self.y)

    @property
    def var(self) -> float:
        return self.model.variance

    def half_width(self, mult: float) -> int:
        if self.model.is_noiseless:
            return 0
        return int(math.ceil(mult * (posterior_for(self.model).half_width + 2.0 * self.model.sd)))

    def factor(self, lo: int, hi: int) -> Factor:
        if self.model.is_noiseless:
            return restrict(Factor(self.y, np.zeros(1), float(self.model.log_pmf(np.array([0]))[0])), lo, hi)
        return likelihood(self.model, self.y, lo, hi)

    def log_weight_at(self, n: int) -> float:
        return float(self.model.log_pmf(np.array([self.y - n]))[0])


def _window(count: Count, centre: float, mult: float, floor: int) -> tuple[int, int]:
    w = count.half_width(mult)
    lo = max(floor, int(math.floor(centre)) - w)
    return lo, max(lo, int(math.ceil(centre)) + w)


def _split_centre(a: Count, b: Count, total: float) -> float:
    """Where a's part of a + b = total sits: the mode of the Gaussian approximation of the two
    likelihoods given their sum, within [0, total]."""
    va, vb = max(a.var, 1e-9), max(b.var, 1e-9)
    return min(max(a.y + (total - a.y - b.y) * va / (va + vb), 0.0), max(total, 0.0))


def _tilt(a: Count, b: Count, total: float) -> float:
    """The slope of log P(a + b = s) at s = total (minus), from the parts' likelihoods where the
    total splits: the exponential tilt that makes the sums near ``total`` the largest."""
    a_at = _split_centre(a, b, total)
    slopes, pinned = [], []
    for count, at in ((a, a_at), (b, total - a_at)):
        if count.model.is_noiseless:
            continue
        n = int(round(at))
        slope = count.log_weight_at(n + 1) - count.log_weight_at(n)
        (slopes if at > 0.5 else pinned).append(slope)
    chosen = slopes or pinned
    return -float(np.mean(chosen)) if chosen else 0.0


@dataclass
class SumFactor:
    """The log-density of a + b (each >= 0) on a window, the same weighted by each part's value
    (log g + log E[a | a + b], log g + log E[b | a + b]), and a bound of what the convolution
    could not resolve."""

    g: Factor
    cut: Factor
    weighted: tuple[Factor, Factor]


def _sum_factor(a: Count, b: Count, lo: int, hi: int, centre: float, mult: float, method: str,
                weighted: bool = False) -> SumFactor:
    """The convolution of a's and b's likelihoods on [lo, hi] (windows of the parts wide enough
    for every total there), tilted at ``centre``."""
    a_lo = _window(a, _split_centre(a, b, lo), mult, 0)[0]
    a_hi = _window(a, _split_centre(a, b, hi), mult, 0)[1]
    b_lo = _window(b, _split_centre(b, a, lo), mult, 0)[0]
    b_hi = _window(b, _split_centre(b, a, hi), mult, 0)[1]
    fa, fb = a.factor(a_lo, a_hi), b.factor(b_lo, b_hi)
    tilt = _tilt(a, b, centre)
    g, cut = convolve_factors(fa, fb, tilt, method)
    g, cut = restrict(g, lo, hi), restrict(cut, lo, hi)
    parts: tuple[Factor, Factor] = (g, g)
    if weighted:
        with np.errstate(divide="ignore"):
            log_s = np.log(g.values)
            ga = restrict(convolve_factors(fa.times(np.log(fa.values)), fb, tilt, method)[0], lo, hi)
            gb = restrict(convolve_factors(fa, fb.times(np.log(fb.values)), tilt, method)[0], lo, hi)
        # E[a | a + b = s] is in [0, s]: where g was not resolved, neither is it.
        parts = tuple(Factor(lo, np.where(np.isfinite(g.lw), np.minimum(w.lw, g.lw + log_s), NEG_INF))
                      for w in (ga, gb))  # type: ignore[assignment]
    return SumFactor(g, cut, parts)


def _laplace(*counts: Count) -> bool:
    """Whether the cells' noise is the geometric (Laplace-like tails: an L1 mode places windows)."""
    return any(c.model.distribution is NoiseDistribution.TWO_SIDED_GEOMETRIC for c in counts)


DIRECT_REFINE_LIMIT = 200_000_000
"""Largest convolution (products of the window lengths) redone by direct sums when the FFT left
too much unresolved: direct sums are quadratic, a fraction of a second at this size."""


def _method(span: int, refine: bool) -> str:
    """The convolution method for parts' windows of length at most ``span``: by size
    (:func:`~phsafe.postprocess.lattice.first_method`), or -- once the FFT left too much
    unresolved (``refine``) -- direct sums, whose precision is every sum's own down to underflow
    where the FFT's round-off is relative to the largest sum (the quadratic log-sum-exp of
    :func:`~phsafe.postprocess.lattice.convolve_factors` is not tried: what direct sums cannot
    resolve lies more than 600 nats below a tilted maximum).

    Direct sums are quadratic: not beyond :data:`DIRECT_REFINE_LIMIT`, where the FFT's result is
    kept. That happens only for a posterior spread over hundreds of thousands of values
    (geometric noise whose released counts contradict the constraints by ~10^6: every split of
    the contradiction is about equally likely); what the FFT leaves unresolved is then below
    1e-16 of the largest sum per value, far below what moves a quantile of such a spread.
    """
    if refine and span * span <= DIRECT_REFINE_LIMIT:
        return "direct"
    return first_method(span, span)


def _recentre(post: BandedPosterior, x_star: float, y_star: float) -> tuple[float, float]:
    """New window centres when the posterior reaches an edge: its modes on each axis (the
    Gaussian approximation placed the window badly, e.g. where one part of a sum is pinned
    at 0)."""
    if post.empty:
        return x_star, y_star
    return float(post.x.lo + int(np.argmax(post.x_pmf()))), float(post.y.lo + int(np.argmax(post.y_pmf())))


def _unresolved(post: BandedPosterior, bound: BandedPosterior) -> bool:
    """Whether the mass a convolution could not resolve may exceed 1e-13 of the posterior."""
    if bound.empty:
        return False
    return post.empty or bound.log_z - post.log_z > math.log(UNRESOLVED)


@dataclass
class CellResult:
    """One ratio row."""

    estimate: float = math.nan
    median: float = math.nan
    lower: float = math.nan
    upper: float = math.nan
    numerator: float = math.nan
    denominator: float = math.nan
    p_positive: float = math.nan
    method: str = "undefined"
    draws: int = 0
    mc_error: float = 0.0


def _edges_ok(post: BandedPosterior, x_floor: int, y_floor: int) -> bool:
    """Whether the windows' edges (other than the hard bounds) hold negligible mass."""
    py = post.y_pmf()
    px = post.x_pmf()
    checks = [py[-1], px[-1]]
    if post.y.lo > y_floor:
        checks.append(py[0])
    if post.x.lo > max(x_floor, post.b * post.y.lo):
        checks.append(px[0])
    return max(checks) <= EDGE_TOLERANCE


def _p_positive(post: BandedPosterior, log_w_empty: float) -> float:
    """P(denominator >= 1) when an empty group (numerator and denominator 0) is allowed too."""
    if post.empty:
        return 0.0
    log_z = post.log_z + post.offset  # both in the likelihoods' own scale
    return float(math.exp(log_z - np.logaddexp(log_z, log_w_empty)))


def _mean_in_range(mean: float, lo: float, hi: float) -> float:
    """A posterior mean of a ratio every point of whose support lies in [lo, hi]: mathematically
    in [lo, hi] too, but the log-space sums land a few units in the last place outside when the
    whole posterior sits on a bound (every family of PH5 at tau = 2 has exactly 2 persons, and the
    sums give 2.0000000000000004). Such rounding is removed; a larger miss is a fault, not rounding."""
    if math.isnan(mean):  # no mass: left for the checks to judge, as before
        return mean
    slack = 1e-9 * max(1.0, *(abs(v) for v in (lo, hi) if math.isfinite(v)))
    if not lo - slack <= mean <= hi + slack:
        raise PostprocessError(f"a posterior mean of a ratio ({mean!r}) lies outside its support [{lo}, {hi}]")
    return min(max(mean, lo), hi)


def _banded_cell(post: BandedPosterior, x_weighted: Factor, log_w_empty: float, draws: int,
                 rng: np.random.Generator) -> CellResult:
    """Total cell (or a PH8 cell): X / Y from the banded posterior; the means exact, the
    quantiles exact too unless the posterior is spread over too many rows (then drawn)."""
    if post.empty:
        return CellResult(p_positive=_p_positive(post, log_w_empty))
    q, error = post.ratio_quantiles(QUANTILES, draws, rng)
    sampled = post.support.size > BANDED_EXACT_LIMIT and draws > 0  # as ratio_quantiles decides
    high = post.tau if post.tau is not None else math.inf
    return CellResult(
        estimate=_mean_in_range(post.expect(x_weighted, 1), post.b, high), median=float(q[1]), lower=float(q[0]), upper=float(q[2]),
        numerator=post.expect(x_weighted, 0), denominator=float(post.y_pmf() @ post.y.values),
        p_positive=_p_positive(post, log_w_empty), method="sampled" if sampled else "exact",
        draws=draws if sampled else 0, mc_error=error,
    )


# --------------------------------------------------------------------------------------------
# PH1, PH5: (N2, N3, H)
# --------------------------------------------------------------------------------------------


def shared_denominator_group(
    n2: Count, n3: Count, h: Count, b: int, tau: int, *, draws: int, rng: np.random.Generator,
    exact_limit: int,
) -> tuple[CellResult, CellResult, CellResult]:
    """Cells 1 (N2 + N3) / H, 2 N2 / H and 3 N3 / H of one population group (module docstring)."""
    mode = constrained_mode(np.array([n2.y, n3.y, h.y], dtype=np.float64), np.array([n2.var, n3.var, h.var]),
                            np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, -b], [-1.0, -1.0, tau]]),
                            np.array([0.0, 0.0, 1.0, 0.0, 0.0]), laplace=_laplace(n2, n3, h))
    n2_star, n3_star, h_star = (float(v) for v in mode)
    s_star = n2_star + n3_star
    unconstrained = b * h_star < s_star - 1e-6 and s_star < tau * h_star - 1e-6  # the band is not active
    mult, refine = 1.0, False
    for _ in range(MAX_WINDOWS):
        w_s = n2.half_width(mult) + n3.half_width(mult)  # each: the tail bound + 2 sd
        h_lo, h_hi = _window(h, h_star, mult, 1)
        s_lo = max(0, int(math.floor(s_star)) - w_s, b * h_lo)
        s_hi = max(s_lo, min(int(math.ceil(s_star)) + w_s, tau * h_hi))
        span = s_hi - s_lo + 1 + 2 * w_s  # bounds the length of each part's window
        method = _method(span, refine)
        sums = _sum_factor(n2, n3, s_lo, s_hi, s_star, mult, method, weighted=True)
        g = sums.g
        d = h.factor(h_lo, h_hi)
        post = BandedPosterior(g, d, b, tau)
        if _unresolved(post, BandedPosterior(sums.cut, d, b, tau)) and _method(span, True) != method:
            refine = True
            continue
        if post.empty or _edges_ok(post, 0, 1) or (n2.model.is_noiseless and n3.model.is_noiseless
                                                  and h.model.is_noiseless):
            break
        s_star, h_star = _recentre(post, s_star, h_star)
        n2_star = _split_centre(n2, n3, s_star)
        n3_star = s_star - n2_star
        mult *= 2.0
    log_w_empty = n2.log_weight_at(0) + n3.log_weight_at(0) + h.log_weight_at(0)
    if post.empty:
        undefined = CellResult(p_positive=_p_positive(post, log_w_empty))
        return undefined, undefined, undefined
    with np.errstate(divide="ignore"):
        s_weighted = g.times(np.log(g.values))
    total = _banded_cell(post, s_weighted, log_w_empty, draws, rng)
    g2, g3 = sums.weighted  # log g + log E[N2 | S], log g + log E[N3 | S]
    parts = []
    for weighted in (g2, g3):
        parts.append(CellResult(
            estimate=_mean_in_range(post.expect(weighted, 1), 0, tau), numerator=post.expect(weighted, 0),
            denominator=total.denominator, p_positive=total.p_positive, method="exact",
        ))
    # Does the constraint bind? The share of the unconstrained posterior of (S, H) it excludes.
    log_all = LogCum(g).total + logsumexp(d.lw)
    excluded = -math.expm1(post.log_z - log_all) if math.isfinite(log_all) else 1.0
    untrimmed = s_lo == max(0, int(math.floor(s_star)) - w_s) and s_hi == int(math.ceil(s_star)) + w_s
    if unconstrained and untrimmed and excluded <= INACTIVE:
        for cell, own in zip(parts, (n2, n3)):
            c_lo, c_hi = _window(own, own.mean, mult, 0)
            q, error = BandedPosterior(own.factor(c_lo, c_hi), d, 0, None).ratio_quantiles(QUANTILES, draws, rng)
            cell.lower, cell.median, cell.upper = float(q[0]), float(q[1]), float(q[2])
            if error > 0:
                cell.method, cell.draws, cell.mc_error = "sampled", draws, error
        return total, parts[0], parts[1]
    windows = {id(n2): _window(n2, n2_star, mult, 0), id(n3): _window(n3, n3_star, mult, 0)}
    size = max((windows[id(c)][1] - windows[id(c)][0] + 1) for c in (n2, n3)) * (h_hi - h_lo + 1)
    if size <= exact_limit:
        for cell, own, other in ((parts[0], n2, n3), (parts[1], n3, n2)):
            coupled = CoupledRatio(own.factor(*windows[id(own)]), other.factor(*windows[id(other)]), d, b, tau)
            q = coupled.quantiles(QUANTILES, tau)
            cell.lower, cell.median, cell.upper = float(q[0]), float(q[1]), float(q[2])
        return total, parts[0], parts[1]
    _sample_parts(post, g, n2, n3, parts, draws, rng)
    return total, parts[0], parts[1]


def _sample_parts(post: BandedPosterior, g: Factor, n2: Count, n3: Count, parts: list[CellResult],
                  draws: int, rng: np.random.Generator) -> None:
    """Quantiles of N2 / H and N3 / H from ``draws`` independent exact draws of (N2, N3, H)."""
    h = sample_from_factor(Factor(post.y.lo, post.log_row), rng.random(draws))
    s = sample_in_band(LogCum(g), post.b * h, post.tau * h, rng.random(draws))

    def log_pmf(x: npt.NDArray[np.int64], total: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return n2.model.log_pmf(n2.y - x) + n3.model.log_pmf(n3.y - (total - x))

    x2 = sample_split(log_pmf, s, rng)
    for cell, ratio in zip(parts, (x2 / h, (s - x2) / h)):
        q, error = sample_quantiles(ratio, QUANTILES)
        cell.lower, cell.median, cell.upper = (float(v) for v in q)
        cell.method, cell.draws, cell.mc_error = "sampled", draws, error


# --------------------------------------------------------------------------------------------
# PH8: (P, U) per cell
# --------------------------------------------------------------------------------------------


def own_denominator_cell(p_parts: list[Count], u_parts: list[Count], tau: int, *, draws: int = DEFAULT_DRAWS,
                         rng: np.random.Generator | None = None) -> CellResult:
    """One PH8 cell: P / U with U >= 1, U <= P <= tau U; P and U each a released cell or the sum
    of two (the total)."""

    k_p, k_u = len(p_parts), len(u_parts)
    parts = [*p_parts, *u_parts]
    A = np.zeros((k_p + k_u + 3, k_p + k_u))
    A[: k_p + k_u] = np.eye(k_p + k_u)  # every part >= 0
    A[-3, k_p:] = 1.0  # U >= 1
    A[-2, :k_p], A[-2, k_p:] = 1.0, -1.0  # P - U >= 0
    A[-1, :k_p], A[-1, k_p:] = -1.0, tau  # tau U - P >= 0
    lower = np.zeros(A.shape[0])
    lower[-3] = 1.0
    mode = constrained_mode(np.array([c.y for c in parts], dtype=np.float64), np.array([c.var for c in parts]), A, lower,
                            laplace=_laplace(*parts))
    p_star, u_star = float(mode[:k_p].sum()), float(mode[k_p:].sum())
    mult, refine = 1.0, False

    def factor(parts: list[Count], lo: int, hi: int, centre: float) -> tuple[Factor, Factor]:
        if len(parts) == 1:
            f = parts[0].factor(lo, hi)
            return f, Factor(f.lo, np.full(f.lw.size, NEG_INF), f.offset)
        sums = _sum_factor(parts[0], parts[1], lo, hi, centre, mult, method)
        return sums.g, sums.cut

    for _ in range(MAX_WINDOWS):
        w_p = sum(c.half_width(mult) for c in p_parts)  # each: the tail bound + 2 sd
        w_u = sum(c.half_width(mult) for c in u_parts)
        u_lo, u_hi = max(1, int(math.floor(u_star)) - w_u), max(1, int(math.ceil(u_star)) + w_u)
        p_lo = max(0, int(math.floor(p_star)) - w_p, u_lo)
        p_hi = max(p_lo, min(int(math.ceil(p_star)) + w_p, tau * u_hi))
        span = max(p_hi - p_lo + 1 + 2 * w_p, u_hi - u_lo + 1 + 2 * w_u)  # bounds every part's window
        method = _method(span, refine)
        (px, px_cut), (uy, uy_cut) = factor(p_parts, p_lo, p_hi, p_star), factor(u_parts, u_lo, u_hi, u_star)
        post = BandedPosterior(px, uy, 1, tau)
        if (_unresolved(post, BandedPosterior(px_cut, uy, 1, tau))
                or _unresolved(post, BandedPosterior(px, uy_cut, 1, tau))) and _method(span, True) != method:
            refine = True
            continue
        if post.empty or _edges_ok(post, 0, 1) or all(c.model.is_noiseless for c in (*p_parts, *u_parts)):
            break
        p_star, u_star = _recentre(post, p_star, u_star)
        mult *= 2.0
    log_w_empty = sum(c.log_weight_at(0) for c in (*p_parts, *u_parts))
    with np.errstate(divide="ignore"):
        weighted = px.times(np.log(px.values))
    return _banded_cell(post, weighted, log_w_empty, draws, rng if rng is not None else np.random.default_rng())


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _counts(frame: pd.DataFrame, table: str) -> dict[tuple, dict[int, Count]]:
    """Population group -> cell -> Count, for a private table."""
    cell = cell_column(table)
    parts = cell_parts(table, frame[cell].to_numpy())
    out: dict[tuple, dict[int, Count]] = {}
    models: dict[tuple, NoiseModel] = {}
    keys = zip(*(frame[k].astype(str) for k in GROUP_KEYS), frame[cell].astype(int), frame["COUNT"].astype(int),
               frame["NOISE_DISTRIBUTION"], frame["VARIANCE"].astype(float), parts)
    for region, rtype, code, number, y, dist, var, k in keys:
        key = (dist, var, int(k) if var > 0 else 1)
        model = models.get(key) or models.setdefault(key, NoiseModel.of(*key))
        out.setdefault((region, rtype, code), {})[number] = Count(model, y)
    return out


def ratio_table(
    shell: RatioShell,
    numerator: pd.DataFrame,
    denominator: pd.DataFrame,
    tau: Mapping[str, int],
    *,
    draws: int = DEFAULT_DRAWS,
    rng: np.random.Generator | None = None,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
) -> pd.DataFrame:
    """The average table ``shell`` from the private numerator and denominator tables.

    Args:
        shell: PH1, PH5 or PH8 (:data:`phsafe.postprocess.shells.RATIO_SHELLS`).
        numerator, denominator: The private tables (with ``ITERATION_CODE``).
        tau: The run's truncation thresholds (table -> tau), from the release's manifest.
        draws: Independent draws where a lattice is beyond ``exact_limit``.
        rng: The generator of those draws.
        exact_limit: Largest two-dimensional lattice computed exactly.

    Returns:
        One row per population group present in both tables (in the numerator's order) and cell
        1, 2, 3: the group keys, ``<T>_DATA_CELL``, :data:`NOISY_COLUMNS` and
        :data:`AVERAGE_COLUMNS`.

    Raises:
        PostprocessError: No tau for the table, or a group lacks a cell.
    """
    if shell.tau_table not in tau:
        raise PostprocessError(f"{shell.name}: the release gives no tau for {shell.tau_table}")
    t = int(tau[shell.tau_table])
    b = min(shell.lower_bound, t)  # a tau below 2 truncates families to fewer than two persons
    rng = rng if rng is not None else np.random.default_rng()
    num = _counts(numerator, shell.numerator)
    den = _counts(denominator, shell.denominator)
    rows = []
    groups = [g for g in num if g in den]
    need_num, need_den = {2, 3}, ({1} if shell.shared_denominator else {2, 3})
    for group in groups:
        if not (need_num <= set(num[group]) and need_den <= set(den[group])):
            raise PostprocessError(f"{shell.name}: population group {group} lacks a cell")
    feasible = _production_feasibility(shell, [(num[g], den[g]) for g in groups], t)
    for gi, group in enumerate(groups):
        n, d = num[group], den[group]
        if shell.shared_denominator:
            results = shared_denominator_group(n[2], n[3], d[1], b, t, draws=draws, rng=rng, exact_limit=exact_limit)
            noisy = [(n[2].y + n[3].y, n[2].var + n[3].var, d[1].y, d[1].var),
                     (n[2].y, n[2].var, d[1].y, d[1].var), (n[3].y, n[3].var, d[1].y, d[1].var)]
            bounds = [(b, t), (0, t), (0, t)]
        else:
            results = (own_denominator_cell([n[2], n[3]], [d[2], d[3]], t, draws=draws, rng=rng),
                       own_denominator_cell([n[2]], [d[2]], t, draws=draws, rng=rng),
                       own_denominator_cell([n[3]], [d[3]], t, draws=draws, rng=rng))
            noisy = [(n[2].y + n[3].y, n[2].var + n[3].var, d[2].y + d[3].y, d[2].var + d[3].var),
                     (n[2].y, n[2].var, d[2].y, d[2].var), (n[3].y, n[3].var, d[3].y, d[3].var)]
            bounds = [(b, t)] * 3
        distribution = next(iter(n.values())).model.distribution.value
        for ci, (cell, r) in enumerate(zip(RATIO_CELLS, results)):
            rows.append({
                **dict(zip(GROUP_KEYS, group)), f"{shell.name}_DATA_CELL": cell,
                **dict(zip(NOISY_COLUMNS, noisy[ci])), "NOISE_DISTRIBUTION": distribution,
                "ESTIMATE": r.estimate, "MEDIAN": r.median, "CI90_LOWER": r.lower, "CI90_UPPER": r.upper,
                "NUMERATOR_ESTIMATE": r.numerator, "DENOMINATOR_ESTIMATE": r.denominator,
                "P_DENOMINATOR_POSITIVE": r.p_positive, "LOWER_BOUND": bounds[ci][0], "UPPER_BOUND": bounds[ci][1],
                "METHOD": r.method, "MC_DRAWS": r.draws, "MC_ERROR": r.mc_error,
                "PRODUCTION_FEASIBLE": bool(feasible[gi, ci]),
            })
    columns = [*GROUP_KEYS, f"{shell.name}_DATA_CELL", *NOISY_COLUMNS, "NOISE_DISTRIBUTION", *AVERAGE_COLUMNS]
    return pd.DataFrame(rows, columns=columns)


def _production_feasibility(shell: RatioShell, groups: list[tuple[dict[int, Count], dict[int, Count]]],
                            tau: int) -> npt.NDArray[np.bool_]:
    """(groups, 3): whether the production's polytope (spec §4) admits its sampler, per row."""
    out = np.ones((len(groups), len(RATIO_CELLS)), dtype=bool)
    if not groups:
        return out

    def arr(values: list[float]) -> npt.NDArray[np.float64]:
        return np.asarray(values, dtype=np.float64)

    if shell.shared_denominator:
        n2, v2 = arr([n[2].y for n, _ in groups]), arr([n[2].var for n, _ in groups])
        n3, v3 = arr([n[3].y for n, _ in groups]), arr([n[3].var for n, _ in groups])
        dd, vd = arr([d[1].y for _, d in groups]), arr([d[1].var for _, d in groups])
        poly = shared_denominator_polytope(n2, v2, n3, v3, dd, vd, shell.lower_bound, tau)
        ok = production_feasible(poly, np.stack([n2, n3, dd], axis=1))
        return np.repeat(ok[:, None], len(RATIO_CELLS), axis=1)  # one model per group
    for ci, cells in enumerate(((2, 3), (2,), (3,))):
        nn = arr([sum(n[c].y for c in cells) for n, _ in groups])
        vn = arr([sum(n[c].var for c in cells) for n, _ in groups])
        dd = arr([sum(d[c].y for c in cells) for _, d in groups])
        vd = arr([sum(d[c].var for c in cells) for _, d in groups])
        poly = own_denominator_polytope(nn, vn, dd, vd, tau)
        out[:, ci] = production_feasible(poly, np.stack([nn, dd], axis=1))
    return out


__all__ = ["AVERAGE_COLUMNS", "DEFAULT_DRAWS", "DEFAULT_EXACT_LIMIT", "NEG_INF", "ratio_table"]
