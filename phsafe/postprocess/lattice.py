"""Exact posteriors on the integer lattice under the ratio tables' constraints.

The building blocks of :mod:`phsafe.postprocess.ratios`. Everything is in log space: the noisy
counts may contradict the constraints by many standard deviations (a negative numerator over a
large denominator), and the posterior then sits far in the tails of every likelihood, where
plain weights underflow.

* :class:`Factor` -- log-weights of consecutive integers (a likelihood restricted to a window);
  :class:`LogCum` -- its prefix and suffix log-sums, for the mass of any interval without
  cancellation.
* :func:`convolve_factors` -- the log-weights of a sum of two independent lattice variables,
  exponentially tilted so that the sums that matter are computed near the top of the floating
  range.
* :class:`BandedPosterior` -- p(X, Y) ∝ e^{lx(X) + ly(Y)} on {Y >= 1, bY <= X <= tau Y}:
  normalizer, marginals, moments and quantiles of the ratio X / Y, by one-dimensional sums.
* :func:`coupled_ratio_cdf` -- the distribution of N2 / H when the constraint couples N2 to a
  third variable N3 (bH <= N2 + N3 <= tau H): a two-dimensional lattice.
* :func:`sample_split` -- exact draws of N2 given N2 + N3 = S, by rejection from an envelope of a
  discrete log-concave pmf (no Markov chain, so the draws are independent).
* :func:`constrained_mode` -- the mode of a Gaussian approximation on the constrained region,
  which places the summation windows.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from phsafe.postprocess.noise import NoiseModel

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
NEG_INF = -np.inf
LINEAR_RANGE = 600.0
"""Weights spanning fewer nats than this are summed plainly (e^-600 is far from underflow)."""


@dataclass
class Factor:
    """Log-weights of the integers lo, lo + 1, ..., lo + len(lw) - 1 (-inf: weight 0).

    The true log-weights are ``lw + offset``: ``lw`` is kept near 0 (relative to a point of the
    window) so that its differences keep full precision -- a likelihood far out is -10^10 nats,
    whose rounding would swamp them -- and the constant ``offset`` is carried apart (it cancels
    in every normalized quantity; only comparisons between models need it).
    """

    lo: int
    lw: Array
    offset: float = 0.0

    @property
    def hi(self) -> int:
        return self.lo + self.lw.size - 1

    @property
    def values(self) -> Array:
        return self.lo + np.arange(self.lw.size, dtype=np.float64)

    def at(self, n: npt.ArrayLike) -> Array:
        """Log-weights at ``n`` (-inf outside the window)."""
        n = np.asarray(n, dtype=np.int64)
        i = n - self.lo
        inside = (i >= 0) & (i < self.lw.size)
        return np.where(inside, self.lw[np.clip(i, 0, self.lw.size - 1)], NEG_INF)

    def times(self, log_g: Array) -> "Factor":
        """The factor multiplied by e^{log_g} (aligned with the window)."""
        return Factor(self.lo, self.lw + log_g, self.offset)


def logsumexp(a: Array, axis: int | None = None) -> Array | float:
    """log(sum(exp(a))), -inf for an empty or all -inf input."""
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return NEG_INF
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out.squeeze(axis=axis) if axis is not None else float(out.reshape(()))


class LogCum:
    """Prefix and suffix sums of a factor's weights: the mass of any interval [a, b].

    The mass of [a, b] is the total minus what lies left of a and right of b; it is computed
    from the prefix sums when the part left out on the left is the smaller one, else from the
    suffix sums, so that a narrow interval in a tail does not cancel to 0. The sums are plain
    (relative to the largest weight) when the window's weights span less than
    :data:`LINEAR_RANGE` nats -- nothing underflows then -- and log-sums otherwise.
    """

    def __init__(self, factor: Factor) -> None:
        self.factor = factor
        lw = factor.lw
        finite = lw[np.isfinite(lw)]
        self.shift = float(finite.max()) if finite.size else 0.0
        self.linear = finite.size > 0 and float(self.shift - finite.min()) < LINEAR_RANGE
        if self.linear:
            e = np.exp(lw - self.shift)
            self.cpre = np.cumsum(e)
            self.csuf = np.cumsum(e[::-1])[::-1]
            self.total = self.shift + float(np.log(self.cpre[-1]))
        else:
            self.pre = np.logaddexp.accumulate(lw) if lw.size else lw
            self.suf = np.logaddexp.accumulate(lw[::-1])[::-1] if lw.size else lw
            self.total = float(self.pre[-1]) if lw.size else NEG_INF

    def _indices(self, a: npt.ArrayLike, b: npt.ArrayLike) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]]:
        n = self.factor.lw.size
        i = np.minimum(np.maximum(np.asarray(a, dtype=np.int64) - self.factor.lo, 0), n)
        j = np.minimum(np.maximum(np.asarray(b, dtype=np.int64) - self.factor.lo, -1), n - 1)
        return i, j, j < i

    def mass(self, a: npt.ArrayLike, b: npt.ArrayLike) -> Array:
        """Sum of the weights in [a, b], relative to e^shift (only for a ``linear`` window)."""
        n = self.factor.lw.size
        i, j, empty = self._indices(a, b)
        last = n - 1
        left = np.where(i > 0, self.cpre[np.maximum(i - 1, 0)], 0.0)
        right = np.where(j < last, self.csuf[np.minimum(j + 1, last)], 0.0)
        via_pre = self.cpre[np.maximum(j, 0)] - left
        via_suf = self.csuf[np.minimum(i, last)] - right
        out = np.where(left <= right, via_pre, via_suf)
        return np.where(empty, 0.0, np.maximum(out, 0.0))

    def mass_from(self, a: IntArray) -> Callable[[IntArray], Array]:
        """:meth:`mass` of [a, b] for a fixed array ``a`` and any ``b`` broadcast against it: what
        depends on ``a`` alone is computed once (a ratio's cdf asks for the same lower ends at
        every point). The same numbers as :meth:`mass`."""
        n = self.factor.lw.size
        last = n - 1
        i = np.minimum(np.maximum(np.asarray(a, dtype=np.int64) - self.factor.lo, 0), n)
        left = np.where(i > 0, self.cpre[np.maximum(i - 1, 0)], 0.0)
        from_i = self.csuf[np.minimum(i, last)]

        # Read at j + 1 (j from -1 to last): cpre[max(j, 0)], and csuf[j + 1] or 0 past the end --
        # the clipping and the test at the end done once here, by padding, not at every point.
        pre_at = np.concatenate([self.cpre[:1], self.cpre])
        suf_after = np.concatenate([self.csuf, [0.0]])

        def mass(b: IntArray) -> Array:
            j1 = np.minimum(np.maximum(np.asarray(b, dtype=np.int64) - self.factor.lo, -1), last) + 1
            right = suf_after.take(j1)
            via_pre = pre_at.take(j1) - left
            via_suf = from_i - right
            out = np.where(left <= right, via_pre, via_suf)
            np.maximum(out, 0.0, out=out)
            np.copyto(out, 0.0, where=j1 <= i)  # j < i: an empty interval
            return out

        return mass

    def log_mass(self, a: npt.ArrayLike, b: npt.ArrayLike) -> Array:
        """log sum of the weights of the integers in [a, b] (elementwise; -inf if none)."""
        if self.factor.lw.size == 0:
            return np.full(np.broadcast(np.asarray(a), np.asarray(b)).shape, NEG_INF)
        if self.linear:
            with np.errstate(divide="ignore"):
                return np.log(self.mass(a, b)) + self.shift
        n = self.factor.lw.size
        i, j, empty = self._indices(a, b)
        left = np.where(i > 0, self.pre[np.clip(i - 1, 0, n - 1)], NEG_INF)  # mass before a
        right = np.where(j < n - 1, self.suf[np.clip(j + 1, 0, n - 1)], NEG_INF)  # mass after b
        upto_b = self.pre[np.clip(j, 0, n - 1)]
        from_a = self.suf[np.clip(i, 0, n - 1)]
        with np.errstate(divide="ignore", invalid="ignore"):
            via_pre = upto_b + np.log1p(-np.exp(np.minimum(left - upto_b, 0.0)))
            via_suf = from_a + np.log1p(-np.exp(np.minimum(right - from_a, 0.0)))
        out = np.where(left <= right, via_pre, via_suf)
        out = np.where(np.isnan(out), NEG_INF, out)
        return np.where(empty, NEG_INF, out)

    def log_prefix(self) -> Array:
        """log of the prefix sums (for inverse-cdf sampling)."""
        if self.linear:
            with np.errstate(divide="ignore"):
                return np.log(self.cpre) + self.shift
        return self.pre

    def log_suffix(self) -> Array:
        if self.linear:
            with np.errstate(divide="ignore"):
                return np.log(self.csuf) + self.shift
        return self.suf


def likelihood(model: "NoiseModel", y: int, lo: int, hi: int) -> Factor:
    """The likelihood n -> f(y - n) of a released count y on the window [lo, hi].

    Computed relative to the window's middle (:meth:`NoiseModel.log_pmf_diff`) plus that point's
    log-pmf: the weights of neighbours stay exact even a million standard deviations out.
    """
    n = np.arange(lo, hi + 1, dtype=np.int64)
    ref = (lo + hi) // 2
    base = float(model.log_pmf(np.array([y - ref]))[0])
    return Factor(lo, np.asarray(model.log_pmf_diff(y - n, y - ref), dtype=np.float64), base)


def convolve_factors(a: Factor, b: Factor, tilt: float, method: str = "fft") -> tuple[Factor, Factor]:
    """The log-weights of X + Y for independent X ~ e^{a}, Y ~ e^{b} (unnormalized).

    Both factors are multiplied by e^{tilt * n} before the convolution and the result by
    e^{-tilt * s} after it -- an exact identity, chosen so that the sums that matter are near the
    largest ones. ``method``: ``"fft"`` (round-off about 1e-16 of the largest sum), ``"direct"``
    (sums of positive terms: full relative precision down to underflow) or ``"logs"`` (log-sum-exp
    of every term: exact however far apart the terms are; quadratic in time and memory).

    Returns:
        The log-weights of the sum, and an upper bound of the log-weights where they were set
        to 0 because they fell below what ``method`` resolves (-inf elsewhere): the caller
        bounds the mass left out with it and, if it matters, asks again with a finer method.
    """
    lo = a.lo + b.lo
    size = a.lw.size + b.lw.size - 1
    offset = a.offset + b.offset
    none = Factor(lo, np.full(max(size, 0), NEG_INF), offset)
    if a.lw.size == 0 or b.lw.size == 0:
        return none, none
    # The tilt is applied relative to each window's start (tilt * n is large far out; its
    # differences are not) and undone relative to the sum's.
    ta = a.lw + tilt * np.arange(a.lw.size, dtype=np.float64)
    tb = b.lw + tilt * np.arange(b.lw.size, dtype=np.float64)
    ma, mb = float(np.max(ta)), float(np.max(tb))
    if not (math.isfinite(ma) and math.isfinite(mb)):
        return none, none
    values = np.arange(size, dtype=np.float64)
    if method == "logs":
        out = np.full(size, NEG_INF)
        step = max(1, (1 << 22) // max(b.lw.size, 1))
        for start in range(0, a.lw.size, step):
            block = ta[start:start + step]
            terms = block[:, None] + tb[None, :]  # (k, j) -> index start + k + j
            for k in range(block.size):
                seg = slice(start + k, start + k + tb.size)
                out[seg] = np.logaddexp(out[seg], terms[k])
        return Factor(lo, out - tilt * values, offset), none
    ea, eb = np.exp(ta - ma), np.exp(tb - mb)
    if method == "direct":
        s = np.convolve(ea, eb)
        floor = 1e-290
    else:
        s = convolve(ea, eb)
        floor = 4e-15 * float(np.max(s))
    cut = s <= floor
    with np.errstate(divide="ignore"):
        ls = np.where(cut, NEG_INF, np.log(np.maximum(s, 1e-300)))
    bound = np.where(cut, math.log(floor), NEG_INF)
    shift = ma + mb - tilt * values
    return Factor(lo, ls + shift, offset), Factor(lo, bound + shift, offset)


def convolve(x: Array, y: Array) -> Array:
    """The convolution of two non-negative arrays by FFT (round-off clipped at 0)."""
    n = x.size + y.size - 1
    size = 1 << (n - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(y, size), size)[:n]
    return np.maximum(out, 0.0)


DIRECT_CONVOLUTION = 4_000_000
"""Factors whose sizes multiply to at most this are convolved by direct sums, larger by FFT
first (a few milliseconds either way)."""


def first_method(a_size: int, b_size: int) -> str:
    return "direct" if a_size * b_size <= DIRECT_CONVOLUTION else "fft"


def restrict(f: Factor, lo: int, hi: int) -> Factor:
    """The factor on [lo, hi] (-inf where it had no weight)."""
    if hi < lo:
        return Factor(lo, np.full(0, NEG_INF), f.offset)
    return Factor(lo, f.at(np.arange(lo, hi + 1)), f.offset)


# --------------------------------------------------------------------------------------------
# X / Y with X in a band [bY, tau Y]
# --------------------------------------------------------------------------------------------


class BandedPosterior:
    """p(X, Y) ∝ e^{lx(X) + ly(Y)} on {Y in ly's window, Y >= 1, bY <= X <= tau Y} (tau None: no
    upper bound), by one-dimensional sums over Y.

    Args:
        x, y: The factors of X and Y (Y's window must start at 1 or above).
        b, tau: The band of X given Y.
    """

    def __init__(self, x: Factor, y: Factor, b: int, tau: int | None) -> None:
        if y.lo < 1:
            raise ValueError("the denominator's window must start at 1 or above")
        self.x, self.y, self.b, self.tau = x, y, b, tau
        self.cx = LogCum(x)
        self.yv = np.arange(y.lo, y.hi + 1, dtype=np.int64)
        self.band_lo = b * self.yv
        self.band_hi = tau * self.yv if tau is not None else np.full(self.yv.size, x.hi)
        self.log_row = y.lw + self.cx.log_mass(self.band_lo, self.band_hi)  # log p(Y) + log Z
        self.log_z = logsumexp(self.log_row)
        self.offset = x.offset + y.offset  # true log normalizer: log_z + offset
        self._row_scale: Array | None = None
        self._support_mass: Callable[[IntArray], Array] | None = None

    @property
    def empty(self) -> bool:
        return not math.isfinite(self.log_z)

    def y_pmf(self) -> Array:
        w = np.exp(self.log_row - np.max(self.log_row))
        return w / w.sum()

    def x_pmf(self) -> Array:
        """The marginal pmf of X on its window."""
        cy = LogCum(self.y)
        xv = np.arange(self.x.lo, self.x.hi + 1, dtype=np.int64)
        # Y with bY <= X <= tau Y: ceil(X / tau) <= Y <= floor(X / b)
        y_lo = -(-xv // self.tau) if self.tau is not None else np.full(xv.size, self.y.lo)
        y_hi = xv // self.b if self.b > 0 else np.full(xv.size, self.y.hi)
        return np.exp(self.x.lw + cy.log_mass(np.maximum(y_lo, 1), y_hi) - self.log_z)

    def expect(self, moment: Factor | None = None, y_power: int = 0) -> float:
        """E[M(X) * Y^-y_power], where ``moment`` holds log(M(X)) + lx(X) (None: M = 1)."""
        if self.empty:
            return math.nan
        cm = self.cx if moment is None else LogCum(moment)
        terms = self.y.lw + cm.log_mass(self.band_lo, self.band_hi) - y_power * np.log(self.yv)
        # both sums relative to the same largest row: their ratio keeps its precision
        top = float(np.max(self.log_row))
        return float(np.exp(terms - top).sum() / np.exp(self.log_row - top).sum())

    @functools.cached_property
    def support(self) -> npt.NDArray[np.int64]:
        """Indices of the rows Y whose posterior weight is within e^-50 of the largest: the others
        hold less than 1e-21 each, and are left out of the ratio's cdf."""
        return np.flatnonzero(self.log_row >= np.max(self.log_row) - 50.0)

    def ratio_cdf(self, r: Array) -> Array:
        """P(X / Y <= r) for each r of the array (shape (k,))."""
        r = np.asarray(r, dtype=np.float64)
        rows = self.support
        yv = self.yv[rows]
        top = np.floor(r[:, None] * yv[None, :] + 1e-9).astype(np.int64)
        top = np.minimum(top, self.band_hi[rows][None, :])
        if self.cx.linear:
            if self._row_scale is None:
                self._row_scale = np.exp(self.y.lw[rows] + self.cx.shift - self.log_z)
                self._support_mass = self.cx.mass_from(self.band_lo[rows][None, :])
            return self._support_mass(top) @ self._row_scale
        lo = np.broadcast_to(self.band_lo[rows], top.shape)
        mass = self.cx.log_mass(lo, top)
        return np.exp(logsumexp(self.y.lw[rows][None, :] + mass, axis=1) - self.log_z)

    def ratio_quantiles(self, ps: Sequence[float], draws: int = 0,
                        rng: np.random.Generator | None = None) -> tuple[Array, float]:
        """Q(p) = min{r : P(X / Y <= r) >= p} for each p, and its Monte Carlo error.

        Exact (error 0) by sums over the rows of :attr:`support`; when those are more than
        :data:`BANDED_EXACT_LIMIT` -- a posterior spread over a huge range, as contradictory
        geometric noise gives -- from ``draws`` independent exact draws of (Y, X) instead (if
        ``rng`` is given), with the largest 95% half-width of the quantiles as the error.
        """
        if self.empty:
            return np.full(len(ps), math.nan), 0.0
        if self.support.size > BANDED_EXACT_LIMIT and rng is not None and draws > 0:
            y = sample_from_factor(Factor(self.y.lo, self.log_row), rng.random(draws))
            x = sample_in_band(self.cx, self.b * y, self.band_hi[y - self.y.lo], rng.random(draws))
            return sample_quantiles(x / y, ps)
        lo_r = max(self.x.lo / self.y.hi, float(self.b)) - 1e-9
        hi_r = self.x.hi / self.y.lo if self.tau is None else float(self.tau)
        return bisect_quantiles(self.ratio_cdf, ps, lo_r, hi_r, self.yv[self.support]), 0.0


BANDED_EXACT_LIMIT = 200_000
"""Most rows of a one-dimensional ratio posterior whose quantiles are computed exactly."""


def sample_quantiles(ratio: Array, ps: Sequence[float]) -> tuple[Array, float]:
    """The sample's Q(p) (smallest value with empirical cdf >= p) for each p, and the largest 95%
    half-width of those quantiles (from the order statistics' binomial ranks)."""
    ordered = np.sort(ratio)
    m = ordered.size
    values, errors = [], []
    for p in ps:
        k = max(int(math.ceil(p * m)) - 1, 0)
        half = 1.96 * math.sqrt(m * p * (1 - p))
        lo_k, hi_k = max(int(math.floor(k - half)), 0), min(int(math.ceil(k + half)), m - 1)
        values.append(float(ordered[k]))
        errors.append(max(ordered[hi_k] - ordered[k], ordered[k] - ordered[lo_k]))
    return np.asarray(values), float(max(errors))


def bisect_quantiles(cdf: Callable[[Array], Array], ps: Sequence[float], lo: float, hi: float,
                     denominators: IntArray) -> Array:
    """Quantiles Q(p) = min{r : P(X / Y <= r) >= p} of a ratio on the lattice, from its cdf.

    Each step evaluates the cdf at :data:`SPLITS` points of every bracket (one call), until a
    bracket (a, b] is narrower than the gap between two distinct values X / Y with Y among
    ``denominators`` (1 / max(Y)^2); it then holds exactly one attainable value, the largest
    X / Y <= b, which is returned: the exact quantile.
    """
    ps = np.asarray(ps, dtype=np.float64)
    d = denominators[denominators > 0].astype(np.float64)
    y_max = float(d.max()) if d.size else 1.0
    a = np.full(ps.size, lo)
    b = np.full(ps.size, max(hi, lo + 1e-9))
    tol = min(0.5 / (y_max * y_max), 1e-3)
    grid = np.arange(1, SPLITS + 1) / (SPLITS + 1)
    for _ in range(200):
        if np.all(b - a <= tol):
            break
        points = a[:, None] + (b - a)[:, None] * grid[None, :]  # (quantiles, SPLITS)
        values = cdf(points.ravel()).reshape(points.shape)
        hit = values >= ps[:, None] - 1e-15
        first = np.where(hit.any(axis=1), hit.argmax(axis=1), SPLITS)  # first point at or past the quantile
        rows = np.arange(ps.size)
        new_b = np.where(first < SPLITS, points[rows, np.minimum(first, SPLITS - 1)], b)
        new_a = np.where(first > 0, points[rows, np.maximum(first - 1, 0)], a)
        a, b = new_a, new_b
    if d.size <= 200_000:
        atoms = np.floor(b[:, None] * d[None, :] + 1e-9) / d[None, :]
        atoms = np.where(atoms > a[:, None], atoms, -np.inf)
        best = atoms.max(axis=1)
        b = np.where(np.isfinite(best), best, b)
    return b


SPLITS = 3
"""Points of each bracket evaluated per step of :func:`bisect_quantiles` (4-fold narrowing). A cdf
evaluation costs about its points times the posterior's rows, plus a fixed overhead per call: 3
points a step evaluate fewer than half the points of 15 (16-fold) for twice the calls, and the
demo data's averages took a third less CPU. The quantile found does not depend on it (the exact
one, once the bracket holds one attainable value): the same files, bit for bit."""

LATTICE_BLOCK = 65_536
"""Cells of a two-dimensional lattice filled at a time (:class:`CoupledRatio`): a block and its
few temporaries stay in the processor's cache."""


# --------------------------------------------------------------------------------------------
# N2 / H when bH <= N2 + N3 <= tau H couples N2 to N3
# --------------------------------------------------------------------------------------------


class CoupledRatio:
    """The joint pmf of (N2, H) given e^{l2(N2) + l3(N3) + ld(H)} on {bH <= N2 + N3 <= tau H},
    N3 summed out, as a two-dimensional lattice (H window x N2 window); the cdf of N2 / H.

    Summing N3 over [bH - N2, tau H - N2] is a difference of N3's prefix sums; along a row
    (fixed H) the two indices slide by one per N2, so every row is read from one window of the
    reversed prefix sums (no per-element index arithmetic).
    """

    def __init__(self, n2: Factor, n3: Factor, h: Factor, b: int, tau: int) -> None:
        self.hv = np.arange(h.lo, h.hi + 1, dtype=np.int64)
        self.n2lo, self.n2len = n2.lo, n2.lw.size
        c2, c3, ch = LogCum(n2), LogCum(n3), LogCum(h)
        w = None
        if c2.linear and ch.linear and c3.linear:
            w = self._linear(n2, h, n3, c2, ch, c3, b, tau)  # already cumulated over N2
        if w is None:
            w = self._logs(n2, h, c3, b, tau)
            if w is not None:
                np.cumsum(w, axis=1, out=w)  # row cdfs over N2 (unnormalized)
        self.empty = w is None
        if w is None:
            self.cum = np.zeros((self.hv.size, 1))
            self.total = 0.0
            return
        self.total = float(w[:, -1].sum())
        self.cum = w

    def _linear(self, n2: Factor, h: Factor, n3: Factor, c2: LogCum, ch: LogCum, c3: LogCum, b: int,
                tau: int) -> Array | None:
        """The weights as plain numbers, when nothing can underflow (the usual case), with each
        row already cumulated over N2 (its unnormalized cdf).

        The lattice (up to millions of cells) is filled a block of rows at a time, every step of
        a block done while it is in the processor's cache: one pass over the lattice's memory
        instead of a dozen, and temporaries small enough to be reused rather than mapped afresh.
        Every cell gets the same operations in the same order as a whole-lattice computation
        (all are elementwise, or along a row), so the numbers are the same to the last bit.
        """
        from numpy.lib.stride_tricks import sliding_window_view

        m, n3len = self.n2len, n3.lw.size
        total = float(c3.cpre[-1])

        def reader(sums: Array, before: float, after: float) -> Callable[[IntArray], Array]:
            """Rows h, entries t: ``sums`` (indexed by N3) at index[h] - t, ``before`` below index
            0 and ``after`` beyond the window -- one window of the reversed, padded sums per row
            (reversed into a contiguous copy: each row read is one block copy). The rows are
            named by :func:`position`."""
            pad = np.concatenate([np.full(m + 1, before), sums, np.full(m + 1, after)])
            return sliding_window_view(np.ascontiguousarray(pad[::-1]), m)  # view[r, t] = pad[len - 1 - r - t]

        def position(index: IntArray) -> IntArray:
            """The row of a reader's view that starts at ``index`` (the same for both readers: their
            padded sums have the same length)."""
            q = np.clip(index, -1, n3len + m - 1) + m + 1  # position in pad of t = 0
            return (n3len + 2 * m + 1) - q

        prefix = reader(c3.cpre, 0.0, total)  # mass of N3 <= index
        suffix = reader(c3.csuf, total, 0.0)  # mass of N3 >= index
        base = -self.n2lo - n3.lo  # N3 index of N3 = c - N2 at N2 = n2lo is c - n2lo - n3.lo
        hi_all, lo_all = tau * self.hv + base, b * self.hv + base
        at_hi, at_lo = position(hi_all), position(lo_all)
        below_lo, above_hi = position(lo_all - 1), position(hi_all + 1)
        row_weight = np.exp(h.lw - ch.shift)
        col_weight = np.exp(n2.lw - c2.shift)
        w = np.empty((self.hv.size, m))
        largest_row = 0.0
        block = max(1, LATTICE_BLOCK // max(m, 1))
        for start in range(0, self.hv.size, block):
            rows_ = slice(start, start + block)
            # The mass of [lo, hi] from the side that leaves out less: no cancellation in a tail --
            # (prefix(hi) - below) where below <= above, else (suffix(lo) - above), with below and
            # above the masses left out on either side.
            via_pre = prefix[at_hi[rows_]]
            below = prefix[below_lo[rows_]]
            via_pre -= below
            above = suffix[above_hi[rows_]]
            use_pre = below <= above
            wb = w[rows_]
            np.subtract(suffix[at_lo[rows_]], above, out=wb)
            np.copyto(wb, via_pre, where=use_pre)
            np.maximum(wb, 0.0, out=wb)
            wb *= row_weight[rows_][:, None]
            wb *= col_weight[None, :]
            largest_row = max(largest_row, float(wb.sum(axis=1).max(initial=0.0)))
            np.cumsum(wb, axis=1, out=wb)
        if not largest_row > 1e-250:  # the mass sits where plain products underflow
            return None
        return w

    def _logs(self, n2: Factor, h: Factor, c3: LogCum, b: int, tau: int) -> Array | None:
        n2v = np.arange(n2.lo, n2.hi + 1, dtype=np.int64)
        log_w = np.empty((self.hv.size, n2v.size))
        step = max(1, (1 << 21) // max(n2v.size, 1))
        for start in range(0, self.hv.size, step):
            hb = self.hv[start:start + step]
            lo = b * hb[:, None] - n2v[None, :]
            hi = tau * hb[:, None] - n2v[None, :]
            log_w[start:start + step] = h.lw[start:start + step][:, None] + n2.lw[None, :] + c3.log_mass(lo, hi)
        top = float(np.max(log_w)) if log_w.size else NEG_INF
        if not math.isfinite(top):
            return None
        np.subtract(log_w, top, out=log_w)
        np.exp(log_w, out=log_w)
        return log_w

    def cdf(self, r: Array) -> Array:
        r = np.asarray(r, dtype=np.float64)
        k = np.floor(r[:, None] * self.hv[None, :] + 1e-9).astype(np.int64) - self.n2lo
        below = k < 0
        k = np.clip(k, 0, self.n2len - 1)
        k += np.arange(0, self.hv.size * self.n2len, self.n2len)  # row h, entry k: k + h * n2len of the flat lattice
        return np.where(below, 0.0, self.cum.reshape(-1).take(k)).sum(axis=1) / self.total

    def quantiles(self, ps: Sequence[float], tau: int) -> Array:
        if self.empty:
            return np.full(len(ps), math.nan)
        return bisect_quantiles(self.cdf, ps, self.n2lo / self.hv[-1] - 1e-9,
                                min(float(tau), (self.n2lo + self.n2len) / self.hv[0]), self.hv)


# --------------------------------------------------------------------------------------------
# Exact sampling
# --------------------------------------------------------------------------------------------


def sample_from_factor(f: Factor, u: Array) -> IntArray:
    """Inverse-cdf draws from the pmf ∝ e^{f} (``u`` uniform in [0, 1))."""
    lw = f.lw - logsumexp(f.lw)
    cdf = np.cumsum(np.exp(lw))
    cdf[-1] = 1.0
    return f.lo + np.minimum(np.searchsorted(cdf, u, side="right"), f.lw.size - 1)


def sample_in_band(c: LogCum, a: IntArray, b: IntArray, u: Array) -> IntArray:
    """Draws of X from e^{lx} restricted to [a_i, b_i] (elementwise), by inverting the prefix
    log-sums -- or the suffix ones where the band sits in the upper tail."""
    n = c.factor.lw.size
    lo = c.factor.lo
    mass = c.log_mass(a, b)
    i = np.clip(a - lo, 0, n - 1)
    j = np.clip(b - lo, 0, n - 1)
    pre, suf = c.log_prefix(), c.log_suffix()
    left = np.where(a - lo > 0, pre[np.clip(i - 1, 0, n - 1)], NEG_INF)
    right = np.where(j < n - 1, suf[np.clip(j + 1, 0, n - 1)], NEG_INF)
    with np.errstate(divide="ignore"):
        target_pre = np.logaddexp(left, np.log(u) + mass)  # P(X <= x) >= this
        target_suf = np.logaddexp(right, np.log1p(-u) + mass)  # P(X >= x) >= this
    from_pre = np.searchsorted(pre, target_pre, side="left")
    # suf is non-increasing: the last index whose suffix mass is still >= the target
    from_suf = n - np.searchsorted(suf[::-1], target_suf, side="left") - 1
    x = np.where(left <= right, from_pre, from_suf)
    return lo + np.clip(x, i, j)


def sample_split(
    log_pmf: Callable[[IntArray, IntArray], Array],
    total: IntArray,
    rng: np.random.Generator,
) -> IntArray:
    """Exact draws of N2 in [0, S] from p(N2 | S) ∝ e^{log_pmf(N2, S)}, one per S of ``total``.

    ``log_pmf`` must be log-concave in N2 (here log f2(y2 - N2) + log f3(y3 - S + N2), a product
    of log-concave likelihoods). Rejection from the envelope: flat at the mode's height between
    the nearest points on each side where the log-pmf has dropped by 1 (found by bisection: it
    is monotone on each side of the mode), and beyond such a point a the line through it of the
    steeper of two slopes that bound a log-concave sequence from above there -- its last step
    and its chord from the mode. The chord keeps the tails' mass within a few times the flat
    part's even on a plateau (two geometric likelihoods pulling apart leave every split in
    between about equally likely), so the acceptance rate stays above about 1/4 whatever the
    shape.
    """
    total = np.asarray(total, dtype=np.int64)
    out = np.empty(total.size, dtype=np.int64)
    pending = np.arange(total.size)
    s_all = total

    def first_true(lo: IntArray, hi: IntArray, pred: Callable[[IntArray], npt.NDArray[np.bool_]]) -> IntArray:
        """Per row, the least x in [lo, hi] with pred(x), pred monotone (False then True); hi + 1
        if none."""
        a, b = lo.copy(), hi + 1
        while np.any(a < b):
            live = a < b
            mid = (a + b) // 2
            ok = pred(np.minimum(mid, hi))
            b = np.where(live & ok, mid, b)
            a = np.where(live & ~ok, mid + 1, a)
        return a

    zero = np.zeros(total.size, dtype=np.int64)
    # mode: the first n with ell(n + 1) < ell(n) (S if none)
    mode = first_true(zero, np.maximum(total - 1, 0), lambda x: log_pmf(x + 1, s_all) < log_pmf(x, s_all))
    mode = np.minimum(mode, total)
    top_all = log_pmf(mode, s_all)
    # ar: the first x > mode with ell(x) <= top - 1 (S + 1: none); al: the last x < mode with it (-1: none)
    ar_all = first_true(np.minimum(mode + 1, total), total, lambda x: log_pmf(x, s_all) <= top_all - 1.0)
    ar_all = np.where(mode >= total, total + 1, ar_all)
    # on the left, x -> mode - x is monotone the same way
    k_left = first_true(zero + 1, np.maximum(mode, 1), lambda k: log_pmf(mode - k, s_all) <= top_all - 1.0)
    al_all = np.where(mode > 0, mode - k_left, -1)
    al_all = np.where(al_all < 0, -1, al_all)
    while pending.size:
        s = s_all[pending]
        m = mode[pending]
        top = top_all[pending]
        ar, al = ar_all[pending], al_all[pending]
        has_r, has_l = ar <= s, al >= 0
        c_lo, c_hi = al + 1, np.minimum(ar - 1, s)
        n_c = c_hi - c_lo + 1
        arc, alc = np.minimum(ar, s), np.maximum(al, 0)
        l_ar = log_pmf(arc, s)
        l_al = log_pmf(alc, s)
        with np.errstate(divide="ignore", invalid="ignore"):
            chord_r = (l_ar - top) / np.maximum(arc - m, 1)
            chord_l = (l_al - top) / np.maximum(m - alc, 1)
        d_r = np.where(has_r, np.minimum(np.minimum(l_ar - log_pmf(np.maximum(arc - 1, 0), s), chord_r), 0.0), 0.0)
        d_l = np.where(has_l, np.minimum(np.minimum(l_al - log_pmf(np.minimum(alc + 1, s), s), chord_l), 0.0), 0.0)
        k_r = np.where(has_r, s - ar + 1, 0)
        k_l = np.where(has_l, al + 1, 0)

        def geometric_log_mass(d: Array, k: IntArray) -> Array:
            with np.errstate(divide="ignore", invalid="ignore"):
                out_ = np.where(d < 0, np.log(-np.expm1(k * d)) - np.log(-np.expm1(d)), np.log(np.maximum(k, 1)))
            return np.where(k > 0, out_, NEG_INF)

        mass_c = top + np.log(n_c)
        mass_r = np.where(has_r, l_ar + geometric_log_mass(d_r, k_r), NEG_INF)
        mass_l = np.where(has_l, l_al + geometric_log_mass(d_l, k_l), NEG_INF)
        masses = np.stack([mass_c, mass_r, mass_l], axis=1)
        probs = np.exp(masses - logsumexp(masses, axis=1)[:, None])
        u = rng.random((pending.size, 3))
        piece = (u[:, :1] > np.cumsum(probs, axis=1)[:, :2]).sum(axis=1)

        def geometric_draw(d: Array, k: IntArray, v: Array) -> IntArray:
            with np.errstate(divide="ignore", invalid="ignore"):
                j = np.where(d < 0, np.ceil(np.log1p(v * np.expm1(k * d)) / d) - 1, np.floor(v * k))
            return np.clip(np.nan_to_num(j, nan=0.0), 0, np.maximum(k - 1, 0)).astype(np.int64)

        x_c = c_lo + np.minimum((u[:, 1] * n_c).astype(np.int64), n_c - 1)
        j_r = geometric_draw(d_r, k_r, u[:, 1])
        j_l = geometric_draw(d_l, k_l, u[:, 1])
        x = np.where(piece == 0, x_c, np.where(piece == 1, ar + j_r, al - j_l))
        env = np.where(piece == 0, top, np.where(piece == 1, l_ar + j_r * d_r, l_al + j_l * d_l))
        accept = np.log(u[:, 2]) <= log_pmf(x, s) - env
        out[pending[accept]] = x[accept]
        pending = pending[~accept]
    return out


# --------------------------------------------------------------------------------------------
# Where the posterior lies
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _active_sets(A_key: bytes, shape: tuple[int, int]) -> list[tuple[npt.NDArray[np.int64], Array]]:
    """For every set of at most d linearly independent rows of A: the rows and the matrix
    A_T^T (A_T A_T^T)^-1 of the projection onto {x : A_T x = b_T}."""
    A = np.frombuffer(A_key, dtype=np.float64).reshape(shape)
    rows, d = shape
    out = []
    for k in range(1, d + 1):
        for subset in itertools.combinations(range(rows), k):
            At = A[list(subset)]
            gram = At @ At.T
            if abs(np.linalg.det(gram)) < 1e-12:
                continue
            out.append((np.array(subset), At.T @ np.linalg.inv(gram)))
    return out


def constrained_mode(centre: Array, variance: Array, A: Array, lower: Array, laplace: bool = False) -> Array:
    """The mode of an approximation of the posterior on {x : A x >= lower}, which centres the
    summation windows (the exact computation then checks that their edges hold no mass).

    Gaussian likelihoods (``laplace`` False): argmin sum((x - centre)^2 / variance), exactly --
    in scaled coordinates (x / sd) the Euclidean projection onto a polyhedron, i.e. onto the
    affine hull of some set of at most d active constraints; every such set is tried and the
    nearest feasible point kept. Geometric (Laplace-like) likelihoods: argmin
    sum(|x - centre| / sd), a linear program -- the constraint is then met by moving the cheapest
    coordinates, not by sharing the move as a Gaussian does.
    """
    if laplace:
        return _laplace_mode(np.asarray(centre, dtype=np.float64), np.asarray(variance, dtype=np.float64),
                             np.asarray(A, dtype=np.float64), np.asarray(lower, dtype=np.float64))
    sd = np.sqrt(np.maximum(np.asarray(variance, dtype=np.float64), 1e-9))
    c = np.asarray(centre, dtype=np.float64) / sd
    As = np.asarray(A, dtype=np.float64) * sd[None, :]
    lower = np.asarray(lower, dtype=np.float64)
    tol = 1e-7 * (1.0 + np.abs(lower).max() + np.abs(As @ c).max())
    if np.all(As @ c >= lower - tol):
        return c * sd
    best, best_dist = None, np.inf
    for subset, P in _active_sets(np.ascontiguousarray(As).tobytes(), As.shape):
        x = c - P @ (As[subset] @ c - lower[subset])
        if np.all(As @ x >= lower - tol):
            dist = float(np.sum((x - c) ** 2))
            if dist < best_dist:
                best, best_dist = x, dist
    if best is None:  # cannot happen for the regions here (never empty); stay at the centre
        return c * sd
    return best * sd


def _laplace_mode(centre: Array, variance: Array, A: Array, lower: Array) -> Array:
    from scipy.optimize import linprog

    d = centre.size
    scale = np.sqrt(np.maximum(variance, 1e-9))
    # variables (x, t): minimize sum(t / sd) with t >= |x - centre| and A x >= lower
    cost = np.concatenate([np.zeros(d), 1.0 / scale])
    eye = np.eye(d)
    a_ub = np.vstack([np.hstack([eye, -eye]), np.hstack([-eye, -eye]), np.hstack([-A, np.zeros((A.shape[0], d))])])
    b_ub = np.concatenate([centre, -centre, -lower])
    done = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * (2 * d), method="highs")
    if done.status != 0:
        return constrained_mode(centre, variance, A, lower)
    return np.asarray(done.x[:d], dtype=np.float64)
