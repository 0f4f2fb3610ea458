"""The ``phsafe postprocess`` command (mounted by :mod:`phsafe.cli`).

``phsafe postprocess OUT [--dest DIR] [--overwrite] [--draws M] [--seed S] [--exact-limit N]
[--tau TABLE=N ...] [-l/--log FILE]`` reads only the published private tables in OUT (and its
manifest's public facts) and writes the Census Bureau's estimate files, our own estimate tables
with every posterior summary, the checks, the summary metrics and a report to DIR (default
``OUT-postprocessed`` next to OUT). See :mod:`phsafe.postprocess`.
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import handle_errors, log_option
from phsafe.cli._output import command_progress, overwrite_option, result_line, verbosity_options

_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


def _parse_tau(values: tuple[str, ...]) -> dict[str, int] | None:
    if not values:
        return None
    out: dict[str, int] = {}
    for value in values:
        table, sep, number = value.partition("=")
        if not sep or not number.strip().isdigit() or int(number) < 1:
            raise click.BadParameter(f"{value!r}: expected TABLE=N with N >= 1, e.g. PH1_num=10", param_hint="--tau")
        out[table.strip()] = int(number)
    return out


@click.command("postprocess")
@click.argument("output", type=_DIR)
@click.option("--dest", "destination", type=click.Path(path_type=Path), default=None,
              help="Where to write: a new or empty folder (see --overwrite). Default: OUT-postprocessed next to OUT.")
@overwrite_option
@click.option("--draws", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Independent exact draws for an average whose two-dimensional lattice exceeds --exact-limit.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of those draws (default: random, recorded in postprocess.json).")
@click.option("--exact-limit", type=click.IntRange(min=0), default=12_000_000, show_default=True,
              help="Largest two-dimensional lattice (points) of an average computed exactly.")
@click.option("--tau", "tau", multiple=True, metavar="TABLE=N",
              help="Truncation threshold of a person table, e.g. PH1_num=10 (default: the release's manifest).")
@log_option
@verbosity_options
@handle_errors
def postprocess(output: Path, destination: Path | None, overwrite: bool, draws: int, seed: int | None,
                exact_limit: int, tau: tuple[str, ...], log_file: Path | None) -> None:
    """Model-based estimates with 90% intervals from the private outputs in OUTPUT alone.

    Per cell of every table shell (released and marginal cells): the posterior of the true count
    from the exact discrete Gaussian (or two-sided geometric) likelihood of the noise and a flat
    prior on the non-negative integers. Averages PH1, PH5, PH8: the joint posterior of numerator
    and denominator on the lattice points that satisfy their logical bounds (denominator >= 1,
    at least 1 person per household and 2 per family, at most tau). Writes the Census Bureau's
    estimate files (PH<k>/estimates/), our own tables, the checks and a report. Reads no input
    data and spends no privacy-loss budget.
    """
    from phsafe.postprocess import postprocess as run

    taus = _parse_tau(tau)
    with command_progress(log_file) as progress:
        result = run(output, destination, draws=draws, seed=seed, exact_limit=exact_limit, tau=taus,
                     overwrite=overwrite, progress=progress)
    warnings = result.checks[(result.checks["SEVERITY"] == "warning") & ~result.checks["PASSED"]]
    note = f"; {int(warnings['FAILED'].sum())} row(s) flagged by a warning check" if len(warnings) else ""
    result_line(f"phsafe: wrote {len(result.files)} files ({len(result.estimate_files)} estimate files, every error "
                f"check passed{note}) to {result.destination} (seed {result.seed}); "
                f"report: {result.destination / 'report.html'}")
