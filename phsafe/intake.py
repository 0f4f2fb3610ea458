"""A run's intake of its inputs: validation and exact counting in one read of each input file.

The counting's pass over the inputs (:class:`phsafe.counting.InputPass`) takes an observer; the
validation (:mod:`phsafe.validation`) is that observer, checking the same columns the counting
reads. This module puts the two together for a run, and sits above both: the counting knows
nothing of the validation, and the validation only drives the counting's pass.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from phsafe.config import ConfigFile, as_config_file
from phsafe.counting import Counting, Counts, StageTimer, exact_counts
from phsafe.errors import ConfigError
from phsafe.tables import TableSpec
from phsafe.validation import ValidationReport, validate_and_count

if TYPE_CHECKING:
    from phsafe.progress import Progress


def _untimed(name: str) -> AbstractContextManager[None]:
    return nullcontext()


def validated_counts(
    config_source: ConfigFile | Path,
    data_dir: Path,
    specs: Sequence[TableSpec],
    *,
    key: bytes | None,
    validate: bool = True,
    report_dir: Path | None = None,
    stage: StageTimer = _untimed,
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
        progress: Shows a bar of the input files read (see :class:`~phsafe.counting.InputPass`).
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
        config = config_file.model()
        counting = Counting.of(config, specs, key)
    except ConfigError:
        pass  # the report says what is wrong with the config; nothing is counted
    report, counts = validate_and_count(config_file, Path(data_dir), counting=counting,
                                        report_dir=report_dir, stage=stage, progress=progress,
                                        memory_limit=memory_limit, spill_dir=spill_dir)
    return (counts if report.ok else None), report
