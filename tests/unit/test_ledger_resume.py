"""Resuming a failed or crashed run in the privacy-loss ledger (``RUN_RESUMED``).

Every rule has a passing and a failing case, checked twice where it matters: through the API
(:meth:`Ledger.resume_run`, :class:`RunRecorder`), which raises a typed error and appends nothing,
and through the replay rules (entries forced past the API with ``Ledger.append_entries``, which
checks them exactly as ``read_ledger`` and ``phsafe audit verify`` do). Charges are compared with
exact Fractions computed by hand from the planned budgets.

Ledgers are made by ``init_ledger`` (``tests/_ledgers.py``) with a policy cap of one plan
(``PLAN.total``) unless a test says otherwise, so that, as before, a re-spend needs a recorded
cap raise; a raise is a ``CAP_RAISED`` entry of the run's dataset (``cap_raise=(cap, reason)``),
written with the RUN_STARTED or RUN_RESUMED it makes room for.
"""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phsafe.accounting import PlannedMeasurement, RunPlan, plan_run
from phsafe.config import INFINITE, PHSafeConfig, PrivacyDefinition, parse_config
from phsafe.errors import AlreadyReleasedError, BudgetError, PHSafeError
from phsafe.ledger import (
    EntryKind,
    Ledger,
    LedgerError,
    RunRecorder,
    RunStatus,
    format_exact,
    parse_exact,
    read_ledger,
)
from phsafe.publog import open_ledger, repair_ledger
from phsafe.noise import SpendReceipt, measure, vector_digest

from tests._ledgers import DIGESTS_B, FP_A, FP_B, new_ledger, rewind_public_log
from tests._ledgers import start as start_run
from tests.conftest import US_CONFIG

CONFIG_DIGEST = "c" * 64  # what tests._ledgers.start records
DATASET = "test-data"  # the dataset tests._ledgers.start runs by default
FILES = {"PH2/PH2.csv": "d" * 64, "manifest.json": "e" * 64}


def make_config(defn: str = "zcdp", budgets: dict[str, dict[str, str]] | None = None) -> PHSafeConfig:
    """Two states and a few measured levels (every other level 0), so runs are quick."""
    raw = json.loads(US_CONFIG.read_text())
    for levels in raw["privacy_budget"].values():
        for level in levels:
            levels[level] = 0
    chosen = budgets or {
        "PH1_num": {"state_*": "0.25", "usa_*": "0.125"},
        "PH2": {"usa_*": "0.0625"},
        "PH8_denom": {"state_A-G": "0.0625"},
    }
    for table, levels in chosen.items():
        raw["privacy_budget"][table].update({k: Decimal(v) for k, v in levels.items()})
    raw["state_filter"] = ["02", "01"]
    raw["privacy_defn"] = defn
    return parse_config(raw)


PLAN = plan_run(make_config())
PURE_PLAN = plan_run(make_config("puredp", {"PH1_denom": {"usa_*": "0.5"}, "PH3": {"state_H,I": "1.5"}}))
# One usa_* level of each of the nine measured tables: the engine's nine measurement tasks.
NINE_PLAN = plan_run(
    make_config(
        "zcdp",
        {t: {"usa_*": "0.0625"} for t in
         ("PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_denom", "PH6", "PH7", "PH8_denom")},
    )
)


def start(ledger: Ledger, plan: RunPlan, run_id: str, **kw: Any) -> RunRecorder:
    return start_run(ledger, plan, run_id, **kw)


def resume(ledger: Ledger, run_id: str, **kw: Any) -> RunRecorder:
    kw.setdefault("reason", "retry after worker loss")
    return ledger.resume_run(run_id, config_digest=kw.pop("config_digest", CONFIG_DIGEST),
                             dataset=kw.pop("dataset", DATASET), fingerprint=kw.pop("fingerprint", FP_A),
                             code_version=kw.pop("code_version", "v2"), **kw)


def publish(rec: RunRecorder, ledger: Ledger) -> None:
    """Record the release in place: OUTPUTS_PUBLISHED and RUN_FINISHED."""
    rec.record_published(FILES, ledger.path.parent / f"out-{rec.run_id}-{rec.attempt}")


def spend(rec: RunRecorder, m: PlannedMeasurement) -> np.ndarray:
    """Spend ``m`` with real noise on zero counts (no data is involved)."""
    return measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)


def budget(m: PlannedMeasurement) -> Fraction:
    return Fraction(m.budget)


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def resume_body(ledger: Ledger, run_id: str, **changes: Any) -> dict[str, Any]:
    """A valid RUN_RESUMED body for ``run_id``, with ``changes`` applied."""
    run = ledger.run(run_id)
    assert run is not None
    body = {
        "config_digest": run.config_digest,
        "dataset": run.dataset,
        "fingerprint": run.fingerprint,
        "code_version": "v2",
        "reason": "retry",
    }
    body.update(changes)
    return body


def raise_body(cap: Fraction | str, reason: str | None = "approved", dataset: str = DATASET) -> dict[str, Any]:
    """A CAP_RAISED body."""
    return {"dataset": dataset, "lifetime_cap": cap if isinstance(cap, str) else format_exact(cap), "reason": reason}


def force(ledger: Ledger, kind: EntryKind, run_id: str | None, body: dict[str, Any],
          *more: tuple[EntryKind, str | None, dict[str, Any]]) -> dict[str, Any]:
    """Append past the API (one write): only the replay rules (as in read_ledger and audit verify) decide."""
    with ledger.locked():
        return ledger.append_entries([(kind, run_id, body), *more])[-1]


def intent_body(m: PlannedMeasurement, plan_record: dict[str, Any]) -> dict[str, Any]:
    return {"key": m.key, "budget": plan_record["budget"], "sensitivity": plan_record["sensitivity"],
            "n_cells": plan_record["n_cells"]}


def recorded(ledger: Ledger, run_id: str, key: str) -> dict[str, Any]:
    run = ledger.run(run_id)
    assert run is not None
    return dict(run.planned[key].record)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    """A confidential zCDP ledger whose policy cap is one plan (PLAN.total)."""
    return new_ledger(tmp_path, cap=PLAN.total)


def failed_after_one_commit_and_one_intent(ledger: Ledger, plan: RunPlan = PLAN, run_id: str = "run-1",
                                           **kw: Any) -> tuple[RunRecorder, np.ndarray]:
    """Attempt 1: first measurement committed, second INTENT without COMMITTED, RUN_FAILED."""
    rec = start(ledger, plan, run_id, **kw)
    noisy = spend(rec, plan.measurements[0])
    rec.record_intent(plan.measurements[1])  # the worker died while sampling
    rec.fail("worker lost")
    return rec, noisy


# --------------------------------------------------------------------------------------------
# RUN_RESUMED: entry, state, history
# --------------------------------------------------------------------------------------------


def test_resume_records_the_entry_and_reopens_the_run(ledger: Ledger) -> None:
    """RUN_RESUMED records the dataset and fingerprint (the content identity) instead of the first
    format's dataset_id, and no cap: the cap is the dataset's, raised only by CAP_RAISED."""
    m0, m1 = PLAN.measurements[:2]
    _, noisy0 = failed_after_one_commit_and_one_intent(ledger)
    rec = resume(ledger, "run-1", plan=PLAN)
    last = entries(ledger.path)[-1]
    assert set(last) == {"seq", "prev", "kind", "time", "run_id", "hash", "config_digest", "dataset",
                         "fingerprint", "code_version", "reason"}
    assert last["kind"] == "RUN_RESUMED" and last["run_id"] == "run-1"
    assert last["config_digest"] == CONFIG_DIGEST and last["dataset"] == DATASET and last["fingerprint"] == FP_A
    assert last["code_version"] == "v2" and last["reason"] == "retry after worker loss"
    assert entries(ledger.path)[-2]["kind"] == "RUN_FAILED"  # no CAP_RAISED: the cap is kept
    run = ledger.run("run-1")
    assert run is not None and run.status is RunStatus.RUNNING and run.terminal_seq is None
    assert run.lifetime_cap == PLAN.total and run.attempts[-1].lifetime_cap == PLAN.total
    assert run.attempts[-1].cap_reason is None
    assert run.attempt == 2 and rec.attempt == 2 and run.attempt_seq == last["seq"]
    assert [(f.number, f.end_seq, f.end_reason) for f in run.failures] == [(1, last["seq"] - 1, "worker lost")]
    assert [a.code_version for a in run.attempts] == ["test", "v2"]
    assert run.code_version == "test"  # the start's lineage is kept; each attempt has its own
    # Reusable: the committed measurement, with the digest of the vector released in attempt 1.
    assert run.reusable == {m0.key: vector_digest(noisy0)}
    assert m1.key in run.intents and m1.key not in run.reusable
    # The returned recorder spends from the recorded plan: the engine's measurements are accepted
    # (a first spend, reserved at resume, passes the cap that the re-spend of m1 would break).
    assert rec.run_id == "run-1"
    spend(rec, PLAN.measurements[2])
    read_ledger(ledger.path)


def test_a_crashed_run_can_be_resumed_and_its_history_says_crashed(tmp_path: Path) -> None:
    path = new_ledger(tmp_path, cap=PLAN.total).path
    rec = start(open_ledger(path), PLAN, "run-1")
    rec.record_intent(PLAN.measurements[0])  # then the process dies: no terminal entry
    reopened = open_ledger(path)
    resume(reopened, "run-1", cap_raise=(PLAN.total + budget(PLAN.measurements[0]), "re-spend"))
    raised, resumed = entries(path)[-2:]
    assert (raised["kind"], resumed["kind"]) == ("CAP_RAISED", "RUN_RESUMED")  # one write
    assert raised["reason"] == "re-spend" and raised["dataset"] == DATASET
    run = reopened.run("run-1")
    assert run is not None and run.attempt == 2 and run.status is RunStatus.RUNNING
    crashed = run.failures
    assert len(crashed) == 1 and crashed[0].end is RunStatus.RUNNING and crashed[0].end_seq is None
    assert run.lifetime_cap == PLAN.total + budget(PLAN.measurements[0])


def test_a_finished_run_is_never_resumed(ledger: Ledger) -> None:
    rec = start(ledger, PLAN, "run-1")
    for m in PLAN.measurements:
        spend(rec, m)
    publish(rec, ledger)
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="finished at entry .* published to .*out-run-1-1; a finished run is never resumed"):
        resume(ledger, "run-1", cap_raise=(10 * PLAN.total, "x"))
    with pytest.raises(LedgerError, match="a finished run cannot be resumed"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1"))
    assert ledger.path.stat().st_size == size


def test_an_unknown_run_cannot_be_resumed(ledger: Ledger) -> None:
    start(ledger, PLAN, "run-1").fail("x")
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="never started"):
        resume(ledger, "run-9")
    with pytest.raises(LedgerError, match="never started"):
        force(ledger, EntryKind.RUN_RESUMED, "run-9", resume_body(ledger, "run-1"))
    assert ledger.path.stat().st_size == size


def test_resume_needs_the_same_config_and_records(ledger: Ledger) -> None:
    """The same inputs are now the same dataset name and content fingerprint (the first format
    compared the input files' digests, so renamed files were the same inputs; the content
    fingerprint does not depend on file names at all, and resume_run takes no input digests)."""
    start(ledger, PLAN, "run-1").fail("x")
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="config differs"):
        resume(ledger, "run-1", config_digest="d" * 64)
    with pytest.raises(LedgerError, match="input records differ from the ones it started with"):
        resume(ledger, "run-1", fingerprint=FP_B)
    with pytest.raises(LedgerError, match="started as dataset 'test-data', not 'other'"):
        resume(ledger, "run-1", dataset="other")
    with pytest.raises(LedgerError, match="config_digest differs"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", config_digest="d" * 64))
    with pytest.raises(LedgerError, match="fingerprint differs"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", fingerprint=FP_B))
    with pytest.raises(LedgerError, match="dataset differs"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", dataset="other"))
    with pytest.raises(LedgerError, match="config_digest is not"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", config_digest="C" * 64))
    assert ledger.path.stat().st_size == size
    # The code version may differ (it is recorded).
    resume(ledger, "run-1", code_version="v9")
    assert entries(ledger.path)[-1]["code_version"] == "v9"


def test_resume_needs_a_reason(ledger: Ledger) -> None:
    start(ledger, PLAN, "run-1").fail("x")
    size = ledger.path.stat().st_size
    for empty in ("", "   ", "\n"):
        with pytest.raises(LedgerError, match="reason"):
            resume(ledger, "run-1", reason=empty)
    for bad in ("", "  ", "two\nlines", 7, None, "x" * 501):
        with pytest.raises(LedgerError, match="reason"):
            force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", reason=bad))
    with pytest.raises(LedgerError, match="code_version"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", code_version=""))
    assert ledger.path.stat().st_size == size
    resume(ledger, "run-1", reason="operator re-run, ticket 12\n(with a second line)")
    assert entries(ledger.path)[-1]["reason"] == "operator re-run, ticket 12 (with a second line)"


def test_resume_checks_the_plan_it_is_given(ledger: Ledger) -> None:
    start(ledger, PLAN, "run-1").fail("x")
    size = ledger.path.stat().st_size
    other = plan_run(make_config(budgets={"PH1_num": {"state_*": "0.25", "usa_*": "0.125"},
                                          "PH2": {"usa_*": "0.125"}, "PH8_denom": {"state_A-G": "0.0625"}}))
    with pytest.raises(LedgerError, match=r"plan computed now differs .*PH2/usa_\* differs in"):
        resume(ledger, "run-1", plan=other)
    fewer = RunPlan(PLAN.privacy_defn, PLAN.measurements[1:])
    with pytest.raises(LedgerError, match="other measurements"):
        resume(ledger, "run-1", plan=fewer)
    with pytest.raises(LedgerError, match="planned in zcdp"):
        resume(ledger, "run-1", plan=PURE_PLAN)
    assert ledger.path.stat().st_size == size
    rec = resume(ledger, "run-1", plan=plan_run(make_config()))  # recomputed: equal
    # Without a plan the recorder uses the recorded plan, which equals the engine's.
    for m in PLAN.measurements:
        spend(rec, m)
    publish(rec, ledger)
    assert read_ledger(ledger.path).runs["run-1"].status is RunStatus.FINISHED


# --------------------------------------------------------------------------------------------
# The cap at resume
# --------------------------------------------------------------------------------------------


def test_resume_cap_kept_or_raised_with_a_reason_never_lowered(ledger: Ledger) -> None:
    """The cap at resume is the dataset's: kept, or raised by a CAP_RAISED (with its reason) in the
    same write as RUN_RESUMED (the first format carried lifetime_cap and cap_reason in RUN_RESUMED)."""
    start(ledger, PLAN, "run-1", cap_raise=(2 * PLAN.total, "room for retries")).fail("x")
    size = ledger.path.stat().st_size
    for lower in (PLAN.total, 2 * PLAN.total):
        with pytest.raises(BudgetError, match="only ever raised"):
            resume(ledger, "run-1", cap_raise=(lower, "lower"))
    for reason in (None, "", "   "):
        with pytest.raises(BudgetError, match="needs a reason"):
            resume(ledger, "run-1", cap_raise=(3 * PLAN.total, reason))
    with pytest.raises(BudgetError, match="not a float"):
        resume(ledger, "run-1", cap_raise=(1.0, "float"))
    with pytest.raises(LedgerError, match="a cap is only ever raised"):
        force(ledger, EntryKind.CAP_RAISED, None, raise_body(PLAN.total))
    with pytest.raises(LedgerError, match="a cap raise needs a reason"):
        force(ledger, EntryKind.CAP_RAISED, None, raise_body(3 * PLAN.total, " "))
    with pytest.raises(LedgerError, match="lifetime_cap is not a canonical"):
        force(ledger, EntryKind.CAP_RAISED, None, raise_body("1.50"))
    # Both entries are checked before either is written: a bad RUN_RESUMED takes its raise with it.
    with pytest.raises(LedgerError, match="config_digest differs"):
        force(ledger, EntryKind.CAP_RAISED, None, raise_body(3 * PLAN.total),
              (EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", config_digest="d" * 64)))
    assert ledger.path.stat().st_size == size
    assert ledger.state.dataset_cap(DATASET) == 2 * PLAN.total
    # Kept (no reason needed, even though the start's cap needed one) ...
    resume(ledger, "run-1").fail("again")
    assert [e["kind"] for e in entries(ledger.path)][-3:] == ["RUN_FAILED", "RUN_RESUMED", "RUN_FAILED"]
    # ... or raised with a reason, which is recorded.
    resume(ledger, "run-1", cap_raise=(Fraction(3) * PLAN.total, "approved, memo 7"))
    raised, resumed = entries(ledger.path)[-2:]
    assert raised["kind"] == "CAP_RAISED" and resumed["kind"] == "RUN_RESUMED"
    assert parse_exact(raised["lifetime_cap"]) == 3 * PLAN.total and raised["reason"] == "approved, memo 7"
    run = ledger.run("run-1")
    assert run is not None and run.lifetime_cap == 3 * PLAN.total
    assert [a.lifetime_cap for a in run.attempts] == [2 * PLAN.total, 2 * PLAN.total, 3 * PLAN.total]
    state = read_ledger(ledger.path)
    assert [(c.lifetime_cap, c.reason) for c in state.dataset_states[DATASET].raises] == [
        (2 * PLAN.total, "room for retries"), (3 * PLAN.total, "approved, memo 7")]


def test_each_attempt_knows_the_reason_of_its_cap(ledger: Ledger) -> None:
    """RunAttempt.cap_reason: "The cap reason recorded with that cap (None if none was given)"."""
    start(ledger, PLAN, "run-1", cap_raise=(2 * PLAN.total, "room for retries")).fail("x")
    resume(ledger, "run-1").fail("again")
    resume(ledger, "run-1", cap_raise=(3 * PLAN.total, "approved, memo 7"))
    run = ledger.run("run-1")
    assert run is not None
    assert [a.cap_reason for a in run.attempts] == ["room for retries", "room for retries", "approved, memo 7"]
    assert run.cap_reason == "approved, memo 7"


def test_infinity_cap_only_for_non_confidential_ledgers(ledger: Ledger, tmp_path: Path) -> None:
    """Confidential and non-confidential runs no longer share a ledger: the Infinity cap is a rule of
    the ledger's kind (the first format checked the run's)."""
    start(ledger, PLAN, "conf").fail("x")
    size = ledger.path.stat().st_size
    with pytest.raises(PHSafeError, match="Infinity lifetime cap is allowed only in a non-confidential ledger"):
        resume(ledger, "conf", cap_raise=(INFINITE, "x"))
    with pytest.raises(LedgerError, match="Infinity lifetime cap"):
        force(ledger, EntryKind.CAP_RAISED, None, raise_body("Infinity"))
    assert ledger.path.stat().st_size == size
    synthetic = new_ledger(tmp_path, cap=PLAN.total, non_confidential=True, name="synthetic.jsonl")
    start(synthetic, PLAN, "synth", non_confidential=True).fail("x")
    resume(synthetic, "synth", cap_raise=(INFINITE, "synthetic data"))
    assert entries(synthetic.path)[-2]["lifetime_cap"] == "Infinity"
    assert synthetic.run("synth").lifetime_cap == INFINITE


def test_resume_refused_when_the_odometer_is_above_the_cap(ledger: Ledger) -> None:
    m0 = PLAN.measurements[0]
    rec = start(ledger, PLAN, "run-1")
    rec.record_intent(m0)
    rec.fail("crashed while sampling")  # charges b0
    other = start(ledger, PLAN, "run-2", cap_raise=(PLAN.total + budget(m0), "retry as a new run"))
    for m in PLAN.measurements:
        spend(other, m)
    publish(other, ledger)
    spent = read_ledger(ledger.path).dataset_spent(DATASET, PrivacyDefinition.ZCDP)
    assert spent == PLAN.total + budget(m0)  # the dataset's cap is used up
    size = ledger.path.stat().st_size
    # run-2 released the same records: resuming run-1 is a second release, refused unless declared.
    with pytest.raises(AlreadyReleasedError, match="run run-2 published them"):
        resume(ledger, "run-1")
    again = "run-1 completes the records' second release"
    with pytest.raises(BudgetError) as info:
        resume(ledger, "run-1", re_release=again)
    # Resumed, run-1 reserves its whole plan again: run-2's plan + run-1's plan.
    need = 2 * PLAN.total
    assert f"would have spent {format_exact(need)}" in str(info.value)
    assert f"cap {format_exact(PLAN.total + budget(m0))}" in str(info.value) and "--cap-reason" in str(info.value)
    with pytest.raises(BudgetError):
        resume(ledger, "run-1", cap_raise=(need - Fraction(1, 10**9), "almost"), re_release=again)
    with pytest.raises(LedgerError, match="must declare re_release"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1"))
    with pytest.raises(LedgerError, match="resumed run exceeds the lifetime cap"):
        force(ledger, EntryKind.RUN_RESUMED, "run-1", resume_body(ledger, "run-1", re_release=again))
    assert ledger.path.stat().st_size == size
    resume(ledger, "run-1", cap_raise=(need, "second release approved"), re_release=again)
    assert read_ledger(ledger.path).runs["run-1"].re_release == again


# --------------------------------------------------------------------------------------------
# INTENT and COMMITTED across attempts
# --------------------------------------------------------------------------------------------


def test_crash_between_intent_and_commit_then_resume_charges_the_respend_twice(tmp_path: Path) -> None:
    path = new_ledger(tmp_path, cap=PLAN.total).path
    m0, m1 = PLAN.measurements[:2]
    rec = start(open_ledger(path), PLAN, "run-1")
    spend(rec, m0)
    rec.record_intent(m1)  # crash here: the noise of m1 may have been drawn and lost
    ledger = open_ledger(path)
    state = ledger.state
    assert state.runs["run-1"].charge() == PLAN.total  # crashed: whole plan reserved
    extra = budget(m1)
    rec2 = resume(ledger, "run-1", cap_raise=(PLAN.total + extra, "m1 must be spent again"))
    run = ledger.run("run-1")
    assert run is not None and set(run.reusable) == {m0.key}
    for m in PLAN.measurements:
        if m.key not in run.reusable:
            spend(rec2, m)
    publish(rec2, ledger)
    state = read_ledger(path)
    run = state.runs["run-1"]
    assert run.status is RunStatus.FINISHED and run.respent == {m1.key: 2}
    assert run.charge() == PLAN.total + extra == Fraction(1, 2) + Fraction(1, 4)
    assert state.dataset_spent(DATASET, PrivacyDefinition.ZCDP) == Fraction(3, 4)
    finished = entries(path)[-1]
    assert finished["kind"] == "RUN_FINISHED" and finished["spent"] == "0.75"
    # m0 was reused: one INTENT and one COMMITTED, both in attempt 1.
    kinds = [(e["kind"], e.get("key")) for e in entries(path)]
    assert kinds.count(("INTENT", m0.key)) == 1 and kinds.count(("INTENT", m1.key)) == 2
    assert kinds.count(("COMMITTED", m1.key)) == 1


def test_respend_refused_by_the_cap_appends_nothing(ledger: Ledger) -> None:
    m1 = PLAN.measurements[1]
    failed_after_one_commit_and_one_intent(ledger)
    rec = resume(ledger, "run-1")  # cap kept: the plan total, all of it reserved again
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError) as info:
        rec.record_intent(m1)
    message = str(info.value)
    spent = PLAN.total + budget(m1)
    for text in ("run-1", m1.key, f"spent {format_exact(spent)}", f"cap {format_exact(PLAN.total)}",
                 "resume the run", "--lifetime-cap", "--cap-reason"):
        assert text in message, text
    assert ledger.path.stat().st_size == size
    body = intent_body(m1, recorded(ledger, "run-1", m1.key))
    with pytest.raises(LedgerError, match=f"re-spending .* exceeds the lifetime cap: the dataset's odometer would "
                                          f"be {format_exact(spent)} > cap {format_exact(PLAN.total)}"):
        force(ledger, EntryKind.INTENT, "run-1", body)
    assert ledger.path.stat().st_size == size
    # Measurements never spent before are no re-spend: they were reserved at resume.
    spend(rec, PLAN.measurements[2])
    # The way out: fail, resume with the cap raised and a reason, spend again.
    rec.fail("re-spend refused by the cap")
    rec3 = resume(ledger, "run-1", cap_raise=(spent, "approved re-spend of one measurement"))
    spend(rec3, m1)
    run = ledger.run("run-1")
    assert run is not None and run.attempt == 3 and run.respent == {m1.key: 2}


def test_one_intent_per_key_per_attempt(ledger: Ledger) -> None:
    m0, m1 = PLAN.measurements[:2]
    rec = start(ledger, PLAN, "run-1", cap_raise=(10 * PLAN.total, "room"))
    receipt = rec.record_intent(m0)
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError, match="already spent .*at most once per attempt"):
        rec.record_intent(m0)
    body = intent_body(m0, recorded(ledger, "run-1", m0.key))
    with pytest.raises(LedgerError, match=f"already spent at entry {receipt.sequence} in this attempt"):
        force(ledger, EntryKind.INTENT, "run-1", body)
    assert ledger.path.stat().st_size == size
    rec.record_committed(receipt, noisy_digest="e" * 64)
    with pytest.raises(LedgerError, match="already spent"):  # committed or not: once per attempt
        force(ledger, EntryKind.INTENT, "run-1", body)
    # A crashed run is not resumed by reopening it: still one INTENT per key.
    reopened = open_ledger(ledger.path)
    with pytest.raises(LedgerError, match="already spent"):
        force(reopened, EntryKind.INTENT, "run-1", body)
    rec2 = resume(reopened, "run-1")
    rec2.record_intent(m0)  # a committed key whose stored vector is lost: spent again
    rec2.record_intent(m1)
    with pytest.raises(BudgetError, match="already spent"):
        rec2.record_intent(m0)
    with pytest.raises(LedgerError, match="already spent"):
        force(reopened, EntryKind.INTENT, "run-1", body)
    rec3 = resume(reopened, "run-1", reason="third attempt")
    rec3.record_intent(m0)
    run = reopened.run("run-1")
    assert run is not None and len(run.intents[m0.key]) == 3 and len(run.intents[m1.key]) == 1
    assert run.charge() == PLAN.total + 2 * budget(m0)
    read_ledger(reopened.path)


def test_committed_refers_to_the_latest_intent_of_the_attempt(ledger: Ledger) -> None:
    m0, m1 = PLAN.measurements[:2]
    rec = start(ledger, PLAN, "run-1", cap_raise=(10 * PLAN.total, "room"))
    old0 = rec.record_intent(m0)
    old1 = rec.record_intent(m1)
    rec.record_committed(old0, noisy_digest="e" * 64)
    rec.fail("worker lost")
    rec2 = resume(ledger, "run-1")
    # The INTENT of attempt 1 cannot be committed in attempt 2: its noise is not vouched for.
    with pytest.raises(LedgerError, match="belongs to an earlier attempt"):
        rec2.record_committed(old1, noisy_digest="f" * 64)
    with pytest.raises(LedgerError, match="already committed"):
        rec2.record_committed(old0, noisy_digest="f" * 64)
    new0 = rec2.record_intent(m0)
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="latest INTENT"):
        rec2.record_committed(old0, noisy_digest="f" * 64)  # the superseded INTENT
    forged = SpendReceipt(m0.key, new0.sequence, old0.entry_hash)
    with pytest.raises(LedgerError, match="intent_hash"):
        rec2.record_committed(forged, noisy_digest="f" * 64)
    assert ledger.path.stat().st_size == size
    run = ledger.run("run-1")
    assert run is not None and m0.key not in run.reusable  # re-spent, not yet committed
    assert run.committed[m0.key] == "e" * 64  # the latest COMMITTED is still attempt 1's
    rec2.record_committed(new0, noisy_digest="f" * 64)
    run = ledger.run("run-1")
    assert run is not None and run.reusable == {m0.key: "f" * 64}
    with pytest.raises(LedgerError, match="already committed"):
        rec2.record_committed(new0, noisy_digest="f" * 64)


def tear_the_last_entry(ledger: Ledger, keep: int = 25) -> Ledger:
    """Power loss in the middle of the last line: only its first ``keep`` bytes reached the disk.
    Repaired as an operator would (``phsafe ledger repair``); returns the reopened ledger."""
    data = ledger.path.read_bytes()
    last = data[:-1].rsplit(b"\n", 1)[-1]
    ledger.path.write_bytes(data[:len(data) - len(last) - 1 + keep])
    rewind_public_log(ledger.path)  # the torn write never reached the public log
    repair = repair_ledger(ledger.path)
    assert repair is not None and repair.dropped_bytes == keep
    return open_ledger(ledger.path)


def test_no_spend_after_the_attempts_outputs_but_a_resumed_attempt_publishes_again(ledger: Ledger) -> None:
    """OUTPUTS_PUBLISHED and RUN_FINISHED are one write now, so an attempt holds OUTPUTS_PUBLISHED
    without RUN_FINISHED only if that write was torn (the first format recorded them apart). Such an
    attempt spends nothing and publishes nothing more; a resumed attempt publishes again, drawing
    nothing."""
    rec = start(ledger, PLAN, "run-1", cap_raise=(10 * PLAN.total, "room"))
    for m in PLAN.measurements:
        spend(rec, m)
    rec.fail("rename failed")  # publishing failed before anything was recorded
    rec2 = resume(ledger, "run-1")
    run = ledger.run("run-1")
    assert run is not None and set(run.reusable) == {m.key for m in PLAN.measurements}
    publish(rec2, ledger)
    assert [e["kind"] for e in entries(ledger.path)][-2:] == ["OUTPUTS_PUBLISHED", "RUN_FINISHED"]
    ledger = tear_the_last_entry(ledger)  # RUN_FINISHED lost: the run is running, its outputs recorded
    run = ledger.run("run-1")
    assert run is not None and run.status is RunStatus.RUNNING and run.outputs_in_attempt()
    rec2 = RunRecorder(ledger, "run-1", PLAN, attempt=2)
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError, match="already published"):
        rec2.record_intent(PLAN.measurements[0])
    with pytest.raises(LedgerError, match="no spend may follow the attempt's OUTPUTS_PUBLISHED"):
        force(ledger, EntryKind.INTENT, "run-1",
              intent_body(PLAN.measurements[0], recorded(ledger, "run-1", PLAN.measurements[0].key)))
    with pytest.raises(LedgerError, match="already published"):
        publish(rec2, ledger)
    assert ledger.path.stat().st_size == size
    rec3 = resume(ledger, "run-1", reason="RUN_FINISHED was lost")
    publish(rec3, ledger)
    run = read_ledger(ledger.path).runs["run-1"]
    assert run.status is RunStatus.FINISHED and run.attempt == 3
    assert run.charge() == PLAN.total  # all reused: nothing extra
    assert run.output_path == str(ledger.path.parent / "out-run-1-3")


def test_finish_needs_every_latest_intent_committed(ledger: Ledger) -> None:
    """A run finishes by publishing (record_published: OUTPUTS_PUBLISHED and RUN_FINISHED in one
    write), only with every latest INTENT committed, and RUN_FINISHED charges the re-spends."""
    m0 = PLAN.measurements[0]
    rec = start(ledger, PLAN, "run-1", cap_raise=(10 * PLAN.total, "room"))
    for m in PLAN.measurements:
        spend(rec, m)
    rec.fail("vector store lost")
    rec2 = resume(ledger, "run-1")
    receipt = rec2.record_intent(m0)  # its stored vector is corrupt: spend again
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="before every measurement was committed"):
        publish(rec2, ledger)
    with pytest.raises(LedgerError, match="without committing"):
        force(ledger, EntryKind.RUN_FINISHED, "run-1", {"spent": format_exact(PLAN.total + budget(m0))})
    rec2.record_committed(receipt, noisy_digest="e" * 64)
    size = ledger.path.stat().st_size
    # RUN_FINISHED.spent is the charge with the re-spend, not the planned total (checked in the same
    # write as its OUTPUTS_PUBLISHED: neither is written).
    output = {"files": FILES, "output": str(ledger.path.parent / "out")}
    with pytest.raises(LedgerError, match="differs from the run's charge"):
        force(ledger, EntryKind.OUTPUTS_PUBLISHED, "run-1", output,
              (EntryKind.RUN_FINISHED, "run-1", {"spent": format_exact(PLAN.total)}))
    # A run finishes by publishing.
    with pytest.raises(LedgerError, match="without OUTPUTS_PUBLISHED in this attempt"):
        force(ledger, EntryKind.RUN_FINISHED, "run-1", {"spent": format_exact(PLAN.total + budget(m0))})
    assert ledger.path.stat().st_size == size
    publish(rec2, ledger)
    assert parse_exact(entries(ledger.path)[-1]["spent"]) == PLAN.total + budget(m0)


def test_stale_recorders_are_refused_after_a_resume(ledger: Ledger) -> None:
    m0, m1 = PLAN.measurements[:2]
    rec = start(ledger, PLAN, "run-1", cap_raise=(10 * PLAN.total, "room"))
    receipt = rec.record_intent(m0)
    # The orchestrator thinks the worker died and resumes the run (no RUN_FAILED was written).
    rec2 = resume(ledger, "run-1")
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError, match="was resumed"):
        rec.record_intent(m1)
    with pytest.raises(BudgetError, match="was resumed"):
        rec.record_committed(receipt, noisy_digest="e" * 64)
    with pytest.raises(BudgetError, match="was resumed"):
        publish(rec, ledger)
    rec.fail("the old worker gives up")  # a no-op: the run belongs to attempt 2 now
    assert ledger.path.stat().st_size == size
    assert rec2.attempt == 2
    spend(rec2, m1)


# --------------------------------------------------------------------------------------------
# Charges: exact arithmetic
# --------------------------------------------------------------------------------------------


def test_charges_are_exact_in_zcdp(ledger: Ledger) -> None:
    b = [budget(m) for m in PLAN.measurements]
    assert b == [Fraction(1, 8), Fraction(1, 4), Fraction(1, 16), Fraction(1, 16)]  # plan order
    m0, m1, m2, m3 = PLAN.measurements
    rec = start(ledger, PLAN, "run-1", cap_raise=(Fraction(2), "room for retries"))
    rec.record_intent(m0)
    rec.record_intent(m1)
    rec.fail("x")
    run = ledger.run("run-1")
    assert run is not None and run.charge() == b[0] + b[1]  # failed: its INTENTs
    assert entries(ledger.path)[-1]["spent"] == format_exact(b[0] + b[1]) == "0.375"
    rec = resume(ledger, "run-1")
    run = ledger.run("run-1")
    assert run is not None and run.charge() == PLAN.total  # running: whole plan, once each
    rec.record_intent(m0)  # re-spend
    rec.record_intent(m2)  # first spend
    run = ledger.run("run-1")
    assert run is not None and run.charge() == PLAN.total + b[0]
    assert [run.multiplicity(m.key) for m in PLAN.measurements] == [2, 1, 1, 1]
    rec.fail("y")
    run = ledger.run("run-1")
    # Failed again: every INTENT entry, re-spends included: m0 twice, m1 once, m2 once.
    assert run is not None and run.charge() == 2 * b[0] + b[1] + b[2] == Fraction(9, 16)
    assert entries(ledger.path)[-1]["spent"] == "0.5625"
    assert run.key_charge(m0.key) == Fraction(1, 4) and run.key_charge(m3.key) == 0
    rec = resume(ledger, "run-1", reason="third attempt")
    for m in (m0, m1, m3):  # m2 was never committed: its only INTENT is attempt 2's
        spend(rec, m)
    spend(rec, m2)
    publish(rec, ledger)
    state = read_ledger(ledger.path)
    run = state.runs["run-1"]
    # Finished: b_k * max(1, n_k) with n = (3, 2, 2, 1).
    want = 3 * b[0] + 2 * b[1] + 2 * b[2] + b[3]
    assert want == Fraction(17, 16)
    assert run.charge() == want and parse_exact(entries(ledger.path)[-1]["spent"]) == want
    assert state.dataset_spent(DATASET, PrivacyDefinition.ZCDP) == want
    assert run.respent == {m0.key: 3, m1.key: 2, m2.key: 2}
    assert run.attempt == 3
    assert [a.end for a in run.attempts] == [RunStatus.FAILED, RunStatus.FAILED, RunStatus.FINISHED]
    # A later run on the dataset sees the re-spends as spent before it ...
    started = start(ledger, PLAN, "run-2")
    assert started.attempt == 1
    assert parse_exact(entries(ledger.path)[-1]["spent_before"]) == want
    # ... exactly: 17/16 + 1/2 + 1/2 > 2.
    with pytest.raises(BudgetError, match=f"already spent {format_exact(want + PLAN.total)}, .* cap 2 "):
        start(ledger, PLAN, "run-3")


def test_charges_are_exact_in_pure_dp_and_convert_to_zcdp(tmp_path: Path) -> None:
    """Charges are counted in the ledger's unit, set at init: epsilon in a pure-DP ledger, and
    epsilon^2/2 per measurement in a zCDP ledger (each cap here is exactly what the run needs)."""
    e0, e1 = (budget(m) for m in PURE_PLAN.measurements)
    assert (e0, e1) == (Fraction(1, 2), Fraction(3, 2))
    m0, m1 = PURE_PLAN.measurements
    zcdp = e0**2 / 2 + 2 * (e1**2 / 2)
    assert zcdp == Fraction(19, 8)
    for defn, cap in ((PrivacyDefinition.PUREDP, Fraction(7, 2)), (PrivacyDefinition.ZCDP, zcdp)):
        ledger = new_ledger(tmp_path, cap=cap, privacy_defn=defn, name=f"{defn.value}.jsonl")
        rec = start(ledger, PURE_PLAN, "pure-1")
        spend(rec, m0)
        rec.record_intent(m1)
        rec.fail("lost")
        assert ledger.run("pure-1").charge() == e0 + e1  # type: ignore[union-attr]
        rec = resume(ledger, "pure-1")
        spend(rec, m1)  # the re-spend reaches the cap exactly
        publish(rec, ledger)
        state = read_ledger(ledger.path)
        run = state.runs["pure-1"]
        assert run.charge() == e0 + 2 * e1 == Fraction(7, 2)  # in the run's own unit
        assert entries(ledger.path)[-1]["spent"] == "3.5"
        # Against zCDP each pure-DP measurement counts eps^2/2, a re-spend again.
        assert state.dataset_spent(DATASET, PrivacyDefinition.ZCDP) == zcdp
        assert run.charge(PrivacyDefinition.ZCDP) == zcdp
        assert state.dataset_spent(DATASET, defn) == (Fraction(7, 2) if defn is PrivacyDefinition.PUREDP else zcdp)
        # The dataset's cap is used up, in the ledger's unit: a new run has no room.
        with pytest.raises(BudgetError, match=f"already spent {format_exact(cap)}"):
            start(ledger, PURE_PLAN, "pure-2")


def test_pure_dp_respend_cap_is_exact(tmp_path: Path) -> None:
    m0, m1 = PURE_PLAN.measurements
    ledger = new_ledger(tmp_path, cap=Fraction(5, 2), privacy_defn=PrivacyDefinition.PUREDP)
    rec = start(ledger, PURE_PLAN, "pure-1")
    spend(rec, m0)
    spend(rec, m1)
    rec.fail("vectors lost")
    rec = resume(ledger, "pure-1")
    rec.record_intent(m0)  # 2 + 1/2 = 5/2: exactly at the cap
    rec.fail("again")
    rec = resume(ledger, "pure-1", reason="third")
    with pytest.raises(BudgetError, match=r"spent 3, .*cap 2\.5"):
        rec.record_intent(m0)  # 3 > 5/2


def test_non_confidential_respends_are_not_cap_checked(tmp_path: Path) -> None:
    m0 = PLAN.measurements[0]
    ledger = new_ledger(tmp_path, cap=PLAN.total, non_confidential=True)
    rec = start(ledger, PLAN, "synth", non_confidential=True)
    rec.record_intent(m0)
    rec.fail("x")
    rec = resume(ledger, "synth")
    rec.record_intent(m0)  # above the cap (the plan total), but the ledger is non-confidential
    run = ledger.run("synth")
    assert run is not None and run.charge() == PLAN.total + budget(m0)


def test_ledgers_without_resumes_keep_their_meaning(ledger: Ledger) -> None:
    rec = start(ledger, PLAN, "run-1")
    for m in PLAN.measurements:
        spend(rec, m)
    publish(rec, ledger)
    last = entries(ledger.path)[-1]
    assert last["kind"] == "RUN_FINISHED" and parse_exact(last["spent"]) == PLAN.total
    run = read_ledger(ledger.path).runs["run-1"]
    assert run.attempt == 1 and run.failures == [] and run.respent == {}
    assert {k: len(v) for k, v in run.intents.items()} == {m.key: 1 for m in PLAN.measurements}
    assert run.reusable == run.committed


# --------------------------------------------------------------------------------------------
# Threads: nine measurement tasks share one recorder (and one Ledger object)
# --------------------------------------------------------------------------------------------


def _run_threads(n: int, target) -> list[BaseException]:
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 -- collected and asserted by the test
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return errors


def test_nine_threads_record_concurrently_on_one_ledger(tmp_path: Path) -> None:
    assert len(NINE_PLAN.measurements) == 9
    ledger = new_ledger(tmp_path)
    a = start(ledger, NINE_PLAN, "run-a")
    b = start(ledger, NINE_PLAN, "run-b", dataset="other-data", fingerprint=FP_B, digests=DIGESTS_B)
    released: dict[tuple[str, str], np.ndarray] = {}

    def task(i: int) -> None:
        m = NINE_PLAN.measurements[i]
        for rec in (a, b):  # two recorders on the same Ledger object, interleaved by nine threads
            released[(rec.run_id, m.key)] = spend(rec, m)

    assert _run_threads(9, task) == []
    for rec in (a, b):
        publish(rec, ledger)
    state = read_ledger(ledger.path)  # one valid chain, every rule holds
    # LEDGER_INIT; per run DATASET_VERSION, RUN_STARTED, 9 x (INTENT, COMMITTED), published, finished.
    assert state.size == 1 + 2 * (2 + 2 * 9 + 2)
    for run_id in ("run-a", "run-b"):
        run = state.runs[run_id]
        assert run.status is RunStatus.FINISHED and run.charge() == NINE_PLAN.total == Fraction(9, 16)
        assert {k: len(v) for k, v in run.intents.items()} == {m.key: 1 for m in NINE_PLAN.measurements}
        assert run.reusable == {m.key: vector_digest(released[(run_id, m.key)]) for m in NINE_PLAN.measurements}


def test_nine_threads_racing_to_respend_one_key_spend_it_once(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, cap=NINE_PLAN.total)
    m0 = NINE_PLAN.measurements[0]
    rec = start(ledger, NINE_PLAN, "run-1", cap_raise=(NINE_PLAN.total + budget(m0), "one retry"))
    rec.record_intent(m0)
    rec.fail("lost")
    rec2 = resume(ledger, "run-1")
    receipts: list[SpendReceipt] = []

    def task(i: int) -> None:
        receipts.append(rec2.record_intent(m0))  # list.append is atomic

    errors = _run_threads(9, task)
    assert len(receipts) == 1 and len(errors) == 8
    assert all(isinstance(e, BudgetError) and "already spent" in str(e) for e in errors)
    # The other eight measurements, concurrently: each exactly once; the cap holds exactly.
    assert _run_threads(8, lambda i: spend(rec2, NINE_PLAN.measurements[i + 1])) == []
    rec2.record_committed(receipts[0], noisy_digest="e" * 64)
    publish(rec2, ledger)
    run = read_ledger(ledger.path).runs["run-1"]
    assert run.charge() == NINE_PLAN.total + budget(m0) == Fraction(10, 16)
