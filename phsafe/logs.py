"""Logging with structlog: JSON lines to the log file, readable lines on the console.

Log events describe stages, timings, files and digests -- never microdata and never a value of a
record. The log file is confidential (it lies in the enclave, beside the ledger): timings, memory
figures and sizes of a run's input pass are functions of the confidential records and go there
only -- a front end that forwards events outside the enclave (the flows' Prefect run log) keeps
the public fields only (``flows/_logging.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

import structlog


def _add_log_level(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """The severity as ``log_level``: ``level`` is taken by the population-group level that the
    engine binds to the events of a measurement (``state_A-G``), which structlog's own
    ``add_log_level`` would overwrite."""
    event["log_level"] = "warning" if method == "warn" else ("error" if method == "exception" else method)
    return event


LOG_FILE_NAME = "phsafe-log.jsonl"
"""The confidential JSON-lines log of the runs on a ledger, beside it (the flows' default)."""

_file_here: contextvars.ContextVar[TextIO | None] = contextvars.ContextVar("phsafe_log_file", default=None)
_path_here: contextvars.ContextVar[Path | None] = contextvars.ContextVar("phsafe_log_path", default=None)
_open_files: dict[Path, TextIO] = {}
_open_files_lock = threading.Lock()
_log_path: Path | None = None


class _JsonFileTee:
    """A structlog processor that appends each event as one JSON line to the log file: the one
    :func:`log_to` chose for the current context, else the process's (:func:`configure`)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        stream = _file_here.get() or self.stream
        if stream is not None:
            stream.write(json.dumps(dict(event), default=str, sort_keys=True) + "\n")
            stream.flush()
        return event


_log_stream: TextIO | None = None


@contextlib.contextmanager
def log_to(log_file: Path) -> Iterator[None]:
    """Inside the block (and the threads and tasks started from it), events go to ``log_file``
    instead of the process's log file: each dataset's log lies beside its own ledger, even when
    one process runs two datasets (the release flow's US and Puerto Rico subflows)."""
    path = Path(log_file).absolute()
    stream = _open(path)
    token, path_token = _file_here.set(stream), _path_here.set(path)
    try:
        yield
    finally:
        _file_here.reset(token)
        _path_here.reset(path_token)


def _open(path: Path) -> TextIO:
    with _open_files_lock:
        stream = _open_files.get(path)
        if stream is None or stream.closed:
            path.parent.mkdir(parents=True, exist_ok=True)
            stream = _open_files[path] = open(path, "a", encoding="utf-8")
        return stream


def check_log_file(log_file: Path, what: str = "the log file") -> None:
    """That ``log_file`` can be appended to (its folder is created if missing), or one line why not.

    Raises:
        PHSafeError: ``<what> <path> cannot be written: permission denied (EACCES)``.
    """
    from phsafe.errors import PHSafeError, os_reason

    path = Path(log_file).absolute()
    try:
        _open(path)
    except OSError as exc:
        raise PHSafeError(f"{what} {path} cannot be written: {os_reason(exc)}") from None


def current_log_file() -> Path | None:
    """The file this context's events go to (:func:`log_to`, else :func:`configure`'s), if any:
    where a message can send the operator for figures it must not state itself."""
    return _path_here.get() or _log_path


class _Forward:
    """A structlog processor handing a copy of each event to ``sink`` (e.g. an orchestrator's
    run log), which must not raise."""

    def __init__(self, sink: Callable[[str, dict[str, Any]], None]) -> None:
        self.sink = sink

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        self.sink(method, dict(event))
        return event


def configure(
    log_file: Path | None = None,
    *,
    console_level: int = logging.INFO,
    sinks: Sequence[Callable[[str, dict[str, Any]], None]] = (),
) -> None:
    """Configure structlog once for the process.

    Events carry the context bound with ``structlog.contextvars`` (run id, table, level, ...);
    they go to the console (human-readable), to ``log_file`` as JSON lines if given, and to each
    of ``sinks`` as ``(level, event dict)``.
    """
    global _log_stream, _log_path
    if _log_stream is not None:
        _log_stream.close()
        _log_stream = None
    _log_path = Path(log_file).absolute() if log_file is not None else None
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        _log_stream = open(log_file, "a", encoding="utf-8")
    processors.append(_JsonFileTee(_log_stream))
    processors.extend(_Forward(sink) for sink in sinks)
    processors.append(_ConsoleFilter(console_level))
    console = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), exception_formatter=_no_traceback)
    # The severity column reads ``log_level``; a population-group ``level`` is an ordinary field.
    console.columns = [structlog.dev.Column("log_level", c.formatter) if c.key == "level" else c
                       for c in console.columns]
    processors.append(console)
    structlog.configure(
        processors=processors,
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def _no_traceback(sio: TextIO, exc_info: Any) -> None:
    """Tracebacks go to the log file only; the console gets one line."""


class _ConsoleFilter:
    _LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "exception": 40, "critical": 50}

    def __init__(self, level: int) -> None:
        self.level = level

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if self._LEVELS.get(method, 20) < self.level:
            raise structlog.DropEvent
        event.pop("exception", None)
        return event


def get_logger(name: str = "phsafe") -> Any:
    """A structlog logger. Until the program configures logging (:func:`configure`: the command
    line and the flows do), the library shows warnings and errors only -- a notebook that calls
    ``phsafe.run_private`` is not flooded with debug events."""
    if not structlog.is_configured():
        configure(console_level=logging.WARNING)
    return structlog.get_logger(name)


def crash_frames(exc: BaseException) -> list[str]:
    """Where ``exc`` was raised, as ``file:line in function`` per frame: no message, no values
    (what a log may keep of an unforeseen error: its place, never the data it was handling)."""
    return [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in traceback.extract_tb(exc.__traceback__)]
