"""Progress of long commands: one facility, three displays.

A long operation (validation, a private or non-private run, ``synth``, ``accuracy``,
``postprocess``) reports what it is doing through a :class:`Progress`, which it receives as an
argument (``progress: Progress | None = None``; ``None`` means :data:`NULL`). The library
never decides how progress looks; the front end does:

* :class:`RichProgress` -- on a terminal: one line per finished stage (``✓ count exact vectors
  2.1 s``), and a live area with a spinner for the running stage and a bar for each task in it
  (files, partitions, measurements, trials) with its count, current item, elapsed and
  remaining time -- a task of ``unit="bytes"`` (an input file being read) shows the bytes
  read of the total (``2.1/7.6 GB``) and the rate (``95.2 MB/s``); the live area disappears
  when the command ends;
* :class:`PlainProgress` -- not a terminal (CI, Prefect, a pipe): a few plain lines, one per
  finished stage with its tasks' counts and the time it took; a byte task also prints a line
  every :data:`PLAIN_EVERY_SECONDS` while it runs (``persons.csv: 43% read, 95 MB/s, about
  1 min 10 s left``), because reading a national file takes minutes;
* :class:`NullProgress` (:data:`NULL`) -- nothing (``--quiet``, or the library called directly).

:func:`for_stream` picks one for a stream (``quiet``/``verbose`` as the command line gives them).

Using it (a library function)::

    def run_something(files, *, progress: Progress | None = None) -> None:
        progress = progress or NULL
        with progress.stage("read inputs"):
            with progress.task("files", total=len(files), unit="files") as task:
                for f in files:
                    read(f)
                    task.advance(item=f.name)

and from a front end::

    with for_stream(sys.stderr, verbose=1) as progress:
        logs.configure(log_file, console_level=logs_off, sinks=[progress.log_sink])
        run_something(files, progress=progress)

Log events: :meth:`Progress.log_sink` is a structlog sink (:func:`phsafe.logs.configure`'s
``sinks``) that shows warnings (and, when verbose, info events) as readable lines *through* the
display, so they never tear the live bars; it never shows errors, which the command reports in
one line of its own. The JSON log file is unaffected.

Budgets are shown to people as decimals (:func:`phsafe.amounts.amount_text`: ``1.257281``, never
``1257281/1000000``); exact fractions stay in the ledger and its JSON.

Nothing here may show a confidential value: stage and task names, counts of files, partitions,
measurements and trials, and times are structure, never a count of records. Sizes of input files
are shown rounded (three significant digits: ``7.58 GB``) and rates to two: never a file's exact
size in bytes, which could tell one record's field width from another.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Iterator, Protocol, TextIO, runtime_checkable

__all__ = [
    "BYTES",
    "NULL",
    "NullProgress",
    "PlainProgress",
    "Progress",
    "RichProgress",
    "Task",
    "for_stream",
]


# --------------------------------------------------------------------------------------------
# The protocol
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Task(Protocol):
    """A countable piece of work inside a stage (a bar on a terminal)."""

    def advance(self, amount: int = 1, *, item: str | None = None) -> None:
        """``amount`` more units done; ``item`` names what is being worked on now."""

    def update(self, completed: int, *, total: int | None = None, item: str | None = None) -> None:
        """Set the units done (and the total, when it becomes known)."""


@runtime_checkable
class Progress(Protocol):
    """What a long operation reports. Every method is cheap and never raises."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A named stage of the operation, for the ``with`` block."""

    def task(self, name: str, total: int | None = None, *, unit: str = "") -> contextlib.AbstractContextManager[Task]:
        """A task of the current stage with ``total`` units (None: unknown), for the ``with`` block."""

    def note(self, message: str) -> None:
        """One line for the person watching (not a log event)."""

    def log_sink(self, level: str, event: dict[str, Any]) -> None:
        """A structlog sink: warnings (info when verbose) as lines; errors are not shown."""

    def __enter__(self) -> "Progress": ...

    def __exit__(self, *exc: object) -> None: ...


# --------------------------------------------------------------------------------------------
# Numbers for people
# --------------------------------------------------------------------------------------------


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "exception": 40, "critical": 50}
_QUIET_KEYS = {"event", "level", "timestamp", "logger", "exc_info", "exception"}


def _event_line(level: str, event: dict[str, Any]) -> str:
    extra = " ".join(f"{k}={v}" for k, v in event.items() if k not in _QUIET_KEYS)
    prefix = "warning: " if _LEVELS.get(level, 20) >= 30 else ""
    return f"{prefix}{event.get('event', '')}" + (f" ({extra})" if extra else "")


class _Base:
    """Shared bookkeeping: the threshold of the log sink and the tasks of the current stage."""

    def __init__(self, *, verbose: int = 0) -> None:
        self.verbose = verbose
        self._threshold = 20 if verbose else 30

    def _wants(self, level: str) -> bool:
        lv = _LEVELS.get(level, 20)
        return self._threshold <= lv < 40

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


# --------------------------------------------------------------------------------------------
# Null
# --------------------------------------------------------------------------------------------


class _NullTask:
    def advance(self, amount: int = 1, *, item: str | None = None) -> None:
        pass

    def update(self, completed: int, *, total: int | None = None, item: str | None = None) -> None:
        pass


class NullProgress(_Base):
    """Shows nothing (``--quiet``; the library's default). Warnings still reach the sink's
    caller only if ``warnings`` is True."""

    def __init__(self, *, warnings: bool = False, stream: TextIO | None = None) -> None:
        super().__init__()
        self._warnings = warnings
        self._stream = stream

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def task(self, name: str, total: int | None = None, *, unit: str = "") -> Iterator[Task]:
        yield _NullTask()

    def note(self, message: str) -> None:
        pass

    def log_sink(self, level: str, event: dict[str, Any]) -> None:
        if self._warnings and _LEVELS.get(level, 20) == 30:
            print(_event_line(level, event), file=self._stream or sys.stderr, flush=True)


NULL = NullProgress()
"""The progress of code that was given none."""


# --------------------------------------------------------------------------------------------
# Plain lines
# --------------------------------------------------------------------------------------------


BYTES = "bytes"
"""The unit of a task that counts bytes read (shown as sizes with a rate)."""
PLAIN_EVERY_SECONDS = 30.0
"""How often :class:`PlainProgress` prints a running byte task's progress."""


def size_text(n: float) -> str:
    """Bytes for people, three significant digits: ``7.58 GB``, ``512 MB``, ``20.1 kB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{int(n)} B"


def _rate_text(bytes_per_second: float) -> str:
    """A rate to two significant digits: ``95 MB/s``, ``1.2 GB/s``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if bytes_per_second >= scale:
            value = bytes_per_second / scale
            return (f"{value:.2g}" if value < 100 else f"{value:.0f}") + f" {unit}/s"
    return f"{bytes_per_second:.0f} B/s"


class _CountingTask:
    def __init__(self, name: str, total: int | None, unit: str) -> None:
        self.name, self.total, self.unit = name, total, unit
        self.completed = 0
        self.started = time.perf_counter()
        # The first and the last advance, and what the first brought: a task may be made long
        # before its work starts (the bytes of the file read next), so rates are measured from
        # its first advance on.
        self._first: float | None = None
        self._first_amount = 0
        self._last = self.started

    def _moved(self, before: int) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first, self._first_amount = now, self.completed - before
        self._last = now

    def advance(self, amount: int = 1, *, item: str | None = None) -> None:
        self.completed += amount
        if amount:
            self._moved(self.completed - amount)

    def update(self, completed: int, *, total: int | None = None, item: str | None = None) -> None:
        before, self.completed = self.completed, completed
        if completed != before:
            self._moved(before)
        if total is not None:
            self.total = total

    def rate(self) -> float:
        """Units per second while the work went on (after its first advance, to its last)."""
        if self._first is None or self._last <= self._first:
            return 0.0
        return (self.completed - self._first_amount) / (self._last - self._first)

    def summary(self) -> str:
        if self.unit == BYTES:
            rate = self.rate()
            return f"{self.name} {size_text(self.completed)}" + (f" at {_rate_text(rate)}" if rate else "")
        unit = f" {self.unit}" if self.unit else ""
        if self.total is not None and self.completed != self.total:
            return f"{self.completed:,}/{self.total:,}{unit}"
        return f"{self.completed:,}{unit}"

    def running(self) -> str:
        """How far a byte task is, for a line while it runs (percent, rate, time left)."""
        rate = self.rate()
        if not self.total:
            return f"{self.name}: {size_text(self.completed)} read"
        share = min(1.0, self.completed / self.total)
        left = f", about {_seconds((self.total - self.completed) / rate)} left" if rate > 0 and share < 1 else ""
        return f"{self.name}: {share:.0%} read, {_rate_text(rate)}{left}"


class PlainProgress(_Base):
    """A few plain lines for logs and pipes: one per finished stage.

    Args:
        write: Where a line goes (default: ``stream``).
        stream: The stream written to when ``write`` is not given (default: stderr).
        prefix: Put before every line (e.g. ``phsafe: ``).
        verbose: Show info log events too.
    """

    def __init__(self, write: Callable[[str], None] | None = None, *, stream: TextIO | None = None,
                 prefix: str = "phsafe: ", verbose: int = 0) -> None:
        super().__init__(verbose=verbose)
        self._stream = stream
        self._write = write
        self.prefix = prefix
        self._tasks: list[_CountingTask] = []

    def _line(self, text: str) -> None:
        if self._write is not None:
            self._write(self.prefix + text)
        else:
            print(self.prefix + text, file=self._stream or sys.stderr, flush=True)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        outer, self._tasks = self._tasks, []
        start = time.perf_counter()
        try:
            yield
        finally:
            tasks, self._tasks = self._tasks, outer
        # A failed stage prints nothing: the command reports the failure in one line.
        done = [t.summary() for t in tasks]
        detail = f": {', '.join(done)}" if done else ""
        self._line(f"{name}{detail} -- done in {_seconds(time.perf_counter() - start)}")

    @contextlib.contextmanager
    def task(self, name: str, total: int | None = None, *, unit: str = "") -> Iterator[Task]:
        task = _PlainTask(self, name, total, unit or name) if unit == BYTES else _CountingTask(name, total, unit or name)
        self._tasks.append(task)
        yield task

    def note(self, message: str) -> None:
        self._line(message)

    def log_sink(self, level: str, event: dict[str, Any]) -> None:
        if self._wants(level):
            self._line(_event_line(level, event))


class _PlainTask(_CountingTask):
    """A byte task of :class:`PlainProgress`: a line every :data:`PLAIN_EVERY_SECONDS`."""

    def __init__(self, display: PlainProgress, name: str, total: int | None, unit: str) -> None:
        super().__init__(name, total, unit)
        self._display = display
        self._next = self.started + PLAIN_EVERY_SECONDS

    def _maybe_line(self) -> None:
        now = time.perf_counter()
        if now >= self._next and self.completed and (self.total is None or self.completed < self.total):
            self._next = now + PLAIN_EVERY_SECONDS
            self._display._line(self.running())

    def advance(self, amount: int = 1, *, item: str | None = None) -> None:
        super().advance(amount)
        self._maybe_line()

    def update(self, completed: int, *, total: int | None = None, item: str | None = None) -> None:
        super().update(completed, total=total)
        self._maybe_line()


# --------------------------------------------------------------------------------------------
# Rich (a terminal)
# --------------------------------------------------------------------------------------------


class _RichTask(_CountingTask):
    def __init__(self, bars: Any, task_id: Any, name: str, total: int | None, unit: str) -> None:
        super().__init__(name, total, unit)
        self._bars, self._id = bars, task_id

    def advance(self, amount: int = 1, *, item: str | None = None) -> None:
        super().advance(amount)
        self._bars.update(self._id, advance=amount, **({"item": item} if item is not None else {}))

    def update(self, completed: int, *, total: int | None = None, item: str | None = None) -> None:
        before, self.completed = self.completed, completed
        if completed != before:
            self._moved(before)
        fields: dict[str, Any] = {"completed": completed}
        if total is not None:
            self.total = total
            fields["total"] = total
        if item is not None:
            fields["item"] = item
        self._bars.update(self._id, **fields)


def _counted_only() -> Callable[..., Any]:
    """A wrapper of rich columns that shows them only on rows with a known total (tasks), not
    on stage rows (spinner, name and elapsed time only); ``bytes_column``, when given, is shown
    instead on the rows of byte tasks, and ``only_bytes`` shows the column on those rows only."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class CountedOnly(ProgressColumn):
        def __init__(self, column: ProgressColumn, bytes_column: ProgressColumn | None = None, *,
                     only_bytes: bool = False) -> None:
            super().__init__()
            self.column = column
            self.bytes_column = bytes_column
            self.only_bytes = only_bytes

        def render(self, task: Any) -> Any:
            if task.total is None:
                return Text("")
            is_bytes = task.fields.get("unit") == BYTES
            if self.only_bytes and not is_bytes:
                return Text("")
            if is_bytes and self.bytes_column is not None:
                return self.bytes_column.render(task)
            return self.column.render(task)

    return CountedOnly


class RichProgress(_Base):
    """A live display on a terminal (rich): finished stages as lines, the running one with a
    spinner, and a bar with count, current item, elapsed and remaining time per task.

    Args:
        console: The rich console (default: one on stderr).
        verbose: Show info log events too (as lines above the live area).
    """

    def __init__(self, console: Any | None = None, *, verbose: int = 0) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress as Bars,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        super().__init__(verbose=verbose)
        self.console = console or Console(stderr=True)
        counted = _counted_only()
        self._bars = Bars(
            SpinnerColumn(finished_text=" "),
            TextColumn("{task.description}"),
            counted(BarColumn(bar_width=30)),
            counted(MofNCompleteColumn(), DownloadColumn()),
            counted(TransferSpeedColumn(), only_bytes=True),
            TextColumn("[cyan]{task.fields[item]}"),
            TimeElapsedColumn(),
            counted(TextColumn("[dim]eta")),
            counted(TimeRemainingColumn()),
            console=self.console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._tasks: list[_RichTask] = []

    def __enter__(self) -> "RichProgress":
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        # A stage row: spinner, name and elapsed time; no bar (its tasks have theirs).
        row = self._bars.add_task(f"[bold]{name}", total=None, item="", unit="")
        outer, self._tasks = self._tasks, []
        start = time.perf_counter()
        try:
            yield
        finally:
            self._bars.remove_task(row)
            tasks, self._tasks = self._tasks, outer
        # A failed stage prints nothing: the command reports the failure in one line.
        done = [t.summary() for t in tasks]
        detail = f" [dim]({', '.join(done)})[/]" if done else ""
        self.console.print(f"[green]✓[/] {name}{detail} [dim]{_seconds(time.perf_counter() - start)}[/]",
                           highlight=False)

    @contextlib.contextmanager
    def task(self, name: str, total: int | None = None, *, unit: str = "") -> Iterator[Task]:
        task_id = self._bars.add_task(f"  {name}", total=total, item="", unit=unit)
        task = _RichTask(self._bars, task_id, name, total, unit or name)
        self._tasks.append(task)
        try:
            yield task
        finally:
            self._bars.remove_task(task_id)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False)

    def log_sink(self, level: str, event: dict[str, Any]) -> None:
        if self._wants(level):
            style = "yellow" if _LEVELS.get(level, 20) >= 30 else "dim"
            self.console.print(_event_line(level, event), style=style, highlight=False, markup=False)


# --------------------------------------------------------------------------------------------
# Choosing one
# --------------------------------------------------------------------------------------------


def for_stream(stream: TextIO | None = None, *, quiet: bool = False, verbose: int = 0) -> Progress:
    """The progress display for ``stream`` (default stderr): nothing if ``quiet`` (warnings
    still shown), rich bars on a terminal, plain lines otherwise."""
    stream = stream or sys.stderr
    if quiet:
        return NullProgress(warnings=True, stream=stream)
    if getattr(stream, "isatty", lambda: False)():
        from rich.console import Console

        return RichProgress(Console(file=stream), verbose=verbose)
    return PlainProgress(stream=stream, verbose=verbose)
