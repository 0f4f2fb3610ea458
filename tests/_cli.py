"""The ``phsafe`` command run in the test's own process, seen as a subprocess would see it.

A ``phsafe`` subprocess costs about a CPU-second of interpreter start and imports before it does
anything, and one that validates its inputs pays 3-5 s more to import Great Expectations; the
system tests run hundreds of commands. Where the process is not what a test checks, it runs the
command here instead (:func:`phsafe`): the imports are paid once per test worker, and the test
gets what it got from ``subprocess.run([phsafe, ...], capture_output=True, text=True)`` -- a
:class:`subprocess.CompletedProcess` with the exit status, standard output and standard error.

What a fresh process would start without is reset around each command, so that one command
cannot change what the next one does or sees:

* the environment (``env=`` replaces it for the command, as ``subprocess.run(env=...)`` does) and
  the working folder (``cwd=``), the umask, and the SIGINT/SIGTERM/SIGXFSZ handlers;
* the logs: structlog's configuration, the JSON-lines files the command opened (closed, as at a
  process's exit), the root logger's handlers and level;
* the process's handles on ledgers (:func:`phsafe.private_run.open_ledger` keeps one per file:
  a test that rewrites a ledger between two commands must see the second read it anew), the
  expectation suites read from disk, the "said once per process" note of the code's provenance;
* warnings: shown on standard error as a fresh interpreter shows them (its default filters), not
  collected by pytest -- a command whose standard error must be one line fails here too when a
  library warns.

An exception that escapes the command is printed as the interpreter prints it (``Traceback ...``
on standard error) and gives exit status 1. Click's own exits (usage errors: status 2) are as the
installed entry point gives them; the program's name in usage lines is ``phsafe``.

What only a real process shows stays a subprocess, in the tests that check it: the installed
console script and its exit codes, signals and kills (``tests/system/_fault_driver.py``), resource
limits set before ``exec`` (``ulimit -f``), a fresh interpreter's imports, crash safety. And
``PHSAFE_TEST_SUBPROCESS=1`` runs every command of this module as a subprocess instead, to
compare the two ways on the whole suite.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from click import formatting
from click.testing import CliRunner

PHSAFE = Path(sys.executable).parent / "phsafe"
"""The installed console script (the subprocess tests' entry point)."""

SUBPROCESS = os.environ.get("PHSAFE_TEST_SUBPROCESS", "") not in ("", "0")
"""Run every command as a subprocess (to check that the two ways agree)."""

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ, signal.SIGPIPE)


def phsafe(*args: object, env: Mapping[str, str] | None = None, cwd: os.PathLike | str | None = None,
           input: str | None = None, timeout: float | None = None,
           preexec_fn: Callable[[], Any] | None = None) -> subprocess.CompletedProcess:
    """``phsafe ARGS`` -- in this process (see the module docstring), or as a subprocess when
    ``PHSAFE_TEST_SUBPROCESS`` is set or ``preexec_fn`` must run in the child before the command
    (a resource limit such as ``ulimit -f``: only a process of its own can have it). ``timeout``
    bounds a subprocess only."""
    argv = [str(a) for a in args]
    if SUBPROCESS or preexec_fn is not None:
        return subprocess_phsafe(*argv, env=env, cwd=cwd, input=input, timeout=timeout, preexec_fn=preexec_fn)
    return in_process(argv, env=env, cwd=cwd, input=input)


def subprocess_phsafe(*args: object, env: Mapping[str, str] | None = None, cwd: os.PathLike | str | None = None,
                      input: str | None = None, timeout: float | None = 900, **kwargs: Any) -> subprocess.CompletedProcess:
    """``phsafe ARGS`` as a real subprocess of the installed console script."""
    return subprocess.run([str(PHSAFE), *map(str, args)], capture_output=True, text=True, input=input,
                          env=None if env is None else dict(env), cwd=cwd, timeout=timeout, **kwargs)


def in_process(argv: list[str], *, env: Mapping[str, str] | None = None, cwd: os.PathLike | str | None = None,
               input: str | None = None) -> subprocess.CompletedProcess:
    from phsafe.cli import main

    runner = _Runner()
    with _fresh_process_state(env, cwd):
        result = runner.invoke(main, argv, input=input, prog_name="phsafe", catch_exceptions=True)
        stdout, stderr = result.stdout, result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # What the interpreter prints for an exception nothing caught, and its exit status.
        stderr += "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else repr(result.exception)
        code = 1
    elif code is None:
        code = 0
    return subprocess.CompletedProcess(["phsafe", *argv], code, stdout, stderr)


class _Runner(CliRunner):
    """Click's test runner, with help text as wide as a process writing to a pipe makes it: the
    terminal's width is unknown there, so ``COLUMNS`` or 80 (the runner itself forces 80)."""

    @contextlib.contextmanager
    def isolation(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with super().isolation(*args, **kwargs) as streams:
            columns = int(os.environ.get("COLUMNS", "0") or 0) or 80
            formatting.FORCED_WIDTH = max(min(columns, 80) - 2, 50)  # click's own rule
            yield streams


@contextlib.contextmanager
def _fresh_process_state(env: Mapping[str, str] | None, cwd: os.PathLike | str | None) -> Iterator[None]:
    import structlog

    from phsafe import logs, private_run, provenance
    from phsafe.validation import _suites

    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_umask = os.umask(0o022)
    os.umask(saved_umask)
    saved_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    structlog_was_configured = structlog.is_configured()
    saved_structlog = structlog.get_config()
    saved_log = (logs._log_stream, logs._log_path)
    saved_open_files = dict(logs._open_files)
    saved_ledgers = dict(private_run._ledgers)
    saved_root = (list(logging.root.handlers), logging.root.level, logging.root.manager.disable)
    saved_said = provenance._said
    private_run._ledgers.clear()
    logs._log_stream, logs._log_path = None, None
    provenance._said = False
    _suites._load.cache_clear()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with warnings.catch_warnings():
            warnings.resetwarnings()  # a fresh interpreter's filters (no -W options, no pytest's)
            for action, category in (("ignore", ResourceWarning), ("ignore", ImportWarning),
                                     ("ignore", PendingDeprecationWarning), ("ignore", DeprecationWarning)):
                warnings.simplefilter(action, category)
            warnings.showwarning = _show_on_stderr
            yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)
        os.umask(saved_umask)
        for s, handler in saved_signals.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        # What a process's exit closes: the log files and the ledgers the command opened.
        if logs._log_stream is not None:
            logs._log_stream.close()
        logs._log_stream, logs._log_path = saved_log
        for path, stream in list(logs._open_files.items()):
            if saved_open_files.get(path) is not stream:
                stream.close()
        logs._open_files.clear()
        logs._open_files.update(saved_open_files)
        for ledger in private_run._ledgers.values():
            with contextlib.suppress(Exception):
                ledger.close()
        private_run._ledgers.clear()
        private_run._ledgers.update(saved_ledgers)
        structlog.configure(**saved_structlog)
        if not structlog_was_configured:
            structlog.reset_defaults()
        logging.root.handlers[:] = saved_root[0]
        logging.root.setLevel(saved_root[1])
        logging.disable(saved_root[2])
        provenance._said = saved_said


def _show_on_stderr(message: Any, category: type[Warning], filename: str, lineno: int,
                    file: Any = None, line: str | None = None) -> None:
    (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))
