"""The outsider's privacy-loss statement binds every release to what its run was charged.

A genuine public log (made by a ledger, in memory of this process) is read by
:func:`phsafe.audit.public.statement`; then entries an insider holding the log key could append
or substitute are refused, each with one line naming the run and the difference:

* a second release of one run (plain, or with another plan);
* a release whose plan, dataset, spends or total is not its run's (its ``run-started`` and
  ``spend`` entries), or whose total is not what its own plan and spends give;
* a spend outside a run's plan, twice in one attempt, after the run ended; a resume after a
  release; a start whose odometer or cap is not the log's; a run over its cap;
* a failure published with operator text, or with a stage its spends contradict.

The statement itself counts every spend of every run -- released, failed, open -- and shows what
was spent without a release apart.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from phsafe.audit.public import statement
from phsafe.amounts import format_exact
from phsafe.errors import VerificationFailure
from phsafe.ledger import canonical_json
from phsafe.noise import measure
from phsafe.publog import log_path
from tests._ledgers import new_ledger
from tests._ledgers import start as start_run
from tests.unit.test_ledger_resume import FILES, PLAN, resume


def spend(rec, m) -> None:  # noqa: ANN001
    measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """A released run (run-1), a failed one (run-2) and an open one (run-3)."""
    ledger = new_ledger(tmp_path_factory.mktemp("statement"), cap=10 * PLAN.total)
    rec = start_run(ledger, PLAN, "run-1")
    for m in PLAN.measurements:
        spend(rec, m)
    rec.record_published(FILES, ledger.path.parent / "out")
    failed = start_run(ledger, PLAN, "run-2", re_release="again")
    spend(failed, PLAN.measurements[0])
    failed.fail("the disk under /srv/out filled up", "storage-error")
    start_run(ledger, PLAN, "run-3", re_release="and again")
    data = (log_path(ledger.path) / "entries").read_bytes().split(b"\n")[:-1]
    return [json.loads(e) for e in data]


def encoded(entries: list[dict[str, Any]]) -> list[bytes]:
    return [canonical_json(e) for e in entries]


def test_the_statement_counts_every_spend_and_shows_the_unreleased_apart(log: list[dict[str, Any]]) -> None:
    (s,) = statement(encoded(log)).datasets.values()
    budget = Fraction(PLAN.measurements[0].budget)
    assert s.releases == ["run-1"] and s.released == PLAN.total
    assert s.failed_runs == ["run-2"] and s.open_runs == ["run-3"]
    assert s.unreleased == budget + PLAN.total and s.spent == 2 * PLAN.total + budget
    line = s.line()
    print(line)
    assert "1 release(s) (run-1) charged" in line and "not (yet) released:" in line
    assert "1 failed run(s), every spend charged: run-2" in line and "1 open run(s), their whole plan charged: run-3" in line


def index_of(log: list[dict[str, Any]], kind: str, run_id: str) -> int:
    return next(i for i, e in enumerate(log) if e["type"] == kind and e.get("run_id") == run_id)


def refused(entries: list[dict[str, Any]], *parts: str) -> str:
    with pytest.raises(VerificationFailure) as caught:
        statement(encoded(entries))
    line = str(caught.value)
    print(line)
    assert "\n" not in line and all(part in line for part in parts), line
    return line


def with_(log: list[dict[str, Any]], change: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    entries = json.loads(json.dumps(log))
    change(entries)
    return entries


def test_a_second_release_of_one_run(log: list[dict[str, Any]]) -> None:
    release = log[index_of(log, "release", "run-1")]
    refused(log + [release], "run run-1 is released a second time", "a run is released once")
    more = json.loads(json.dumps(release))
    for item in more["planned"]:
        item["budget"] = "4"  # 4x the budget claimed; its own spent disagrees
    refused(log + [more], "run run-1 is released a second time")


def test_a_release_that_is_not_its_runs(log: list[dict[str, Any]]) -> None:
    i = index_of(log, "release", "run-1")

    def plan_changed(entries: list[dict[str, Any]]) -> None:
        entries[i]["planned"][0]["sensitivity"] += 1

    refused(with_(log, plan_changed), "run run-1's release states another plan than its run-started",
            f"{log[i]['planned'][0]['key']}: sensitivity")

    def dataset_changed(entries: list[dict[str, Any]]) -> None:
        entries[i]["dataset"] = "another"

    refused(with_(log, dataset_changed), "run run-1's release states dataset 'another'")

    def spends_changed(entries: list[dict[str, Any]]) -> None:
        entries[i]["spends"][0]["times"] = 2

    refused(with_(log, spends_changed), "run run-1's release states 2 spend(s)", "the log holds 1")

    def total_changed(entries: list[dict[str, Any]]) -> None:
        entries[i]["spent"] = "0.1"

    refused(with_(log, total_changed), "run run-1", "states it spent 0.1")


def test_spends_resumes_and_starts_follow_the_rules(log: list[dict[str, Any]]) -> None:
    i = index_of(log, "spend", "run-1")
    refused(log[:i + 1] + [log[i]], "run run-1 spends", "twice in one attempt")
    after_release = dict(log[i])
    refused(log + [after_release], "a spend of run run-1, which had finished")

    def spend_not_planned(entries: list[dict[str, Any]]) -> None:
        entries[i]["budget"] = "9"

    refused(with_(log, spend_not_planned), "a spend of run run-1 that its plan does not hold")
    resumed = {"type": "run-resumed", "run_id": "run-1", "dataset": log[i - 1]["dataset"], "attempt": 2,
               "code_version": "x", "reason": "again", "time": log[i]["time"]}
    refused(log + [resumed], "run run-1 is resumed after its release")
    j = index_of(log, "run-started", "run-2")

    def odometer_wrong(entries: list[dict[str, Any]]) -> None:
        entries[j]["spent_before"] = "0"

    refused(with_(log, odometer_wrong), "run run-2 states dataset", "had spent 0 before it")

    def over_cap(entries: list[dict[str, Any]]) -> None:
        for e in entries:
            if e["type"] in ("policy", "run-started"):
                e["lifetime_cap"] = format_exact(Fraction(PLAN.total) * 3 / 2)

    refused(with_(log, over_cap), "run run-2: its start takes dataset test-data to", "above its cap")


def test_a_failure_is_a_code_and_a_stage_never_text(log: list[dict[str, Any]]) -> None:
    i = index_of(log, "run-failed", "run-2")
    assert log[i]["code"] == "storage-error" and log[i]["stage"] == "measure" and "reason" not in log[i]

    def with_text(entries: list[dict[str, Any]]) -> None:
        entries[i]["reason"] = "the disk under /srv/out filled up"

    line = refused(with_(log, with_text), "run run-2's failure carries operator text")
    assert "/srv" not in line

    def unknown_code(entries: list[dict[str, Any]]) -> None:
        entries[i]["code"] = "it broke"

    refused(with_(log, unknown_code), "names no known code and stage")

    def wrong_stage(entries: list[dict[str, Any]]) -> None:
        entries[i]["stage"] = "release"

    refused(with_(log, wrong_stage), "failed at its release stage with a measurement never spent")


def test_a_resumed_run_released_once_with_its_re_spends(tmp_path: Path) -> None:
    """The binding holds across attempts: the release lists every spend of every attempt."""
    ledger = new_ledger(tmp_path, cap=10 * PLAN.total)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    rec.fail("lost", "interrupted")
    again = resume(ledger, "run-1")
    for m in PLAN.measurements:
        spend(again, m)
    again.record_published(FILES, tmp_path / "out")
    entries = (log_path(ledger.path) / "entries").read_bytes().split(b"\n")[:-1]
    (s,) = statement(entries).datasets.values()
    assert s.releases == ["run-1"] and s.spent == PLAN.total + Fraction(PLAN.measurements[0].budget)
