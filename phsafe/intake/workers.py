"""Worker processes of the input pass on one machine.

:class:`WorkerProcesses` runs pieces of the pass (:func:`phsafe.intake.cluster.count_bucket`,
:func:`phsafe.intake.cluster.count_state`) in a few Python processes, so that the pass
(:class:`phsafe.intake.input_pass.InputPass`) counts a spilled partition's MAFID ranges, or the
states of data stored by state, on every core. A job is a function and its arguments, pickled
(the function by reference: a job names no module in a string); its answer is a
:class:`~phsafe.intake.pieces.Piece`, which the pass merges (:func:`phsafe.intake.pieces.merge`).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from phsafe.errors import PHSafeError

__all__ = ["WorkerProcesses", "next_job", "release_memory", "serve"]

Job = tuple[int, Callable[..., Any], tuple[Any, ...]]


def serve() -> int:
    """A worker process: run jobs (pickled ``(number, function, arguments)``) from standard input
    until it ends; answer each with ``(result, None)`` or ``(None, the exception's class name)``
    -- never its message, which may quote data. Nothing else is printed."""
    from phsafe.validation import trim_imports

    channel = os.fdopen(os.dup(1), "wb")  # results only; anything else printed goes nowhere
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- for the life of the process
    trim_imports()  # a process of the pass only: Great Expectations' import a third cheaper
    jobs = sys.stdin.buffer
    while True:
        try:
            _, fn, args = pickle.load(jobs)
        except EOFError:
            return 0
        answer: tuple[Any, str | None]
        try:
            answer = (fn(*args), None)
        except Exception as exc:  # noqa: BLE001 -- its class only: the message may quote data
            answer = (None, type(exc).__name__)
        pickle.dump(answer, channel, protocol=pickle.HIGHEST_PROTOCOL)
        channel.flush()
        del answer
        release_memory()


def release_memory() -> None:
    """What the pass freed goes back to the system: between a worker's jobs -- a process waiting for
    its next job (while the other counts California) must not hold the last state's batches in
    pyarrow's allocator, hundreds of MiB of the process tree's memory -- and after a partition is
    streamed."""
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None:
        pyarrow.default_memory_pool().release_unused()
    if sys.platform.startswith("linux"):  # and what the C heap keeps of numpy's freed arrays
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def next_job(pending: Sequence[int], running: Sequence[int], passed: Sequence[int], budget: int | None, *,
             smaller_may_pass: bool = False) -> int | None:
    """Which pending job starts on a free process (its position in ``pending``), or None: wait.

    Args:
        pending: The costs of the jobs not started, in the calls' order.
        running: The costs of the jobs running.
        passed: The costs of the running jobs that started before an earlier call (passers).
        budget: What the running jobs may cost together (None: no limit).
        smaller_may_pass: When the first pending job does not fit, the first later one that fits
            starts instead -- if the first still fits beside it and the other passers (so it starts
            as soon as the jobs it waits for end, never after passers that keep coming).
    """
    if not pending:
        return None
    in_flight = sum(running)
    if budget is None or not running or in_flight + pending[0] <= budget:
        return 0
    if smaller_may_pass:
        beside_passers = sum(passed) + pending[0]
        for position in range(1, len(pending)):
            cost = pending[position]
            if in_flight + cost <= budget and beside_passers + cost <= budget:
                return position
    return None


def _command(entry: Callable[[], int]) -> list[str]:
    """The command line of a process that runs ``entry`` (a module-level function, imported by
    its module's name and its own)."""
    return [sys.executable, "-c", f"import sys; from {entry.__module__} import {entry.__name__}; sys.exit({entry.__name__}())"]


class WorkerProcesses:
    """A few Python processes of this machine that run this module's tasks, so that a pass's MAFID
    ranges are counted on every core (the pass on one machine; the Dask path has its cluster).

    The processes are started with :mod:`subprocess` (each runs :func:`serve`), not
    :mod:`multiprocessing`: a spawned multiprocessing child re-imports the caller's ``__main__``,
    which runs the top level of any script that calls the pass without a ``__main__`` guard. Jobs
    go as pickles on their standard input and results come back on their standard output; an
    exception comes back as its class name only (its message may quote data).

    Args:
        processes: How many.
        validation: The jobs validate: each process imports Great Expectations at once, while
            the pass still streams its files.
    """

    def __init__(self, processes: int, *, validation: bool = False) -> None:
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._results: dict[int, tuple[Any, str | None]] = {}
        self._done = threading.Condition()
        self._failed: str | None = None
        env = {**os.environ, "GX_ANALYTICS_ENABLED": "False"}
        self._procs = [subprocess.Popen(_command(serve), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
                       for _ in range(processes)]
        self._threads = [threading.Thread(target=self._serve, args=(p,), name="phsafe-worker", daemon=True)
                         for p in self._procs]
        for t in self._threads:
            t.start()
        self._number = 0
        if validation:
            from phsafe.validation import prewarm

            for _ in self._procs:  # one each (a process takes one job at a time; results unread)
                self._number += 1
                self._jobs.put((self._number, prewarm, ()))

    def _serve(self, proc: "subprocess.Popen[bytes]") -> None:
        stdin: IO[bytes] | None = proc.stdin
        stdout: IO[bytes] | None = proc.stdout
        assert stdin is not None and stdout is not None
        while (job := self._jobs.get()) is not None:
            number = job[0]
            try:
                pickle.dump(job, stdin, protocol=pickle.HIGHEST_PROTOCOL)
                stdin.flush()
                answer, error = pickle.load(stdout)
            except (OSError, EOFError, ValueError, pickle.PickleError):
                answer, error = None, "the worker process stopped"
            with self._done:
                self._results[number] = (answer, error)
                self._done.notify_all()
        try:
            stdin.close()
        except OSError:
            pass

    def map(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *, costs: Sequence[int] | None = None,
            budget: int | None = None, smaller_may_pass: bool = False) -> Iterator[Any]:
        """Run ``fn(*args)`` (a module-level function) for each ``args`` of ``calls`` on the
        processes; the results in order, each as soon as it (and those before it) is done.

        Jobs start in the calls' order, each when a process is free -- with ``budget``, only while
        the costs (bytes of memory) of the jobs running, with its own, stay within it (a job always
        may when none runs); which job starts next is :func:`next_job`'s choice. A job that does
        not fit waits for running ones to end. Without ``smaller_may_pass``, later ones do not pass
        it (an answer that comes early is held here until those before it are done: passing jobs
        would hold theirs). With it, a later job that fits may start first if the waiting job
        will still fit beside it -- give the calls largest first, so that what passes is small and
        ends soon, and a free process need not stay idle beside a large job.

        Raises:
            PHSafeError: A job failed in its process (its exception's class is named).
        """
        costs = list(costs) if costs is not None else [0] * len(calls)
        pending = list(range(len(calls)))
        running: dict[int, int] = {}  # job number -> call index
        passed: set[int] = set()  # job numbers that started before an earlier call
        done: dict[int, Any] = {}
        next_out = 0
        while next_out < len(calls):
            while pending and len(running) < len(self._procs):
                pick = next_job([costs[i] for i in pending], [costs[i] for i in running.values()],
                                [costs[running[n]] for n in passed], budget, smaller_may_pass=smaller_may_pass)
                if pick is None:
                    break
                index = pending.pop(pick)
                self._number += 1
                running[self._number] = index
                if pick:
                    passed.add(self._number)
                self._jobs.put((self._number, fn, tuple(calls[index])))
            with self._done:
                self._done.wait_for(lambda: any(n in self._results for n in running))
                number = next(n for n in running if n in self._results)
                answer, error = self._results.pop(number)
            index = running.pop(number)
            passed.discard(number)
            if error is not None:
                raise PHSafeError(f"a worker process of the input pass failed ({error}); nothing was spent")
            done[index] = answer
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1

    def close(self) -> None:
        """Stop the processes (jobs not started yet are dropped)."""
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=30)
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except Exception:  # noqa: BLE001 -- a stuck process is killed
                p.kill()
                p.wait()

    def __enter__(self) -> "WorkerProcesses":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
