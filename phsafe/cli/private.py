"""``phsafe private CONFIG DATA OUT``: the private run (spec §8), a thin layer over the engine.

Its arguments and options are the command-line spellings of the fields of
:class:`phsafe.parameters.PrivateRunParameters` (the flows take the same fields as parameters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from phsafe.cli._common import handle_errors, log_option, parse_amount, start
from phsafe.cli._output import command_progress, result_line, verbosity_options
from phsafe.cli._parameters import private_run_parameters


@click.command()
@private_run_parameters
@click.option("-v", "--validate", "validate_flag", is_flag=True,
              help="Validate the inputs first (the default; kept for the production release's scripts).")
@log_option
@verbosity_options
@handle_errors
def private(validate_flag: bool, log_file: Path | None, **given: Any) -> None:
    """Run PHSafe on DATA with CONFIG and publish the eleven tables to OUT.

    Checks everything first (config, ledger, keys, paths, space, inputs) and spends nothing
    if anything is wrong. The public release goes to OUT; the run's confidential work folder
    (validation reports, noisy vectors until published, the final checkpoint) is
    runs/<run id>/ beside the ledger.
    """
    if validate_flag and not given["validate_inputs"]:
        raise click.UsageError("give either --validate or --no-validate")
    start(log_file)
    from phsafe.interrupt import stop_at_safe_points
    from phsafe.parameters import PrivateRunParameters
    from phsafe.sequence import InProcess, run_release

    given["lifetime_cap"] = parse_amount(given["lifetime_cap"], "--lifetime-cap")
    parameters = PrivateRunParameters(**given)
    with stop_at_safe_points(), command_progress(log_file) as progress:
        result = run_release(parameters, runner=InProcess(progress))
    throwaway = f"; throwaway ledger {result.ledger}" if parameters.ledger is None and parameters.non_confidential else ""
    result_line(f"phsafe: published {len(result.files)} files to {result.output_dir} (run {result.run_id}; "
                f"confidential work folder {result.run_dir}{throwaway})")
