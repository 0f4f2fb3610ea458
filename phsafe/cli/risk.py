"""``phsafe risk CONFIG``: Bayesian disclosure risk of every measured level of a config.

Mounted by :mod:`phsafe.cli`; :mod:`phsafe.risk` is imported only when the command runs.

    phsafe risk CONFIG [--out DIR] [--overwrite] [--prior P]... [--released X,Y,...] [--known-count K]
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import click

from phsafe.cli._common import handle_errors, log_option
from phsafe.cli._output import command_progress, overwrite_option, result_line, verbosity_options

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def _prior(value: str) -> Fraction:
    try:
        p = Fraction(value.strip())
    except (ValueError, ZeroDivisionError):
        raise click.BadParameter(f"{value!r} is not a probability (e.g. 1/5 or 0.2)") from None
    if not 0 < p < 1:
        raise click.BadParameter(f"{value!r} must be strictly between 0 and 1")
    return p


@click.command("risk")
@click.argument("config", type=_FILE)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("phsafe-risk"),
              show_default=True, help="Output folder: new or empty (see --overwrite).")
@overwrite_option
@click.option("--prior", "priors", multiple=True, metavar="P",
              help="Intruder's prior that the target is in the cell (e.g. 1/5); repeatable. "
                   "Default: 1/2, 1/5, 1/10, 1/50.")
@click.option("--released", default=None, metavar="X,Y,...",
              help="Released values to tabulate (default: quantiles of the release when the target is in).")
@click.option("--known-count", type=click.IntRange(min=0), default=0, show_default=True,
              help="k, the count without the target (the risk does not depend on it).")
@log_option
@verbosity_options
@handle_errors
def risk(config: Path, out: Path, overwrite: bool, priors: tuple[str, ...], released: str | None, known_count: int,
         log_file: Path | None) -> None:
    """Disclosure risk of one released cell, for every measured level of CONFIG.

    Writes risk.json, risk_report.md, risk_report.html and risk_ratio.png into OUT.
    """
    from phsafe import risk as risk_mod

    prior_values = tuple(_prior(p) for p in priors) or risk_mod.PRIORS
    values = None
    if released is not None:
        try:
            values = [int(v) for v in released.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter("must be comma-separated integers", param_hint="--released") from None
    with command_progress(log_file) as progress, progress.stage("disclosure risk"):
        result = risk_mod.analyse_config(config, prior_values, values, known_count)
        paths = risk_mod.write_risk(result, out, overwrite=overwrite)
    worst = max((m.risk for nr in result.by_noise.values() for m in nr.marginals), default=1.0)
    result_line(f"phsafe: analysed {len(result.levels)} population-group levels "
                f"({len(result.by_noise)} distinct noises); largest marginal risk R = {worst:.6f}")
    for path in paths.values():
        result_line(f"wrote {path}")
