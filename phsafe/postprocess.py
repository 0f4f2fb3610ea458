"""Statistical post-processing of a private output directory: estimates and credible intervals.

Pure post-processing (paper, §6.5): everything here is computed from the *published* private
tables alone -- the noisy ``COUNT``, the ``NOISE_DISTRIBUTION`` and the ``VARIANCE`` of each
cell -- and never from the input data, so it costs no privacy-loss budget. :func:`postprocess`
opens only files under the output directory it is given (the released tables and, when present,
``manifest.json`` to check their digests) and writes to a separate destination.

Model
    A released count is y = n + Z, where n >= 0 is the (truncated) exact count and Z the noise,
    independent across cells (spec §6):

    * ``Discrete Gaussian`` (zCDP): Z ~ N_Z(0, s2), P(Z = z) ∝ exp(-z^2 / (2 s2)), s2 = VARIANCE;
    * ``Two-Sided Geometric`` (pure DP): P(Z = z) ∝ q^|z| with q = e^(-1/s). The spec reports
      VARIANCE = 2q / (1 - q)^2, so q is recovered exactly as the root in (0, 1) of
      V q^2 - 2(V + 1) q + V = 0, i.e. q = V / (V + 1 + sqrt(2V + 1));
    * derived cells (PH5_num, PH8_num; spec §5) carry the *sum* of the noises of the k source
      cells they add up (PH8_num cell 2 = PH7 cells 2 + 3, so k = 2), each with variance V / k.
      Their likelihood is the exact k-fold convolution (closed forms for k = 2 below), not a
      single discrete Gaussian or geometric of variance V;
    * VARIANCE 0 (an ``Infinity`` budget, test runs only): no noise, the posterior is a point
      mass at y.

    With a flat prior on the non-negative integers the posterior is
    p(n | y) = f(y - n) / sum_{m >= 0} f(y - m) for n = 0, 1, 2, ..., where f is the noise pmf.
    It is computed exactly, by summation, on a finite window (see *Truncation bound*).

Per cell
    ``ESTIMATE`` is the posterior mean (the Bayes estimate under squared error; non-negative, and
    equal to y when y is far from 0), ``MEDIAN`` the posterior median, and
    [``CI90_LOWER``, ``CI90_UPPER``] the 90% highest-posterior-density (HPD) credible interval on
    the integers: the smallest set {n : p(n | y) >= c} holding at least 90% of the posterior.
    The posterior is log-concave (flat prior on an interval times a log-concave likelihood), so
    the set is an interval around the mode max(y, 0); when y is far above 0 it is the symmetric
    y ± h with P(|Z| <= h) >= 0.9 (h = 1.645 sigma, rounded, for the discrete Gaussian), and near
    0 it becomes [0, u].

    Why HPD and not equal-tailed: with a flat prior on n >= 0, the equal-tailed interval (5th to
    95th posterior percentile) never contains a true 0 unless P(n = 0 | y) >= 0.05, i.e. almost
    never when sigma is large, and covers a true n = 0.1 sigma only about 67% of the time (normal
    limit). S-DHC tables have many small and zero cells: on the demo data the equal-tailed
    intervals covered 0.755 of the truncated exact counts, the HPD intervals 0.91-0.92. The
    frequentist coverage of the HPD interval in the normal limit, by true n / sigma: 0.91 (n = 0),
    0.92 (0.1), 0.93 (0.25), 0.94 (0.5-1), 0.91 (1.5), 0.88 (2), 0.87 (3), 0.90 (>= 5); Bayesian
    coverage under the flat prior is 90% by construction. See ``docs/postprocess_and_accuracy.md``.

Averages (PH1, PH5, PH8)
    numerator / denominator per population group (:data:`AVERAGES`), by simulation: ``draws``
    independent draws from the posteriors of the numerator and denominator cells, the ratio of
    the sums taken only where the denominator draw is positive. The PH8 total (cell 1) is built
    from its parts: (PH8_num 2 + PH8_num 3) / (PH8_denom 2 + PH8_denom 3), because the private
    release has no cell 1. The estimate is the median of the ratio draws, the interval the
    shortest interval holding 90% of them (the sample HPD interval; on the demo data it covered
    0.904 of the exact ratios, the 5th-95th percentile interval 0.929 while being 38% wider);
    ``P_DENOMINATOR_POSITIVE`` is the share of draws with a positive denominator. The draws come from a seeded :class:`numpy.random.Generator`: this is
    post-processing of public data, and the seed (recorded in ``postprocess.json``) makes the
    results reproducible.

Truncation bound
    Let f be symmetric and log-concave (every noise here is: the discrete Gaussian, the two-sided
    geometric and their convolutions), T(L) = P(|Z| > L) and S(a) = P(Z >= a). The window of a
    cell is n in [max(0, y - L), max(y, 0) + L]. The posterior mass outside it, relative to the
    mass inside, is at most 2 T(L): for y >= 0 the ignored mass is at most T(L) and the total at
    least P(Z <= y) >= 1/2; for y < 0 it is S(|y| + L + 1) / S(|y|) <= S(L + 1) / S(0) <= T(L),
    since S is log-concave. L is the smallest integer with T(L) <= 5e-13, so every posterior
    probability, quantile and mean here is exact up to a relative error below 1e-12
    (:data:`TAIL_BOUND`).

Vectorization
    Cells are grouped by noise model (distribution, variance, number of summed parts). A cell
    with y > L has the posterior "y + noise", whose summaries are those of the noise shifted by y
    (computed once per model); the others depend on y only, and are computed once per distinct y
    in blocks of rows (a matrix of posterior weights per block).
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import phsafe
from phsafe.accounting import NoiseDistribution
from phsafe.errors import PostprocessError
from phsafe.logs import get_logger
from phsafe.outputs import CSV_SEPARATOR, MANIFEST, Publication, cell_column, private_columns
from phsafe.reader import file_digest
from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES

if TYPE_CHECKING:
    from phsafe.progress import Progress

log = get_logger("phsafe.postprocess")

TAIL_BOUND = 1e-12
"""Upper bound on the posterior mass ignored by the finite summation window, relative to the
mass summed (see the module docstring)."""
_NOISE_TAIL = TAIL_BOUND / 2  # T(L) = P(|Z| > L) of the noise table
CREDIBLE_LEVEL = 0.90
DEFAULT_DRAWS = 4000
_CHUNK_ELEMENTS = 1 << 22  # floats per block of posterior rows (32 MiB)
_MAX_TABLE = 50_000_000  # refuse noise tables beyond this (variance ~1e13)

GROUP_KEYS = ("REGION_ID", "REGION_TYPE", "ITERATION_CODE")
COUNT_COLUMNS = ("ESTIMATE", "MEDIAN", "CI90_LOWER", "CI90_UPPER", "POSTERIOR_SD", "P_ZERO")
"""Columns appended to each private table (after its own seven or six columns)."""
AVERAGE_COLUMNS = (
    "ESTIMATE", "MEAN", "CI90_LOWER", "CI90_UPPER", "P_DENOMINATOR_POSITIVE",
    "NUMERATOR_ESTIMATE", "DENOMINATOR_ESTIMATE", "DRAWS",
)
"""Columns of an average table after REGION_ID, REGION_TYPE, ITERATION_CODE, <T>_DATA_CELL."""
POSTPROCESS_METADATA = "postprocess.json"
README = "README.md"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"


@dataclass(frozen=True)
class AverageSpec:
    """An average table: numerator over denominator, per population group.

    Attributes:
        name: ``PH1``, ``PH5`` or ``PH8``.
        numerator: Output table of the numerator counts.
        denominator: Output table of the denominator counts.
        cells: Average cell -> (numerator cells summed, denominator cells summed).
    """

    name: str
    numerator: str
    denominator: str
    cells: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]


AVERAGES: dict[str, AverageSpec] = {
    # PH1 and PH5 share one denominator (households, families): the age averages add up to the
    # total average (paper, §2.4).
    "PH1": AverageSpec("PH1", "PH1_num", "PH1_denom", ((1, (2, 3), (1,)), (2, (2,), (1,)), (3, (3,), (1,)))),
    "PH5": AverageSpec("PH5", "PH5_num", "PH5_denom", ((1, (2, 3), (1,)), (2, (2,), (1,)), (3, (3,), (1,)))),
    # PH8: each cell has its own denominator (occupied, owner, renter units); the total is
    # built from the owner and renter parts, which are all the private release has.
    "PH8": AverageSpec("PH8", "PH8_num", "PH8_denom", ((1, (2, 3), (2, 3)), (2, (2,), (2,)), (3, (3,), (3,)))),
}


# --------------------------------------------------------------------------------------------
# Noise models and their exact pmfs
# --------------------------------------------------------------------------------------------


def geometric_q(variance: float) -> float:
    """The ratio q = e^(-1/s) of the two-sided geometric whose variance is ``variance``.

    Inverts :func:`phsafe.accounting.geometric_variance`: V = 2q / (1 - q)^2 gives
    V q^2 - 2(V + 1) q + V = 0, whose roots multiply to 1; the root in (0, 1) is
    q = V / (V + 1 + sqrt(2V + 1)) (written this way to avoid cancellation).
    """
    if not variance > 0:
        raise ValueError("a geometric variance must be positive")
    return variance / (variance + 1.0 + math.sqrt(2.0 * variance + 1.0))


@dataclass(frozen=True)
class NoiseModel:
    """The noise of one released cell.

    Attributes:
        distribution: Discrete Gaussian (zCDP) or two-sided geometric (pure DP).
        variance: The cell's reported ``VARIANCE`` (of the whole, summed noise).
        parts: How many independent, identically distributed noises the cell adds up (2 for
            PH8_num cell 2, which is PH7 cells 2 + 3; 1 otherwise).
    """

    distribution: NoiseDistribution
    variance: float
    parts: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.variance) and self.variance >= 0):
            raise ValueError("VARIANCE must be finite and non-negative")
        if self.parts not in (1, 2):
            raise ValueError("only cells that sum one or two noises have an exact likelihood here")

    @property
    def is_noiseless(self) -> bool:
        return self.variance == 0

    @property
    def sd(self) -> float:
        return math.sqrt(self.variance)

    @functools.cached_property
    def _constants(self) -> tuple[float, ...]:
        """Constants of :meth:`log_pmf` that depend only on the model."""
        v = self.variance / self.parts  # variance of one part
        if self.distribution is NoiseDistribution.DISCRETE_GAUSSIAN:
            if self.parts == 1:
                return ()
            # Sum of two N_Z(0, v): sum_{j1 + j2 = x} exp(-(j1^2 + j2^2) / (2v)), and
            # j1^2 + j2^2 = 2 (j1 - x/2)^2 + x^2 / 2, so the pmf is
            # exp(-x^2 / (2V)) * theta(x mod 2) with V = 2v and
            # theta(r) = sum_m exp(-(m - r/2)^2 / v): a discrete Gaussian of variance
            # parameter V, reweighted by parity (theta(0) ≈ theta(1) unless v is small).
            m = np.arange(-int(40 * math.sqrt(v)) - 3, int(40 * math.sqrt(v)) + 4, dtype=np.float64)
            thetas = [np.logaddexp.reduce(-((m - r / 2.0) ** 2) / v) for r in (0, 1)]
            return (float(thetas[0]), float(thetas[1]))
        q = geometric_q(v)
        if self.parts == 1:
            return (math.log(q),)
        # Sum of two independent two-sided geometrics, P(Z = z) = c q^|z|, c = (1-q)/(1+q): for
        # x >= 0, sum_j q^(|j| + |x - j|) = q^x [(x + 1) + 2 q^2 / (1 - q^2)] (j in [0, x]
        # gives x + 1 terms q^x; j < 0 and j > x each give q^x q^2 / (1 - q^2)).
        return (math.log(q), 2.0 * q * q / (1.0 - q * q))

    def log_pmf(self, x: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """log P(Z = x) up to an additive constant (the same for every x), exactly.

        Args:
            x: Integer noise values.
        """
        x = np.asarray(x)
        if self.is_noiseless:
            return np.where(x == 0, 0.0, -np.inf)
        xf = x.astype(np.float64)
        if self.distribution is NoiseDistribution.DISCRETE_GAUSSIAN:
            out = -(xf * xf) / (2.0 * self.variance)
            if self.parts == 2:
                theta0, theta1 = self._constants
                out += np.where(x % 2 == 0, theta0, theta1)
            return out
        ax = np.abs(xf)
        if self.parts == 1:
            (log_q,) = self._constants
            return ax * log_q
        log_q, extra = self._constants
        return ax * log_q + np.log(ax + 1.0 + extra)

    def table_half_width(self) -> int:
        """A half-width B beyond which the pmf is negligible (< 1e-20 relative)."""
        if self.distribution is NoiseDistribution.DISCRETE_GAUSSIAN:
            # exp(-x^2 / (2V)) at x = 12 sd is e^-72; the parity factor is bounded.
            return int(math.ceil(12.0 * self.sd)) + 4
        q = geometric_q(self.variance / self.parts)
        scale = -1.0 / math.log(q)  # s
        # q^x (x + 1 + ...) <= 1e-25 well before x = s (60 + 2 log(1 + s)) + a few.
        return int(math.ceil(scale * (60.0 + 2.0 * math.log1p(scale)))) + 4

    @classmethod
    def of(cls, distribution: str | NoiseDistribution, variance: float, parts: int = 1) -> "NoiseModel":
        return cls(NoiseDistribution(distribution), float(variance), int(parts))


# --------------------------------------------------------------------------------------------
# Posterior of one cell under a flat prior on {0, 1, 2, ...}
# --------------------------------------------------------------------------------------------


@dataclass
class CellSummaries:
    """Posterior summaries of cells, aligned with the observations given."""

    mean: npt.NDArray[np.float64]
    median: npt.NDArray[np.int64]
    lower: npt.NDArray[np.int64]
    upper: npt.NDArray[np.int64]
    sd: npt.NDArray[np.float64]
    p_zero: npt.NDArray[np.float64]

    @classmethod
    def empty(cls, n: int) -> "CellSummaries":
        return cls(np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                   np.zeros(n), np.zeros(n))


def _first_at_least(cdf: npt.NDArray[np.float64], p: float) -> npt.NDArray[np.int64]:
    """Index of the first entry of each row of ``cdf`` that is >= p (the last if none is)."""
    hit = cdf >= p
    idx = hit.argmax(axis=-1)
    return np.where(hit.any(axis=-1), idx, cdf.shape[-1] - 1).astype(np.int64)


def hpd_rows(w: npt.NDArray[np.float64], level: float = CREDIBLE_LEVEL) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Highest-posterior-density set of each row of normalized weights ``w``: first and last index.

    The set is {n : w(n) >= c} with c the largest threshold whose set holds at least ``level``
    of the mass (ties at c are all included, so a symmetric posterior keeps a symmetric set). It
    is the smallest set with that mass; for a log-concave posterior -- every posterior here:
    the prior is flat on an interval and the likelihood log-concave -- it is an interval
    containing the mode.
    """
    w = np.atleast_2d(w)
    ordered = -np.sort(-w, axis=1)  # descending
    cum = np.cumsum(ordered, axis=1)
    k = _first_at_least(cum, level)
    threshold = ordered[np.arange(w.shape[0]), k]
    inside = w >= threshold[:, None]
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
        if 2 * big + 1 > _MAX_TABLE:
            raise PostprocessError(f"VARIANCE {model.variance!r} is too large to post-process exactly")
        x = np.arange(-big, big + 1, dtype=np.int64)
        logf = model.log_pmf(x)
        f = np.exp(logf - logf.max())
        f /= f.sum()
        # T(L) = P(|Z| > L) = 2 * sum_{x > L} f(x) (f is symmetric); summed from the outside in.
        positive = f[big + 1:]  # x = 1 .. big
        beyond = np.cumsum(positive[::-1])[::-1]  # beyond[i] = P(Z >= i + 1) = P(Z > i)
        ok = np.flatnonzero(2.0 * beyond <= _NOISE_TAIL)
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
        self._noise_median = int(self.x[_first_at_least(self.cdf, 0.5)])
        lo, hi = hpd_rows(self.pmf)
        self._noise_hpd = (int(self.x[lo[0]]), int(self.x[hi[0]]))

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
            out.median[:] = out.lower[:] = out.upper[:] = y
            out.p_zero[:] = y == 0
            return out
        shifted = y > self.half_width  # posterior = y + noise (window clear of 0)
        ys = y[shifted]
        out.mean[shifted] = ys + self.noise_mean
        out.median[shifted] = ys + self._noise_median
        out.lower[shifted] = ys + self._noise_hpd[0]
        out.upper[shifted] = ys + self._noise_hpd[1]
        out.sd[shifted] = self.noise_sd
        out.p_zero[shifted] = 0.0
        near = ~shifted
        if near.any():
            uniq, inverse = np.unique(y[near], return_inverse=True)
            mean = np.empty(uniq.size)
            sd = np.empty(uniq.size)
            p0 = np.empty(uniq.size)
            q = np.empty((3, uniq.size), dtype=np.int64)
            for block, width in self._blocks(uniq):
                w = self._weights(uniq[block], width)
                n = np.arange(width, dtype=np.float64)
                m = w @ n
                mean[block] = m
                sd[block] = np.sqrt(np.maximum((w * (n[None, :] - m[:, None]) ** 2).sum(axis=1), 0.0))
                p0[block] = w[:, 0]
                q[1, block] = _first_at_least(np.cumsum(w, axis=1), 0.5)
                q[0, block], q[2, block] = hpd_rows(w)
            idx = np.flatnonzero(near)
            out.mean[idx] = mean[inverse]
            out.sd[idx] = sd[inverse]
            out.p_zero[idx] = p0[inverse]
            out.lower[idx], out.median[idx], out.upper[idx] = q[0][inverse], q[1][inverse], q[2][inverse]
        return out

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
# Tables
# --------------------------------------------------------------------------------------------


def cell_parts(table: str, cells: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """How many measured noises each cell of ``table`` adds up (spec §5, derived tables)."""
    cells = np.asarray(cells, dtype=np.int64)
    parts = np.ones(cells.shape, dtype=np.int64)
    if table in DERIVED_TABLES:
        for number, sources in DERIVED_TABLES[table].cells:
            parts[cells == number] = len(sources)
    return parts


def _models(frame: pd.DataFrame, table: str) -> tuple[list[NoiseModel], npt.NDArray[np.int64]]:
    """Distinct noise models of a table's rows, and each row's index into them."""
    parts = cell_parts(table, frame[cell_column(table)].to_numpy())
    keys = pd.DataFrame({
        "d": frame["NOISE_DISTRIBUTION"].to_numpy(),
        "v": frame["VARIANCE"].to_numpy(dtype=np.float64),
        "k": parts,
    })
    codes, uniques = pd.MultiIndex.from_frame(keys).factorize()
    models = [NoiseModel.of(d, v, int(k) if v > 0 else 1) for d, v, k in uniques]
    return models, np.asarray(codes, dtype=np.int64)


def summarize_table(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """The private table with the per-cell posterior columns (:data:`COUNT_COLUMNS`) appended."""
    models, codes = _models(frame, table)
    y = frame["COUNT"].to_numpy(dtype=np.int64)
    s = CellSummaries.empty(len(frame))
    for i, model in enumerate(models):
        rows = np.flatnonzero(codes == i)
        part = posterior_for(model).summarize(y[rows])
        for name in ("mean", "median", "lower", "upper", "sd", "p_zero"):
            getattr(s, name)[rows] = getattr(part, name)
    out = frame.copy()
    out["ESTIMATE"] = s.mean
    out["MEDIAN"] = s.median
    out["CI90_LOWER"] = s.lower
    out["CI90_UPPER"] = s.upper
    out["POSTERIOR_SD"] = s.sd
    out["P_ZERO"] = s.p_zero
    return out


def sample_table(frame: pd.DataFrame, table: str, draws: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Posterior draws of every row of a private table: an int64 array (rows, draws)."""
    models, codes = _models(frame, table)
    y = frame["COUNT"].to_numpy(dtype=np.int64)
    out = np.empty((len(frame), draws), dtype=np.int64)
    for i, model in enumerate(models):
        rows = np.flatnonzero(codes == i)
        out[rows] = posterior_for(model).sample(y[rows], draws, rng)
    return out


def _row_quantiles(sorted_rows: npt.NDArray[np.float64], valid: npt.NDArray[np.int64], p: float) -> npt.NDArray[np.float64]:
    """Quantile ``p`` (numpy's default, linear) of the first ``valid[i]`` entries of each sorted
    row; NaN where a row has none."""
    k = valid.astype(np.float64)
    pos = p * np.maximum(k - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(valid - 1, 0))
    frac = pos - lo
    rows = np.arange(sorted_rows.shape[0])
    a = sorted_rows[rows, np.minimum(lo, sorted_rows.shape[1] - 1)]
    b = sorted_rows[rows, np.minimum(hi, sorted_rows.shape[1] - 1)]
    out = a + frac * (b - a)
    return np.where(valid > 0, out, np.nan)


def _row_hpd(sorted_rows: npt.NDArray[np.float64], valid: npt.NDArray[np.int64],
             level: float = CREDIBLE_LEVEL) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Shortest interval holding ceil(level * k) of the k valid (sorted, leading) draws of each
    row; NaN where a row has none."""
    rows, width_m = sorted_rows.shape
    m = np.ceil(level * valid - 1e-9).astype(np.int64)
    i = np.arange(width_m)[None, :]
    j = i + m[:, None] - 1
    ok = (j < valid[:, None]) & (m[:, None] > 0)
    jc = np.clip(j, 0, width_m - 1)
    with np.errstate(invalid="ignore"):
        width = np.take_along_axis(sorted_rows, jc, axis=1) - sorted_rows
    width = np.where(ok, width, np.inf)
    best = width.argmin(axis=1)
    r = np.arange(rows)
    lower = sorted_rows[r, best]
    upper = sorted_rows[r, jc[r, best]]
    none = valid == 0
    return np.where(none, np.nan, lower), np.where(none, np.nan, upper)


_GROUP_CHUNK = 512  # population groups per block of simulation (~100 MiB at 4000 draws)


def average_table(
    spec: AverageSpec,
    numerator: pd.DataFrame,
    denominator: pd.DataFrame,
    draws: int,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """The average table ``spec`` from the private numerator and denominator tables.

    Population groups present in both tables are kept (a level measured in only one of them
    has no average). Cells of a group that are missing from a table count as absent, not 0: a
    group lacking any cell an average needs is dropped.
    """
    num_col, den_col = cell_column(spec.numerator), cell_column(spec.denominator)
    need_num = sorted({c for _, cs, _ in spec.cells for c in cs})
    need_den = sorted({c for _, _, cs in spec.cells for c in cs})

    def wide(frame: pd.DataFrame, col: str, need: list[int]) -> pd.DataFrame:
        positions = frame.reset_index(drop=True).assign(_row=lambda f: np.arange(len(f)))
        return positions.pivot_table(index=list(GROUP_KEYS), columns=col, values="_row", aggfunc="first",
                                     sort=False).reindex(columns=need)

    num_pos, den_pos = wide(numerator, num_col, need_num), wide(denominator, den_col, need_den)
    num_pos.columns = [f"n{c}" for c in num_pos.columns]
    den_pos.columns = [f"d{c}" for c in den_pos.columns]
    groups = num_pos.join(den_pos, how="inner").dropna()
    num_rows = groups.iloc[:, : len(need_num)].to_numpy(dtype=np.int64)
    den_rows = groups.iloc[:, len(need_num):].to_numpy(dtype=np.int64)
    # Posterior means of the parts (exact): the mean of a sum is the sum of the means.
    num_mean = summarize_table(numerator, spec.numerator)["ESTIMATE"].to_numpy()
    den_mean = summarize_table(denominator, spec.denominator)["ESTIMATE"].to_numpy()

    n_groups, n_cells = len(groups), len(spec.cells)
    result = {name: np.full((n_groups, n_cells), np.nan) for name in
              ("ESTIMATE", "MEAN", "CI90_LOWER", "CI90_UPPER", "P_DENOMINATOR_POSITIVE",
               "NUMERATOR_ESTIMATE", "DENOMINATOR_ESTIMATE")}
    num_index, den_index = {c: i for i, c in enumerate(need_num)}, {c: i for i, c in enumerate(need_den)}
    for start in range(0, n_groups, _GROUP_CHUNK):
        sl = slice(start, min(n_groups, start + _GROUP_CHUNK))
        g_num, g_den = num_rows[sl], den_rows[sl]
        # Draws of every needed cell of these groups: (groups, cells, draws).
        nd = sample_table(numerator.iloc[g_num.ravel()], spec.numerator, draws, rng).reshape(*g_num.shape, draws)
        dd = sample_table(denominator.iloc[g_den.ravel()], spec.denominator, draws, rng).reshape(*g_den.shape, draws)
        for j, (_, ncells, dcells) in enumerate(spec.cells):
            top = nd[:, [num_index[c] for c in ncells], :].sum(axis=1).astype(np.float64)
            bottom = dd[:, [den_index[c] for c in dcells], :].sum(axis=1).astype(np.float64)
            positive = bottom > 0
            ratio = np.where(positive, top / np.where(positive, bottom, 1.0), np.nan)
            valid = positive.sum(axis=1)
            ordered = np.sort(ratio, axis=1)  # NaNs sort last
            result["ESTIMATE"][sl, j] = _row_quantiles(ordered, valid, 0.5)
            result["CI90_LOWER"][sl, j], result["CI90_UPPER"][sl, j] = _row_hpd(ordered, valid)
            with np.errstate(invalid="ignore", divide="ignore"):
                result["MEAN"][sl, j] = np.where(valid > 0, np.nansum(ratio, axis=1) / np.maximum(valid, 1), np.nan)
            result["P_DENOMINATOR_POSITIVE"][sl, j] = valid / draws
            result["NUMERATOR_ESTIMATE"][sl, j] = num_mean[g_num[:, [num_index[c] for c in ncells]]].sum(axis=1)
            result["DENOMINATOR_ESTIMATE"][sl, j] = den_mean[g_den[:, [den_index[c] for c in dcells]]].sum(axis=1)

    keys = groups.index.to_frame(index=False)
    frame = keys.loc[keys.index.repeat(n_cells)].reset_index(drop=True)
    frame[f"{spec.name}_DATA_CELL"] = np.tile([c for c, _, _ in spec.cells], n_groups)
    for name, values in result.items():
        frame[name] = values.ravel()
    frame["DRAWS"] = draws
    return frame[[*GROUP_KEYS, f"{spec.name}_DATA_CELL", *AVERAGE_COLUMNS]]


# --------------------------------------------------------------------------------------------
# Reading a private output directory (and nothing else)
# --------------------------------------------------------------------------------------------


def _inside(path: Path, root: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise PostprocessError(f"{path} is outside the output directory")
    return resolved


def read_private_outputs(output_dir: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    """Read the private tables of ``output_dir``; open nothing outside it.

    The digest of every table read is checked against ``manifest.json`` when the manifest lists
    it. Tables are read from ``<TABLE>/<TABLE>.csv`` (spec §7).

    Returns:
        Table name -> frame, and facts about the source (run id, digests of the files read).

    Raises:
        PostprocessError: Not a directory, no private table, bad columns or values, or a digest
            that disagrees with the manifest.
    """
    root = Path(output_dir).resolve()
    if not root.is_dir():
        raise PostprocessError(f"output directory {output_dir} does not exist")
    manifest: dict = {}
    manifest_path = root / MANIFEST
    if manifest_path.is_file():
        try:
            manifest = json.loads(_inside(manifest_path, root).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise PostprocessError(f"{MANIFEST} is not valid JSON") from None
        if manifest.get("mode") == "non-private":
            raise PostprocessError(f"{output_dir} holds non-private tables; post-processing needs private outputs")
    listed = manifest.get("files", {}) if isinstance(manifest.get("files"), dict) else {}
    tables: dict[str, pd.DataFrame] = {}
    digests: dict[str, str] = {}
    for table in OUTPUT_TABLES:
        rel = f"{table}/{table}.csv"
        path = root / rel
        if not path.is_file():
            continue
        path = _inside(path, root)
        digest = file_digest(path)
        if rel in listed and listed[rel] != digest:
            raise PostprocessError(f"{rel}: SHA-256 differs from {MANIFEST}; the outputs were modified")
        digests[rel] = digest
        tables[table] = _read_private_csv(path, table)
    if not tables:
        raise PostprocessError(f"{output_dir} holds no private output table (<TABLE>/<TABLE>.csv)")
    return tables, {"run_id": manifest.get("run_id"), "privacy_defn": manifest.get("privacy_defn"),
                    "manifest": manifest_path.is_file(), "files": digests}


def _read_private_csv(path: Path, table: str) -> pd.DataFrame:
    columns = private_columns(table)
    with open(path, "r", encoding="utf-8", newline="") as fh:
        frame = pd.read_csv(fh, sep=CSV_SEPARATOR, dtype=str, keep_default_na=False)
    if list(frame.columns) != columns:
        if "NOISE_DISTRIBUTION" not in frame.columns:
            raise PostprocessError(f"{table}: no NOISE_DISTRIBUTION/VARIANCE columns -- not a private output")
        raise PostprocessError(f"{table}: columns {list(frame.columns)} are not the private columns {columns}")
    try:
        frame[cell_column(table)] = frame[cell_column(table)].astype(np.int64)
        frame["COUNT"] = frame["COUNT"].astype(np.int64)
        frame["VARIANCE"] = frame["VARIANCE"].astype(np.float64)
    except (ValueError, OverflowError):
        raise PostprocessError(f"{table}: COUNT, VARIANCE or the cell column is not numeric") from None
    known = {d.value for d in NoiseDistribution}
    if not frame["NOISE_DISTRIBUTION"].isin(known).all():
        raise PostprocessError(f"{table}: NOISE_DISTRIBUTION must be one of {sorted(known)}")
    var = frame["VARIANCE"].to_numpy()
    if not (np.isfinite(var) & (var >= 0)).all():
        raise PostprocessError(f"{table}: VARIANCE must be finite and non-negative")
    if "ITERATION_CODE" not in frame.columns:
        frame.insert(2, "ITERATION_CODE", "*")
        frame.attrs["iteration_column"] = False
    return frame


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


@dataclass
class PostprocessResult:
    """What :func:`postprocess` wrote.

    Attributes:
        destination: The directory written.
        files: Relative path -> SHA-256 of every file written.
        seed: The seed of the simulation (given or drawn).
        tables: Table name -> number of rows written.
    """

    destination: Path
    files: dict[str, str]
    seed: int
    tables: dict[str, int] = field(default_factory=dict)


def default_destination(output_dir: Path) -> Path:
    """``<OUT>-postprocessed`` next to the output directory (never inside it: the published
    directory must hold exactly the files its manifest and ledger list)."""
    output_dir = Path(output_dir).absolute()
    return output_dir.parent / f"{output_dir.name}-postprocessed"


def postprocess(
    output_dir: Path,
    destination: Path | None = None,
    *,
    draws: int = DEFAULT_DRAWS,
    seed: int | None = None,
    overwrite: bool = False,
    progress: "Progress | None" = None,
) -> PostprocessResult:
    """Post-process the private output directory ``output_dir`` (no access to any input data).

    Writes, to ``destination`` (default :func:`default_destination`), for every private table
    ``<TABLE>.csv`` (``|``-separated) and ``<TABLE>.parquet`` with the per-cell posterior columns,
    the average tables ``PH1``, ``PH5`` and ``PH8`` likewise, ``README.md`` (the columns) and
    ``postprocess.json`` (source, seed, draws, bounds, file digests), and a summary report
    (``report.md``, ``report.html``). The destination appears atomically (written to a hidden
    sibling, then renamed); an existing destination is replaced only with ``overwrite``.

    Args:
        output_dir: A published private output directory.
        destination: Where to write: a new or empty folder (or any folder, with ``overwrite``).
        draws: Posterior draws per cell for the averages.
        seed: Seed of the simulation; drawn at random (and recorded) when None.
        overwrite: Replace an existing destination that holds files (after the new one is
            complete).
        progress: Where to report the stages and tables (:mod:`phsafe.progress`).

    Raises:
        PostprocessError: The outputs cannot be read, or the destination holds files and
            ``overwrite`` is not set.
    """
    from phsafe.progress import NULL

    progress = progress or NULL
    if draws < 1:
        raise PostprocessError("draws must be at least 1")
    output_dir = Path(output_dir).absolute()
    destination = Path(destination).absolute() if destination is not None else default_destination(output_dir)
    root = output_dir.resolve()
    if destination.resolve().is_relative_to(root):
        raise PostprocessError("the destination must be outside the output directory (its manifest lists every file)")
    if destination.exists() and not destination.is_dir():
        raise PostprocessError(f"destination {destination} is a file, not a folder")
    replace = destination.is_dir() and any(destination.iterdir())
    if replace and not overwrite:
        raise PostprocessError(f"destination {destination} already exists and holds files; choose a new one, "
                               "or replace it with --overwrite")
    with progress.stage("read the release"):
        tables, source = read_private_outputs(output_dir)
    if seed is None:
        seed = secrets.randbits(63)
    rng = np.random.default_rng(seed)
    log.info("postprocess", output=str(output_dir), destination=str(destination), tables=len(tables),
             draws=draws, seed=seed)

    frames: dict[str, pd.DataFrame] = {}
    with progress.stage("posterior of every cell"), \
            progress.task("tables", total=len(tables), unit="tables") as task:
        for table, frame in tables.items():
            task.advance(0, item=table)
            out = summarize_table(frame, table)
            if frame.attrs.get("iteration_column") is False:
                out = out.drop(columns="ITERATION_CODE")
            frames[table] = out
            task.advance(item="")
    with progress.stage("averages PH1, PH5, PH8"), \
            progress.task("averages", total=len(AVERAGES), unit="averages") as task:
        for spec in AVERAGES.values():
            task.advance(0, item=spec.name)
            if spec.numerator in tables and spec.denominator in tables:
                frames[spec.name] = average_table(spec, tables[spec.numerator], tables[spec.denominator], draws, rng)
            else:
                log.warning("average not computed: a table is missing", average=spec.name)
            task.advance(item="")

    if destination.is_dir() and not replace:
        destination.rmdir()  # an empty folder given as the destination: published in its place
    with progress.stage("write"):
        files = _publish(frames, destination, replace, source=output_dir, facts=source, seed=seed, draws=draws)
    log.info("postprocess written", destination=str(destination), files=len(files))
    return PostprocessResult(destination, files, seed, {t: len(f) for t, f in frames.items()})


def _publish(frames: Mapping[str, pd.DataFrame], destination: Path, replace: bool, *, source: Path,
             facts: Mapping[str, object], seed: int, draws: int) -> dict[str, str]:
    """Write everything into a hidden sibling of ``destination`` and rename it into place; an
    existing destination (``replace``) is moved aside only once the new folder is complete."""
    publication = Publication(destination, Publication.staging_path(destination, uuid.uuid4().hex[:12]))
    destination.parent.mkdir(parents=True, exist_ok=True)
    publication.staging.mkdir()
    try:
        files = _write(frames, publication.staging)
        readme = publication.staging / README
        readme.write_text(columns_doc(), encoding="utf-8")
        files[README] = file_digest(readme)
        report = build_report(frames, source=source, run_id=facts.get("run_id"), seed=seed, draws=draws)  # type: ignore[arg-type]
        for path in report.write(publication.staging / REPORT_MD, publication.staging / REPORT_HTML):
            files[path.name] = file_digest(path)
        metadata = {
            "source": {"output_dir": str(source), **facts},
            "seed": seed,
            "draws": draws,
            "credible_level": CREDIBLE_LEVEL,
            "tail_bound": TAIL_BOUND,
            "estimate": "posterior mean (flat prior on the non-negative integers)",
            "code_version": phsafe.__version__,
            "created": datetime.now(timezone.utc).isoformat(),
            "tables": {t: len(f) for t, f in frames.items()},
            "files": files,
        }
        (publication.staging / POSTPROCESS_METADATA).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n",
                                                                encoding="utf-8")
        old = None
        if replace:
            old = destination.parent / f".{destination.name}.replaced-{uuid.uuid4().hex[:12]}"
            os.rename(destination, old)
        publication.publish()
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        publication.abandon()
        raise
    return files


def _write(frames: Mapping[str, pd.DataFrame], directory: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for name, frame in frames.items():
        csv_path = directory / f"{name}.csv"
        frame.to_csv(csv_path, sep=CSV_SEPARATOR, index=False, lineterminator="\n")
        pq_path = directory / f"{name}.parquet"
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), pq_path)
        for p in (csv_path, pq_path):
            files[p.name] = file_digest(p)
    return files


def _n(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) >= 1 else f"{x:.3f}"


def build_report(frames: Mapping[str, pd.DataFrame], *, source: Path, run_id: str | None, seed: int,
                 draws: int):  # type: ignore[no-untyped-def]
    """A summary of the post-processed tables as a :class:`phsafe._plots.Document`: per table,
    how wide the credible intervals are and how many cells are probably zero; the national
    averages with their intervals; what every column means."""
    from phsafe._plots import Bullets, Document, Heading, Para, Table
    from phsafe.datapackage import REGION_NAMES
    from phsafe.tables import output_spec

    doc = Document("PHSafe post-processed estimates")
    doc.add(Para("Estimates and 90% credible intervals computed from the published private tables alone "
                 "(no input data, no privacy-loss budget). Files: `<TABLE>.csv` (`|`-separated) and "
                 "`<TABLE>.parquet`; `README.md` describes every column, `postprocess.json` the source "
                 "and its digests."))
    doc.add(Table(("Field", "Value"), [
        ["Source release", f"`{source}`"],
        ["Run", "-" if run_id is None else f"`{run_id}`"],
        ["Seed of the simulated averages", str(seed)],
        ["Draws per cell (averages)", str(draws)],
        ["Prior", "flat on the non-negative integers"],
    ]))
    rows = []
    for table, frame in frames.items():
        if table in AVERAGES:
            continue
        width = (frame["CI90_UPPER"] - frame["CI90_LOWER"]).to_numpy(dtype=float)
        rows.append([f"{table}: {output_spec(table).title}", f"{len(frame):,}", _n(float(np.median(width))),
                     _n(float(width.max())), f"{float(frame['P_ZERO'].mean()):.3f}",
                     f"{float((frame['COUNT'] < 0).mean()):.3f}"])
    doc.add(Heading(2, "Count tables"), Table(
        ("Table", "Cells", "Median 90% interval width", "Widest interval", "Mean P(n = 0)",
         "Share of released counts < 0"), rows))
    national = []
    for name, spec in AVERAGES.items():
        frame = frames.get(name)
        if frame is None:
            continue
        cell = f"{name}_DATA_CELL"
        top = frame[(frame["REGION_TYPE"] == "USA") & (frame["ITERATION_CODE"] == "*")]
        if top.empty:  # Puerto Rico: its own state row
            top = frame[(frame["REGION_TYPE"] == "STATE") & (frame["ITERATION_CODE"] == "*")].head(len(spec.cells))
        labels = dict(output_spec(spec.numerator).cell_labels)
        for r in top.itertuples(index=False):
            row = r._asdict()
            region = str(row["REGION_ID"])
            national.append([f"{name} cell {row[cell]} ({labels.get(row[cell], '')})", REGION_NAMES.get(region, region),
                             _n(row["ESTIMATE"]), f"{_n(row['CI90_LOWER'])} to {_n(row['CI90_UPPER'])}",
                             f"{row['P_DENOMINATOR_POSITIVE']:.3f}"])
    if national:
        doc.add(Heading(2, "Averages, total population group"), Table(
            ("Average", "Region", "Estimate (median)", "90% credible interval", "P(denominator > 0)"), national))
    doc.add(Heading(2, "Columns"), Bullets([
        "Count tables: the private columns, then `ESTIMATE` (posterior mean), `MEDIAN`, `CI90_LOWER` and "
        "`CI90_UPPER` (90% highest-posterior-density credible interval), `POSTERIOR_SD` and `P_ZERO` "
        "(posterior probability that the true count is 0).",
        "Average tables PH1, PH5, PH8: `ESTIMATE` (median of the simulated ratios), `MEAN`, `CI90_LOWER`, "
        "`CI90_UPPER`, `P_DENOMINATOR_POSITIVE`, `NUMERATOR_ESTIMATE`, `DENOMINATOR_ESTIMATE`, `DRAWS`.",
        "Credible intervals cover the noise of disclosure avoidance only, not truncation (tau) or other "
        "non-sampling error.",
    ]))
    return doc


def columns_doc() -> str:
    """The README written next to the post-processed tables."""
    return f"""# Post-processed PHSafe outputs

Computed by `phsafe postprocess` from the published private tables only (no input data; no
privacy-loss budget). Files: `<TABLE>.csv` (`{CSV_SEPARATOR}`-separated) and `<TABLE>.parquet`, same
columns; `postprocess.json` records the source directory, its run id, the SHA-256 of every table
read, the seed and the number of draws.

## Count tables (PH1_num ... PH8_denom)

The private columns (`REGION_ID{CSV_SEPARATOR}REGION_TYPE{CSV_SEPARATOR}ITERATION_CODE{CSV_SEPARATOR}<TABLE>_DATA_CELL{CSV_SEPARATOR}COUNT{CSV_SEPARATOR}NOISE_DISTRIBUTION{CSV_SEPARATOR}VARIANCE`,
`ITERATION_CODE` absent for PH2 and PH6), then the posterior of the cell's true count n given
its released COUNT, under a flat prior on n = 0, 1, 2, ... and the exact likelihood of the
noise (discrete Gaussian or two-sided geometric of the stated VARIANCE; PH8_num cell 2 is the
sum of two such noises):

| column | meaning |
|---|---|
| ESTIMATE | posterior mean of n (>= 0; a float) |
| MEDIAN | posterior median of n (an integer) |
| CI90_LOWER | lower end of the 90% highest-posterior-density credible interval (the shortest interval holding >= 90% of the posterior) |
| CI90_UPPER | upper end of that interval (inclusive) |
| POSTERIOR_SD | posterior standard deviation of n |
| P_ZERO | posterior probability that n = 0 |

VARIANCE 0 (no noise, test runs only): the posterior is the released count itself.

## Average tables PH1, PH5, PH8

`REGION_ID{CSV_SEPARATOR}REGION_TYPE{CSV_SEPARATOR}ITERATION_CODE{CSV_SEPARATOR}<T>_DATA_CELL` then:

| column | meaning |
|---|---|
| ESTIMATE | median of the simulated ratio (numerator draw / denominator draw, draws with a positive denominator) |
| MEAN | mean of those ratio draws |
| CI90_LOWER, CI90_UPPER | the shortest interval holding 90% of those draws: a 90% credible interval of the average |
| P_DENOMINATOR_POSITIVE | share of the draws whose denominator is positive (the others are left out) |
| NUMERATOR_ESTIMATE | posterior mean of the numerator (sum of the parts' posterior means) |
| DENOMINATOR_ESTIMATE | posterior mean of the denominator |
| DRAWS | number of independent draws per cell |

Cells: PH1 and PH5 -- 1 = (num 2 + num 3) / denom 1, 2 = num 2 / denom 1, 3 = num 3 / denom 1
(PH1_num / PH1_denom; PH5_num / PH5_denom). PH8 -- 1 = (PH8_num 2 + 3) / (PH8_denom 2 + 3),
2 = owner: PH8_num 2 / PH8_denom 2, 3 = renter: PH8_num 3 / PH8_denom 3. A population group
whose numerator or denominator level was not released has no row. When no draw has a positive
denominator the ratio columns are empty (NaN).

Credible intervals cover the noise of disclosure avoidance only, not truncation (tau) or other
non-sampling error.
"""
