"""Logging for flow runs: structlog configured once, into the Prefect run logs and a file.

The library logs with structlog only. Each event goes

* to the JSON-lines log file, whole: every field, with the run id, the flow run id, and the
  table and population-group level bound as context (for machines and for the auditors);
* to the Prefect run log of the flow or task it happened in, as one short readable line for
  the operator in the UI -- the event, then its public fields in a fixed order (stage, table,
  level, status, ...), rendered by structlog's console renderer without colours:
  ``measurement: table=PH1_num level=state_A-G status=drawn cells=70``. Fields that the flow
  run page shows already (run ids, dataset, time, severity) are left out there, and budgets
  read as decimals (``total=1.257281``, not ``1257281/1000000``).

The Prefect database is outside the enclave. Timings, memory figures and sizes of a run's stages
are functions of the confidential records (the input pass takes longer and needs more memory for
more records), so only the fields of :data:`PUBLIC_FIELDS` -- names, outcomes, budgets, sizes of
public domains, paths -- reach the Prefect run log; every other field (``seconds``,
``peak_rss_mib``, bytes, rows, rates, partitions) stays in the confidential JSON-lines file.
A field is public because it is listed here, never because nobody thought of it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from pathlib import Path
from typing import Any, Iterator

import structlog

from phsafe import logs
from tasks._format import decimal_text

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
           "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL}
_lock = threading.Lock()
_configured = False
_to_run_log: contextvars.ContextVar[bool] = contextvars.ContextVar("phsafe_events_to_run_log", default=True)

# The key fields first, in this order; any other public field follows in alphabetical order.
KEY_FIELDS = ("stage", "table", "level", "status", "cells", "measurements", "total")
PUBLIC_FIELDS = frozenset({
    *KEY_FIELDS,
    "measurement",  # TABLE/level: names of the plan
    "signal",  # the signal that asked a run to stop
    "attempt", "reusable", "files",  # counts of the plan's measurements and of the release's files
    "privacy_defn", "resume", "already_published", "unit",
    "output", "config", "data", "ledger", "destination", "rehearsal",  # paths and names the operator gave
    "run_charge", "dataset_spent", "lifetime_cap", "left", "total_budget", "attempt_spend",  # budgets
    "checkpoint_size", "checkpoint_head", "checkpoint_signed",  # the public ledger checkpoint
    "error_type", "frames",  # a defect's type and code locations (never its message)
    "code_version",
    "folders", "outputs", "work_folder", "validation_reports", "checkpoint",  # paths
})
"""Fields that may reach the Prefect run log: public by construction. Anything else -- timings,
memory figures, sizes and counts of the input pass -- stays in the confidential log file."""

# Privacy-loss amounts: exact fractions in the file, decimals for people.
BUDGET_FIELDS = {"total", "budget", "rho", "epsilon", "lifetime_cap", "planned_total", "charge"}

_FIELDS = structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0, sort_keys=False,
                                        exception_formatter=lambda sio, exc_info: None)
# Only ``key=value`` pairs, in the order given: no timestamp/severity/event columns (the
# severity column would otherwise take the population-group ``level``).
_FIELDS.columns = [c for c in _FIELDS.columns if c.key == ""]


def run_log_message(event: dict[str, Any]) -> str:
    """One readable line for the Prefect run log: ``<event>: key=value ...``."""
    fields = {k: v for k, v in event.items() if k in PUBLIC_FIELDS}
    if "table" in fields and "level" in fields:
        fields.pop("measurement", None)  # "PH1_num/state_*" says table and level again
    for key in BUDGET_FIELDS & fields.keys():
        fields[key] = decimal_text(fields[key])
    ordered = {k: fields.pop(k) for k in KEY_FIELDS if k in fields}
    ordered.update(sorted(fields.items()))
    rendered = _FIELDS(None, "info", ordered) if ordered else ""
    text = str(event.get("event", ""))
    return f"{text}: {rendered}" if rendered else text


@contextlib.contextmanager
def events_to_file_only() -> Iterator[None]:
    """Inside the block, phsafe's events go to the JSON-lines file only, not to the Prefect run
    log: for steps made of many runs (the accuracy experiment's 2·K), whose progress the task
    logs itself, one line a run."""
    token = _to_run_log.set(False)
    try:
        yield
    finally:
        _to_run_log.reset(token)


def _to_prefect_run_log(level: str, event: dict[str, Any]) -> None:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    if not _to_run_log.get() and _LEVELS.get(level, logging.INFO) < logging.WARNING:
        return
    try:
        logger = get_run_logger()
    except MissingContextError:  # outside a flow or task run: the file and console have it
        return
    logger.log(_LEVELS.get(level, logging.INFO), run_log_message(event))


class RefusalsWithoutTraceback(logging.Filter):
    """Prefect logs a failed task's exception with its traceback, and the Failed state a flow
    returns again with the engine's own. A refusal of ours (bad input, a budget refused, a release
    already made, a stop) is not a bug: the task run's log gets one line, and the flow run's state
    message says the rest once."""

    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.exceptions import FailedRun

        from phsafe.errors import PHSafeError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, FailedRun):
            # Prefect's engine raising again the Failed state a flow returned ("Engine execution
            # exited with unexpected exception" and its own frames): the flow run's state and its
            # one error line say it already.
            return False
        if isinstance(exc, PHSafeError):
            first = (str(exc).splitlines() or [""])[0]
            stopped = type(exc).__name__ == "StoppedBySignal"
            record.msg = "%s: %s -- the flow run's message says what to do" if stopped else \
                "refused (%s): %s -- the flow run's message says what to do"
            record.args = ("stopped", first[:200]) if stopped else (type(exc).__name__, first[:200])
            record.exc_info = None
            record.exc_text = None
        return True


_REFUSALS = RefusalsWithoutTraceback()


def configure_once(log_file: Path | None) -> None:
    """Configure structlog for this process, the first time only.

    A later call (a subflow, a retry) keeps the configuration; it does not reopen files.
    """
    global _configured
    with _lock:
        if _configured:
            return
        # The Prefect run logger prints to the console already: ours only warns there.
        logs.configure(log_file, console_level=logging.WARNING, sinks=[_to_prefect_run_log])
        for name in ("prefect.task_runs", "prefect.flow_runs"):
            if _REFUSALS not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(_REFUSALS)
        _configured = True
