"""The private release as one sequence of stages: the only place their order is written down.

A private run is, in this order::

    plan ─► preflight ─► validate and count (one read) ─► digest inputs ─► open the ledger run
      ─► measure (each table: the spend recorded, then the noise) ─► write the tables
      ─► validate outputs ─► publish (signed checkpoint, manifest, rename, then the ledger)

:func:`run_release` runs it, given the operator's
:class:`~phsafe.parameters.PrivateRunParameters`. The command line (and :func:`phsafe.run_private`)
runs it with :class:`InProcess`, which times each stage and shows it on the progress display;
the Prefect flows run the very same function with a runner that makes each stage a task
(``tasks/pipeline.py``). A runner decides *how* a stage runs -- in this process, as a task, the
nine measurements one after another or concurrently -- never *whether* or *when*: the order, what
a failure does, and which run a retry continues are decided here, once.

The stages enforce their own preconditions besides: the ledger refuses a spend without an open
run (and a second release of the same records without a declared re-release), the measurement
spends before it draws, the tables are written only from committed vectors, and the ledger
records a publication only once the release is in place. So a runner that called the stages in
another order would be refused, not obeyed.

Which run an attempt continues:

* the parameter ``resume_run_id`` given: that run (the operator resumes it on purpose);
* an orchestrator's retry (the same flow run, or a subflow of the same parent flow run, found
  through the flow run ids recorded in the ledger): the run it started -- resumed if it did not
  finish, or nothing at all if it published (the result says where);
* otherwise a new run.

A failure after the run opened in the ledger is recorded (``RUN_FAILED``) and the message says
how to complete the run without drawing noise again; before that, nothing was spent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeVar

import structlog

from phsafe import engine, interrupt
from phsafe.engine import (
    ExactCounts,
    LedgerAttempt,
    MeasurementOutcome,
    PrivateRun,
    RunResult,
    SpendStatus,
    StageTimer,
    ValidationFailed,
)
from phsafe.logs import get_logger
from phsafe.parameters import PrivateRunParameters
from phsafe.tables import TABLES

if TYPE_CHECKING:
    from phsafe.accounting import RunPlan
    from phsafe.config import PHSafeConfig
    from phsafe.ledger import Orchestration
    from phsafe.progress import Progress

__all__ = [
    "Stage", "SEQUENCE", "PLAN", "PREFLIGHT", "VALIDATE_AND_COUNT", "DIGEST_INPUTS", "OPEN_LEDGER_RUN",
    "MEASURE", "WRITE_TABLES", "VALIDATE_OUTPUTS", "PUBLISH", "RECORD_FAILURE",
    "StageRunner", "InProcess", "Counter", "LocalCounter", "ReleaseHooks", "run_release",
]

log = get_logger("phsafe.sequence")
T = TypeVar("T")


@dataclass(frozen=True)
class Stage:
    """One stage of the release.

    Attributes:
        name: Its name as an orchestrator shows it (a Prefect task name).
        title: Its name on the progress display and in the timings.
        retriable: A runner may retry it on its own: a pure read or an idempotent write. Stages
            that touch the ledger or draw noise are never retried by a runner -- a retry of the
            *run* resumes it instead.
        run_name: How each item of a mapped stage is named (``measure-{table}``).
    """

    name: str
    title: str
    retriable: bool = False
    run_name: str | None = None


PLAN = Stage("plan-budget", "plan")
PREFLIGHT = Stage("preflight", "preflight")
VALIDATE_AND_COUNT = Stage("validate-and-count", "validate and count")
DIGEST_INPUTS = Stage("fingerprint-inputs", "digest inputs", retriable=True)
OPEN_LEDGER_RUN = Stage("open-ledger-run", "open the ledger run")
MEASURE = Stage("measure", "measure (noise)", run_name="measure-{table}")
WRITE_TABLES = Stage("derive-and-write-tables", "write outputs", retriable=True)
VALIDATE_OUTPUTS = Stage("validate-outputs", "validate outputs")
PUBLISH = Stage("publish", "publish")
RECORD_FAILURE = Stage("record-failure", "record the failure")

SEQUENCE: tuple[Stage, ...] = (PLAN, PREFLIGHT, VALIDATE_AND_COUNT, DIGEST_INPUTS, OPEN_LEDGER_RUN, MEASURE,
                               WRITE_TABLES, VALIDATE_OUTPUTS, PUBLISH)
"""The stages in the order :func:`run_release` runs them (``RECORD_FAILURE`` only on a failure)."""


class StageRunner(Protocol):
    """How stages run: in this process, or as an orchestrator's tasks."""

    timer: StageTimer | None
    """Nested stages (the counting's) report here; None where the runner shows them itself."""

    def run(self, stage: Stage, fn: Callable[..., T], *args: Any, inline: bool = False) -> T:
        """Run ``fn(*args)`` as ``stage`` and return its result (raise its exception).

        ``inline``: ``fn`` orchestrates work of its own (counting on a cluster): run it as it is.
        """
        ...

    def map(self, stage: Stage, fn: Callable[..., T], items: Sequence[str], *args: Any, total: int) -> list[T]:
        """Run ``fn(item, *args)`` for every item as ``stage`` (in any order, or concurrently);
        the results in the order of ``items``; raise the first failure once all have ended.
        ``fn`` takes ``done=`` (called with each finished unit's name) for progress displays;
        ``total`` is the number of such units."""
        ...


class InProcess:
    """Runs every stage in this process, in order, timed and shown on a progress display."""

    def __init__(self, progress: "Progress | None" = None) -> None:
        self.timer: StageTimer | None = StageTimer(progress)

    def run(self, stage: Stage, fn: Callable[..., T], *args: Any, inline: bool = False) -> T:
        assert self.timer is not None
        with self.timer(stage.title):
            return fn(*args)

    def map(self, stage: Stage, fn: Callable[..., T], items: Sequence[str], *args: Any, total: int) -> list[T]:
        assert self.timer is not None
        with self.timer(stage.title), self.timer.progress.task("measurements", total=total,
                                                                unit="measurements") as task:
            return [fn(item, *args, done=lambda key: task.advance(item=key)) for item in items]


class Counter(Protocol):
    """Validates (unless the run skips it) and counts the inputs exactly.

    Returns ``(counts, report)``: the exact counts (None when validation failed: nothing may be
    spent) and the validation report (None without validation)."""

    orchestrates: bool
    """It runs work of its own (tasks on a cluster): runners call it as it is, not as a stage task."""

    def __call__(self, run: PrivateRun, config: "PHSafeConfig", timer: StageTimer | None) -> tuple[Any, Any]: ...


class LocalCounter:
    """One read of each input in this process (:func:`phsafe.engine.validate_and_count`)."""

    orchestrates = False

    def __call__(self, run: PrivateRun, config: "PHSafeConfig", timer: StageTimer | None) -> tuple[Any, Any]:
        return engine.validate_and_count(run, timer)


@dataclass
class ReleaseHooks:
    """What a front end shows of a run, beside the run itself (the flows' artifacts).

    Attributes:
        accepted: Called with ``(run, config)`` once the config is read, before anything else: a
            front end's own refusals (the US flow refuses Puerto Rico's config).
        validated: Called with ``(run, subject, report)`` after input (``subject="input"``) or
            output validation, whether it passed or not.
        validation_text: The text of a failed validation in the run's error message: the
            report's own text (failing-row counts included) inside the enclave; the flows give
            the broken rules only, since their messages leave the enclave.
        ended: Called with ``(run, plan, result, error)`` once the run ends, either way.
    """

    accepted: Callable[[PrivateRun, "PHSafeConfig"], None] | None = None
    validated: Callable[[PrivateRun, str, Any], None] | None = None
    validation_text: Callable[[Any, PrivateRun], str] | None = None
    ended: Callable[[PrivateRun, "RunPlan | None", RunResult | None, BaseException | None], None] | None = None


def _continuation(resume_run_id: str | None, orchestration: "Orchestration | None", dataset: str,
                  ledger: Path) -> tuple[str | None, Any]:
    """Which earlier run this attempt continues: ``(run_id, finished_run)``; ``(None, None)``
    for a new run.

    ``finished_run`` is the ledger's record of a run this orchestrated attempt already finished
    (a retry of a completed flow run): there is nothing left to do.
    """
    from phsafe.ledger import RunStatus

    if resume_run_id:
        if ledger.is_file():
            earlier = engine.open_ledger(ledger).run(resume_run_id)
            if earlier is not None and earlier.status is RunStatus.FINISHED:
                if orchestration is not None and any(orchestration.started(a) for a in earlier.attempts):
                    return earlier.run_id, earlier  # a retry of the flow run that finished it
                if _lacks_release_log_files(ledger, earlier):
                    return earlier.run_id, earlier  # stopped before its log files were written
        return resume_run_id, None
    if orchestration is None or not ledger.is_file():
        return None, None
    mine = engine.open_ledger(ledger).state.runs_of(orchestration, dataset)
    if not mine:
        return None, None
    latest = mine[0]
    if latest.status is RunStatus.FINISHED:
        return latest.run_id, latest
    return latest.run_id, None


def _lacks_release_log_files(ledger: Path, recorded: Any) -> bool:
    """A finished run whose release folder is there but lacks its public log files (the run
    stopped between recording its publication and writing them): completing it writes them."""
    from phsafe.publog import RELEASE_LOG_FILES, log_path

    folder = Path(recorded.output_path or "")
    return (bool(recorded.output_path) and folder.is_dir() and log_path(ledger).is_dir()
            and not all((folder / name).is_file() for name in RELEASE_LOG_FILES))


def _retry_reason(orchestration: "Orchestration") -> str:
    if orchestration.parent_flow_run_id:
        return f"Prefect flow run {orchestration.flow_run_id} retries its parent flow run {orchestration.parent_flow_run_id}"
    return f"Prefect flow run {orchestration.flow_run_id} retried"


def _already_published(run: PrivateRun, recorded: Any) -> RunResult:
    checkpoint = None
    manifest = Path(recorded.output_path or "") / "manifest.json"
    if recorded.output_path and manifest.is_file():
        import json

        try:
            checkpoint = json.loads(manifest.read_text(encoding="utf-8")).get("checkpoint")
        except (OSError, ValueError):
            checkpoint = None
    if recorded.output_path and Path(recorded.output_path).is_dir():
        # Stopped between recording the publication and writing the release's log files.
        engine.write_release_log_files(engine.open_ledger(run.ledger), run.run_id, Path(recorded.output_path))
    # ... or before removing what the finished run no longer needs (`phsafe ledger clean-finished`'s work).
    engine.clean_finished_runs(run.ledger, [run.run_id], work_dir=run.parameters.work_dir)
    log.info("already published: nothing to do", run_id=run.run_id, output=recorded.output_path)
    return RunResult(run.run_id, Path(recorded.output_path or run.output_dir), dict(recorded.outputs or {}),
                     None, {}, run.ledger, run.run_dir, [], checkpoint, recorded.attempt, already_published=True,
                     budget=engine.dataset_budget(run))


def _measure(table: str, run: PrivateRun, plan: "RunPlan", counts: ExactCounts, attempt: LedgerAttempt,
             done: Callable[[str], None] | None = None) -> list[MeasurementOutcome]:
    """Every level of ``table``: the spend recorded first, then the noise; committed vectors reused."""
    with structlog.contextvars.bound_contextvars(table=table):
        return engine.measure_table(run, plan, table, counts, attempt, done=done)


def _failure(exc: BaseException, run: PrivateRun, status: SpendStatus) -> BaseException:
    """``exc`` with how to complete the run if it spent and did not finish (a finished run is
    never resumed: its refusal says so and nothing else); ``spend_status`` attached either way."""
    resumable = status.spent and not status.finished
    if isinstance(exc, interrupt.RunInterrupted) and exc.could_spend and not status.finished:
        failed: BaseException = interrupt.RunInterrupted(
            f"{exc} -- {engine.resume_hint(run, status)}" if resumable
            else f"{exc}; no budget was spent: run again when ready", could_spend=True)
    else:
        failed = engine.with_resume_hint(exc, run, status) if resumable else exc
    try:
        failed.spend_status = status  # type: ignore[attr-defined]
        failed.resume_hint = engine.resume_hint(run, status) if resumable else None  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        pass
    return failed


def run_release(
    parameters: PrivateRunParameters,
    *,
    runner: StageRunner | None = None,
    hooks: ReleaseHooks | None = None,
    orchestration: "Orchestration | None" = None,
    counter: Counter | None = None,
    new_run_id: str | None = None,
) -> RunResult:
    """Run the private release the operator asked for, stage by stage, with ``runner``; publish
    it; record it.

    Args:
        parameters: What the operator set; exactly one of ``output`` (the release's folder) and
            ``output_root`` (each run publishes to ``<output_root>/<run id>/``).
        runner: How the stages run (default: :class:`InProcess`, without a progress display).
        hooks: What a front end shows of the run beside it.
        orchestration: The orchestrator's flow run running this attempt (recorded in the ledger;
            a retry of it finds its run and continues it).
        counter: How the inputs are validated and counted (default: one read in this process).
        new_run_id: The id a new run gets (default: a fresh one).

    Raises:
        PHSafeError: Bad config, setting or input, a refusal (budget, a second release of the
            same records, ...), a failed validation -- nothing spent -- or a failure after
            spending, whose message says how to complete the run without drawing noise again.
            The exception carries ``spend_status`` (:class:`~phsafe.engine.SpendStatus`).
    """
    if (parameters.output is None) == (parameters.output_root is None):
        raise ValueError("give exactly one of output and output_root")

    def output_for(run_id: str) -> Path:
        folder = parameters.output if parameters.output is not None else Path(parameters.output_root or "") / run_id
        return Path(folder).absolute()

    runner = runner or InProcess()
    hooks = hooks or ReleaseHooks()
    counter = counter or LocalCounter()
    new_id = new_run_id or engine.new_run_id()
    run, config = engine.begin_private_run(parameters, run_id=new_id, output_dir=output_for(new_id),
                                           orchestration=orchestration)
    if hooks.accepted is not None:
        hooks.accepted(run, config)
    run_id, finished = _continuation(parameters.resume_run_id, orchestration, run.dataset, run.ledger)
    if run_id is not None:
        if orchestration is not None and not parameters.resume_reason:
            run = replace(run, parameters=parameters.model_copy(update={"resume_reason": _retry_reason(orchestration)}))
        run = replace(run, run_id=run_id, resume=True, output_dir=output_for(run_id))
    log.info("private run", run_id=run.run_id, config=str(run.config_path), data=str(run.data_dir),
             output=str(run.output_dir), privacy_defn=config.privacy_defn.value, resume=run.resume,
             dataset=run.dataset)
    if finished is not None:
        return _already_published(run, finished)
    with structlog.contextvars.bound_contextvars(run_id=run.run_id):
        return _run(run, config, counter, runner, hooks)


def _validation_text(hooks: ReleaseHooks, report: Any, run: PrivateRun) -> str:
    if hooks.validation_text is not None:
        return hooks.validation_text(report, run)
    return report.to_text() + f"\nreport: {run.report_dir}"


def _run(run: PrivateRun, config: "PHSafeConfig", counter: Counter, runner: StageRunner,
         hooks: ReleaseHooks) -> RunResult:
    """The stages, in order; on a failure, what the ledger must record and the operator be told."""
    parameters = run.parameters
    plan: "RunPlan | None" = None
    attempt: LedgerAttempt | None = None
    try:
        plan = runner.run(PLAN, engine.plan_private_run, config)
        run = runner.run(PREFLIGHT, _preflight, run, config, plan)
        counting = VALIDATE_AND_COUNT if parameters.validate_inputs else replace(VALIDATE_AND_COUNT, title="count")
        counts, report = runner.run(counting, counter, run, config, runner.timer, inline=counter.orchestrates)
        if report is not None and hooks.validated is not None:
            hooks.validated(run, "input", report)
        if counts is None:  # validation failed: nothing spent
            raise ValidationFailed("input", _validation_text(hooks, report, run), report)
        # CSV inputs were hashed as they were read: the digests of the very bytes counted.
        digests = runner.run(DIGEST_INPUTS, engine.fingerprint_inputs, run.data_dir, counts.input_digests)
        interrupt.spending()  # from here on a stop request waits for the next safe point
        attempt = runner.run(OPEN_LEDGER_RUN, _open_ledger_run, run, plan, digests, counts)
        outcomes = [o for found in runner.map(MEASURE, _measure, list(TABLES), run, plan, counts, attempt,
                                              total=len(plan.measurements)) for o in found]
        del counts
        interrupt.check()
        files = runner.run(WRITE_TABLES, engine.write_private_outputs, run, config, plan)
        if parameters.validate_outputs:
            report = runner.run(VALIDATE_OUTPUTS, engine.check_outputs, run, config)
            if hooks.validated is not None:
                hooks.validated(run, "output", report)
            if not report.ok:
                raise ValidationFailed("output", _validation_text(hooks, report, run), report)
        interrupt.check()
        checkpoint = runner.run(PUBLISH, engine.publish_private_run, run, config, plan, files, attempt)
    except BaseException as exc:
        # An attempt the ledger opened, though opening raised (its public log could not follow).
        attempt = attempt or getattr(exc, "opened_attempt", None)
        if attempt is not None and plan is not None:
            status = runner.run(RECORD_FAILURE, engine.record_failure, run, plan, attempt, engine.failure_reason(exc),
                                engine.failure_code(exc))
            if status.spent:
                log.debug("run failed after spending; its committed measurements are kept for a resume",
                          run_id=run.run_id, run_dir=str(run.run_dir))
        else:  # before the ledger run opened: a resumed run may have spent in earlier attempts; a
            # new run has not (no measurement starts before it opens), whatever the ledger's state
            status = engine.spend_status(run) if run.resume else SpendStatus(run.run_id)
        failed = _failure(exc, run, status)
        if hooks.ended is not None:
            hooks.ended(run, plan, None, failed)
        if failed is exc:
            raise
        raise failed from exc
    timings = dict(runner.timer.timings) if runner.timer is not None else {}
    result = RunResult(run.run_id, run.output_dir, files, plan, timings, run.ledger, run.run_dir, outcomes,
                       checkpoint, attempt.attempt, budget=engine.dataset_budget(run))
    if hooks.ended is not None:
        hooks.ended(run, plan, result, None)
    return result


def _preflight(run: PrivateRun, config: "PHSafeConfig", plan: "RunPlan") -> PrivateRun:
    """Everything the run needs later, checked before any spend; the run with its truncation key.
    Last, a new run on the very files a run of its dataset released is refused before the input
    pass (:func:`refuse_released_bytes`)."""
    checked = engine.preflight(run, config, plan).run
    refuse_released_bytes(checked, plan)
    return checked


def refuse_released_bytes(run: PrivateRun, plan: "RunPlan") -> None:
    """Refuse a new run whose input files and config are byte for byte those of a run of the
    same dataset that released them (or is releasing them) -- with the very refusal the ledger
    gives when the run opens (a content version is released once) -- before the input pass.

    The ledger tells content versions apart by the records' content fingerprint, which only the
    input pass computes: without this check a second trigger of a release reads, validates and
    counts every input before it is refused. The same bytes under the same config are the same
    tabulated records, so they have the fingerprint that run recorded (under the same ledger's
    key) -- and if a later version of the fingerprint ever disagreed, refusing the same bytes
    again would still be right. The check is only ever a refusal: files that differ from every
    earlier run's, or any case it does not cover (a resume, a declared re-release, a cap raise,
    a non-confidential ledger, a closed dataset, an Infinity budget), go on to the pass, and the
    ledger's own check when the run opens stays the authority. The input digests are
    confidential lineage: compared here, never shown; the message is the ledger's.

    Files are hashed only when a run of the dataset with the same config and the same input
    names claims a release, smallest input first, and no further once no such run matches.
    """
    parameters = run.parameters
    if run.resume or parameters.re_release or parameters.lifetime_cap is not None:
        return
    from phsafe.amounts import is_infinite

    if is_infinite(plan.total):
        return
    ledger = engine.open_ledger(run.ledger)
    with ledger.locked(lagging=True) as state:  # caught up with the file; the files are hashed outside the lock
        policy = state.policy
    if (policy is None or policy.non_confidential or bool(parameters.non_confidential) != policy.non_confidential
            or state.dataset_refusal(run.dataset) is not None):
        return
    from phsafe.reader import input_digests, locate_inputs

    inputs = locate_inputs(run.data_dir)
    names = {f.name for f in inputs.values()}
    candidates = [r for r in state.runs.values()
                  if r.dataset == run.dataset and r.fingerprint is not None and r.claims_release
                  and r.config_digest == run.config_sha256 and set(r.input_digests) == names]
    if not candidates:
        return
    def size(stem: str) -> int:
        return sum(os.path.getsize(p) for p in inputs[stem].files)

    for stem in sorted(inputs, key=size):
        ((name, digest),) = input_digests({stem: inputs[stem]}).items()
        candidates = [r for r in candidates if r.input_digests[name] == digest]
        if not candidates:
            return
    from phsafe.errors import LedgerError, LedgerRuleViolation
    from phsafe.ledger.runs import explain

    with ledger.locked(lagging=True) as state:  # the claims as they are now (an open run may have failed since)
        claims = state.release_claims(run.dataset, candidates[0].fingerprint or "")
    if not claims:
        return
    violation = LedgerRuleViolation("these records are a content version another run claims", rule="release-claimed",
                                    other=claims[0].run_id)
    log.info("refused before the input pass: the inputs are the files of a run that claims their release",
             other_run=claims[0].run_id)
    raise explain(LedgerError(str(violation), violation=violation), state, run_id=run.run_id)


def _open_ledger_run(run: PrivateRun, plan: "RunPlan", digests: dict[str, str], counts: ExactCounts) -> LedgerAttempt:
    """Start the run in the ledger (dataset, content version, one release per version, lifetime
    cap) or resume it; what earlier attempts committed."""
    return engine.open_run_in_ledger(run, plan, digests, engine.content_fingerprint(run, counts),
                                     engine.records_sketch(run, counts))
