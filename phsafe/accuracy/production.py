"""The Census Bureau's production post-processing, re-implemented for the accuracy comparison only.

``phsafe accuracy`` puts our estimates (:mod:`phsafe.postprocess`) beside those of the method the
Census Bureau used for the S-DHC model-based estimates (``MODEL_BASED_ESTIMATES.md`` §3-§4), run
on the same noisy tables. Nothing else uses this module: its estimates are never published.

Count tables (§3): each internal cell's posterior is N(Z, D) truncated to [0, inf) -- the noise
taken as continuous, a flat prior on Y >= 0, cells independent.

* ``PRED`` = round(Z + sigma phi(a) / (1 - Phi(a))), a = -Z / sigma, rounded half to even (R's
  ``round``), with the production's formula as written: 1 - Phi(a) cancels to 0 for Z below
  about -8.3 sigma, and the estimate is then Inf or NaN -- counted as outside the bounds.
* An internal cell's ``PRED_LO``/``PRED_HI``: floor of the 5% and ceiling of the 95% quantile of
  1,000,000 draws in the production. We use the exact quantiles of the truncated normal (the
  limit of those draws; the spec notes the closed form): 10^6 draws move a quantile by about
  0.002 sigma, which the floor and ceiling absorb but for the rare quantile within that of an
  integer.
* A marginal cell: ``PRED`` the sum of its internal cells' rounded ``PRED``; its interval floor
  and ceiling of the type-7 quantiles of the draw-by-draw sums of ``draws`` independent draws of
  each internal cell (the production: 10^6; the default here 20,000, whose Monte Carlo error is
  about 0.01 of the marginal's sd at the 5% and 95% quantiles).

Ratio tables (§4): the truncated multivariate normal N(Z, diag(v)) on the production's polytope
l <= A Y <= u (:mod:`phsafe.postprocess.polytope`: its rows, its data-dependent upper bounds
noisy + 6 sigma, kappa = ``trun`` = 10), sampled as the production does -- a Gibbs sampler in
whitened coordinates (each coordinate in turn from its truncated normal conditional), started
at the Euclidean projection of Z onto the shrunken set l + 0.5 <= A Y <= u - 0.5, 20,010 sweeps
of which every second from the 12th is kept (10,000 draws; the package's burn-in 10 and thinning
1 as the production calls it). ``RATIO_PRED`` the mean of the ratio draws, ``RATIO_PRED_LO``/
``_HI`` their type-7 5% and 95% quantiles, ``PRED_NUM``/``PRED_DENOM`` the means of numerator
and denominator. PH1 and PH5: one model of (N2, N3, H) per population group; PH8: one model of
(P, U) per row, the total from the summed counts and variances of cells 2 and 3.

Where the production stops -- a row with l >= u, or an empty shrunken set (its quadratic
program is infeasible) -- the whole production run fails; here only that model is marked failed
(NaN), so that the comparison can go on and count how often it happens (``FAILED``).

Our sampler and the production's differ in their random streams (the production's depends on
R's generator, the package versions and the row order, so it cannot be matched draw for draw;
§3 step 7), not in what they sample.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.special import log_ndtr, ndtr, ndtri, ndtri_exp

from phsafe.outputs import cell_column
from phsafe.postprocess import GROUP_KEYS, RATIO_SHELLS
from phsafe.postprocess.census import count_file_frame, ratio_file_frame
from phsafe.postprocess.polytope import Polytope, own_denominator_polytope, project, shared_denominator_polytope
from phsafe.postprocess.shells import COUNT_SHELLS, marginal_cells

Array = npt.NDArray[np.float64]

TRUN = 10
"""kappa, the production's upper bound of every average (``trun`` in its global config)."""
EXCLUDED_LEVELS = ("TRACT", "PLACE", "BLOCK_GROUP", "AIANNH")
COUNT_DRAWS = 20_000
"""Draws per internal cell for a marginal cell's interval (the production: 1,000,000)."""
GIBBS_DRAWS = 10_000
GIBBS_BURN = 10
GIBBS_THIN = 1
"""The production's sampler settings (10,000 draws hard-coded; the package's defaults)."""
SAMPLE_FLOATS = 4_000_000
"""Most truncated-normal draws held at once for the marginal cells' sums (32 MB)."""
CHUNK = 512
"""Population groups sampled together (the kept draws of a chunk: CHUNK x 10,000 x d floats)."""


# --------------------------------------------------------------------------------------------
# Count tables
# --------------------------------------------------------------------------------------------


def truncated_normal_mean(z: Array, sigma: Array) -> Array:
    """The production's PRED before rounding: Z + sigma phi(a) / (1 - Phi(a)), a = -Z / sigma,
    computed as it is written (1 - Phi(a) cancels for large a: Inf or NaN there)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = -z / sigma
        phi = np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
        return z + sigma * phi / (1.0 - ndtr(a))


def truncated_normal_quantile(z: Array, sigma: Array, p: float) -> Array:
    """The p-quantile of N(z, sigma^2) truncated to [0, inf), in the upper-tail form
    z - sigma Phi^-1(p'), p' computed in logs (exact even far in the tail)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = -z / sigma
        log_upper = log_ndtr(-a)  # log P(X > 0) of the untruncated normal, standardized
        # P(X > x | X > 0) = 1 - p  ->  log P(Std > (x - z) / sigma) = log(1 - p) + log_upper
        return z - sigma * ndtri_exp(math.log1p(-p) + log_upper)


def sample_truncated_normal(z: Array, sigma: Array, draws: int, rng: np.random.Generator) -> Array:
    """``draws`` independent draws of each N(z_i, sigma_i^2) truncated to [0, inf): shape
    (cells, draws), by the inverse cdf in the upper-tail form."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (-z / sigma)[:, None]
        log_upper = log_ndtr(-a)
        log_u = np.log1p(-rng.random((z.size, draws)))  # log of a uniform on (0, 1]
        return z[:, None] - sigma[:, None] * ndtri_exp(log_u + log_upper)


def count_table_estimates(frame: pd.DataFrame, table: str, rng: np.random.Generator,
                          draws: int = COUNT_DRAWS) -> pd.DataFrame:
    """A count table by the production's method, in the layout of
    :func:`phsafe.postprocess.counts.count_estimates` (the columns the Census writer reads:
    ESTIMATE is PRED, CI90_ET_LOWER/UPPER are PRED_LO/HI), so that
    :func:`~phsafe.postprocess.census.count_file_frame` lays it out as the production does."""
    cell = cell_column(table)
    rows = frame[~frame["REGION_TYPE"].isin(EXCLUDED_LEVELS)].reset_index(drop=True).copy()
    z = rows["COUNT"].to_numpy(dtype=np.float64)
    sigma = np.sqrt(rows["VARIANCE"].to_numpy(dtype=np.float64))
    pred = np.round(truncated_normal_mean(z, sigma))  # numpy rounds half to even, as R
    with np.errstate(invalid="ignore"):
        lo = np.floor(truncated_normal_quantile(z, sigma, 0.05))
        hi = np.ceil(truncated_normal_quantile(z, sigma, 0.95))
    rows["ESTIMATE"], rows["CI90_ET_LOWER"], rows["CI90_ET_UPPER"] = pred, lo, hi
    rows["MARGINAL"], rows["SOURCE_ROW"] = False, np.arange(len(rows))
    built = []
    index = {k: i for i, k in enumerate(zip(*(rows[c].astype(str) for c in (*GROUP_KEYS, cell))))}
    groups = rows[list(GROUP_KEYS)].astype(str).drop_duplicates().itertuples(index=False, name=None)
    groups = list(groups)
    for number, parts in marginal_cells(table):
        members = np.array([[index.get((*g, str(p)), -1) for p in parts] for g in groups], dtype=np.int64)
        complete = (members >= 0).all(axis=1)
        members = members[complete]
        if not len(members):
            continue
        keys = [g for g, ok in zip(groups, complete) if ok]
        q = np.empty((2, len(members)))
        per_chunk = max(1, SAMPLE_FLOATS // (len(parts) * draws))  # bounded memory
        for first in range(0, len(members), per_chunk):
            chunk = members[first:first + per_chunk]
            flat = chunk.ravel()
            sample = sample_truncated_normal(z[flat], sigma[flat], draws, rng).reshape(len(chunk), len(parts), draws)
            q[:, first:first + len(chunk)] = np.quantile(sample.sum(axis=1), [0.05, 0.95], axis=1, method="linear")
        part = pd.DataFrame(keys, columns=list(GROUP_KEYS))
        part[cell] = number
        part["COUNT"] = z[members].sum(axis=1)
        part["VARIANCE"] = (sigma[members] ** 2).sum(axis=1)
        part["ESTIMATE"] = pred[members].sum(axis=1)
        part["CI90_ET_LOWER"], part["CI90_ET_UPPER"] = np.floor(q[0]), np.ceil(q[1])
        part["MARGINAL"], part["SOURCE_ROW"] = True, -1
        built.append(part)
    return pd.concat([rows, *built], ignore_index=True)


# --------------------------------------------------------------------------------------------
# Ratio tables: the truncated multivariate normal on the production's polytope
# --------------------------------------------------------------------------------------------


def _truncated_standard_normal(lo: Array, hi: Array, u: Array) -> Array:
    """Inverse-cdf draws of N(0, 1) truncated to [lo, hi] (per element), in logs on the side
    away from 0 so that intervals far in a tail keep their precision."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _truncated_standard_normal_raw(lo, hi, u)


def _truncated_standard_normal_raw(lo: Array, hi: Array, u: Array) -> Array:
    """:func:`_truncated_standard_normal` without its floating-point context (the Gibbs sweep
    sets it once for all its calls). Each element's formula is evaluated for that element only
    (the tail's in logs where the interval does not straddle 0, the plain cdf's where it does):
    the same numbers as evaluating both everywhere and keeping one, at about half the cost."""
    upper = lo + hi >= 0  # more of the interval above 0: use the upper tail
    a = np.where(upper, lo, -hi)  # mirrored to the upper side
    b = np.where(upper, hi, -lo)
    mid = (a < 0) & (b > 0)  # straddling 0: the plain cdf is precise
    pa, pb = ndtr(a), ndtr(b)
    x = ndtri(pa + u * (pb - pa))
    if not mid.all():
        tail = ~mid
        at, bt, ut = a[tail], b[tail], u[tail]
        la, lb = log_ndtr(-at), log_ndtr(-bt)  # log P(S > a) >= log P(S > b)
        # P(S > x) = P(S > a) - u (P(S > a) - P(S > b))
        x[tail] = -ndtri_exp(la + np.log1p(-ut * -np.expm1(lb - la)))
    x = np.minimum(np.maximum(x, a), b)  # np.clip(x, a, b), without its Python wrapper
    return np.where(upper, x, -x)


class _Block:
    """Groups of one dimension sampled together, and the stream of their uniforms."""

    def __init__(self, z: Array, sd: Array, A: Array, lower: Array, upper: Array, start: Array,
                 stream: np.random.Generator) -> None:
        self.z, self.sd, self.A, self.lower, self.upper, self.start = z, sd, A, lower, upper, start
        self.stream = stream

    @property
    def groups(self) -> int:
        return self.z.shape[0]

    @property
    def d(self) -> int:
        return self.z.shape[1]


SWEEP_BLOCK = 256
"""Sweeps whose uniforms are drawn in one call (the same numbers as one call per sweep)."""


def _sweeps(blocks: list[_Block], draws: int, burn: int, thin: int) -> list[Array]:
    """The Gibbs sweeps of :func:`gibbs_truncated_normal` for several blocks at once -- of any
    dimensions -- each drawing its uniforms from its own stream exactly as if it were sampled
    alone: per sweep, ``stream.random((d, groups))``.

    The blocks share one sweep loop: a block of lower dimension is padded with coordinates no
    row involves (never updated, and taking no uniforms from its stream) and rows whose
    coefficients are all 0; the groups are laid out by dimension, highest first, so that the
    update of coordinate j touches the prefix of groups that have it. The arithmetic of every
    coordinate update is the single block's (the same operations in the same order, per
    element), so that the draws are those of the blocks sampled one after the other.
    """
    order = sorted(range(len(blocks)), key=lambda k: -blocks[k].d)  # coordinate j: a prefix of the groups
    D = max(b.d for b in blocks)
    R = max(b.A.shape[-2] for b in blocks)
    G = sum(b.groups for b in blocks)
    # Laid out (coordinate or row, group): an update reads and writes contiguous rows.
    coef = np.zeros((D, R, G))
    low = np.full((R, G), -np.inf)
    high = np.full((R, G), np.inf)
    x = np.zeros((D, G))
    ax = np.zeros((R, G))
    z = np.zeros((D, G))
    sd = np.ones((D, G))
    cols: list[slice] = [slice(0)] * len(blocks)
    at = 0
    for k in order:
        b = blocks[k]
        g, d, r = b.groups, b.d, b.A.shape[-2]
        sl = slice(at, at + g)
        cols[k] = sl
        c = b.A * b.sd[:, None, :]  # A diag(sd)
        coef[:d, :r, sl] = c.transpose(2, 1, 0)
        low[:r, sl] = (b.lower - np.einsum("grd,gd->gr", b.A, b.z)).T
        high[:r, sl] = (b.upper - np.einsum("grd,gd->gr", b.A, b.z)).T
        start = (b.start - b.z) / b.sd
        x[:d, sl] = start.T
        ax[:r, sl] = np.einsum("grd,gd->gr", c, start).T  # A diag(sd) x per row
        z[:d, sl], sd[:d, sl] = b.z.T, b.sd.T
        at += g
    # Per coordinate: the groups that have it (a prefix), the rows that bound it (a row without
    # it bounds nothing: -inf, inf), and the divisor of its bounds (1 where the row lacks it).
    n_of, c_of, div_of, low_of, high_of = [], [], [], [], []
    for j in range(D):
        n = sum(b.groups for b in blocks if b.d > j)
        c = np.ascontiguousarray(coef[j, :, :n])
        free = c == 0
        n_of.append(n)
        c_of.append(c)
        div_of.append(np.where(free, 1.0, c))
        low_of.append(np.where(free, -np.inf, low[:, :n]))
        high_of.append(np.where(free, np.inf, high[:, :n]))
    out = np.empty((draws, D, G))
    step = thin + 1
    first = burn + step
    total = first + (draws - 1) * step
    u_block = np.empty((SWEEP_BLOCK, D, G))  # padded coordinates: never read
    kept = 0
    with np.errstate(divide="ignore", invalid="ignore"):
        for block_start in range(1, total + 1, SWEEP_BLOCK):
            n = min(SWEEP_BLOCK, total + 1 - block_start)
            for b, sl in zip(blocks, cols):
                u_block[:n, :b.d, sl] = b.stream.random((n, b.d, b.groups))
            for i in range(n):
                sweep = block_start + i
                u = u_block[i]
                for j in range(D):
                    m, c = n_of[j], c_of[j]
                    rest = ax[:, :m] - c * x[j, :m]
                    t1 = (low_of[j] - rest) / div_of[j]
                    t2 = (high_of[j] - rest) / div_of[j]
                    lo = np.minimum(t1, t2).max(axis=0)
                    hi = np.maximum(t1, t2).min(axis=0)
                    new = _truncated_standard_normal_raw(lo, hi, u[j, :m])
                    ax[:, :m] = rest + c * new
                    x[j, :m] = new
                if sweep >= first and (sweep - first) % step == 0:
                    out[kept] = z + sd * x
                    kept += 1
    return [out[:, :b.d, sl].transpose(0, 2, 1) for b, sl in zip(blocks, cols)]


def gibbs_truncated_normal(z: Array, sd: Array, A: Array, lower: Array, upper: Array, start: Array,
                           rng: np.random.Generator, draws: int = GIBBS_DRAWS, burn: int = GIBBS_BURN,
                           thin: int = GIBBS_THIN) -> Array:
    """Kept draws of N(z, diag(sd^2)) truncated to lower <= A y <= upper, every group at once
    (its own A: shape (groups, rows, d)), by Gibbs sweeps in whitened coordinates
    x = (y - z) / sd from ``start``, as the production's sampler: each sweep updates the
    coordinates in turn, each from its truncated normal conditional (by the inverse cdf of one
    uniform; ``rng.random((d, groups))`` per sweep).

    Returns:
        (draws, groups, d) draws of y: after ``burn + thin + 1`` sweeps, every ``thin + 1``-th
        (the production: sweeps 12, 14, ..., 20,010).
    """
    [y] = _sweeps([_Block(z, sd, A, lower, upper, start, rng)], draws, burn, thin)
    return y


def _type7(values: Array, p: float) -> Array:
    return np.quantile(values, p, axis=0, method="linear")


def _substreams(rng: np.random.Generator, sizes: list[int]) -> list[np.random.Generator] | None:
    """Generators that draw what ``rng`` would draw next in consecutive pieces of ``sizes``
    doubles, and ``rng`` advanced past them all -- or None if its bit generator cannot jump
    ahead (then the pieces are sampled one after the other from ``rng`` itself)."""
    bit = rng.bit_generator
    if not hasattr(bit, "advance"):
        return None
    streams, offset = [], 0
    for size in sizes:
        copy = type(bit)(0)  # (a seed, not the system's entropy: the state is replaced)
        copy.state = bit.state
        copy.advance(offset)  # one 64-bit output per double
        streams.append(np.random.Generator(copy))
        offset += size
    bit.advance(offset)
    return streams


def fit_models(models: list[tuple[Array, Array, Polytope]], rng: np.random.Generator,
               draws: int = GIBBS_DRAWS) -> list[Array]:
    """Draws (draws, groups, d) of each model (z, variances, polytope) whose groups the
    production's sampler accepts -- every row l < u and a non-empty shrunken set, its start the
    Euclidean projection of z onto that set -- and NaN for the others.

    The groups are sampled in chunks of at most :data:`CHUNK` of one dimension, smallest
    dimension first, each chunk's uniforms the next ones of ``rng`` (as if each chunk were
    sampled in turn); chunks of different dimensions share one sweep loop (:func:`_sweeps`),
    up to :data:`CHUNK` groups in all, each with its own piece of ``rng``'s stream.
    """
    starts, oks = [], []
    for z, _, poly in models:
        ok = np.all(poly.lower < poly.upper, axis=1) & np.all(np.isfinite(poly.upper), axis=1)
        start, feasible = project(z, poly.A, poly.lower + 0.5, poly.upper - 0.5)
        starts.append(start)
        oks.append(ok & feasible)
    results = [np.full((draws, *z.shape), np.nan) for z, _, _ in models]
    chunks = []  # (block arrays, model_of, group_of) in the order their uniforms are drawn
    for d in sorted({z.shape[1] for z, _, _ in models}):
        members = [i for i, (z, _, _) in enumerate(models) if z.shape[1] == d]
        z = np.concatenate([models[i][0][oks[i]] for i in members])
        v = np.concatenate([models[i][1][oks[i]] for i in members])
        A = np.concatenate([np.broadcast_to(models[i][2].A, (int(oks[i].sum()), *models[i][2].A.shape))
                            for i in members])
        lower = np.concatenate([models[i][2].lower[oks[i]] for i in members])
        upper = np.concatenate([models[i][2].upper[oks[i]] for i in members])
        start = np.concatenate([starts[i][oks[i]] for i in members])
        # where each sampled group goes: (model, group) -- the draws are written there chunk by chunk
        model_of = np.concatenate([np.full(int(oks[i].sum()), i) for i in members])
        group_of = np.concatenate([np.flatnonzero(oks[i]) for i in members])
        for first in range(0, z.shape[0], CHUNK):
            sl = slice(first, first + CHUNK)
            chunks.append(((z[sl], np.sqrt(v[sl]), A[sl], lower[sl], upper[sl], start[sl]), model_of[sl], group_of[sl]))
    sweeps = GIBBS_BURN + GIBBS_THIN + 1 + (draws - 1) * (GIBBS_THIN + 1)
    streams = _substreams(rng, [sweeps * c[0][0].size for c in chunks])
    # Runs of consecutive chunks sharing one sweep loop, at most CHUNK groups each (memory: the
    # kept draws of a run); one chunk per run when the stream cannot be split.
    runs: list[list[int]] = []
    for k, chunk in enumerate(chunks):
        size = chunk[0][0].shape[0]
        if streams is not None and runs and sum(chunks[i][0][0].shape[0] for i in runs[-1]) + size <= CHUNK:
            runs[-1].append(k)
        else:
            runs.append([k])
    for run in runs:
        blocks = [_Block(*chunks[k][0], streams[k] if streams is not None else rng) for k in run]
        for k, y in zip(run, _sweeps(blocks, draws, GIBBS_BURN, GIBBS_THIN)):
            _, model_of, group_of = chunks[k]
            for i in np.unique(model_of):
                mine = model_of == i
                results[i][:, group_of[mine]] = y[:, mine]
    return results


def _group_cells(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """COUNT and VARIANCE per group (rows) and cell (columns, a MultiIndex (value, cell))."""
    cell = cell_column(table)
    rows = frame[~frame["REGION_TYPE"].isin(EXCLUDED_LEVELS)].copy()
    for k in GROUP_KEYS:
        rows[k] = rows[k].astype(str)
    return rows.pivot_table(index=list(GROUP_KEYS), columns=cell, values=["COUNT", "VARIANCE"], aggfunc="first",
                            sort=False)


def ratio_models(name: str, numerator: pd.DataFrame, denominator: pd.DataFrame
                 ) -> tuple[list[tuple[Array, Array, Polytope]], Callable[[list[Array]], pd.DataFrame]]:
    """The production's models of PH1, PH5 or PH8 (spec §4), and how to turn their draws into
    rows in the layout of :func:`phsafe.postprocess.ratios.ratio_table` (the columns the Census
    writer reads)."""
    shell = RATIO_SHELLS[name]
    num = _group_cells(numerator, shell.numerator)
    den = _group_cells(denominator, shell.denominator)
    groups = num.index.intersection(den.index, sort=False)
    num, den = num.loc[groups], den.loc[groups]

    def col(frame: pd.DataFrame, value: str, cells: tuple[int, ...]) -> Array:
        return np.sum([frame[(value, c)].to_numpy(dtype=np.float64) for c in cells], axis=0)

    cell_col = f"{name}_DATA_CELL"
    if shell.shared_denominator:
        n2, v2 = col(num, "COUNT", (2,)), col(num, "VARIANCE", (2,))
        n3, v3 = col(num, "COUNT", (3,)), col(num, "VARIANCE", (3,))
        dd, vd = col(den, "COUNT", (1,)), col(den, "VARIANCE", (1,))
        poly = shared_denominator_polytope(n2, v2, n3, v3, dd, vd, shell.lower_bound, TRUN)
        models = [(np.stack([n2, n3, dd], axis=1), np.stack([v2, v3, vd], axis=1), poly)]

        def shared_rows(draws: list[Array]) -> pd.DataFrame:
            y = draws[0]
            h = y[:, :, 2]
            return pd.concat([_rows(groups, cell_col, cell, top, h, nv, nvar, dd, vd)
                              for cell, top, nv, nvar in ((1, y[:, :, 0] + y[:, :, 1], n2 + n3, v2 + v3),
                                                          (2, y[:, :, 0], n2, v2), (3, y[:, :, 1], n3, v3))],
                             ignore_index=True)

        return models, shared_rows
    noisy = []
    models = []
    for cells in ((2, 3), (2,), (3,)):  # PH8: one model per cell, the total from the sums
        nn, vn = col(num, "COUNT", cells), col(num, "VARIANCE", cells)
        dd, vd = col(den, "COUNT", cells), col(den, "VARIANCE", cells)
        noisy.append((nn, vn, dd, vd))
        models.append((np.stack([nn, dd], axis=1), np.stack([vn, vd], axis=1),
                       own_denominator_polytope(nn, vn, dd, vd, TRUN)))

    def own_rows(draws: list[Array]) -> pd.DataFrame:
        return pd.concat([_rows(groups, cell_col, cell, y[:, :, 0], y[:, :, 1], *values)
                          for cell, y, values in zip((1, 2, 3), draws, noisy)], ignore_index=True)

    return models, own_rows


def _rows(groups: pd.Index, cell_col: str, cell: int, top: Array, bottom: Array, nv: Array, nvar: Array,
          dv: Array, dvar: Array) -> pd.DataFrame:
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = top / bottom
    frame = pd.DataFrame(list(groups), columns=list(GROUP_KEYS))
    frame[cell_col] = cell
    frame["COUNT_NOISY_NUM"], frame["VARIANCE_NUM"] = nv, nvar
    frame["COUNT_NOISY_DENOM"], frame["VARIANCE_DENOM"] = dv, dvar
    frame["ESTIMATE"] = ratio.mean(axis=0)
    frame["NUMERATOR_ESTIMATE"], frame["DENOMINATOR_ESTIMATE"] = top.mean(axis=0), bottom.mean(axis=0)
    frame["CI90_LOWER"], frame["CI90_UPPER"] = _type7(ratio, 0.05), _type7(ratio, 0.95)
    return frame


# --------------------------------------------------------------------------------------------
# All files
# --------------------------------------------------------------------------------------------


def production_files(tables: Mapping[str, pd.DataFrame], rng: np.random.Generator, *,
                     count_draws: int = COUNT_DRAWS, gibbs_draws: int = GIBBS_DRAWS) -> dict[str, pd.DataFrame]:
    """The production's estimates of a release's private tables (as
    :func:`phsafe.postprocess.read_private_outputs` reads them), one frame per table in the
    Census files' layout (:mod:`phsafe.postprocess.census`), all levels together. A model the
    production could not start (module docstring) has NaN estimates."""
    out: dict[str, pd.DataFrame] = {}
    for table in COUNT_SHELLS:
        if table in tables:
            out[table] = count_file_frame(table, count_table_estimates(tables[table], table, rng, count_draws))
    shells = [(name, shell) for name, shell in RATIO_SHELLS.items()
              if shell.numerator in tables and shell.denominator in tables]
    built = [ratio_models(name, tables[shell.numerator], tables[shell.denominator]) for name, shell in shells]
    flat = [m for models, _ in built for m in models]
    draws = fit_models(flat, rng, gibbs_draws) if flat else []
    at = 0
    for (name, shell), (models, rows) in zip(shells, built):
        estimates = rows(draws[at:at + len(models)])
        at += len(models)
        out[name] = ratio_file_frame(name, estimates, tables[shell.numerator], tables[shell.denominator])
    return out
