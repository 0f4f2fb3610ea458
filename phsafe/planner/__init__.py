"""Budget planning: from 90% margins of error to privacy-loss budgets, and back (``phsafe plan``).

* :mod:`phsafe.planner.moe` -- one level's MOE and budget, exactly (discrete Gaussian, geometric);
* :mod:`phsafe.planner.targets` -- MOE targets files, ``--tau`` and ``--state-filter`` values;
* :mod:`phsafe.planner.plan` -- the plan of a run (pure analysis: levels, budgets, totals);
* :mod:`phsafe.planner.report` -- writing it: ``config.json``, ``plan.json``, report, plots;
* :func:`plan` -- all of it as one call (:mod:`phsafe.planner.command`).

The paper's Table 10::

    p = plan("docs/table10_moe_targets.csv", tau=["10", "PH3=6,PH6=6"])
    p.total("rho")                     # Fraction(6286441129, 5000000000): 1.2572882258
"""

from __future__ import annotations

from phsafe.errors import PlanningError
from phsafe.planner.command import plan
from phsafe.planner.moe import (
    DEFAULT_DIGITS,
    Z90,
    discrete_gaussian_halfwidth,
    epsilon_for_halfwidth,
    fraction_text,
    gaussian_moe,
    gaussian_moe_met,
    gaussian_sigma2,
    geometric_halfwidth,
    geometric_sd_moe,
    rho_for_moe,
    round_up,
)
from phsafe.planner.plan import (
    DEFAULT_DELTA,
    LevelPlan,
    Plan,
    PlanMode,
    TotalsRow,
    plan_from_config,
    plan_from_targets,
    totals_row,
)
from phsafe.planner.report import amount_text, build_report, config_text, plan_json, write_plan
from phsafe.planner.targets import Targets, parse_state_filter, parse_tau, read_targets

__all__ = [
    "DEFAULT_DELTA", "DEFAULT_DIGITS", "LevelPlan", "Plan", "PlanMode", "PlanningError", "Targets", "TotalsRow",
    "Z90", "amount_text", "build_report", "config_text", "discrete_gaussian_halfwidth", "epsilon_for_halfwidth",
    "fraction_text", "gaussian_moe", "gaussian_moe_met", "gaussian_sigma2", "geometric_halfwidth",
    "geometric_sd_moe", "parse_state_filter", "parse_tau", "plan", "plan_from_config", "plan_from_targets",
    "plan_json", "read_targets", "rho_for_moe", "round_up", "totals_row", "write_plan",
]
