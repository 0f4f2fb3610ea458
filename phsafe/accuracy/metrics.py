"""Accuracy metrics per table x population-group level, pooled over trials (pure).

Errors are released COUNT minus the reference; MOE = 1.645 sqrt(VARIANCE), as
:attr:`phsafe.accounting.PlannedMeasurement.moe90`. See :mod:`phsafe.accuracy.experiment` for
what each metric means.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from phsafe.accuracy.levels import coverage_interval, level_order
from phsafe.postprocess import GROUP_KEYS, RATIO_SHELLS, NoiseModel, cell_parts, posterior_for
from phsafe.tables import OUTPUT_TABLES

MOE_Z = 1.645
"""The z of the stated 90% margin of error (spec §6, :mod:`phsafe.accounting`)."""
NOMINAL = 0.90
KEYS = [*GROUP_KEYS, "CELL"]

METRIC_COLUMNS = (
    "TABLE", "LEVEL", "NOISE_DISTRIBUTION", "CELLS", "TRIALS", "MEAN_MOE", "MAE", "RMSE", "P90_ABS_ERROR",
    "EXPECTED_NOISE_MAE", "MOE_COVERAGE", "MOE_COVERAGE_LOW", "MOE_COVERAGE_HIGH", "MOE_COVERAGE_VS_TRUTH",
    "TRUNCATION_MAE",
    "TRUNCATION_MAX_ABS", "TRUNCATION_SHARE", "CI90_COVERAGE", "CI90_COVERAGE_VS_TRUTH", "CI90_MEAN_WIDTH",
    "ESTIMATE_MAE",
)
AVERAGE_METRIC_COLUMNS = (
    "TABLE", "LEVEL", "CELLS", "TRIALS", "UNDEFINED", "MAE", "P90_ABS_ERROR", "CI90_COVERAGE", "CI90_COVERAGE_LOW",
    "CI90_COVERAGE_HIGH", "CI90_COVERAGE_VS_TRUTH", "CI90_MEAN_WIDTH", "MEAN_P_DENOMINATOR_POSITIVE",
)


def noise_abs_mean(frame: pd.DataFrame, table: str) -> np.ndarray:
    """E|noise| of each row, exactly from its noise model."""
    parts = cell_parts(table, frame["CELL"].to_numpy())
    out = np.zeros(len(frame))
    keys = pd.DataFrame({"d": frame["NOISE_DISTRIBUTION"], "v": frame["VARIANCE"], "k": parts})
    for (d, v, k), idx in keys.groupby(["d", "v", "k"]).groups.items():
        if v > 0:
            out[frame.index.get_indexer(idx)] = posterior_for(NoiseModel.of(d, v, int(k))).noise_abs_mean
    return out


def exact_ratios(counts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Exact averages (numerator / denominator, NaN where the denominator is 0) from count tables
    holding KEYS + COUNT (cells missing from a table count 0)."""
    parts = []
    for spec in RATIO_SHELLS.values():
        if spec.numerator not in counts or spec.denominator not in counts:
            continue
        num = counts[spec.numerator].pivot_table(index=list(GROUP_KEYS), columns="CELL", values="COUNT", aggfunc="sum")
        den = counts[spec.denominator].pivot_table(index=list(GROUP_KEYS), columns="CELL", values="COUNT", aggfunc="sum")
        groups = num.index.intersection(den.index)
        for cell, ncells, dcells in spec.cells:
            top = num.reindex(index=groups, columns=list(ncells)).fillna(0).sum(axis=1)
            bottom = den.reindex(index=groups, columns=list(dcells)).fillna(0).sum(axis=1)
            ratio = (top / bottom.where(bottom > 0)).rename("RATIO").reset_index()
            ratio["TABLE"], ratio["CELL"] = spec.name, cell
            parts.append(ratio)
    if not parts:
        return pd.DataFrame(columns=["TABLE", *KEYS, "RATIO"])
    return pd.concat(parts, ignore_index=True)[["TABLE", *KEYS, "RATIO"]]


def table_metrics(cells: pd.DataFrame) -> pd.DataFrame:
    """Per table x level metrics (:data:`METRIC_COLUMNS`) from the per-cell rows of all trials,
    plus an ``ALL``/``ALL`` row pooling everything."""
    c = cells.copy()
    c["ERR"] = (c["COUNT"] - c["TRUTH"]).astype(np.float64)
    c["ABS"] = c["ERR"].abs()
    c["MOE"] = MOE_Z * np.sqrt(c["VARIANCE"])
    c["COVERED"] = (c["COUNT"] - c["TRUNCATED"]).abs() <= c["MOE"]
    c["COVERED_TRUTH"] = c["ABS"] <= c["MOE"]
    c["TRUNC_ABS"] = (c["TRUNCATED"] - c["TRUTH"]).abs()
    post = "CI90_LOWER" in c
    if post:
        c["CI_COVERED"] = (c["CI90_LOWER"] <= c["TRUNCATED"]) & (c["TRUNCATED"] <= c["CI90_UPPER"])
        c["CI_COVERED_TRUTH"] = (c["CI90_LOWER"] <= c["TRUTH"]) & (c["TRUTH"] <= c["CI90_UPPER"])
        c["CI_WIDTH"] = c["CI90_UPPER"] - c["CI90_LOWER"]
        c["EST_ABS"] = (c["ESTIMATE"] - c["TRUTH"]).abs()

    def summarize(g: pd.DataFrame) -> dict:
        n = len(g)
        cov = float(g["COVERED"].mean())
        low, high = coverage_interval(int(g["COVERED"].sum()), n)
        row = {
            "NOISE_DISTRIBUTION": ", ".join(sorted(g["NOISE_DISTRIBUTION"].unique())),
            "CELLS": int(n // g["TRIAL"].nunique()),
            "TRIALS": int(g["TRIAL"].nunique()),
            "MEAN_MOE": float(g["MOE"].mean()),
            "MAE": float(g["ABS"].mean()),
            "RMSE": float(np.sqrt((g["ERR"] ** 2).mean())),
            "P90_ABS_ERROR": float(np.quantile(g["ABS"], 0.9)),
            "EXPECTED_NOISE_MAE": float(g["EXPECTED_ABS_NOISE"].mean()),
            "MOE_COVERAGE": cov,
            "MOE_COVERAGE_LOW": low,
            "MOE_COVERAGE_HIGH": high,
            "MOE_COVERAGE_VS_TRUTH": float(g["COVERED_TRUTH"].mean()),
            "TRUNCATION_MAE": float(g["TRUNC_ABS"].mean()),
            "TRUNCATION_MAX_ABS": int(g["TRUNC_ABS"].max()),
            "TRUNCATION_SHARE": float((g["TRUNC_ABS"] > 0).mean()),
        }
        if post:
            row.update({
                "CI90_COVERAGE": float(g["CI_COVERED"].mean()),
                "CI90_COVERAGE_VS_TRUTH": float(g["CI_COVERED_TRUTH"].mean()),
                "CI90_MEAN_WIDTH": float(g["CI_WIDTH"].mean()),
                "ESTIMATE_MAE": float(g["EST_ABS"].mean()),
            })
        return row

    rows = []
    table_rank = {t: i for i, t in enumerate(OUTPUT_TABLES)}
    for (table, level), g in c.groupby(["TABLE", "LEVEL"], sort=False):
        rows.append({"TABLE": table, "LEVEL": level, **summarize(g)})
    out = pd.DataFrame(rows)
    out = out.sort_values(by=["TABLE", "LEVEL"], key=lambda s: s.map(table_rank) if s.name == "TABLE" else level_order(s))
    out = pd.concat([out, pd.DataFrame([{"TABLE": "ALL", "LEVEL": "ALL", **summarize(c)}])], ignore_index=True)
    out["CELLS"] = out["CELLS"].astype(np.int64)
    return out.reindex(columns=list(METRIC_COLUMNS))


def average_table_metrics(avg: pd.DataFrame) -> pd.DataFrame:
    """Per average table x level metrics (:data:`AVERAGE_METRIC_COLUMNS`), pooled over trials;
    cells whose exact (truncated) denominator is 0 have no defined average and are counted in
    ``UNDEFINED`` only."""
    rows = []

    def summarize(g: pd.DataFrame) -> dict:
        defined = g[g["TRUNCATED_RATIO"].notna() & g["ESTIMATE"].notna()]
        n = len(defined)
        covered = (defined["CI90_LOWER"] <= defined["TRUNCATED_RATIO"]) & (defined["TRUNCATED_RATIO"] <= defined["CI90_UPPER"])
        with_truth = defined[defined["TRUE_RATIO"].notna()]
        covered_truth = (with_truth["CI90_LOWER"] <= with_truth["TRUE_RATIO"]) & (with_truth["TRUE_RATIO"] <= with_truth["CI90_UPPER"])
        abs_err = (with_truth["ESTIMATE"] - with_truth["TRUE_RATIO"]).abs()
        cov = float(covered.mean()) if n else math.nan
        low, high = coverage_interval(int(covered.sum()), n)
        return {
            "CELLS": int(len(g) // max(g["TRIAL"].nunique(), 1)),
            "TRIALS": int(g["TRIAL"].nunique()),
            "UNDEFINED": int(len(g) - n),
            "MAE": float(abs_err.mean()) if len(abs_err) else math.nan,
            "P90_ABS_ERROR": float(np.quantile(abs_err, 0.9)) if len(abs_err) else math.nan,
            "CI90_COVERAGE": cov,
            "CI90_COVERAGE_LOW": low,
            "CI90_COVERAGE_HIGH": high,
            "CI90_COVERAGE_VS_TRUTH": float(covered_truth.mean()) if len(with_truth) else math.nan,
            "CI90_MEAN_WIDTH": float((defined["CI90_UPPER"] - defined["CI90_LOWER"]).mean()) if n else math.nan,
            "MEAN_P_DENOMINATOR_POSITIVE": float(g["P_DENOMINATOR_POSITIVE"].mean()),
        }

    for (table, level), g in avg.groupby(["TABLE", "LEVEL"], sort=False):
        rows.append({"TABLE": table, "LEVEL": level, **summarize(g)})
    out = pd.DataFrame(rows)
    out = out.sort_values(by=["TABLE", "LEVEL"], key=lambda s: s if s.name == "TABLE" else level_order(s))
    out = pd.concat([out, pd.DataFrame([{"TABLE": "ALL", "LEVEL": "ALL", **summarize(avg)}])], ignore_index=True)
    return out.reindex(columns=list(AVERAGE_METRIC_COLUMNS))
