"""Where Great Expectations runs: a thread of this process, or a second process.

Reading, joining and counting the inputs is numpy and pyarrow work; Great Expectations is Python
that takes seconds to import. On a machine with two cores, validating a large input imports and
runs Great Expectations in a second process (``python -m phsafe.validation._worker``) while this
one reads: the evaluation jobs -- small frames of distinct combinations, never a file's rows --
are sent to it as they become ready, and come back as value-free counts.

The second process is started with :mod:`subprocess` rather than :mod:`multiprocessing`: a
spawned multiprocessing child re-imports the caller's ``__main__``, which runs the top level of
any script that validates without a ``__main__`` guard. Jobs arrive as pickles on its standard
input; results (value-free :class:`~phsafe.validation._gx.RuleResult` lists, or the class name of
an exception) leave as pickles on its standard output. Nothing else is printed.

If the second process fails, its unanswered jobs are evaluated here instead (the report is the
same: evaluation is deterministic). The report's files are written there too (:class:`ReportJob`):
their Data Docs pages are rendered by Great Expectations, which this process need not import.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


class SecondProcess:
    """Great Expectations in a second Python process (see the module docstring)."""

    def __init__(self) -> None:
        from phsafe.validation._suites import SUITES_ENV, suites_dir

        env = {**os.environ, SUITES_ENV: str(suites_dir()), "GX_ANALYTICS_ENABLED": "False"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "phsafe.validation._worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
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
    """The second process: evaluate jobs until standard input ends."""
    channel = os.fdopen(os.dup(1), "wb")  # results only; anything else printed goes nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- for the life of the process
    from phsafe.validation import _gx
    # This file runs as __main__; the jobs' classes are those of the package's module.
    from phsafe.validation._worker import _run as run

    _gx.trim_imports()
    _gx.import_gx()
    jobs = sys.stdin.buffer
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
