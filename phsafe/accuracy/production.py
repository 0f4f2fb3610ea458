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
        upper = lo + hi >= 0  # more of the interval above 0: use the upper tail
        a = np.where(upper, lo, -hi)  # mirrored to the upper side
        b = np.where(upper, hi, -lo)
        la, lb = log_ndtr(-a), log_ndtr(-b)  # log P(S > a) >= log P(S > b)
        # P(S > x) = P(S > a) - u (P(S > a) - P(S > b))
        log_tail = la + np.log1p(-u * -np.expm1(lb - la))
        x = -ndtri_exp(log_tail)
        mid = (a < 0) & (b > 0)  # straddling 0: the plain cdf is precise
        pa, pb = ndtr(a), ndtr(b)
        x = np.where(mid, ndtri(pa + u * (pb - pa)), x)
        x = np.clip(x, a, b)
    return np.where(upper, x, -x)


def gibbs_truncated_normal(z: Array, sd: Array, A: Array, lower: Array, upper: Array, start: Array,
                           rng: np.random.Generator, draws: int = GIBBS_DRAWS, burn: int = GIBBS_BURN,
                           thin: int = GIBBS_THIN) -> Array:
    """Kept draws of N(z, diag(sd^2)) truncated to lower <= A y <= upper, every group at once
    (its own A: shape (groups, rows, d)), by Gibbs sweeps in whitened coordinates
    x = (y - z) / sd from ``start``, as the production's sampler.

    Returns:
        (draws, groups, d) draws of y: after ``burn + thin + 1`` sweeps, every ``thin + 1``-th
        (the production: sweeps 12, 14, ..., 20,010).
    """
    groups, d = z.shape
    coef = A * sd[:, None, :]  # A diag(sd)
    low = lower - np.einsum("grd,gd->gr", A, z)
    high = upper - np.einsum("grd,gd->gr", A, z)
    x = (start - z) / sd
    ax = np.einsum("grd,gd->gr", coef, x)  # A diag(sd) x per row
    out = np.empty((draws, groups, d))
    step = thin + 1
    first = burn + step
    total = first + (draws - 1) * step
    pos, neg = coef > 0, coef < 0
    kept = 0
    for sweep in range(1, total + 1):
        u = rng.random((d, groups))
        for j in range(d):
            c = coef[:, :, j]
            rest = ax - c * x[:, j, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                a = (low - rest) / c
                b = (high - rest) / c
            lo = np.max(np.where(pos[:, :, j], a, np.where(neg[:, :, j], b, -np.inf)), axis=1)
            hi = np.min(np.where(pos[:, :, j], b, np.where(neg[:, :, j], a, np.inf)), axis=1)
            new = _truncated_standard_normal(lo, hi, u[j])
            ax = rest + c * new[:, None]
            x[:, j] = new
        if sweep >= first and (sweep - first) % step == 0:
            out[kept] = z + sd * x
            kept += 1
    return out


def _type7(values: Array, p: float) -> Array:
    return np.quantile(values, p, axis=0, method="linear")


def fit_models(models: list[tuple[Array, Array, Polytope]], rng: np.random.Generator,
               draws: int = GIBBS_DRAWS) -> list[Array]:
    """Draws (draws, groups, d) of each model (z, variances, polytope) whose groups the
    production's sampler accepts -- every row l < u and a non-empty shrunken set, its start the
    Euclidean projection of z onto that set -- and NaN for the others. Models of one dimension d
    are sampled together."""
    starts, oks = [], []
    for z, _, poly in models:
        ok = np.all(poly.lower < poly.upper, axis=1) & np.all(np.isfinite(poly.upper), axis=1)
        start, feasible = project(z, poly.A, poly.lower + 0.5, poly.upper - 0.5)
        starts.append(start)
        oks.append(ok & feasible)
    results = [np.full((draws, *z.shape), np.nan) for z, _, _ in models]
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
            y = gibbs_truncated_normal(z[sl], np.sqrt(v[sl]), A[sl], lower[sl], upper[sl], start[sl], rng, draws=draws)
            for i in np.unique(model_of[sl]):
                mine = model_of[sl] == i
                results[i][:, group_of[sl][mine]] = y[:, mine]
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
