"""The S-DHC production flows: the US, Puerto Rico, and the release running both.

A dataset flow runs the library's one release sequence (:func:`phsafe.sequence.run_release`) --
the same function the command line runs -- with a runner that makes each stage a Prefect task
(``tasks/pipeline.py``)::

    plan-budget ─► preflight ─► validate-and-count (one read) ─► fingerprint-inputs
      ─► open-ledger-run ─► measure-PH1_num … measure-PH8_denom (concurrent)
      ─► derive-and-write-tables ─► validate-outputs ─► publish

The flow adds what the UI shows (:mod:`tasks.artifacts`) and nothing else: the order, the spend
rules, and which run a retry continues are the sequence's. The release goes to
``<output_root>/<run id>/`` (the public zone); the run's confidential work folder is
``runs/<run id>/`` beside the ledger, and the JSON-lines log ``phsafe-log.jsonl`` beside the
ledger too (each dataset beside its own ledger).

Re-running never re-draws noise silently, and never releases the same records twice unasked:

* every attempt records its Prefect flow run id (and its parent's) in the ledger, so a **retry**
  of a flow run -- Retry in the UI, or of the release run that started it as a subflow -- finds
  its run and resumes it: committed measurements are read back, not drawn again; a retry of a
  completed run does nothing and ends Completed, saying where the release is;
* a **new** run on records the dataset already released (a second trigger) is refused before any
  spend, whatever room the cap leaves, unless ``re_release_reason`` declares a re-release;
* ``resume_run_id`` resumes a named run by hand.

A refusal ends the flow run Failed with one message -- what is wrong, and either "No
privacy-loss budget was spent." or how many spends the ledger records and that a Retry resumes
the run -- with no traceback (a refusal is not a bug) and nothing persisted: the flows return
their final state instead of raising (Prefect writes a raised exception to result storage).
"""

from __future__ import annotations

import contextvars
from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from prefect import flow
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.states import Failed, State
from pydantic import Field

from flows._logging import configure_once
from phsafe import engine, logs
from phsafe.config import PHSafeConfig
from phsafe.errors import ConfigError, PHSafeError, front_end, os_reason
from phsafe.ledger import Orchestration
from phsafe.sequence import LocalCounter, ReleaseHooks, ReleaseJob, run_release
from tasks import artifacts
from tasks._format import decimal_text
from tasks.pipeline import PrefectStages

log = structlog.get_logger("flows.sdhc")

PUERTO_RICO = "72"

# Flow parameters as operators type them in the UI or with `prefect deployment run --param`:
# numbers are JSON numbers (``--param lifetime_cap=2.5``), choices are a list to pick from.
Counting = Literal["local", "dask"]
"""``local``: count in the flow's process; ``dask``: per-partition tasks on a Dask cluster."""
LifetimeCap = Annotated[float, Field(ge=0, description="the dataset's new lifetime privacy-loss cap "
                                                       "(rho under zCDP, epsilon under pure DP)")]
PositiveCount = Annotated[int, Field(ge=1)]

_RELEASE_PARAMETERS: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "phsafe_release_parameters", default=None)
"""Set by the release flow: its subflows' refusals name the release deployment's parameters."""


def _scheduled_start() -> datetime:
    when = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    return when.astimezone(timezone.utc)


def _run_name(label: str):
    """Flow run names that say what they are: ``us-2026-11-21T02:00Z``."""
    def name() -> str:
        return f"{label}-{_scheduled_start():%Y-%m-%dT%H:%MZ}"
    return name


def _run_id(label: str) -> str:
    """The phsafe run id of a new run started by this flow run: ``us-20261121T0200Z-1a2b3c4d``."""
    return f"{label}-{_scheduled_start():%Y%m%dT%H%MZ}-{str(flow_run.id).split('-')[0]}"


def _orchestration() -> Orchestration:
    """This flow run (and its parent, for a subflow), as the ledger records it."""
    parent = flow_run.parent_flow_run_id
    return Orchestration(str(flow_run.id), str(parent) if parent else None)


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


def failure_message(exc: BaseException) -> str:
    """The flow run's state message for a failure: the reason, then what the ledger holds."""
    if isinstance(exc, PHSafeError):
        text = str(exc)
    elif isinstance(exc, OSError):
        where = f" on {Path(exc.filename).name}" if getattr(exc, "filename", None) else ""
        text = (f"operating-system error: {os_reason(exc)}{where}" if exc.errno is not None
                else f"operating-system error ({type(exc).__name__}){where}")
    else:  # a bug: its type, never its message (which may quote a value); frames are in the log file
        text = f"internal error: {type(exc).__name__} (its frames are in the run's log file)"
    status = getattr(exc, "spend_status", None)
    if status is None or not status.spent:
        return f"{text}\nNo privacy-loss budget was spent."
    if isinstance(exc, PHSafeError):
        return text  # the engine added what the ledger records and how to resume
    return f"{text}\n{getattr(exc, 'resume_hint', None) or 'the run spent budget: Retry this flow run to resume it'}"


class _Shown(ReleaseHooks):
    """The artifacts of a dataset run (``us-…``; ``nonconfidential-us-…`` on synthetic data)."""

    def __init__(self, label: str, shown: str) -> None:
        super().__init__(accepted=self._accepted, validated=self._validated, validation_text=_public_text,
                         ended=self._ended)
        self.label = label
        self.shown = shown

    def _accepted(self, run: engine.PrivateRun, config: PHSafeConfig) -> None:
        _check_dataset(self.label, config, run.config_path)

    def _validated(self, run: engine.PrivateRun, subject: str, report: Any) -> None:
        artifacts.validation_summary(self.shown, run.run_id, subject, report)

    def _ended(self, run: engine.PrivateRun, plan: Any, result: engine.RunResult | None,
               error: BaseException | None) -> None:
        if plan is None:
            return  # refused before planning: nothing to show beside the message
        budget = result.budget if result is not None else engine.dataset_budget(run)
        artifacts.budget_spends(self.shown, run.run_id, engine.spend_summary(run, plan), plan.total, budget)
        if result is not None:
            artifacts.output_manifest(self.shown, run.output_dir)
            if result.checkpoint is not None:
                artifacts.ledger_checkpoint(self.shown, run.run_id, result.checkpoint)


def _summary(result: engine.RunResult, plan_total: Any = None) -> dict[str, Any]:
    """The flow's result: where everything is, and the privacy-loss account (public facts)."""
    checkpoint = result.checkpoint or {}
    budget = result.budget
    summary: dict[str, Any] = {
        "dataset": budget.dataset if budget else None,
        "run_id": result.run_id,
        "outputs": str(result.output_dir),
        "already_published": result.already_published,
        "attempt": result.attempt,
        "work_folder": str(result.run_dir),
        "validation_reports": str(Path(result.run_dir or ".") / "validation"),
        "ledger": str(result.ledger),
        "checkpoint": str(Path(result.run_dir or ".") / "checkpoint.json"),
        "checkpoint_size": checkpoint.get("ledger_size"),
        "checkpoint_head": checkpoint.get("head_hash"),
        "checkpoint_signed": bool(checkpoint.get("signature")),
        "measurements": {s: sum(o.status == s for o in result.outcomes) for s in ("drawn", "reused", "noiseless")},
    }
    if result.plan is not None:
        summary.update(total_budget=decimal_text(result.plan.total), privacy_defn=result.plan.privacy_defn.value)
    if budget is not None:
        summary.update(unit=budget.unit, run_charge=decimal_text(budget.run_charge),
                       dataset_spent=decimal_text(budget.spent), lifetime_cap=decimal_text(budget.cap),
                       left=decimal_text(budget.left))
    return summary


_DATASET_PARAMETERS = frozenset({
    "config", "data", "output_root", "ledger", "dataset", "new_version_reason", "re_release_reason", "signing_key",
    "public_key", "validate_inputs", "validate_outputs", "lifetime_cap", "cap_reason", "resume_run_id",
    "resume_reason", "non_confidential", "work_dir", "log_file", "counting", "dask_address", "dask_workers",
    "partition_persons",
})


def run_dataset(
    label: str,
    *,
    config: str,
    data: str,
    output_root: str,
    ledger: str,
    dataset: str | None = None,
    new_version_reason: str | None = None,
    re_release_reason: str | None = None,
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
) -> dict[str, Any] | State:
    """The body of the US and Puerto Rico flows (``label`` is ``us`` or ``pr``): the release
    sequence with Prefect tasks; its summary, or a Failed state with one message."""
    configure_once(None)
    ledger_path = Path(ledger).absolute()
    parameters = _RELEASE_PARAMETERS.get() or _DATASET_PARAMETERS
    with front_end("flow", parameters), logs.log_to(Path(log_file) if log_file else ledger_path.parent / "phsafe-log.jsonl"), \
            structlog.contextvars.bound_contextvars(flow_run_id=str(flow_run.id), dataset=label):
        # Artifacts of runs on non-confidential (synthetic) data get keys of their own, so the
        # versions of `us-budget-spends` in the UI are those of runs on the real inputs only.
        shown = f"nonconfidential-{label}" if non_confidential else label
        try:
            root = Path(output_root).absolute()
            root.mkdir(parents=True, exist_ok=True)  # the release area: each run publishes a folder in it
            options = engine.PrivateRunOptions(
                ledger=ledger_path, dataset=dataset, new_version=new_version_reason, re_release=re_release_reason,
                lifetime_cap=_cap(lifetime_cap), cap_reason=cap_reason,
                signing_key=Path(signing_key) if signing_key else None,
                public_key=Path(public_key) if public_key else None, non_confidential=non_confidential,
                validate_inputs=validate_inputs, validate_outputs=validate_outputs,
                work_dir=Path(work_dir) if work_dir else None, resume_reason=resume_reason,
            )
            counter: Any = LocalCounter()
            if counting == "dask":
                from flows.counting import DaskCounter

                counter = DaskCounter(dask_address, dask_workers, partition_persons)
            job = ReleaseJob(Path(config), Path(data), options, output_root=root, resume_run_id=resume_run_id,
                             orchestration=_orchestration(), new_run_id=_run_id(label), counter=counter)
            result = run_release(job, PrefectStages(), _Shown(label, shown))
        except Exception as exc:  # noqa: BLE001 -- the state says why; a bug's frames go to the log file
            if not isinstance(exc, PHSafeError):
                from phsafe.cli._common import crash_frames

                log.error("flow run failed", error_type=type(exc).__name__, frames=crash_frames(exc))
            message = failure_message(exc)
            get_run_logger().error(message.splitlines()[0])
            return Failed(message=message)
        summary = _summary(result)
        if result.already_published:
            get_run_logger().info(f"run {result.run_id} already published its release to {result.output_dir}; "
                                  "nothing to do (a retry of a completed run)")
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
        re_release_reason: Why records the dataset already released are released again
            (recorded; the lifetime cap still applies). Without it such a run is refused before
            any spend.
        signing_key: Ed25519 private key (PEM) that signs the ledger checkpoints.
        public_key: The operator's Ed25519 public key (PEM): the signing key must match it.
        validate_inputs: Validate config and inputs first (Great Expectations; recorded).
        validate_outputs: Validate the tables before publishing them.
        lifetime_cap: Raise the dataset's lifetime cap to this number (rho or epsilon, e.g. 2.5);
            needs ``cap_reason``; recorded.
        cap_reason: Why the cap is raised (recorded in the ledger).
        resume_run_id: Complete this failed run: its committed measurements are reused, not
            drawn again. (A Retry of the flow run that started it does the same by itself.)
        resume_reason: Why it is resumed (recorded in the ledger).
        non_confidential: The data is synthetic (Infinity budgets, a throwaway ledger).
        work_dir: Folder of the runs' confidential work folders (default: ``runs/`` beside the ledger).
        log_file: JSON-lines log file (default: ``phsafe-log.jsonl`` beside the ledger; confidential).
        counting: ``local`` (in this process) or ``dask`` (per-partition tasks on a Dask cluster;
            validation, plan, ledger and noise stay here).
        dask_address: Scheduler address of an existing Dask cluster (default: a LocalCluster).
        dask_workers: Workers of the LocalCluster (default 2).
        partition_persons: Cut partitions larger than this many persons into MAFID ranges.
"""


@flow(name="sdhc-us", flow_run_name=_run_name("us"), retries=0, validate_parameters=True, persist_result=False)
def us_flow(
    config: str,
    data: str,
    output_root: str,
    ledger: str,
    dataset: str | None = None,
    new_version_reason: str | None = None,
    re_release_reason: str | None = None,
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
) -> dict[str, Any] | State:
    """S-DHC for the 50 states and DC: Nation and State levels."""
    return run_dataset("us", **locals())


@flow(name="sdhc-pr", flow_run_name=_run_name("pr"), retries=0, validate_parameters=True, persist_result=False)
def pr_flow(
    config: str,
    data: str,
    output_root: str,
    ledger: str,
    dataset: str | None = None,
    new_version_reason: str | None = None,
    re_release_reason: str | None = None,
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
) -> dict[str, Any] | State:
    """S-DHC for Puerto Rico: its own config, budget and ledger; no Nation level."""
    return run_dataset("pr", **locals())


us_flow.__doc__ = (us_flow.__doc__ or "") + _COMMON_DOC
pr_flow.__doc__ = (pr_flow.__doc__ or "") + _COMMON_DOC

_RELEASE_FLOW_PARAMETERS = frozenset({
    "us_config", "us_data", "us_ledger", "pr_config", "pr_data", "pr_ledger", "output_root", "new_version_reason",
    "re_release_reason", "signing_key", "public_key", "validate_outputs", "non_confidential", "log_file",
})


@flow(name="sdhc-release", flow_run_name=_run_name("release"), retries=0, validate_parameters=True,
      persist_result=False)
def release_flow(
    us_config: str,
    us_data: str,
    us_ledger: str,
    pr_config: str,
    pr_data: str,
    pr_ledger: str,
    output_root: str,
    new_version_reason: str | None = None,
    re_release_reason: str | None = None,
    signing_key: str | None = None,
    public_key: str | None = None,
    validate_outputs: bool = True,
    non_confidential: bool = False,
    log_file: str | None = None,
) -> dict[str, Any] | State:
    """The release: the US and Puerto Rico flows as subflows, each with its own ledger and log.

    Both datasets run even if one fails; the release fails if either does. Each config names its
    dataset; ``new_version_reason`` is recorded for either dataset whose records are new to it,
    ``re_release_reason`` for either whose records were released before. A Retry of this flow
    run resumes what its subflows started (and does nothing for a dataset already published).
    """
    logger = get_run_logger()
    root = str(Path(output_root).absolute())
    common = dict(output_root=root, new_version_reason=new_version_reason, re_release_reason=re_release_reason,
                  signing_key=signing_key, public_key=public_key, validate_outputs=validate_outputs,
                  non_confidential=non_confidential, log_file=log_file)
    token = _RELEASE_PARAMETERS.set(_RELEASE_FLOW_PARAMETERS)
    try:
        states = {
            "us": us_flow(config=us_config, data=us_data, ledger=us_ledger, return_state=True, **common),
            "pr": pr_flow(config=pr_config, data=pr_data, ledger=pr_ledger, return_state=True, **common),
        }
    finally:
        _RELEASE_PARAMETERS.reset(token)
    outcomes: dict[str, dict[str, Any]] = {}
    for label, state in states.items():
        if state.is_completed():
            outcomes[label] = state.result()
            o = outcomes[label]
            done = "was already published at" if o["already_published"] else "published to"
            logger.info(f"{label}: run {o['run_id']} {done} {o['outputs']}; this run charged {o.get('run_charge')}, "
                        f"dataset {o['dataset']} has spent {o.get('dataset_spent')} of its cap {o.get('lifetime_cap')} "
                        f"({o.get('unit')}), {o.get('left')} left")
        else:
            reason = (state.message or state.type.value.lower()).strip()
            outcomes[label] = {"failed": reason.splitlines()[0][:300]}
            logger.error(f"{label}: {state.type.value.lower()}: {reason.splitlines()[0][:300]}")
    artifacts.release_summary(flow_run.name or "release", outcomes)
    failed = [label for label, o in outcomes.items() if "failed" in o]
    if failed:
        return Failed(message="release incomplete -- " + "\n".join(
            f"{label}: {states[label].message or states[label].type.value.lower()}" for label in failed))
    return outcomes
