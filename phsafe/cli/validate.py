"""``phsafe validate CONFIG DATA``: the config and the inputs against the suites; spends nothing."""

from __future__ import annotations

from pathlib import Path

import click

from phsafe import logs
from phsafe.cli._common import EXISTING, PATH, fail, log_option


@click.command()
@click.argument("config", type=EXISTING)
@click.argument("data", type=EXISTING)
@click.option("--report-dir", type=PATH, default=None,
              help="Write the full validation result and HTML Data Docs here.")
@log_option
def validate(config: Path, data: Path, report_dir: Path | None, log_file: Path | None) -> None:
    """Validate CONFIG and the input files in DATA; spends no budget."""
    logs.configure(log_file)
    try:
        from phsafe.validation import validate_inputs

        report = validate_inputs(config, data, report_dir=report_dir)
    except Exception as exc:  # noqa: BLE001 -- one line to the user, details to the log
        fail(exc, log_file)
        return
    if not report.ok:
        click.echo(report.to_text(), err=True)
        click.echo("phsafe: error: input validation failed", err=True)
        raise SystemExit(1)
    click.echo("phsafe: inputs are valid")
