"""The ledger's rules on bytes in memory: no file, no lock, no key.

Each test writes ledger lines the way any writer would (canonical JSON, hash chain) with
:class:`Lines` and replays them with :func:`phsafe.ledger.replay.replay` -- the same apply the
ledger uses on open, on append and in ``phsafe audit verify``. The tests through the file API
(appends, locks, rollback, repair) are in ``test_ledger.py``.
"""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from phsafe.accounting import RunPlan, plan_run
from phsafe.amounts import format_exact
from phsafe.config import PHSafeConfig, parse_config
from phsafe.errors import LedgerError, TornTailError
from phsafe.ledger import EntryKind, RunStatus, canonical_json, dataset_id, entry_hash, replay
from phsafe.ledger.first_format import FIRST_FORMAT_RULES
from phsafe.ledger.format import GENESIS_HASH, planned_item
from phsafe.ledger.replay import apply
from phsafe.ledger.rules import RULES
from phsafe.ledger.state import LedgerState

from tests.conftest import US_CONFIG

FP = "a1" * 32
OTHER_FP = "b2" * 32
DIGESTS = {"persons.csv": "1" * 64, "units.csv": "2" * 64, "geo.csv": "3" * 64}
FILES = {"PH1_num/PH1_num.csv": "d" * 64, "manifest.json": "e" * 64}
TIME = "2026-01-02T03:04:05.000006Z"


def small_plan() -> RunPlan:
    """Three measurements of two states (the other levels have budget 0: not measured)."""
    raw = json.loads(US_CONFIG.read_text())
    for levels in raw["privacy_budget"].values():
        for level in levels:
            levels[level] = 0
    raw["privacy_budget"]["PH1_num"].update({"state_*": Decimal("0.25"), "usa_*": Decimal("0.125")})
    raw["privacy_budget"]["PH2"].update({"usa_*": Decimal("0.0625")})
    raw["state_filter"] = ["02", "01"]
    config: PHSafeConfig = parse_config(raw)
    return plan_run(config)


PLAN = small_plan()
TOTAL = sum((Fraction(m.budget) for m in PLAN.measurements), Fraction(0))


class Lines:
    """Ledger lines built in memory, each hashed onto the previous one as a writer would."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def add(self, kind: str, run_id: str | None = None, **body: Any) -> dict[str, Any]:
        last = self.entries[-1] if self.entries else None
        entry = {"seq": len(self.entries), "prev": last["hash"] if last else GENESIS_HASH, "kind": kind,
                 "time": TIME, "run_id": run_id, **body}
        entry["hash"] = entry_hash(entry)
        self.entries.append(entry)
        return entry

    @property
    def data(self) -> bytes:
        return b"".join(canonical_json(e) + b"\n" for e in self.entries)

    # -- entries of a ledger with a policy -------------------------------------------------

    def init(self, cap: str = "2", *, non_confidential: bool = False) -> Lines:
        self.add("LEDGER_INIT", None, ledger_id="0" * 32, format=2, privacy_defn="zcdp", lifetime_cap=cap,
                 reason="test policy", non_confidential=non_confidential, key_id="1" * 32, code_version="test")
        return self

    def version(self, fingerprint: str = FP, dataset: str = "test-data") -> Lines:
        self.add("DATASET_VERSION", None, dataset=dataset, fingerprint=fingerprint, reason="first version")
        return self

    def start(self, run_id: str, *, spent_before: Fraction = Fraction(0), cap: str = "2",
              fingerprint: str = FP, **extra: Any) -> dict[str, Any]:
        return self.add(
            "RUN_STARTED", run_id, dataset="test-data", fingerprint=fingerprint, input_digests=DIGESTS,
            config_digest="c" * 64, code_version="test", truncation_key="ab" * 32, privacy_defn="zcdp",
            planned=[planned_item(m) for m in PLAN.measurements], planned_total=format_exact(TOTAL),
            lifetime_cap=cap, non_confidential=False, spent_before=format_exact(spent_before), validated=True,
            **extra)

    def spend(self, run_id: str, index: int = 0, *, commit: bool = True) -> dict[str, Any]:
        item = planned_item(PLAN.measurements[index])
        intent = self.add("INTENT", run_id, key=item["key"], budget=item["budget"],
                          sensitivity=item["sensitivity"], n_cells=item["n_cells"])
        if commit:
            self.add("COMMITTED", run_id, key=item["key"], intent_seq=intent["seq"], intent_hash=intent["hash"],
                     noisy_digest="f" * 64)
        return intent

    def release(self, run_id: str, *, spent: Fraction = TOTAL) -> None:
        for i in range(len(PLAN.measurements)):
            self.spend(run_id, i)
        self.add("OUTPUTS_PUBLISHED", run_id, files=FILES, output=f"/srv/release/{run_id}")
        self.add("RUN_FINISHED", run_id, spent=format_exact(spent))


def rejects(lines: Lines, match: str) -> LedgerError:
    """The replay of ``lines`` stops at their last entry, for ``match``."""
    last = lines.entries[-1]
    with pytest.raises(LedgerError, match=match) as info:
        replay(lines.data)
    assert (info.value.seq, info.value.kind) == (last["seq"], last["kind"]), str(info.value)
    return info.value


# --------------------------------------------------------------------------------------------
# The table of rules
# --------------------------------------------------------------------------------------------


def test_every_entry_kind_has_one_check_in_each_table() -> None:
    assert set(RULES) == set(EntryKind) == set(FIRST_FORMAT_RULES)
    differ = {kind for kind in EntryKind if FIRST_FORMAT_RULES[kind] is not RULES[kind]}
    assert differ == {EntryKind.RUN_STARTED, EntryKind.RUN_RESUMED, EntryKind.OUTPUTS_PUBLISHED,
                      EntryKind.RUN_FINISHED, EntryKind.RUN_FAILED}


def test_a_whole_release_replays_and_is_counted() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    lines.release("r1")
    state = replay(lines.data)
    run = state.runs["r1"]
    assert run.status is RunStatus.FINISHED and run.published and run.output_path == "/srv/release/r1"
    assert state.dataset_spent("test-data", PLAN.privacy_defn) == TOTAL
    assert state.head_hash == lines.entries[-1]["hash"] and state.size == len(lines.entries)


def test_a_rejected_entry_leaves_the_state_as_it_was() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    state = replay(lines.data)
    before = (state.size, state.head_hash, dict(state.runs["r1"].intents))
    bad = Lines()
    bad.entries = list(lines.entries)
    bad.add("INTENT", "r1", key="PH9/usa_*", budget="1", sensitivity=2, n_cells=2)
    with pytest.raises(LedgerError, match="not in the run's plan"):
        apply(state, canonical_json(bad.entries[-1]))
    assert (state.size, state.head_hash, dict(state.runs["r1"].intents)) == before


# --------------------------------------------------------------------------------------------
# Encoding and chain
# --------------------------------------------------------------------------------------------


def test_a_ledger_starts_with_its_policy() -> None:
    lines = Lines()
    lines.add("DATASET_VERSION", None, dataset="test-data", fingerprint=FP, reason="x")
    rejects(lines, "starts with LEDGER_INIT")


def test_lines_must_be_canonical_and_chained() -> None:
    lines = Lines().init()
    entry = dict(lines.entries[0])
    spaced = json.dumps(entry, sort_keys=True).encode() + b"\n"
    with pytest.raises(LedgerError, match="canonical JSON"):
        replay(spaced)
    lines.version()
    lines.entries[-1]["prev"] = "9" * 64
    lines.entries[-1]["hash"] = entry_hash(lines.entries[-1])
    rejects(lines, "prev does not match")
    lines.entries[-1]["prev"] = lines.entries[0]["hash"]
    lines.entries[-1]["hash"] = "0" * 64
    rejects(lines, "hash does not match")


def test_an_incomplete_last_line_is_a_torn_tail() -> None:
    data = Lines().init().version().data
    with pytest.raises(TornTailError) as info:
        replay(data + b'{"seq":2,')
    assert info.value.seq == 2


def test_optional_fields_are_left_out_never_null() -> None:
    lines = Lines().init().version()
    lines.start("r1", orchestration=None)
    rejects(lines, "orchestration is null")


# --------------------------------------------------------------------------------------------
# Datasets, versions and caps
# --------------------------------------------------------------------------------------------


def test_a_run_needs_a_declared_content_version() -> None:
    lines = Lines().init()
    lines.start("r1")
    rejects(lines, "never declared under dataset 'test-data'")


def test_a_content_version_is_declared_under_one_name() -> None:
    lines = Lines().init().version()
    lines.version(dataset="another-name")
    rejects(lines, "already declared under dataset 'test-data'")


def test_caps_are_only_raised_and_bound_every_start() -> None:
    lines = Lines().init(cap="0.5")
    lines.add("CAP_RAISED", None, dataset="test-data", lifetime_cap="0.25", reason="lower")
    rejects(lines, "a cap is only ever raised")

    lines = Lines().init(cap="0.5").version()
    lines.start("r1", cap="0.5")  # the plan reserves 0.4375 of 0.5
    lines.release("r1")
    lines.start("r2", spent_before=TOTAL, cap="0.5", re_release="the same records again")
    rejects(lines, "exceeds dataset test-data's lifetime cap")


def test_run_started_records_the_dataset_state_it_was_checked_against() -> None:
    lines = Lines().init().version()
    lines.start("r1", cap="3")
    rejects(lines, "is not dataset test-data's cap 2")
    lines = Lines().init().version()
    lines.start("r1", spent_before=Fraction(1))
    rejects(lines, "differs from the ledger's spends")


# --------------------------------------------------------------------------------------------
# One release per content version
# --------------------------------------------------------------------------------------------


def test_a_second_release_of_the_same_records_must_be_declared() -> None:
    lines = Lines().init(cap="10").version()
    lines.start("r1", cap="10")
    lines.release("r1")
    lines.start("r2", spent_before=TOTAL, cap="10")
    rejects(lines, "already claims this content version")
    lines.entries.pop()
    lines.start("r2", spent_before=TOTAL, cap="10", re_release="a corrected geography")
    assert replay(lines.data).runs["r2"].re_release == "a corrected geography"


def test_a_declared_re_release_must_be_one() -> None:
    lines = Lines().init().version()
    lines.start("r1", re_release="nothing was released")
    rejects(lines, "no other run released or is releasing")


# --------------------------------------------------------------------------------------------
# The run state machine
# --------------------------------------------------------------------------------------------


def test_a_measurement_is_spent_once_per_attempt_and_committed_against_its_intent() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    lines.spend("r1", 0)
    lines.spend("r1", 0, commit=False)
    rejects(lines, "already spent at entry 3 in this attempt")

    lines = Lines().init().version()
    lines.start("r1")
    intent = lines.spend("r1", 0, commit=False)
    lines.add("COMMITTED", "r1", key=intent["key"], intent_seq=intent["seq"], intent_hash="9" * 64,
              noisy_digest="f" * 64)
    rejects(lines, "intent_hash is not the hash of the INTENT entry")


def test_publication_follows_every_commit_and_ends_the_attempt() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    lines.spend("r1", 0)
    lines.add("OUTPUTS_PUBLISHED", "r1", files=FILES, output="/srv/release/r1")
    rejects(lines, "before every measurement was committed")

    lines = Lines().init().version()
    lines.start("r1")
    lines.release("r1")
    lines.entries = lines.entries[:-1]  # without RUN_FINISHED
    lines.add("OUTPUTS_PUBLISHED", "r1", files=FILES, output="/srv/release/r1")
    rejects(lines, "outputs were already published at entry")
    lines.entries.pop()
    lines.add("RUN_FAILED", "r1", spent=format_exact(TOTAL), reason="after publishing")
    rejects(lines, "it finishes, it cannot fail")


def test_a_run_finishes_by_publishing_its_whole_charge() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    lines.release("r1", spent=TOTAL / 2)
    rejects(lines, "differs from the run's charge")


def test_a_failed_run_charges_its_intents_and_resumes_with_the_same_config() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    lines.spend("r1", 0, commit=False)
    budget = Fraction(PLAN.measurements[0].budget)
    lines.add("RUN_FAILED", "r1", spent=format_exact(budget), reason="disk full")
    state = replay(lines.data)
    assert state.runs["r1"].status is RunStatus.FAILED
    assert state.dataset_spent("test-data", PLAN.privacy_defn) == budget
    lines.add("RUN_RESUMED", "r1", config_digest="d" * 64, dataset="test-data", fingerprint=FP,
              code_version="test", reason="resume")
    rejects(lines, "config_digest differs from the run's RUN_STARTED")
    lines.entries.pop()
    lines.add("RUN_RESUMED", "r1", config_digest="c" * 64, dataset="test-data", fingerprint=FP,
              code_version="test", reason="resume")
    state = replay(lines.data)
    assert state.runs["r1"].attempt == 2 and state.runs["r1"].status is RunStatus.RUNNING


# --------------------------------------------------------------------------------------------
# The first format
# --------------------------------------------------------------------------------------------


def first_format_start(lines: Lines, run_id: str) -> None:
    lines.add("RUN_STARTED", run_id, dataset_id=dataset_id(DIGESTS), input_digests=DIGESTS,
              config_digest="c" * 64, code_version="v0", truncation_key="ab" * 32, privacy_defn="zcdp",
              planned=[planned_item(m) for m in PLAN.measurements], planned_total=format_exact(TOTAL),
              lifetime_cap=format_exact(TOTAL), cap_reason=None, non_confidential=False, spent_before="0")


def test_first_format_rules_apply_until_the_ledger_has_a_policy() -> None:
    lines = Lines()
    first_format_start(lines, "old")
    for i in range(len(PLAN.measurements)):
        lines.spend("old", i)
    lines.add("OUTPUTS_PUBLISHED", "old", files=FILES)  # the first format recorded no output path
    lines.add("RUN_FINISHED", "old", spent=format_exact(TOTAL))
    state = replay(lines.data)
    assert state.format == 1 and state.runs["old"].legacy and state.runs["old"].status is RunStatus.FINISHED

    lines.add("DATASET_VERSION", None, dataset="test-data", fingerprint=FP, reason="x")
    rejects(lines, "migrate it first")


def test_format_two_needs_the_output_path_the_first_format_lacked() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    for i in range(len(PLAN.measurements)):
        lines.spend("r1", i)
    lines.add("OUTPUTS_PUBLISHED", "r1", files=FILES)
    rejects(lines, r"wrong fields \(missing \['output'\]")


def test_apply_builds_the_same_state_line_by_line() -> None:
    lines = Lines().init().version()
    lines.start("r1")
    lines.release("r1")
    state = LedgerState()
    for entry in lines.entries:
        apply(state, canonical_json(entry))
    whole = replay(lines.data)
    assert state.lines == whole.lines and state.head_hash == whole.head_hash
    assert state.runs["r1"].charge() == whole.runs["r1"].charge() == TOTAL
