"""What every command shares: the log option, one-line failures, exact-number options."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

import click

from phsafe import logs

PATH = click.Path(path_type=Path)
EXISTING = click.Path(exists=True, path_type=Path)


def fail(exc: BaseException, log_file: Path | None) -> None:
    """End the command on ``exc``: one line on stderr, exit 1 (our errors) or 2 (a bug)."""
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


def parse_cap(value: str | None) -> Fraction | None:
    if value is None:
        return None
    try:
        cap = Fraction(Decimal(value))
    except (InvalidOperation, ValueError):
        raise click.BadParameter("must be a decimal number, e.g. 2.514562") from None
    if cap < 0:
        raise click.BadParameter("must be non-negative")
    return cap


log_option = click.option("-l", "--log", "log_file", type=PATH, default=None,
                          help="Append JSON-lines logs to FILE.")
