"""``phsafe non-private CONFIG DATA OUT``: ground-truth tables, for synthetic data only."""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import EXISTING, PATH, handle_errors, log_option, memory_limit_option, start
from phsafe.cli._output import command_progress, result_line, verbosity_options


@click.command("non-private")
@click.argument("config", type=EXISTING)
@click.argument("data", type=EXISTING)
@click.argument("output", type=PATH)
@click.option("--non-confidential", is_flag=True,
              help="Declare the data synthetic/non-confidential (required: the tables are exact counts).")
@click.option("-v", "--validate", "validate_inputs", is_flag=True, help="Validate the inputs first.")
@memory_limit_option
@click.option("--work-dir", type=PATH, default=None, metavar="DIR",
              help="Where inputs too large for the memory limit are spilled (removed at the end; default: the "
                   "system's temporary folder).")
@log_option
@verbosity_options
@handle_errors
def non_private(config: Path, data: Path, output: Path, non_confidential: bool, validate_inputs: bool,
                memory_limit: int | None, work_dir: Path | None, log_file: Path | None) -> None:
    """Ground-truth tables (no truncation, no noise) -- for synthetic data only."""
    start(log_file)
    from phsafe.engine import run_nonprivate

    with command_progress(log_file) as progress:
        result = run_nonprivate(config, data, output, non_confidential=non_confidential,
                                validate=validate_inputs, progress=progress, memory_limit=memory_limit,
                                work_dir=work_dir)
    result_line(f"phsafe: wrote {len(result.files)} files to {result.output_dir} (run {result.run_id})")
