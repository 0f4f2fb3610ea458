"""The input pass on a Dask cluster, through Prefect's Dask task runner (``prefect-dask``).

A ``LocalCluster`` of worker processes on this machine by default, or any existing cluster by its
scheduler address. The pass's tasks and their order are the library's
(:func:`phsafe.intake.run_cluster_pass`); this module only gives it Prefect's ``submit``, so that
each task is a Prefect task run on the cluster, named for the operator:

* **national files** (one persons, units and geo file, CSV or Parquet): read *once*, in blocks --
  ``read-<file>-<n>`` tasks parse, check, validate and spill each block to MAFID ranges in the
  run's confidential work folder (geo first: its blocks say which MAFIDs the state filter sets
  aside; ``settle-state-filter-<n>`` tasks finish that), then ``count-range-<n>`` tasks join,
  validate and count each range. The work folder must be reachable by every worker at the same
  path (a shared file system for a cluster of several machines); the spill folder is removed when
  the pass ends, whatever happens.
* **data stored by state**: read *once* too -- a ``count-<state>`` task reads, validates and
  counts each state's folders, and ``layout-<state>`` tasks read the MAFIDs of the folders
  outside the state filter for the layout check.

Only descriptions (paths, byte ranges, MAFID ranges; never data) go to the workers; what comes back
is value-free -- rule tallies, reading problems as file, column and rule -- but for the exact
count cubes (a few kilobytes a piece), added up on the flow's process. The plan, the ledger and
every noise draw stay on the flow's process: no worker ever sees the budget or draws noise.

The cubes are exact and confidential: run the cluster inside the same trust boundary as the
data (same enclave, TLS between scheduler and workers for a remote cluster), and never persist
the tasks' results (they are not).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from phsafe import engine
from phsafe.config import PHSafeConfig
from phsafe.engine import ExactCounts, PrivateRun, StageTimer
from phsafe.intake import SPILL_FOLDER, Piece, PieceCall, SpillArea, plan_cluster, run_cluster_pass
from phsafe.tables import TABLES


@task(name="input-pass-piece", task_run_name="{call.name}", cache_policy=NONE, persist_result=False, retries=0)
def piece_task(call: PieceCall) -> Piece:
    """One task of the input pass (runs on a Dask worker): a block read, a MAFID range or a
    state counted (see :func:`phsafe.intake.run_cluster_pass`)."""
    return call()


def validate_and_count_on_dask(
    run: PrivateRun,
    config: PHSafeConfig,
    *,
    address: str | None = None,
    n_workers: int | None = None,
    max_persons: int | None = None,
    block_bytes: int | None = None,
    runner: Any = None,
) -> tuple[ExactCounts | None, Any]:
    """Validate (unless the run skips it) and count on the cluster, reading each input once;
    ``(counts, report)`` as the local ``validate-and-count`` task returns them (counts None when
    validation failed).

    Args:
        max_persons: Persons of a MAFID range of national files (default:
            :data:`phsafe.memory.MAX_BUCKET_PERSONS`).
        block_bytes: CSV bytes of a block (default: :data:`phsafe.intake.cluster.BLOCK_BYTES`).
        runner: A Dask task runner already entered (default: :func:`dask_task_runner` of
            ``address`` and ``n_workers``, for this call).
    """
    from phsafe.intake.cluster import BLOCK_BYTES

    spill = SpillArea(run.run_dir / SPILL_FOLDER)  # empties what a killed attempt left
    try:
        plan = plan_cluster(run.config_file, run.data_dir, spill.path, specs=list(TABLES.values()),
                            key=run.truncation_key, validate=run.parameters.validate_inputs,
                            block_bytes=block_bytes or BLOCK_BYTES, bucket_persons=max_persons)
        if plan is None:  # inputs the cluster cannot cut (e.g. one missing): the pass here says why
            counts, report = engine.validate_and_count(run)
            return counts, report
        with contextlib.nullcontext(runner) if runner is not None else dask_task_runner(address, n_workers) as used:
            counts, report = run_cluster_pass(
                plan, lambda call: used.submit(piece_task, parameters={"call": call}), report_dir=run.report_dir)
        return (ExactCounts(counts) if counts is not None else None), report
    finally:
        spill.close()


@dataclass(frozen=True)
class DaskCounter:
    """The sequence's counting stage on a Dask cluster (:class:`phsafe.sequence.Counter`):
    :func:`validate_and_count_on_dask` -- each input read once on the cluster, validation and
    counting from the same read. It runs tasks of its own, so the runner calls it in the flow
    rather than as a task.
    """

    address: str | None = None
    n_workers: int | None = None
    max_persons: int | None = None
    orchestrates = True

    def __call__(self, run: PrivateRun, config: PHSafeConfig, timer: StageTimer | None) -> tuple[Any, Any]:
        return validate_and_count_on_dask(run, config, address=self.address, n_workers=self.n_workers,
                                          max_persons=self.max_persons)


def _api_url() -> str | None:
    """The API this flow run talks to (in ephemeral mode, the temporary server's address)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.api_url).rstrip("/") or None


def dask_task_runner(address: str | None, n_workers: int | None = None) -> Any:
    """The Dask task runner: the cluster at ``address``, or a new ``LocalCluster``.

    Workers of a local cluster report their task runs to this flow's Prefect API (even in
    ephemeral mode, where they would otherwise each start a server of their own). Workers of an
    existing cluster must be configured with ``PREFECT_API_URL`` by whoever runs them.
    """
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    env = {k: v for k, v in os.environ.items() if k.startswith("PREFECT_") or k == "DO_NOT_TRACK"}
    api = _api_url()
    if api:
        env["PREFECT_API_URL"] = api
    return DaskTaskRunner(cluster_kwargs={"n_workers": n_workers or 2, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None, "env": env,
                                          # No dashboard, and the scheduler's HTTP routes (health,
                                          # metrics) on a free loopback port: with no address they
                                          # take 8787, and a second cluster on the host warned.
                                          "scheduler_kwargs": {"dashboard": False,
                                                               "dashboard_address": "127.0.0.1:0"}})
