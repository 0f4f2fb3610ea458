"""``phsafe plan``: budgets from 90% MOE targets, or MOEs from a config's budgets.

Mounted by :mod:`phsafe.cli`. The planner itself (and matplotlib) is imported only when the
command runs, so the CLI starts fast.

    phsafe plan --targets FILE --tau SPEC... [--privacy-defn zcdp|puredp] [--state-filter us|pr|LIST]
                [--sensitivity paper|exact] [--digits N] [--delta D] [--out DIR] [--overwrite]
    phsafe plan --from-config CONFIG [--digits N] [--delta D] [--out DIR] [--overwrite]
"""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from phsafe.cli._common import handle_errors, log_option
from phsafe.cli._output import command_progress, overwrite_option, result_line, verbosity_options

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("plan")
@click.option("--targets", "targets_file", type=_FILE, default=None,
              help="MOE targets (CSV or JSON: table, geography, iteration, moe); see docs/planning_and_risk.md.")
@click.option("--from-config", "config_file", type=_FILE, default=None,
              help="Instead of targets: report the MOEs of this config's budgets.")
@click.option("--tau", "tau_specs", multiple=True, metavar="SPEC",
              help="Truncation thresholds: TABLE=N (e.g. PH3=6), comma-separated lists of them, or N "
                   "for every person table; repeatable, later values win.")
@click.option("--privacy-defn", type=click.Choice(["zcdp", "puredp"]), default="zcdp", show_default=True,
              help="Which budgets go into config.json (both are reported).")
@click.option("--state-filter", default="us", show_default=True,
              help="us (50 states and DC), pr (Puerto Rico: no USA levels) or FIPS codes, e.g. 01,06.")
@click.option("--sensitivity", type=click.Choice(["paper", "exact"]), default="paper", show_default=True,
              help="The sensitivity the noise is calibrated to: the PHSafe paper's 2*tau+2 and 2, or the exact "
                   "ones of docs/sensitivity.md (the report then compares the two).")
@click.option("--digits", type=click.IntRange(1, 15), default=6, show_default=True,
              help="Significant digits of the budgets (always rounded up).")
@click.option("--delta", type=float, default=1e-10, show_default=True,
              help="delta of the (epsilon, delta) conversion of the zCDP totals.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("phsafe-plan"),
              show_default=True, help="Output folder: new or empty (see --overwrite).")
@overwrite_option
@log_option
@verbosity_options
@click.pass_context
@handle_errors
def plan(ctx: click.Context, targets_file: Path | None, config_file: Path | None, tau_specs: tuple[str, ...],
         privacy_defn: str, state_filter: str, sensitivity: str, digits: int, delta: float, out: Path,
         overwrite: bool, log_file: Path | None) -> None:
    """Plan budgets for MOE targets (writes config.json), or the MOEs of a config.

    Writes config.json (from targets), plan.json, plan_report.md/.html, moe_vs_rho.png and
    budget_split.png into OUT. Budgets are rounded up so every MOE target is met.
    """
    from phsafe import planner
    from phsafe.config import PrivacyDefinition
    from phsafe.amounts import amount_text

    if (targets_file is None) == (config_file is None):
        raise click.UsageError("give exactly one of --targets FILE and --from-config CONFIG")
    if config_file is not None:
        for name in ("tau_specs", "privacy_defn", "state_filter", "sensitivity"):
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                flag = "--" + name.replace("_specs", "").replace("_", "-")
                raise click.UsageError(f"{flag} applies to --targets only (the config fixes it)")
    if not 0 < delta < 1:
        raise click.BadParameter("must be between 0 and 1", param_hint="--delta")
    with command_progress(log_file) as progress, progress.stage("plan"):
        result = planner.plan(
            targets_file, config=config_file, tau=tau_specs, privacy_defn=privacy_defn,
            state_filter=state_filter, digits=digits, delta=delta, sensitivity=sensitivity,
        )
        paths = planner.write_plan(result, out, overwrite=overwrite)
    measure = "rho" if result.privacy_defn is PrivacyDefinition.ZCDP else "epsilon"
    total = result.total(measure)

    def text(x: object) -> str:
        return "n/a" if x is None else amount_text(x)  # type: ignore[arg-type]

    factor = result.bounded_factor(measure)
    result_line(f"phsafe: planned {len(result.levels)} population-group levels; total {measure} "
                f"{text(total)} (bounded {text(None if total is None else factor * total)}; "
                f"{result.bound.value} sensitivities)")
    if result.paper is not None:
        paper = result.paper.total(measure)
        result_line(f"with the paper's sensitivities the same targets take {measure} {text(paper)}")
    for note in result.notes:
        result_line(f"note: {note}")
    for path in paths.values():
        result_line(f"wrote {path}")
