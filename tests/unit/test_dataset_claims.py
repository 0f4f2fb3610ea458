"""One log per dataset, in the ledger, its public log, ``audit public`` and ``audit monitor`` (issue 35).

* a ledger made with ``datasets`` records them in LEDGER_INIT and its log's policy, and takes no
  version, cap raise or run of another dataset (one line, nothing appended); a ledger made
  before declarations accounts any dataset, as before;
* ``DATASET_RETIRED`` (with its successor log) ends a dataset's accounting in the ledger for
  good: refused while a run of it is open, and after it no run, resume, version or cap raise of
  it; its public ``dataset-retired`` entry is in the log;
* the outsider's statement says what the policy declares and what was retired, and reports a
  run of a retired or undeclared dataset, or a retirement with an open run, as a broken rule;
* the monitor reports a second log for a dataset another log accounts (``dataset-claimed``),
  but not once that log retired it publicly in favour of this one -- nor the retiring log
  itself afterwards.

The witnesses' side (registrations, their claim map) is tests/unit/test_tlog_registration.py;
with witness services and real ledgers, tests/system/test_dataset_claims.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phsafe.audit.monitor import EXIT_STATUS, monitor_once
from phsafe.audit.public import statement
from phsafe.errors import BudgetError, LedgerError, VerificationFailure
from phsafe.ledger import read_ledger
from phsafe.noise import measure
from phsafe.publog import log_path
from phsafe.publog.claims import retire_dataset
from tests._ledgers import FP_B, new_ledger
from tests._ledgers import start as start_run
from tests._witnesses import Witnesses
from tests.unit.test_ledger_resume import FILES, PLAN, resume


def spend(rec, m) -> None:  # noqa: ANN001
    measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)


def log_entries(ledger: Path) -> list[bytes]:
    return (log_path(ledger) / "entries").read_bytes().split(b"\n")[:-1]


def kinds(ledger: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in read_ledger(ledger).lines]


def test_a_ledger_accounts_only_the_datasets_it_declares(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, cap=10 * PLAN.total, datasets=["test-data", "other-data", "test-data"])
    assert read_ledger(ledger.path).declared_datasets == ("other-data", "test-data")  # sorted, once each
    policy = json.loads(log_entries(ledger.path)[0])
    assert policy["type"] == "policy" and policy["datasets"] == ["other-data", "test-data"]
    before = kinds(ledger.path)
    with pytest.raises(LedgerError) as refused:
        start_run(ledger, PLAN, "run-x", dataset="unknown-data")
    print(f"a run of an undeclared dataset: {refused.value}")
    assert "'unknown-data' is not one of the datasets this ledger declares it accounts (other-data, test-data)" \
        in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(LedgerError, match="knows no dataset 'unknown-data'"):
        ledger.raise_cap("unknown-data", 20 * PLAN.total, "more")
    assert kinds(ledger.path) == before  # nothing appended
    spend(start_run(ledger, PLAN, "run-1"), PLAN.measurements[0])  # a declared one runs
    with pytest.raises(LedgerError, match="is not a dataset name"):
        new_ledger(tmp_path / "bad", datasets=["no spaces"])
    legacy = new_ledger(tmp_path / "legacy")  # made without declarations: any dataset, as before
    assert read_ledger(legacy.path).declared_datasets is None and "datasets" not in json.loads(log_entries(legacy.path)[0])
    start_run(legacy, PLAN, "run-any", dataset="whatever-data")


def test_a_retired_dataset_is_accounted_no_more(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, cap=10 * PLAN.total, datasets=["test-data"])
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    with pytest.raises(LedgerError) as open_run:
        ledger.retire_dataset("test-data", "moving on")
    assert "run run-1 of dataset 'test-data' is open" in str(open_run.value)
    rec.fail("stopped for the test", "interrupted")
    with pytest.raises(LedgerError, match="--successor: not a log's verifier key"):
        retire_dataset(ledger.path, "test-data", reason="moving on", successor="nonsense")
    with pytest.raises(LedgerError, match="does not account dataset 'other-data'|not one of the datasets"):
        ledger.retire_dataset("other-data", "never here")
    successor = new_ledger(tmp_path / "next", datasets=["test-data"])
    vkey = successor.state.public_log["vkey"]
    entry = retire_dataset(ledger.path, "test-data", reason="test-data moves to its own ledger", successor=vkey)
    origin, key_id = vkey.split("+")[:2]
    assert entry["successor"] == {"origin": origin, "key_id": key_id}
    public = json.loads(log_entries(ledger.path)[-1])
    assert public == {"type": "dataset-retired", "dataset": "test-data", "reason": "test-data moves to its own ledger",
                      "successor": {"origin": origin, "key_id": key_id}, "time": entry["time"]}
    before = kinds(ledger.path)
    for attempt in (lambda: start_run(ledger, PLAN, "run-2", fingerprint=FP_B),
                    lambda: resume(ledger, "run-1"),
                    lambda: ledger.raise_cap("test-data", 20 * PLAN.total, "more"),
                    lambda: ledger.retire_dataset("test-data", "again")):
        with pytest.raises((LedgerError, BudgetError)) as refused:
            attempt()
        assert "retired from this ledger" in str(refused.value), refused.value
    assert kinds(ledger.path) == before
    # the outsider's statement
    s = statement(log_entries(ledger.path))
    assert s.declared == ("test-data",)
    line = s.datasets["test-data"].line()
    print(f"the statement of a retired dataset: {line}")
    assert f"retired at entry {len(log_entries(ledger.path)) - 1}" in line and f"its successor: the log {origin}" in line
    assert "retired since: test-data" in s.declaration_line()


def _forged(entries: list[bytes], index: int, **change: object) -> bytes:
    entry = json.loads(entries[index])
    entry.update(change)
    return json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()


def test_the_outsider_reports_runs_the_declaration_or_a_retirement_does_not_allow(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, cap=10 * PLAN.total, datasets=["test-data"])
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    rec.fail("stopped", "interrupted")
    ledger.retire_dataset("test-data", "moved")
    entries = log_entries(ledger.path)
    started = next(i for i, e in enumerate(entries) if json.loads(e)["type"] == "run-started")
    retired_at = len(entries) - 1
    with pytest.raises(VerificationFailure) as after:  # a run started after the retirement
        statement(entries + [_forged(entries, started, run_id="run-2")])
    print(f"a run of a retired dataset: {after.value}")
    assert after.value.finding == "rule" and f"which this log retired at entry {retired_at}" in str(after.value)
    with pytest.raises(VerificationFailure) as undeclared:  # a run of a dataset the policy does not name
        statement(entries[:retired_at] + [_forged(entries, started, run_id="run-2", dataset="other-data")])
    assert undeclared.value.finding == "rule" and "which the log's policy does not declare" in str(undeclared.value)
    failed = next(i for i, e in enumerate(entries) if json.loads(e)["type"] == "run-failed")
    with pytest.raises(VerificationFailure, match="while its run run-1 is open"):  # retired with a run open
        statement(entries[:failed] + [entries[retired_at]])
    with pytest.raises(VerificationFailure, match="retired a second time"):
        statement(entries + [entries[retired_at]])
    legacy = new_ledger(tmp_path / "legacy")
    assert "declares no datasets" in statement(log_entries(legacy.path)).declaration_line()


def test_the_monitor_lets_a_log_take_a_dataset_only_once_the_first_retired_it(tmp_path: Path) -> None:
    ws = Witnesses(1)
    (tmp_path / "w.vkey").write_text(ws[1].vkey + "\n")
    state = tmp_path / "monitor.json"

    def ledger(name: str):  # noqa: ANN202
        made = new_ledger(tmp_path / name, cap=10 * PLAN.total, datasets=["test-data"], witnesses=ws.listed(),
                          transport=ws.transport)
        ws.trust(made.state.public_log["vkey"])
        made.confirm()
        return made

    def watch(made):  # noqa: ANN001, ANN202
        return monitor_once(log_path(made.path), log_path(made.path) / "log.vkey", state_file=state,
                            witness_keys=[tmp_path / "w.vkey"])

    a = ledger("a")
    rec = start_run(a, PLAN, "run-a")
    for m in PLAN.measurements:
        spend(rec, m)
    rec.record_published(FILES, tmp_path / "out")
    assert watch(a).status == 0
    b = ledger("b")
    claimed = watch(b)
    print(f"a second log for a dataset, not retired: exit {claimed.status}: {claimed.findings[0]}")
    assert claimed.status == EXIT_STATUS["dataset-claimed"] and "already in the log" in str(claimed.findings[0])
    c = ledger("c")
    retire_dataset(a.path, "test-data", reason="moves to b", successor=b.state.public_log["vkey"], transport=ws.transport)
    assert watch(a).status == 0  # the retiring log: its retirement is kept, no claim of its own now
    taken = watch(b)
    assert taken.status == 0, taken.findings
    assert any("retired since" not in line and "declares the dataset(s) test-data" in line for line in taken.lines)
    assert json.loads(state.read_text())["claims"] == {"test-data": b.state.public_log["origin"]}
    assert watch(a).status == 0  # later rounds over the retired log stay quiet
    other = watch(c)  # a third log: b holds it now, and a retired it in favour of b, not c
    assert other.status == EXIT_STATUS["dataset-claimed"] and "already in the log" in str(other.findings[0])
