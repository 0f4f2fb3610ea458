"""Ctrl-C and SIGTERM stop a private run at its next safe point, never in the middle of a spend.

A signal delivered as an exception lands wherever the interpreter happens to be: inside an
object's finaliser (OpenDP's) it is printed and *ignored*, and the run goes on; between a spend
and its noise it would leave the ledger to be repaired by a resume. So, while a run is under
:func:`stop_at_safe_points` (the command line), SIGINT and SIGTERM only *ask* for a stop:

* before the run can spend (planning, preflight, reading and counting the inputs), the request
  also interrupts at once (:class:`RunInterrupted`): nothing is in the ledger, nothing to resume;
* once it can spend (from opening its ledger run on), the request is only recorded, and the run
  stops at the next safe point (:func:`check`: before each spend and between stages), so no
  INTENT follows the request and every recorded spend is complete.

The sequence (:mod:`phsafe.sequence`) records the stopped run as failed and says how to resume
it. A front end that installs no handler (the Prefect flows: the worker owns the signals) is not
affected: :func:`check` is then a no-op.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["RunInterrupted", "stop_at_safe_points", "spending", "check", "requested"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class RunInterrupted(KeyboardInterrupt):
    """The operator (or the system) stopped the run; raised at a safe point.

    A KeyboardInterrupt, so that no ``except Exception`` on the way swallows it.
    """

    def __init__(self, message: str, *, could_spend: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.could_spend = could_spend
        """Raised once the run could spend: what the ledger holds decides what the operator does."""

    def __str__(self) -> str:
        return self.message


class _State:
    installed = False
    can_spend = False
    requested: str | None = None


_state = _State()


def _on_signal(signum: int, frame: Any) -> None:
    _state.requested = _NAMES.get(signal.Signals(signum), signal.Signals(signum).name)
    if not _state.can_spend:
        raise RunInterrupted(f"stopped by {_state.requested} before any budget was spent: nothing to resume, "
                             "run again when ready")


@contextmanager
def stop_at_safe_points() -> Iterator[None]:
    """Handle SIGINT and SIGTERM as described in the module docstring, in this block.

    Only in the main thread (where Python delivers signals); elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    _state.installed, _state.can_spend, _state.requested = True, False, None
    try:
        for s in _SIGNALS:
            signal.signal(s, _on_signal)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.installed, _state.can_spend, _state.requested = False, False, None


def spending() -> None:
    """The run may spend from now on: a signal only asks for a stop at the next safe point."""
    check()
    _state.can_spend = True


def requested() -> str | None:
    """The signal that asked for a stop, if one did."""
    return _state.requested


def check() -> None:
    """A safe point: stop here if a stop was asked for.

    Raises:
        RunInterrupted: Saying which signal stopped the run.
    """
    if _state.requested is None:
        return
    if not _state.can_spend:
        raise RunInterrupted(f"stopped by {_state.requested} before any budget was spent: nothing to resume, run "
                             "again when ready")
    raise RunInterrupted(f"stopped by {_state.requested} at a safe point (no spend after it)", could_spend=True)
