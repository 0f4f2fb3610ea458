"""Input and output validation as Great Expectations suites, before any budget is spent.

The rules live in ``expectations/*.json`` (Great Expectations 1.x suites, reviewed like code);
this package builds the frames they are evaluated on and reports every broken rule by file,
column(s), rule and number of failing rows -- never a value or a MAFID of a record.

Public surface:

* Input validation is the *observer* of the input pass (:mod:`phsafe.intake`, which reads each
  input once for validation and counting; :func:`phsafe.intake.validate_inputs` and
  :func:`phsafe.intake.validated_counts` are what callers use). For the pass this package
  exports :class:`ValidationSetup` (the config read, the state filter, the inputs found; its
  :meth:`~ValidationSetup.validation` is the run's observer), :func:`piece_validation` (the
  observer of one piece of a pass, in a worker process or a cluster's task),
  :class:`ValidationPiece` and :class:`FileSeen` (what a piece found),
  :func:`report_of_pieces`, :func:`prewarm` and :func:`guarded`.
* :func:`validate_outputs` -- the private output tables against the run plan (spec §7).
* :func:`validate` -- the one wrapper around Great Expectations: named frames against a suite.
* :class:`ValidationReport`, :class:`Failure`; :class:`~phsafe.errors.ValidationMachineryError` when
  validation itself could not complete (a defect, never a verdict on the data).

Importing this package is cheap: Great Expectations is imported on first use only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from phsafe.errors import PHSafeError, ValidationMachineryError, cause_in_words
from phsafe.validation._inputs import (
    FileSeen,
    InputValidation,
    ValidationPiece,
    ValidationSetup,
    piece_validation,
    report_of_pieces,
    usable_states,
)
from phsafe.validation._report import Failure, ValidationReport

if TYPE_CHECKING:
    import pandas as pd

    from phsafe.config import PHSafeConfig

__all__ = ["Failure", "FileSeen", "InputValidation", "ValidationMachineryError", "ValidationPiece", "ValidationReport",
           "ValidationSetup", "guarded", "piece_validation", "prewarm", "report_of_pieces", "trim_imports", "usable_states",
           "validate", "validate_outputs"]

ValidationError = ValidationMachineryError
"""The former name of :class:`~phsafe.errors.ValidationMachineryError`, still importable for callers that
know it; new code names the defect by its new name (inputs that fail their rules raise
:class:`~phsafe.errors.ValidationFailed`, a verdict, not a defect)."""

T = TypeVar("T")


def guarded(stage: str, call: Callable[[], T]) -> T:
    """Run ``call``; turn an unexpected exception into a ValidationMachineryError that quotes no data."""
    try:
        return call()
    except PHSafeError:
        raise
    except Exception as exc:  # noqa: BLE001 -- its message may hold a value: not chained
        raise ValidationMachineryError(f"{stage} could not complete: {cause_in_words(exc)}") from None


def prewarm() -> None:
    """Import Great Expectations (seconds) before the first evaluation: a worker process of the
    pass does it while the pass still streams its files."""
    from phsafe.validation._gx import import_gx

    import_gx()


def trim_imports() -> None:
    """In a process that only runs the pass (a worker process, the validation's second process):
    Great Expectations imported without what the suites never use -- see
    :func:`phsafe.validation._gx.trim_imports`. Call it first."""
    from phsafe.validation._gx import trim_imports as trim

    trim()


def validate_outputs(config: "PHSafeConfig", output_dir: Path, *, report_dir: Path | None = None) -> ValidationReport:
    """Validate the private output tables in ``output_dir`` (e.g. the staging directory).

    See :func:`phsafe.validation._outputs.validate_outputs`.
    """
    from phsafe.validation._outputs import validate_outputs as run

    return guarded("output validation", lambda: run(config, output_dir, report_dir=report_dir))


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
