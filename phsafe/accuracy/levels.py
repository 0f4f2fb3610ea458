"""The population-group levels of the accuracy metrics, and the interval of a coverage."""

from __future__ import annotations

import math

import pandas as pd

COVERAGE_INTERVAL = 0.95
"""Confidence level of the Wilson score interval reported with each empirical coverage."""


def coverage_interval(covered: int, n: int, level: float = COVERAGE_INTERVAL) -> tuple[float, float]:
    """The Wilson score interval of a coverage of ``covered`` out of ``n`` (scipy.stats).

    Unlike coverage +- 2 standard errors it stays inside [0, 1] and is not empty at a coverage
    of 0 or 1, which matters with few trials or few cells. Treats the n cells x trials as
    independent: the noise is, the truncation error of cells of one trial is not.

    Returns:
        (low, high); (nan, nan) when n is 0.
    """
    if n == 0:
        return math.nan, math.nan
    from scipy.stats import binomtest

    ci = binomtest(int(covered), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


_ITERATION_LEVEL = {"*": "*", **{c: "A-G" for c in "ABCDEFG"}, "H": "H,I", "I": "H,I"}


def level_of(region_type: pd.Series, iteration_code: pd.Series) -> pd.Series:
    """The config key of each row's population-group level, e.g. ``state_A-G``."""
    return region_type.str.lower() + "_" + iteration_code.map(_ITERATION_LEVEL)


def level_order(levels: pd.Series) -> pd.Series:
    order = {k: i for i, k in enumerate(("usa_*", "usa_A-G", "usa_H,I", "state_*", "state_A-G", "state_H,I"))}
    return levels.map(order).fillna(99)
