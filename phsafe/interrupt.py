"""SIGINT and SIGTERM stop a private run at its next safe point, never in the middle of a spend.

A signal delivered as an exception lands wherever the interpreter happens to be: inside an
object's finaliser (OpenDP's) it is printed and *ignored*, and the run goes on; between a spend
and its noise it would leave the ledger to be repaired by a resume. So, while a run is under
:func:`stop_at_safe_points` (the command line, and the Prefect flows in the flow run's process),
SIGINT and SIGTERM only *ask* for a stop:

* before the run can spend (planning, preflight, reading and counting the inputs), the request
  also interrupts at once (:class:`RunInterrupted`): nothing is in the ledger, nothing to resume;
* once it can spend (from opening its ledger run on), the request is only recorded, and the run
  stops at the next safe point (:func:`check`): between stages, before each measurement, and --
  under the ledger's lock -- right before each INTENT is appended. So no INTENT is recorded after
  the request, and a measurement whose INTENT was recorded before it is drawn and committed:
  every recorded spend is complete, and a resume reuses them all.

The sequence (:mod:`phsafe.sequence`) records the stopped run as failed ("stopped by a signal")
and says how to resume it. Scopes nest: the release flow runs both datasets' runs in one process,
and a request made during the first stops the second before it starts (:func:`requested`). Code
outside any scope is not affected: :func:`check` is then a no-op.
"""

from __future__ import annotations

import contextvars
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["RunInterrupted", "stop_at_safe_points", "spending", "check", "requested", "STOPPED_BY_A_SIGNAL"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPED_BY_A_SIGNAL = "stopped by a signal"
"""How a stopped run's failure reason begins (the ledger's RUN_FAILED, the flow run's message)."""


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


class _Scope:
    """One :func:`stop_at_safe_points` block: whether a request interrupts at once, and whom to tell."""

    def __init__(self, at_once: bool, on_request: Callable[[str], None] | None) -> None:
        self.at_once = at_once
        self.can_spend = False
        self.on_request = on_request
        self.context = contextvars.copy_context()  # the callback runs with the block's context


class _State:
    scopes: list[_Scope] = []
    requested: str | None = None
    notice = threading.Event()
    notifier: threading.Thread | None = None
    closing = False


_state = _State()


def _innermost() -> _Scope | None:
    return _state.scopes[-1] if _state.scopes else None


def _before_spending_message(name: str) -> str:
    return f"{STOPPED_BY_A_SIGNAL} ({name}) before any budget was spent: nothing to resume, run again when ready"


def _on_signal(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    if _state.requested is None:
        _state.requested = name
        _state.notice.set()  # the notifier thread tells the scopes (no I/O in a signal handler)
    scope = _innermost()
    if scope is not None and scope.at_once and not scope.can_spend:
        raise RunInterrupted(_before_spending_message(name))


def _notify() -> None:
    """The notifier thread: once a stop is requested, each open scope's callback, once."""
    _state.notice.wait()
    if _state.closing or _state.requested is None:
        return
    for scope in list(_state.scopes):
        if scope.on_request is not None:
            try:
                scope.context.run(scope.on_request, _state.requested)
            except Exception:  # noqa: BLE001 -- telling of the request must never break the stop
                pass


@contextmanager
def stop_at_safe_points(*, at_once: bool = True, on_request: Callable[[str], None] | None = None) -> Iterator[None]:
    """Handle SIGINT and SIGTERM as described in the module docstring, in this block.

    Args:
        at_once: Before :func:`spending`, a request interrupts at once (a run's block); False for
            a block that only orchestrates runs (the release flow), which reads :func:`requested`.
        on_request: Called once (in a thread of its own, with this block's context variables)
            with the signal's name when a stop is first requested: to say so in the run's logs.

    Only in the main thread (where Python delivers signals); elsewhere it does nothing. Blocks
    nest: each installs the handlers if they are not in place and restores what it found when it
    ends; a request stays requested until the outermost block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    scope = _Scope(at_once, on_request)
    outermost = not _state.scopes
    if outermost:
        _state.requested, _state.closing = None, False
        _state.notice.clear()
        _state.notifier = threading.Thread(target=_notify, name="phsafe-stop-notice", daemon=True)
        _state.notifier.start()
    # Every block (re)installs the handler: between two blocks an orchestrator may have put its
    # own in place (Prefect's SIGTERM handler around a subflow), which this block then restores.
    replaced = {s: handler for s in _SIGNALS if (handler := signal.getsignal(s)) is not _on_signal}
    _state.scopes.append(scope)
    try:
        for s in replaced:
            signal.signal(s, _on_signal)
        yield
    finally:
        _state.scopes.remove(scope)
        for s, handler in replaced.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)  # None: set outside Python
        if outermost:
            _state.closing = True
            _state.notice.set()
            if _state.notifier is not None:
                _state.notifier.join(timeout=5)
            _state.requested, _state.notifier = None, None


def spending() -> None:
    """The run may spend from now on: a signal only asks for a stop at the next safe point."""
    check()
    scope = _innermost()
    if scope is not None:
        scope.can_spend = True


def requested() -> str | None:
    """The name of the signal that asked for a stop (``SIGTERM``), if one did."""
    return _state.requested


def check() -> None:
    """A safe point: stop here if a stop was asked for. Any thread may call it.

    Raises:
        RunInterrupted: Saying which signal stopped the run.
    """
    name = _state.requested
    if name is None:
        return
    scope = _innermost()
    if scope is None or not scope.can_spend:
        raise RunInterrupted(_before_spending_message(name))
    raise RunInterrupted(f"{STOPPED_BY_A_SIGNAL} ({name}) at a safe point (no spend after it)", could_spend=True)
