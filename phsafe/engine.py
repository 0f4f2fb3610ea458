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
from contextlib import contextmanager
import resource
import secrets
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

import phsafe
from phsafe.accounting import PlannedMeasurement, RunPlan, plan_run
from phsafe.config import PHSafeConfig, load_config
from phsafe.counting import exact_counts
from phsafe.domain import measurement_domain
from phsafe.errors import BudgetError, PHSafeError
from phsafe.iterations import GeographyLevel
from phsafe.logs import get_logger
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


@dataclass
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


@dataclass
class RunResult:
    run_id: str
    output_dir: Path
    files: dict[str, str]
    plan: RunPlan | None = None
    timings: dict[str, float] = field(default_factory=dict)


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


def run_private(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    options: PrivateRunOptions,
    *,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Run PHSafe privately and publish the eleven tables to ``output_dir``.

    Raises:
        PHSafeError: Bad config or input (nothing spent), budget refused, or validation failed.
    """
    from phsafe.ledger import Ledger

    stage = _Stages(progress)
    run_id = new_run_id()
    config_sha256 = config_digest(Path(config_path))
    config = load_config(config_path)
    version = code_version()
    output_dir = Path(output_dir).absolute()
    if output_dir.exists():
        raise PHSafeError(f"output directory {output_dir} already exists; choose a new one")
    report_dir = options.report_dir or output_dir.parent / f"{output_dir.name}-validation"
    log.info("private run", run_id=run_id, config=str(config_path), data=str(data_dir),
             output=str(output_dir), privacy_defn=config.privacy_defn.value)
    if config.has_infinite_budget and not options.non_confidential:
        raise BudgetError(
            "Infinity budgets (no noise) are for non-confidential test data only: "
            "pass --non-confidential if this data is synthetic"
        )
    if options.validate_inputs:
        with stage("validate inputs"):
            _validate_inputs(Path(config_path), Path(data_dir), report_dir)
    files = locate_inputs(data_dir)
    with stage("digest inputs"):
        digests = input_digests(files)
    key = bytes.fromhex(options.truncation_key) if options.truncation_key else secrets.token_bytes(TRUNCATION_KEY_BYTES)
    if len(key) != TRUNCATION_KEY_BYTES:
        raise PHSafeError(f"a truncation key is {TRUNCATION_KEY_BYTES} bytes ({2 * TRUNCATION_KEY_BYTES} hex digits)")
    counts = exact_counts(config, Path(data_dir), list(TABLES.values()), key=key, stage=stage)

    plan = plan_run(config)
    for m in plan.measurements:
        check_privacy_map(m)
    log.info("plan", measurements=len(plan.measurements), total=str(plan.total),
             cells=sum(m.n_cells for m in plan.measurements))

    ledger = Ledger.open(Path(options.ledger))
    recorder = ledger.start_run(
        run_id=run_id, plan=plan, config_digest=config_sha256,
        input_digests=digests, code_version=version, truncation_key_hex=key.hex(),
        lifetime_cap=options.lifetime_cap, cap_reason=options.cap_reason,
        non_confidential=options.non_confidential,
    )
    publication = None
    finished = False
    try:
        noisy: dict[str, np.ndarray] = {}
        with stage("measure (noise)"):
            for m in plan.measurements:
                noisy[m.key] = measure(m, exact_vector(m, counts[m.table]), recorder)
        del counts
        with stage("write outputs"):
            publication = Publication.begin(output_dir, run_id)
            frames = private_tables(config, plan, noisy)
            file_digests = write_tables(frames, publication.staging)
        if options.validate_outputs:
            with stage("validate outputs"):
                from phsafe.validation import validate_outputs

                report = validate_outputs(config, publication.staging, report_dir=report_dir)
                if not report.ok:
                    raise ValidationFailed("output", report.to_text())
        with stage("publish"):
            recorder.record_outputs_published(file_digests)
            recorder.finish()
            finished = True
            checkpoint = recorder.checkpoint(options.signing_key)
            publication.write_manifest({
                "run_id": run_id,
                "mode": "private",
                "privacy_defn": config.privacy_defn.value,
                "total_budget": str(plan.total),
                "config": {"path": str(config_path), "sha256": config_sha256},
                "inputs": digests,
                "code_version": version,
                "ledger": str(Path(options.ledger).absolute()),
                "checkpoint": checkpoint,
                "files": file_digests,
            })
            publication.publish()
    except BaseException as exc:
        if publication is not None and publication.staging.exists():
            if finished:
                # Spent, recorded and complete, only not renamed: keep it for the operator.
                log.error("publication failed after the run finished; staged outputs kept",
                          staging=str(publication.staging), target=str(output_dir))
            else:
                publication.abandon()
        if not finished:  # a finished run stays finished: its spends are recorded either way
            recorder.fail(type(exc).__name__ if not isinstance(exc, PHSafeError) else str(exc).splitlines()[0][:200])
        raise
    log.info("published", run_id=run_id, output=str(output_dir), files=len(file_digests))
    return RunResult(run_id, output_dir, file_digests, plan, stage.timings)


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
