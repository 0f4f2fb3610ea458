"""``phsafe validate CONFIG DATA``: the config and the inputs against the suites; spends nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from phsafe.cli._common import EXISTING, PATH, handle_errors, log_option, memory_limit_option
from phsafe.cli._output import command_progress, overwrite_option, result_line, verbosity_options

if TYPE_CHECKING:
    from phsafe.config import ConfigFile


@click.command()
@click.argument("config", type=EXISTING)
@click.argument("data", type=EXISTING)
@click.option("--report-dir", type=PATH, default=None,
              help="Write the full report (HTML pages, JSON results, text) into this new folder.")
@overwrite_option
@memory_limit_option
@click.option("--work-dir", type=PATH, default=None, metavar="DIR",
              help="Where inputs too large for the memory limit are spilled (a private folder in it, removed at "
                   "the end; confidential; default: the system's temporary folder).")
@log_option
@verbosity_options
@handle_errors
def validate(config: Path, data: Path, report_dir: Path | None, overwrite: bool, memory_limit: int | None,
             work_dir: Path | None, log_file: Path | None) -> None:
    """Validate CONFIG and the input files in DATA; spends no budget.

    Every broken rule is one line on stderr: file, columns, rule and the number of failing rows
    (never a value). Exit status 1 if any rule fails.
    """
    with command_progress(log_file) as progress:
        from phsafe._plots import report_folder
        from phsafe.intake import validate_inputs

        if report_dir is not None:
            report_folder(report_dir, overwrite=overwrite, what="report folder")
        spill_dir = _spill_dir(work_dir)
        with progress.stage("validate the config and the inputs"):
            source = _read_once(config)
            _refuse_if_too_big(source, data, memory_limit, spill_dir)
            report = validate_inputs(source, data, report_dir=report_dir, progress=progress,
                                     memory_limit=memory_limit, spill_dir=spill_dir)
    if not report.ok:
        click.echo(report.to_text(), err=True)
        click.echo("phsafe: error: input validation failed", err=True)
        raise SystemExit(1)
    where = f"; report in {report_dir}" if report_dir is not None else ""
    result_line(f"phsafe: inputs are valid{where}")


def _spill_dir(work_dir: Path | None) -> Path | None:
    """A new spill folder's path in ``work_dir`` (made, private, and removed by the pass)."""
    if work_dir is None:
        return None
    import uuid

    return Path(work_dir).absolute() / f"phsafe-spill-{uuid.uuid4().hex[:12]}"


def _read_once(config: Path) -> "ConfigFile | Path":
    """The command's one read of CONFIG (the path itself when it cannot be read: the report says why)."""
    from phsafe.config import read_config_file
    from phsafe.errors import ConfigError

    try:
        return read_config_file(config)
    except ConfigError:
        return config


def _refuse_if_too_big(source: "ConfigFile | Path", data: Path, memory_limit: int | None,
                       spill_dir: Path | None) -> None:
    """Refuse, before reading, inputs that cannot be validated within the memory limit."""
    from phsafe.config import ConfigFile
    from phsafe.intake import check_pass_memory

    if not isinstance(source, ConfigFile) or source.config is None:
        return  # validation reports the config's problems; its pass plans without a state filter
    check_pass_memory(Path(data), source.config.states, memory_limit=memory_limit, validate=True,
                      spill_dir=spill_dir)
