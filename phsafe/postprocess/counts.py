"""Estimates of counts: every released cell and every marginal cell of a private table.

Released cells: the exact posterior of each cell under a flat prior on {0, 1, 2, ...}
(:class:`phsafe.postprocess.posterior.Posterior`, vectorized by noise model). Marginal cells (a
sum of released cells of the same population group, :func:`phsafe.postprocess.shells.marginal_cells`):
the exact convolution of the posteriors of their parts, which are independent a posteriori --
not a sum of rounded means, and with an interval of its own.

The frame returned is the private table's columns (a marginal row's ``COUNT`` and ``VARIANCE``
are the sums of its parts', as the Census Bureau's files give them) followed by
:data:`COUNT_COLUMNS`, one row per cell of every population group, the groups in the order of the
private table and the cells in numeric order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from phsafe.outputs import cell_column
from phsafe.postprocess._base import GROUP_KEYS
from phsafe.postprocess.noise import NoiseModel
from phsafe.postprocess.posterior import CellSummaries, PmfSummary, convolve_pmfs, posterior_for, summarize_pmf
from phsafe.postprocess.shells import marginal_cells
from phsafe.tables import DERIVED_TABLES

COUNT_COLUMNS = ("ESTIMATE", "MEDIAN", "CI90_LOWER", "CI90_UPPER", "POSTERIOR_SD", "P_ZERO",
                 "CI90_ET_LOWER", "CI90_ET_UPPER")
"""Columns appended to each private table's own columns in our files."""
_SUMMARY_OF = dict(zip(COUNT_COLUMNS, CellSummaries.FIELDS))
HELPER_COLUMNS = ("MARGINAL", "PARTS", "SOURCE_ROW")


def cell_parts(table: str, cells: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """How many measured noises each cell of ``table`` adds up (spec §5, derived tables)."""
    cells = np.asarray(cells, dtype=np.int64)
    parts = np.ones(cells.shape, dtype=np.int64)
    if table in DERIVED_TABLES:
        for number, sources in DERIVED_TABLES[table].cells:
            parts[cells == number] = len(sources)
    return parts


def row_models(frame: pd.DataFrame, table: str) -> tuple[list[NoiseModel], npt.NDArray[np.int64]]:
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


def cell_summaries(frame: pd.DataFrame, table: str) -> CellSummaries:
    """The posterior summaries of every row of a private table (released cells)."""
    models, codes = row_models(frame, table)
    y = frame["COUNT"].to_numpy(dtype=np.int64)
    out = CellSummaries.empty(len(frame))
    for i, model in enumerate(models):
        rows = np.flatnonzero(codes == i)
        part = posterior_for(model).summarize(y[rows])
        for name in CellSummaries.FIELDS:
            getattr(out, name)[rows] = getattr(part, name)
    return out


def summarize_table(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """The private table (released cells only, in its order) with :data:`COUNT_COLUMNS` appended."""
    s = cell_summaries(frame, table)
    out = frame.copy()
    for column, name in _SUMMARY_OF.items():
        out[column] = getattr(s, name)
    return out


class _MarginalCache:
    """Posterior summaries of sums, shared by sums of the same shape.

    A part whose count y is beyond its window's half-width L has the posterior "y + noise": its
    shape does not depend on y, so two marginals whose parts have the same noise models and the
    same near-zero counts have the same posterior up to a shift by the sum of the far counts.
    Large tables (every state's total) thus convolve once per noise model.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple, tuple[int, PmfSummary, float]] = {}

    def summary(self, parts: list[tuple[NoiseModel, int]]) -> PmfSummary:
        shift = 0
        key_parts = []
        for model, y in parts:
            post = posterior_for(model)
            if not model.is_noiseless and y > post.half_width:
                shift += y
                key_parts.append((model, None))
            else:
                key_parts.append((model, y))
        key = tuple(sorted(key_parts, key=repr))
        if key not in self._cache:
            pmfs = []
            for model, y in key:
                post = posterior_for(model)
                pmfs.append((-post.half_width, post.pmf) if y is None else post.window(y))
            offset, w = convolve_pmfs(pmfs)
            self._cache[key] = (offset, summarize_pmf(offset, w), float(w[0]))
        offset, s, w0 = self._cache[key]
        return PmfSummary(
            s.mean + shift, s.median + shift, s.lower + shift, s.upper + shift, s.sd,
            w0 if offset + shift == 0 else 0.0, s.et_lower + shift, s.et_upper + shift,
        )


def count_estimates(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """Estimates of every released and marginal cell of a private table (module docstring).

    Args:
        frame: The private table as read (:func:`phsafe.postprocess.source.read_private_outputs`:
            with an ``ITERATION_CODE`` column, ``*`` for PH2 and PH6).
        table: Its name.

    Returns:
        The private columns and :data:`COUNT_COLUMNS`, plus :data:`HELPER_COLUMNS` (which the
        writers drop): ``MARGINAL`` (True for a built marginal row), ``PARTS`` (the released
        cells it sums; the cell itself for a released row) and ``SOURCE_ROW`` (the row's
        position in the private table; -1 for a built row).
    """
    cell = cell_column(table)
    released = summarize_table(frame, table).reset_index(drop=True)
    released["MARGINAL"] = False
    released["PARTS"] = [(int(c),) for c in released[cell]]
    released["SOURCE_ROW"] = np.arange(len(released))
    marginals = marginal_cells(table)
    if not marginals or released.empty:
        return released[[*frame.columns, *COUNT_COLUMNS, *HELPER_COLUMNS]]
    models, codes = row_models(frame.reset_index(drop=True), table)
    y = released["COUNT"].to_numpy(dtype=np.int64)
    cache = _MarginalCache()
    rows = []
    group_of = released.groupby(list(GROUP_KEYS), sort=False, observed=True).indices
    # Plain arrays in the loop (a pandas lookup per marginal cell cost more than its posterior).
    cells = released[cell].to_numpy(dtype=np.int64)
    distribution = released["NOISE_DISTRIBUTION"].to_numpy()
    variance = released["VARIANCE"].to_numpy(dtype=np.float64)
    for group, index in group_of.items():
        by_cell = {int(cells[i]): int(i) for i in index}
        for number, parts in marginals:
            if not all(p in by_cell for p in parts):
                continue  # a level that released only some parts (never in a complete release)
            members = [by_cell[p] for p in parts]
            s = cache.summary([(models[codes[i]], int(y[i])) for i in members])
            distributions = sorted(set(distribution[members]))
            rows.append({
                **dict(zip(GROUP_KEYS, group)), cell: number,
                "COUNT": int(y[members].sum()),
                "NOISE_DISTRIBUTION": ", ".join(distributions),
                "VARIANCE": float(variance[members].sum()),
                "ESTIMATE": s.mean, "MEDIAN": s.median, "CI90_LOWER": s.lower, "CI90_UPPER": s.upper,
                "POSTERIOR_SD": s.sd, "P_ZERO": s.p_zero, "CI90_ET_LOWER": s.et_lower,
                "CI90_ET_UPPER": s.et_upper, "MARGINAL": True, "PARTS": tuple(parts), "SOURCE_ROW": -1,
            })
    built = pd.DataFrame(rows)
    released["_GROUP"] = released.groupby(list(GROUP_KEYS), sort=False, observed=True).ngroup()
    if len(built):
        group_rank = {k: r for r, k in enumerate(group_of)}
        built["_GROUP"] = [group_rank[tuple(r[k] for k in GROUP_KEYS)] for r in rows]
    out = pd.concat([released, built], ignore_index=True)
    out = out.sort_values(["_GROUP", cell], kind="stable").drop(columns="_GROUP").reset_index(drop=True)
    return out[[*frame.columns, *COUNT_COLUMNS, *HELPER_COLUMNS]]
