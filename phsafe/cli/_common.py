"""What every command shares: the log option, one-line failures, exact-number options.

A failure is one line on stderr and a non-zero exit: ``phsafe: error: ...`` for everything this
package refuses on purpose (exit 1), ``phsafe: internal error: <type>`` for a bug (exit 2). No
traceback reaches a console or a file on a user error; for a bug, the log file gets the
exception's type and the file, line and function of each frame -- never its message, which may
quote a value of the data. A command gets this by :func:`handle_errors`, its innermost decorator.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import click

from phsafe import logs
from phsafe.interrupt import RunInterrupted

PATH = click.Path(path_type=Path)
EXISTING = click.Path(exists=True, path_type=Path)
EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)

F = TypeVar("F", bound=Callable[..., Any])


class MemorySize(click.ParamType):
    """A size in bytes: ``8G``, ``512M``, ``12.5GiB`` (binary units; :func:`phsafe.sizes.parse_size`)."""

    name = "SIZE"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from phsafe.sizes import parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


MEMORY_SIZE = MemorySize()


def memory_limit_help() -> str:
    """``--memory-limit``'s help: the parameter's description and this machine's default."""
    from phsafe.memory import default_memory_limit
    from phsafe.sizes import format_size
    from phsafe.parameters import PrivateRunParameters

    text = PrivateRunParameters.model_fields["memory_limit"].description or ""
    return f"{text} This machine's default: {format_size(default_memory_limit())}."


def memory_limit_option(f: F) -> F:
    """``--memory-limit SIZE`` of validate and non-private (private takes it from its parameters)."""
    return click.option("--memory-limit", "memory_limit", type=MEMORY_SIZE, default=None, metavar="SIZE",
                        help=memory_limit_help())(f)


def fail(exc: BaseException, log_file: Path | None) -> None:
    """End the command on ``exc``: one line on stderr, exit 1 (our errors) or 2 (a bug)."""
    from phsafe.errors import PHSafeError, os_reason

    log = logs.get_logger("phsafe.cli")
    if isinstance(exc, RunInterrupted):
        log.info("run interrupted", reason=str(exc).splitlines()[0])
        click.echo(f"phsafe: interrupted: {exc}", err=True)
        raise SystemExit(130)  # 128 + SIGINT, as shells report an interrupted command
    if isinstance(exc, PHSafeError):
        log.debug("run failed", error=str(exc).splitlines()[0] if str(exc) else "", error_type=type(exc).__name__)
        click.echo(f"phsafe: error: {exc}", err=True)
        raise SystemExit(1)
    if isinstance(exc, OSError):
        # An operating-system refusal the code did not foresee: its kind and the file, no data.
        log.error("operating-system error", error_type=type(exc).__name__, frames=logs.crash_frames(exc))
        where = f" on {Path(exc.filename).name}" if getattr(exc, "filename", None) else ""
        click.echo(f"phsafe: error: {os_reason(exc)}{where}", err=True)
        raise SystemExit(1)
    log.error("internal error", error_type=type(exc).__name__, frames=logs.crash_frames(exc))
    where = f" (frames in {log_file})" if log_file else " (re-run with --log FILE for where it happened)"
    click.echo(f"phsafe: internal error: {type(exc).__name__}{where}", err=True)
    raise SystemExit(2)


def handle_errors(command: F) -> F:
    """End ``command`` on an exception the way every command ends: see :func:`fail`.

    The innermost decorator of a command (right above its ``def``), so that it sees the
    command's own arguments: its ``log_file``, when it has one, gets a bug's frames. Click's own
    exits (usage errors, ``--help``, an abort) and an explicit ``SystemExit`` pass through.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (click.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise
        except (Exception, RunInterrupted) as exc:  # noqa: BLE001 -- one line to the user, details to the log
            fail(exc, kwargs.get("log_file"))

    return run  # type: ignore[return-value]


def start(log_file: Path | None) -> None:
    """Set up a command: the log file (checked first: one line if unusable) and signals.

    A file-size limit (``ulimit -f``) must end in an error the run handles -- a failed write,
    rolled back -- not in the process being killed mid-write by SIGXFSZ.
    """
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if log_file is not None:
        log_file = Path(log_file)
        problem = None
        if log_file.is_dir() or str(log_file).endswith(os.sep):
            problem = "is a folder; give a file"
        elif not log_file.parent.is_dir():
            problem = f"is in {log_file.parent}, which is not an existing folder"
        elif log_file.exists() and not os.access(log_file, os.W_OK):
            problem = "is not writable"
        elif not log_file.exists() and not os.access(log_file.parent, os.W_OK):
            problem = "cannot be created (its folder is not writable)"
        if problem:
            click.echo(f"phsafe: error: the log file {log_file} (--log) {problem}", err=True)
            raise SystemExit(1)
    try:
        logs.configure(log_file)
    except OSError as exc:
        click.echo(f"phsafe: error: the log file {log_file} (--log) cannot be opened ({exc.strerror})", err=True)
        raise SystemExit(1) from None


def parse_amount(value: str | None, flag: str) -> Fraction | None:
    """A decimal option (``2.514562``) as an exact Fraction; finite, non-negative, bounded.

    Raises:
        PHSafeError: naming ``flag`` (one line, like every refusal).
    """
    from phsafe.errors import PHSafeError

    if value is None:
        return None
    text = value.strip()
    if len(text) > 40:
        raise PHSafeError(f"{flag}: a number has at most 40 characters")
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise PHSafeError(f"{flag}: {value!r} is not a decimal number (e.g. 2.514562)") from None
    if not number.is_finite():
        raise PHSafeError(f"{flag}: must be a finite number (an infinite cap has no meaning for confidential data)")
    if number < 0:
        raise PHSafeError(f"{flag}: must be non-negative")
    if number != 0 and abs(number.adjusted()) > 40:
        raise PHSafeError(f"{flag}: is out of range")
    return Fraction(number)


log_option = click.option("-l", "--log", "log_file", type=PATH, default=None,
                          help="Append JSON-lines logs to FILE (confidential: keep it with the data).")
