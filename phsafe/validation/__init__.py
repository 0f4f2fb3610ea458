"""Input and output validation as Great Expectations suites, before any budget is spent.

The rules live in ``expectations/*.json`` (Great Expectations 1.x suites, reviewed like code);
this package builds the frames they are evaluated on and reports every broken rule by file,
column(s), rule and number of failing rows -- never a value or a MAFID of a record.

Public surface:

* :func:`validate_inputs` -- the config and the three input files (spec §1, §2), the state
  filter applied first, with the cross-file rules on frames derived from the MAFID join; one
  pass over the files, shared with the counting (:func:`validate_and_count`;
  :func:`phsafe.intake.validated_counts` validates and counts in the same pass for a run).
* :func:`validate_outputs` -- the private output tables against the run plan (spec §7).
* :func:`validate` -- the one wrapper around Great Expectations: named frames against a suite.
* :class:`ValidationReport`, :class:`Failure`; :class:`~phsafe.errors.ValidationMachineryError` when
  validation itself could not complete (a defect, never a verdict on the data).

Importing this package is cheap: Great Expectations is imported on first use only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phsafe.errors import PHSafeError, ValidationMachineryError, cause_in_words
from phsafe.validation._report import Failure, ValidationReport

if TYPE_CHECKING:
    import pandas as pd

    from phsafe.config import ConfigFile, PHSafeConfig
    from phsafe.counting import Counting, Counts, StageTimer
    from phsafe.progress import Progress

__all__ = ["Failure", "ValidationMachineryError", "ValidationReport", "validate", "validate_and_count", "validate_inputs",
           "validate_outputs"]

ValidationError = ValidationMachineryError
"""The former name of :class:`~phsafe.errors.ValidationMachineryError`, still importable for callers that
know it; new code names the defect by its new name (inputs that fail their rules raise
:class:`~phsafe.errors.ValidationFailed`, a verdict, not a defect)."""


def _guarded(stage: str, call: Callable[[], ValidationReport]) -> ValidationReport:
    """Run ``call``; turn an unexpected exception into a ValidationMachineryError that quotes no data."""
    try:
        return call()
    except PHSafeError:
        raise
    except Exception as exc:  # noqa: BLE001 -- its message may hold a value: not chained
        raise ValidationMachineryError(f"{stage} could not complete: {cause_in_words(exc)}") from None


def validate_inputs(config_path: "ConfigFile | Path", data_dir: Path, *, report_dir: Path | None = None,
                    progress: "Progress | None" = None, memory_limit: int | None = None,
                    spill_dir: Path | None = None) -> ValidationReport:
    """Validate ``config_path`` and the persons, units and geo files of ``data_dir``.

    See :func:`phsafe.validation._inputs.validate_inputs`.
    """
    from phsafe.validation._inputs import validate_inputs as run

    return _guarded("input validation", lambda: run(config_path, data_dir, report_dir=report_dir, progress=progress,
                                                     memory_limit=memory_limit, spill_dir=spill_dir))


def validate_and_count(config_path: "ConfigFile | Path", data_dir: Path, *, counting: "Counting | None",
                       report_dir: Path | None = None, stage: "StageTimer | None" = None,
                       progress: "Progress | None" = None, memory_limit: int | None = None,
                       spill_dir: Path | None = None) -> tuple[ValidationReport, "Counts | None"]:
    """Validate the inputs and count (``counting``; None: only validate) in the counting's one pass.

    See :func:`phsafe.intake.validated_counts`, which a run calls (``memory_limit`` and
    ``spill_dir`` as there).

    Returns:
        (the report, the exact counts -- None when not counting or the report is not ok).
    """
    from phsafe.validation._inputs import run_validation

    out: list[Any] = []

    def call() -> ValidationReport:
        report, counts = run_validation(config_path, data_dir, counting=counting, report_dir=report_dir, stage=stage,
                                        progress=progress, memory_limit=memory_limit, spill_dir=spill_dir)
        out.append(counts)
        return report

    report = _guarded("input validation", call)
    return report, out[0]


def validate_outputs(config: "PHSafeConfig", output_dir: Path, *, report_dir: Path | None = None) -> ValidationReport:
    """Validate the private output tables in ``output_dir`` (e.g. the staging directory).

    See :func:`phsafe.validation._outputs.validate_outputs`.
    """
    from phsafe.validation._outputs import validate_outputs as run

    return _guarded("output validation", lambda: run(config, output_dir, report_dir=report_dir))


def validate(
    frames: Mapping[str, "pd.DataFrame"],
    suite: str,
    *,
    parameters: Mapping[str, Any] | None = None,
    file_names: Mapping[str, str] | None = None,
) -> ValidationReport:
    """Evaluate the suite ``expectations/<suite>.json`` on named frames.

    Args:
        frames: Frame name (as in the suite's expectations' ``meta.frame``) -> data. Only the
            rules of the frames given are evaluated.
        suite: Suite name.
        parameters: Values of the suite's ``$PARAMETER`` references (e.g. ``state_filter``).
        file_names: File stem (``persons``, ``output``, ...) -> name to report.

    Raises:
        ValueError: A frame name is not one of the suite's frames.
    """
    from phsafe.validation._run import SuiteRun

    run = SuiteRun(suite, parameters)
    for name, data in frames.items():
        run.check(name, data)
    report = ValidationReport(subject=suite)
    report.failures.extend(run.tally.failures(dict(file_names or {})))
    report.notes.extend(run.tally.notes())
    if run.tally.any_evaluated():
        report.results.append(run.tally.result_json())
    return report
