"""What every command shares about its output: ``--quiet``/``--verbose``, the progress display
and the logs, and the ``--overwrite`` of report folders.

``-q/--quiet`` and ``-v/--verbose`` mean the same on every command:

* quiet: no progress, no result line; warnings and the one error line of a failure only;
* default: progress on stderr (bars on a terminal, a few plain lines otherwise) and the result;
* verbose (``-v``; ``-vv`` for debug events): also the log events, as readable lines.

They are options of the ``phsafe`` group (``phsafe -q validate ...``, ``phsafe -vv synth ...``)
and, long only, of every command (``phsafe validate ... --quiet``). The short ``-v`` is not a
command option because ``private`` and ``non-private`` keep the production release's ``-v``
(``--validate``, spec §8).

A command uses them like this (``private`` and ``non-private`` too)::

    @click.command()
    @verbosity_options
    @log_option
    @handle_errors                       # a failure is one line: phsafe: error: ...
    def private(..., log_file):
        with command_progress(log_file) as progress:
            result = run_private(..., progress=progress)
        result_line(f"phsafe: published ... ")

Log events go to the ``-l/--log`` file as JSON lines, all of them; on the console only through
the progress display's sink (warnings, and info events when verbose), never errors: a failure is
reported once, by :func:`phsafe.cli._common.handle_errors`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from phsafe.progress import Progress

F = TypeVar("F", bound=Callable[..., Any])

_QUIET, _VERBOSE = "phsafe.quiet", "phsafe.verbose"
CONSOLE_OFF = logging.CRITICAL + 10
"""The structlog console threshold of the commands: its own console renderer is off (events
reach the console through the progress display's sink)."""


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if not value:
            return
        if key == _QUIET:
            ctx.meta[_QUIET] = True
        else:
            ctx.meta[_VERBOSE] = max(int(ctx.meta.get(_VERBOSE, 0)), int(value))
    return callback


def group_verbosity_options(f: F) -> F:
    """``-q/--quiet`` and ``-v/--verbose`` (repeatable) on the ``phsafe`` group."""
    f = click.option("-v", "--verbose", count=True, expose_value=False, is_eager=True,
                     callback=_remember(_VERBOSE),
                     help="Show log events too (-vv: debug events). Same as --verbose on any command.")(f)
    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True,
                     callback=_remember(_QUIET),
                     help="No progress and no result line: warnings and errors only. Same as --quiet on any command.")(f)
    return f


def verbosity_options(f: F) -> F:
    """``--quiet`` and ``--verbose`` (long only) on a command; the same as the group's ``-q``/``-v``."""
    f = click.option("--verbose", count=True, expose_value=False, callback=_remember(_VERBOSE),
                     help="Show log events too (twice: debug events); also `phsafe -v COMMAND`.")(f)
    f = click.option("--quiet", is_flag=True, expose_value=False, callback=_remember(_QUIET),
                     help="No progress and no result line: warnings and errors only; also `phsafe -q COMMAND`.")(f)
    return f


def verbosity(ctx: click.Context | None = None) -> tuple[bool, int]:
    """(quiet, verbose) of the running command, from the group's and the command's options.

    Raises:
        click.UsageError: Both quiet and verbose were given.
    """
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None:
        return False, 0
    quiet, verbose = bool(ctx.meta.get(_QUIET)), int(ctx.meta.get(_VERBOSE, 0))
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose contradict each other; give one")
    return quiet, verbose


@contextlib.contextmanager
def command_progress(log_file: Path | None = None, *, stream: Any = None) -> Iterator["Progress"]:
    """The progress display of the running command, with the logs configured to match.

    Yields:
        The :class:`phsafe.progress.Progress` to hand to the library.
    """
    from phsafe import logs  # imported when a command runs: ``phsafe --help`` needs neither
    from phsafe.progress import for_stream

    quiet, verbose = verbosity()
    progress = for_stream(stream or sys.stderr, quiet=quiet, verbose=verbose)
    logs.configure(log_file, console_level=CONSOLE_OFF, sinks=[progress.log_sink])
    with progress:
        yield progress


def result_line(text: str, *, err: bool = False) -> None:
    """The command's result (e.g. where it wrote): printed unless quiet."""
    quiet, _ = verbosity()
    if not quiet:
        click.echo(text, err=err)


overwrite_option = click.option(
    "--overwrite", is_flag=True,
    help="Replace the files of an existing output folder (without it, a folder that holds files is refused).")
