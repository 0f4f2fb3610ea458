"""Exact counting on a Dask cluster, through Prefect's Dask task runner (``prefect-dask``).

The per-partition counting -- reading a state's (or a MAFID range's) rows, truncate-join-count --
runs as Prefect tasks on Dask workers: a ``LocalCluster`` on this machine by default, or any
existing cluster by its scheduler address. Only the partition descriptions (paths, a state, a
MAFID range) go to the workers and only the exact count cubes (a few kilobytes a partition) come
back; they are added up on the flow's process. Validation, the plan, the ledger and every noise
draw stay on the flow's process: no worker ever sees the budget or draws noise.

The cubes are exact and confidential: run the cluster inside the same trust boundary as the
data (same enclave, TLS between scheduler and workers for a remote cluster), and never persist
the tasks' results (they are not).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from prefect.futures import wait

from phsafe.config import PHSafeConfig
from phsafe.counting import CountingPartition, combine_counts, count_partition, plan_partitions
from phsafe import engine
from phsafe.engine import ExactCounts, PrivateRun, StageTimer
from phsafe.tables import TABLES
from phsafe.tabulate import TableCounts


@task(name="count-partition", task_run_name="count-{partition.label}", cache_policy=NONE,
      persist_result=False, retries=0)
def count_partition_task(partition: CountingPartition, config: PHSafeConfig, key: bytes | None) -> dict[str, TableCounts]:
    """Exact count cubes of the nine measured tables on one partition (runs on a Dask worker)."""
    return count_partition(partition, config, list(TABLES.values()), key=key)


def count_on_dask(
    run: PrivateRun,
    config: PHSafeConfig,
    *,
    address: str | None = None,
    n_workers: int | None = None,
    max_persons: int | None = None,
) -> ExactCounts:
    """Plan the partitions here, count them on the cluster, add the cubes up here.

    Called inside a flow run (the dataset flow): its count tasks appear in that flow run, while
    the flow's own task runner (threads, for the noise tasks) is untouched. A task runner is
    entered here rather than a subflow started, so that nothing of the run -- the truncation key
    in particular -- becomes a flow-run parameter stored by the Prefect server.
    """
    partitions = plan_partitions(config, run.data_dir, max_persons=max_persons)
    with dask_task_runner(address, n_workers) as runner:
        futures = [
            runner.submit(count_partition_task,
                          parameters={"partition": p, "config": config, "key": run.truncation_key})
            for p in partitions
        ]
        wait(futures)
        return ExactCounts(combine_counts(f.result() for f in futures))


@task(name="validate-inputs", cache_policy=NONE, persist_result=False, retries=0)
def validate_inputs_task(run: PrivateRun):  # noqa: ANN201 -- the validation report
    """Great Expectations over config, persons, units and geo, on the flow's process (value-free report)."""
    return engine.check_inputs(run)


@dataclass(frozen=True)
class DaskCounter:
    """The sequence's counting stage on a Dask cluster (:class:`phsafe.sequence.Counter`).

    Validation reads the inputs on the flow's process first (as a task); if it passes, the
    partitions are counted on the cluster. It runs tasks of its own, so the runner calls it in
    the flow rather than as a task.
    """

    address: str | None = None
    n_workers: int | None = None
    max_persons: int | None = None
    orchestrates = True

    def __call__(self, run: PrivateRun, config: PHSafeConfig, timer: StageTimer | None) -> tuple[Any, Any]:
        report = validate_inputs_task(run) if run.options.validate_inputs else None
        if report is not None and not report.ok:
            return None, report
        return count_on_dask(run, config, address=self.address, n_workers=self.n_workers,
                             max_persons=self.max_persons), report


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
                                          "processes": True, "dashboard_address": None, "env": env})
