"""The ``phsafe postprocess`` command (mounted by :mod:`phsafe.cli`).

``phsafe postprocess OUT [--dest DIR] [--overwrite] [--draws M] [--seed S] [-l/--log FILE]``
reads only the published private tables in OUT and writes per-cell estimates with 90% credible
intervals, the average tables PH1, PH5, PH8 and a report to DIR (default ``OUT-postprocessed``
next to OUT). See :mod:`phsafe.postprocess`.
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import handle_errors, log_option
from phsafe.cli._output import command_progress, overwrite_option, result_line, verbosity_options

_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


@click.command("postprocess")
@click.argument("output", type=_DIR)
@click.option("--dest", "destination", type=click.Path(path_type=Path), default=None,
              help="Where to write: a new or empty folder (see --overwrite). Default: OUT-postprocessed next to OUT.")
@overwrite_option
@click.option("--draws", type=click.IntRange(min=1), default=4000, show_default=True,
              help="Posterior draws per cell for the averages PH1, PH5, PH8.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of the simulation of the averages (default: random, recorded in postprocess.json).")
@log_option
@verbosity_options
@handle_errors
def postprocess(output: Path, destination: Path | None, overwrite: bool, draws: int, seed: int | None,
                log_file: Path | None) -> None:
    """Estimates and 90% credible intervals from the private outputs in OUTPUT alone.

    Per cell: the posterior mean and median of the true count and its 90% highest posterior
    density credible interval, from the exact discrete Gaussian (or two-sided geometric)
    likelihood of the noise and a flat prior on the non-negative integers. Averages PH1, PH5 and PH8 (numerator over
    denominator) with 90% credible intervals by simulation from those posteriors. Reads no input
    data and spends no privacy-loss budget.
    """
    from phsafe.postprocess import postprocess as run

    with command_progress(log_file) as progress:
        result = run(output, destination, draws=draws, seed=seed, overwrite=overwrite, progress=progress)
    result_line(f"phsafe: wrote {len(result.files)} files to {result.destination} (seed {result.seed}); "
                f"report: {result.destination / 'report.html'}")
