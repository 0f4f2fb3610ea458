"""``phsafe validate CONFIG DATA``: the config and the inputs against the suites; spends nothing."""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import EXISTING, PATH, handle_errors, log_option
from phsafe.cli._output import command_progress, overwrite_option, result_line, verbosity_options


@click.command()
@click.argument("config", type=EXISTING)
@click.argument("data", type=EXISTING)
@click.option("--report-dir", type=PATH, default=None,
              help="Write the full report (HTML pages, JSON results, text) into this new folder.")
@overwrite_option
@log_option
@verbosity_options
@handle_errors
def validate(config: Path, data: Path, report_dir: Path | None, overwrite: bool, log_file: Path | None) -> None:
    """Validate CONFIG and the input files in DATA; spends no budget.

    Every broken rule is one line on stderr: file, columns, rule and the number of failing rows
    (never a value). Exit status 1 if any rule fails.
    """
    with command_progress(log_file) as progress:
        from phsafe._plots import report_folder
        from phsafe.validation import validate_inputs

        if report_dir is not None:
            report_folder(report_dir, overwrite=overwrite, what="report folder")
        with progress.stage("validate the config and the inputs"):
            report = validate_inputs(config, data, report_dir=report_dir, progress=progress)
    if not report.ok:
        click.echo(report.to_text(), err=True)
        click.echo("phsafe: error: input validation failed", err=True)
        raise SystemExit(1)
    where = f"; report in {report_dir}" if report_dir is not None else ""
    result_line(f"phsafe: inputs are valid{where}")
