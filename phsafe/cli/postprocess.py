"""The ``phsafe postprocess`` command (mounted by :mod:`phsafe.cli`).

``phsafe postprocess OUT [--dest DIR] [--draws M] [--seed S] [-l/--log FILE]`` reads only the
published private tables in OUT and writes per-cell estimates with 90% credible intervals and the
average tables PH1, PH5, PH8 to DIR (default ``OUT-postprocessed`` next to OUT). See
:mod:`phsafe.postprocess`.
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe import logs

_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


@click.command("postprocess")
@click.argument("output", type=_DIR)
@click.option("--dest", "destination", type=click.Path(path_type=Path), default=None,
              help="Where to write (must not exist). Default: OUT-postprocessed next to OUT.")
@click.option("--draws", type=click.IntRange(min=1), default=4000, show_default=True,
              help="Posterior draws per cell for the averages PH1, PH5, PH8.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of the simulation of the averages (default: random, recorded in postprocess.json).")
@click.option("-l", "--log", "log_file", type=click.Path(path_type=Path), default=None,
              help="Append JSON-lines logs to FILE.")
def postprocess(output: Path, destination: Path | None, draws: int, seed: int | None, log_file: Path | None) -> None:
    """Estimates and 90% credible intervals from the private outputs in OUTPUT alone.

    Per cell: the posterior mean and median of the true count and its 90% highest posterior
    density credible interval, from the exact discrete Gaussian (or two-sided geometric)
    likelihood of the noise and a flat prior on the non-negative integers. Averages PH1, PH5 and PH8 (numerator over
    denominator) with 90% credible intervals by simulation from those posteriors. Reads no input
    data and spends no privacy-loss budget.
    """
    logs.configure(log_file)
    from phsafe.errors import PHSafeError
    from phsafe.postprocess import postprocess as run

    try:
        result = run(output, destination, draws=draws, seed=seed)
    except PHSafeError as exc:
        click.echo(f"phsafe: error: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"phsafe: wrote {len(result.files)} files to {result.destination} (seed {result.seed})")
