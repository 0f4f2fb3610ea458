"""Where Great Expectations runs: a thread of this process, or a second process.

Reading, joining and counting the inputs is numpy and pyarrow work; Great Expectations is Python
that takes seconds to import. On a machine with two cores, validating a large input imports and
runs Great Expectations in a second process (``python -m phsafe.validation._worker``) while this
one reads: the evaluation jobs -- small frames of distinct combinations, never a file's rows --
are sent to it as they become ready, and come back as value-free counts.

The second process is this one forked (:func:`os.fork`) when nothing but the main thread (and
idle threads known to hold no lock, :data:`IDLE_THREADS`) runs: the copy has numpy, pandas,
pyarrow and the suites' code imported already, and imports only Great Expectations -- a fresh
interpreter would spend about 0.7 CPU-s more on its imports, a third of the run's fixed cost at 1M
persons. Otherwise (a thread could hold a lock the copy would need: Prefect's, a test runner's) it
is ``python -m phsafe.validation._worker``, started with :mod:`subprocess` rather than
:mod:`multiprocessing`: a spawned multiprocessing child re-imports the caller's ``__main__``,
which runs the top level of any script that validates without a ``__main__`` guard. Jobs arrive
as pickles on a pipe (its standard input); results (value-free
:class:`~phsafe.validation._gx.RuleResult` lists, or the class name of an exception) leave as
pickles on another (its standard output). Nothing else is printed. The forked copy runs no code
of the caller after the fork but :func:`_serve`, and leaves by :func:`os._exit` (no exit handler
of the caller runs in it).

If the second process fails, its unanswered jobs are evaluated here instead (the report is the
same: evaluation is deterministic). The report's files are written there too (:class:`ReportJob`):
their Data Docs pages are rendered by Great Expectations, which this process need not import.
"""

from __future__ import annotations

import gc
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol

SECOND_PROCESS_MIN_ROWS = 300_000
"""Inputs of at least this many rows (estimated) are validated with Great Expectations in a second
process, when the machine has a second core and Great Expectations is not imported here yet."""


@dataclass(frozen=True)
class ReportJob:
    """Write a validation report's files (:func:`~phsafe.validation._report.write_report`) where
    Great Expectations is already imported: its Data Docs pages are rendered by it."""

    report: Any
    directory: Path


def _run(job: Any) -> Any:
    if isinstance(job, ReportJob):
        from phsafe.validation._report import write_report

        write_report(job.report, job.directory)
        return None
    from phsafe.validation import _gx

    return _gx.evaluate(job)


class Evaluator(Protocol):
    """Runs :class:`~phsafe.validation._gx.Job` s (and :class:`ReportJob` s); results come back
    as futures."""

    def submit(self, job: Any) -> "Future[Any]": ...

    def close(self) -> None: ...


class InProcess:
    """Great Expectations on one background thread of this process (imported at once)."""

    def __init__(self) -> None:
        from phsafe.validation import _gx

        self._gx = _gx
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="phsafe-gx")
        self._pool.submit(_gx.import_gx)  # the import overlaps the reading

    def submit(self, job: Any) -> "Future[Any]":
        return self._pool.submit(_run, job)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


IDLE_THREADS = ("phsafe-stop-notice",)
"""Threads that may run beside the main one when the second process is forked: each waits on an
event and holds no lock the forked copy uses (:mod:`phsafe.interrupt`'s notifier)."""

_forked_pipes: set[int] = set()  # this process's ends of its forked copies' pipes


def can_fork() -> bool:
    """Whether the second process may be this one forked (see the module docstring)."""
    if not hasattr(os, "fork") or threading.current_thread() is not threading.main_thread():
        return False
    return all(t is threading.main_thread() or (t.daemon and t.name in IDLE_THREADS)
               for t in threading.enumerate())


class _Forked:
    """The forked copy, with the part of :class:`subprocess.Popen` :class:`SecondProcess` uses."""

    def __init__(self, environment: dict[str, str]) -> None:
        jobs_read, jobs_write = os.pipe()
        results_read, results_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        # The objects of both processes stay shared pages until written: no collection of either
        # walks the objects made before the fork (a walk writes to each object's header, which
        # copies every page of the heap) until the copy is gone (close()).
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the copy: never returns
            _forked_child(jobs_read, results_write, [jobs_write, results_read, *_forked_pipes], environment)
        os.close(jobs_read)
        os.close(results_write)
        self.pid = pid
        self.returncode: int | None = None
        self.stdin: IO[bytes] = os.fdopen(jobs_write, "wb")
        self.stdout: IO[bytes] = os.fdopen(results_read, "rb")
        self._ends = (jobs_write, results_read)
        _forked_pipes.update(self._ends)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                _forked_pipes.difference_update(self._ends)
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("second process", timeout or 0)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _forked_child(jobs: int, results: int, close: list[int], environment: dict[str, str]) -> NoReturn:
    """The forked copy: serve jobs until the pipe ends, then leave without the caller's exit
    handlers (its buffers, temporary folders and ledger are the caller's)."""
    code = 1
    try:
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        # Stopped by the caller (its end of the jobs closed), never by the terminal's Ctrl-C;
        # the caller's signal handlers are not this copy's.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 -- for the life of the copy
        os.environ.update(environment)
        code = _serve(os.fdopen(jobs, "rb"), os.fdopen(results, "wb"))
    finally:
        os._exit(code)


class SecondProcess:
    """Great Expectations in a second Python process (see the module docstring)."""

    def __init__(self) -> None:
        from phsafe.validation._suites import SUITES_ENV, suites_dir

        extra = {SUITES_ENV: str(suites_dir()), "GX_ANALYTICS_ENABLED": "False"}
        self.process: Any
        if can_fork():
            self.process = _Forked(extra)
        else:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "phsafe.validation._worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, **extra},
            )
        self._futures: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()
        self._outbox: queue.Queue[tuple[int, Any] | None] = queue.Queue()
        self._number = 0
        self._dead = False
        self._sender = threading.Thread(target=self._send, name="phsafe-gx-send", daemon=True)
        self._receiver = threading.Thread(target=self._receive, name="phsafe-gx-receive", daemon=True)
        self._sender.start()
        self._receiver.start()

    def submit(self, job: Any) -> "Future[Any]":
        future: Future[Any] = Future()
        with self._lock:
            if self._dead:
                future.set_exception(RuntimeError("validation worker stopped"))
                return future
            self._number += 1
            self._futures[self._number] = future
            self._outbox.put((self._number, job))
        return future

    def _send(self) -> None:
        assert self.process.stdin is not None
        try:
            while (item := self._outbox.get()) is not None:
                pickle.dump(item, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                self.process.stdin.flush()
        except (OSError, ValueError, pickle.PicklingError):
            self._stop()
        finally:
            try:
                self.process.stdin.close()
            except OSError:
                pass

    def _receive(self) -> None:
        assert self.process.stdout is not None
        try:
            while True:
                number, result, error = pickle.load(self.process.stdout)
                with self._lock:
                    future = self._futures.pop(number)
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(RuntimeError(f"validation worker failed ({error})"))
        except (EOFError, OSError, pickle.UnpicklingError, ValueError):
            self._stop()

    def _stop(self) -> None:
        with self._lock:
            self._dead = True
            pending = list(self._futures.values())
            self._futures.clear()
        for future in pending:
            if not future.done():
                future.set_exception(RuntimeError("validation worker stopped"))

    def close(self) -> None:
        """Stop the second process (its jobs are answered: nothing is lost by not waiting for
        its interpreter to tear Great Expectations down)."""
        self._outbox.put(None)
        self._sender.join(timeout=60)
        try:
            self.process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._receiver.join(timeout=5)
        if isinstance(self.process, _Forked):
            self.process.stdout.close()
            gc.unfreeze()
        self._stop()


def evaluator(rows: int) -> Evaluator:
    """Where to evaluate the suites of an input of about ``rows`` rows (see the module docstring)."""
    if (rows >= SECOND_PROCESS_MIN_ROWS and (os.cpu_count() or 1) >= 2
            and "great_expectations" not in sys.modules):
        try:
            return SecondProcess()
        except (OSError, ValueError):
            pass
    return InProcess()


def main() -> int:
    """The second process started as ``python -m``: evaluate jobs until standard input ends."""
    channel = os.fdopen(os.dup(1), "wb")  # results only; anything else printed goes nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- for the life of the process
    # This file runs as __main__; the jobs' classes are those of the package's module.
    from phsafe.validation._worker import _serve

    return _serve(sys.stdin.buffer, channel)


def _serve(jobs: IO[bytes], channel: IO[bytes]) -> int:
    """Evaluate the jobs of ``jobs`` until it ends, each answer pickled to ``channel``."""
    from phsafe.validation import _gx

    _gx.trim_imports()
    # Great Expectations' import makes hundreds of thousands of objects that live as long as the
    # process: no collection while importing, and none that walks them afterwards (frozen). Its
    # evaluations then collect only what they make (a third less CPU for the ~30 of a run).
    gc.disable()
    try:
        _gx.import_gx()
    finally:
        gc.freeze()
        gc.enable()
    run = _run
    while True:
        try:
            number, job = pickle.load(jobs)
        except EOFError:
            return 0
        try:
            answer = (number, run(job), None)
        except Exception as exc:  # noqa: BLE001 -- its class only: the message may quote data
            answer = (number, None, type(exc).__name__)
        pickle.dump(answer, channel, protocol=pickle.HIGHEST_PROTOCOL)
        channel.flush()


if __name__ == "__main__":
    sys.exit(main())
