"""The S-DHC production flows: the US, Puerto Rico, and the release running both.

Each dataset flow chains, as Prefect tasks over :mod:`phsafe.engine`::

    plan ─► preflight ─► validate + count (one read) ─► fingerprint ─► open ledger run
        ─► nine measurements, submitted concurrently ─► derive PH5_num/PH8_num, variances,
        write ─► validate outputs ─► publish (signed checkpoint, manifest, atomic rename, then
        the ledger records the release)

and publishes five artifacts: budget spends, input validation, output validation, output
manifest and ledger checkpoint. A refused preflight or a validation failure ends the flow Failed
before the ledger is touched: nothing is spent. The release goes to ``<output_root>/<run id>/``
(the public zone); the run's confidential work folder -- validation reports, noisy vectors until
published, the final checkpoint -- is ``runs/<run id>/`` beside the ledger, and the JSON-lines
log defaults to ``phsafe-log.jsonl`` beside the ledger.

Re-running never re-draws noise silently. The phsafe run id is derived from the Prefect flow run
(``us-20261121T0200Z-<flow run id>``), so a *flow retry* finds its run in the ledger and resumes
it; an operator re-runs a failed run explicitly with ``resume_run_id``. A resumed run reads back
every measurement the ledger shows COMMITTED (checked against the recorded digest) and draws only
the rest -- each such draw is a new spend in the ledger, charged again and checked against the
lifetime cap. A new run on the same data is refused by the lifetime cap unless the operator
raises it with a reason.
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from prefect import flow
from prefect.futures import wait
from prefect.runtime import flow_run
from pydantic import Field

from flows._logging import configure_once
from flows.counting import validate_and_count_on_dask
from phsafe import engine
from phsafe.config import PHSafeConfig
from phsafe.errors import ConfigError, PHSafeError, front_end, option
from phsafe.ledger import RunStatus
from phsafe.tables import TABLES
from tasks import artifacts
from tasks import pipeline as t
from tasks._format import decimal_text

log = structlog.get_logger("flows.sdhc")

PUERTO_RICO = "72"

# Flow parameters as operators type them in the UI or with `prefect deployment run --param`:
# numbers are JSON numbers (``--param lifetime_cap=2.5``), choices are a list to pick from.
Counting = Literal["local", "dask"]
"""``local``: count in the flow's process; ``dask``: per-partition tasks on a Dask cluster."""
LifetimeCap = Annotated[float, Field(ge=0, description="the dataset's new lifetime privacy-loss cap "
                                                       "(rho under zCDP, epsilon under pure DP)")]
PositiveCount = Annotated[int, Field(ge=1)]


def _scheduled_start() -> datetime:
    when = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    return when.astimezone(timezone.utc)


def _run_name(label: str):
    """Flow run names that say what they are: ``us-2026-11-21T02:00Z``."""
    def name() -> str:
        return f"{label}-{_scheduled_start():%Y-%m-%dT%H:%MZ}"
    return name


def _run_id(label: str) -> str:
    """A phsafe run id that is the same on every retry of this flow run."""
    return f"{label}-{_scheduled_start():%Y%m%dT%H%MZ}-{str(flow_run.id).split('-')[0]}"


def _cap(value: float | None) -> Fraction | None:
    """The cap exactly as the operator wrote it: ``2.514562`` is 2514562/1000000, not the
    binary float nearest to it (the shortest decimal that reads back as the float)."""
    if value is None:
        return None
    return Fraction(Decimal(repr(float(value))))


def _public_text(report: Any, run: engine.PrivateRun) -> str:
    """A failed validation as the flow run's state message shows it (the Prefect database is
    outside the enclave): the broken rules, without failing-row counts, which are a statistic
    of the confidential data and stay in the report."""
    return (artifacts.broken_rules_text(report.subject, report)
            + f"\nfailing-row counts: in the validation report {run.report_dir} (confidential)")


def _check_dataset(label: str, config: PHSafeConfig, config_path: Path) -> None:
    """The US and Puerto Rico are separate runs with separate configs and ledgers."""
    states = set(config.states)
    if label == "pr" and states != {PUERTO_RICO}:
        raise ConfigError("state_filter", "the Puerto Rico flow needs state_filter [\"72\"]", file=str(config_path))
    if label == "us" and PUERTO_RICO in states:
        raise ConfigError("state_filter", "Puerto Rico (72) is its own run: use the Puerto Rico flow",
                          file=str(config_path))


def _memory_limit(text: str | None) -> int | None:
    """The ``memory_limit`` flow parameter (``8G``, ``512M``) in bytes."""
    if not text:
        return None
    from phsafe.memory import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise PHSafeError(f"the flow parameter memory_limit: {exc}") from None


def run_dataset(
    label: str,
    *,
    config: str,
    data: str,
    output_root: str,
    ledger: str,
    dataset: str | None = None,
    new_version_reason: str | None = None,
    signing_key: str | None = None,
    public_key: str | None = None,
    validate_inputs: bool = True,
    validate_outputs: bool = True,
    lifetime_cap: float | None = None,
    cap_reason: str | None = None,
    resume_run_id: str | None = None,
    resume_reason: str | None = None,
    non_confidential: bool = False,
    work_dir: str | None = None,
    log_file: str | None = None,
    counting: Counting = "local",
    dask_address: str | None = None,
    dask_workers: int | None = None,
    partition_persons: int | None = None,
    memory_limit: str | None = None,
) -> dict[str, Any]:
    """The body of the US and Puerto Rico flows (``label`` is ``us`` or ``pr``).

    Refusals name flow parameters (``the flow parameter lifetime_cap``), not CLI flags.
    """
    with front_end("flow"):
        root = Path(output_root).absolute()
        root.mkdir(parents=True, exist_ok=True)  # the release area: each run publishes a folder in it
        ledger_path = Path(ledger).absolute()
        configure_once(Path(log_file) if log_file else ledger_path.parent / "phsafe-log.jsonl")
        # Artifacts of runs on non-confidential (synthetic) data get keys of their own, so the
        # versions of `us-budget-spends` in the UI are those of runs on the real inputs only.
        shown = f"nonconfidential-{label}" if non_confidential else label
        run_id = resume_run_id or _run_id(label)
        options = engine.PrivateRunOptions(
            ledger=ledger_path, dataset=dataset, new_version=new_version_reason,
            lifetime_cap=_cap(lifetime_cap), cap_reason=cap_reason,
            signing_key=Path(signing_key) if signing_key else None,
            public_key=Path(public_key) if public_key else None, non_confidential=non_confidential,
            validate_inputs=validate_inputs, validate_outputs=validate_outputs,
            work_dir=Path(work_dir) if work_dir else None,
            resume_reason=resume_reason or (f"Prefect flow run {flow_run.id} retried" if not resume_run_id else None),
            memory_limit=_memory_limit(memory_limit),
        )
        earlier = engine.open_ledger(ledger_path).run(run_id) if ledger_path.is_file() else None
        if resume_run_id and earlier is None:
            raise PHSafeError(f"{option('resume')} names run {resume_run_id}, which is not in the ledger "
                              f"{ledger_path}; nothing to resume")
        if earlier is not None and earlier.status is RunStatus.FINISHED:
            raise PHSafeError(f"run {run_id} already finished and published to {earlier.output_path}; "
                              "it is never run again")
        with structlog.contextvars.bound_contextvars(run_id=run_id, flow_run_id=str(flow_run.id), dataset=label):
            run, cfg = engine.begin_private_run(
                Path(config), Path(data), root / run_id, options, run_id=run_id, resume=earlier is not None,
            )
            _check_dataset(label, cfg, run.config_path)
            plan = t.plan_budget(cfg)
            run = t.preflight(run, cfg, plan)  # nothing is spent if anything is wrong
            if counting == "dask":
                # On the cluster: national files read once in blocks (validation and counting),
                # data stored by state validated here and counted per state there.
                counts, report = validate_and_count_on_dask(run, cfg, address=dask_address, n_workers=dask_workers,
                                                            max_persons=partition_persons)
            else:
                counts, report = t.validate_and_count(run)
            if report is not None:
                artifacts.validation_summary(shown, run_id, "input", report)
                if not report.ok:  # before the ledger run: nothing spent
                    raise engine.ValidationFailed("input", _public_text(report, run))
            digests = t.fingerprint_inputs(run.data_dir)
            attempt = t.open_ledger_run(run, plan, digests, counts)
            try:
                futures = [t.measure_table.submit(run, plan, table, counts, attempt) for table in TABLES]
                wait(futures)
                del counts
                outcomes = [o for f in futures for o in f.result()]  # raises the first failure
                file_digests = t.derive_and_write_tables(run, cfg, plan)
                if validate_outputs:
                    report = t.validate_outputs(run, cfg)
                    artifacts.validation_summary(shown, run_id, "output", report)
                    if not report.ok:
                        raise engine.ValidationFailed("output", _public_text(report, run))
                checkpoint = t.publish(run, cfg, plan, file_digests, attempt)
            except BaseException as exc:
                resumable = t.record_failure(run, plan, attempt, engine.failure_reason(exc))
                artifacts.budget_spends(shown, run_id, engine.spend_summary(run, plan), plan.total)
                hinted = engine.with_resume_hint(exc, run) if resumable else exc
                if hinted is not exc:
                    raise hinted from exc
                raise
            artifacts.budget_spends(shown, run_id, engine.spend_summary(run, plan), plan.total)
            artifacts.output_manifest(shown, run.output_dir)
            artifacts.ledger_checkpoint(shown, run_id, checkpoint)
            summary = {
                "dataset": run.dataset,
                "run_id": run_id,
                "outputs": str(run.output_dir),
                "work_folder": str(run.run_dir),
                "validation_reports": str(run.report_dir),
                "ledger": str(ledger_path),
                "checkpoint": str(run.run_dir / "checkpoint.json"),
                "total_budget": decimal_text(plan.total),
                "privacy_defn": plan.privacy_defn.value,
                "measurements": {s: sum(o.status == s for o in outcomes) for s in ("drawn", "reused", "noiseless")},
            }
            log.info("run published", **{k: v for k, v in summary.items() if k != "measurements"})
            return summary


_COMMON_DOC = """
    Args:
        config: The production ``config.json`` of this dataset (its ``"dataset"`` names the
            dataset the run spends against, unless ``dataset`` does).
        data: Folder with persons, units and geo (CSV or Parquet).
        output_root: Each run publishes its release to ``<output_root>/<run id>/``.
        ledger: This dataset's audit ledger, made once by ``phsafe ledger init`` (a run never
            creates one, except a throwaway one for non-confidential data).
        dataset: The dataset name (default: the config's ``"dataset"``).
        new_version_reason: Why these records are a new content version of the dataset
            (recorded); needed the first time the dataset runs on records it has not seen.
        signing_key: Ed25519 private key (PEM) that signs the ledger checkpoints.
        public_key: The operator's Ed25519 public key (PEM): the signing key must match it.
        validate_inputs: Validate config and inputs first (Great Expectations; recorded).
        validate_outputs: Validate the tables before publishing them.
        lifetime_cap: Raise the dataset's lifetime cap to this number (rho or epsilon, e.g. 2.5);
            needs ``cap_reason``; recorded.
        cap_reason: Why the cap is raised (recorded in the ledger).
        resume_run_id: Complete this failed run: its committed measurements are reused, not
            drawn again.
        resume_reason: Why it is resumed (recorded in the ledger).
        non_confidential: The data is synthetic (Infinity budgets, a throwaway ledger).
        work_dir: Folder of the runs' confidential work folders (default: ``runs/`` beside the ledger).
        log_file: JSON-lines log file (default: ``phsafe-log.jsonl`` beside the ledger; confidential).
        counting: ``local`` (in this process) or ``dask`` (per-partition tasks on a Dask cluster;
            validation, plan, ledger and noise stay here).
        dask_address: Scheduler address of an existing Dask cluster (default: a LocalCluster).
        dask_workers: Workers of the LocalCluster (default 2).
        partition_persons: Cut partitions larger than this many persons into MAFID ranges.
        memory_limit: Memory the input pass may use, e.g. ``8G`` (default: half of the machine's);
            inputs too large for it are spilled in MAFID ranges to the work folder, inputs that
            cannot fit are refused before anything is spent.
"""


@flow(name="sdhc-us", flow_run_name=_run_name("us"), retries=0, validate_parameters=True)
def us_flow(
    config: str,
    data: str,
    output_root: str,
    ledger: str,
    dataset: str | None = None,
    new_version_reason: str | None = None,
    signing_key: str | None = None,
    public_key: str | None = None,
    validate_inputs: bool = True,
    validate_outputs: bool = True,
    lifetime_cap: LifetimeCap | None = None,
    cap_reason: str | None = None,
    resume_run_id: str | None = None,
    resume_reason: str | None = None,
    non_confidential: bool = False,
    work_dir: str | None = None,
    log_file: str | None = None,
    counting: Counting = "local",
    dask_address: str | None = None,
    dask_workers: PositiveCount | None = None,
    partition_persons: PositiveCount | None = None,
    memory_limit: str | None = None,
) -> dict[str, Any]:
    """S-DHC for the 50 states and DC: Nation and State levels."""
    return run_dataset("us", **locals())


@flow(name="sdhc-pr", flow_run_name=_run_name("pr"), retries=0, validate_parameters=True)
def pr_flow(
    config: str,
    data: str,
    output_root: str,
    ledger: str,
    dataset: str | None = None,
    new_version_reason: str | None = None,
    signing_key: str | None = None,
    public_key: str | None = None,
    validate_inputs: bool = True,
    validate_outputs: bool = True,
    lifetime_cap: LifetimeCap | None = None,
    cap_reason: str | None = None,
    resume_run_id: str | None = None,
    resume_reason: str | None = None,
    non_confidential: bool = False,
    work_dir: str | None = None,
    log_file: str | None = None,
    counting: Counting = "local",
    dask_address: str | None = None,
    dask_workers: PositiveCount | None = None,
    partition_persons: PositiveCount | None = None,
    memory_limit: str | None = None,
) -> dict[str, Any]:
    """S-DHC for Puerto Rico: its own config, budget and ledger; no Nation level."""
    return run_dataset("pr", **locals())


us_flow.__doc__ = (us_flow.__doc__ or "") + _COMMON_DOC
pr_flow.__doc__ = (pr_flow.__doc__ or "") + _COMMON_DOC


@flow(name="sdhc-release", flow_run_name=_run_name("release"), retries=0, validate_parameters=True)
def release_flow(
    us_config: str,
    us_data: str,
    us_ledger: str,
    pr_config: str,
    pr_data: str,
    pr_ledger: str,
    output_root: str,
    new_version_reason: str | None = None,
    signing_key: str | None = None,
    public_key: str | None = None,
    validate_outputs: bool = True,
    non_confidential: bool = False,
    log_file: str | None = None,
) -> dict[str, Any]:
    """The release: the US and Puerto Rico flows as subflows, each with its own ledger.

    Both datasets run even if one fails; the release fails if either does. Each config names its
    dataset; ``new_version_reason`` is recorded for either dataset whose records are new to it.
    """
    with front_end("flow"):
        root = Path(output_root).absolute()
        configure_once(Path(log_file) if log_file else Path(us_ledger).absolute().parent / "phsafe-log.jsonl")
        common = dict(output_root=str(root), new_version_reason=new_version_reason, signing_key=signing_key,
                      public_key=public_key, validate_outputs=validate_outputs,
                      non_confidential=non_confidential, log_file=log_file)
        states = {
            "us": us_flow(config=us_config, data=us_data, ledger=us_ledger, return_state=True, **common),
            "pr": pr_flow(config=pr_config, data=pr_data, ledger=pr_ledger, return_state=True, **common),
        }
        failed = [label for label, state in states.items() if not state.is_completed()]
        if failed:
            raise PHSafeError("release incomplete: " + ", ".join(
                f"{label} {states[label].type.value.lower()} ({states[label].message})" for label in failed))
        return {label: state.result() for label, state in states.items()}
