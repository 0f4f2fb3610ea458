"""The privacy-loss ledger: exact totals, write-ahead durability, lifetime caps, concurrency.

Ledgers here are built through the real API (:class:`phsafe.ledger.Ledger`) and real noise
(:func:`phsafe.noise.measure`); hashes are recomputed independently from the format's definition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing as mp
import os
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import phsafe.ledger as ledger_mod
import phsafe.noise as noise_mod
from phsafe.accounting import RunPlan, plan_run
from phsafe.config import PHSafeConfig, PrivacyDefinition, load_config, parse_config
from phsafe.errors import BudgetError
from phsafe.ledger import (
    Ledger,
    LedgerError,
    RunStatus,
    dataset_id,
    format_exact,
    parse_exact,
    read_ledger,
)
from phsafe.noise import measure

from tests.conftest import PR_CONFIG, US_CONFIG

DIGESTS_A = {"persons.csv": "1" * 64, "units.csv": "2" * 64, "geo.csv": "3" * 64}
DIGESTS_B = {"persons.csv": "4" * 64, "units.csv": "5" * 64, "geo.csv": "6" * 64}
KEY_HEX = "ab" * 32


def small_config(defn: str = "zcdp", **budgets: Any) -> PHSafeConfig:
    """Two states; a few measured levels (others 0) so runs are quick."""
    raw = json.loads(US_CONFIG.read_text())
    for table, levels in raw["privacy_budget"].items():
        for level in levels:
            levels[level] = 0
    chosen = budgets or {
        "PH1_num": {"state_*": Decimal("0.25"), "usa_*": Decimal("0.125")},
        "PH2": {"usa_*": Decimal("0.0625")},
        "PH8_denom": {"state_A-G": Decimal("0.0625")},
    }
    for table, levels in chosen.items():
        raw["privacy_budget"][table].update(levels)
    raw["state_filter"] = ["02", "01"]
    raw["privacy_defn"] = defn
    return parse_config(raw)


def start(ledger: Ledger, plan: RunPlan, run_id: str, digests=DIGESTS_A, **kw: Any):
    return ledger.start_run(
        run_id=run_id,
        plan=plan,
        config_digest="c" * 64,
        input_digests=digests,
        code_version="test",
        truncation_key_hex=KEY_HEX,
        **kw,
    )


def run_all(recorder, plan: RunPlan) -> None:
    for m in plan.measurements:
        measure(m, np.arange(m.n_cells, dtype=np.int64), recorder)


def run_all_but_first(recorder, plan: RunPlan) -> None:
    for m in plan.measurements[1:]:
        measure(m, np.arange(m.n_cells, dtype=np.int64), recorder)


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------------------
# Totals
# --------------------------------------------------------------------------------------------


def test_production_totals_are_exact_and_recorded_exactly(tmp_path: Path) -> None:
    us = plan_run(load_config(US_CONFIG))
    pr = plan_run(load_config(PR_CONFIG))
    assert us.total == Fraction(1257281, 1000000)
    assert pr.total == Fraction(1226649, 1000000)
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    start(ledger, us, "us-run")
    start(ledger, pr, "pr-run", digests=DIGESTS_B)
    started = entries(tmp_path / "ledger.jsonl")
    assert started[0]["planned_total"] == "1.257281"
    assert started[1]["planned_total"] == "1.226649"
    assert parse_exact(started[0]["planned_total"]) == us.total
    # The recorded budgets sum, exactly, to the same total; no float is written anywhere.
    assert sum(parse_exact(p["budget"]) for p in started[0]["planned"]) == us.total
    assert len(started[0]["planned"]) == len(us.measurements) == 46
    assert len(started[1]["planned"]) == len(pr.measurements) == 23
    for line in (tmp_path / "ledger.jsonl").read_text().splitlines():
        json.loads(line, parse_float=lambda s: pytest.fail(f"float {s} in the ledger"))
    state = read_ledger(tmp_path / "ledger.jsonl")
    assert state.runs["us-run"].planned_total == us.total
    assert state.runs["us-run"].lifetime_cap == us.total  # default cap: the run's own total


def test_planned_fields_match_the_plan(tmp_path: Path) -> None:
    plan = plan_run(load_config(US_CONFIG))
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    start(ledger, plan, "r")
    recorded = {p["key"]: p for p in entries(tmp_path / "ledger.jsonl")[0]["planned"]}
    for m in plan.measurements:
        p = recorded[m.key]
        assert (p["table"], p["level"], p["sensitivity"], p["tau"], p["n_cells"]) == (
            m.table, m.level.config_key, m.sensitivity, m.tau, m.n_cells,
        )
        assert Decimal(p["budget"]) == m.budget
        assert float(p["variance"]) == m.variance
        assert parse_exact(p["noise_parameter"]) == Fraction(m.sensitivity**2) / (2 * Fraction(m.budget))


@given(st.fractions(min_value=0, max_value=10**6))
def test_exact_amounts_round_trip(value: Fraction) -> None:
    text = format_exact(value)
    assert parse_exact(text) == value
    assert format_exact(parse_exact(text)) == text


def test_exact_amounts_are_canonical() -> None:
    assert format_exact(Fraction(11, 500000)) == "0.000022"
    assert format_exact(Fraction(1, 3)) == "1/3"
    assert format_exact(Decimal("Infinity")) == "Infinity"
    assert format_exact(Fraction(5)) == "5"
    for bad in ("0.10", "00.1", "2/4", "1e-3", "-1", " 1", "0.", "inf", 1):
        with pytest.raises(ValueError):
            parse_exact(bad)


# --------------------------------------------------------------------------------------------
# Format: canonical JSON, chain, domain-separated hash
# --------------------------------------------------------------------------------------------


def test_entries_form_a_domain_separated_hash_chain(tmp_path: Path) -> None:
    config = small_config()
    plan = plan_run(config)
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    run_all(rec, plan)
    rec.record_outputs_published({"PH2/PH2.csv": "d" * 64})
    rec.finish()
    raw_lines = (tmp_path / "ledger.jsonl").read_bytes().split(b"\n")
    assert raw_lines[-1] == b""
    prev = "0" * 64
    kinds = []
    for seq, raw in enumerate(raw_lines[:-1]):
        entry = json.loads(raw)
        body = {k: v for k, v in entry.items() if k != "hash"}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert raw == json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert entry["hash"] == hashlib.sha256(b"phsafe-ledger-entry-v1\x00" + canonical).hexdigest()
        assert entry["seq"] == seq and entry["prev"] == prev and entry["run_id"] == "run-1"
        assert entry["time"].endswith("Z")
        prev = entry["hash"]
        kinds.append(entry["kind"])
    n = len(plan.measurements)
    assert kinds == ["RUN_STARTED"] + ["INTENT", "COMMITTED"] * n + ["OUTPUTS_PUBLISHED", "RUN_FINISHED"]


def test_ledger_holds_no_microdata_fields(tmp_path: Path) -> None:
    """Only the documented fields exist: digests, config digest, plan, cell counts, noisy digests."""
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    measure(plan.measurements[0], np.arange(plan.measurements[0].n_cells), rec)
    rec.fail("Traceback with data\nsecond line\x00")
    allowed = {
        "seq", "prev", "kind", "time", "run_id", "hash", "dataset_id", "input_digests", "config_digest",
        "code_version", "truncation_key", "privacy_defn", "planned", "planned_total", "lifetime_cap",
        "cap_reason", "non_confidential", "spent_before", "key", "budget", "sensitivity", "n_cells",
        "intent_seq", "intent_hash", "noisy_digest", "files", "spent", "reason",
    }
    for entry in entries(tmp_path / "ledger.jsonl"):
        assert set(entry) <= allowed
    assert "\n" not in entries(tmp_path / "ledger.jsonl")[-1]["reason"]


def test_noisy_digest_is_the_released_vector(tmp_path: Path) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    m = plan.measurements[0]
    noisy = measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
    committed = [e for e in entries(tmp_path / "ledger.jsonl") if e["kind"] == "COMMITTED"][0]
    assert committed["noisy_digest"] == noise_mod.vector_digest(noisy)


# --------------------------------------------------------------------------------------------
# Write-ahead: the INTENT is on disk (fsynced) before any noise is drawn
# --------------------------------------------------------------------------------------------


def test_intent_is_fsynced_before_noise_is_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sub" / "ledger.jsonl"
    events: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def spy_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(ledger_mod.os, "fsync", spy_fsync)
    ledger = Ledger.open(path)
    # Creating the file fsyncs the file and its directory.
    assert ("fsync", str(path)) in events and ("fsync", str(path.parent)) in events
    plan = plan_run(small_config())
    rec = start(ledger, plan, "run-1")

    real_build = noise_mod._build_mechanism

    def build(m):
        mechanism, scale = real_build(m)

        def draw(values):
            last = entries(path)[-1]
            # The spend is on disk, and the last thing the ledger did was fsync it.
            assert last["kind"] == "INTENT" and last["key"] == m.key
            assert events[-1] == ("fsync", str(path))
            events.append(("noise", m.key))
            return mechanism(values)

        return draw, scale

    monkeypatch.setattr(noise_mod, "_build_mechanism", build)
    run_all(rec, plan)
    assert [e for e in events if e[0] == "noise"] == [("noise", m.key) for m in plan.measurements]


def test_a_spend_stands_when_drawing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")

    def broken(m):
        def draw(values):
            raise RuntimeError("sampler failed")

        return draw, 1.0

    monkeypatch.setattr(noise_mod, "_build_mechanism", broken)
    with pytest.raises(RuntimeError):
        measure(plan.measurements[0], np.zeros(plan.measurements[0].n_cells, dtype=np.int64), rec)
    rec.fail("RuntimeError")
    state = read_ledger(tmp_path / "ledger.jsonl")
    run = state.runs["run-1"]
    assert run.status is RunStatus.FAILED
    assert run.charge() == Fraction(plan.measurements[0].budget)  # INTENT without COMMITTED counts


def test_recorder_refuses_spends_outside_the_plan(tmp_path: Path) -> None:
    plan = plan_run(small_config())
    other = plan_run(small_config(PH3={"state_*": Decimal("0.5")}))
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    m = plan.measurements[0]
    with pytest.raises(BudgetError, match="not a measurement"):
        rec.record_intent(other.measurements[0])
    receipt = rec.record_intent(m)
    with pytest.raises(BudgetError, match="already spent"):
        rec.record_intent(m)
    with pytest.raises(LedgerError):
        rec.record_committed(receipt, noisy_digest="not-a-digest")
    rec.record_committed(receipt, noisy_digest="e" * 64)
    with pytest.raises(LedgerError, match="already committed"):
        rec.record_committed(receipt, noisy_digest="e" * 64)
    with pytest.raises(LedgerError, match="without committing"):
        rec.finish()
    rec.fail("stopped")
    rec.fail("again")  # no-op once ended
    with pytest.raises(BudgetError, match="ended"):
        rec.record_intent(plan.measurements[1])
    read_ledger(tmp_path / "ledger.jsonl")  # nothing invalid reached the file


def test_open_rejects_a_broken_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    plan = plan_run(small_config())
    rec = start(Ledger.open(path), plan, "run-1")
    run_all(rec, plan)
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"n_cells":2', b'"n_cells":3', 1))
    with pytest.raises(LedgerError, match="entry 0"):
        Ledger.open(path)
    path.write_bytes(data[:-5])
    with pytest.raises(LedgerError, match="incomplete"):
        Ledger.open(path)


def test_ledger_detects_shrinking_under_an_open_handle(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    plan = plan_run(small_config())
    ledger = Ledger.open(path)
    rec = start(ledger, plan, "run-1")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LedgerError, match="shrank"):
        rec.record_intent(plan.measurements[0])


# --------------------------------------------------------------------------------------------
# Lifetime budget of a dataset
# --------------------------------------------------------------------------------------------


def test_second_run_is_refused_by_default(tmp_path: Path) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    run_all(rec, plan)
    rec.finish()
    with pytest.raises(BudgetError) as info:
        start(ledger, plan, "run-2")
    message = str(info.value)
    total = format_exact(plan.total)
    assert f"already spent {total}" in message and f"plans {total}" in message
    assert f"cap {total}" in message and "--lifetime-cap" in message and "--cap-reason" in message
    # A different dataset is unaffected; the refused run left no trace.
    start(ledger, plan, "run-3", digests=DIGESTS_B)
    assert [e["run_id"] for e in entries(tmp_path / "ledger.jsonl") if e["kind"] == "RUN_STARTED"] == ["run-1", "run-3"]


def test_raised_cap_needs_a_reason_which_is_recorded(tmp_path: Path) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    run_all(rec, plan)
    rec.finish()
    with pytest.raises(BudgetError, match="reason"):
        start(ledger, plan, "run-2", lifetime_cap=2 * plan.total)
    with pytest.raises(BudgetError, match="exceeds the cap"):
        start(ledger, plan, "run-2", lifetime_cap=2 * plan.total - Fraction(1, 10**9), cap_reason="re-release")
    start(ledger, plan, "run-2", lifetime_cap=2 * plan.total, cap_reason="approved re-release, memo 42")
    started = [e for e in entries(tmp_path / "ledger.jsonl") if e["kind"] == "RUN_STARTED"][-1]
    assert started["cap_reason"] == "approved re-release, memo 42"
    assert parse_exact(started["lifetime_cap"]) == 2 * plan.total
    assert parse_exact(started["spent_before"]) == plan.total


def test_intent_without_commit_counts_and_failed_runs_release_the_rest(tmp_path: Path) -> None:
    plan = plan_run(small_config())
    first = plan.measurements[0]
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    rec.record_intent(first)  # crash between INTENT and COMMITTED ...
    rec.fail("crashed while sampling")  # ... recorded as a failure
    charged = Fraction(first.budget)
    assert read_ledger(tmp_path / "ledger.jsonl").dataset_spent(dataset_id(DIGESTS_A), PrivacyDefinition.ZCDP) == charged
    # Spent so far = the one INTENT: a full run fits only under a cap of total + that INTENT.
    with pytest.raises(BudgetError):
        start(ledger, plan, "run-2", lifetime_cap=plan.total + charged - Fraction(1, 10**12), cap_reason="retry")
    start(ledger, plan, "run-2", lifetime_cap=plan.total + charged, cap_reason="retry after failure")


def test_a_crashed_run_keeps_its_whole_reservation(tmp_path: Path) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    rec.record_intent(plan.measurements[0])  # then the process dies: no terminal entry
    reopened = Ledger.open(tmp_path / "ledger.jsonl")
    state = reopened.state
    assert state.runs["run-1"].status is RunStatus.RUNNING
    assert state.dataset_spent(dataset_id(DIGESTS_A), PrivacyDefinition.ZCDP) == plan.total
    with pytest.raises(BudgetError):
        start(reopened, plan, "run-2", lifetime_cap=2 * plan.total - Fraction(1, 10**9), cap_reason="retry")


def noiseless_plan() -> RunPlan:
    """A plan with one Infinity (no-noise) budget, as a non-production test run has."""
    base = plan_run(small_config())
    first = dataclasses.replace(base.measurements[0], budget=Decimal("Infinity"))
    return RunPlan(base.privacy_defn, (first,) + base.measurements[1:])


def test_infinite_budgets_need_non_confidential_and_are_recorded(tmp_path: Path) -> None:
    plan = noiseless_plan()
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    with pytest.raises(BudgetError, match="non-confidential"):
        start(ledger, plan, "run-1")
    rec = start(ledger, plan, "run-1", non_confidential=True)
    noisy = measure(plan.measurements[0], np.arange(plan.measurements[0].n_cells), rec)
    assert list(noisy) == list(range(plan.measurements[0].n_cells))
    run_all_but_first(rec, plan)
    rec.finish()
    started = entries(tmp_path / "ledger.jsonl")[0]
    assert started["planned_total"] == "Infinity" and started["planned"][0]["budget"] == "Infinity"
    assert started["non_confidential"] is True and started["planned"][0]["variance"] == "0.0"
    # Non-confidential runs are not refused by the cap (the demo runs twice) ...
    start(ledger, plan, "run-2", non_confidential=True)
    # ... but everything they spent counts against the dataset for confidential runs.
    with pytest.raises(BudgetError, match="already spent Infinity"):
        start(ledger, plan_run(small_config()), "run-3", lifetime_cap=Fraction(1000), cap_reason="x")


def test_pure_dp_spends_count_against_zcdp_runs_as_eps_squared_over_two(tmp_path: Path) -> None:
    pure = plan_run(small_config("puredp"))
    zcdp = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, pure, "pure-1")
    run_all(rec, pure)
    rec.finish()
    converted = sum((Fraction(m.budget) ** 2 / 2 for m in pure.measurements), Fraction(0))
    state = read_ledger(tmp_path / "ledger.jsonl")
    assert state.dataset_spent(dataset_id(DIGESTS_A), PrivacyDefinition.ZCDP) == converted
    assert state.dataset_spent(dataset_id(DIGESTS_A), PrivacyDefinition.PUREDP) == pure.total
    start(ledger, zcdp, "zcdp-1", lifetime_cap=zcdp.total + converted, cap_reason="both analyses")
    # A zCDP spend has no pure-DP bound: a later pure-DP run on the dataset is refused.
    with pytest.raises(BudgetError, match="Infinity"):
        start(ledger, pure, "pure-2", lifetime_cap=Fraction(10**6), cap_reason="x")


def test_run_ids_are_unique(tmp_path: Path) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    start(ledger, plan, "same", non_confidential=True)
    with pytest.raises(LedgerError, match="already started"):
        start(ledger, plan, "same", non_confidential=True)


# --------------------------------------------------------------------------------------------
# Concurrency: check-and-record is atomic across processes
# --------------------------------------------------------------------------------------------


def _contender(path: str, run_id: str, barrier, results) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(Path(path))
    barrier.wait()
    try:
        rec = start(ledger, plan, run_id)
    except BudgetError:
        results.put((run_id, "refused"))
        return
    for m in plan.measurements:
        measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
    rec.finish()
    results.put((run_id, "ran"))


@pytest.mark.parametrize("round_", range(3))
def test_two_simultaneous_runs_exactly_one_proceeds(tmp_path: Path, round_: int) -> None:
    ctx = mp.get_context("fork")
    path = tmp_path / "ledger.jsonl"
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_contender, args=(str(path), f"run-{i}", barrier, results)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    outcome = sorted(results.get(timeout=5)[1] for _ in procs)
    assert outcome == ["ran", "refused"]
    state = read_ledger(path)
    assert len(state.runs) == 1 and next(iter(state.runs.values())).status is RunStatus.FINISHED


def _writer(path: str, run_id: str, digests: dict[str, str], barrier) -> None:
    plan = plan_run(small_config())
    ledger = Ledger.open(Path(path))
    barrier.wait()
    rec = start(ledger, plan, run_id, digests=digests)
    run_all(rec, plan)
    rec.record_outputs_published({})
    rec.finish()


def test_concurrent_appends_keep_one_valid_chain(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    path = tmp_path / "ledger.jsonl"
    barrier = ctx.Barrier(3)
    digests = [DIGESTS_A, DIGESTS_B, {k: "7" * 64 for k in DIGESTS_A}]
    procs = [ctx.Process(target=_writer, args=(str(path), f"w{i}", digests[i], barrier)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    state = read_ledger(path)
    assert {r.run_id for r in state.runs.values() if r.status is RunStatus.FINISHED} == {"w0", "w1", "w2"}
    assert state.size == 3 * (2 * len(plan_run(small_config()).measurements) + 3)


def test_checkpoint_signature(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "key.pem"
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    plan = plan_run(small_config())
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    rec = start(ledger, plan, "run-1")
    unsigned = rec.checkpoint(None)
    assert unsigned["signature"] is None and unsigned["ledger_size"] == 1
    signed = rec.checkpoint(pem)
    assert signed["head_hash"] == entries(tmp_path / "ledger.jsonl")[-1]["hash"]
    import base64

    key.public_key().verify(
        base64.b64decode(signed["signature"]), ledger_mod.checkpoint_message(1, signed["head_hash"])
    )
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(LedgerError, match="signing key"):
        rec.checkpoint(bad)
