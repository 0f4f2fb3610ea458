"""Run logs for people, log files for machines: the Prefect run log line of a phsafe event, and
budgets as decimals."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import pytest
import structlog

from flows._logging import run_log_message
from tasks._format import decimal_text


@pytest.mark.parametrize(("value", "text"), [
    (Fraction(1257281, 1000000), "1.257281"), ("1257281/1000000", "1.257281"), (Decimal("2.2E-5"), "0.000022"),
    (2.514562, "2.514562"), (10, "10"), (Decimal("Infinity"), "Infinity"), ("Infinity", "Infinity"),
    (Fraction(1, 3), "≈ 0.3333333333"), ("not an amount", "not an amount"),
])
def test_budgets_read_as_decimals(value, text):
    assert decimal_text(value) == text


def test_a_run_log_line_is_the_event_then_its_key_fields():
    event = {"event": "measurement", "measurement": "PH1_num/state_A-G", "status": "drawn", "cells": 70,
             "level": "state_A-G", "table": "PH1_num", "run_id": "us-20261201T0700Z-1a2b3c4d",
             "flow_run_id": "1a2b3c4d-0000", "dataset": "us", "log_level": "info", "timestamp": "2026-12-01T07:00Z"}
    assert run_log_message(event) == "measurement: table=PH1_num level=state_A-G status=drawn cells=70"
    # Timings, memory figures and sizes of the input pass are functions of the confidential records:
    # the stage's name and outcome reach Prefect, the figures stay in the confidential file.
    assert run_log_message({"event": "stage finished", "peak_rss_mib": 162, "seconds": 0.009,
                            "stage": "truncate, join and count"}) == "stage finished: stage='truncate, join and count'"
    assert run_log_message({"event": "partition stages", "partition": "MAFID 100000001-100512000",
                            "read_and_check": 6.914, "bytes": 18_700_000, "rows": 331449281}) == "partition stages"
    assert run_log_message({"event": "plan", "total": "1257281/1000000", "measurements": 46, "cells": 1224}) == \
        "plan: cells=1224 measurements=46 total=1.257281"
    assert run_log_message({"event": "run published"}) == "run published"


def test_the_log_file_keeps_every_field_and_the_population_level(tmp_path):
    from phsafe import logs

    sent: list[tuple[str, dict]] = []
    logs.configure(tmp_path / "log.jsonl", sinks=[lambda level, event: sent.append((level, event))])
    log = structlog.get_logger("test")
    with structlog.contextvars.bound_contextvars(run_id="r1", table="PH2", level="state_*"):
        log.info("measurement", measurement="PH2/state_*", status="drawn", cells=40)
        log.warning("stored measurement has the wrong shape", measurement="PH2/state_*")
    logs.configure(None)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert records[0] | {"timestamp": None} == {
        "event": "measurement", "measurement": "PH2/state_*", "status": "drawn", "cells": 40, "run_id": "r1",
        "table": "PH2", "level": "state_*", "log_level": "info", "timestamp": None}
    assert records[1]["log_level"] == "warning" and records[1]["level"] == "state_*"
    assert [level for level, _ in sent] == ["info", "warning"]
    assert run_log_message(sent[0][1]) == "measurement: table=PH2 level=state_* status=drawn cells=40"


def test_a_failed_state_a_flow_returned_is_not_logged_again_with_a_traceback():
    """Prefect's engine raises the Failed state a flow returns once more and logs it with its
    frames ("Engine execution exited with unexpected exception"): dropped, the state's message
    and the flow's one error line say it. A refusal inside a task becomes one line."""
    import logging

    from prefect.exceptions import FailedRun

    from flows._logging import RefusalsWithoutTraceback
    from phsafe.errors import PHSafeError

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "Engine execution exited with "
                                 "unexpected exception", (), (type(exc), exc, None))

    keep = RefusalsWithoutTraceback()
    assert keep.filter(record(FailedRun("the ledger /nonexistent does not exist"))) is False
    refused = record(PHSafeError("the ledger /x does not exist\nNo privacy-loss budget was spent."))
    assert keep.filter(refused) is True and refused.exc_info is None
    assert refused.getMessage() == ("refused (PHSafeError): the ledger /x does not exist -- the flow run's message "
                                    "says what to do")
    bug = record(ValueError("a bug"))
    assert keep.filter(bug) is True and bug.exc_info is not None  # a defect keeps its frames
