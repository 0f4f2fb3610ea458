"""The privacy-loss ledger: policy, exact totals, write-ahead durability, lifetime caps per
declared dataset, publication, repair, migration, concurrency.

Ledgers here are made the only way ledgers are made (:func:`phsafe.ledger.init_ledger`, through
``tests/_ledgers.py``) and used through the real API (:class:`phsafe.ledger.Ledger`) with real
noise (:func:`phsafe.noise.measure`); hashes are recomputed independently from the format's
definition. What only the replay rules can reject (``read_ledger``, the same code ``phsafe audit
verify`` runs) is written by hand with a correct hash chain (``tests._ledgers.craft``); ledgers of
the first format are written by hand too (``tests._ledgers.FirstFormatLedger``). The rules on
ledger lines in memory, without files, are in ``test_ledger_rules.py``; exact amounts in
``test_amounts.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import hmac
import json
import os
import stat
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import phsafe.ledger as ledger_mod
import phsafe.ledger.store as store_mod
import phsafe.noise as noise_mod
from phsafe.accounting import RunPlan, plan_run
from phsafe.config import INFINITE, PHSafeConfig, PrivacyDefinition, load_config, parse_config
from phsafe.errors import BudgetError, PHSafeError
from phsafe.ledger import (
    Ledger,
    LedgerError,
    RunStatus,
    TornTailError,
    dataset_id,
    format_exact,
    key_id,
    key_path,
    lock_path,
    migrate_ledger,
    parse_exact,
    read_ledger,
)
from phsafe.publog import create_ledger, open_ledger, repair_ledger
from phsafe.noise import measure

from tests._ledgers import (
    DIGESTS_A,
    DIGESTS_B,
    FP_A,
    FP_B,
    FirstFormatLedger,
    craft,
    new_ledger,
    start,
)
from tests.conftest import PR_CONFIG, US_CONFIG

DATASET = "test-data"  # the dataset tests._ledgers.start runs by default
FILES = {"PH2/PH2.csv": "d" * 64, "manifest.json": "e" * 64}
COMMON = {"seq", "prev", "kind", "time", "run_id", "hash"}


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


PLAN = plan_run(small_config())


def run_all(recorder, plan: RunPlan) -> None:
    for m in plan.measurements:
        measure(m, np.arange(m.n_cells, dtype=np.int64), recorder)


def run_all_but_first(recorder, plan: RunPlan) -> None:
    for m in plan.measurements[1:]:
        measure(m, np.arange(m.n_cells, dtype=np.int64), recorder)


def publish(recorder, out: Path) -> None:
    """Record the release (as the engine does once it is renamed into place)."""
    recorder.record_published(FILES, out)


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def of_kind(path: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in entries(path) if e["kind"] == kind]


def body_of(entry: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """An entry's body fields (without the common ones), with ``changes``."""
    body = {k: v for k, v in entry.items() if k not in COMMON}
    body.update(changes)
    return body


def rejected(path: Path, seq: int, kind: str, match: str) -> LedgerError:
    """``read_ledger`` rejects the ledger at entry ``seq`` (``kind``), for ``match``."""
    with pytest.raises(LedgerError, match=match) as info:
        read_ledger(path)
    assert (info.value.seq, info.value.kind) == (seq, kind), str(info.value)
    assert str(info.value).startswith(f"entry {seq} ({kind}): ")
    return info.value


# --------------------------------------------------------------------------------------------
# Totals
# --------------------------------------------------------------------------------------------


def test_production_totals_are_exact_and_recorded_exactly(tmp_path: Path) -> None:
    """The default cap of a run is its dataset's cap, which the ledger's policy set at init (the
    first format used the run's own planned total)."""
    us = plan_run(load_config(US_CONFIG))
    pr = plan_run(load_config(PR_CONFIG))
    assert us.total == Fraction(1257281, 1000000)
    assert pr.total == Fraction(1226649, 1000000)
    ledger = new_ledger(tmp_path, cap=2)
    start(ledger, us, "us-run", dataset="cef2020-us")
    start(ledger, pr, "pr-run", dataset="cef2020-pr", fingerprint=FP_B, digests=DIGESTS_B)
    started = of_kind(ledger.path, "RUN_STARTED")
    assert started[0]["planned_total"] == "1.257281"
    assert started[1]["planned_total"] == "1.226649"
    assert parse_exact(started[0]["planned_total"]) == us.total
    # The recorded budgets sum, exactly, to the same total; no float is written anywhere.
    assert sum(parse_exact(p["budget"]) for p in started[0]["planned"]) == us.total
    assert len(started[0]["planned"]) == len(us.measurements) == 46
    assert len(started[1]["planned"]) == len(pr.measurements) == 23
    for line in ledger.path.read_text().splitlines():
        json.loads(line, parse_float=lambda s: pytest.fail(f"float {s} in the ledger"))
    state = read_ledger(ledger.path)
    assert state.runs["us-run"].planned_total == us.total
    assert started[0]["lifetime_cap"] == started[1]["lifetime_cap"] == "2"
    assert state.runs["us-run"].lifetime_cap == state.runs["pr-run"].lifetime_cap == Fraction(2)
    assert state.dataset_cap("cef2020-us") == state.policy.lifetime_cap == Fraction(2)


def test_planned_fields_match_the_plan(tmp_path: Path) -> None:
    plan = plan_run(load_config(US_CONFIG))
    ledger = new_ledger(tmp_path)
    start(ledger, plan, "r")
    recorded = {p["key"]: p for p in of_kind(ledger.path, "RUN_STARTED")[0]["planned"]}
    for m in plan.measurements:
        p = recorded[m.key]
        assert (p["table"], p["level"], p["sensitivity"], p["tau"], p["n_cells"]) == (
            m.table, m.level.config_key, m.sensitivity, m.tau, m.n_cells,
        )
        assert Decimal(p["budget"]) == m.budget
        assert float(p["variance"]) == m.variance
        assert parse_exact(p["noise_parameter"]) == Fraction(m.sensitivity**2) / (2 * Fraction(m.budget))


# --------------------------------------------------------------------------------------------
# Format: canonical JSON, chain, domain-separated hash
# --------------------------------------------------------------------------------------------


def test_entries_form_a_domain_separated_hash_chain(tmp_path: Path) -> None:
    """Entries about the ledger or a dataset (LEDGER_INIT, DATASET_VERSION) have a null run_id."""
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    run_all(rec, PLAN)
    publish(rec, tmp_path / "out")
    raw_lines = ledger.path.read_bytes().split(b"\n")
    assert raw_lines[-1] == b""
    prev = "0" * 64
    kinds = []
    for seq, raw in enumerate(raw_lines[:-1]):
        entry = json.loads(raw)
        body = {k: v for k, v in entry.items() if k != "hash"}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert raw == json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert entry["hash"] == hashlib.sha256(b"phsafe-ledger-entry-v1\x00" + canonical).hexdigest()
        assert entry["seq"] == seq and entry["prev"] == prev
        assert entry["run_id"] == (None if entry["kind"] in ("LEDGER_INIT", "DATASET_VERSION") else "run-1")
        assert entry["time"].endswith("Z")
        prev = entry["hash"]
        kinds.append(entry["kind"])
    n = len(PLAN.measurements)
    assert kinds == (["LEDGER_INIT", "DATASET_VERSION", "RUN_STARTED"] + ["INTENT", "COMMITTED"] * n
                     + ["OUTPUTS_PUBLISHED", "RUN_FINISHED"])


def test_ledger_holds_no_microdata_fields(tmp_path: Path) -> None:
    """Only the documented fields exist: policy, dataset names and keyed fingerprints, digests, config
    digest, plan, cell counts, noisy digests. The lineage key itself is never in the ledger."""
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    measure(PLAN.measurements[0], np.arange(PLAN.measurements[0].n_cells), rec)
    rec.fail("Traceback with data\nsecond line\x00")
    allowed = COMMON | {
        "ledger_id", "format", "privacy_defn", "lifetime_cap", "reason", "non_confidential", "key_id",
        "code_version", "dataset", "fingerprint", "input_digests", "config_digest", "truncation_key", "planned",
        "planned_total", "spent_before", "validated", "key", "budget", "sensitivity", "n_cells", "intent_seq",
        "intent_hash", "noisy_digest", "spent", "public_log", "code", "stage",
    }
    for entry in entries(ledger.path):
        assert set(entry) <= allowed
    reason = entries(ledger.path)[-1]["reason"]
    assert "\n" not in reason and "\x00" not in reason
    key_hex = key_path(ledger.path).read_text().strip()
    assert len(key_hex) == 64 and key_hex not in ledger.path.read_text()


def test_noisy_digest_is_the_released_vector(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    m = PLAN.measurements[0]
    noisy = measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
    committed = of_kind(ledger.path, "COMMITTED")[0]
    assert committed["noisy_digest"] == noise_mod.vector_digest(noisy)


# --------------------------------------------------------------------------------------------
# Init: the policy, the lineage key, and the only way a ledger comes to exist
# --------------------------------------------------------------------------------------------


def test_init_creates_the_ledger_and_its_lineage_key(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "ledger.jsonl"
    ledger = create_ledger(path, lifetime_cap=Fraction(5, 4), reason="policy memo 3", code_version="v9")
    key_file = key_path(path)
    assert key_file == tmp_path / "deep" / "er" / "ledger.jsonl.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = bytes.fromhex(key_file.read_text(encoding="ascii").strip())
    assert len(key) == 32
    (genesis,) = entries(path)
    assert set(genesis) == COMMON | {"ledger_id", "format", "privacy_defn", "lifetime_cap", "reason",
                                     "non_confidential", "key_id", "code_version", "public_log"}
    assert (genesis["seq"], genesis["prev"], genesis["kind"], genesis["run_id"]) == (0, "0" * 64, "LEDGER_INIT", None)
    assert genesis["format"] == 3 and genesis["privacy_defn"] == "zcdp" and genesis["lifetime_cap"] == "1.25"
    assert genesis["public_log"]["witnesses"] == [] and genesis["public_log"]["quorum"] == 0
    assert genesis["reason"] == "policy memo 3" and genesis["non_confidential"] is False
    assert genesis["code_version"] == "v9" and len(genesis["ledger_id"]) == 32
    # The key id identifies the key file's key (HMAC under it), without revealing it.
    expected_id = hmac.new(key, b"phsafe-lineage-key-id-v1\x00", hashlib.sha256).hexdigest()[:32]
    assert genesis["key_id"] == key_id(key) == expected_id
    assert ledger.lineage_key() == key
    policy = read_ledger(path).policy
    assert policy is not None and policy.seq == 0 and policy.key_id == expected_id
    assert policy.lifetime_cap == Fraction(5, 4) and policy.non_confidential is False
    # Two ledgers never share a key or an id.
    other = new_ledger(tmp_path)
    assert other.lineage_key() != key and other.state.policy.ledger_id != policy.ledger_id


def test_init_never_overwrites_a_ledger(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    start(ledger, PLAN, "run-1")
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for cap, non_conf in ((Fraction(2), False), (INFINITE, True)):
        with pytest.raises(LedgerError, match="already exists; a ledger is never created twice"):
            create_ledger(ledger.path, lifetime_cap=cap, reason="again", non_confidential=non_conf)
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # A leftover key file or lock file of another ledger also refuses (a key is never replaced).
    for leftover in ("fresh.jsonl.key", "other.jsonl.lock"):
        (tmp_path / leftover).write_text("x")
        with pytest.raises(LedgerError, match="already exists"):
            create_ledger(tmp_path / leftover.rsplit(".", 1)[0], lifetime_cap=Fraction(1), reason="x")
        assert not (tmp_path / leftover.rsplit(".", 1)[0]).exists()
        assert (tmp_path / leftover).read_text() == "x"


def test_init_policy_rules(tmp_path: Path) -> None:
    """Infinity caps only for non-confidential ledgers; positive exact caps; a reason. A refused init
    creates nothing."""
    path = tmp_path / "ledger.jsonl"
    with pytest.raises(BudgetError, match="Infinity lifetime cap is allowed only for a non-confidential"):
        create_ledger(path, lifetime_cap=INFINITE, reason="no cap")
    with pytest.raises(BudgetError, match="positive"):
        create_ledger(path, lifetime_cap=Fraction(0), reason="zero")
    with pytest.raises(BudgetError, match="not a float"):
        create_ledger(path, lifetime_cap=1.0, reason="float")  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match="non-negative"):
        create_ledger(path, lifetime_cap=Fraction(-1), reason="negative")
    for empty in ("", "   ", "\n"):
        with pytest.raises(LedgerError, match="reason"):
            create_ledger(path, lifetime_cap=Fraction(1), reason=empty)
    assert list(tmp_path.iterdir()) == []
    synthetic = create_ledger(path, lifetime_cap=INFINITE, reason="demo data", non_confidential=True)
    genesis = entries(path)[0]
    assert genesis["lifetime_cap"] == "Infinity" and genesis["non_confidential"] is True
    assert synthetic.state.policy.lifetime_cap == INFINITE
    pure = new_ledger(tmp_path, cap=3, privacy_defn=PrivacyDefinition.PUREDP, name="pure.jsonl")
    assert entries(pure.path)[0]["privacy_defn"] == "puredp" and pure.state.unit is PrivacyDefinition.PUREDP


def test_open_never_creates_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.jsonl"
    for use in (Ledger.open, read_ledger):
        with pytest.raises(LedgerError, match=r"does not exist.*phsafe ledger init"):
            use(path)
    assert not (tmp_path / "sub").exists()
    path.parent.mkdir()
    with pytest.raises(LedgerError, match="does not exist"):
        open_ledger(path)
    assert list(path.parent.iterdir()) == []  # not the ledger, not its lock, not its key
    path.mkdir()
    with pytest.raises(LedgerError, match="is a directory"):
        open_ledger(path)


def test_replay_rejects_a_bad_genesis(tmp_path: Path) -> None:
    """LEDGER_INIT is entry 0 of a ledger, and only entry 0; its policy follows the init rules."""
    good = entries(new_ledger(tmp_path).path)[0]
    path = tmp_path / "crafted.jsonl"

    def genesis(**changes: Any) -> None:
        path.write_bytes(b"")
        craft(path, "LEDGER_INIT", None, body_of(good, **changes))

    genesis(lifetime_cap="Infinity")
    rejected(path, 0, "LEDGER_INIT", "Infinity lifetime cap is allowed only in a non-confidential ledger")
    genesis(lifetime_cap="Infinity", non_confidential=True)
    assert read_ledger(path).policy.lifetime_cap == INFINITE
    genesis(format=1)
    rejected(path, 0, "LEDGER_INIT", "format must be 3")
    genesis(format=2)  # format 2 binds no log
    rejected(path, 0, "LEDGER_INIT", "public_log is bound by LEDGER_INIT of format 3 only")
    genesis(public_log={**good["public_log"], "quorum": 1})
    rejected(path, 0, "LEDGER_INIT", "public_log.quorum")
    genesis(public_log={**good["public_log"], "origin": "another.example/log"})
    rejected(path, 0, "LEDGER_INIT", "public_log.origin is not the name of the log's key")
    unbound = dict(good)
    del unbound["public_log"]
    path.write_bytes(b"")
    craft(path, "LEDGER_INIT", None, body_of(unbound))
    rejected(path, 0, "LEDGER_INIT", "public_log is missing")
    genesis(reason=" ")
    rejected(path, 0, "LEDGER_INIT", "reason")
    genesis(key_id="K" * 32)
    rejected(path, 0, "LEDGER_INIT", "key_id")
    genesis()
    craft(path, "LEDGER_INIT", None, body_of(good))
    rejected(path, 1, "LEDGER_INIT", "LEDGER_INIT can only be the first entry")
    path.write_bytes(b"")
    craft(path, "DATASET_VERSION", None, {"dataset": DATASET, "fingerprint": FP_A, "reason": "x"})
    rejected(path, 0, "DATASET_VERSION", "a ledger starts with LEDGER_INIT")


def test_the_lineage_key_must_be_the_ledgers(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    other = new_ledger(tmp_path, name="other.jsonl")
    key_file = key_path(ledger.path)
    own = key_file.read_bytes()
    key_file.write_bytes(key_path(other.path).read_bytes())
    with pytest.raises(LedgerError, match="is not this ledger's lineage key"):
        ledger.lineage_key()
    key_file.write_text("not hex")
    with pytest.raises(LedgerError, match="cannot read the ledger's lineage key"):
        ledger.lineage_key()
    key_file.unlink()
    with pytest.raises(LedgerError, match="lineage key .* is missing"):
        ledger.lineage_key()
    key_file.write_bytes(own)
    assert ledger.lineage_key() == bytes.fromhex(own.decode().strip())


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

    monkeypatch.setattr(store_mod.os, "fsync", spy_fsync)
    ledger = new_ledger(path.parent)
    # Creating the ledger fsyncs its key file, the ledger and their directory.
    for made in (key_path(path), path, path.parent):
        assert ("fsync", str(made)) in events
    assert events.index(("fsync", str(key_path(path)))) < events.index(("fsync", str(path)))
    rec = start(ledger, PLAN, "run-1")

    real_build = noise_mod._build_mechanism

    def build(m):
        mechanism, scale = real_build(m)

        def draw(values):
            last = entries(path)[-1]
            # The spend is on disk, and the last thing the ledger did was fsync it.
            assert last["kind"] == "INTENT" and last["key"] == m.key
            # (The public log is written after the ledger, under its lock: its fsyncs may follow.)
            ledger_events = [e for e in events if ".public-log" not in e[1]]
            assert ledger_events[-1] == ("fsync", str(path))
            events.append(("noise", m.key))
            return mechanism(values)

        return draw, scale

    monkeypatch.setattr(noise_mod, "_build_mechanism", build)
    run_all(rec, PLAN)
    assert [e for e in events if e[0] == "noise"] == [("noise", m.key) for m in PLAN.measurements]


def test_a_spend_stands_when_drawing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")

    def broken(m):
        def draw(values):
            raise RuntimeError("sampler failed")

        return draw, 1.0

    monkeypatch.setattr(noise_mod, "_build_mechanism", broken)
    with pytest.raises(RuntimeError):
        measure(PLAN.measurements[0], np.zeros(PLAN.measurements[0].n_cells, dtype=np.int64), rec)
    rec.fail("RuntimeError")
    state = read_ledger(ledger.path)
    run = state.runs["run-1"]
    assert run.status is RunStatus.FAILED
    assert run.charge() == Fraction(PLAN.measurements[0].budget)  # INTENT without COMMITTED counts


def test_recorder_refuses_spends_outside_the_plan(tmp_path: Path) -> None:
    """A run finishes only by publishing (record_published), and only with every measurement committed."""
    other = plan_run(small_config(PH3={"state_*": Decimal("0.5")}))
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    m = PLAN.measurements[0]
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
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="before every measurement was committed"):
        publish(rec, tmp_path / "out")
    assert ledger.path.stat().st_size == size  # neither OUTPUTS_PUBLISHED nor RUN_FINISHED
    rec.fail("stopped")
    rec.fail("again")  # no-op once ended
    with pytest.raises(BudgetError, match="ended"):
        rec.record_intent(PLAN.measurements[1])
    with pytest.raises(LedgerError, match="already ended"):
        publish(rec, tmp_path / "out")
    read_ledger(ledger.path)  # nothing invalid reached the file
    assert [e["kind"] for e in entries(ledger.path)][-1] == "RUN_FAILED"


def test_open_rejects_a_broken_ledger(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    run_all(rec, PLAN)
    data = ledger.path.read_bytes()
    ledger.path.write_bytes(data.replace(b'"n_cells":2', b'"n_cells":3', 1))
    with pytest.raises(LedgerError, match="entry 2"):  # RUN_STARTED, after LEDGER_INIT and DATASET_VERSION
        open_ledger(ledger.path)
    ledger.path.write_bytes(data[:-5])
    with pytest.raises(TornTailError, match="incomplete.*phsafe ledger repair"):
        open_ledger(ledger.path)


def test_ledger_detects_shrinking_under_an_open_handle(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    data = ledger.path.read_bytes()
    ledger.path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LedgerError, match="shrank"):
        rec.record_intent(PLAN.measurements[0])


# --------------------------------------------------------------------------------------------
# A failed append is rolled back (a full disk)
# --------------------------------------------------------------------------------------------


def full_disk_after(monkeypatch: pytest.MonkeyPatch, path: Path, room: int | Callable[[bytes], int]) -> list[int]:
    """Writes to ``path`` fail with ENOSPC once ``room`` bytes were written (``room`` may be computed
    from the bytes of the first write); returns the count of bytes written."""
    real_write = os.write
    written = [0]
    target = os.path.realpath(path)
    limit: list[int] = []

    def write(fd: int, data) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != target:
            return real_write(fd, data)
        if not limit:
            limit.append(room(bytes(data)) if callable(room) else room)
        left = limit[0] - written[0]
        if left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data[:left]))
        written[0] += n
        return n

    monkeypatch.setattr(store_mod.os, "write", write)
    return written


def test_a_failed_append_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file ends where it ended before the append; the error names ENOSPC; the ledger stays usable."""
    ledger = new_ledger(tmp_path)
    before = ledger.path.read_bytes()
    written = full_disk_after(monkeypatch, ledger.path, 50)
    with pytest.raises(LedgerError, match=r"no space left on device \(ENOSPC\); nothing of it was kept"):
        start(ledger, PLAN, "run-1")  # DATASET_VERSION and RUN_STARTED, one write
    assert written[0] == 50 and ledger.path.read_bytes() == before
    monkeypatch.undo()
    rec = start(ledger, PLAN, "run-1")
    run_all_but_first(rec, PLAN)
    m0 = PLAN.measurements[0]
    # One entry; then the publication's two entries, cut inside the second one.
    for room, action in ((7, lambda: measure(m0, np.zeros(m0.n_cells, dtype=np.int64), rec)),
                         (lambda data: data.index(b"\n") + 6, lambda: publish(rec, tmp_path / "out"))):
        before = ledger.path.read_bytes()
        written = full_disk_after(monkeypatch, ledger.path, room)
        with pytest.raises(LedgerError, match=r"\(ENOSPC\)") as info:
            action()
        assert written[0] > 0 and ledger.path.read_bytes() == before
        assert "Free space" in str(info.value)
        monkeypatch.undo()
        read_ledger(ledger.path)
        if room == 7:
            assert ledger.run("run-1").intents.get(m0.key) is None  # no noise was drawn either
            measure(m0, np.zeros(m0.n_cells, dtype=np.int64), rec)
    assert ledger.run("run-1").status is RunStatus.RUNNING and not ledger.run("run-1").published
    publish(rec, tmp_path / "out")
    assert [e["kind"] for e in entries(ledger.path)][-2:] == ["OUTPUTS_PUBLISHED", "RUN_FINISHED"]


def test_a_failed_rollback_leaves_a_torn_tail_that_repair_records(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    before = ledger.path.read_bytes()
    full_disk_after(monkeypatch, ledger.path, 30)

    def no_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(store_mod.os, "ftruncate", no_truncate)
    with pytest.raises(LedgerError, match=r"\(ENOSPC\); the ledger may end in an incomplete entry: run `phsafe ledger repair"):
        rec.record_intent(PLAN.measurements[0])
    monkeypatch.undo()
    torn = ledger.path.read_bytes()[len(before):]
    assert len(torn) == 30 and ledger.path.read_bytes().startswith(before)
    with pytest.raises(TornTailError, match="30 bytes of an interrupted write"):
        open_ledger(ledger.path)
    repair = repair_ledger(ledger.path)
    assert repair is not None and repair.dropped_bytes == 30
    assert repair.dropped_sha256 == hashlib.sha256(torn).hexdigest()
    # The torn INTENT drew nothing: the measurement is spent by a new INTENT, in the same attempt.
    reopened = open_ledger(ledger.path)
    assert reopened.run("run-1").intents == {}
    measure(PLAN.measurements[0], np.zeros(PLAN.measurements[0].n_cells, dtype=np.int64), rec)


def test_a_failed_init_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """"A write that fails is rolled back ... so the ledger never keeps a partial entry" -- for the
    genesis entry too: a failed init leaves neither the ledger nor its key, and can be retried."""
    path = tmp_path / "ledger.jsonl"
    full_disk_after(monkeypatch, path, 10)
    with pytest.raises(LedgerError, match=r"\(ENOSPC\)"):
        create_ledger(path, lifetime_cap=Fraction(1), reason="policy")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    create_ledger(path, lifetime_cap=Fraction(1), reason="policy")


# --------------------------------------------------------------------------------------------
# TAIL_REPAIRED
# --------------------------------------------------------------------------------------------


def test_repair_drops_a_torn_tail_and_records_it(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    measure(PLAN.measurements[0], np.zeros(PLAN.measurements[0].n_cells, dtype=np.int64), rec)
    complete = ledger.path.read_bytes()
    assert repair_ledger(ledger.path) is None  # nothing to repair
    assert ledger.path.read_bytes() == complete
    # A killed process left the first 57 bytes of its next line.
    torn = b'{"budget":"0.125","hash":"' + b"7" * 31
    assert len(torn) == 57
    with open(ledger.path, "ab") as f:
        f.write(torn)
    for use in (Ledger.open, read_ledger):
        with pytest.raises(TornTailError, match=r"57 bytes of an interrupted write.*phsafe ledger repair") as info:
            use(ledger.path)
        assert info.value.seq == len(complete.splitlines())
    with pytest.raises(LedgerError, match="incomplete"):
        rec.record_intent(PLAN.measurements[1])
    repair = repair_ledger(ledger.path, reason="disk full on 2026-11-23")
    assert repair is not None
    assert (repair.dropped_bytes, repair.dropped_sha256) == (57, hashlib.sha256(torn).hexdigest())
    data = ledger.path.read_bytes()
    assert data.startswith(complete) and torn not in data
    last = entries(ledger.path)[-1]
    assert set(last) == COMMON | {"dropped_bytes", "dropped_sha256", "reason"}
    assert (last["kind"], last["run_id"], last["seq"]) == ("TAIL_REPAIRED", None, repair.seq)
    assert last["dropped_bytes"] == 57 and last["dropped_sha256"] == hashlib.sha256(torn).hexdigest()
    assert last["reason"] == "disk full on 2026-11-23"
    state = read_ledger(ledger.path)
    assert [(r.seq, r.dropped_bytes) for r in state.repairs] == [(repair.seq, 57)]
    # The run goes on, recording through its recorder.
    run_all_but_first(rec, PLAN)
    publish(rec, tmp_path / "out")
    assert read_ledger(ledger.path).runs["run-1"].status is RunStatus.FINISHED
    assert repair_ledger(ledger.path) is None


def test_repair_never_touches_a_broken_complete_line(tmp_path: Path) -> None:
    """A broken complete entry is not a torn write: repair changes nothing and says which entry."""
    ledger = new_ledger(tmp_path)
    start(ledger, PLAN, "run-1")
    lines = ledger.path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"reason":"first version"', b'"reason":"first versioN"')
    broken = b"\n".join(lines)
    ledger.path.write_bytes(broken)
    with pytest.raises(LedgerError, match="entry 1 is damaged .* restore the ledger from its backup"):
        repair_ledger(ledger.path)  # damage in the middle, though the ledger ends in a complete entry
    assert ledger.path.read_bytes() == broken
    ledger.path.write_bytes(broken + b'{"seq":3,')
    with pytest.raises(LedgerError, match="entry 1") as info:
        repair_ledger(ledger.path)
    assert not isinstance(info.value, TornTailError)
    assert ledger.path.read_bytes() == broken + b'{"seq":3,'


def test_read_ledger_names_the_first_broken_entry_before_a_torn_tail(tmp_path: Path) -> None:
    """read_ledger: "naming the first entry that breaks a rule" -- a tampered entry 1 comes before a
    torn tail at entry 3 (and repair, told to drop the tail, refuses because of entry 1)."""
    ledger = new_ledger(tmp_path)
    start(ledger, PLAN, "run-1")
    data = ledger.path.read_bytes().replace(b'"reason":"first version"', b'"reason":"first versioN"')
    ledger.path.write_bytes(data + b'{"seq":3,')
    with pytest.raises(LedgerError) as info:
        read_ledger(ledger.path)
    assert info.value.seq == 1 and not isinstance(info.value, TornTailError), str(info.value)


def test_repair_of_a_ledger_without_a_complete_entry(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b'{"code_version":"x"')
    with pytest.raises(LedgerError, match="holds no complete entry.*phsafe ledger init"):
        repair_ledger(path)
    assert path.read_bytes() == b'{"code_version":"x"'


def test_replay_checks_tail_repaired_entries(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    good = {"dropped_bytes": 12, "dropped_sha256": "0" * 64, "reason": "repaired"}
    data = ledger.path.read_bytes()
    for bad, match in (({"dropped_bytes": 0}, "dropped_bytes"), ({"dropped_bytes": "12"}, "dropped_bytes"),
                       ({"dropped_sha256": "x" * 64}, "dropped_sha256"), ({"reason": ""}, "reason")):
        ledger.path.write_bytes(data)
        craft(ledger.path, "TAIL_REPAIRED", None, {**good, **bad})
        rejected(ledger.path, 1, "TAIL_REPAIRED", match)
    ledger.path.write_bytes(data)
    craft(ledger.path, "TAIL_REPAIRED", None, good)
    craft(ledger.path, "TAIL_REPAIRED", "run-1", good)
    rejected(ledger.path, 2, "TAIL_REPAIRED", "run_id must be null")


# --------------------------------------------------------------------------------------------
# Lifetime budget of a dataset: the policy cap, raises, content versions
# --------------------------------------------------------------------------------------------


def test_second_run_is_refused_by_the_policy_cap(tmp_path: Path) -> None:
    """With a policy cap of one release, a second release of the same dataset is refused (the first
    format refused it by the run's own total; the cap now comes from the ledger's policy)."""
    ledger = new_ledger(tmp_path, cap=PLAN.total)
    rec = start(ledger, PLAN, "run-1")
    run_all(rec, PLAN)
    publish(rec, tmp_path / "out")
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError) as info:
        start(ledger, PLAN, "run-2")
    message = str(info.value)
    total = format_exact(PLAN.total)
    assert f"dataset {DATASET!r}" in message
    assert f"already spent {total}" in message and f"plans {total}" in message
    assert f"cap {total}" in message and "--lifetime-cap" in message and "--cap-reason" in message
    assert ledger.path.stat().st_size == size
    # Another dataset is unaffected; the refused run left no trace.
    start(ledger, PLAN, "run-3", dataset="other-data", fingerprint=FP_B, digests=DIGESTS_B)
    assert [e["run_id"] for e in of_kind(ledger.path, "RUN_STARTED")] == ["run-1", "run-3"]


def test_the_default_cap_is_the_policy_cap_not_the_runs_total(tmp_path: Path) -> None:
    """New rule: the cap admits runs until the dataset's odometer reaches the policy cap."""
    ledger = new_ledger(tmp_path, cap=2 * PLAN.total)
    for run_id in ("run-1", "run-2"):
        run_all(start(ledger, PLAN, run_id), PLAN)
    with pytest.raises(BudgetError, match=f"already spent {format_exact(2 * PLAN.total)}"):
        start(ledger, PLAN, "run-3")
    started = of_kind(ledger.path, "RUN_STARTED")
    assert [parse_exact(e["spent_before"]) for e in started] == [0, PLAN.total]
    assert {e["lifetime_cap"] for e in started} == {format_exact(2 * PLAN.total)}
    # A run bigger than the cap is refused before anything is spent, even as a first run.
    big = plan_run(small_config(PH1_num={"state_*": Decimal("1"), "usa_*": Decimal("0.125")}))
    with pytest.raises(BudgetError, match="exceeds the cap"):
        start(ledger, big, "run-4", dataset="fresh", fingerprint=FP_B)


def test_raised_cap_needs_a_reason_which_is_recorded(tmp_path: Path) -> None:
    """A raise is its own CAP_RAISED entry (dataset, cap, reason), in the same write as RUN_STARTED
    (the first format recorded a cap_reason in RUN_STARTED)."""
    ledger = new_ledger(tmp_path, cap=PLAN.total)
    rec = start(ledger, PLAN, "run-1")
    run_all(rec, PLAN)
    publish(rec, tmp_path / "out")
    size = ledger.path.stat().st_size
    for reason in (None, "", "   "):
        with pytest.raises(BudgetError, match="needs a reason"):
            start(ledger, PLAN, "run-2", cap_raise=(2 * PLAN.total, reason))
    with pytest.raises(BudgetError, match="exceeds the cap"):
        start(ledger, PLAN, "run-2", cap_raise=(2 * PLAN.total - Fraction(1, 10**9), "re-release"))
    assert ledger.path.stat().st_size == size  # a refused start records no raise either
    start(ledger, PLAN, "run-2", cap_raise=(2 * PLAN.total, "approved re-release, memo 42"))
    raised, started = entries(ledger.path)[-2:]
    assert raised["kind"] == "CAP_RAISED" and raised["run_id"] is None
    assert set(raised) == COMMON | {"dataset", "lifetime_cap", "reason"}
    assert raised["dataset"] == DATASET and raised["reason"] == "approved re-release, memo 42"
    assert parse_exact(raised["lifetime_cap"]) == 2 * PLAN.total
    assert started["kind"] == "RUN_STARTED"
    assert parse_exact(started["lifetime_cap"]) == 2 * PLAN.total
    assert parse_exact(started["spent_before"]) == PLAN.total
    ds = read_ledger(ledger.path).dataset_states[DATASET]
    assert ds.lifetime_cap == 2 * PLAN.total
    assert [(c.seq, c.reason) for c in ds.raises] == [(raised["seq"], "approved re-release, memo 42")]


def _known(ledger: Ledger, dataset: str = DATASET, **kw: Any) -> Ledger:
    """``dataset`` declared in ``ledger`` (its first version, by a run that failed before spending)."""
    start(ledger, PLAN, f"declare-{dataset}", dataset=dataset, **kw).fail("declared for the test")
    return ledger


def test_a_cap_is_only_ever_raised(tmp_path: Path) -> None:
    ledger = _known(new_ledger(tmp_path, cap=1))
    size = ledger.path.stat().st_size
    for cap in (Fraction(1), Fraction(1, 2)):
        with pytest.raises(BudgetError, match="only ever raised"):
            ledger.raise_cap(DATASET, cap, "lower")
    with pytest.raises(BudgetError, match="needs a reason"):
        ledger.raise_cap(DATASET, Fraction(2), " ")
    with pytest.raises(BudgetError, match="not a float"):
        ledger.raise_cap(DATASET, 2.0, "float")  # type: ignore[arg-type]
    with pytest.raises(LedgerError, match="not a dataset name"):
        ledger.raise_cap("../x", Fraction(2), "bad name")
    with pytest.raises(LedgerError, match="Infinity lifetime cap is allowed only in a non-confidential"):
        ledger.raise_cap(DATASET, INFINITE, "no cap")
    assert ledger.path.stat().st_size == size
    entry = ledger.raise_cap(DATASET, Fraction(3, 2), "memo 1")
    assert entry["kind"] == "CAP_RAISED" and entry["lifetime_cap"] == "1.5"
    with pytest.raises(BudgetError, match="1.25 does not raise dataset test-data's cap 1.5"):
        ledger.raise_cap(DATASET, Fraction(5, 4), "lower again")
    ledger.raise_cap(DATASET, Fraction(2), "memo 2")
    # Another dataset still has the policy cap.
    state = read_ledger(ledger.path)
    assert state.dataset_cap(DATASET) == 2 and state.dataset_cap("other") == 1
    # A non-confidential ledger may raise to Infinity.
    synthetic = _known(new_ledger(tmp_path, cap=1, non_confidential=True, name="synthetic.jsonl"),
                       non_confidential=True)
    assert synthetic.raise_cap(DATASET, INFINITE, "demo")["lifetime_cap"] == "Infinity"


def test_raise_cap_needs_a_dataset_the_ledger_knows_and_a_reason_that_fits(tmp_path: Path) -> None:
    """A typo in --dataset is refused, not recorded as a cap of a dataset nobody runs; a reason
    over 500 characters is refused whole, never cut."""
    ledger = new_ledger(tmp_path, cap=1)
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="knows no dataset 'test-data' .its datasets: none yet.: check the name"):
        ledger.raise_cap(DATASET, Fraction(2), "memo")
    _known(ledger)
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="knows no dataset 'test-dta' .its datasets: test-data."):
        ledger.raise_cap("test-dta", Fraction(2), "memo")
    with pytest.raises(LedgerError, match="--reason is 5000 characters long; the ledger records at most 500 "
                                          r"\(never cut\): shorten it"):
        ledger.raise_cap(DATASET, Fraction(2), "x" * 5000)
    assert ledger.path.stat().st_size == size
    assert ledger.raise_cap(DATASET, Fraction(2), "y" * 500)["reason"] == "y" * 500


def test_operator_reasons_over_the_limit_are_refused_not_cut(tmp_path: Path) -> None:
    long = "r" * 501
    with pytest.raises(LedgerError, match="--reason is 501 characters long"):
        create_ledger(tmp_path / "l.jsonl", lifetime_cap=Fraction(1),
                    reason=long)
    assert not (tmp_path / "l.jsonl").exists()
    ledger = new_ledger(tmp_path, cap=1)
    size = ledger.path.stat().st_size
    with pytest.raises(LedgerError, match="--new-version is 501 characters long"):
        start(ledger, PLAN, "run-1", new_version=long)
    with pytest.raises(LedgerError, match="--cap-reason is 501 characters long"):
        start(ledger, PLAN, "run-1", cap_raise=(Fraction(3), long))
    assert ledger.path.stat().st_size == size
    start(ledger, PLAN, "run-1").fail("stopped")
    with pytest.raises(LedgerError, match="--resume-reason is 501 characters long"):
        ledger.resume_run("run-1", config_digest="c" * 64, dataset=DATASET, fingerprint=FP_A, code_version="t",
                          reason=long)


def test_replay_rejects_cap_raises_that_lower_or_have_no_reason(tmp_path: Path) -> None:
    ledger = _known(new_ledger(tmp_path, cap=1))
    ledger.raise_cap(DATASET, Fraction(2), "memo 1")
    data = ledger.path.read_bytes()
    for body, match in (
        ({"lifetime_cap": "1.5", "reason": "lower"}, "does not raise test-data's cap 2: a cap is only ever raised"),
        ({"lifetime_cap": "2", "reason": "same"}, "only ever raised"),
        ({"lifetime_cap": "3", "reason": ""}, "a cap raise needs a reason"),
        ({"lifetime_cap": "3", "reason": "  "}, "a cap raise needs a reason"),
        ({"lifetime_cap": "3.0", "reason": "x"}, "lifetime_cap is not a canonical"),
        ({"lifetime_cap": "Infinity", "reason": "x"}, "Infinity lifetime cap"),
    ):
        ledger.path.write_bytes(data)
        craft(ledger.path, "CAP_RAISED", None, {"dataset": DATASET, **body})
        rejected(ledger.path, len(data.splitlines()), "CAP_RAISED", match)
    ledger.path.write_bytes(data)
    craft(ledger.path, "CAP_RAISED", None, {"dataset": DATASET, "lifetime_cap": "3", "reason": "memo 2"})
    assert read_ledger(ledger.path).dataset_cap(DATASET) == 3  # the crafting itself is sound


def test_a_spend_above_the_policy_cap_is_rejected_by_replay(tmp_path: Path) -> None:
    """A RUN_STARTED forced past the API (correct chain, correct odometer and cap fields) that takes
    the dataset above its cap is rejected by read_ledger, naming the entry; with a recorded raise
    the same entry is accepted."""
    ledger = new_ledger(tmp_path, cap=PLAN.total)
    rec = start(ledger, PLAN, "run-1")
    run_all(rec, PLAN)
    publish(rec, tmp_path / "out")
    first = of_kind(ledger.path, "RUN_STARTED")[0]
    data = ledger.path.read_bytes()
    second = body_of(first, spent_before=format_exact(PLAN.total), re_release="a second release, crafted")
    entry = craft(ledger.path, "RUN_STARTED", "run-2", second)
    error = rejected(ledger.path, entry["seq"], "RUN_STARTED",
                     f"run exceeds dataset test-data's lifetime cap: spent {format_exact(PLAN.total)} \\+ planned")
    assert "cap " + format_exact(PLAN.total) in str(error)
    with pytest.raises(LedgerError, match=f"entry {entry['seq']}"):
        open_ledger(ledger.path)
    # A spend within the cap but claiming a cap the dataset does not have is rejected too.
    ledger.path.write_bytes(data)
    craft(ledger.path, "RUN_STARTED", "run-2", {**second, "lifetime_cap": format_exact(2 * PLAN.total)})
    rejected(ledger.path, entry["seq"], "RUN_STARTED", "is not dataset test-data's cap")
    # Control: the same entry after a recorded raise is valid.
    ledger.path.write_bytes(data)
    craft(ledger.path, "CAP_RAISED", None, {"dataset": DATASET, "lifetime_cap": format_exact(2 * PLAN.total),
                                            "reason": "approved"})
    craft(ledger.path, "RUN_STARTED", "run-2", {**second, "lifetime_cap": format_exact(2 * PLAN.total)})
    assert read_ledger(ledger.path).dataset_spent(DATASET, PrivacyDefinition.ZCDP) == 2 * PLAN.total


def test_a_new_content_version_needs_new_version_and_shares_the_cap(tmp_path: Path) -> None:
    """New rule: datasets are named; a content version never seen under the name is refused without
    new_version; versions are DATASET_VERSION entries; every version counts against one cap."""
    ledger = new_ledger(tmp_path, cap=PLAN.total + Fraction(1, 8))
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError, match=r"never been run on these records \(it has no declared version yet\).*--new-version"):
        start(ledger, PLAN, "run-1", new_version=None)
    with pytest.raises(BudgetError, match="--new-version"):
        start(ledger, PLAN, "run-1", new_version="   ")
    assert ledger.path.stat().st_size == size
    rec = start(ledger, PLAN, "run-1", new_version="first delivery of the CEF, memo 5")
    declared = of_kind(ledger.path, "DATASET_VERSION")
    assert len(declared) == 1 and set(declared[0]) == COMMON | {"dataset", "fingerprint", "reason"}
    assert (declared[0]["dataset"], declared[0]["fingerprint"], declared[0]["run_id"]) == (DATASET, FP_A, None)
    assert declared[0]["reason"] == "first delivery of the CEF, memo 5"
    run_all(rec, PLAN)
    publish(rec, tmp_path / "out")
    # A known version needs no new_version (and records none).
    with pytest.raises(BudgetError, match="exceeds the cap"):
        start(ledger, PLAN, "run-2", new_version=None)
    # Other records under the same name: refused without new_version, and even with it the
    # dataset's odometer (PLAN.total already) leaves no room: nothing is declared then.
    with pytest.raises(BudgetError, match=r"it has 1 declared version\(s\), and these records match none"):
        start(ledger, PLAN, "run-2", fingerprint=FP_B, new_version=None)
    with pytest.raises(BudgetError, match=f"already spent {format_exact(PLAN.total)}"):
        start(ledger, PLAN, "run-2", fingerprint=FP_B, new_version="edited CEF")
    assert len(of_kind(ledger.path, "DATASET_VERSION")) == 1
    small = plan_run(small_config(PH2={"usa_*": Decimal("0.125")}))
    start(ledger, small, "run-2", fingerprint=FP_B, new_version="edited CEF, memo 6")
    state = read_ledger(ledger.path)
    assert [v.fingerprint for v in state.dataset_states[DATASET].versions] == [FP_A, FP_B]
    assert state.fingerprints == {FP_A: DATASET, FP_B: DATASET}
    assert state.dataset_spent(DATASET, PrivacyDefinition.ZCDP) == PLAN.total + Fraction(1, 8)
    assert state.runs["run-2"].fingerprint == FP_B and state.runs["run-2"].spent_before == PLAN.total


def test_a_fingerprint_is_never_released_under_a_second_name(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    start(ledger, PLAN, "run-1", dataset="cef-a")
    size = ledger.path.stat().st_size
    for new_version in (None, "it is new, honest"):
        with pytest.raises(BudgetError, match=r"already declared as dataset 'cef-a'.*second name \('cef-b'\)"):
            ledger.start_run(run_id="run-2", plan=PLAN, dataset="cef-b", fingerprint=FP_A, config_digest="c" * 64,
                             input_digests=DIGESTS_B, code_version="test", truncation_key_hex="ab" * 32,
                             new_version=new_version)
    assert ledger.path.stat().st_size == size
    with pytest.raises(LedgerError, match="not a dataset name"):
        start(ledger, PLAN, "run-2", dataset="cef a")


def test_replay_rejects_undeclared_or_misnamed_content_versions(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    start(ledger, PLAN, "run-1", dataset="cef-a")
    first = of_kind(ledger.path, "RUN_STARTED")[0]
    data = ledger.path.read_bytes()
    # RUN_STARTED of a fingerprint never declared.
    craft(ledger.path, "RUN_STARTED", "run-2", body_of(first, dataset="cef-b", fingerprint=FP_B))
    rejected(ledger.path, 3, "RUN_STARTED", "never declared under dataset 'cef-b'")
    # ... of a fingerprint declared under another name.
    ledger.path.write_bytes(data)
    craft(ledger.path, "RUN_STARTED", "run-2", body_of(first, dataset="cef-b", spent_before="0"))
    rejected(ledger.path, 3, "RUN_STARTED", "declared under dataset 'cef-a', not 'cef-b'")
    # A fingerprint declared under a second name, or twice.
    for name, match in (("cef-b", "already declared under dataset 'cef-a'$"), ("cef-a", r"\(declared twice\)")):
        ledger.path.write_bytes(data)
        craft(ledger.path, "DATASET_VERSION", None, {"dataset": name, "fingerprint": FP_A, "reason": "x"})
        rejected(ledger.path, 3, "DATASET_VERSION", match)
    for body, match in (({"reason": ""}, "needs a reason"), ({"fingerprint": "F" * 64}, "fingerprint"),
                        ({"dataset": "a b"}, "dataset name")):
        ledger.path.write_bytes(data)
        craft(ledger.path, "DATASET_VERSION", None, {"dataset": "cef-b", "fingerprint": FP_B, "reason": "x", **body})
        rejected(ledger.path, 3, "DATASET_VERSION", match)
    # Control: declared, then started.
    ledger.path.write_bytes(data)
    craft(ledger.path, "DATASET_VERSION", None, {"dataset": "cef-b", "fingerprint": FP_B, "reason": "x"})
    craft(ledger.path, "RUN_STARTED", "run-2", body_of(first, dataset="cef-b", fingerprint=FP_B))
    assert read_ledger(ledger.path).runs["run-2"].dataset == "cef-b"


def test_intent_without_commit_counts_and_failed_runs_release_the_rest(tmp_path: Path) -> None:
    """The room for a retry is a recorded CAP_RAISED of the dataset (the first format: a per-run cap)."""
    first = PLAN.measurements[0]
    ledger = new_ledger(tmp_path, cap=PLAN.total)
    rec = start(ledger, PLAN, "run-1")
    rec.record_intent(first)  # crash between INTENT and COMMITTED ...
    rec.fail("crashed while sampling")  # ... recorded as a failure
    charged = Fraction(first.budget)
    assert read_ledger(ledger.path).dataset_spent(DATASET, PrivacyDefinition.ZCDP) == charged
    # Spent so far = the one INTENT: a full run fits only under a cap of total + that INTENT.
    with pytest.raises(BudgetError):
        start(ledger, PLAN, "run-2", cap_raise=(PLAN.total + charged - Fraction(1, 10**12), "retry"))
    start(ledger, PLAN, "run-2", cap_raise=(PLAN.total + charged, "retry after failure"))


def test_a_crashed_run_keeps_its_whole_reservation(tmp_path: Path) -> None:
    """Against the dataset's cap (the policy's, raised by CAP_RAISED), a crashed run reserves its plan."""
    ledger = new_ledger(tmp_path, cap=PLAN.total)
    rec = start(ledger, PLAN, "run-1")
    rec.record_intent(PLAN.measurements[0])  # then the process dies: no terminal entry
    reopened = open_ledger(ledger.path)
    state = reopened.state
    assert state.runs["run-1"].status is RunStatus.RUNNING
    assert state.dataset_spent(DATASET, PrivacyDefinition.ZCDP) == PLAN.total
    with pytest.raises(BudgetError):
        start(reopened, PLAN, "run-2", cap_raise=(2 * PLAN.total - Fraction(1, 10**9), "retry"))


def noiseless_plan() -> RunPlan:
    """A plan with one Infinity (no-noise) budget, as a non-production test run has."""
    first = dataclasses.replace(PLAN.measurements[0], budget=Decimal("Infinity"))
    return RunPlan(PLAN.privacy_defn, (first,) + PLAN.measurements[1:])


def test_infinite_budgets_need_non_confidential_and_are_recorded(tmp_path: Path) -> None:
    """Infinity budgets only in non-confidential runs, which only a non-confidential ledger takes (new
    rule: they can no longer share a confidential dataset's ledger, instead of counting against it)."""
    plan = noiseless_plan()
    confidential = new_ledger(tmp_path, name="production.jsonl")
    with pytest.raises(BudgetError, match="non-confidential"):
        start(confidential, plan, "run-1")
    with pytest.raises(LedgerError, match="for confidential data; a run declared non-confidential must use its own"):
        start(confidential, plan, "run-1", non_confidential=True)
    assert [e["kind"] for e in entries(confidential.path)] == ["LEDGER_INIT"]
    ledger = new_ledger(tmp_path, cap=1, non_confidential=True)
    rec = start(ledger, plan, "run-1", non_confidential=True)
    noisy = measure(plan.measurements[0], np.arange(plan.measurements[0].n_cells), rec)
    assert list(noisy) == list(range(plan.measurements[0].n_cells))
    run_all_but_first(rec, plan)
    publish(rec, tmp_path / "out")
    started = of_kind(ledger.path, "RUN_STARTED")[0]
    assert started["planned_total"] == "Infinity" and started["planned"][0]["budget"] == "Infinity"
    assert started["non_confidential"] is True and started["planned"][0]["variance"] == "0.0"
    # Non-confidential runs are not refused by the cap (the demo runs twice) ...
    start(ledger, plan, "run-2", non_confidential=True)
    state = read_ledger(ledger.path)
    assert state.dataset_spent(DATASET, PrivacyDefinition.ZCDP) == INFINITE  # ... though recorded
    assert state.runs["run-2"].spent_before == INFINITE and state.runs["run-2"].lifetime_cap == 1


def test_confidential_and_non_confidential_ledgers_take_only_their_runs(tmp_path: Path) -> None:
    confidential = new_ledger(tmp_path, cap=PLAN.total)
    synthetic = new_ledger(tmp_path, cap=PLAN.total, non_confidential=True, name="synthetic.jsonl")
    with pytest.raises(LedgerError, match="for confidential data"):
        start(confidential, PLAN, "run-1", non_confidential=True)
    with pytest.raises(LedgerError, match="created for non-confidential .*without --non-confidential"):
        start(synthetic, PLAN, "run-1")
    # Declaring data non-confidential cannot sidestep the production cap: the production ledger
    # refuses the run however it is declared.
    run_all(start(confidential, PLAN, "run-1"), PLAN)
    for non_conf in (False, True):
        with pytest.raises(PHSafeError):
            start(confidential, PLAN, "run-2", non_confidential=non_conf)
    for run_id in ("s-1", "s-2", "s-3"):  # caps are recorded, not enforced
        run_all(start(synthetic, PLAN, run_id, non_confidential=True), PLAN)
    assert read_ledger(synthetic.path).dataset_spent(DATASET, PrivacyDefinition.ZCDP) == 3 * PLAN.total
    # Replay: a run of the other kind forced into either ledger is rejected.
    for ledger, flag in ((confidential, True), (synthetic, False)):
        first = of_kind(ledger.path, "RUN_STARTED")[-1]
        entry = craft(ledger.path, "RUN_STARTED", "forced", body_of(first, non_confidential=flag))
        rejected(ledger.path, entry["seq"], "RUN_STARTED", "confidential ledger takes only confidential runs")


def test_pure_dp_spends_count_in_the_ledgers_unit(tmp_path: Path) -> None:
    """A zCDP ledger counts a pure-DP spend of epsilon as epsilon^2/2; a pure-DP ledger counts epsilon,
    and refuses zCDP spends (no pure-DP bound). The unit is the ledger's, set at init (the first
    format converted into the later run's unit)."""
    pure = plan_run(small_config("puredp"))
    zcdp = PLAN
    converted = sum((Fraction(m.budget) ** 2 / 2 for m in pure.measurements), Fraction(0))
    cap = zcdp.total + converted
    for slack, fits in ((0, True), (Fraction(1, 10**9), False)):
        ledger = new_ledger(tmp_path, cap=cap - slack, name=f"zcdp-{fits}.jsonl")
        rec = start(ledger, pure, "pure-1")
        run_all(rec, pure)
        publish(rec, tmp_path / f"out-{fits}")
        state = read_ledger(ledger.path)
        assert state.dataset_spent(DATASET, PrivacyDefinition.ZCDP) == converted
        assert state.dataset_spent(DATASET, PrivacyDefinition.PUREDP) == pure.total
        if fits:
            start(ledger, zcdp, "zcdp-1")
            assert parse_exact(of_kind(ledger.path, "RUN_STARTED")[-1]["spent_before"]) == converted
        else:
            with pytest.raises(BudgetError, match="exceeds the cap"):
                start(ledger, zcdp, "zcdp-1")
    ledger = new_ledger(tmp_path, cap=pure.total, privacy_defn=PrivacyDefinition.PUREDP, name="pure.jsonl")
    rec = start(ledger, pure, "pure-1")
    run_all(rec, pure)
    assert read_ledger(ledger.path).dataset_spent(DATASET, PrivacyDefinition.PUREDP) == pure.total
    with pytest.raises(BudgetError, match=r"epsilon \(pure DP\)"):
        start(ledger, pure, "pure-2")
    # A zCDP spend has no pure-DP bound: refused in a pure-DP ledger whatever its cap.
    ledger.raise_cap(DATASET, Fraction(10**6), "room")
    with pytest.raises(BudgetError, match="plans Infinity"):
        start(ledger, zcdp, "zcdp-1")


def test_run_ids_are_unique(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, non_confidential=True)
    start(ledger, PLAN, "same", non_confidential=True)
    with pytest.raises(LedgerError, match="already started"):
        start(ledger, PLAN, "same", non_confidential=True)


# --------------------------------------------------------------------------------------------
# Publication: OUTPUTS_PUBLISHED and RUN_FINISHED, recorded after the release is in place
# --------------------------------------------------------------------------------------------


def test_publication_is_recorded_with_its_place_and_finishes_the_run(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """New rule: OUTPUTS_PUBLISHED records where the release went (an absolute path) and is written
    with RUN_FINISHED in one write; a run finishes only by publishing."""
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    run_all(rec, PLAN)
    data = ledger.path.read_bytes()
    last = entries(ledger.path)[-1]
    # Replay: RUN_FINISHED without OUTPUTS_PUBLISHED in the attempt; a relative or missing output.
    craft(ledger.path, "RUN_FINISHED", "run-1", {"spent": format_exact(PLAN.total)})
    rejected(ledger.path, last["seq"] + 1, "RUN_FINISHED", "without OUTPUTS_PUBLISHED in this attempt")
    for output in ("out", "", None, "/x\n"):
        ledger.path.write_bytes(data)
        craft(ledger.path, "OUTPUTS_PUBLISHED", "run-1", {"files": FILES, "output": output})
        rejected(ledger.path, last["seq"] + 1, "OUTPUTS_PUBLISHED", "absolute path the release was published to")
    ledger.path.write_bytes(data)
    craft(ledger.path, "OUTPUTS_PUBLISHED", "run-1", {"files": FILES})
    rejected(ledger.path, last["seq"] + 1, "OUTPUTS_PUBLISHED", r"missing \['output'\]")
    ledger.path.write_bytes(data)
    craft(ledger.path, "OUTPUTS_PUBLISHED", "run-1", {"files": {}, "output": "/x"})
    rejected(ledger.path, last["seq"] + 1, "OUTPUTS_PUBLISHED", "non-empty")
    ledger.path.write_bytes(data)
    craft(ledger.path, "OUTPUTS_PUBLISHED", "run-1", {"files": {"../etc/passwd": "d" * 64}, "output": "/x"})
    rejected(ledger.path, last["seq"] + 1, "OUTPUTS_PUBLISHED", "relative paths")
    ledger.path.write_bytes(data)
    monkeypatch.chdir(tmp_path)
    rec.record_published(FILES, Path("release"))  # given relative: recorded absolute
    release = str(Path.cwd() / "release")
    published, finished = entries(ledger.path)[-2:]
    assert (published["kind"], finished["kind"]) == ("OUTPUTS_PUBLISHED", "RUN_FINISHED")
    assert published["output"] == release and published["files"] == FILES
    assert parse_exact(finished["spent"]) == PLAN.total
    run = read_ledger(ledger.path).runs["run-1"]
    assert run.status is RunStatus.FINISHED and run.output_path == release
    assert run.outputs == FILES and run.published
    with pytest.raises(LedgerError, match="already ended"):
        rec.record_published(FILES, tmp_path / "again")


def test_an_attempt_that_published_cannot_fail(tmp_path: Path) -> None:
    """OUTPUTS_PUBLISHED must be followed by RUN_FINISHED in the same attempt: a run that recorded
    its release in place cannot then record that it failed."""
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    run_all(rec, PLAN)
    craft(ledger.path, "OUTPUTS_PUBLISHED", "run-1", {"files": FILES, "output": str(tmp_path / "out")})
    published = entries(ledger.path)[-1]
    craft(ledger.path, "RUN_FAILED", "run-1", {"spent": format_exact(PLAN.total), "reason": "after publishing",
                                               "code": "internal-error", "stage": "release"})
    rejected(ledger.path, published["seq"] + 1, "RUN_FAILED", "OUTPUTS_PUBLISHED")


# --------------------------------------------------------------------------------------------
# Ledgers of the first format: still verified, migrated in place
# --------------------------------------------------------------------------------------------


PURE = plan_run(small_config("puredp"))


def first_format_ledger(path: Path) -> FirstFormatLedger:
    """Two old datasets: A (a finished run, then a second run with a raised cap that failed after an
    uncommitted INTENT) and B (a crashed pure-DP run)."""
    old = FirstFormatLedger(path)
    rng = np.random.default_rng(3)
    old.start("old-1", PLAN, DIGESTS_A)
    for m in PLAN.measurements:
        old.spend("old-1", m, rng.integers(0, 9, m.n_cells))
    old.publish("old-1", FILES)
    old.finish("old-1", PLAN.total)
    old.start("old-2", PLAN, DIGESTS_A, spent_before=PLAN.total, lifetime_cap=2 * PLAN.total,
              cap_reason="second release approved")
    old.intent("old-2", PLAN.measurements[0])
    old.fail("old-2", Fraction(PLAN.measurements[0].budget), "worker lost")
    old.start("old-3", PURE, DIGESTS_B)
    old.intent("old-3", PURE.measurements[0])
    return old


OLD_A, OLD_B = dataset_id(DIGESTS_A), dataset_id(DIGESTS_B)
OLD_A_SPENT = PLAN.total + Fraction(PLAN.measurements[0].budget)


def test_a_first_format_ledger_still_verifies_under_its_own_rules(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    old = first_format_ledger(path)
    state = read_ledger(path)
    assert state.format == 1 and state.policy is None and state.unit is None
    assert state.size == len(old.entries)
    assert {r.run_id: (r.legacy, r.account, r.status) for r in state.runs.values()} == {
        "old-1": (True, f"legacy:{OLD_A}", RunStatus.FINISHED),
        "old-2": (True, f"legacy:{OLD_A}", RunStatus.FAILED),
        "old-3": (True, f"legacy:{OLD_B}", RunStatus.RUNNING),
    }
    assert state.dataset_spent(f"legacy:{OLD_A}", PrivacyDefinition.ZCDP) == OLD_A_SPENT
    assert state.dataset_spent(f"legacy:{OLD_B}", PrivacyDefinition.PUREDP) == PURE.total
    assert state.runs["old-2"].cap_reason == "second release approved"
    assert state.runs["old-1"].outputs == FILES and state.runs["old-1"].output_path is None
    # The first format's own rules still hold: a raised cap needed a cap_reason, a run finished
    # without publishing, a run's cap covered the dataset's earlier spends.
    data = path.read_bytes()
    started = old.entries[0]
    body = body_of(started, spent_before=format_exact(OLD_A_SPENT), lifetime_cap=format_exact(3 * PLAN.total),
                   cap_reason=None)
    craft(path, "RUN_STARTED", "old-4", body)
    rejected(path, len(old.entries), "RUN_STARTED", "above the planned total needs a recorded cap_reason")
    path.write_bytes(data)
    craft(path, "RUN_STARTED", "old-4", {**body, "lifetime_cap": format_exact(PLAN.total), "cap_reason": None})
    rejected(path, len(old.entries), "RUN_STARTED", "run exceeds the lifetime cap")
    path.write_bytes(data)
    craft(path, "RUN_STARTED", "old-4", {**body, "dataset_id": OLD_B})
    rejected(path, len(old.entries), "RUN_STARTED", "dataset_id is not the digest of the input digests")
    path.write_bytes(data)
    craft(path, "RUN_STARTED", "old-4", {**body, "cap_reason": "third release"})
    assert read_ledger(path).runs["old-4"].lifetime_cap == 3 * PLAN.total
    # A first-format ledger has no format-2 entries before its migration.
    path.write_bytes(data)
    craft(path, "CAP_RAISED", None, {"dataset": "cef-a", "lifetime_cap": "5", "reason": "x"})
    rejected(path, len(old.entries), "CAP_RAISED", "migrate it first")


def test_a_first_format_ledger_takes_no_new_run_until_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    first_format_ledger(path)
    data = path.read_bytes()
    ledger = open_ledger(path)
    for attempt in (lambda: start(ledger, PLAN, "new-1"),
                    lambda: ledger.raise_cap("cef-a", Fraction(5), "x"),
                    lambda: ledger.resume_run("old-2", config_digest="c" * 64, dataset="cef-a",
                                              fingerprint=FP_A, code_version="t", reason="retry"),
                    ledger.lineage_key):
        with pytest.raises(LedgerError, match="phsafe ledger migrate"):
            attempt()
    assert path.read_bytes() == data and not key_path(path).exists()


def test_migrate_names_old_datasets_and_their_runs_count_against_them(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    old = first_format_ledger(path)
    data = path.read_bytes()
    migrated = migrate_ledger(path, lifetime_cap=OLD_A_SPENT + PLAN.total, reason="policy after migration",
                              names={OLD_A[:8]: "cef-a", OLD_B.upper()[:12]: "cef-b"}, code_version="v2")
    # In place, appended: the old history is untouched and the chain runs on.
    assert path.read_bytes().startswith(data)
    entry = entries(path)[-1]
    assert entry["kind"] == "LEDGER_MIGRATED" and entry["run_id"] is None and entry["seq"] == len(old.entries)
    assert entry["prev"] == old.entries[-1]["hash"]
    assert entry["datasets"] == {OLD_A: "cef-a", OLD_B: "cef-b"}
    assert entry["lifetime_cap"] == format_exact(OLD_A_SPENT + PLAN.total) and entry["non_confidential"] is False
    assert entry["format"] == 3 and entry["reason"] == "policy after migration"
    assert stat.S_IMODE(key_path(path).stat().st_mode) == 0o600
    key = migrated.lineage_key()
    assert key_id(key) == entry["key_id"]
    state = read_ledger(path)
    assert state.format == 3 and state.policy.seq == entry["seq"] and state.legacy_names == entry["datasets"]
    assert state.public_log is None and not state.awaits_log_binding  # no log: its first runs cannot be projected
    assert {r.run_id: r.account for r in state.runs.values()} == {"old-1": "cef-a", "old-2": "cef-a",
                                                                  "old-3": "cef-b"}
    assert state.dataset_spent("cef-a", PrivacyDefinition.ZCDP) == OLD_A_SPENT
    # The old runs count against the named dataset: a new version of cef-a has room for one plan.
    rec = start(migrated, PLAN, "new-1", dataset="cef-a", new_version="first run after migration")
    started = entries(path)[-1]
    assert parse_exact(started["spent_before"]) == OLD_A_SPENT
    run_all(rec, PLAN)
    publish(rec, tmp_path / "out")
    with pytest.raises(BudgetError, match=f"already spent {format_exact(OLD_A_SPENT + PLAN.total)}"):
        start(migrated, PLAN, "new-2", dataset="cef-a")
    # An old crashed run keeps its whole reservation (in the ledger's unit, zCDP: eps^2/2).
    eps2 = sum((Fraction(m.budget) ** 2 / 2 for m in PURE.measurements), Fraction(0))
    assert read_ledger(path).dataset_spent("cef-b", PrivacyDefinition.ZCDP) == eps2
    # Old runs are history: they are not resumed or appended to after the migration.
    with pytest.raises(LedgerError, match="before the ledger was migrated"):
        migrated.resume_run("old-2", config_digest="c" * 64, dataset="cef-a", fingerprint=FP_A,
                            code_version="v2", reason="retry")
    intent = next(e for e in old.entries if e["kind"] == "INTENT" and e["run_id"] == "old-3")
    size = len(entries(path))
    craft(path, "COMMITTED", "old-3", {"key": intent["key"], "intent_seq": intent["seq"],
                                       "intent_hash": intent["hash"], "noisy_digest": "0" * 64})
    rejected(path, size, "COMMITTED", "of the first ledger format; the ledger was migrated since")


def test_migrate_refuses_an_unnamed_old_dataset(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    first_format_ledger(path)
    data = path.read_bytes()
    for names, match in (
        ({OLD_A[:8]: "cef-a"}, f"old dataset {OLD_B[:16]} has no name"),
        ("cef", "has 2 old datasets; name each"),
        ({OLD_A[:7]: "cef-a", OLD_B: "cef-b"}, "8 or more hex digits"),
        ({"0" * 8: "cef-a", OLD_B: "cef-b"}, "names 0 old dataset ids"),
        ({OLD_A: "cef a", OLD_B: "cef-b"}, "dataset names"),
    ):
        with pytest.raises(LedgerError, match=match):
            migrate_ledger(path, lifetime_cap=Fraction(2), reason="x", names=names)
        assert path.read_bytes() == data and not key_path(path).exists()
    with pytest.raises(LedgerError, match="reason"):
        migrate_ledger(path, lifetime_cap=Fraction(2), reason=" ", names={OLD_A: "cef-a", OLD_B: "cef-b"})
    with pytest.raises(BudgetError, match="non-confidential"):
        migrate_ledger(path, lifetime_cap=INFINITE, reason="x", names={OLD_A: "cef-a", OLD_B: "cef-b"})
    assert path.read_bytes() == data and not key_path(path).exists()
    migrate_ledger(path, lifetime_cap=Fraction(2), reason="x", names={OLD_A: "cef-a", OLD_B: "cef-b"})
    migrated = path.read_bytes()
    with pytest.raises(LedgerError, match="migrated once"):
        migrate_ledger(path, lifetime_cap=Fraction(2), reason="x", names={OLD_A: "cef-a", OLD_B: "cef-b"})
    key_path(path).unlink()
    with pytest.raises(LedgerError, match="already of the current format"):
        migrate_ledger(path, lifetime_cap=Fraction(2), reason="x", names={OLD_A: "cef-a", OLD_B: "cef-b"})
    assert path.read_bytes() == migrated
    # A ledger of the current format is never migrated; a single old dataset takes one name.
    fresh = new_ledger(tmp_path)
    with pytest.raises(LedgerError, match="already exists"):
        migrate_ledger(fresh.path, lifetime_cap=Fraction(2), reason="x", names="cef")
    single = FirstFormatLedger(tmp_path / "single.jsonl")
    single.start("only", PLAN, DIGESTS_A)
    assert migrate_ledger(single.path, lifetime_cap=Fraction(2), reason="x", names="cef").state.runs["only"].dataset == "cef"


def test_replay_rejects_a_migration_that_does_not_name_every_old_dataset(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    old = first_format_ledger(path)
    data = path.read_bytes()
    policy = body_of(entries(new_ledger(tmp_path, cap=2).path)[0])
    del policy["public_log"]  # a migrated first-format ledger has no public log
    n = len(old.entries)
    for datasets, match in (
        ({OLD_A: "cef-a"}, "must name every old dataset id exactly"),
        ({OLD_A: "cef-a", OLD_B: "cef-b", "f" * 64: "cef-c"}, "names an id no run of the ledger has"),
        ({OLD_A: "cef-a", OLD_B: "cef b"}, "SHA-256 hex ids to dataset names"),
        ("cef", "datasets must map"),
    ):
        path.write_bytes(data)
        craft(path, "LEDGER_MIGRATED", None, {**policy, "datasets": datasets})
        rejected(path, n, "LEDGER_MIGRATED", match)
    path.write_bytes(data)
    craft(path, "LEDGER_MIGRATED", None, {**policy, "datasets": {OLD_A: "cef-a", OLD_B: "cef-b"}})
    state = read_ledger(path)
    assert state.policy is not None and state.runs["old-3"].dataset == "cef-b"
    craft(path, "LEDGER_MIGRATED", None, {**policy, "datasets": {OLD_A: "cef-a", OLD_B: "cef-b"}})
    rejected(path, n + 1, "LEDGER_MIGRATED", "already has a policy")
    # A ledger of the first format without runs is not migrated: it is initialised.
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    craft(empty, "LEDGER_MIGRATED", None, {**policy, "datasets": {}})
    rejected(empty, 0, "LEDGER_MIGRATED", "a ledger starts with LEDGER_INIT")


def test_checkpoint_signature(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "key.pem"
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    unsigned = rec.checkpoint(None)
    assert unsigned["signature"] is None and unsigned["ledger_size"] == 3  # LEDGER_INIT, DATASET_VERSION, RUN_STARTED
    signed = rec.checkpoint(pem)
    assert signed["head_hash"] == entries(ledger.path)[-1]["hash"] == unsigned["head_hash"]
    key.public_key().verify(
        base64.b64decode(signed["signature"]), ledger_mod.checkpoint_message(3, signed["head_hash"])
    )
    assert rec.checkpoint(key)["signature"] == signed["signature"]  # a loaded key signs the same
    locked = tmp_path / "locked.pem"
    locked.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(PHSafeError, match="protected by a passphrase"):
        rec.checkpoint(locked)
    assert lock_path(ledger.path).exists()
    assert [e["kind"] for e in entries(ledger.path)][-1] == "RUN_STARTED"  # checkpoints append nothing


def test_a_bad_signing_key_is_refused_in_one_line(tmp_path: Path) -> None:
    """Garbage, another algorithm, or a key that does not match the operator's public key: one clear
    refusal (PHSafeError), never an internal error."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    ledger = new_ledger(tmp_path)
    rec = start(ledger, PLAN, "run-1")
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(PHSafeError, match=r"the signing key bad.pem \(--signing-key\) is not a PEM private key"):
        rec.checkpoint(bad)
    other = tmp_path / "rsa.pem"
    other.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(PHSafeError, match="is a RSAPrivateKey, not an Ed25519 key"):
        ledger_mod.load_signing_key(other)
    key, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    pem, pub = tmp_path / "key.pem", tmp_path / "stranger.pub"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    pub.write_bytes(stranger.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(PHSafeError, match=r"does not match the public key stranger.pub \(--public-key\)"):
        ledger_mod.load_signing_key(pem, pub)
    with pytest.raises(PHSafeError, match="is not a readable PEM public key"):
        ledger_mod.load_signing_key(pem, bad)
    assert ledger_mod.load_signing_key(pem) is not None


def _sketch(tags: range, records: int | None = None) -> dict[str, Any]:
    """A sketch as phsafe.overlap.keyed_sketch records it: the tags of the records' least hashes."""
    listed = sorted(f"{t:012x}" for t in tags)
    return {"records": len(listed) if records is None else records, "size": 512, "tags": listed}


US = _sketch(range(512), 1000)  # 1000 person records; the sketch holds the 512 least
NEAR = _sketch(range(1, 513), 999)  # the same records but one


def test_records_that_overlap_another_dataset_need_a_declared_relation(tmp_path: Path) -> None:
    """Issue 22: one person removed and a new name is not a new dataset with a fresh cap."""
    from phsafe.overlap import overlap_share, percent

    share = percent(overlap_share(NEAR, US))
    assert share == "99.90%"
    ledger = new_ledger(tmp_path, cap=1)
    start(ledger, PLAN, "us-1", dataset="cef-us", sketch=US).fail("x")
    start(ledger, PLAN, "pr-1", dataset="cef-pr", fingerprint=FP_B, sketch=_sketch(range(5000, 5400))).fail("x")
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError, match=r"more than 1.00% of these records are also in dataset 'cef-us': "
                                          r"if they are a new version of 'cef-us', run them as 'cef-us'") as refused:
        start(ledger, PLAN, "copy-1", dataset="cef-copy", fingerprint="c3" * 32, sketch=NEAR)
    assert "99.9" not in str(refused.value)  # the estimated share is confidential: never in the message
    assert ledger.path.stat().st_size == size
    with pytest.raises(BudgetError, match="--overlap-reason is given, but these records overlap no other"):
        start(ledger, PLAN, "new-1", dataset="cef-new", fingerprint="d4" * 32, sketch=_sketch(range(9000, 9500)),
              overlap_reason="memo")
    start(ledger, PLAN, "copy-1", dataset="cef-copy", fingerprint="c3" * 32, sketch=NEAR,
          overlap_reason="a disjoint population, memo 7")
    (version,) = read_ledger(ledger.path).dataset_states["cef-copy"].versions
    assert version.overlap == {"dataset": "cef-us", "share": share, "reason": "a disjoint population, memo 7"}
    # Up to 1% is allowed; exact while both datasets fit in a sketch, else scaled by the larger size.
    assert overlap_share(_sketch(range(500)), _sketch(range(495, 995))) == Fraction(5, 500)
    assert overlap_share(_sketch(range(512), 200_000), _sketch(range(502, 1014), 100_000)) == Fraction(10, 512)


def test_replay_checks_the_overlap_of_every_declared_version(tmp_path: Path) -> None:
    """audit verify: a version whose sketch overlaps another dataset's carries the relation, and
    only then; a sketch of the wrong form is refused."""
    ledger = new_ledger(tmp_path, cap=1)
    start(ledger, PLAN, "us-1", dataset="cef-us", sketch=US).fail("x")
    data = ledger.path.read_bytes()
    relation = {"dataset": "cef-us", "share": "99.90%", "reason": "memo"}
    for body, match in (
        ({"sketch": NEAR}, "about 99.90% of these records are also in dataset 'cef-us'"),
        ({"sketch": NEAR, "overlap": {**relation, "share": "50.00%"}}, "the sketches give 'cef-us' at '99.90%'"),
        ({"sketch": _sketch(range(5000, 5100)), "overlap": relation}, "overlap no other dataset's beyond 1.00%"),
        ({"sketch": {**NEAR, "tags": NEAR["tags"][::-1]}}, "sorted, distinct"),
        ({"overlap": relation}, "overlap is declared without a sketch"),
    ):
        ledger.path.write_bytes(data)
        craft(ledger.path, "DATASET_VERSION", None, {"dataset": "cef-copy", "fingerprint": FP_B, "reason": "x",
                                                     **body})
        rejected(ledger.path, len(data.splitlines()), "DATASET_VERSION", match)
    ledger.path.write_bytes(data)
    craft(ledger.path, "DATASET_VERSION", None, {"dataset": "cef-copy", "fingerprint": FP_B, "reason": "x",
                                                 "sketch": NEAR, "overlap": relation})
    assert read_ledger(ledger.path).dataset_states["cef-copy"].versions[0].overlap == relation


def test_a_ledger_wide_cap_bounds_all_datasets_together(tmp_path: Path) -> None:
    """Issue 22: the cap is per dataset name; ``ledger init --ledger-cap`` adds one over them all,
    enforced by the API and by replay (audit verify)."""
    with pytest.raises(BudgetError, match="confidential ledger only"):
        create_ledger(tmp_path / "nc.jsonl", lifetime_cap=INFINITE, reason="demo", non_confidential=True,
                    ledger_cap=Fraction(1))
    ledger = create_ledger(tmp_path / "l.jsonl", lifetime_cap=Fraction(1), reason="policy",
                         ledger_cap=Fraction(3, 4))
    assert ledger.state.policy.ledger_cap == Fraction(3, 4)
    rec = start(ledger, PLAN, "a-1", dataset="cef-a")
    run_all(rec, PLAN)
    publish(rec, tmp_path / "out-a")
    size = ledger.path.stat().st_size
    with pytest.raises(BudgetError, match=r"refused by the ledger-wide cap 0.75 .* all datasets would have spent 1\b"):
        start(ledger, PLAN, "b-1", dataset="cef-b", fingerprint=FP_B)
    assert ledger.path.stat().st_size == size
    # Forced past the API, the same start is rejected on replay.
    data = ledger.path.read_bytes()
    first = of_kind(ledger.path, "RUN_STARTED")[0]
    craft(ledger.path, "DATASET_VERSION", None, {"dataset": "cef-b", "fingerprint": FP_B, "reason": "x"})
    entry = craft(ledger.path, "RUN_STARTED", "b-1", body_of(first, dataset="cef-b", fingerprint=FP_B,
                                                               spent_before="0"))
    rejected(ledger.path, entry["seq"], "RUN_STARTED", r"run exceeds the ledger-wide cap: all datasets' spends "
                                                       r"would be 1 > ledger cap 0.75")
    ledger.path.write_bytes(data)


def test_a_planned_item_is_checked_the_same_every_time_it_is_read() -> None:
    """parse_planned remembers an item's passed checks (a plan is replayed on every read) and
    never a refusal: an item refused once is refused again, and an item differing from a
    passed one only in a value's type (true for 1) or by a nested value is refused all the same."""
    from phsafe.errors import LedgerRuleViolation
    from phsafe.ledger.format import planned_item
    from phsafe.ledger.rules import parse_planned

    plan = plan_run(load_config(US_CONFIG))
    defn = plan.measurements[0].privacy_defn
    person = next(m for m in plan.measurements if m.tau is not None)
    # tau 1 (paper bound: sensitivity 2 tau + 2 = 4), so that a true for the 1 could be taken for it
    measurements = [dataclasses.replace(person, tau=1, sensitivity=4) if m is person else m for m in plan.measurements]
    items = [planned_item(m) for m in measurements]
    first, again = parse_planned(items, defn), parse_planned([dict(i) for i in items], defn)
    assert first == again and [s.measurement for s in first.values()] == measurements
    p = measurements.index(next(m for m in measurements if m.tau == 1))
    u = next(i for i, m in enumerate(measurements) if m.tau is None)
    for position, change, why in (
            (p, {"tau": True}, "tau >= 1"),
            (p, {"n_cells": [items[p]["n_cells"]]}, "n_cells"),
            (u, {"distribution": ["gaussian"]}, "distribution"),
            (u, {"variance": "1.0"}, "variance"),
            (u, {"key": "PH2/usa_*"}, "key")):
        bad = [dict(item) for item in items]
        bad[position].update(change)
        for _ in range(2):
            with pytest.raises(LedgerRuleViolation, match=rf"planned\[{position}\]") as info:
                parse_planned(bad, defn)
            assert why in str(info.value), (change, str(info.value))
    with pytest.raises(LedgerRuleViolation, match=r"planned\[" + str(len(items)) + r"\] repeats"):
        parse_planned(items + [dict(items[0])], defn)
    assert parse_planned(items, defn) == first


def test_a_torn_ledger_is_replayed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """read_ledger_prefix gives the state of the complete entries and the incomplete bytes, from
    one replay; read_ledger raises the torn tail's error."""
    from phsafe.errors import TornTailError
    from phsafe.ledger.store import read_ledger_prefix

    path = new_ledger(tmp_path).path
    complete = read_ledger(path)
    torn = b'{"budget":"0.25","ha'
    with open(path, "ab") as f:
        f.write(torn)
    replays = []
    real = store_mod.apply_all
    monkeypatch.setattr(store_mod, "apply_all", lambda state, data, *a: (replays.append(len(data)), real(state, data, *a)))
    state, tail = read_ledger_prefix(path)
    assert tail == torn and len(replays) == 1
    assert state.size == complete.size and state.head_hash == complete.head_hash and state.lines == complete.lines
    with pytest.raises(TornTailError, match=f"{len(torn)} bytes"):
        read_ledger(path)
    path.write_bytes(path.read_bytes()[: -len(torn)])
    assert read_ledger_prefix(path)[1] == b""


@pytest.mark.parametrize(("value", "why"), [
    (1.5, "floats"), ({"a": [1, {"b": 2.5}]}, "floats"), ({1: 2}, "keys"), ({"a": 1.5, 2: 1}, "floats"),
    ([b"x"], "bytes cannot"), ((1, [2, [3.0]]), "floats"), ({"a": {"b": [object()]}}, "object cannot")])
def test_canonical_json_refuses_what_has_no_exact_form(value: object, why: str) -> None:
    """Floats anywhere, keys that are not strings, values JSON has no exact form for -- the
    first one met in key order, as the walk meets it (subclasses of the scalars are scalars)."""
    import enum
    from collections import OrderedDict

    from phsafe.ledger.format import canonical_json

    with pytest.raises(TypeError, match=why):
        canonical_json(value)
    with pytest.raises(TypeError, match=why):
        canonical_json(OrderedDict(wrapped=value))

    class Code(enum.IntEnum):
        A = 1

    class Text(str):
        pass

    assert canonical_json({"b": [Code.A, Text("x"), None, True], "a": OrderedDict(c=(1, 2))}) == \
        b'{"a":{"c":[1,2]},"b":[1,"x",null,true]}'


def test_a_ledger_dropped_unclosed_closes_its_files(tmp_path: Path) -> None:
    from phsafe.ledger.store import lock_path
    from tests._descriptors import assert_closes_its_files_once

    made = new_ledger(tmp_path, cap=3)
    path = made.path
    made.close()
    assert_closes_its_files_once(lambda: Ledger.open(path), {path, lock_path(path)})
