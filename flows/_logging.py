"""Logging for flow runs: structlog configured once, into the Prefect run logs and a file.

The library logs with structlog only. Here each event becomes one JSON line, in the log file and
in the Prefect run log of the flow or task it happened in (so the UI shows it next to the task),
with the run id, the flow run id, and the table and level bound as context. Events hold stage
names, timings, digests and counts of public things, never microdata.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from phsafe import logs

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
           "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL}
_lock = threading.Lock()
_configured = False


def _to_prefect_run_log(level: str, event: dict[str, Any]) -> None:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        logger = get_run_logger()
    except MissingContextError:  # outside a flow or task run: the file and console have it
        return
    event.pop("timestamp", None)  # Prefect stamps its own
    logger.log(_LEVELS.get(level, logging.INFO), json.dumps(event, default=str, sort_keys=True))


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
        _configured = True
