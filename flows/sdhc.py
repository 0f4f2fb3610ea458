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
  spend, whatever room the cap leaves, unless ``re_release`` declares a re-release;
* ``resume`` resumes a named run by hand.

The flows' parameters are the fields of :class:`phsafe.parameters.PrivateRunParameters` (where
each is typed, defaulted and described once, for the command line too), made into the flows'
signatures below: flat and typed, as the UI's form and ``--param name=value`` take them, and
named as ``phsafe private`` names them (``--new-version``: ``new_version``). A run given a
former name (``new_version_reason``, ...) is refused in one line naming the new one.

A refusal ends the flow run Failed with one message -- what is wrong, and either "No
privacy-loss budget was spent." or how many spends the ledger records and that a Retry resumes
the run -- with no traceback (a refusal is not a bug) and nothing persisted: the flows return
their final state instead of raising (Prefect writes a raised exception to result storage).
What a flow run needs before its first log line -- the ledger it names, and the confidential
log file beside it (or ``log_file``) -- is checked first, so that even a mistyped ledger path
ends in that one message.

**Stopping.** SIGTERM or SIGINT to the flow run's process (the worker stopped by systemd or from
a shell, a host shutting down) stops the run as ``phsafe private`` stops: at once before it can
spend; once it can, at the next safe point -- no INTENT after the request, a measurement whose
spend is recorded drawn and committed first (:mod:`phsafe.interrupt`). The ledger records the
run failed, "stopped by a signal"; the flow run ends Failed saying so, and a Retry resumes it
with every committed measurement reused. The release does not start Puerto Rico once a stop was
requested during the US run.

Nothing computed from the confidential records goes to Prefect: the run logs there carry stage
names and outcomes, budgets and public domain sizes (:mod:`flows._logging`); timings, memory and
sizes stay in the confidential log file.
"""

from __future__ import annotations

import contextvars
import inspect
import textwrap
import warnings
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import structlog
from prefect import Flow
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.states import Failed, State

from flows._ended import END_HOOKS
from flows._logging import configure_once
from phsafe import engine, interrupt, logs
from phsafe.config import PHSafeConfig
from phsafe.errors import ConfigError, PHSafeError, cause_in_words
from phsafe.ledger import Orchestration, check_ledger_file
from phsafe.parameters import (
    PositiveCount, PrivateRunParameters, describe, flow_parameters, flow_spelling, front_end, on_flows,
    refuse_former_names,
)
from phsafe.sequence import LocalCounter, ReleaseHooks, run_release
from tasks import artifacts
from tasks._format import decimal_text
from tasks.pipeline import PrefectStages

log = structlog.get_logger("flows.sdhc")

PUERTO_RICO = "72"

__all__ = ["us_flow", "pr_flow", "release_flow", "run_dataset", "failure_message", "PositiveCount"]

_RELEASE_PARAMETERS: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "phsafe_release_parameters", default=None)
"""Set by the release flow: its subflows' refusals name the release deployment's parameters."""


def _scheduled_start() -> datetime:
    when = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    return when.astimezone(timezone.utc)


def flow_run_name(label: str):
    """Flow run names that say what they are: ``us-2026-11-21T02:00Z``."""
    def name() -> str:
        return f"{label}-{_scheduled_start():%Y-%m-%dT%H:%MZ}"
    return name


def run_id_for(label: str) -> str:
    """The phsafe run id of a new run started by this flow run: ``us-20261121T0200Z-1a2b3c4d``."""
    return f"{label}-{_scheduled_start():%Y%m%dT%H%MZ}-{str(flow_run.id).split('-')[0]}"


def _orchestration() -> Orchestration:
    """This flow run (and its parent, for a subflow), as the ledger records it."""
    parent = flow_run.parent_flow_run_id
    return Orchestration(str(flow_run.id), str(parent) if parent else None)


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
    if isinstance(exc, (PHSafeError, interrupt.RunInterrupted)):
        text = str(exc)
    elif isinstance(exc, OSError):
        where = f" on {Path(exc.filename).name}" if getattr(exc, "filename", None) else ""
        text = f"operating-system error: {cause_in_words(exc)}{where}"
    else:  # a bug: its type, never its message (which may quote a value); frames are in the log file
        text = f"internal error: {type(exc).__name__} (its frames are in the run's log file)"
    status = getattr(exc, "spend_status", None)
    if status is None or not status.spent:
        return f"{text}\nNo privacy-loss budget was spent."
    if isinstance(exc, (PHSafeError, interrupt.RunInterrupted)):
        return text  # the sequence added what the ledger records and how to resume
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
    summary["attempt_spend"] = decimal_text(_attempt_spend(result)) if not result.already_published else None
    if budget is not None:
        summary.update(unit=budget.unit, run_charge=decimal_text(budget.run_charge),
                       dataset_spent=decimal_text(budget.spent), lifetime_cap=decimal_text(budget.cap),
                       left=decimal_text(budget.left))
    return summary


def _attempt_spend(result: engine.RunResult) -> Any:
    """What this attempt spent: the budgets of the measurements it recorded a spend for (all of
    them for a new run; only those drawn again for a resume; nothing for a retry of a run that
    had published)."""
    from phsafe.amounts import add_amounts

    spent: Any = Fraction(0)
    if result.plan is not None:
        recorded = {o.key for o in result.outcomes if o.status in ("drawn", "noiseless")}
        for m in result.plan.measurements:
            if m.key in recorded:
                spent = add_amounts(spent, m.budget)
    return spent


# --------------------------------------------------------------------------------------------
# The flows' parameters: the fields of phsafe.parameters.PrivateRunParameters, as flat typed
# parameters (Prefect builds each flow's parameter form and schema from its signature, so the UI
# and `prefect deployment run --param name=value` take them as before).
# --------------------------------------------------------------------------------------------


def _args_doc(parameters: list[inspect.Parameter], text: Callable[[str], str]) -> str:
    """A Google-style ``Args:`` section (Prefect shows it as the parameters' descriptions)."""
    lines = ["Args:"]
    for parameter in parameters:
        lines += textwrap.wrap(f"{parameter.name}: {text(parameter.name)}", 100, initial_indent="    ",
                               subsequent_indent="        ", break_on_hyphens=False)
    return "\n".join(lines) + "\n"


_FIELD_OF = {spelling.name or name: name for name, spelling in on_flows()}
"""Flow parameter name -> the field of PrivateRunParameters it is."""
_NOTES = {spelling.name or name: spelling.note for name, spelling in on_flows()}


def _description(parameter: str) -> str:
    return describe(_FIELD_OF[parameter], flow_spelling(), _NOTES[parameter])


DATASET_PARAMETERS = flow_parameters()
"""The parameters of the US and Puerto Rico flows, in order."""

# The flow parameter ``validate`` (``phsafe private --validate``) is a field of the model Prefect
# builds to validate a run's parameters, where pydantic notes that it shadows BaseModel.validate
# (deprecated, and not what Prefect calls): harmless, and not the operator's concern.
warnings.filterwarnings("ignore", message=r'Field name "validate" in ".*" shadows an attribute', category=UserWarning)


class _Flow(Flow):
    """A flow whose runs given a former parameter name (``new_version_reason``: now
    ``new_version``) are refused in one line naming the new name, before anything runs
    (:func:`phsafe.parameters.refuse_former_names`) -- an old deployment's stored parameters, an
    old trigger. Prefect ends the run Failed with that line."""

    def validate_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        refuse_former_names(parameters)
        return super().validate_parameters(parameters)
_DATASET_PARAMETER_NAMES = frozenset(p.name for p in DATASET_PARAMETERS)


def run_dataset(label: str, values: dict[str, Any]) -> dict[str, Any] | State:
    """The body of the US and Puerto Rico flows (``label`` is ``us`` or ``pr``): the release
    sequence with Prefect tasks; its summary, or a Failed state with one message.

    Args:
        values: The flow run's parameters (see :data:`DATASET_PARAMETERS`).
    """
    configure_once(None)
    known = _RELEASE_PARAMETERS.get() or _DATASET_PARAMETER_NAMES
    with front_end("flow", known), structlog.contextvars.bound_contextvars(flow_run_id=str(flow_run.id),
                                                                          dataset=label):
        try:
            given, log_file = _flow_preflight(values)
        except Exception as refused:  # noqa: BLE001 -- before the log file: one line, nothing else anywhere
            return _failed(refused)
        with logs.log_to(log_file), interrupt.stop_at_safe_points(on_request=_stop_requested):
            return _run_dataset(label, given)


def check_deployed_version() -> None:
    """Say so, in one line, when the code runs a version other than the one its deployment was
    made with (the checkout changed after the deploy step); runs record the version they run."""
    from prefect.runtime import deployment

    from phsafe.provenance import code_version

    try:
        deployed = deployment.version
    except Exception:  # noqa: BLE001 -- no deployment (a subflow, a flow called directly): nothing to compare
        return
    running = code_version()
    if deployed and deployed != running:
        log.warning(f"this code is {running}, not the {deployed} the deployment was made with: the checkout changed "
                    "after the deploy step; runs record what runs -- re-run the deploy step")


def _flow_preflight(values: dict[str, Any]) -> tuple[PrivateRunParameters, Path]:
    """What the flow run needs before it writes anything: the ledger it names (a confidential
    run's is never created here) and a writable confidential log file (``log_file``, or
    ``phsafe-log.jsonl`` beside the ledger) -- in that order, so that a mistyped ledger path is
    refused as such, not as a log file that cannot be created at the root of the disk.

    Raises:
        PHSafeError: One line; nothing was written.
    """
    given = PrivateRunParameters.from_flow(values)
    assert given.ledger is not None and given.output_root is not None  # required flow parameters
    ledger_path = given.ledger.absolute()
    given = given.model_copy(update={"ledger": ledger_path})
    if not given.non_confidential:  # a non-confidential run may get a throwaway ledger in preflight
        check_ledger_file(ledger_path)
    log_file = (given.log_file or ledger_path.parent / logs.LOG_FILE_NAME).absolute()
    try:
        logs.check_log_file(log_file, "the confidential log file")
    except PHSafeError as refused:
        raise PHSafeError(f"{refused} (the flow parameter log_file names another)") from None
    return given, log_file


def _stop_requested(signal_name: str) -> None:
    """Said once in the run's logs (the flow run's and the confidential file) when a stop is asked."""
    log.warning("stop requested by a signal: the run stops at its next safe point, no new spend starts",
                signal=signal_name)


def _failed(exc: BaseException) -> State:
    """The flow run's end on a failure: one line in its log, the whole message in its state."""
    if not isinstance(exc, (PHSafeError, interrupt.RunInterrupted)):
        from phsafe.logs import crash_frames

        log.error("flow run failed", error_type=type(exc).__name__, frames=crash_frames(exc))
    message = failure_message(exc)
    get_run_logger().error(message.splitlines()[0])
    return Failed(message=message)


def _run_dataset(label: str, given: PrivateRunParameters) -> dict[str, Any] | State:
    """The release sequence of one dataset, with the flow's log file and stop handling in place."""
    # Artifacts of runs on non-confidential (synthetic) data get keys of their own, so the
    # versions of `us-budget-spends` in the UI are those of runs on the real inputs only.
    shown = f"nonconfidential-{label}" if given.non_confidential else label
    assert given.output_root is not None
    try:
        check_deployed_version()
        interrupt.check()  # a stop requested before this run began (during the release's US run)
        root = given.output_root.absolute()
        root.mkdir(parents=True, exist_ok=True)  # the release area: each run publishes a folder in it
        counter: Any = LocalCounter()
        if given.counting == "dask":
            from flows.counting import DaskCounter

            counter = DaskCounter(given.dask_address, given.dask_workers, given.partition_persons)
        result = run_release(given.model_copy(update={"output_root": root}), runner=PrefectStages(),
                             hooks=_Shown(label, shown), orchestration=_orchestration(),
                             counter=counter, new_run_id=run_id_for(label))
    except (Exception, interrupt.RunInterrupted) as exc:  # noqa: BLE001 -- the state says why
        return _failed(exc)
    summary = _summary(result)
    if result.already_published:
        get_run_logger().info(f"run {result.run_id} already published its release to {result.output_dir}; "
                              "nothing to do (a retry of a completed run)")
    log.info("run published", **{k: v for k, v in summary.items() if k != "measurements"})
    return summary


def _dataset_flow(label: str, summary: str) -> Flow:
    """The flow of one dataset: :func:`run_dataset` with the parameters of :data:`DATASET_PARAMETERS`."""

    def dataset_flow(**parameters: Any) -> dict[str, Any] | State:
        return run_dataset(label, parameters)

    dataset_flow.__name__ = dataset_flow.__qualname__ = f"{label}_flow"
    dataset_flow.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        DATASET_PARAMETERS, return_annotation=dict[str, Any] | State)
    dataset_flow.__doc__ = f"{summary}\n\n{_args_doc(DATASET_PARAMETERS, _description)}"
    return _Flow(dataset_flow, name=f"sdhc-{label}", flow_run_name=flow_run_name(label), retries=0,
                 validate_parameters=True, persist_result=False, **END_HOOKS)


us_flow = _dataset_flow("us", "S-DHC for the 50 states and DC: Nation and State levels.")
pr_flow = _dataset_flow("pr", "S-DHC for Puerto Rico: its own config, budget and ledger; no Nation level.")

_PER_DATASET = ("config", "data", "ledger")
_SHARED = ("output_root", "new_version", "re_release", "signing_key", "public_key", "validate_outputs",
           "non_confidential", "log_file")
RELEASE_PARAMETERS = [*flow_parameters(only=_PER_DATASET, prefix="us_"),
                      *flow_parameters(only=_PER_DATASET, prefix="pr_"),
                      *flow_parameters(only=_SHARED)]
"""The release flow's parameters: each dataset's config, data and ledger, then what both share."""
_RELEASE_PARAMETER_NAMES = frozenset(p.name for p in RELEASE_PARAMETERS)


def _release_description(parameter: str) -> str:
    for prefix, dataset in (("us_", "The US"), ("pr_", "Puerto Rico")):
        if parameter.startswith(prefix) and parameter.removeprefix(prefix) in _PER_DATASET:
            return f"{dataset}: {_description(parameter.removeprefix(prefix))}"
    return _description(parameter)


def release_flow(**parameters: Any) -> dict[str, Any] | State:
    """The release: the US and Puerto Rico flows as subflows, each with its own ledger and log.

    Both datasets run even if one fails; the release fails if either does. Each config names its
    dataset; ``new_version`` is recorded for either dataset whose records are new to it,
    ``re_release`` for either whose records were released before. A Retry of this flow
    run resumes what its subflows started (and does nothing for a dataset already published).
    """
    logger = get_run_logger()
    configure_once(None)
    check_deployed_version()
    shared = {name: value for name, value in parameters.items() if not name.startswith(("us_", "pr_"))}
    shared["output_root"] = str(Path(shared["output_root"]).absolute())
    token = _RELEASE_PARAMETERS.set(_RELEASE_PARAMETER_NAMES)
    messages: dict[str, str] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    try:
        # A stop requested during the US run stops it at a safe point (its subflow's block) and
        # Puerto Rico is then not started; a request here, between the two, is only recorded.
        with interrupt.stop_at_safe_points(at_once=False):
            for label, dataset_flow in (("us", us_flow), ("pr", pr_flow)):
                stopped = interrupt.requested()
                if stopped is not None:
                    messages[label] = (f"not started: {interrupt.STOPPED_BY_A_SIGNAL} ({stopped}) during the "
                                       "release; Retry the release to run it\nNo privacy-loss budget was spent.")
                    outcomes[label] = {"failed": messages[label].splitlines()[0]}
                    logger.error(f"{label}: {messages[label].splitlines()[0]}")
                    continue
                state = dataset_flow(**{name: parameters[f"{label}_{name}"] for name in _PER_DATASET},
                                     return_state=True, **shared)
                if state.is_completed():
                    outcomes[label] = o = state.result()
                    done = "was already published at" if o["already_published"] else "published to"
                    logger.info(f"{label}: run {o['run_id']} {done} {o['outputs']}; {_attempt_text(o)}; dataset "
                                f"{o['dataset']} has spent {o.get('dataset_spent')} of its cap "
                                f"{o.get('lifetime_cap')} ({o.get('unit')}), {o.get('left')} left")
                else:
                    reason = (state.message or state.type.value.lower()).strip()
                    messages[label] = reason
                    outcomes[label] = {"failed": reason.splitlines()[0][:300]}
                    logger.error(f"{label}: {state.type.value.lower()}: {reason.splitlines()[0][:300]}")
    finally:
        _RELEASE_PARAMETERS.reset(token)
    artifacts.release_summary(flow_run.name or "release", outcomes)
    failed = [label for label, o in outcomes.items() if "failed" in o]
    if failed:
        return Failed(message="release incomplete -- " + "\n".join(f"{label}: {messages[label]}" for label in failed))
    return outcomes


def _attempt_text(outcome: dict[str, Any]) -> str:
    """``this attempt spent 1.257281 (the run's charge 1.257281)`` or ``nothing spent by this attempt ...``."""
    spent = artifacts.attempt_spend_text(outcome)
    prefix = spent if spent.startswith("nothing") else f"this attempt spent {spent}"
    return f"{prefix} (the run's charge {outcome.get('run_charge')})"


release_flow.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    RELEASE_PARAMETERS, return_annotation=dict[str, Any] | State)
release_flow.__doc__ = f"{inspect.getdoc(release_flow)}\n\n{_args_doc(RELEASE_PARAMETERS, _release_description)}"
release_flow = _Flow(release_flow, name="sdhc-release", flow_run_name=flow_run_name("release"),  # type: ignore[assignment]
                     retries=0, validate_parameters=True, persist_result=False, **END_HOOKS)
