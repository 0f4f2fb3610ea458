"""The paper's sensitivity bound against the exact one, at the same budgets (pure).

``phsafe accuracy --compare-sensitivity`` runs the accuracy experiment twice on the same data
with the same config -- once calibrated to the PHSafe paper's sensitivities (2 tau + 2, 2), once
to the exact ones of ``docs/sensitivity.md`` -- and :func:`bound_comparison` sets their metrics
side by side, per table x population-group level: the stated 90% margin of error (MOE = 1.645
sqrt(VARIANCE)) and the empirical coverage of the interval COUNT +- MOE (noise only: against the
truncated exact count, with its Wilson interval), their ratios, and the errors against the truth.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

BOUND_COMPARISON_COLUMNS = (
    "TABLE", "LEVEL", "CELLS", "TRIALS",
    "MOE_PAPER", "MOE_EXACT", "MOE_RATIO", "VARIANCE_RATIO",
    "COVERAGE_PAPER", "COVERAGE_PAPER_LOW", "COVERAGE_PAPER_HIGH",
    "COVERAGE_EXACT", "COVERAGE_EXACT_LOW", "COVERAGE_EXACT_HIGH",
    "MAE_PAPER", "MAE_EXACT", "MAE_RATIO",
    "CI90_COVERAGE_PAPER", "CI90_COVERAGE_EXACT", "CI90_WIDTH_RATIO",
)
"""Ratios are exact / paper (below 1: the exact bound's noise is smaller)."""


def bound_comparison(paper: pd.DataFrame, exact: pd.DataFrame) -> pd.DataFrame:
    """Per table x level (and the pooled ``ALL`` row): both experiments' metrics
    (:data:`phsafe.accuracy.metrics.METRIC_COLUMNS` frames) side by side, with their ratios."""
    keys = ["TABLE", "LEVEL"]
    both = paper.merge(exact, on=keys, how="inner", suffixes=("_P", "_E"), validate="one_to_one")
    if len(both) != len(paper) or len(both) != len(exact):
        raise ValueError("the two experiments released different table levels")

    def ratio(a: str, b: str) -> pd.Series:
        num, den = both[a].astype(float), both[b].astype(float)
        return (num / den.where(den > 0)).astype(float)

    out = pd.DataFrame({
        "TABLE": both["TABLE"], "LEVEL": both["LEVEL"], "CELLS": both["CELLS_P"], "TRIALS": both["TRIALS_P"],
        "MOE_PAPER": both["MEAN_MOE_P"], "MOE_EXACT": both["MEAN_MOE_E"],
        "MOE_RATIO": ratio("MEAN_MOE_E", "MEAN_MOE_P"),
        "VARIANCE_RATIO": ratio("MEAN_MOE_E", "MEAN_MOE_P") ** 2,
        "COVERAGE_PAPER": both["MOE_COVERAGE_P"], "COVERAGE_PAPER_LOW": both["MOE_COVERAGE_LOW_P"],
        "COVERAGE_PAPER_HIGH": both["MOE_COVERAGE_HIGH_P"],
        "COVERAGE_EXACT": both["MOE_COVERAGE_E"], "COVERAGE_EXACT_LOW": both["MOE_COVERAGE_LOW_E"],
        "COVERAGE_EXACT_HIGH": both["MOE_COVERAGE_HIGH_E"],
        "MAE_PAPER": both["MAE_P"], "MAE_EXACT": both["MAE_E"], "MAE_RATIO": ratio("MAE_E", "MAE_P"),
        "CI90_COVERAGE_PAPER": both.get("CI90_COVERAGE_P", pd.Series(np.nan, index=both.index)),
        "CI90_COVERAGE_EXACT": both.get("CI90_COVERAGE_E", pd.Series(np.nan, index=both.index)),
        "CI90_WIDTH_RATIO": (ratio("CI90_MEAN_WIDTH_E", "CI90_MEAN_WIDTH_P") if "CI90_MEAN_WIDTH_P" in both
                             else pd.Series(np.nan, index=both.index)),
    })
    # The pooled MOE of the ALL row mixes tables with unlike noise; the ratio of means stays as is.
    return out.reindex(columns=list(BOUND_COMPARISON_COLUMNS)).reset_index(drop=True)
