"""Prefect tasks: one per pipeline stage, each a thin wrapper over a function of ``phsafe.engine``.

What crosses a task boundary is small: paths, digests, the plan, summaries. The one exception
is the exact counts, an in-memory :class:`phsafe.engine.ExactCounts` handed from the counting
task to the measurement tasks in the same process; it cannot be serialized, and no task here
persists its result.

Privacy rules (DEVELOPERS.md):

* No task caches or persists its result (``cache_policy=NONE``, ``persist_result=False``): a
  cached result could replay a noisy release, or write exact counts to result storage.
* A task that draws noise or appends to the ledger has no retries. A retried draw would be a new
  spend; the ledger's write-ahead rule and the measurement store make a *resumed run* reuse
  committed measurements instead (see ``flows/sdhc.py``).
* Retries with exponential backoff only on pure reads and idempotent writes (fingerprinting the
  inputs, writing the tables from stored vectors).
"""

from __future__ import annotations

from pathlib import Path

import structlog
from prefect import task
from prefect.cache_policies import NONE
from prefect.tasks import exponential_backoff

from phsafe import engine
from phsafe.accounting import RunPlan
from phsafe.config import PHSafeConfig
from phsafe.engine import ExactCounts, LedgerAttempt, MeasurementOutcome, PrivateRun

# Every task: no cache, no persisted result.
_NOTHING_KEPT = {"cache_policy": NONE, "persist_result": False}
# Pure I/O: a few retries with backoff (1 s, 2 s, 4 s, with jitter).
_IO_RETRIES = {"retries": 3, "retry_delay_seconds": exponential_backoff(backoff_factor=1), "retry_jitter_factor": 0.5}
# Spends budget or writes the ledger: exactly once per call.
_NO_RETRIES = {"retries": 0}


@task(name="preflight", **_NOTHING_KEPT, **_NO_RETRIES)
def preflight(run: PrivateRun, config: PHSafeConfig, plan: RunPlan) -> PrivateRun:
    """Everything the run needs later, checked before any spend: ledger, keys, paths, space, cap.
    Returns the run with its truncation key (fresh, or the recorded one for a resume)."""
    return engine.preflight(run, config, plan).run


@task(name="fingerprint-inputs", **_NOTHING_KEPT, **_IO_RETRIES)
def fingerprint_inputs(data_dir: Path) -> dict[str, str]:
    """SHA-256 of every input file: confidential lineage, recorded in the ledger only."""
    return engine.fingerprint_inputs(Path(data_dir))


@task(name="validate-inputs", **_NOTHING_KEPT, **_NO_RETRIES)
def validate_inputs(run: PrivateRun):
    """Great Expectations over config, persons, units and geo. Returns the (value-free) report."""
    return engine.check_inputs(run)


@task(name="validate-and-count", **_NOTHING_KEPT, **_NO_RETRIES)
def validate_and_count(run: PrivateRun):
    """One read of each input: validate (Great Expectations, unless the run skips it), state
    filter, geography and group quarters, truncate and join, count exactly. Returns the exact
    counts (None if validation failed) and the value-free report (None without validation)."""
    return engine.validate_and_count(run)


@task(name="preprocess-and-count", **_NOTHING_KEPT, **_NO_RETRIES)
def preprocess_and_count(run: PrivateRun, config: PHSafeConfig) -> ExactCounts:
    """Read, state-filter, geography and group quarters, truncate and join, count exactly."""
    return engine.count_exact(run, config)


@task(name="plan-budget", **_NOTHING_KEPT, **_NO_RETRIES)
def plan_budget(config: PHSafeConfig) -> RunPlan:
    """Every measurement's exact budget, sensitivity and variance, checked against OpenDP."""
    return engine.plan_private_run(config)


@task(name="open-ledger-run", **_NOTHING_KEPT, **_NO_RETRIES)
def open_ledger_run(run: PrivateRun, plan: RunPlan, input_digests: dict[str, str], counts: ExactCounts) -> LedgerAttempt:
    """Start the run in the ledger (its dataset, content version and lifetime cap checked) or
    resume it; returns what earlier attempts committed."""
    return engine.open_run_in_ledger(run, plan, input_digests, engine.content_fingerprint(run, counts))


@task(name="measure", task_run_name="measure-{table}", **_NOTHING_KEPT, **_NO_RETRIES)
def measure_table(
    run: PrivateRun, plan: RunPlan, table: str, counts: ExactCounts, attempt: LedgerAttempt
) -> list[MeasurementOutcome]:
    """Noise for every level of one table: spend recorded first, committed vectors reused."""
    with structlog.contextvars.bound_contextvars(table=table):
        return engine.measure_table(run, plan, table, counts, attempt)


@task(name="derive-and-write-tables", **_NOTHING_KEPT, **_IO_RETRIES)
def derive_and_write_tables(run: PrivateRun, config: PHSafeConfig, plan: RunPlan) -> dict[str, str]:
    """PH5_num and PH8_num from their sources, variances attached, eleven tables staged."""
    return engine.write_private_outputs(run, config, plan)


@task(name="validate-outputs", **_NOTHING_KEPT, **_NO_RETRIES)
def validate_outputs(run: PrivateRun, config: PHSafeConfig):
    """Great Expectations over the staged tables. Returns the report."""
    return engine.check_outputs(run, config)


@task(name="publish", **_NOTHING_KEPT, **_NO_RETRIES)
def publish(
    run: PrivateRun, config: PHSafeConfig, plan: RunPlan, file_digests: dict[str, str], attempt: LedgerAttempt,
) -> dict:
    """Sign a checkpoint, write the manifest, rename the release into place, then record it in
    the ledger (OUTPUTS_PUBLISHED, RUN_FINISHED)."""
    return engine.publish_private_run(run, config, plan, file_digests, attempt)


@task(name="record-failure", **_NOTHING_KEPT, **_NO_RETRIES)
def record_failure(run: PrivateRun, plan: RunPlan, attempt: LedgerAttempt | None, reason: str) -> bool:
    """Mark the run failed in the ledger; True if it can be resumed from its committed spends."""
    return engine.record_failure(run, plan, attempt, reason)
