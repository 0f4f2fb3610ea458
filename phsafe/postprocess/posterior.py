"""The exact posterior of one released count, and of a sum of counts (marginal cells).

A released count is y = n + Z, where n >= 0 is the (truncated) exact count and Z the noise of
:mod:`phsafe.postprocess.noise`, independent across cells. With a flat prior on the non-negative
integers the posterior is p(n | y) = f(y - n) / sum_{m >= 0} f(y - m), computed exactly, by
summation, on a finite window.

Per cell: the posterior mean (the Bayes estimate under squared error; non-negative, and equal to
y when y is far from 0), the median, the 90% highest-posterior-density (HPD) credible interval on
the integers -- the smallest set {n : p(n | y) >= c} holding at least 90% of the posterior --
and the 90% equal-tailed interval [Q(0.05), Q(0.95)] with Q(p) = min{n : P(N <= n | y) >= p},
so that each tail left out holds at most 5%. The posterior is log-concave (flat prior on an
interval times a log-concave likelihood), so the HPD set is an interval around the mode
max(y, 0); far above 0 it is y ± h with P(|Z| <= h) >= 0.9 (h = 1.645 sigma, rounded, for the
discrete Gaussian), near 0 it becomes [0, u]. See ``docs/postprocess_and_accuracy.md`` for why
our own files lead with the HPD interval.

Marginal cells (a sum of released cells, e.g. PH2 cell 2 = cells 3 + 4): the cells are
independent a posteriori, so the posterior of their sum is the exact convolution of their
posteriors (:func:`convolve_pmfs`), summarized the same way (:func:`summarize_pmf`).

Truncation bound
    Let f be symmetric and log-concave, T(L) = P(|Z| > L) and S(a) = P(Z >= a). The window of a
    cell is n in [max(0, y - L), max(y, 0) + L]. The posterior mass outside it, relative to the
    mass inside, is at most 2 T(L): for y >= 0 the ignored mass is at most T(L) and the total at
    least P(Z <= y) >= 1/2; for y < 0 it is S(|y| + L + 1) / S(|y|) <= S(L + 1) / S(0) <= T(L),
    since S is log-concave. L is the smallest integer with T(L) <= 5e-13, so every posterior
    probability, quantile and mean here is exact up to a relative error below 1e-12
    (:data:`TAIL_BOUND`). A convolution of k windows ignores at most k times that.

Vectorization
    Cells are grouped by noise model (distribution, variance, number of summed parts). A cell
    with y > L has the posterior "y + noise", whose summaries are those of the noise shifted by y
    (computed once per model); the others depend on y only, and are computed once per distinct y
    in blocks of rows (a matrix of posterior weights per block).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from phsafe.postprocess._base import CREDIBLE_LEVEL, MAX_TABLE, NOISE_TAIL, PostprocessError
from phsafe.postprocess.noise import NoiseModel

_CHUNK_ELEMENTS = 1 << 22  # floats per block of posterior rows (32 MiB)
ET_TAIL = (1.0 - CREDIBLE_LEVEL) / 2  # 0.05: each tail of the equal-tailed interval
TIE = 1e-9  # relative difference of posterior weights treated as a tie by the HPD set



@dataclass
class CellSummaries:
    """Posterior summaries of cells, aligned with the observations given."""

    mean: npt.NDArray[np.float64]
    median: npt.NDArray[np.int64]
    lower: npt.NDArray[np.int64]
    upper: npt.NDArray[np.int64]
    sd: npt.NDArray[np.float64]
    p_zero: npt.NDArray[np.float64]
    et_lower: npt.NDArray[np.int64]
    et_upper: npt.NDArray[np.int64]

    @classmethod
    def empty(cls, n: int) -> "CellSummaries":
        return cls(np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                   np.zeros(n), np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64))

    FIELDS = ("mean", "median", "lower", "upper", "sd", "p_zero", "et_lower", "et_upper")


def first_at_least(cdf: npt.NDArray[np.float64], p: float) -> npt.NDArray[np.int64]:
    """Index of the first entry of each row of ``cdf`` that is >= p (the last if none is)."""
    hit = cdf >= p
    idx = hit.argmax(axis=-1)
    return np.where(hit.any(axis=-1), idx, cdf.shape[-1] - 1).astype(np.int64)


def hpd_rows(w: npt.NDArray[np.float64], level: float = CREDIBLE_LEVEL) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Highest-posterior-density set of each row of normalized weights ``w``: first and last index.

    The set is {n : w(n) >= c} with c the largest threshold whose set holds at least ``level``
    of the mass (ties at c are all included, so a symmetric posterior keeps a symmetric set;
    weights within a relative :data:`TIE` of c count as ties, so that round-off -- of a
    convolution, say -- cannot break the symmetry). It
    is the smallest set with that mass; for a log-concave posterior -- every posterior here:
    the prior is flat on an interval and the likelihood log-concave -- it is an interval
    containing the mode.
    """
    w = np.atleast_2d(w)
    ordered = -np.sort(-w, axis=1)  # descending
    cum = np.cumsum(ordered, axis=1)
    k = first_at_least(cum, level)
    threshold = ordered[np.arange(w.shape[0]), k]
    inside = w >= threshold[:, None] * (1.0 - TIE)
    lower = inside.argmax(axis=1)
    upper = w.shape[1] - 1 - inside[:, ::-1].argmax(axis=1)
    return lower.astype(np.int64), upper.astype(np.int64)


class Posterior:
    """Exact posterior of a count under a flat prior on the non-negative integers, for one noise
    model; summarizes and samples many cells at once.

    Args:
        model: The noise of the cells.
    """

    def __init__(self, model: NoiseModel) -> None:
        self.model = model
        if model.is_noiseless:
            self.half_width = 0
            return
        big = model.table_half_width()
        if 2 * big + 1 > MAX_TABLE:
            raise PostprocessError(f"VARIANCE {model.variance!r} is too large to post-process exactly")
        x = np.arange(-big, big + 1, dtype=np.int64)
        logf = model.log_pmf(x)
        f = np.exp(logf - logf.max())
        f /= f.sum()
        # T(L) = P(|Z| > L) = 2 * sum_{x > L} f(x) (f is symmetric); summed from the outside in.
        positive = f[big + 1:]  # x = 1 .. big
        beyond = np.cumsum(positive[::-1])[::-1]  # beyond[i] = P(Z >= i + 1) = P(Z > i)
        ok = np.flatnonzero(2.0 * beyond <= NOISE_TAIL)
        half = int(ok[0]) if ok.size else big
        self.half_width = half
        self.x = np.arange(-half, half + 1, dtype=np.int64)
        pmf = f[big - half: big + half + 1]
        self.pmf = pmf / pmf.sum()
        self.cdf = np.cumsum(self.pmf)
        self.cdf[-1] = 1.0
        self.noise_mean = float(self.pmf @ self.x)  # 0 by symmetry, up to rounding
        self.noise_sd = float(math.sqrt(self.pmf @ (self.x - self.noise_mean) ** 2))
        self.noise_abs_mean = float(self.pmf @ np.abs(self.x))
        self._noise_median = int(self.x[first_at_least(self.cdf, 0.5)])
        lo, hi = hpd_rows(self.pmf)
        self._noise_hpd = (int(self.x[lo[0]]), int(self.x[hi[0]]))
        # Equal-tailed quantiles of n = y - Z, i.e. y minus the noise's upper quantiles; the noise
        # is symmetric, so they are y + the noise's own quantiles at the same levels.
        self._noise_et = (int(self.x[first_at_least(self.cdf, ET_TAIL)]),
                          int(self.x[first_at_least(self.cdf, 1.0 - ET_TAIL)]))

    # -- helpers -------------------------------------------------------------------------------

    def _blocks(self, ys: npt.NDArray[np.int64]) -> Iterator[tuple[slice, int]]:
        """Blocks of the sorted distinct observations ys (all <= L) and their window widths.

        Row i of a block holds n = 0 .. width - 1 with width = max(max(y), 0) + L + 1: every n of
        the cell's window (see the module docstring); n beyond a row's own window only adds exact
        (negligible) terms.
        """
        start = 0
        while start < ys.size:
            width = max(int(ys[-1]), 0) + self.half_width + 1  # ys sorted: widest row last
            rows = max(1, _CHUNK_ELEMENTS // width)
            stop = min(ys.size, start + rows)
            width = max(int(ys[stop - 1]), 0) + self.half_width + 1
            yield slice(start, stop), width
            start = stop

    def _weights(self, ys: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.float64]:
        """Normalized posterior weights p(n | y) for n = 0 .. width - 1, one row per y."""
        n = np.arange(width, dtype=np.int64)
        logw = self.model.log_pmf(n[None, :] - ys[:, None])
        logw -= logw.max(axis=1, keepdims=True)
        w = np.exp(logw)
        w /= w.sum(axis=1, keepdims=True)
        return w

    # -- public --------------------------------------------------------------------------------

    def summarize(self, y: npt.ArrayLike) -> CellSummaries:
        """Posterior mean, median, 90% interval, sd and P(n = 0) of each observation in ``y``."""
        y = np.asarray(y, dtype=np.int64)
        out = CellSummaries.empty(y.size)
        if self.model.is_noiseless:
            if (y < 0).any():
                raise PostprocessError("a noiseless (VARIANCE 0) cell has a negative COUNT")
            out.mean[:] = y
            out.median[:] = out.lower[:] = out.upper[:] = out.et_lower[:] = out.et_upper[:] = y
            out.p_zero[:] = y == 0
            return out
        shifted = y > self.half_width  # posterior = y + noise (window clear of 0)
        ys = y[shifted]
        out.mean[shifted] = ys + self.noise_mean
        out.median[shifted] = ys + self._noise_median
        out.lower[shifted] = ys + self._noise_hpd[0]
        out.upper[shifted] = ys + self._noise_hpd[1]
        out.et_lower[shifted] = ys + self._noise_et[0]
        out.et_upper[shifted] = ys + self._noise_et[1]
        out.sd[shifted] = self.noise_sd
        out.p_zero[shifted] = 0.0
        near = ~shifted
        if near.any():
            uniq, inverse = np.unique(y[near], return_inverse=True)
            mean = np.empty(uniq.size)
            sd = np.empty(uniq.size)
            p0 = np.empty(uniq.size)
            q = np.empty((5, uniq.size), dtype=np.int64)
            for block, width in self._blocks(uniq):
                w = self._weights(uniq[block], width)
                n = np.arange(width, dtype=np.float64)
                m = w @ n
                mean[block] = m
                sd[block] = np.sqrt(np.maximum((w * (n[None, :] - m[:, None]) ** 2).sum(axis=1), 0.0))
                p0[block] = w[:, 0]
                cum = np.cumsum(w, axis=1)
                q[1, block] = first_at_least(cum, 0.5)
                q[3, block] = first_at_least(cum, ET_TAIL)
                q[4, block] = first_at_least(cum, 1.0 - ET_TAIL)
                q[0, block], q[2, block] = hpd_rows(w)
            idx = np.flatnonzero(near)
            out.mean[idx] = mean[inverse]
            out.sd[idx] = sd[inverse]
            out.p_zero[idx] = p0[inverse]
            out.lower[idx], out.median[idx], out.upper[idx] = q[0][inverse], q[1][inverse], q[2][inverse]
            out.et_lower[idx], out.et_upper[idx] = q[3][inverse], q[4][inverse]
        return out

    def window(self, y: int) -> tuple[int, npt.NDArray[np.float64]]:
        """The normalized posterior pmf of one cell: (first n, weights of n, n + 1, ...).

        The window is [max(0, y - L), max(y, 0) + L] (the module docstring's bound); a noiseless
        cell is a point mass at y.
        """
        y = int(y)
        if self.model.is_noiseless:
            if y < 0:
                raise PostprocessError("a noiseless (VARIANCE 0) cell has a negative COUNT")
            return y, np.ones(1)
        if y > self.half_width:  # y + noise: the noise pmf (symmetric) placed at y - L
            return y - self.half_width, self.pmf.copy()
        width = max(y, 0) + self.half_width + 1
        return 0, self._weights(np.array([y], dtype=np.int64), width)[0]

    def sample(self, y: npt.ArrayLike, draws: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """``draws`` independent posterior draws of each cell: an array (len(y), draws).

        Inverse-cdf sampling on the exact posterior (uniforms from ``rng``).
        """
        y = np.asarray(y, dtype=np.int64)
        if self.model.is_noiseless:
            return np.repeat(y[:, None], draws, axis=1)
        u = rng.random((y.size, draws))
        out = np.empty((y.size, draws), dtype=np.int64)
        shifted = y > self.half_width
        if shifted.any():
            j = np.searchsorted(self.cdf, u[shifted], side="right")
            out[shifted] = y[shifted, None] + self.x[np.minimum(j, self.x.size - 1)]
        near = np.flatnonzero(~shifted)
        if near.size:
            uniq, inverse = np.unique(y[near], return_inverse=True)
            for block, width in self._blocks(uniq):
                cdf = np.cumsum(self._weights(uniq[block], width), axis=1)
                cdf[:, -1] = 1.0
                rows = cdf.shape[0]
                # Row r's cdf shifted to [r, r + 1]: one searchsorted over the flattened rows.
                flat = (cdf + np.arange(rows, dtype=np.float64)[:, None]).ravel()
                mine = (inverse >= block.start) & (inverse < block.stop)
                cells = near[mine]
                r = inverse[mine] - block.start
                pos = np.searchsorted(flat, u[cells] + r[:, None], side="right")
                out[cells] = np.clip(pos - r[:, None] * width, 0, width - 1)
        return out


@functools.lru_cache(maxsize=256)
def posterior_for(model: NoiseModel) -> Posterior:
    """The (cached) posterior machinery of a noise model."""
    return Posterior(model)


# --------------------------------------------------------------------------------------------
# Any pmf on a window of the integers (marginal cells)
# --------------------------------------------------------------------------------------------


def convolve_pmfs(pmfs: Sequence[tuple[int, npt.NDArray[np.float64]]]) -> tuple[int, npt.NDArray[np.float64]]:
    """The pmf of the sum of independent integer variables, each given as (first value, weights).

    Exact convolution; long ones through the FFT (``scipy.signal.convolve`` picks the faster
    method), whose round-off (about 1e-16 of the largest weight) is clipped at 0 and far below
    the truncation bound.
    """
    from scipy.signal import convolve

    offset, out = pmfs[0][0], np.asarray(pmfs[0][1], dtype=np.float64)
    for first, weights in pmfs[1:]:
        offset += first
        if out.size == 1 or len(weights) == 1:  # a point mass shifts the other pmf
            out = out * weights[0] if len(weights) == 1 else np.asarray(weights, dtype=np.float64) * out[0]
        else:
            out = convolve(out, weights, method="auto")
            np.maximum(out, 0.0, out=out)
    return offset, out / out.sum()


@dataclass(frozen=True)
class PmfSummary:
    """Summaries of one pmf (see :class:`CellSummaries` for their meaning)."""

    mean: float
    median: int
    lower: int
    upper: int
    sd: float
    p_zero: float
    et_lower: int
    et_upper: int


def summarize_pmf(offset: int, w: npt.NDArray[np.float64]) -> PmfSummary:
    """Mean, median, 90% HPD and equal-tailed intervals, sd and P(0) of the pmf ``w`` of the
    values offset, offset + 1, ... (normalized)."""
    n = offset + np.arange(w.size, dtype=np.float64)
    mean = float(w @ n)
    sd = math.sqrt(max(float(w @ (n - mean) ** 2), 0.0))
    cum = np.cumsum(w)
    lo, hi = hpd_rows(w[None, :])
    quantile = [offset + int(first_at_least(cum, p)) for p in (0.5, ET_TAIL, 1.0 - ET_TAIL)]
    return PmfSummary(mean, quantile[0], offset + int(lo[0]), offset + int(hi[0]), sd,
                      float(w[0]) if offset == 0 else 0.0, quantile[1], quantile[2])
