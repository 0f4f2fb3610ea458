"""The release sequence's stages as Prefect tasks: :class:`PrefectStages` runs
:func:`phsafe.sequence.run_release` in a flow.

The sequence decides the order, the failure handling and which run a retry continues; this
runner only makes each stage a task named after it (``preflight``, ``validate-and-count``,
``measure-PH1_num`` … ``measure-PH8_denom``, ``publish``), so the flow run page shows the stages
as task runs. What crosses a task boundary is small: paths, digests, the plan, summaries -- and
the exact counts, an in-memory :class:`phsafe.engine.ExactCounts` handed from the counting task to
the measurement tasks in the same process; it cannot be serialized.

The project's privacy rules for tasks (a release's noise is drawn once, and exact counts are
never written anywhere):

* No task caches or persists its result (``cache_policy=NONE``, ``persist_result=False``): a
  cached result could replay a noisy release, or write exact counts to result storage.
* A stage that draws noise or writes the ledger is never retried by Prefect (the stage says
  whether it may be, :attr:`phsafe.sequence.Stage.retriable`): a retried draw would be a new
  spend. A retry of the *flow run* resumes the run instead (see ``flows/sdhc.py``).
* Retries with exponential backoff only on pure reads and idempotent writes (digesting the
  inputs, writing the tables from stored vectors).
* The measurements of the nine tables run as concurrent tasks: each records its spend in the
  ledger before it draws, under the ledger's lock.
* An unforeseen error inside a stage reaches Prefect (the task run's log and state message, in
  the Prefect database) as :class:`UnexpectedError`: its type only -- its message may quote a
  value of the confidential data. The error itself is raised again in the flow.
* A stop request (SIGTERM or SIGINT to the flow run's process, :mod:`phsafe.interrupt`) ends a
  stage at its next safe point with :class:`phsafe.interrupt.RunInterrupted`, a
  ``KeyboardInterrupt`` that Prefect would record as a *crash* of the task. Inside a task it
  travels as :class:`StoppedBySignal` (an ordinary failure: the task run ends Failed with one
  line) and is raised again as ``RunInterrupted`` in the flow, where the sequence records the
  stopped run in the ledger.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence, TypeVar

from prefect import Task, task
from prefect.cache_policies import NONE
from prefect.futures import wait
from prefect.tasks import exponential_backoff

from phsafe.errors import PHSafeError
from phsafe.interrupt import RunInterrupted
from phsafe.sequence import Stage

T = TypeVar("T")

# Every task: no cache, no persisted result.
_NOTHING_KEPT: dict[str, Any] = {"cache_policy": NONE, "persist_result": False}
# Pure I/O: a few retries with backoff (1 s, 2 s, 4 s, with jitter).
_IO_RETRIES: dict[str, Any] = {"retries": 3, "retry_delay_seconds": exponential_backoff(backoff_factor=1),
                               "retry_jitter_factor": 0.5}
# Spends budget or writes the ledger: exactly once per call.
_NO_RETRIES: dict[str, Any] = {"retries": 0}


class UnexpectedError(Exception):
    """An unforeseen error inside a stage, as Prefect sees it (the task run's log and state): its
    type, never its message, which may quote a value of the confidential data. The error itself
    travels with it, in memory, and is raised again in the flow, where the sequence handles it
    and the confidential log file gets its frames."""

    def __init__(self, original: Exception) -> None:
        super().__init__(f"internal error: {type(original).__name__} (its frames are in the run's log file)")
        self.original = original


class StoppedBySignal(PHSafeError):
    """A stop request inside a task (see the module docstring): an ordinary exception, so that
    the task run ends Failed, not Crashed."""

    def __init__(self, message: str, could_spend: bool) -> None:
        super().__init__(message)
        self.could_spend = could_spend


def _stops_as_failures(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except RunInterrupted as stop:
            raise StoppedBySignal(str(stop), stop.could_spend) from None
        except PHSafeError:
            raise  # our own refusals and failures: value-free by construction
        except Exception as exc:  # noqa: BLE001 -- Prefect gets the type only; the flow gets the error
            raise UnexpectedError(exc) from None

    return body


def _original(failure: Exception) -> BaseException:
    """What a stage task's failure is for the sequence: the stop, or the error itself."""
    if isinstance(failure, StoppedBySignal):
        return RunInterrupted(str(failure), could_spend=failure.could_spend)
    if isinstance(failure, UnexpectedError):
        return failure.original
    return failure


class PrefectStages:
    """A :class:`phsafe.sequence.StageRunner`: each stage a Prefect task of the running flow."""

    timer = None  # the flow run page shows the stages; nested stages are logged

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, Callable[..., Any]], Task[..., Any]] = {}
        self._lock = threading.Lock()

    def task_for(self, stage: Stage, fn: Callable[..., T]) -> Task[..., T]:
        """The task that runs ``fn`` as ``stage`` (made once per stage and function)."""
        with self._lock:
            made = self._tasks.get((stage.name, fn))
            if made is None:
                doc = (fn.__doc__ or "").strip().splitlines()
                made = task(_stops_as_failures(fn), name=stage.name, task_run_name=stage.run_name,
                            description=doc[0] if doc else None,
                            **_NOTHING_KEPT, **(_IO_RETRIES if stage.retriable else _NO_RETRIES))
                self._tasks[(stage.name, fn)] = made
            return made

    def run(self, stage: Stage, fn: Callable[..., T], *args: Any, inline: bool = False) -> T:
        if inline:  # it runs tasks of its own (counting on a Dask cluster)
            return fn(*args)
        try:
            return self.task_for(stage, fn)(*args)
        except (StoppedBySignal, UnexpectedError) as failure:
            raise _original(failure) from None

    def map(self, stage: Stage, fn: Callable[..., T], items: Sequence[str], *args: Any, total: int) -> list[T]:
        work = self.task_for(stage, fn)
        futures = [work.submit(item, *args) for item in items]
        wait(futures)  # every measurement in flight ends (committed) before a stop is acted on
        try:
            return [future.result() for future in futures]  # raises the first failure, once all ended
        except (StoppedBySignal, UnexpectedError) as failure:
            raise _original(failure) from None
