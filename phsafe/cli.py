"""The ``phsafe`` command line, compatible with the production release (spec §8).

``phsafe validate CONFIG DATA``, ``phsafe private CONFIG DATA OUT``, ``phsafe non-private CONFIG
DATA OUT`` with ``-l/--log``, ``-v/--validate`` and ``-vo/--validate-private-output``, plus the
audit commands. Failures exit non-zero with one human line on stderr; details (tracebacks) go to
the log file only.
"""

from __future__ import annotations

import sys
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

import click

import phsafe
from phsafe import logs

_PATH = click.Path(path_type=Path)
_EXISTING = click.Path(exists=True, path_type=Path)


def _fail(exc: BaseException, log_file: Path | None) -> None:
    from phsafe.errors import PHSafeError

    log = logs.get_logger("phsafe.cli")
    if isinstance(exc, PHSafeError):
        log.error("run failed", error=str(exc).splitlines()[0], error_type=type(exc).__name__)
        click.echo(f"phsafe: error: {exc}", err=True)
        raise SystemExit(1)
    log.error("internal error", error_type=type(exc).__name__, exc_info=exc)
    where = f" (details in {log_file})" if log_file else " (re-run with --log FILE for details)"
    click.echo(f"phsafe: internal error: {type(exc).__name__}{where}", err=True)
    raise SystemExit(2)


def _parse_cap(value: str | None) -> Fraction | None:
    if value is None:
        return None
    try:
        cap = Fraction(Decimal(value))
    except (InvalidOperation, ValueError):
        raise click.BadParameter("must be a decimal number, e.g. 2.514562") from None
    if cap < 0:
        raise click.BadParameter("must be non-negative")
    return cap


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(phsafe.__version__, prog_name="phsafe")
def main() -> None:
    """PHSafe: the S-DHC tables under differential privacy."""


_log_option = click.option("-l", "--log", "log_file", type=_PATH, default=None,
                           help="Append JSON-lines logs to FILE.")


@main.command()
@click.argument("config", type=_EXISTING)
@click.argument("data", type=_EXISTING)
@click.option("--report-dir", type=_PATH, default=None,
              help="Write the full validation result and HTML Data Docs here.")
@_log_option
def validate(config: Path, data: Path, report_dir: Path | None, log_file: Path | None) -> None:
    """Validate CONFIG and the input files in DATA; spends no budget."""
    logs.configure(log_file)
    try:
        from phsafe.validation import validate_inputs

        report = validate_inputs(config, data, report_dir=report_dir)
    except Exception as exc:  # noqa: BLE001 -- one line to the user, details to the log
        _fail(exc, log_file)
        return
    if not report.ok:
        click.echo(report.to_text(), err=True)
        click.echo("phsafe: error: input validation failed", err=True)
        raise SystemExit(1)
    click.echo("phsafe: inputs are valid")


@main.command()
@click.argument("config", type=_EXISTING)
@click.argument("data", type=_EXISTING)
@click.argument("output", type=_PATH)
@click.option("-v", "--validate", "validate_inputs", is_flag=True, help="Validate the inputs first.")
@click.option("-vo", "--validate-private-output", "validate_outputs", is_flag=True,
              help="Validate the output tables before publishing them.")
@_log_option
@click.option("--ledger", type=_PATH, default=None,
              help="Audit ledger (JSON Lines). Default: phsafe-ledger/ledger.jsonl in the working directory.")
@click.option("--lifetime-cap", default=None,
              help="Lifetime privacy-loss cap of this dataset (default: this run's planned total).")
@click.option("--cap-reason", default=None, help="Why the cap is raised (recorded in the ledger).")
@click.option("--signing-key", type=_EXISTING, default=None,
              help="Ed25519 private key (PEM) to sign the ledger checkpoint.")
@click.option("--non-confidential", is_flag=True,
              help="Declare the data synthetic/non-confidential (allows Infinity budgets).")
@click.option("--truncation-key", default=None, help="Replay a run with its recorded truncation key (hex).")
@click.option("--resume", "resume_run_id", default=None, metavar="RUN_ID",
              help="Resume the failed run RUN_ID (same CONFIG, DATA and OUTPUT): its committed "
                   "measurements are reused, the rest are new spends.")
@click.option("--resume-reason", default=None, help="Why the run is resumed (recorded in the ledger).")
def private(config: Path, data: Path, output: Path, validate_inputs: bool, validate_outputs: bool,
            log_file: Path | None, ledger: Path | None, lifetime_cap: str | None, cap_reason: str | None,
            signing_key: Path | None, non_confidential: bool, truncation_key: str | None,
            resume_run_id: str | None, resume_reason: str | None) -> None:
    """Run PHSafe on DATA with CONFIG and publish the eleven tables to OUTPUT."""
    logs.configure(log_file)
    try:
        from phsafe.engine import DEFAULT_LEDGER, PrivateRunOptions, run_private

        options = PrivateRunOptions(
            ledger=ledger or DEFAULT_LEDGER, lifetime_cap=_parse_cap(lifetime_cap),
            cap_reason=cap_reason, signing_key=signing_key, non_confidential=non_confidential,
            validate_inputs=validate_inputs, validate_outputs=validate_outputs,
            truncation_key=truncation_key, resume_reason=resume_reason,
        )
        result = run_private(config, data, output, options, run_id=resume_run_id, resume=resume_run_id is not None)
    except click.BadParameter:
        raise
    except Exception as exc:  # noqa: BLE001
        _fail(exc, log_file)
        return
    click.echo(f"phsafe: published {len(result.files)} files to {result.output_dir} (run {result.run_id})")


@main.command("non-private")
@click.argument("config", type=_EXISTING)
@click.argument("data", type=_EXISTING)
@click.argument("output", type=_PATH)
@click.option("-v", "--validate", "validate_inputs", is_flag=True, help="Validate the inputs first.")
@_log_option
def non_private(config: Path, data: Path, output: Path, validate_inputs: bool, log_file: Path | None) -> None:
    """Ground-truth tables (no truncation, no noise) -- for synthetic data only."""
    logs.configure(log_file)
    try:
        from phsafe.engine import run_nonprivate

        result = run_nonprivate(config, data, output, validate=validate_inputs)
    except Exception as exc:  # noqa: BLE001
        _fail(exc, log_file)
        return
    click.echo(f"phsafe: wrote {len(result.files)} files to {result.output_dir} (run {result.run_id})")


# Commands that live in their own modules: (module, click command name). Imported when the CLI
# starts; each module owns its command and its options.
_COMMAND_MODULES: tuple[tuple[str, str], ...] = (
    ("phsafe.audit.cli", "audit"),
    ("phsafe.planner_cli", "plan"),
    ("phsafe.risk_cli", "risk"),
    ("phsafe.postprocess_cli", "postprocess"),
    ("phsafe.accuracy_cli", "accuracy"),
    ("phsafe.synth_cli", "synth"),
)


def _mount_commands() -> None:
    import importlib

    for module_name, attribute in _COMMAND_MODULES:
        main.add_command(getattr(importlib.import_module(module_name), attribute))


_mount_commands()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
