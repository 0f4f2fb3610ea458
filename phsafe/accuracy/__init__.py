"""Empirical accuracy of the private algorithm on synthetic or otherwise non-confidential data.

``phsafe accuracy`` runs the private algorithm K times on the same data and compares every
released cell with the truth (:func:`run_accuracy`; the metrics are described in
:mod:`phsafe.accuracy.experiment`):

* :mod:`phsafe.accuracy.experiment` -- the runs: truth, private trials, their truncated exact
  counts, post-processing and the production's method on each trial;
* :mod:`phsafe.accuracy.metrics` -- per table x level metrics, pooled over trials (pure);
* :mod:`phsafe.accuracy.comparison` -- our estimate files against the production's (pure);
* :mod:`phsafe.accuracy.bounds` -- the paper's sensitivity bound against the exact one at the same
  budgets (pure; :func:`compare_bounds` runs both experiments);
* :mod:`phsafe.accuracy.production` -- the Census Bureau's production estimation method;
* :mod:`phsafe.accuracy.levels` -- population-group levels of released rows, coverage intervals;
* :mod:`phsafe.accuracy.report`, :mod:`phsafe.accuracy.plots` -- writing it all.
"""

from __future__ import annotations

from phsafe.accuracy.bounds import BOUND_COMPARISON_COLUMNS, bound_comparison
from phsafe.accuracy.comparison import COMPARISON_COLUMNS
from phsafe.accuracy.experiment import (
    DEFAULT_ACCURACY_DRAWS,
    DEFAULT_TRIALS,
    AccuracyResult,
    BoundComparisonResult,
    compare_bounds,
    config_with_bound,
    noiseless_config,
    run_accuracy,
)
from phsafe.accuracy.levels import COVERAGE_INTERVAL, coverage_interval, level_of, level_order
from phsafe.accuracy.metrics import (
    AVERAGE_METRIC_COLUMNS,
    KEYS,
    METRIC_COLUMNS,
    MOE_Z,
    NOMINAL,
    average_table_metrics,
    table_metrics,
)
from phsafe.accuracy.plots import interval_bars
from phsafe.accuracy.plots import interval_bars as _interval_bars  # the name earlier callers used
from phsafe.accuracy.report import write_report
from phsafe.errors import ConfidentialityNotConfirmed

__all__ = [
    "AVERAGE_METRIC_COLUMNS", "BOUND_COMPARISON_COLUMNS", "BoundComparisonResult", "COMPARISON_COLUMNS",
    "bound_comparison", "compare_bounds", "config_with_bound", "COVERAGE_INTERVAL", "DEFAULT_ACCURACY_DRAWS", "DEFAULT_TRIALS",
    "KEYS", "METRIC_COLUMNS", "MOE_Z", "NOMINAL", "AccuracyResult", "ConfidentialityNotConfirmed",
    "average_table_metrics", "coverage_interval", "interval_bars", "level_of", "level_order", "noiseless_config",
    "run_accuracy", "table_metrics", "write_report",
]
