"""A private run: its identity, its ledger handle, its result.

What every stage of the private run (:mod:`phsafe.engine`, in the order :mod:`phsafe.sequence`
runs them) needs to find its files: the run id, the config, the inputs, the output folder, the
ledger and the dataset (:class:`PrivateRun`, fixed by :func:`begin_private_run` from the
operator's :class:`~phsafe.parameters.PrivateRunParameters`), and the process's handle on the
ledger (:func:`open_ledger`).
"""

from __future__ import annotations

import os
import resource
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from phsafe.accounting import RunPlan
from phsafe.config import ConfigFile, PHSafeConfig, check_budget_policy, read_config_file
from phsafe.errors import PHSafeError
from phsafe.parameters import option
from phsafe.logs import get_logger
from phsafe.measurements import MeasurementStore
from phsafe.parameters import PrivateRunParameters
from phsafe.truncation import TRUNCATION_KEY_BYTES

if TYPE_CHECKING:
    from phsafe.ledger import Ledger, Orchestration
    from phsafe.progress import Progress

log = get_logger("phsafe.engine")

LEDGER_ENV = "PHSAFE_LEDGER"
"""Environment variable naming the ledger when no ``--ledger`` is given."""
RUNS_DIR = "runs"
MEASUREMENTS_FOLDER = "measurements"
"""In a run's work folder: its noisy vectors until the release is published."""
RELEASE_FOLDER = "release"
"""In a run's work folder: the release as it is assembled, until it is published."""
CHECKPOINT_FILE = "checkpoint.json"
"""In a run's work folder: the ledger checkpoint signed once the release is recorded."""
NON_CONFIDENTIAL_DATASET = "non-confidential"


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


_ledgers: dict[Path, "Ledger"] = {}
_ledgers_lock = threading.Lock()


def open_ledger(path: Path) -> "Ledger":
    """The process's handle on the ledger at ``path``, verified once, with its public log.

    Every stage and every measurement task of a run needs the ledger; opening it anew each time
    would re-read and re-verify the whole file (a cost growing with the ledger's history). One
    :class:`~phsafe.ledger.Ledger` per file instead keeps the file open and catches up with what
    other processes appended, under the file lock, before every read and append. A file replaced
    on disk is opened anew (while the handle is open, its file's inode cannot be reused, so the
    path naming another inode is another file).

    Raises:
        LedgerError: The ledger does not exist (it is never created here) or is broken; its
            public log, log key or witness list is missing or is not the one it is bound to.
    """
    from phsafe.publog import open_ledger as open_with_log

    key = Path(path).absolute()
    with _ledgers_lock:
        cached = _ledgers.get(key)
        if cached is not None and cached.same_file():
            return cached
        if cached is not None:
            cached.close()
        ledger = open_with_log(key)
        _ledgers[key] = ledger
        return ledger


def forget_ledgers() -> None:
    """Close every ledger handle :func:`open_ledger` keeps (and its public log's files): the next
    use opens the files anew. For a process whose files were put back from elsewhere (a restore,
    a test's crash states)."""
    with _ledgers_lock:
        for ledger in _ledgers.values():
            for follower in ledger.followers:
                close = getattr(follower, "close", None)
                if close is not None:
                    close()
            ledger.close()
        _ledgers.clear()


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:12]


def code_version() -> str:
    """Package version and commit (``.dirty`` if the code differs from it), from the install
    stamp (:mod:`phsafe.provenance`): the services' user need not be able to run git."""
    from phsafe.provenance import code_version as stamped

    return stamped()


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


# --------------------------------------------------------------------------------------------
# The run's identity. Everything passed between the stages is small (paths, digests, the plan)
# except the exact counts, which stay in memory.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivateRun:
    """The identity of one private run: what every stage needs to find its files.

    Attributes:
        run_id: The ledger's run id.
        config_file: The run's one read of its config: the bytes whose digest the ledger
            records and whose parse every stage runs with (the file is not read again).
        output_dir: Where the release is published (must not exist yet): the parameter
            ``output``, or ``<output_root>/<run id>``.
        parameters: What the operator set for the run.
        ledger: The audit ledger (resolved: the parameter, ``$PHSAFE_LEDGER`` or the throwaway one).
        dataset: The declared dataset name.
        code_version: Package version and commit, recorded in the ledger.
        resume: This continues an earlier, failed or interrupted attempt of ``run_id``.
        truncation_key: The key of the truncation hash: fresh for a new run, the recorded one
            for a resumed run (so the exact counts are the same); set by :func:`preflight`.
        orchestration: The orchestrator's flow run running this attempt (recorded in the
            ledger, so that a retry of that flow run finds this run and resumes it).
    """

    run_id: str
    config_file: ConfigFile
    output_dir: Path
    parameters: PrivateRunParameters
    ledger: Path
    dataset: str
    code_version: str
    resume: bool = False
    truncation_key: bytes = field(default=b"", repr=False)
    orchestration: "Orchestration | None" = None

    @property
    def data_dir(self) -> Path:
        """The input folder."""
        return self.parameters.data

    @property
    def config_sha256(self) -> str:
        """Digest of the config's bytes, recorded in the ledger."""
        return self.config_file.sha256

    @property
    def config_path(self) -> Path:
        """Where the config was read from (for messages; its bytes are :attr:`config_file`)."""
        return self.config_file.path

    @property
    def config(self) -> PHSafeConfig:
        return self.config_file.model()

    @property
    def run_dir(self) -> Path:
        """The run's confidential work folder: ``<ledger folder>/runs/<run id>/``."""
        base = self.parameters.work_dir or self.ledger.parent / RUNS_DIR
        return Path(base).absolute() / self.run_id

    @property
    def report_dir(self) -> Path:
        """The run's validation reports (confidential: failing-row counts are a function of the data)."""
        return self.run_dir / "validation"

    @property
    def release_dir(self) -> Path:
        """Where the release is assembled (tables, data package, manifest) before it is copied
        beside ``output_dir`` and renamed into place."""
        return self.run_dir / RELEASE_FOLDER

    @property
    def store(self) -> MeasurementStore:
        return MeasurementStore(self.run_dir / MEASUREMENTS_FOLDER)


def resolve_ledger(parameters: PrivateRunParameters, output_dir: Path) -> Path:
    """The run's ledger: the parameter, else ``$PHSAFE_LEDGER``, else -- for non-confidential
    data only -- a throwaway ledger beside the output folder (``<OUT>-ledger/ledger.jsonl``)."""
    if parameters.ledger is not None:
        return Path(parameters.ledger).absolute()
    if os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV]).absolute()
    if parameters.non_confidential:
        return output_dir.parent / f"{output_dir.name}-ledger" / "ledger.jsonl"
    raise PHSafeError(
        f"name the audit ledger with {option('ledger')} (or ${LEDGER_ENV}). A ledger is created once, "
        "before any data is seen: `phsafe ledger init LEDGER --lifetime-cap RHO --reason TEXT`"
    )


def begin_private_run(
    parameters: PrivateRunParameters,
    *,
    run_id: str,
    output_dir: Path,
    orchestration: "Orchestration | None" = None,
) -> tuple[PrivateRun, PHSafeConfig]:
    """Read the config and fix the run's identity; touches no file but the config.

    Args:
        parameters: What the operator set.
        run_id: The id of the new run (a resumed run's is set by the sequence once it knows
            which run this attempt continues).
        output_dir: Where this run publishes.
        orchestration: The orchestrator's flow run that runs this attempt (recorded).

    Raises:
        PHSafeError: A bad config or budget, no ledger or dataset named, a truncation key where
            none may be chosen. Nothing is spent.
    """
    config_file = read_config_file(Path(parameters.config))  # the run's one read of its config
    config = config_file.model()
    check_budget_policy(config, non_confidential=parameters.non_confidential)
    output_dir = Path(output_dir).absolute()
    if parameters.truncation_key is not None:
        if not parameters.non_confidential:
            raise PHSafeError(
                f"{option('truncation_key')} is for non-confidential data only: on confidential data the "
                "truncation key is drawn fresh for every run (a chosen key could depend on the data), "
                f"and a resumed run ({option('resume_run_id')}) replays the key its ledger recorded"
            )
        try:
            key = bytes.fromhex(parameters.truncation_key)
        except ValueError:
            key = b""
        if len(key) != TRUNCATION_KEY_BYTES:
            raise PHSafeError(f"{option('truncation_key')} must be {2 * TRUNCATION_KEY_BYTES} hex digits "
                              f"({TRUNCATION_KEY_BYTES} bytes)")
    dataset = parameters.dataset or config.dataset
    if parameters.dataset and config.dataset and parameters.dataset != config.dataset:
        raise PHSafeError(f"the config names dataset {config.dataset!r} but {option('dataset')} says "
                          f"{parameters.dataset!r}; they must agree")
    if dataset is None:
        if not parameters.non_confidential:
            raise PHSafeError(f"name the dataset this run spends against: the config key \"dataset\" or "
                              f"{option('dataset')} NAME (e.g. cef2020-us)")
        dataset = NON_CONFIDENTIAL_DATASET
    run = PrivateRun(
        run_id=run_id, config_file=config_file, output_dir=output_dir, parameters=parameters,
        ledger=resolve_ledger(parameters, output_dir), dataset=dataset, code_version=code_version(),
        orchestration=orchestration,
    )
    return run, config


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
    sensitivity: int | str
    variance: float
    moe90: float
    cells: int


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
