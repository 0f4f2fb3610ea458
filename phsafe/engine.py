"""The private and non-private runs, stage by stage.

Private run, in this order -- everything that can fail on bad input or a bad setting fails before
any budget is spent, and a failure after a spend can be completed without new noise:

1. config (with its budget sanity checks), the run's identity (dataset, run id, paths);
2. preflight (:func:`preflight`): the ledger, its lock and key files, the signing key, the output
   folder's parent, free space, the run's work folder -- everything the run will need later --
   and a first check of the dataset's lifetime cap;
3. input validation (on by default), then read, preprocess, truncate-join-count every table
   exactly, with the content fingerprint of the records (inconsistent codes stop the run);
4. plan every measurement (exact budgets) and cross-check each with OpenDP's privacy map;
5. start the run in the audit ledger: the dataset, its content version and its lifetime cap are
   checked and the plan recorded under a lock;
6. for each measurement, :func:`phsafe.noise.measure` records the spend, then draws the noise, and
   the noisy vector is stored in the run's work folder before it is committed;
7. write the release (tables, data package, manifest with a signed checkpoint) in the work folder,
   optionally validate it, copy it beside the output folder, fsync, rename it into place -- and
   only then record ``OUTPUTS_PUBLISHED`` and ``RUN_FINISHED``.

Two zones. The public release ``OUT`` holds the tables and what describes them (data package,
manifest, signed checkpoint, a keyed lineage commitment). Everything else -- the ledger and its
keys, the run's work folder (noisy vectors before publication, validation reports), logs -- is
confidential and lives beside the ledger: ``<ledger folder>/runs/<run id>/`` (or ``work_dir``).
"""

from __future__ import annotations

import copy
import json
import os
import resource
import secrets
import shutil
import stat
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import structlog

import phsafe
from phsafe.accounting import PlannedMeasurement, RunPlan, plan_run
from phsafe.config import INFINITE, PHSafeConfig, check_budget_policy, load_config
from phsafe.counting import Counts, exact_counts
from phsafe.errors import BudgetError, LedgerError, OutputExistsError, PHSafeError, ValidationFailed, option, os_reason
from phsafe.intake import validated_counts
from phsafe.iterations import GeographyLevel
from phsafe.logs import get_logger
from phsafe.measurements import MeasurementStore
from phsafe.noise import check_privacy_map, measure
from phsafe.outputs import MANIFEST, Publication, nonprivate_tables, private_tables, publish_release, write_tables
from phsafe.progress import budget_text
from phsafe.reader import file_digest, input_digests, locate_inputs
from phsafe.tables import DERIVED_TABLES, TABLES
from phsafe.tabulate import TableCounts
from phsafe.truncation import TRUNCATION_KEY_BYTES

if TYPE_CHECKING:
    from phsafe.ledger import Ledger, Orchestration
    from phsafe.progress import Progress

log = get_logger("phsafe.engine")

LEDGER_ENV = "PHSAFE_LEDGER"
"""Environment variable naming the ledger when no ``--ledger`` is given."""
RUNS_DIR = "runs"
NON_CONFIDENTIAL_DATASET = "non-confidential"
_MIN_LEDGER_FREE = 1 << 20  # bytes the ledger's file system must have free before a run starts


@dataclass(frozen=True)
class PrivateRunOptions:
    """Options of a private run.

    Attributes:
        ledger: The audit ledger (made by ``phsafe ledger init``). Required for confidential
            data; a non-confidential run without one gets a throwaway ledger beside ``OUT``.
        dataset: The declared dataset the run spends against (default: the config's
            ``dataset`` key; non-confidential runs: ``non-confidential``).
        new_version: Why these records are a new content version of the dataset (recorded);
            needed the first time a dataset runs on records it has never seen.
        lifetime_cap: Raise the dataset's lifetime cap to this (recorded with ``cap_reason``).
        cap_reason: Why the cap is raised.
        signing_key: Ed25519 private key (PEM) that signs the ledger checkpoints.
        public_key: The operator's public key (PEM): the signing key must match it.
        non_confidential: The data is synthetic/non-confidential (allows Infinity budgets and
            scales below one count; needs a non-confidential ledger).
        validate_inputs: Run the full input suites first (default; recorded in the ledger).
        validate_outputs: Validate the output tables before publishing them.
        work_dir: Folder of the runs' work folders (default: ``runs/`` beside the ledger).
        report_dir: Where validation reports go (default: the run's work folder).
        truncation_key: Replay a run with this truncation key (hex) -- non-confidential data
            only: a chosen key must not depend on the data.
        resume_reason: Why a failed run is resumed (recorded in the ledger).
        re_release: Why records that another run released (or is releasing) are released again
            (recorded in the ledger). Without it such a run is refused before any spend.
    """

    ledger: Path | None = None
    dataset: str | None = None
    new_version: str | None = None
    lifetime_cap: Fraction | None = None
    cap_reason: str | None = None
    signing_key: Path | None = None
    public_key: Path | None = None
    non_confidential: bool = False
    validate_inputs: bool = True
    validate_outputs: bool = False
    work_dir: Path | None = None
    report_dir: Path | None = None
    truncation_key: str | None = None
    resume_reason: str | None = None
    re_release: str | None = None


@dataclass
class RunResult:
    """What a run did.

    Attributes:
        run_id: The ledger's run id.
        output_dir: Where the release is.
        files: Relative path -> SHA-256 of every published file.
        plan: The run's plan (None for a non-private tabulation).
        timings: Stage -> seconds (stages run in this process).
        ledger: The audit ledger.
        run_dir: The run's confidential work folder.
        outcomes: What happened to each measurement in this attempt (drawn, reused, noiseless).
        checkpoint: The ledger checkpoint published in the manifest.
        attempt: 1 for a new run, higher for a resumed one.
        already_published: The run had published before this call (an orchestrator's retry of a
            finished run): nothing was done.
        budget: The dataset's privacy-loss account after the run (see :func:`dataset_budget`).
    """

    run_id: str
    output_dir: Path
    files: dict[str, str]
    plan: RunPlan | None = None
    timings: dict[str, float] = field(default_factory=dict)
    ledger: Path | None = None
    run_dir: Path | None = None
    outcomes: list["MeasurementOutcome"] = field(default_factory=list)
    checkpoint: dict | None = None
    attempt: int = 1
    already_published: bool = False
    budget: "DatasetBudget | None" = None


_ledgers: dict[Path, tuple[tuple[int, int, bytes], "Ledger"]] = {}
_ledgers_lock = threading.Lock()
_GENESIS_BYTES = 1 << 16
"""At most this much of the first line identifies a ledger (its LEDGER_INIT names a unique id)."""


def _ledger_identity(path: Path) -> tuple[int, int, bytes] | None:
    """The file at ``path`` (device, inode) and its first line, or None when there is none.

    The inode alone is not an identity: a ledger deleted and made anew at the same path (a
    throwaway ledger of ``accuracy --overwrite``) often gets the inode just freed. The first line
    -- LEDGER_INIT, with the ledger's own random id -- tells two ledgers apart.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return st.st_dev, st.st_ino, b""  # not a ledger: Ledger.open says what it is
    with open(path, "rb") as f:
        return st.st_dev, st.st_ino, f.readline(_GENESIS_BYTES)


def open_ledger(path: Path) -> "Ledger":
    """The process's handle on the ledger at ``path``, verified once.

    Every stage and every measurement task of a run needs the ledger; opening it anew each time
    would re-read and re-verify the whole file (a cost growing with the ledger's history). One
    :class:`~phsafe.ledger.Ledger` per file instead catches up with what other processes
    appended, under the file lock, before every read and append. A file replaced on disk (other
    inode, or another ledger's first entry) is opened anew.

    Raises:
        LedgerError: The ledger does not exist (it is never created here) or is broken.
    """
    from phsafe.ledger import Ledger

    key = Path(path).absolute()
    with _ledgers_lock:
        cached = _ledgers.get(key)
        try:
            identity = _ledger_identity(key)
        except OSError as exc:
            raise LedgerError(f"cannot open the ledger {key}: {exc.strerror}") from None
        if cached is not None and identity is not None and identity == cached[0]:
            return cached[1]
        ledger = Ledger.open(key)
        opened = _ledger_identity(key)
        if opened is not None:
            _ledgers[key] = (opened, ledger)
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
    return file_digest(Path(path))


def _peak_rss_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


class StageTimer:
    """Times the stages of a run, logs them, and shows them on the run's progress display."""

    def __init__(self, progress: "Progress | None") -> None:
        from phsafe.progress import NULL

        self.timings: dict[str, float] = {}
        self.progress = progress or NULL

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        log.info("stage started", stage=name)
        with self.progress.stage(name):
            yield
        self.timings[name] = round(time.perf_counter() - start, 3)
        log.info("stage finished", stage=name, seconds=self.timings[name], peak_rss_mib=_peak_rss_mib())


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
        output_dir: Where the release is published (must not exist yet).
        options: The run's options.
        ledger: The audit ledger (resolved: the option, ``$PHSAFE_LEDGER`` or the throwaway one).
        dataset: The declared dataset name.
        config_sha256: Digest of the config file, recorded in the ledger.
        code_version: Package version and commit, recorded in the ledger.
        resume: This continues an earlier, failed or interrupted attempt of ``run_id``.
        truncation_key: The key of the truncation hash: fresh for a new run, the recorded one
            for a resumed run (so the exact counts are the same); set by :func:`preflight`.
        orchestration: The orchestrator's flow run running this attempt (recorded in the
            ledger, so that a retry of that flow run finds this run and resumes it).
    """

    run_id: str
    config_path: Path
    data_dir: Path
    output_dir: Path
    options: PrivateRunOptions
    ledger: Path
    dataset: str
    config_sha256: str
    code_version: str
    resume: bool = False
    truncation_key: bytes = field(default=b"", repr=False)
    orchestration: "Orchestration | None" = None

    @property
    def run_dir(self) -> Path:
        """The run's confidential work folder: ``<ledger folder>/runs/<run id>/``."""
        base = self.options.work_dir or self.ledger.parent / RUNS_DIR
        return Path(base).absolute() / self.run_id

    @property
    def report_dir(self) -> Path:
        return Path(self.options.report_dir).absolute() if self.options.report_dir else self.run_dir / "validation"

    @property
    def release_dir(self) -> Path:
        """Where the release is assembled (tables, data package, manifest) before it is copied
        beside ``output_dir`` and renamed into place."""
        return self.run_dir / "release"

    @property
    def store(self) -> MeasurementStore:
        return MeasurementStore(self.run_dir / "measurements")


@dataclass(frozen=True)
class MeasurementOutcome:
    """What happened to one measurement in this attempt (for logs, artifacts and summaries).

    Attributes:
        key: ``TABLE/level``.
        status: ``drawn`` (noise drawn now), ``reused`` (committed by an earlier attempt and read
            back from the stored vector) or ``noiseless`` (Infinity budget, test data only).
        budget: The budget as a decimal (exactly as configured).
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

    def __repr__(self) -> str:
        return f"ExactCounts(tables={sorted(self._counts)})"

    def __reduce__(self):  # never pickled: exact counts do not leave the process by accident
        raise TypeError("exact counts are confidential and are not serialized")


def resolve_ledger(options: PrivateRunOptions, output_dir: Path) -> Path:
    """The run's ledger: the option, else ``$PHSAFE_LEDGER``, else -- for non-confidential
    data only -- a throwaway ledger beside the output folder (``<OUT>-ledger/ledger.jsonl``)."""
    if options.ledger is not None:
        return Path(options.ledger).absolute()
    if os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV]).absolute()
    if options.non_confidential:
        return output_dir.parent / f"{output_dir.name}-ledger" / "ledger.jsonl"
    raise PHSafeError(
        f"name the audit ledger with {option('ledger')} (or ${LEDGER_ENV}). A ledger is created once, "
        "before any data is seen: `phsafe ledger init LEDGER --lifetime-cap RHO --reason TEXT`"
    )


def begin_private_run(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    options: PrivateRunOptions,
    *,
    run_id: str | None = None,
    resume: bool = False,
    orchestration: "Orchestration | None" = None,
) -> tuple[PrivateRun, PHSafeConfig]:
    """Read the config and fix the run's identity; touches no file but the config.

    Args:
        run_id: The run id (default: a fresh one). To resume, the id of the run to continue.
        resume: Continue the failed or interrupted run ``run_id``: its committed measurements are
            reused and its truncation key replayed; its config must be unchanged.
        orchestration: The orchestrator's flow run that runs this attempt (recorded).

    Raises:
        PHSafeError: A bad config or budget, no ledger or dataset named, a truncation key where
            none may be chosen. Nothing is spent.
    """
    config_path, data_dir = Path(config_path), Path(data_dir)
    config = load_config(config_path)
    check_budget_policy(config, non_confidential=options.non_confidential)
    config_sha256 = config_digest(config_path)
    output_dir = Path(output_dir).absolute()
    if resume and not run_id:
        raise PHSafeError("resuming needs the id of the run to resume")
    if options.truncation_key is not None:
        if not options.non_confidential:
            raise PHSafeError(
                f"{option('truncation_key')} is for non-confidential data only: on confidential data the "
                "truncation key is drawn fresh for every run (a chosen key could depend on the data), "
                f"and a resumed run ({option('resume')}) replays the key its ledger recorded"
            )
        try:
            key = bytes.fromhex(options.truncation_key)
        except ValueError:
            key = b""
        if len(key) != TRUNCATION_KEY_BYTES:
            raise PHSafeError(f"{option('truncation_key')} must be {2 * TRUNCATION_KEY_BYTES} hex digits "
                              f"({TRUNCATION_KEY_BYTES} bytes)")
    dataset = options.dataset or config.dataset
    if options.dataset and config.dataset and options.dataset != config.dataset:
        raise PHSafeError(f"the config names dataset {config.dataset!r} but {option('dataset')} says "
                          f"{options.dataset!r}; they must agree")
    if dataset is None:
        if not options.non_confidential:
            raise PHSafeError(f"name the dataset this run spends against: the config key \"dataset\" or "
                              f"{option('dataset')} NAME (e.g. cef2020-us)")
        dataset = NON_CONFIDENTIAL_DATASET
    ledger = resolve_ledger(options, output_dir)
    run = PrivateRun(
        run_id=run_id or new_run_id(), config_path=config_path, data_dir=data_dir,
        output_dir=output_dir, options=options, ledger=ledger, dataset=dataset,
        config_sha256=config_sha256, code_version=code_version(), resume=resume, orchestration=orchestration,
    )
    return run, config


# --------------------------------------------------------------------------------------------
# Preflight: everything the run needs later, checked before the first spend
# --------------------------------------------------------------------------------------------

_NAME_MAX = 255


def _probe_folder(folder: Path, what: str) -> None:
    """Create, write, fsync, rename and remove a probe in ``folder``: proves it usable."""
    probe = folder / f".phsafe-probe-{uuid.uuid4().hex[:12]}"
    try:
        probe.mkdir()
        try:
            f = probe / "probe"
            with open(f, "wb") as fh:
                fh.write(b"phsafe\n")
                fh.flush()
                os.fsync(fh.fileno())
            f.rename(probe / "renamed")
            fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    except OSError as exc:
        raise PHSafeError(f"{what} {folder} cannot be written: {os_reason(exc)}") from None


def _free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def estimated_release_bytes(plan: RunPlan) -> int:
    """A generous estimate of a release's size: every cell of every table (derived tables
    included) as a CSV row and a Parquet row, plus the manifest and data package."""
    cells = sum(m.n_cells for m in plan.measurements)
    derived = sum(m.n_cells for m in plan.measurements if m.table in {d.source for d in DERIVED_TABLES.values()})
    return (cells + derived) * 96 + (1 << 20)


def _check_output_dir(run: PrivateRun, needed: int) -> None:
    out = run.output_dir
    other = f"choose another output folder ({option('output')})"
    if len(out.name.encode()) + len(f"..partial-{run.run_id}".encode()) > _NAME_MAX:
        raise PHSafeError(f"the output folder's name is too long ({len(out.name.encode())} bytes; with the "
                          f"staging suffix a name must fit in {_NAME_MAX} bytes): {other}")
    parent = out.parent
    if not parent.exists():
        raise PHSafeError(f"the output folder's parent {parent} does not exist: create it, or {other}")
    if not parent.is_dir():
        raise PHSafeError(f"the output folder's parent {parent} is not a folder: {other}")
    _probe_folder(parent, "the output folder's parent")
    free = _free_bytes(parent)
    if free < needed:
        raise PHSafeError(f"the output folder's file system has {free >> 20} MiB free; the release needs about "
                          f"{needed >> 20} MiB: free space, or {other}")


def _existing_release_of(run: PrivateRun) -> bool:
    """Whether ``output_dir`` already holds this very run's release (a publish whose ledger
    record was interrupted): then a resume only records it."""
    manifest = run.output_dir / MANIFEST
    try:
        return json.loads(manifest.read_text(encoding="utf-8")).get("run_id") == run.run_id
    except (OSError, ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class Preflight:
    """What the preflight established.

    Attributes:
        run: The run, with its truncation key (fresh, or the recorded one for a resume).
        created_ledger: A throwaway ledger was created for this non-confidential run.
        republish: ``output_dir`` already holds this run's release; only the ledger record of
            the publication is missing.
    """

    run: PrivateRun
    created_ledger: bool = False
    republish: bool = False


def preflight(run: PrivateRun, config: PHSafeConfig, plan: RunPlan) -> Preflight:
    """Check everything the run will need later, before any budget is spent.

    The ledger (a regular file this process can append to and fsync, its lock file, its lineage
    key, its policy and kind), the dataset's lifetime cap for this plan (checked again, under the
    lock, when the run starts), the signing key (loads, is Ed25519, matches ``public_key``), the
    output folder (does not exist; its parent is a writable folder with room for the release; the
    staging name fits), and the run's work folder (created and fsynced; for a resume, the run and
    its work folder exist). A non-confidential run without a ledger gets a throwaway one here.

    Raises:
        PHSafeError: One clear line saying what is wrong and what to do. Nothing is spent.
    """
    from phsafe.amounts import add_amounts, amount_exceeds, format_exact
    from phsafe.ledger import (
        RunStatus, check_ledger_file, check_ledger_kind, init_ledger, load_signing_key, plan_charge,
    )

    options = run.options
    created = False
    if options.non_confidential and not run.ledger.exists() and not os.path.islink(run.ledger):
        init_ledger(run.ledger, lifetime_cap=INFINITE, reason="throwaway ledger of a non-confidential run",
                    privacy_defn=config.privacy_defn, non_confidential=True, code_version=run.code_version)
        log.info("created a throwaway ledger for non-confidential data", ledger=str(run.ledger))
        created = True
    check_ledger_file(run.ledger)
    ledger = open_ledger(run.ledger)
    ledger.lineage_key()  # the key file is there and is the ledger's; a first-format ledger refuses
    state = ledger.state
    assert state.policy is not None
    check_ledger_kind(state.policy, options.non_confidential)
    if _free_bytes(run.ledger.parent) < _MIN_LEDGER_FREE:
        raise PHSafeError("the ledger's file system has less than 1 MiB free: free space before running "
                          "(the ledger must be able to record every spend)")
    if options.signing_key is not None:
        load_signing_key(options.signing_key, options.public_key)
    elif options.public_key is not None:
        raise PHSafeError(f"{option('public_key')} is given without {option('signing_key')}: nothing would be signed")

    key = run.truncation_key
    republish = False
    if run.resume:
        earlier = ledger.run(run.run_id)
        if earlier is None:
            raise PHSafeError(f"{option('resume')} names run {run.run_id}, which is not in the ledger {run.ledger}; "
                              "nothing to resume")
        if earlier.status is RunStatus.FINISHED:
            raise PHSafeError(f"run {run.run_id} finished and published to {earlier.output_path}; a finished "
                              "run is never resumed")
        if earlier.config_digest != run.config_sha256:
            raise PHSafeError(f"run {run.run_id} was started with a different config; it can only be resumed "
                              "with the same one")
        if earlier.dataset != run.dataset:
            raise PHSafeError(f"run {run.run_id} was started as dataset {earlier.dataset!r}, not {run.dataset!r}")
        key = bytes.fromhex(earlier.truncation_key)
        if options.truncation_key is not None and options.truncation_key.lower() != earlier.truncation_key:
            raise PHSafeError(f"{option('truncation_key')} differs from the key run {run.run_id} recorded")
        republish = run.output_dir.exists() and _existing_release_of(run)
        if not run.run_dir.is_dir():
            log.warning("the run's work folder is missing: its committed measurements cannot be reused, and "
                        "every measurement would be spent again", run_dir=str(run.run_dir))
    else:
        if options.truncation_key is not None:
            key = bytes.fromhex(options.truncation_key)
        else:
            key = secrets.token_bytes(TRUNCATION_KEY_BYTES)
        if run.run_dir.exists():
            raise PHSafeError(f"the work folder {run.run_dir} exists: run {run.run_id} was started before; "
                              f"resume it ({option('resume')})")
    if run.output_dir.exists() and not republish:
        raise OutputExistsError(f"the output folder {run.output_dir} already exists; a release is never "
                                f"overwritten: choose a new output folder ({option('output')})")
    needed = estimated_release_bytes(plan)
    if not republish:
        _check_output_dir(run, needed)
    try:
        run.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PHSafeError(f"cannot create the run's work folder {run.run_dir}: {os_reason(exc)} "
                          f"(choose another with {option('work_dir')})") from None
    _probe_folder(run.run_dir, "the run's work folder")
    if _free_bytes(run.run_dir) < 2 * needed:
        raise PHSafeError(f"the work folder's file system has {_free_bytes(run.run_dir) >> 20} MiB free; the run "
                          f"needs about {2 * needed >> 20} MiB for its measurements and release")

    # A dataset's first release needs its records declared as its first content version: say so
    # now, not after hours of reading (whether later records match a declared version is known
    # only once they are read; the ledger checks it when the run starts).
    if not options.non_confidential and not run.resume and not (options.new_version or "").strip():
        known = state.dataset_states.get(run.dataset)
        if known is None or not known.versions:
            raise BudgetError(
                f"dataset {run.dataset!r} has no declared content version in the ledger {run.ledger} yet: "
                f"its first run says why these records are its first version with {option('new_version')} "
                "(recorded in the ledger)"
            )

    # The dataset's cap, before hours of reading: the authoritative check is repeated under the
    # ledger's lock when the run starts (or resumes).
    if not options.non_confidential and not run.resume:
        cap = state.dataset_cap(run.dataset)
        if options.lifetime_cap is not None:
            cap = options.lifetime_cap
        spent = state.dataset_spent(run.dataset, state.policy.privacy_defn)
        planned = plan_charge(plan, state.policy.privacy_defn)
        need = add_amounts(spent, planned)
        if amount_exceeds(need, cap):
            raise BudgetError(
                f"privacy-loss budget refused for dataset {run.dataset!r}: already spent {format_exact(spent)}, "
                f"this run plans {format_exact(planned)}, lifetime cap {format_exact(cap)}; spent + planned "
                f"= {format_exact(need)} exceeds the cap. Spends are never refunded. To run anyway, raise the "
                f"cap to at least {format_exact(need)} with {option('lifetime_cap')} and say why with "
                f"{option('cap_reason')} (both are recorded in the ledger)."
            )
    if options.lifetime_cap is not None and not (options.cap_reason or "").strip():
        raise BudgetError(f"{option('lifetime_cap')} raises the dataset's cap: say why with {option('cap_reason')} "
                          "(it is recorded in the ledger)")
    return Preflight(replace(run, truncation_key=key), created_ledger=created, republish=republish)


# --------------------------------------------------------------------------------------------
# Reading and counting
# --------------------------------------------------------------------------------------------


def check_inputs(run: PrivateRun):
    """Validate the config and inputs on their own (``phsafe validate``'s check); the report.
    A run validates and counts in one read instead: :func:`validate_and_count`."""
    from phsafe.validation import validate_inputs

    return validate_inputs(run.config_path, run.data_dir, report_dir=run.report_dir)


def fingerprint_inputs(data_dir: Path) -> dict[str, str]:
    """SHA-256 of every input file: confidential lineage, recorded only in the ledger."""
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
    counts, report = validated_counts(run.config_path, run.data_dir, list(TABLES.values()),
                                      key=run.truncation_key, validate=run.options.validate_inputs,
                                      report_dir=run.report_dir, stage=stage, progress=stage.progress)
    return (ExactCounts(counts) if counts is not None else None), report


def count_exact(run: PrivateRun, config: PHSafeConfig, stage: "StageTimer | None" = None) -> ExactCounts:
    """Read, preprocess, truncate (with the run's key), join and count every measured table."""
    stage = stage or StageTimer(None)
    return ExactCounts(exact_counts(config, run.data_dir, list(TABLES.values()), key=run.truncation_key,
                                    stage=stage, progress=stage.progress))


def plan_private_run(config: PHSafeConfig) -> RunPlan:
    """Plan every measurement and cross-check each against OpenDP's privacy map."""
    plan = plan_run(config)
    for m in plan.measurements:
        check_privacy_map(m)
    log.info("plan", measurements=len(plan.measurements), total=budget_text(plan.total),
             cells=sum(m.n_cells for m in plan.measurements))
    return plan


def content_fingerprint(run: PrivateRun, counts: ExactCounts) -> str:
    """The records' content fingerprint, committed under the ledger's lineage key."""
    return counts.content.commit(open_ledger(run.ledger).lineage_key())


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


def open_run_in_ledger(run: PrivateRun, plan: RunPlan, input_digests_: dict[str, str], fingerprint: str) -> LedgerAttempt:
    """Start the run in the ledger (dataset, version and lifetime cap checked under the lock),
    or resume it.

    Raises:
        BudgetError: The dataset's lifetime cap does not admit the run, or the records are a
            content version the operator has not declared.
        LedgerError: The run cannot be resumed (finished, other records, ...).
    """
    ledger = open_ledger(run.ledger)
    options = run.options
    cap_raise = (options.lifetime_cap, options.cap_reason) if options.lifetime_cap is not None else None
    if not run.resume:
        new_version = options.new_version
        if new_version is None and options.non_confidential:
            new_version = "non-confidential data: content version declared automatically"
        ledger.start_run(
            run_id=run.run_id, plan=plan, dataset=run.dataset, fingerprint=fingerprint,
            config_digest=run.config_sha256, input_digests=input_digests_, code_version=run.code_version,
            truncation_key_hex=run.truncation_key.hex(), non_confidential=options.non_confidential,
            validated=options.validate_inputs, new_version=new_version, cap_raise=cap_raise,
            re_release=options.re_release, orchestration=run.orchestration,
        )
        return LedgerAttempt(1, {})
    recorder = ledger.resume_run(
        run.run_id, config_digest=run.config_sha256, dataset=run.dataset, fingerprint=fingerprint,
        code_version=run.code_version, reason=options.resume_reason or "resumed by the operator",
        cap_raise=cap_raise,
        plan=plan,  # the ledger refuses a resume whose plan differs from the recorded one
        re_release=options.re_release, orchestration=run.orchestration,
    )
    state = ledger.run(run.run_id)
    assert state is not None
    log.info("run resumed", run_id=run.run_id, attempt=recorder.attempt, reusable=len(state.reusable))
    return LedgerAttempt(recorder.attempt, dict(state.reusable))


def recorder_for(run: PrivateRun, plan: RunPlan, attempt: LedgerAttempt):
    """A spend recorder for this attempt of the run (each caller gets its own ledger handle)."""
    from phsafe.ledger import RunRecorder

    return RunRecorder(open_ledger(run.ledger), run.run_id, plan, attempt=attempt.attempt)


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
                privacy_defn=m.privacy_defn.value, budget=budget_text(m.budget), sensitivity=m.sensitivity,
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
    return write_tables(frames, run.release_dir)


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
        "total_budget": budget_text(plan.total),
        "non_confidential": run.options.non_confidential,
        "config": {"state_filter": list(config.state_filter), "tau": dict(config.tau)},
        "measurements": [
            {"table": m.table, "level": m.level.config_key, "budget": budget_text(m.budget),
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
        The checkpoint published in the manifest (signed if the options name a signing key).

    Raises:
        PHSafeError: The output folder exists (not this run's), the copy or rename failed (no
            space, permissions): nothing is recorded and the run can be resumed, drawing nothing.
    """
    from phsafe.ledger import load_signing_key

    options = run.options
    signing_key = load_signing_key(options.signing_key, options.public_key) if options.signing_key else None
    recorder = recorder_for(run, plan, attempt)
    release_files = dict(file_digests)
    if run.output_dir.exists() and _existing_release_of(run):
        published = _check_existing_release(run, file_digests)
        checkpoint = published["checkpoint"]
        release_files[MANIFEST] = file_digest(run.output_dir / MANIFEST)
        log.info("the release was already in place; recording its publication", output=str(run.output_dir))
    else:
        checkpoint = recorder.checkpoint(signing_key)
        manifest = public_manifest(run, config, plan, file_digests, checkpoint)
        release_files[MANIFEST] = publish_release(run.release_dir, run.output_dir, run.run_id, manifest)
    recorder.record_published(release_files, run.output_dir)
    final = recorder.checkpoint(signing_key)
    (run.run_dir / "checkpoint.json").write_text(json.dumps(final, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(run.store.directory, ignore_errors=True)
    shutil.rmtree(run.release_dir, ignore_errors=True)
    log.info("published", run_id=run.run_id, output=str(run.output_dir), files=len(release_files))
    return checkpoint


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
    return manifest


def failure_reason(exc: BaseException) -> str:
    """A short, value-free reason for the ledger: our own error's first line, else the class."""
    if isinstance(exc, PHSafeError):
        return (str(exc).splitlines() or [""])[0][:200] or type(exc).__name__
    return type(exc).__name__


@dataclass(frozen=True)
class SpendStatus:
    """What a failed attempt leaves in the ledger, for the operator's message.

    Attributes:
        run_id: The run.
        intents: INTENT entries the run has recorded over all its attempts (spends).
        committed: Measurements whose noisy vector is committed (reused by a resume).
        known: False when the ledger could not be read: the run may have spent.
    """

    run_id: str
    intents: int = 0
    committed: int = 0
    known: bool = True

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
    return SpendStatus(run.run_id, sum(len(seqs) for seqs in state.intents.values()), len(state.reusable))


def record_failure(run: PrivateRun, plan: RunPlan, attempt: LedgerAttempt | None, reason: str) -> SpendStatus:
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
        state = open_ledger(run.ledger).run(run.run_id)
    except LedgerError as exc:  # e.g. a full disk: the run stays "running" (resumable) in the ledger
        log.debug("could not read the ledger to record the failure", error=str(exc).splitlines()[0])
        return SpendStatus(run.run_id, known=False)
    if state is None or state.status is RunStatus.FINISHED:  # never started: nothing spent
        return SpendStatus(run.run_id)
    if state.status is RunStatus.RUNNING and attempt is not None and state.attempt == attempt.attempt:
        try:
            recorder_for(run, plan, attempt).fail(reason)
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
    from phsafe.errors import flow_parameters

    if status is not None and status.known:
        recorded = f"{status.intents} spend(s) of run {run.run_id} are recorded in the ledger"
    else:
        recorded = f"run {run.run_id} spent budget"
    if option("resume").startswith("--"):
        return (f"{recorded}; complete it without drawing noise again: phsafe private CONFIG DATA OUT --ledger "
                f"{run.ledger} --resume {run.run_id} --resume-reason TEXT, with a new OUT if the old one is unusable")
    known = flow_parameters()
    also = (f", or run the deployment with resume_run_id={run.run_id}"
            if known is None or "resume_run_id" in known else "")
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
) -> RunResult:
    """Ground-truth tabulation for testing on synthetic data: no truncation, no noise.

    Args:
        non_confidential: Must be True: the data is declared synthetic or public. Exact counts
            of confidential data are never written.

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
    config = load_config(config_path)
    check_budget_policy(config, non_confidential=True)
    output_dir = Path(output_dir).absolute()
    if output_dir.exists():
        raise OutputExistsError(f"output directory {output_dir} already exists; choose a new one")
    log.info("non-private run", run_id=run_id, config=str(config_path), data=str(data_dir),
             output=str(output_dir))
    specs = list(TABLES.values()) + [d.nonprivate for d in DERIVED_TABLES.values()]
    with stage("validate and count" if validate else "count"):
        counts, report = validated_counts(Path(config_path), Path(data_dir), specs, key=None, validate=validate,
                                          report_dir=output_dir.parent / f"{output_dir.name}-validation",
                                          stage=stage, progress=stage.progress)
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


@dataclass(frozen=True)
class DatasetBudget:
    """A dataset's privacy-loss account in its ledger (public facts: budgets and caps).

    Attributes:
        dataset: The dataset name.
        unit: ``rho`` (zCDP ledger) or ``epsilon`` (pure-DP ledger).
        spent: Every run's charge against the dataset (the odometer), exact.
        cap: The dataset's lifetime cap.
        run_charge: What this run charges (its plan, plus any re-spends).
        enforced: False in a non-confidential ledger (caps recorded, not enforced).
    """

    dataset: str
    unit: str
    spent: object
    cap: object
    run_charge: object
    enforced: bool

    @property
    def left(self):  # noqa: ANN201 -- an exact amount, or Infinity
        from phsafe.amounts import amount_exceeds

        if not amount_exceeds(self.cap, self.spent):
            return Fraction(0)
        if isinstance(self.cap, Fraction):
            return self.cap - Fraction(self.spent)  # type: ignore[arg-type]
        return self.cap


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
            budget_name: budget_text(m.budget),
            "sensitivity": m.sensitivity,
            "variance": m.variance,
            "moe90": m.moe90,
            "cells": m.n_cells,
            "spends": spends,
            "status": "committed" if m.key in committed else ("spent, not committed" if spends else "not spent"),
        })
    return rows
