"""The stages of a private run, what a failure records, and the non-private run.

Their order is written once, in :mod:`phsafe.sequence` (:data:`~phsafe.sequence.SEQUENCE`), which
runs them for the command line in one process and for the flows as Prefect tasks. The rules they
keep, whatever the order they are called in: everything that can fail on bad input or a bad
setting fails before any budget is spent (:mod:`phsafe.preflight`, the validation); each
measurement is recorded in the ledger before its noise is drawn (:func:`phsafe.noise.measure`)
and its noisy vector stored in the run's work folder before it is committed; the release is
written from committed vectors only, renamed into place, and only then recorded
(``OUTPUTS_PUBLISHED``, ``RUN_FINISHED``); a failure after a spend can be completed without new
noise.

Two zones. The public release ``OUT`` holds the tables and what describes them (data package,
manifest, signed checkpoint, a keyed lineage commitment). Everything else -- the ledger and its
keys, the run's work folder (noisy vectors before publication, validation reports), logs -- is
confidential and lives beside the ledger: ``<ledger folder>/runs/<run id>/`` (or ``work_dir``).

The run's identity is :mod:`phsafe.private_run`'s (:class:`PrivateRun`, made from the operator's
:class:`~phsafe.parameters.PrivateRunParameters`); this module re-exports what its callers know
it by (``phsafe.engine.PrivateRun``).
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import structlog

from phsafe import durable, interrupt
from phsafe.accounting import PlannedMeasurement, RunPlan, plan_run
from phsafe.config import PHSafeConfig, check_budget_policy, read_config_file
from phsafe.counting import Counts
from phsafe.errors import LedgerError, OutputExistsError, PHSafeError, ValidationFailed, cause_in_words
from phsafe.parameters import option
from phsafe.intake import SPILL_FOLDER, check_pass_memory, exact_counts, validated_counts
from phsafe.iterations import GeographyLevel
from phsafe.logs import get_logger
from phsafe.noise import check_privacy_map, measure
from phsafe.outputs import (
    MANIFEST, Publication, nonprivate_tables, private_tables, publish_release, release_strays, write_tables,
)
from phsafe.preflight import Preflight, estimated_release_bytes, existing_release_of, preflight
from phsafe.private_run import (
    CHECKPOINT_FILE,
    DatasetBudget,
    MeasurementOutcome,
    LEDGER_ENV,
    NON_CONFIDENTIAL_DATASET,
    RUNS_DIR,
    PrivateRun,
    RunResult,
    StageTimer,
    begin_private_run,
    code_version,
    new_run_id,
    open_ledger,
    resolve_ledger,
)
from phsafe.amounts import amount_text
from phsafe.reader import file_digest, input_digests, locate_inputs
from phsafe.tables import DERIVED_TABLES, TABLES
from phsafe.tabulate import TableCounts

if TYPE_CHECKING:
    from phsafe.progress import Progress

__all__ = [
    # the run (phsafe.private_run) and its preflight (phsafe.preflight)
    "PrivateRun", "RunResult", "StageTimer", "begin_private_run", "resolve_ledger",
    "open_ledger", "new_run_id", "code_version", "LEDGER_ENV", "RUNS_DIR",
    "NON_CONFIDENTIAL_DATASET", "Preflight", "preflight", "estimated_release_bytes",
    # the stages
    "ExactCounts", "exact_vector", "check_inputs", "fingerprint_inputs", "validate_and_count", "count_exact",
    "plan_private_run", "content_fingerprint", "LedgerAttempt", "open_run_in_ledger", "recorder_for",
    "MeasurementOutcome", "measure_table", "write_private_outputs", "check_outputs", "public_manifest",
    "publish_private_run",
    # failures and what the ledger says
    "failure_reason", "failure_code", "SpendStatus", "spend_status", "record_failure", "with_resume_hint", "resume_hint",
    "DatasetBudget", "dataset_budget", "spend_summary", "ValidationFailed",
    # the non-private run
    "run_nonprivate",
    # finished runs stopped at their very end
    "FinishedRunTidied", "clean_finished_runs",
]

log = get_logger("phsafe.engine")


def exact_vector(m: PlannedMeasurement, counts: TableCounts) -> np.ndarray:
    """The exact count vector of ``m`` in domain order; the nation is the sum of the states."""
    cube = counts.by_level[m.level.iteration]
    if m.level.geography is GeographyLevel.USA:
        cube = cube.sum(axis=0, keepdims=True)
    vector = cube.reshape(-1)
    assert vector.size == m.n_cells, m.key
    return vector


class ExactCounts:
    """The exact (truncated) count cubes of a run and its content digest: confidential, kept in
    memory only.

    The wrapper exists so that nothing (a log line, a Prefect state, a traceback) ever prints
    the counts by accident: its ``repr`` names the tables only, and it cannot be pickled.
    """

    __slots__ = ("_counts",)

    def __init__(self, counts: Counts) -> None:
        self._counts = counts

    def __getitem__(self, table: str) -> TableCounts:
        return self._counts[table]

    @property
    def content(self):  # noqa: ANN201 -- phsafe.fingerprint.ContentDigest
        """The content digest of the tabulated records (see :mod:`phsafe.fingerprint`)."""
        return self._counts.content

    @property
    def input_digests(self) -> dict[str, str] | None:
        """The inputs' SHA-256, computed on the bytes the counts were read from (CSV inputs), or
        None (see :attr:`phsafe.counting.Counts.input_digests`)."""
        return self._counts.input_digests

    def __repr__(self) -> str:
        return f"ExactCounts(tables={sorted(self._counts)})"

    def __reduce__(self):  # never pickled: exact counts do not leave the process by accident
        raise TypeError("exact counts are confidential and are not serialized")


# --------------------------------------------------------------------------------------------
# Reading and counting
# --------------------------------------------------------------------------------------------


def check_inputs(run: PrivateRun):
    """Validate the config and inputs on their own (``phsafe validate``'s check); the report.
    A run validates and counts in one read instead: :func:`validate_and_count`."""
    from phsafe.intake import validate_inputs

    return validate_inputs(run.config_file, run.data_dir, report_dir=run.report_dir)


def fingerprint_inputs(data_dir: Path, read: dict[str, str] | None = None) -> dict[str, str]:
    """SHA-256 of every input file: confidential lineage, recorded only in the ledger.

    Args:
        read: The digests the input pass computed on the very bytes it counted
            (:attr:`ExactCounts.input_digests`: national CSV files are hashed as they are read);
            when given, the files are not read again.
    """
    if read is not None:
        return dict(read)
    return input_digests(locate_inputs(data_dir))


def validate_and_count(run: PrivateRun, stage: "StageTimer | None" = None):  # noqa: ANN201
    """Validate the inputs (unless the run skips it) and count every measured table exactly,
    truncated with the run's key -- one read of each input file
    (:func:`phsafe.intake.validated_counts`).

    Returns:
        ``(counts, report)``: the :class:`ExactCounts` (None if validation failed: the run must
        stop, nothing spent) and the validation report (None without validation).

    Raises:
        InputError: Without validation, an input breaks a rule the counting needs.
    """
    stage = stage or StageTimer(None)
    counts, report = validated_counts(run.config_file, run.data_dir, list(TABLES.values()),
                                      key=run.truncation_key, validate=run.parameters.validate_inputs,
                                      report_dir=run.report_dir, stage=stage, progress=stage.progress,
                                      memory_limit=run.parameters.memory_limit, spill_dir=run.run_dir / SPILL_FOLDER)
    return (ExactCounts(counts) if counts is not None else None), report


def count_exact(run: PrivateRun, config: PHSafeConfig, stage: "StageTimer | None" = None) -> ExactCounts:
    """Read, preprocess, truncate (with the run's key), join and count every measured table."""
    stage = stage or StageTimer(None)
    return ExactCounts(exact_counts(config, run.data_dir, list(TABLES.values()), key=run.truncation_key,
                                    stage=stage, progress=stage.progress, memory_limit=run.parameters.memory_limit,
                                    spill_dir=run.run_dir / SPILL_FOLDER))


def plan_private_run(config: PHSafeConfig) -> RunPlan:
    """Plan every measurement and cross-check each against OpenDP's privacy map."""
    plan = plan_run(config)
    for m in plan.measurements:
        check_privacy_map(m)
    log.info("plan", measurements=len(plan.measurements), total=amount_text(plan.total),
             cells=sum(m.n_cells for m in plan.measurements))
    return plan


def content_fingerprint(run: PrivateRun, counts: ExactCounts) -> str:
    """The records' content fingerprint, committed under the ledger's lineage key."""
    return counts.content.commit(open_ledger(run.ledger).lineage_key())


def records_sketch(run: PrivateRun, counts: ExactCounts) -> dict:
    """The keyed sketch of the records (:mod:`phsafe.overlap`), for the confidential ledger only."""
    from phsafe.overlap import keyed_sketch

    return keyed_sketch(counts.content, open_ledger(run.ledger).lineage_key())


# --------------------------------------------------------------------------------------------
# The ledger run and the measurements
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerAttempt:
    """This process's attempt at a run, as opened in the ledger.

    Attributes:
        attempt: 1 for a new run, 1 + the number of resumes otherwise. The ledger refuses
            records from an attempt that another resume has replaced.
        reusable: Measurement key -> the noisy-vector digest recorded at COMMITTED, for the
            measurements earlier attempts committed (empty for a new run).
    """

    attempt: int
    reusable: dict[str, str]


def open_run_in_ledger(run: PrivateRun, plan: RunPlan, input_digests_: dict[str, str], fingerprint: str,
                       sketch: dict | None = None) -> LedgerAttempt:
    """Start the run in the ledger (dataset, version and lifetime cap checked under the lock),
    or resume it.

    Raises:
        BudgetError: The dataset's lifetime cap does not admit the run, or the records are a
            content version the operator has not declared.
        LedgerError: The run cannot be resumed (finished, other records, ...).
    """
    from phsafe.ledger import FollowerUnwritable

    try:
        return _open_run(run, plan, input_digests_, fingerprint, sketch)
    except FollowerUnwritable as exc:
        # The ledger recorded the start (or the resume) and its public log could not follow: the
        # attempt is open, and its failure must be recorded like any other (RUN_FAILED).
        for entry in exc.appended:
            if entry["run_id"] == run.run_id and entry["kind"] in ("RUN_STARTED", "RUN_RESUMED"):
                state = open_ledger(run.ledger).run(run.run_id, lagging=True)
                if state is not None:
                    exc.opened_attempt = LedgerAttempt(state.attempt, dict(state.reusable))  # type: ignore[attr-defined]
        raise


def _open_run(run: PrivateRun, plan: RunPlan, input_digests_: dict[str, str], fingerprint: str,
              sketch: dict | None) -> LedgerAttempt:
    ledger = open_ledger(run.ledger)
    parameters = run.parameters
    cap_raise = (parameters.lifetime_cap, parameters.cap_reason) if parameters.lifetime_cap is not None else None
    if not run.resume:
        new_version = parameters.new_version
        if new_version is None and parameters.non_confidential:
            new_version = "non-confidential data: content version declared automatically"
        ledger.start_run(
            run_id=run.run_id, plan=plan, dataset=run.dataset, fingerprint=fingerprint,
            config_digest=run.config_sha256, input_digests=input_digests_, code_version=run.code_version,
            truncation_key_hex=run.truncation_key.hex(), non_confidential=parameters.non_confidential,
            validated=parameters.validate_inputs, new_version=new_version, cap_raise=cap_raise,
            re_release=parameters.re_release, orchestration=run.orchestration, sketch=sketch,
            overlap_reason=parameters.overlap_reason,
        )
        return LedgerAttempt(1, {})
    recorder = ledger.resume_run(
        run.run_id, config_digest=run.config_sha256, dataset=run.dataset, fingerprint=fingerprint,
        code_version=run.code_version, reason=parameters.resume_reason or "resumed by the operator",
        cap_raise=cap_raise,
        plan=plan,  # the ledger refuses a resume whose plan differs from the recorded one
        re_release=parameters.re_release, orchestration=run.orchestration,
    )
    state = ledger.run(run.run_id)
    assert state is not None
    log.info("run resumed", run_id=run.run_id, attempt=recorder.attempt, reusable=len(state.reusable))
    return LedgerAttempt(recorder.attempt, dict(state.reusable))


def recorder_for(run: PrivateRun, plan: RunPlan, attempt: LedgerAttempt):
    """A spend recorder for this attempt of the run (each caller gets its own ledger handle)."""
    from phsafe.ledger import RunRecorder

    # A stop request is checked under the ledger's lock right before each INTENT: none follows it.
    return RunRecorder(open_ledger(run.ledger), run.run_id, plan, attempt=attempt.attempt,
                       before_spend=interrupt.check)


def measure_table(
    run: PrivateRun,
    plan: RunPlan,
    table: str,
    counts: ExactCounts,
    attempt: LedgerAttempt,
    *,
    done: Callable[[str], None] | None = None,
) -> list[MeasurementOutcome]:
    """Measure every level of ``table``: reuse what an earlier attempt committed, draw the rest.

    A committed measurement whose stored vector is intact is read back, never re-drawn. Anything
    else goes through :func:`phsafe.noise.measure`: the spend is recorded before the draw, and
    the noisy vector is stored before the spend is marked committed.

    Args:
        done: Called with each measurement's key once it is committed (progress).
    """
    store = run.store
    recorder = recorder_for(run, plan, attempt)
    reusable = attempt.reusable
    outcomes = []
    for m in plan.for_table(table):
        interrupt.check()  # a safe point: a stop request never lets another spend begin
        with structlog.contextvars.bound_contextvars(table=m.table, level=m.level.config_key):
            status = "noiseless" if m.is_noiseless else "drawn"
            if m.key in reusable and store.load(m.key, reusable[m.key], m.n_cells) is not None:
                status = "reused"
            else:
                if m.key in reusable:
                    log.warning("committed measurement lost; measuring again is a new spend", measurement=m.key)
                measure(m, exact_vector(m, counts[m.table]), recorder,
                        keep=lambda vector, key=m.key: store.save(key, vector))
            log.info("measurement", measurement=m.key, status=status, cells=m.n_cells)
            if done is not None:
                done(m.key)
            outcomes.append(MeasurementOutcome(
                key=m.key, table=m.table, level=m.level.config_key, status=status,
                privacy_defn=m.privacy_defn.value, budget=amount_text(m.budget), sensitivity=m.sensitivity,
                variance=m.variance, moe90=m.moe90, cells=m.n_cells,
            ))
    return outcomes


# --------------------------------------------------------------------------------------------
# The release
# --------------------------------------------------------------------------------------------


def write_private_outputs(run: PrivateRun, config: PHSafeConfig, plan: RunPlan) -> dict[str, str]:
    """Derive PH5_num and PH8_num, attach variances and write the release's tables into the
    run's work folder (``release/``), from the committed noisy vectors.

    Returns:
        Relative path -> SHA-256 of every file written.
    """
    state = open_ledger(run.ledger).run(run.run_id)
    if state is None:
        raise PHSafeError(f"run {run.run_id} is not in the ledger")
    store = run.store
    noisy: dict[str, np.ndarray] = {}
    for m in plan.measurements:
        digest = state.reusable.get(m.key)
        vector = store.load(m.key, digest, m.n_cells) if digest else None
        if vector is None:
            raise PHSafeError(f"{m.key} has no committed noisy vector; the run cannot be written")
        noisy[m.key] = vector
    frames = private_tables(config, plan, noisy)
    shutil.rmtree(run.release_dir, ignore_errors=True)  # an earlier attempt's, rewritten identically
    run.release_dir.mkdir(parents=True)
    return write_tables(frames, run.release_dir, plan=plan)


def check_outputs(run: PrivateRun, config: PHSafeConfig):
    """Validate the release's tables (Great Expectations); the report."""
    from phsafe.validation import validate_outputs

    return validate_outputs(config, run.release_dir, report_dir=run.report_dir)


def public_manifest(run: PrivateRun, config: PHSafeConfig, plan: RunPlan, file_digests: dict[str, str],
                    checkpoint: dict) -> dict:
    """The release's manifest: public facts only.

    The plan (budgets as decimals, sensitivities, variances, cells), the config's public settings,
    the code version, the dataset name, the table files' digests, the signed ledger checkpoint,
    and the keyed lineage commitment (:func:`phsafe.ledger.lineage_commitment`). No digest of an
    input, no fingerprint, no path of the confidential zone: nothing here is a function of the
    confidential records but through the noisy tables.
    """
    from phsafe.ledger import lineage_commitment

    ledger = open_ledger(run.ledger)
    recorded = ledger.run(run.run_id)
    assert recorded is not None
    return {
        "run_id": run.run_id,
        "mode": "private",
        "dataset": run.dataset,
        "privacy_defn": config.privacy_defn.value,
        "total_budget": amount_text(plan.total),
        "non_confidential": run.parameters.non_confidential,
        "config": {"state_filter": list(config.state_filter), "tau": dict(config.tau),
                   "sensitivity": config.sensitivity.value},
        "measurements": [
            {"table": m.table, "level": m.level.config_key, "budget": amount_text(m.budget),
             "sensitivity": m.sensitivity, "variance": m.variance, "moe90": m.moe90, "cells": m.n_cells,
             "noise": m.distribution.value}
            for m in plan.measurements
        ],
        "code_version": run.code_version,
        "lineage": {
            "commitment": lineage_commitment(ledger.lineage_key(), recorded),
            "algorithm": "HMAC-SHA256 under the ledger's lineage key (held by the auditors, never published)",
        },
        "checkpoint": checkpoint,
        "files": file_digests,
    }


def publish_private_run(
    run: PrivateRun,
    config: PHSafeConfig,
    plan: RunPlan,
    file_digests: dict[str, str],
    attempt: LedgerAttempt,
) -> dict:
    """Publish the release, then record it: the order that keeps the ledger truthful.

    Signs a checkpoint of the ledger (every spend of the run is in it), writes the public
    manifest into the release, copies the release beside the output folder, fsyncs it and
    renames it into place -- and only then records ``OUTPUTS_PUBLISHED`` and ``RUN_FINISHED``.
    Writes the final signed checkpoint into the run's work folder and removes the noisy vectors
    there. If the output folder already holds this run's release (an earlier attempt published
    it and stopped before recording), the release is checked against what the run would write
    and only recorded.

    Returns:
        The checkpoint published in the manifest (signed if the parameters name a signing key).

    Raises:
        PHSafeError: The output folder exists (not this run's), the copy or rename failed (no
            space, permissions): nothing is recorded and the run can be resumed, drawing nothing.
    """
    from phsafe.ledger import load_signing_key

    parameters = run.parameters
    signing_key = load_signing_key(parameters.signing_key, parameters.public_key) if parameters.signing_key else None
    recorder = recorder_for(run, plan, attempt)
    release_files = dict(file_digests)
    if run.output_dir.exists() and existing_release_of(run):
        published = _check_existing_release(run, file_digests)
        checkpoint = published["checkpoint"]
        release_files[MANIFEST] = file_digest(run.output_dir / MANIFEST)
        log.info("the release was already in place; recording its publication", output=str(run.output_dir))
    else:
        checkpoint = recorder.checkpoint(signing_key)
        manifest = public_manifest(run, config, plan, file_digests, checkpoint)
        release_files[MANIFEST] = publish_release(run.release_dir, run.output_dir, run.run_id, manifest)
    recorder.record_published(release_files, run.output_dir)
    write_release_log_files(recorder.ledger, run.run_id, run.output_dir)
    final = recorder.checkpoint(signing_key)
    durable.replace(run.run_dir / CHECKPOINT_FILE, (json.dumps(final, indent=2, sort_keys=True) + "\n").encode(),
                    mode=0o600)
    # What the finished run no longer needs, removed durably; a stop before this leaves them to
    # `phsafe audit verify` (reported) and `phsafe ledger clean-finished` (removed).
    from phsafe.leftovers import leftovers_of, remove_leftovers

    try:
        remove_leftovers(leftovers_of(run.ledger, run.run_id, run.output_dir, run.parameters.work_dir), run.output_dir)
    except OSError as exc:  # the release is published and recorded: the run succeeded all the same
        log.warning("the finished run's work folder could not be cleaned; `phsafe ledger clean-finished` removes "
                    "what is left", run_dir=str(run.run_dir), error=cause_in_words(exc))
    log.info("published", run_id=run.run_id, output=str(run.output_dir), files=len(release_files))
    return checkpoint


def write_release_log_files(ledger: Any, run_id: str, output_dir: Path) -> bool:
    """Give a recorded release its public log files (:data:`phsafe.publog.RELEASE_LOG_FILES`).

    Written into the published folder once the ledger -- and so the public log -- records the
    release: the exact bytes of the run's ``release`` entry and its ``privacy-loss.tlog-proof``
    against the log's checkpoint, cosigned by the ledger's witness quorum when it has witnesses.
    Returns False for a ledger without a public log (nothing to write).
    """
    from phsafe.publog import write_release_log_files as write

    if not write(ledger, run_id, output_dir):
        return False
    log.info("the release's public log entry and proof are in place", output=str(output_dir))
    return True


def _check_existing_release(run: PrivateRun, file_digests: dict[str, str]) -> dict:
    """The manifest of this run's release already in ``output_dir``, if its files are exactly
    what the run writes now (same digests); else an error."""
    manifest = json.loads((run.output_dir / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("files") != file_digests:
        raise OutputExistsError(f"{run.output_dir} holds a release of run {run.run_id} whose files differ from "
                                f"what it writes now; choose a new output folder ({option('output')})")
    for rel, digest in file_digests.items():
        path = run.output_dir / rel
        if not path.is_file() or file_digest(path) != digest:
            raise OutputExistsError(f"{run.output_dir} holds an incomplete release of run {run.run_id} ({rel}); "
                                    f"choose a new output folder ({option('output')})")
    # The same check as a first publish (only tables, data package and manifest), and nothing
    # beside what this run wrote: a file planted in the folder is never recorded as released.
    stray = release_strays(run.output_dir, set(file_digests) | {MANIFEST})
    if stray:
        raise OutputExistsError(f"{run.output_dir} holds {stray}, which is not part of run {run.run_id}'s release: "
                                "the release was not recorded; remove what is not the release from the folder, "
                                f"or remove the folder, and resume (or choose a new output folder, {option('output')})")
    return manifest


def failure_reason(exc: BaseException) -> str:
    """A short, value-free reason for the ledger: our own error's first line, else the class."""
    if isinstance(exc, (PHSafeError, interrupt.RunInterrupted)):
        return (str(exc).splitlines() or [""])[0][:200] or type(exc).__name__
    return cause_in_words(exc)


def failure_code(exc: BaseException) -> str:
    """The public kind of a failure (:data:`phsafe.ledger.FAILURE_CODES`): the public log gets it
    instead of the message, which may name the enclave's folders. The first kind that matches,
    in order: a witness refusal is a refusal, and a refusal is a PHSafeError."""
    from phsafe.errors import BudgetError, ForkRefused, OutputExistsError, ValidationFailed, WitnessesUnavailable
    from phsafe.ledger import FollowerUnwritable

    kinds: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
        ((interrupt.RunInterrupted, KeyboardInterrupt), "interrupted"),
        (WitnessesUnavailable, "witness-unreachable"),
        (ForkRefused, "witness-refused"),
        (BudgetError, "budget-refused"),
        (FollowerUnwritable, "storage-error"),  # the public log's file system refused a write
        (LedgerError, "ledger-error"),
        (ValidationFailed, "outputs-invalid"),
        (OutputExistsError, "output-exists"),
        (OSError, "storage-error"),
        (PHSafeError, "refused"),
    )
    return next((code for kind, code in kinds if isinstance(exc, kind)), "internal-error")


@dataclass(frozen=True)
class SpendStatus:
    """What a failed attempt leaves in the ledger, for the operator's message.

    Attributes:
        run_id: The run.
        intents: INTENT entries the run has recorded over all its attempts (spends).
        committed: Measurements whose noisy vector is committed (reused by a resume).
        known: False when the ledger could not be read: the run may have spent.
        finished: The run finished (published, recorded): nothing is left to complete, so a
            failure of this attempt (a refused resume) gets no hint to resume it.
    """

    run_id: str
    intents: int = 0
    committed: int = 0
    known: bool = True
    finished: bool = False

    @property
    def spent(self) -> bool:
        return self.intents > 0 or not self.known


def spend_status(run: PrivateRun) -> SpendStatus:
    """How many spends the ledger records for ``run`` now (nothing if it never started)."""
    try:
        state = open_ledger(run.ledger).run(run.run_id) if run.ledger.is_file() else None
    except LedgerError:
        return SpendStatus(run.run_id, known=False)
    if state is None:
        return SpendStatus(run.run_id)
    from phsafe.ledger import RunStatus

    return SpendStatus(run.run_id, sum(len(seqs) for seqs in state.intents.values()), len(state.reusable),
                       finished=state.status is RunStatus.FINISHED)


def record_failure(run: PrivateRun, plan: RunPlan, attempt: LedgerAttempt | None, reason: str,
                   code: str = "internal-error") -> SpendStatus:
    """Mark the run failed in the ledger (unless it finished), if the ledger can still be written.

    The run's work folder is kept: it holds the validation reports, and the committed noisy
    vectors that let a resume complete the run without drawing them again. A partial copy of the
    release beside the output folder is removed.

    Returns:
        What the run has spent (``.spent``: it can be resumed from its committed measurements).
    """
    from phsafe.ledger import RunStatus

    for partial in run.output_dir.parent.glob(f".{run.output_dir.name}.partial-{run.run_id}"):
        shutil.rmtree(partial, ignore_errors=True)
    try:
        state = open_ledger(run.ledger).run(run.run_id, lagging=True)
    except LedgerError as exc:  # e.g. a full disk: the run stays "running" (resumable) in the ledger
        log.debug("could not read the ledger to record the failure", error=str(exc).splitlines()[0])
        return SpendStatus(run.run_id, known=False)
    if state is None or state.status is RunStatus.FINISHED:  # never started: nothing spent
        return SpendStatus(run.run_id)
    if state.status is RunStatus.RUNNING and attempt is not None and state.attempt == attempt.attempt:
        try:
            recorder_for(run, plan, attempt).fail(reason, code)
        except LedgerError as exc:  # the failure being handled says why; the run stays resumable
            log.debug("could not record the failure in the ledger; the run stays open and can be resumed",
                      error=str(exc).splitlines()[0])
    return SpendStatus(run.run_id, sum(len(seqs) for seqs in state.intents.values()), len(state.reusable))


def with_resume_hint(exc: BaseException, run: PrivateRun, status: "SpendStatus | None" = None) -> BaseException:
    """``exc`` (one of ours) with how to complete the run that spent, or ``exc`` itself.

    The copy keeps the exception's type and attributes (a :class:`ValidationFailed` keeps its
    report); only its message grows."""
    if not isinstance(exc, PHSafeError):
        return exc
    hinted = copy.copy(exc)
    hinted.args = (f"{exc} -- {resume_hint(run, status)}",)
    return hinted


def resume_hint(run: PrivateRun, status: "SpendStatus | None" = None) -> str:
    """What the run left in the ledger, and how the operator completes it from where they ran it."""
    from phsafe.parameters import deployment_parameters, name_of

    if status is not None and status.known:
        recorded = f"{status.intents} spend(s) of run {run.run_id} are recorded in the ledger"
    else:
        recorded = f"run {run.run_id} spent budget"
    if option("resume_run_id").startswith("--"):
        return (f"{recorded}; complete it without drawing noise again: phsafe private CONFIG DATA OUT --ledger "
                f"{run.ledger} --resume {run.run_id} --resume-reason TEXT, with a new OUT if the old one is unusable")
    known, parameter = deployment_parameters(), name_of("resume_run_id")
    also = (f", or run the deployment with {parameter}={run.run_id}"
            if known is None or parameter in known else "")
    return (f"{recorded}; Retry this flow run to resume it (committed measurements are reused, not drawn "
            f"again){also}")


def run_nonprivate(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    *,
    non_confidential: bool = False,
    validate: bool = False,
    progress: "Progress | None" = None,
    memory_limit: int | None = None,
    work_dir: Path | None = None,
) -> RunResult:
    """Ground-truth tabulation for testing on synthetic data: no truncation, no noise.

    Args:
        non_confidential: Must be True: the data is declared synthetic or public. Exact counts
            of confidential data are never written.
        memory_limit: Bytes the input pass may use (see :class:`~phsafe.parameters.PrivateRunParameters`).
        work_dir: Where inputs too large for the limit are spilled (a private folder in it,
            removed at the end; default: the system's temporary folder).

    Raises:
        PHSafeError: The data is not declared non-confidential, or a bad config or input.
    """
    if not non_confidential:
        raise PHSafeError(
            "non-private tables are the exact counts, with no noise: they are for synthetic or public "
            f"data only. Declare that the data is not confidential with {option('non_confidential')}"
        )
    stage = StageTimer(progress)
    run_id = new_run_id()
    config_file = read_config_file(config_path)  # one read: the counting gets these bytes' parse
    config = config_file.model()
    check_budget_policy(config, non_confidential=True)
    output_dir = Path(output_dir).absolute()
    if output_dir.exists():
        raise OutputExistsError(f"output directory {output_dir} already exists; choose a new one")
    log.info("non-private run", run_id=run_id, config=str(config_path), data=str(data_dir),
             output=str(output_dir))
    specs = list(TABLES.values()) + [d.nonprivate for d in DERIVED_TABLES.values()]
    spill_dir = Path(work_dir).absolute() / f"spill-{run_id}" if work_dir is not None else None
    check_pass_memory(Path(data_dir), config.states, memory_limit=memory_limit, validate=validate,
                      spill_dir=spill_dir)
    with stage("validate and count" if validate else "count"):
        counts, report = validated_counts(config_file, Path(data_dir), specs, key=None, validate=validate,
                                          report_dir=output_dir.parent / f"{output_dir.name}-validation",
                                          stage=stage, progress=stage.progress, memory_limit=memory_limit,
                                          spill_dir=spill_dir)
    if counts is None:
        raise ValidationFailed("input", report.to_text())
    with stage("write outputs"):
        staging = Publication.begin(output_dir, run_id).staging
        try:
            file_digests = write_tables(nonprivate_tables(config, counts), staging)
            manifest = {"run_id": run_id, "mode": "non-private", "non_confidential": True,
                        "config": {"state_filter": list(config.state_filter)},
                        "code_version": code_version(), "files": file_digests}
            publish_release(staging, output_dir, run_id, manifest, move=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return RunResult(run_id, output_dir, file_digests, None, stage.timings)


def dataset_budget(run: PrivateRun) -> DatasetBudget | None:
    """The dataset's spent, cap and left as the ledger says now (None if the ledger is unreadable)."""
    try:
        state = open_ledger(run.ledger).state
        recorded = open_ledger(run.ledger).run(run.run_id)
    except LedgerError:
        return None
    if state.policy is None:
        return None
    unit = state.policy.privacy_defn
    return DatasetBudget(
        dataset=run.dataset, unit="rho" if unit.value == "zcdp" else "epsilon",
        spent=state.dataset_spent(run.dataset, unit), cap=state.dataset_cap(run.dataset),
        run_charge=recorded.charge(unit) if recorded is not None else Fraction(0),
        enforced=not state.policy.non_confidential,
    )


def spend_summary(run: PrivateRun, plan: RunPlan) -> list[dict[str, object]]:
    """One row per planned measurement, as the ledger records it: budget (a decimal), Δ, variance,
    MOE, cells, how many times it was spent and whether its release is committed. Value-free."""

    state = open_ledger(run.ledger).run(run.run_id)
    committed = state.reusable if state is not None else {}
    budget_name = "rho" if plan.privacy_defn.value == "zcdp" else "epsilon"
    rows: list[dict[str, object]] = []
    for m in plan.measurements:
        spends = len(state.intents.get(m.key, ())) if state is not None else 0
        rows.append({
            "table": m.table,
            "level": m.level.config_key,
            budget_name: amount_text(m.budget),
            "sensitivity": m.sensitivity,
            "variance": m.variance,
            "moe90": m.moe90,
            "cells": m.n_cells,
            "spends": spends,
            "status": "committed" if m.key in committed else ("spent, not committed" if spends else "not spent"),
        })
    return rows


@dataclass(frozen=True)
class FinishedRunTidied:
    """What :func:`clean_finished_runs` did for one finished run."""

    run_id: str
    wrote: tuple[str, ...]
    removed: str
    run_dir: Path


def clean_finished_runs(ledger_path: Path, run_ids: "list[str] | tuple[str, ...]" = (), *,
                        work_dir: Path | None = None) -> list[FinishedRunTidied]:
    """``phsafe ledger clean-finished``: complete what finished runs left undone when they were
    stopped at their very end, and nothing else.

    For every run named (default: every run the ledger says finished): its recorded release's
    public log files (:data:`phsafe.publog.RELEASE_LOG_FILES`) are written if they are missing
    and the release folder is reachable, and its work folder's leftovers
    (:mod:`phsafe.leftovers`: noisy vectors, the staged release, spill and temporary files) are
    removed durably. The published release, the validation reports and the final checkpoint are
    never touched.

    Raises:
        PHSafeError: A named run is not in the ledger, or has not finished (its work folder is
            what a resume completes it from): nothing is done for any run then.
        LedgerError: The ledger or its public log cannot be used (it says why).
    """
    from phsafe.leftovers import leftovers_of, remove_leftovers
    from phsafe.ledger import RunStatus
    from phsafe.publog import RELEASE_LOG_FILES

    ledger = open_ledger(Path(ledger_path))
    ledger_path = ledger.path
    with ledger.locked() as state:
        runs = [state.runs.get(run_id) for run_id in run_ids] if run_ids else \
            [r for r in state.runs.values() if r.status is RunStatus.FINISHED]
    for run_id, found in zip(run_ids, runs):
        if found is None:
            raise PHSafeError(f"run {run_id} is not in the ledger {ledger_path}; nothing was removed")
        if found.status is not RunStatus.FINISHED:
            raise PHSafeError(f"run {run_id} has not finished ({found.status.value}): its work folder is what a resume "
                              "completes it from, and is kept; nothing was removed")
    done = []
    for run in runs:
        assert run is not None
        wrote: tuple[str, ...] = ()
        place = Path(run.output_path) if run.output_path else None
        if place is not None and place.is_dir() and not all((place / n).is_file() for n in RELEASE_LOG_FILES):
            if write_release_log_files(ledger, run.run_id, place):
                wrote = RELEASE_LOG_FILES
        left = leftovers_of(ledger_path, run.run_id, run.output_path, work_dir)
        with ledger.locked():
            remove_leftovers(left, run.output_path)
        if wrote or left:
            done.append(FinishedRunTidied(run.run_id, wrote, left.describe(), left.run_dir))
    return done
