"""The public kind of a failure (engine.failure_code): every exception a run can end with maps to
one of the ledger's FAILURE_CODES, the most specific kind first."""

from __future__ import annotations

import errno

import pytest

from phsafe import engine, interrupt
from phsafe.errors import (
    BudgetError,
    ForkRefused,
    LedgerError,
    OutputExistsError,
    PHSafeError,
    ValidationFailed,
    WitnessesUnavailable,
)
from phsafe.ledger import FAILURE_CODES


@pytest.mark.parametrize(("exc", "code"), [
    (interrupt.RunInterrupted("stopped by a signal (SIGTERM)", could_spend=True), "interrupted"),
    (KeyboardInterrupt(), "interrupted"),
    (WitnessesUnavailable("2 of 3 witnesses unreachable"), "witness-unreachable"),  # a ForkRefused too
    (ForkRefused("the witnesses refuse the log"), "witness-refused"),  # a BudgetError too
    (BudgetError("over the cap"), "budget-refused"),
    (LedgerError("torn"), "ledger-error"),
    (ValidationFailed("output", "3 failures"), "outputs-invalid"),
    (OutputExistsError("exists"), "output-exists"),
    (OSError(errno.ENOSPC, "No space left on device"), "storage-error"),
    (PHSafeError("refused"), "refused"),
    (ZeroDivisionError(), "internal-error"),
])
def test_each_failure_has_its_public_kind(exc: BaseException, code: str) -> None:
    assert engine.failure_code(exc) == code
    assert code in FAILURE_CODES
