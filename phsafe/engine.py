"""The private and non-private runs, stage by stage.

Private run, in this order -- everything that can fail on bad input fails before any budget is
spent:

1. config, output directory check, optional input validation;
2. read, preprocess, truncate-join-count every table exactly (inconsistent codes stop the run);
3. plan every measurement (exact budgets) and cross-check each with OpenDP's privacy map;
4. open the audit ledger and start the run: the lifetime budget of the dataset is checked and the
   plan recorded under a lock;
5. for each measurement, :func:`phsafe.noise.measure` records the spend, then draws the noise;
6. write the tables into a staging directory, optionally validate them, record the output
   digests, finish the run, and publish by renaming the staging directory into place.
"""

from __future__ import annotations

import hashlib
import resource
import secrets
import shutil
import subprocess
import threading
from contextlib import contextmanager
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import structlog

import phsafe
from phsafe.accounting import PlannedMeasurement, RunPlan, plan_run
from phsafe.config import PHSafeConfig, load_config
from phsafe.counting import StageTimer, exact_counts
from phsafe.domain import measurement_domain
from phsafe.errors import BudgetError, PHSafeError
from phsafe.iterations import GeographyLevel
from phsafe.logs import get_logger
from phsafe.measurements import MEASUREMENTS_DIR, MeasurementStore
from phsafe.noise import check_privacy_map, measure
from phsafe.outputs import Publication, nonprivate_tables, private_tables, write_tables
from phsafe.reader import input_digests, locate_inputs
from phsafe.tables import DERIVED_TABLES, TABLES
from phsafe.tabulate import TableCounts
from phsafe.truncation import TRUNCATION_KEY_BYTES

log = get_logger("phsafe.engine")

DEFAULT_LEDGER = Path("phsafe-ledger") / "ledger.jsonl"


class ValidationFailed(PHSafeError):
    """Input or output validation found problems; the report says which."""

    def __init__(self, what: str, report_text: str) -> None:
        self.report_text = report_text
        super().__init__(f"{what} validation failed:\n{report_text}")


@dataclass(frozen=True)
class PrivateRunOptions:
    """Options of a private run.

    Attributes:
        ledger: Audit ledger path (JSON Lines); created if missing.
        lifetime_cap: Lifetime budget cap of the dataset (default: this run's planned total).
        cap_reason: Why the operator raised the cap (recorded in the ledger).
        signing_key: Ed25519 private key (PEM) that signs the ledger checkpoint.
        non_confidential: The data is synthetic/non-confidential (allows Infinity budgets).
        validate_inputs: Validate the inputs before anything else.
        validate_outputs: Validate the output tables before publishing them.
        report_dir: Where validation reports go (default: next to the output directory).
        truncation_key: Replay a run with its recorded key (hex); fresh random key otherwise.
        resume_reason: Why a failed run is resumed (recorded in the ledger).
    """

    ledger: Path = DEFAULT_LEDGER
    lifetime_cap: Fraction | None = None
    cap_reason: str | None = None
    signing_key: Path | None = None
    non_confidential: bool = False
    validate_inputs: bool = False
    validate_outputs: bool = False
    report_dir: Path | None = None
    truncation_key: str | None = None
    resume_reason: str | None = None


@dataclass
class RunResult:
    run_id: str
    output_dir: Path
    files: dict[str, str]
    plan: RunPlan | None = None
    timings: dict[str, float] = field(default_factory=dict)


_ledgers: dict[Path, tuple[tuple[int, int], "Ledger"]] = {}
_ledgers_lock = threading.Lock()


def open_ledger(path: Path) -> "Ledger":
    """The process's handle on the ledger at ``path``, verified once.

    Every stage and every measurement task of a run needs the ledger; opening it anew each time
    would re-read and re-verify the whole file (a cost growing with the ledger's history). One
    :class:`~phsafe.ledger.Ledger` per file instead catches up with what other processes
    appended, under the file lock, before every read and append. A file replaced on disk (other
    inode) is opened anew.
    """
    from phsafe.ledger import Ledger

    key = Path(path).absolute()
    with _ledgers_lock:
        cached = _ledgers.get(key)
        try:
            st = key.stat()
            identity = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            identity = None
        if cached is not None and identity == cached[0]:
            return cached[1]
        ledger = Ledger.open(key)
        st = key.stat()
        _ledgers[key] = ((st.st_dev, st.st_ino), ledger)
        return ledger


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:12]


def code_version() -> str:
    """Package version and, in a git checkout, the commit (``+dirty`` if modified)."""
    root = Path(phsafe.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    version = phsafe.__version__
    if commit:
        version += f"+g{commit[:12]}" + (".dirty" if dirty else "")
    return version


def config_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()



def _peak_rss_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


class _Stages:
    """Times the stages of a run and reports progress on the console."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.timings: dict[str, float] = {}
        self.progress = progress

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.progress:
            self.progress(name)
        log.info("stage started", stage=name)
        yield
        self.timings[name] = round(time.perf_counter() - start, 3)
        log.info("stage finished", stage=name, seconds=self.timings[name], peak_rss_mib=_peak_rss_mib())


def _validate_inputs(config_path: Path, data_dir: Path, report_dir: Path | None) -> None:
    from phsafe.validation import validate_inputs

    report = validate_inputs(config_path, data_dir, report_dir=report_dir)
    if not report.ok:
        raise ValidationFailed("input", report.to_text())


def exact_vector(m: PlannedMeasurement, counts: TableCounts) -> np.ndarray:
    """The exact count vector of ``m`` in domain order; the nation is the sum of the states."""
    cube = counts.by_level[m.level.iteration]
    if m.level.geography is GeographyLevel.USA:
        cube = cube.sum(axis=0, keepdims=True)
    vector = cube.reshape(-1)
    assert vector.size == m.n_cells, m.key
    return vector


# --------------------------------------------------------------------------------------------
# The private run, stage by stage. ``run_private`` chains these in one process; the Prefect
# flows in ``flows/`` run the same functions as tasks. Everything passed between stages is small
# (paths, digests, the plan) except the exact counts, which stay in memory.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivateRun:
    """The identity of one private run: what every stage needs to find its files.

    Attributes:
        run_id: The ledger's run id.
        config_path: The config file.
        data_dir: The input folder.
        output_dir: Where the tables are published (must not exist yet).
        options: The run's options.
        config_sha256: Digest of the config file, recorded in the ledger.
        code_version: Package version and commit, recorded in the ledger.
        resume: This continues an earlier, failed or interrupted attempt of ``run_id``.
        truncation_key: The key of the truncation hash: fresh for a new run, the recorded one
            for a resumed run (so the exact counts are the same).
    """

    run_id: str
    config_path: Path
    data_dir: Path
    output_dir: Path
    options: PrivateRunOptions
    config_sha256: str
    code_version: str
    resume: bool = False
    truncation_key: bytes = field(default=b"", repr=False)

    @property
    def report_dir(self) -> Path:
        return self.options.report_dir or self.output_dir.parent / f"{self.output_dir.name}-validation"

    @property
    def staging(self) -> Path:
        return Publication.staging_path(self.output_dir, self.run_id)

    @property
    def store(self) -> MeasurementStore:
        return MeasurementStore(self.staging / MEASUREMENTS_DIR)


@dataclass(frozen=True)
class MeasurementOutcome:
    """What happened to one measurement in this attempt (for logs, artifacts and summaries).

    Attributes:
        key: ``TABLE/level``.
        status: ``drawn`` (noise drawn now), ``reused`` (committed by an earlier attempt and read
            back from the staged vector) or ``noiseless`` (Infinity budget, test data only).
    """

    key: str
    table: str
    level: str
    status: str
    privacy_defn: str
    budget: str
    sensitivity: int
    variance: float
    moe90: float
    cells: int


class ExactCounts:
    """The exact (truncated) count cubes of a run: confidential, kept in memory only.

    The wrapper exists so that nothing (a log line, a Prefect state, a traceback) ever prints
    the counts by accident: its ``repr`` names the tables only.
    """

    __slots__ = ("_by_table",)

    def __init__(self, by_table: dict[str, TableCounts]) -> None:
        self._by_table = by_table

    def __getitem__(self, table: str) -> TableCounts:
        return self._by_table[table]

    def __repr__(self) -> str:
        return f"ExactCounts(tables={sorted(self._by_table)})"

    def __reduce__(self):  # never pickled: exact counts do not leave the process by accident
        raise TypeError("exact counts are confidential and are not serialized")


def begin_private_run(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    options: PrivateRunOptions,
    *,
    run_id: str | None = None,
    resume: bool = False,
) -> tuple[PrivateRun, PHSafeConfig]:
    """Check everything that needs neither the data nor the ledger's lock; fix the run's identity.

    Args:
        run_id: The run id (default: a fresh one). To resume, the id of the run to continue.
        resume: Continue the failed or interrupted run ``run_id``: its committed measurements are
            reused and its truncation key replayed; its config must be unchanged.

    Raises:
        PHSafeError: Bad config, an existing output directory, Infinity budgets without
            ``non_confidential``, or a run that cannot be resumed. Nothing is spent.
    """
    config_path, data_dir = Path(config_path), Path(data_dir)
    config_sha256 = config_digest(config_path)
    config = load_config(config_path)
    output_dir = Path(output_dir).absolute()
    if output_dir.exists():
        raise PHSafeError(f"output directory {output_dir} already exists; choose a new one")
    if config.has_infinite_budget and not options.non_confidential:
        raise BudgetError(
            "Infinity budgets (no noise) are for non-confidential test data only: "
            "pass --non-confidential if this data is synthetic"
        )
    if resume:
        if not run_id:
            raise PHSafeError("resuming needs the id of the run to resume")
        earlier = open_ledger(options.ledger).run(run_id)
        if earlier is None:
            raise PHSafeError(f"run {run_id} is not in the ledger {options.ledger}; nothing to resume")
        if earlier.config_digest != config_sha256:
            raise PHSafeError(f"run {run_id} was started with a different config; it can only be resumed with the same one")
        key = bytes.fromhex(earlier.truncation_key)
    else:
        if options.truncation_key:
            key = bytes.fromhex(options.truncation_key)
            if len(key) != TRUNCATION_KEY_BYTES:
                raise PHSafeError(f"a truncation key is {TRUNCATION_KEY_BYTES} bytes ({2 * TRUNCATION_KEY_BYTES} hex digits)")
        else:
            key = secrets.token_bytes(TRUNCATION_KEY_BYTES)
    run = PrivateRun(
        run_id=run_id or new_run_id(), config_path=config_path, data_dir=data_dir,
        output_dir=output_dir, options=options, config_sha256=config_sha256,
        code_version=code_version(), resume=resume, truncation_key=key,
    )
    if not resume and run.staging.exists():
        raise PHSafeError(f"staging directory {run.staging} exists: run {run.run_id} was started before; resume it")
    log.info("private run", run_id=run.run_id, config=str(config_path), data=str(data_dir),
             output=str(output_dir), privacy_defn=config.privacy_defn.value, resume=resume)
    return run, config


def check_inputs(run: PrivateRun):
    """Validate the config and inputs (Great Expectations); the report, failures included."""
    from phsafe.validation import validate_inputs

    return validate_inputs(run.config_path, run.data_dir, report_dir=run.report_dir)


def fingerprint_inputs(data_dir: Path) -> dict[str, str]:
    """SHA-256 of every input file (the ledger's dataset id is derived from these)."""
    return input_digests(locate_inputs(data_dir))


def count_exact(run: PrivateRun, config: PHSafeConfig, stage: StageTimer | None = None) -> ExactCounts:
    """Read, preprocess, truncate (with the run's key), join and count every measured table."""
    return ExactCounts(exact_counts(config, run.data_dir, list(TABLES.values()), key=run.truncation_key,
                                    stage=stage or _Stages(None)))


def plan_private_run(config: PHSafeConfig) -> RunPlan:
    """Plan every measurement and cross-check each against OpenDP's privacy map."""
    plan = plan_run(config)
    for m in plan.measurements:
        check_privacy_map(m)
    log.info("plan", measurements=len(plan.measurements), total=str(plan.total),
             cells=sum(m.n_cells for m in plan.measurements))
    return plan


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


def open_run_in_ledger(run: PrivateRun, plan: RunPlan, input_digests_: dict[str, str]) -> LedgerAttempt:
    """Start the run in the ledger (lifetime cap checked under the lock), or resume it.

    Raises:
        BudgetError: The dataset's lifetime budget does not admit the run.
        LedgerError: The run cannot be resumed (finished, other inputs, ...).
    """
    ledger = open_ledger(run.options.ledger)
    if not run.resume:
        ledger.start_run(
            run_id=run.run_id, plan=plan, config_digest=run.config_sha256,
            input_digests=input_digests_, code_version=run.code_version,
            truncation_key_hex=run.truncation_key.hex(),
            lifetime_cap=run.options.lifetime_cap, cap_reason=run.options.cap_reason,
            non_confidential=run.options.non_confidential,
        )
        return LedgerAttempt(1, {})
    recorder = ledger.resume_run(
        run.run_id, config_digest=run.config_sha256, input_digests=input_digests_,
        code_version=run.code_version, reason=run.options.resume_reason or "resumed by the operator",
        lifetime_cap=run.options.lifetime_cap, cap_reason=run.options.cap_reason,
        plan=plan,  # the ledger refuses a resume whose plan differs from the recorded one
    )
    state = ledger.run(run.run_id)
    assert state is not None
    log.info("run resumed", run_id=run.run_id, attempt=recorder.attempt, reusable=len(state.reusable))
    return LedgerAttempt(recorder.attempt, dict(state.reusable))


def recorder_for(run: PrivateRun, plan: RunPlan, attempt: LedgerAttempt):
    """A spend recorder for this attempt of the run (each caller gets its own ledger handle)."""
    from phsafe.ledger import RunRecorder

    return RunRecorder(open_ledger(run.options.ledger), run.run_id, plan, attempt=attempt.attempt)


def measure_table(
    run: PrivateRun,
    plan: RunPlan,
    table: str,
    counts: ExactCounts,
    attempt: LedgerAttempt,
) -> list[MeasurementOutcome]:
    """Measure every level of ``table``: reuse what an earlier attempt committed, draw the rest.

    A committed measurement whose stored vector is intact is read back, never re-drawn. Anything
    else goes through :func:`phsafe.noise.measure`: the spend is recorded before the draw, and
    the noisy vector is stored before the spend is marked committed.
    """
    store = run.store
    recorder = recorder_for(run, plan, attempt)
    reusable = attempt.reusable
    outcomes = []
    for m in plan.for_table(table):
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
            outcomes.append(MeasurementOutcome(
                key=m.key, table=m.table, level=m.level.config_key, status=status,
                privacy_defn=m.privacy_defn.value, budget=str(m.budget), sensitivity=m.sensitivity,
                variance=m.variance, moe90=m.moe90, cells=m.n_cells,
            ))
    return outcomes


def write_private_outputs(run: PrivateRun, config: PHSafeConfig, plan: RunPlan) -> dict[str, str]:
    """Derive PH5_num and PH8_num, attach variances and write the eleven tables to staging.

    Reads the noisy vectors from the run's measurement store (every one must be committed).

    Returns:
        Relative path -> SHA-256 of every table file written.
    """
    state = open_ledger(run.options.ledger).run(run.run_id)
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
    return write_tables(frames, run.staging)


def check_outputs(run: PrivateRun, config: PHSafeConfig):
    """Validate the staged output tables (Great Expectations); the report."""
    from phsafe.validation import validate_outputs

    return validate_outputs(config, run.staging, report_dir=run.report_dir)


def publish_private_run(
    run: PrivateRun,
    config: PHSafeConfig,
    plan: RunPlan,
    input_digests_: dict[str, str],
    file_digests: dict[str, str],
    attempt: LedgerAttempt,
) -> dict:
    """Record the outputs and finish the run in the ledger, sign a checkpoint, write the
    manifest and rename the staging directory into place.

    Returns:
        The ledger checkpoint (signed if the options name a signing key).
    """
    recorder = recorder_for(run, plan, attempt)
    recorder.record_outputs_published(file_digests)
    recorder.finish()
    checkpoint = recorder.checkpoint(run.options.signing_key)
    publication = Publication(run.output_dir, run.staging)
    shutil.rmtree(run.staging / MEASUREMENTS_DIR, ignore_errors=True)
    publication.write_manifest({
        "run_id": run.run_id,
        "mode": "private",
        "privacy_defn": config.privacy_defn.value,
        "total_budget": str(plan.total),
        "config": {"path": str(run.config_path), "sha256": run.config_sha256},
        "inputs": input_digests_,
        "code_version": run.code_version,
        "ledger": str(Path(run.options.ledger).absolute()),
        "checkpoint": checkpoint,
        "files": file_digests,
    })
    try:
        publication.publish()
    except BaseException:
        # Spent, recorded and complete, only not renamed: keep it for the operator.
        log.error("publication failed after the run finished; staged outputs kept",
                  staging=str(run.staging), target=str(run.output_dir))
        raise
    log.info("published", run_id=run.run_id, output=str(run.output_dir), files=len(file_digests))
    return checkpoint


def failure_reason(exc: BaseException) -> str:
    """A short, value-free reason for the ledger: our own error's first line, else the class."""
    if isinstance(exc, PHSafeError):
        return (str(exc).splitlines() or [""])[0][:200] or type(exc).__name__
    return type(exc).__name__


def record_failure(run: PrivateRun, plan: RunPlan, attempt: LedgerAttempt | None, reason: str) -> bool:
    """Mark the run failed in the ledger (unless it finished) and tidy its staging directory.

    The staging directory is kept when it holds committed measurements, so the run can be
    resumed without drawing them again; otherwise it is removed.

    Returns:
        True if the run can be resumed (it has committed measurements kept on disk).
    """
    from phsafe.ledger import RunStatus

    state = open_ledger(run.options.ledger).run(run.run_id)
    if state is None:  # never started: nothing spent, nothing to keep
        Publication(run.output_dir, run.staging).abandon()
        return False
    if state.status is RunStatus.FINISHED:
        return False
    if state.status is RunStatus.RUNNING and attempt is not None and state.attempt == attempt.attempt:
        recorder_for(run, plan, attempt).fail(reason)
    resumable = bool(state.reusable) and run.staging.exists()
    if not resumable:
        Publication(run.output_dir, run.staging).abandon()
    return resumable


def run_private(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    options: PrivateRunOptions,
    *,
    progress: Callable[[str], None] | None = None,
    run_id: str | None = None,
    resume: bool = False,
) -> RunResult:
    """Run PHSafe privately and publish the eleven tables to ``output_dir``.

    Args:
        run_id, resume: See :func:`begin_private_run`.

    Raises:
        PHSafeError: Bad config or input (nothing spent), budget refused, or validation failed.
    """
    stage = _Stages(progress)
    run, config = begin_private_run(config_path, data_dir, output_dir, options, run_id=run_id, resume=resume)
    with structlog.contextvars.bound_contextvars(run_id=run.run_id):
        if options.validate_inputs:
            with stage("validate inputs"):
                report = check_inputs(run)
                if not report.ok:
                    raise ValidationFailed("input", report.to_text())
        with stage("digest inputs"):
            digests = fingerprint_inputs(run.data_dir)
        counts = count_exact(run, config, stage)
        plan = plan_private_run(config)
        attempt = open_run_in_ledger(run, plan, digests)
        try:
            with stage("measure (noise)"):
                for table in TABLES:
                    measure_table(run, plan, table, counts, attempt)
            del counts
            with stage("write outputs"):
                file_digests = write_private_outputs(run, config, plan)
            if options.validate_outputs:
                with stage("validate outputs"):
                    report = check_outputs(run, config)
                    if not report.ok:
                        raise ValidationFailed("output", report.to_text())
            with stage("publish"):
                publish_private_run(run, config, plan, digests, file_digests, attempt)
        except BaseException as exc:
            if record_failure(run, plan, attempt, failure_reason(exc)):
                log.error("run failed; its committed measurements are kept for a resume",
                          run_id=run.run_id, staging=str(run.staging))
                if isinstance(exc, PHSafeError):
                    raise type(exc)(f"{exc}\n(resume with: phsafe private ... --resume {run.run_id})") from exc
            raise
    return RunResult(run.run_id, run.output_dir, file_digests, plan, stage.timings)


def run_nonprivate(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    *,
    validate: bool = False,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Ground-truth tabulation for testing on synthetic data: no truncation, no noise."""
    stage = _Stages(progress)
    run_id = new_run_id()
    config = load_config(config_path)
    output_dir = Path(output_dir).absolute()
    if output_dir.exists():
        raise PHSafeError(f"output directory {output_dir} already exists; choose a new one")
    log.info("non-private run", run_id=run_id, config=str(config_path), data=str(data_dir),
             output=str(output_dir))
    if validate:
        with stage("validate inputs"):
            _validate_inputs(Path(config_path), Path(data_dir), output_dir.parent / f"{output_dir.name}-validation")
    files = locate_inputs(data_dir)
    digests = input_digests(files)
    specs = list(TABLES.values()) + [d.nonprivate for d in DERIVED_TABLES.values()]
    counts = exact_counts(config, Path(data_dir), specs, key=None, stage=stage)
    with stage("write outputs"):
        publication = Publication.begin(output_dir, run_id)
        try:
            file_digests = write_tables(nonprivate_tables(config, counts), publication.staging)
            publication.write_manifest({
                "run_id": run_id, "mode": "non-private",
                "config": {"path": str(config_path), "sha256": config_digest(Path(config_path))},
                "inputs": digests, "code_version": code_version(), "files": file_digests,
            })
            publication.publish()
        except BaseException:
            publication.abandon()
            raise
    return RunResult(run_id, output_dir, file_digests, None, stage.timings)


def spend_summary(run: PrivateRun, plan: RunPlan) -> list[dict[str, object]]:
    """One row per planned measurement, as the ledger records it: budget, Δ, variance, MOE,
    cells, how many times it was spent and whether its release is committed. Value-free."""

    state = open_ledger(run.options.ledger).run(run.run_id)
    committed = state.reusable if state is not None else {}
    budget_name = "rho" if plan.privacy_defn.value == "zcdp" else "epsilon"
    rows: list[dict[str, object]] = []
    for m in plan.measurements:
        spends = len(state.intents.get(m.key, ())) if state is not None else 0
        rows.append({
            "table": m.table,
            "level": m.level.config_key,
            budget_name: str(m.budget),
            "sensitivity": m.sensitivity,
            "variance": m.variance,
            "moe90": m.moe90,
            "cells": m.n_cells,
            "spends": spends,
            "status": "committed" if m.key in committed else ("spent, not committed" if spends else "not spent"),
        })
    return rows
