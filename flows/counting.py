"""The input pass on a Dask cluster, through Prefect's Dask task runner (``prefect-dask``).

A ``LocalCluster`` of worker processes on this machine by default, or any existing cluster by its
scheduler address. Two shapes of input:

* **national files** (one persons, units and geo file, CSV or Parquet): read *once*, in blocks,
  on the cluster (:mod:`phsafe.distributed`) -- every block parsed, checked, validated by the
  per-file rules and spilled to MAFID ranges in the run's confidential work folder by a
  ``read-<file>-<n>`` task (geo first: its blocks say which MAFIDs the state filter sets aside;
  ``settle-state-filter-<n>`` tasks finish that), then every range joined, validated by the
  cross-file rules and counted by a ``count-range-<n>`` task. The work folder must be reachable
  by every worker at the same path (a shared file system for a cluster of several machines);
  the spill folder is removed when the pass ends, whatever happens.
* **data stored by state**: validated on the flow's process, then counted one state (or MAFID
  range of a state) per ``count-<partition>`` task.

Only descriptions (paths, byte ranges, MAFID ranges; never data) go to the workers; what comes back
is value-free -- rule tallies, reading problems as file, column and rule -- but for the exact
count cubes (a few kilobytes a range), added up on the flow's process. The plan, the ledger and
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
from prefect.futures import wait

from phsafe import distributed
from phsafe.config import PHSafeConfig
from phsafe.counting import CountingPartition, combine_counts, count_partition, plan_partitions
from phsafe import engine
from phsafe.distributed import Block, BlockResult, BucketResult, ClusterPlan
from phsafe.engine import ExactCounts, PrivateRun, StageTimer
from phsafe.spill import SPILL_FOLDER, SpillArea
from phsafe.tables import TABLES
from phsafe.tabulate import TableCounts


@task(name="count-partition", task_run_name="count-{partition.label}", cache_policy=NONE,
      persist_result=False, retries=0)
def count_partition_task(partition: CountingPartition, config: PHSafeConfig, key: bytes | None) -> dict[str, TableCounts]:
    """Exact count cubes of the nine measured tables on one partition (runs on a Dask worker)."""
    return count_partition(partition, config, list(TABLES.values()), key=key)


@task(name="read-block", task_run_name="read-{block.label}", cache_policy=NONE, persist_result=False, retries=0)
def read_block_task(plan: ClusterPlan, block: Block) -> BlockResult:
    """Read, check, validate and spill one block of one national file (runs on a Dask worker)."""
    return distributed.read_block(plan, block)


@task(name="settle-state-filter", task_run_name="settle-state-filter-{bucket}", cache_policy=NONE,
      persist_result=False, retries=0)
def settle_aside_task(plan: ClusterPlan, bucket: int) -> None:
    """The MAFIDs of one range that the state filter sets aside, once geo is read."""
    distributed.settle_aside(plan, bucket)


@task(name="count-range", task_run_name="count-range-{bucket}", cache_policy=NONE, persist_result=False, retries=0)
def count_bucket_task(plan: ClusterPlan, bucket: int, seen: dict, rows: dict) -> BucketResult:
    """Join, validate and count one MAFID range (runs on a Dask worker)."""
    return distributed.count_bucket(plan, bucket, seen, rows)


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
    """Validate (unless the run skips it) and count on the cluster; ``(counts, report)`` as the
    local ``validate-and-count`` task returns them (counts None when validation failed).

    National files are read once, in blocks, on the cluster (see the module docstring); data
    stored by state is validated here and counted per state there.

    Args:
        max_persons: Persons of a MAFID range (default: :data:`phsafe.memory.MAX_BUCKET_PERSONS`).
        block_bytes: CSV bytes of a block (default: :data:`phsafe.distributed.BLOCK_BYTES`).
        runner: A Dask task runner already entered (default: :func:`dask_task_runner` of
            ``address`` and ``n_workers``, for this call).
    """
    validate = run.parameters.validate_inputs
    spill = SpillArea(run.run_dir / SPILL_FOLDER)  # empties what a killed attempt left
    try:
        plan = distributed.plan_cluster(
            run.config_file, run.data_dir, spill.path, specs=list(TABLES.values()), key=run.truncation_key,
            validate=validate, block_bytes=block_bytes or distributed.BLOCK_BYTES, bucket_persons=max_persons)
        if plan is None:
            report = validate_inputs_task(run) if validate else None
            if report is not None and not report.ok:
                return None, report
            return count_on_dask(run, config, address=address, n_workers=n_workers, max_persons=max_persons), report
        with contextlib.nullcontext(runner) if runner is not None else dask_task_runner(address, n_workers) as used:
            def each(task_fn, items, **fixed):  # noqa: ANN001, ANN202 -- submit, wait, results in order
                futures = [used.submit(task_fn, parameters={**fixed, **item}) for item in items]
                wait(futures)
                return [f.result() for f in futures]

            blocks = each(read_block_task, [{"block": b} for b in plan.blocks_of("geo")], plan=plan)
            if any(b.aside for b in blocks):
                each(settle_aside_task, [{"bucket": k} for k in range(plan.buckets.buckets)], plan=plan)
            for stem in ("units", "persons"):
                blocks += each(read_block_task, [{"block": b} for b in plan.blocks_of(stem)], plan=plan)
            seen, rows = distributed.seen_of(blocks), distributed.rows_of(blocks, plan.buckets.buckets)
            buckets = each(count_bucket_task, [{"bucket": k} for k in range(plan.buckets.buckets)],
                           plan=plan, seen=seen, rows=rows)
        counts, report = distributed.merge(plan, blocks, buckets, report_dir=run.report_dir)
        return (ExactCounts(counts) if counts is not None else None), report
    finally:
        spill.close()


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
    """Great Expectations over config, persons, units and geo, on the flow's process (value-free
    report): data stored by state, before its states are counted on the cluster."""
    return engine.check_inputs(run)


@dataclass(frozen=True)
class DaskCounter:
    """The sequence's counting stage on a Dask cluster (:class:`phsafe.sequence.Counter`):
    :func:`validate_and_count_on_dask` -- national files read once in blocks on the cluster
    (validation and counting from the same blocks), data stored by state validated here and
    counted per state there. It runs tasks of its own, so the runner calls it in the flow rather
    than as a task.
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
                                          "processes": True, "dashboard_address": None, "env": env})
