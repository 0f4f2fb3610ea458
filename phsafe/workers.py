"""Worker processes of the input pass on one machine, and the description of the work they do.

:class:`WorkerProcesses` runs the tasks of :mod:`phsafe.distributed` (``count_bucket``,
``count_state``) in a few Python processes, so that the pass (:class:`phsafe.counting.InputPass`)
counts a spilled partition's MAFID ranges, or the states of data stored by state, on every core.
:class:`ClusterPlan` says what a task does (paths, MAFID ranges, what to count; never data) --
the same description the Dask path's tasks get.

This module sits below both the counting and :mod:`phsafe.distributed`: the pass names its tasks
by their names and the processes run ``python -m phsafe.distributed``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phsafe.config import ConfigFile
from phsafe.reader import InputFile
from phsafe.spill import BucketPlan

__all__ = ["Block", "ClusterPlan", "WorkerProcesses"]


@dataclass(frozen=True)
class Block:
    """One task's share of one file: ``span`` bytes of a CSV file or row groups of a Parquet file."""

    stem: str
    index: int
    span: tuple[int, int]

    @property
    def label(self) -> str:
        return f"{self.stem}-{self.index + 1}"


@dataclass(frozen=True)
class ClusterPlan:
    """Everything a task needs: where the inputs and the spill folder are, the buckets, what to
    count (picklable; never data)."""

    config: "ConfigFile"
    """The run's one read of its config."""
    data_dir: Path
    files: Mapping[str, InputFile]
    states: tuple[str, ...] | None
    buckets: BucketPlan
    folder: Path
    blocks: tuple[Block, ...]
    validate: bool
    counting: Any
    """What to count: a :class:`phsafe.counting.Counting`, or None (validate only)."""
    file_names: Mapping[str, str] = field(default_factory=dict)
    state_filter: list | None = None
    """The config's state filter as validation reads it (a parameter of geo's rules)."""

    def blocks_of(self, stem: str) -> list[Block]:
        return [b for b in self.blocks if b.stem == stem]

    @property
    def aside_folder(self) -> Path:
        return self.folder / "aside"


class WorkerProcesses:
    """A few Python processes of this machine that run this module's tasks, so that a pass's MAFID
    ranges are counted on every core (the pass on one machine; the Dask path has its cluster).

    The processes are started with :mod:`subprocess` (``python -m phsafe.distributed``), not
    :mod:`multiprocessing`, for the reason of :mod:`phsafe.validation._worker`: a spawned child
    re-imports the caller's ``__main__``. Jobs go as pickles on their standard input and results
    come back on their standard output; an exception comes back as its class name only (its
    message may quote data). Nothing else is printed.

    Args:
        processes: How many.
        validation: The jobs validate: each process imports Great Expectations at once, while
            the pass still streams its files.
    """

    def __init__(self, processes: int, *, validation: bool = False) -> None:
        import os
        import queue
        import subprocess
        import sys
        import threading

        self._jobs: "queue.Queue[tuple[int, str, tuple] | None]" = queue.Queue()
        self._results: dict[int, object] = {}
        self._done = threading.Condition()
        self._failed: str | None = None
        env = {**os.environ, "GX_ANALYTICS_ENABLED": "False"}
        self._procs = [subprocess.Popen([sys.executable, "-m", "phsafe.distributed"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
                       for _ in range(processes)]
        self._threads = [threading.Thread(target=self._serve, args=(p,), name="phsafe-worker", daemon=True)
                         for p in self._procs]
        for t in self._threads:
            t.start()
        self._number = 0
        if validation:
            for _ in self._procs:  # one each (a process takes one job at a time; results unread)
                self._number += 1
                self._jobs.put((self._number, "prewarm", ()))

    def _serve(self, proc) -> None:  # noqa: ANN001 -- a subprocess.Popen
        import pickle

        while (job := self._jobs.get()) is not None:
            number = job[0]
            try:
                pickle.dump(job, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.flush()
                answer, error = pickle.load(proc.stdout)
            except (OSError, EOFError, ValueError, pickle.PickleError):
                answer, error = None, "the worker process stopped"
            with self._done:
                self._results[number] = (answer, error)
                self._done.notify_all()
        try:
            proc.stdin.close()
        except OSError:
            pass

    def map(self, name: str, calls: Sequence[tuple], *, costs: Sequence[int] | None = None,
            budget: int | None = None) -> "Iterator[object]":
        """Run ``name(*args)`` for each ``args`` of ``calls`` on the processes; the results in
        order, each as soon as it (and those before it) is done.

        Args:
            costs, budget: A job starts only while the costs (bytes of memory) of the jobs
                started and not yet answered, with its own, stay within ``budget`` -- one job
                always may.

        Raises:
            PHSafeError: A job failed in its process (its exception's class is named).
        """
        from collections import deque

        from phsafe.errors import PHSafeError

        costs = list(costs) if costs is not None else [0] * len(calls)
        waiting = deque(zip(calls, costs))
        started: deque[tuple[int, int]] = deque()
        in_flight = 0
        while waiting or started:
            while waiting and (not started or budget is None or in_flight + waiting[0][1] <= budget):
                args, cost = waiting.popleft()
                self._number += 1
                started.append((self._number, cost))
                in_flight += cost
                self._jobs.put((self._number, name, tuple(args)))
            number, cost = started.popleft()
            with self._done:
                self._done.wait_for(lambda: number in self._results)
                answer, error = self._results.pop(number)  # type: ignore[misc]
            in_flight -= cost
            if error is not None:
                raise PHSafeError(f"a worker process of the input pass failed ({error}); nothing was spent")
            yield answer

    def close(self) -> None:
        """Stop the processes (jobs not started yet are dropped)."""
        import queue

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
