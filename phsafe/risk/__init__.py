"""Bayesian disclosure risk of one released cell (``phsafe risk``), after Kazan and Reiter.

* :mod:`phsafe.risk.analysis` -- the analysis, pure: the noise of each measured level, the
  intruder's posterior, marginal risk and correct-guess probability, per prior;
* :mod:`phsafe.risk.report` -- writing it: ``risk.json``, ``risk_report.md``/``.html``, the plot.
"""

from __future__ import annotations

from phsafe.risk.analysis import (
    GAUSSIAN,
    GEOMETRIC,
    NONE,
    PRIORS,
    QUANTILES,
    CellNoise,
    ConfigRisk,
    LevelRisk,
    Marginal,
    NoiseRisk,
    ReleasedValue,
    analyse,
    analyse_config,
    level_noise,
    likelihood,
    marginal,
    noise_pmf,
    posterior,
    released_values,
    risk_ratio,
)
from phsafe.risk.analysis import noise_pmf as _pmf  # the name earlier callers used
from phsafe.risk.report import (
    PROBABILITY_FLOOR,
    REPORT_HTML,
    REPORT_MD,
    RISK_JSON,
    RISK_PNG,
    build_report,
    probability_text,
    risk_json,
    write_risk,
)
from phsafe.risk.report import probability_text as _prob  # the name earlier callers used

__all__ = [
    "GAUSSIAN", "GEOMETRIC", "NONE", "PRIORS", "PROBABILITY_FLOOR", "QUANTILES", "REPORT_HTML", "REPORT_MD",
    "RISK_JSON", "RISK_PNG", "CellNoise", "ConfigRisk", "LevelRisk", "Marginal", "NoiseRisk", "ReleasedValue",
    "analyse", "analyse_config", "build_report", "level_noise", "likelihood", "marginal", "noise_pmf", "posterior",
    "probability_text", "released_values", "risk_json", "risk_ratio", "write_risk",
]
