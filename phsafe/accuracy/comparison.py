"""Our model-based estimates beside the Census Bureau's production method, on the same trials.

For every trial of ``phsafe accuracy`` and every row of the Census Bureau's estimate files
(``PH<k>/estimates/``: internal and marginal cells of PH2, PH3, PH4, PH6, PH7; cells 1-3 of the
averages PH1, PH5, PH8) two sets of estimates of the same noisy tables:

* ``ours`` -- the files ``phsafe postprocess`` wrote (exact discrete posterior; the equal-tailed
  90% interval the files promise);
* ``production`` -- :mod:`phsafe.accuracy.production`, the production's continuous method.

Each row is compared with its *truncated truth*: the exact count of the truncated data (the
noiseless run with the trial's truncation key), a marginal cell's the sum of its parts', an
average's the ratio of the truncated counts (undefined, and left out, where the denominator is
0). What the intervals claim is about the noise only, so that is what they can cover.

Per table x level (:func:`~phsafe.accuracy.levels.level_of`) and method, pooled over trials:

* ``COVERAGE``: the share of rows whose interval [LO, HI] holds the truncated truth (rows with
  an estimate and a defined truth), with its 95% Wilson interval;
* ``MEAN_LENGTH``: the mean of HI - LO;
* ``OUT_OF_BOUNDS``: the share of rows whose estimate or an interval end lies outside the logical
  bounds -- a count >= 0; an average in [1, tau] for households (PH1, PH8 every cell), [2, tau]
  for families (PH5 total), [0, tau] for a part of PH1 or PH5 -- or is not finite;
* ``FAILED``: the share of rows without an estimate because the production's sampler could not
  start (its polytope or the shrunken set empty: the production run stops there).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from phsafe.accuracy.levels import coverage_interval, level_of, level_order
from phsafe.postprocess import RATIO_SHELLS
from phsafe.postprocess.census import read_file
from phsafe.postprocess.shells import COUNT_SHELLS, marginal_cells

METHODS = ("ours", "production")
ROW_KEYS = ["TABLE", "GEOID", "REGION_TYPE", "ITERATION_CODE", "DATA_CELL"]
COMPARISON_COLUMNS = (
    "TABLE", "LEVEL", "METHOD", "ROWS", "TRIALS", "COVERAGE", "COVERAGE_LOW", "COVERAGE_HIGH", "MEAN_LENGTH",
    "OUT_OF_BOUNDS", "FAILED",
)


def truncated_truth(exact: Mapping[str, pd.DataFrame], exact_ratios: pd.DataFrame) -> pd.DataFrame:
    """The truncated truth of every row of the estimate files, keyed like them (:data:`ROW_KEYS`).

    Args:
        exact: Per private table, the truncated exact counts (REGION_ID, REGION_TYPE,
            ITERATION_CODE, CELL, COUNT).
        exact_ratios: Their averages (:func:`phsafe.accuracy._exact_ratios`: TABLE, REGION_ID,
            REGION_TYPE, ITERATION_CODE, CELL, RATIO).
    """
    parts = []
    for table in COUNT_SHELLS:
        frame = exact.get(table)
        if frame is None:
            continue
        frame = frame[["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "CELL", "COUNT"]]
        blocks = [frame]
        wide = frame.pivot_table(index=["REGION_ID", "REGION_TYPE", "ITERATION_CODE"], columns="CELL", values="COUNT",
                                 aggfunc="sum")
        for number, cells in marginal_cells(table):
            total = wide.reindex(columns=list(cells)).sum(axis=1, min_count=len(cells)).dropna()
            block = total.rename("COUNT").reset_index()
            block["CELL"] = number
            blocks.append(block)
        rows = pd.concat(blocks, ignore_index=True)
        rows["TABLE"] = table
        parts.append(rows.rename(columns={"COUNT": "TRUTH"}))
    ratios = exact_ratios.rename(columns={"RATIO": "TRUTH"})
    parts.append(ratios[ratios["TABLE"].isin(list(RATIO_SHELLS))])
    out = pd.concat(parts, ignore_index=True).rename(columns={"REGION_ID": "GEOID", "CELL": "DATA_CELL"})
    out["GEOID"] = out["GEOID"].astype(str)
    out["ITERATION_CODE"] = out["ITERATION_CODE"].astype(str)
    out["DATA_CELL"] = out["DATA_CELL"].astype(np.int64)
    out["TRUTH"] = out["TRUTH"].astype(np.float64)
    return out[[*ROW_KEYS, "TRUTH"]]


def long_rows(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Estimate files (table -> frame in the Census layout) as ROW_KEYS, ESTIMATE, LOWER, UPPER."""
    parts = []
    for table, frame in frames.items():
        ratio = table in RATIO_SHELLS
        cols = ("RATIO_PRED", "RATIO_PRED_LO", "RATIO_PRED_HI") if ratio else ("PRED", "PRED_LO", "PRED_HI")
        rows = pd.DataFrame({
            "TABLE": table, "GEOID": frame["GEOID"].astype(str), "REGION_TYPE": frame["REGION_TYPE"].astype(str),
            "ITERATION_CODE": frame["ITERATION_CODE"].astype(str),
            "DATA_CELL": frame["DATA_CELL"].astype(np.int64),
            "ESTIMATE": frame[cols[0]].astype(np.float64), "LOWER": frame[cols[1]].astype(np.float64),
            "UPPER": frame[cols[2]].astype(np.float64),
        })
        parts.append(rows)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*ROW_KEYS, "ESTIMATE", "LOWER",
                                                                                    "UPPER"])


def read_estimate_files(directory: Path) -> dict[str, pd.DataFrame]:
    """The Census-layout files ``phsafe postprocess`` wrote, per table (every level together)."""
    frames: dict[str, list[pd.DataFrame]] = {}
    for path in sorted(Path(directory).glob("PH*/estimates/*.csv")):
        frames.setdefault(path.parent.parent.name, []).append(read_file(path))
    return {t: pd.concat(f, ignore_index=True) for t, f in frames.items()}


def logical_bounds(rows: pd.DataFrame, taus: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """The least and largest possible value of each row (module docstring)."""
    lower = np.zeros(len(rows))
    upper = np.full(len(rows), np.inf)
    for name, shell in RATIO_SHELLS.items():
        mask = (rows["TABLE"] == name).to_numpy()
        if not mask.any():
            continue
        tau = float(taus.get(shell.tau_table, math.inf))
        total = rows["DATA_CELL"].to_numpy() == 1
        if shell.shared_denominator:
            lower[mask & total] = min(shell.lower_bound, tau)
        else:
            lower[mask] = 1.0
        upper[mask] = tau
    return lower, upper


def compare_trial(trial: int, ours: Mapping[str, pd.DataFrame], production: Mapping[str, pd.DataFrame],
                  truth: pd.DataFrame, taus: Mapping[str, int]) -> pd.DataFrame:
    """One row per estimate-file row and method of one trial, with its truth and verdicts."""
    parts = []
    for method, frames in (("ours", ours), ("production", production)):
        rows = long_rows(frames)
        rows.insert(0, "METHOD", method)
        parts.append(rows)
    rows = pd.concat(parts, ignore_index=True)
    rows = rows.merge(truth, on=ROW_KEYS, how="left", validate="many_to_one")
    lower, upper = logical_bounds(rows, taus)
    est, lo, hi = (rows[c].to_numpy(dtype=np.float64) for c in ("ESTIMATE", "LOWER", "UPPER"))
    produced = ~np.isnan(est)
    eps = 1e-9
    inside = (np.isfinite(est) & np.isfinite(lo) & np.isfinite(hi)
              & (lo >= lower - eps) & (est >= lower - eps) & (hi <= upper + eps) & (est <= upper + eps))
    rows["FAILED"] = ~produced
    rows["OUT_OF_BOUNDS"] = produced & ~inside
    truth_v = rows["TRUTH"].to_numpy(dtype=np.float64)
    rows["COVERED"] = (lo <= truth_v + eps) & (truth_v - eps <= hi)
    rows["LENGTH"] = hi - lo
    rows.insert(0, "TRIAL", trial)
    return rows


def comparison_metrics(rows: pd.DataFrame) -> pd.DataFrame:
    """Per table x level x method (:data:`COMPARISON_COLUMNS`), pooled over trials, plus ALL."""
    rows = rows.copy()
    rows["LEVEL"] = level_of(rows["REGION_TYPE"], rows["ITERATION_CODE"])

    def summarize(g: pd.DataFrame) -> dict:
        produced = g[~g["FAILED"]]
        scored = produced[produced["TRUTH"].notna()]
        covered = int(scored["COVERED"].sum())
        low, high = coverage_interval(covered, len(scored))
        trials = max(int(g["TRIAL"].nunique()), 1)
        return {
            "ROWS": int(len(g) // trials), "TRIALS": trials,
            "COVERAGE": covered / len(scored) if len(scored) else math.nan, "COVERAGE_LOW": low, "COVERAGE_HIGH": high,
            "MEAN_LENGTH": float(scored["LENGTH"].mean()) if len(scored) else math.nan,
            "OUT_OF_BOUNDS": float(produced["OUT_OF_BOUNDS"].mean()) if len(produced) else math.nan,
            "FAILED": float(g["FAILED"].mean()),
        }

    out = []
    order = {t: i for i, t in enumerate(("PH1", "PH2", "PH3", "PH4", "PH5", "PH6", "PH7", "PH8"))}
    for (table, level, method), g in rows.groupby(["TABLE", "LEVEL", "METHOD"], sort=False):
        out.append({"TABLE": table, "LEVEL": level, "METHOD": method, **summarize(g)})
    frame = pd.DataFrame(out)
    if len(frame):
        frame["_T"] = frame["TABLE"].map(order)
        frame["_L"] = level_order(frame["LEVEL"])
        frame["_M"] = frame["METHOD"].map({m: i for i, m in enumerate(METHODS)})
        frame = frame.sort_values(["_T", "_L", "_M"], kind="stable").drop(columns=["_T", "_L", "_M"])
    for method in METHODS:
        g = rows[rows["METHOD"] == method]
        if len(g):
            frame = pd.concat([frame, pd.DataFrame([{"TABLE": "ALL", "LEVEL": "ALL", "METHOD": method,
                                                     **summarize(g)}])], ignore_index=True)
    return frame.reindex(columns=list(COMPARISON_COLUMNS)).reset_index(drop=True)


def side_by_side(metrics: pd.DataFrame) -> pd.DataFrame:
    """The comparison as one row per table x level: each metric for ours and the production."""
    wide = metrics.pivot_table(index=["TABLE", "LEVEL"], columns="METHOD",
                               values=["COVERAGE", "MEAN_LENGTH", "OUT_OF_BOUNDS", "FAILED"], sort=False)
    wide.columns = [f"{value}_{method.upper()}" for value, method in wide.columns]
    keep = [c for c in ("COVERAGE_OURS", "COVERAGE_PRODUCTION", "MEAN_LENGTH_OURS", "MEAN_LENGTH_PRODUCTION",
                        "OUT_OF_BOUNDS_OURS", "OUT_OF_BOUNDS_PRODUCTION", "FAILED_PRODUCTION") if c in wide]
    return wide[keep].reset_index()
