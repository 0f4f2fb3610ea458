"""``phsafe plan`` as one call: read targets (or a config), plan, and optionally write."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from phsafe.config import PHSafeConfig, PrivacyDefinition
from phsafe.errors import PlanningError
from phsafe.planner.moe import DEFAULT_DIGITS
from phsafe.planner.plan import DEFAULT_DELTA, Plan, plan_from_config, plan_from_targets
from phsafe.planner.report import write_plan
from phsafe.planner.targets import parse_state_filter, parse_tau, read_targets
from phsafe.sensitivity import SensitivityBound


def plan(
    targets: str | Path | None = None,
    *,
    config: PHSafeConfig | str | Path | None = None,
    tau: int | Mapping[str, int] | Sequence[str] | None = None,
    privacy_defn: PrivacyDefinition | str = PrivacyDefinition.ZCDP,
    state_filter: str | Sequence[str] = "us",
    digits: int = DEFAULT_DIGITS,
    delta: float = DEFAULT_DELTA,
    out: str | Path | None = None,
    overwrite: bool = False,
    sensitivity: SensitivityBound | str = SensitivityBound.PAPER,
) -> Plan:
    """Plan budgets for 90% MOE targets, or the MOEs of a config's budgets (``phsafe plan``).

    Give exactly one of ``targets`` (a targets file, see ``docs/planning_and_risk.md``) and
    ``config``. The paper's Table 10::

        p = plan("docs/table10_moe_targets.csv", tau=["10", "PH3=6,PH6=6"])
        p.total("rho")                     # Fraction(6286441129, 5000000000): 1.2572882258

    Args:
        targets: MOE targets file (CSV or JSON).
        config: Instead of targets: a config (or its path) whose MOEs to report.
        tau: Truncation thresholds (targets only): an int for every person table, a mapping
            table -> int, or ``--tau`` specs (``"10"``, ``"PH3=6,PH6=6"``; later ones win).
        privacy_defn: Which budgets go into the planned config (both are reported).
        state_filter: ``"us"``, ``"pr"``, comma-separated FIPS codes, or a list of them.
        digits: Significant digits of the budgets (rounded up).
        delta: delta of the (epsilon, delta) conversions.
        out: Also write the plan there (:func:`write_plan`): config.json, plan.json, report, plots.
        overwrite: Replace the files of an existing ``out`` folder.
        sensitivity: Targets only: ``"paper"`` (2 tau + 2 and 2, the production release's) or
            ``"exact"`` (the proven sensitivities, ``docs/sensitivity.md``; the plan then holds the
            paper's plan of the same targets for comparison). A config fixes its own.

    Raises:
        PlanningError: Neither or both of targets and config, or a bad target or tau.
    """
    if (targets is None) == (config is None):
        raise PlanningError("give exactly one of targets and config")
    if config is not None:
        result = plan_from_config(config, digits=digits, delta=delta)
    else:
        table_targets, file_tau = read_targets(targets)  # type: ignore[arg-type]
        if isinstance(tau, int):
            specs: list[str] = [str(tau)]
        elif isinstance(tau, Mapping):
            specs = [f"{t}={n}" for t, n in tau.items()]
        else:
            specs = list(tau or [])
        states = parse_state_filter(state_filter) if isinstance(state_filter, str) else list(state_filter)
        result = plan_from_targets(table_targets, parse_tau(specs, base=file_tau),
                                   privacy_defn=PrivacyDefinition(privacy_defn), state_filter=states,
                                   digits=digits, delta=delta, source=str(targets),
                                   sensitivity=SensitivityBound(sensitivity))
    if out is not None:
        write_plan(result, out, overwrite=overwrite)
    return result
