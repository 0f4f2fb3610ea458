"""A run's intake of its inputs: each input file read once, validated and counted.

The front of the input pass. A run calls :func:`validated_counts`: the config and the inputs are
validated against the suites of ``expectations/`` (:mod:`phsafe.validation`, the pass's observer)
*and* the tables counted (:mod:`phsafe.counting`) in the same pass -- each input file is read
once -- and the counts are returned only when every rule holds. :func:`validate_inputs` validates
without counting; :func:`exact_counts` counts without validation (the checks the counting itself
needs still stop a bad input); :func:`check_pass_memory` is the run's check, before anything is
read, that the pass fits its memory limit.

The package:

* :mod:`~phsafe.intake.input_pass` -- :class:`InputPass`, the pass on one machine;
* :mod:`~phsafe.intake.parts` -- its parts: partitions, kept rows, what it found;
* :mod:`~phsafe.intake.spill` -- inputs too large for memory, routed by MAFID range to the run's
  confidential work folder;
* :mod:`~phsafe.intake.pieces` -- :class:`Piece`, what a piece of the pass done elsewhere found,
  and :func:`merge`, the one place pieces are added up;
* :mod:`~phsafe.intake.workers` -- :class:`WorkerProcesses`, the pass's worker processes on one
  machine;
* :mod:`~phsafe.intake.cluster` -- the pass as tasks for a cluster, and :func:`run_cluster_pass`,
  which runs them in their order with any ``submit`` (Prefect's on a Dask task runner);
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from phsafe.config import ConfigFile, PHSafeConfig, as_config_file
from phsafe.counting import Counting, Counts
from phsafe.errors import ConfigError, InputError
from phsafe.intake.cluster import ClusterPlan, PieceCall, conclude, plan_cluster, run_cluster_pass
from phsafe.intake.input_pass import InputPass, plan_memory, plan_parts, smallest_limit
from phsafe.intake.parts import PassPart, PassResult, StageTimer, no_timer
from phsafe.intake.pieces import Piece, merge
from phsafe.intake.spill import SPILL_FOLDER, SpillArea
from phsafe.intake.workers import WorkerProcesses
from phsafe.memory import MemoryPlan, check_memory
from phsafe.reader import locate_inputs
from phsafe.tables import TableSpec
from phsafe.validation import ValidationReport, ValidationSetup, guarded

if TYPE_CHECKING:
    from phsafe.progress import Progress

__all__ = ["SPILL_FOLDER", "ClusterPlan", "InputPass", "PassPart", "PassResult", "Piece", "PieceCall", "SpillArea",
           "StageTimer", "WorkerProcesses", "check_pass_memory", "conclude", "exact_counts", "merge", "plan_cluster",
           "run_cluster_pass", "validate_inputs", "validated_counts"]


def validated_counts(
    config_source: ConfigFile | Path,
    data_dir: Path,
    specs: Sequence[TableSpec],
    *,
    key: bytes | None,
    validate: bool = True,
    report_dir: Path | None = None,
    stage: StageTimer = no_timer,
    progress: "Progress | None" = None,
    memory_limit: int | None = None,
    spill_dir: Path | None = None,
) -> tuple[Counts | None, ValidationReport | None]:
    """Validate the config and the inputs and count the tables, reading each input file once.

    The entry point of a private (or non-private) run. With ``validate``, the config and the
    three inputs are checked against every suite of ``expectations/`` (Great Expectations) on the
    same columns the counting reads -- the state filter applied first (spec §1) -- and the counts
    are returned only when every rule holds: a failed validation returns ``(None, report)``, and
    the run must stop before any budget is spent. Without ``validate`` the counting still checks
    what it needs (formats, code lists, the layout of data stored by state) and raises an
    :class:`~phsafe.errors.InputError` at the first problem; the report is None.

    Args:
        config_source: The run's read of its ``config.json`` (or the file, read once here).
        data_dir: Folder with the persons, units and geo inputs.
        specs: Tables to count (e.g. ``list(phsafe.tables.TABLES.values())``).
        key: Truncation key; ``None`` counts without truncation (the non-private ground truth).
        validate: Validate the inputs (the default of a private run).
        report_dir: Where the validation report is written (``report_dir/inputs/``), if given.
        stage: Stage timer for progress and logs.
        progress: Shows a bar of the input files read (see :class:`InputPass`).
        memory_limit: The memory the pass may use (bytes; default: half of this machine's).
            Inputs too large for it are spilled in MAFID ranges to ``spill_dir``.
        spill_dir: The folder of the spill files: a run's ``<work folder>/spill`` (emptied
            first -- a killed earlier attempt's --, removed at the end, whatever happens); None:
            a private folder in the system's temporary folder.

    Returns:
        ``(counts, report)``: the exact counts (None when validation failed) and the validation
        report (None without ``validate``). Both are confidential.

    Raises:
        ConfigError: Without ``validate``, the config is invalid.
        InputError: Without ``validate``, an input breaks a rule the counting needs; with
            ``validate``, every rule held but the counting still refused a record (e.g. codes that
            fall in no cell of a table).
        ValidationMachineryError: Validation could not complete (a defect, never a bad input).
    """
    config_file = as_config_file(config_source)
    if not validate:
        config = config_file.model()
        return exact_counts(config, Path(data_dir), specs, key=key, stage=stage, progress=progress,
                            memory_limit=memory_limit, spill_dir=spill_dir), None
    counting = None
    try:
        counting = Counting.of(config_file.model(), specs, key)
    except ConfigError:
        pass  # the report says what is wrong with the config; nothing is counted
    report, counts = _validated_pass(config_file, Path(data_dir), counting=counting, report_dir=report_dir,
                                     stage=stage, progress=progress, memory_limit=memory_limit, spill_dir=spill_dir)
    return (counts if report.ok else None), report


def validate_inputs(config_source: ConfigFile | Path, data_dir: Path, *, report_dir: Path | None = None,
                    progress: "Progress | None" = None, memory_limit: int | None = None,
                    spill_dir: Path | None = None) -> ValidationReport:
    """Validate ``config.json`` and the input files of ``data_dir`` (spec §1, §2), counting nothing.

    Spends no budget. Never raises on bad input: every problem is a
    :class:`~phsafe.validation.Failure` of the returned report.

    Args:
        config_source: The run's configuration (its one read, or the file: read once here).
        data_dir: Folder holding persons, units and geo (CSV, Parquet, or Parquet stored by state).
        report_dir: If given, the report, the value-free Great Expectations results and their
            Data Docs are written to ``report_dir/inputs/``.
        progress: Shows the stages (read, evaluate the rules, write the report) and a bar of the
            input files read.
        memory_limit, spill_dir: As :func:`validated_counts`.

    Raises:
        ValidationMachineryError: Validation could not complete (a defect, never a bad input).
    """
    return _validated_pass(config_source, Path(data_dir), counting=None, report_dir=report_dir,
                           stage=no_timer if progress is None else progress.stage, progress=progress,
                           memory_limit=memory_limit, spill_dir=spill_dir)[0]


def _validated_pass(config_source: ConfigFile | Path, data_dir: Path, *, counting: Counting | None,
                    report_dir: Path | None, stage: StageTimer, progress: "Progress | None",
                    memory_limit: int | None, spill_dir: Path | None) -> tuple[ValidationReport, Counts | None]:
    """One pass with the validation as its observer; (the report, the counts -- None when not
    counting or the report is not ok).

    Raises:
        InputError: Every rule held, but the counting refused a record.
    """

    def run() -> tuple[ValidationReport, PassResult]:
        setup = ValidationSetup.of(config_source, data_dir)
        observer = setup.validation()
        try:
            config_run = observer.config(setup.raw)
            result = InputPass(setup.files(), setup.states, observer=observer,
                               counting=counting if not setup.missing else None, stage=stage, progress=progress,
                               memory_limit=memory_limit, spill_dir=spill_dir).run()
            # Great Expectations evaluates the rule groups as the pass submits them (on the second
            # core for a large input); what is still running when the pass ends is waited for here.
            with stage("evaluate the rules (Great Expectations)"):
                report = observer.report(result, config_run, setup.load_failure, setup.missing, setup.states)
            if report_dir is not None:
                with stage("write the validation report"):
                    observer.write_report(report, Path(report_dir))
        finally:
            observer.close()
        return report, result

    report, result = guarded("input validation", run)
    counts = None
    if counting is not None and report.ok:
        if result.count_error is not None:
            raise result.count_error
        counts = result.counts
    return report, counts


def exact_counts(
    config: PHSafeConfig,
    data_dir: Path,
    specs: Sequence[TableSpec],
    *,
    key: bytes | None,
    stage: StageTimer = no_timer,
    progress: "Progress | None" = None,
    memory_limit: int | None = None,
    spill_dir: Path | None = None,
) -> Counts:
    """Exact count cubes of ``specs`` over the states of ``config``, and their content digest.

    One :class:`InputPass` without validation: each input file is read once, a partition (a
    state, for data stored by state; else the whole input) at a time, the next partition read
    while this one is counted. Peak memory is that of the largest partition.

    Args:
        config: The run's config (state filter and the truncation thresholds τ).
        data_dir: Folder with the persons, units and geo inputs.
        specs: Tables to count.
        key: Truncation key; ``None`` counts without truncation (the non-private ground truth).
        stage: Stage timer for progress and logs.
        progress: Shows a bar of the input files read (see :class:`InputPass`).
        memory_limit, spill_dir: The pass's memory budget and where it spills (see :class:`InputPass`).

    Raises:
        InputError: An input is unreadable or has inconsistent codes (nothing is spent).
        PHSafeError: The inputs cannot be processed within ``memory_limit``, or spill files
            cannot be written.
    """
    files = locate_inputs(data_dir)
    result = InputPass(files, config.states, counting=Counting.of(config, specs, key), stage=stage,
                       progress=progress, memory_limit=memory_limit, spill_dir=spill_dir).run()
    assert result.counts is not None
    return result.counts


def check_pass_memory(data_dir: Path, states: tuple[str, ...] | None, *, memory_limit: int | None = None,
                      validate: bool = True, spill_dir: Path | None = None) -> MemoryPlan | None:
    """Check, before anything is read, that the input pass can run within ``memory_limit`` and,
    if it must spill, that the spill fits on ``spill_dir``'s file system (a run's preflight).

    Cheap: file listings, Parquet metadata, a few line lengths of each CSV file.

    Returns:
        The pass's memory plan (None when the inputs cannot even be located: the pass itself
        reports that, as it reports every input problem).

    Raises:
        PHSafeError: One line that says what to do: the limit it needs, or the space the spill
            needs. Nothing is read, nothing spent.
    """
    from phsafe.memory import default_memory_limit, plan_target

    try:
        files = locate_inputs(data_dir)
    except InputError:
        return None
    parts, _, states_found = plan_parts(files, states)
    by_state = states_found is not None
    limit = memory_limit if memory_limit is not None else default_memory_limit()
    plan = plan_memory(parts, limit, validate=validate, by_state=by_state, target=plan_target(memory_limit))
    check_memory(plan, smallest_limit(parts, validate=validate, by_state=by_state), spill_dir)
    return plan
