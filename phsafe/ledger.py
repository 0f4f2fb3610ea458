"""The privacy-loss ledger: an append-only, hash-chained, durable record of every spend.

Format
    JSON Lines. Each line is the canonical JSON (sorted keys, no whitespace, UTF-8, no floats:
    exact numbers are strings) of one entry with the fields ``seq`` (0-based, consecutive),
    ``prev`` (hash of the previous entry, 64 zeros for the first), ``kind``, ``time`` (UTC ISO),
    ``run_id``, the body fields of its kind, and ``hash`` = SHA-256 over ``ENTRY_DOMAIN`` followed
    by the canonical JSON of the entry without ``hash``. Kinds: ``RUN_STARTED``, ``INTENT``,
    ``COMMITTED``, ``OUTPUTS_PUBLISHED``, ``RUN_FINISHED``, ``RUN_FAILED``, ``RUN_RESUMED``.

    The ledger holds no microdata: only file digests, the config digest, the plan (budgets,
    sensitivities, cell counts of public domains), digests of released noisy vectors, output
    file digests and short fixed failure and resume messages.

Write-ahead spends
    Every append happens under an exclusive ``flock`` on the sibling ``<ledger>.lock`` file: the
    writer reads (and verifies) whatever other processes appended since it last looked, appends
    one line, flushes and ``fsync``\\ s the file (and the directory when the file is created), and
    only then releases the lock and returns. :func:`phsafe.noise.measure` draws noise only after
    :meth:`RunRecorder.record_intent` returned, so a spend is on disk before its noise exists.
    Within one process a :class:`Ledger` object also holds a thread mutex around the same
    section, so recorders used from many threads (one per measurement task) append one at a time.

Attempts: resuming a failed or crashed run
    A run whose status is failed (it recorded ``RUN_FAILED``) or running (no terminal entry: it is
    running or it crashed) can be resumed by a ``RUN_RESUMED`` entry (:meth:`Ledger.resume_run`);
    a finished run never can. ``RUN_RESUMED`` records ``config_digest`` and ``dataset_id``, which
    must equal the run's ``RUN_STARTED`` values (the same config and inputs: otherwise reused
    measurements would be inconsistent with new ones), the ``code_version`` that resumes (it may
    differ, and is recorded), the operator's ``reason`` (non-empty), and the run's new
    ``lifetime_cap`` (same encoding as at start; kept or raised, never lowered; raising it needs a
    non-empty ``cap_reason``; Infinity only for a non-confidential run) with ``cap_reason`` (null
    or text). The run is running again; its attempt number is 1 + its number of ``RUN_RESUMED``
    entries, and the earlier attempts (how each ended, with its entry and reason) stay in the
    history.

    A measurement (planned key) has at most one ``INTENT`` per attempt: a further ``INTENT`` of a
    key is valid only if a ``RUN_RESUMED`` of its run lies between the key's previous ``INTENT``
    and the new one. A ``COMMITTED`` refers to its key's latest ``INTENT`` (``intent_seq`` and
    ``intent_hash``) and must be in the same attempt; each attempt publishes outputs at most once
    and spends nothing after that. A key whose latest ``INTENT`` is committed is *reusable*: a
    resumed attempt releases the noisy vector it stored, checked against the ``COMMITTED`` digest,
    instead of drawing noise again. Anything else -- an ``INTENT`` without ``COMMITTED`` (its
    noise may have been drawn and lost) or a committed vector that is missing or corrupt -- is
    spent again by a new ``INTENT``, charged again. Noise is never re-drawn without a new spend.
    A resumed attempt must tabulate with the run's recorded truncation key
    (:attr:`RunState.truncation_key`), so that what it spends again is computed from the same
    truncated data as what it reuses. A :class:`RunRecorder` belongs to one attempt: once the run
    is resumed, recorders of earlier attempts (a worker thought dead) are refused.

Lifetime rule (the odometer)
    A dataset is identified by :func:`dataset_id` (SHA-256 over its sorted input file digests).
    Write ``b_k`` for the budget of planned key ``k`` and ``n_k`` for its number of ``INTENT``
    entries over all the run's attempts. What a run *charges* against its dataset is:

    * a run whose status is failed: ``sum_k b_k * n_k`` -- every ``INTENT`` it recorded, re-spends
      included (an ``INTENT`` without ``COMMITTED`` counts: its noise may have been drawn); the
      unspent rest of its plan is released;
    * any other run -- finished, still running, or crashed without a terminal entry:
      ``sum over its planned keys of b_k * max(1, n_k)`` -- its whole plan stays reserved and every
      re-spend is charged on top. A crashed run's reservation is never released: nobody can prove
      which noise it drew. A resumed run is running again, so it reserves its whole plan again.

    For a run never resumed ``n_k <= 1``, so this is its planned total (its INTENTs if it failed).
    ``RUN_FINISHED.spent`` is the run's charge and ``RUN_FAILED.spent`` the sum of all its
    INTENTs. Nothing is ever refunded. The cap is checked in three places, each under the lock
    with the append it guards, so two processes cannot both pass a check:

    * :meth:`Ledger.start_run` refuses (:class:`~phsafe.errors.BudgetError`) a run for which
      ``spent + planned > cap``; the cap defaults to the run's own planned total, so a second full
      run on the same data is refused unless the operator raises the cap and says why (the cap and
      the reason are recorded);
    * :meth:`Ledger.resume_run` refuses a resume after which the odometer (with the run reserving
      its whole plan again, re-spends included) exceeds the new cap;
    * :meth:`RunRecorder.record_intent` refuses a re-spend (an ``INTENT`` of a key that already has
      one) that makes the odometer exceed the run's current cap, the latest recorded at start or
      resume. A first ``INTENT`` of a key adds nothing: it was reserved at start or resume.

    Charges are compared in the new run's unit. A pure-DP spend of epsilon counts as
    epsilon^2/2 against a zCDP run (epsilon-DP implies epsilon^2/2-zCDP, per measurement); a zCDP
    spend cannot be bounded in pure DP, so it makes a pure-DP run's odometer infinite.

    Non-confidential runs (synthetic or public data, declared by the operator) may use
    ``Infinity`` budgets and are not refused by the cap (at start, resume or re-spend); they are
    recorded like any other run, their spends count against the dataset for every later run, and
    the audit report flags them.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import enum
import errno
import fcntl
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator, Mapping

from phsafe.accounting import PlannedMeasurement, RunPlan
from phsafe.config import INFINITE, PrivacyDefinition
from phsafe.errors import BudgetError, PHSafeError
from phsafe.iterations import PopulationGroupLevel
from phsafe.noise import SpendReceipt
from phsafe.tables import TABLE_LEVELS, TABLES, TableKind

ENTRY_DOMAIN = b"phsafe-ledger-entry-v1\x00"
CHECKPOINT_DOMAIN = b"phsafe-ledger-checkpoint-v1\x00"
DATASET_DOMAIN = b"phsafe-dataset-v1\x00"
GENESIS_HASH = "0" * 64

Amount = Fraction | Decimal
"""An exact privacy-loss amount: a Fraction, or ``Decimal('Infinity')``."""


class EntryKind(str, enum.Enum):
    RUN_STARTED = "RUN_STARTED"
    INTENT = "INTENT"
    COMMITTED = "COMMITTED"
    OUTPUTS_PUBLISHED = "OUTPUTS_PUBLISHED"
    RUN_FINISHED = "RUN_FINISHED"
    RUN_FAILED = "RUN_FAILED"
    RUN_RESUMED = "RUN_RESUMED"


class RunStatus(str, enum.Enum):
    RUNNING = "running"  # no terminal entry: still running, or crashed
    FINISHED = "finished"
    FAILED = "failed"


class LedgerError(PHSafeError):
    """The ledger is malformed, broken, or was asked to record something inconsistent.

    Args:
        message: What failed, in plain words.
        seq: Index of the first failing entry (line), when the failure is about one.
        kind: That entry's kind, when known.
    """

    def __init__(self, message: str, *, seq: int | None = None, kind: str | None = None) -> None:
        self.seq = seq
        self.kind = kind
        self.reason = message
        where = ""
        if seq is not None:
            where = f"entry {seq}" + (f" ({kind})" if kind else "") + ": "
        super().__init__(where + message)


# --------------------------------------------------------------------------------------------
# Canonical encoding and exact numbers
# --------------------------------------------------------------------------------------------

_HEX64 = re.compile(r"[0-9a-f]{64}")
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]*[1-9])?")
_RATIO = re.compile(r"([1-9][0-9]*)/([1-9][0-9]*)")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
_MAX_TEXT = 500


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, UTF-8, no floats (exact numbers are strings)."""
    _reject_floats(obj)
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _reject_floats(obj: Any) -> None:
    if isinstance(obj, float):
        raise TypeError("floats are not allowed in the ledger; write exact numbers as strings")
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError("ledger object keys must be strings")
            _reject_floats(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _reject_floats(v)
    elif not (obj is None or isinstance(obj, (str, int, bool))):
        raise TypeError(f"{type(obj).__name__} cannot be written to the ledger")


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``ENTRY_DOMAIN`` + canonical JSON of ``entry`` without its ``hash``."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(ENTRY_DOMAIN + canonical_json(body)).hexdigest()


def checkpoint_message(ledger_size: int, head_hash: str) -> bytes:
    """The bytes an Ed25519 checkpoint signature covers."""
    return CHECKPOINT_DOMAIN + canonical_json({"head_hash": head_hash, "ledger_size": ledger_size})


def dataset_id(input_digests: Mapping[str, str]) -> str:
    """SHA-256 over the sorted input file digests (names are not part of a dataset's identity)."""
    digests = sorted(input_digests.values())
    return hashlib.sha256(DATASET_DOMAIN + "\n".join(digests).encode("ascii")).hexdigest()


def format_exact(value: Amount) -> str:
    """Exact, canonical text of an amount: ``"0.002619"``, ``"1/3"`` or ``"Infinity"``."""
    if isinstance(value, Decimal):
        if value.is_infinite() and value > 0:
            return "Infinity"
        if not value.is_finite():
            raise ValueError(f"{value} is not a privacy-loss amount")
        value = Fraction(value)
    if value < 0:
        raise ValueError("privacy-loss amounts are non-negative")
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = max(twos, fives)
    scaled = value * 10**digits
    assert scaled.denominator == 1
    text = str(scaled.numerator).rjust(digits + 1, "0")
    if digits:
        text = f"{text[:-digits]}.{text[-digits:]}".rstrip("0").rstrip(".")
    return text


def parse_exact(text: Any) -> Amount:
    """Inverse of :func:`format_exact`; accepts only the canonical form.

    Raises:
        ValueError: ``text`` is not a canonical exact amount.
    """
    if not isinstance(text, str):
        raise ValueError("an exact amount must be a string")
    if text == "Infinity":
        return INFINITE
    if _DECIMAL.fullmatch(text):
        return Fraction(Decimal(text))
    m = _RATIO.fullmatch(text)
    if m:
        value = Fraction(int(m.group(1)), int(m.group(2)))
        if format_exact(value) == text:
            return value
    raise ValueError(f"{text!r} is not a canonical exact amount")


def add_amounts(a: Amount, b: Amount) -> Amount:
    if _is_inf(a) or _is_inf(b):
        return INFINITE
    return Fraction(a) + Fraction(b)


def _is_inf(a: Amount) -> bool:
    return isinstance(a, Decimal) and a.is_infinite()


def amount_exceeds(total: Amount, cap: Amount) -> bool:
    """Whether ``total > cap`` (Infinity > anything finite; Infinity does not exceed Infinity)."""
    if _is_inf(cap):
        return False
    return _is_inf(total) or Fraction(total) > Fraction(cap)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _variance_text(m: PlannedMeasurement) -> str:
    # repr of the float the outputs report in VARIANCE (shortest round-trip text).
    return repr(m.variance)


def _noise_parameter(m: PlannedMeasurement) -> str | None:
    if m.is_noiseless:
        return None
    if m.privacy_defn is PrivacyDefinition.ZCDP:
        return format_exact(m.gaussian_sigma_squared)
    return format_exact(m.geometric_scale)


def _planned_item(m: PlannedMeasurement) -> dict[str, Any]:
    return {
        "key": m.key,
        "table": m.table,
        "level": m.level.config_key,
        "budget": format_exact(m.budget),
        "sensitivity": m.sensitivity,
        "tau": m.tau,
        "n_cells": m.n_cells,
        "distribution": m.distribution.value,
        "noise_parameter": _noise_parameter(m),
        "variance": _variance_text(m),
    }


# --------------------------------------------------------------------------------------------
# Replay: the one implementation of the ledger's rules (used on open, on append and by audit)
# --------------------------------------------------------------------------------------------

_COMMON = frozenset({"seq", "prev", "kind", "time", "run_id", "hash"})
_BODY: dict[EntryKind, frozenset[str]] = {
    EntryKind.RUN_STARTED: frozenset(
        {
            "dataset_id", "input_digests", "config_digest", "code_version", "truncation_key",
            "privacy_defn", "planned", "planned_total", "lifetime_cap", "cap_reason",
            "non_confidential", "spent_before",
        }
    ),
    EntryKind.INTENT: frozenset({"key", "budget", "sensitivity", "n_cells"}),
    EntryKind.COMMITTED: frozenset({"key", "intent_seq", "intent_hash", "noisy_digest"}),
    EntryKind.OUTPUTS_PUBLISHED: frozenset({"files"}),
    EntryKind.RUN_FINISHED: frozenset({"spent"}),
    EntryKind.RUN_FAILED: frozenset({"spent", "reason"}),
    EntryKind.RUN_RESUMED: frozenset(
        {"config_digest", "dataset_id", "code_version", "reason", "lifetime_cap", "cap_reason"}
    ),
}
_PLANNED_KEYS = frozenset(
    {"key", "table", "level", "budget", "sensitivity", "tau", "n_cells", "distribution",
     "noise_parameter", "variance"}
)
_LEVELS: dict[str, dict[str, PopulationGroupLevel]] = {
    t: {lv.config_key: lv for lv in levels} for t, levels in TABLE_LEVELS.items()
}


class _Invalid(Exception):
    """A rule failed for the entry being checked (turned into a LedgerError with its seq)."""


@dataclass(frozen=True)
class PlannedSpend:
    """One planned measurement as the ledger recorded it.

    Attributes:
        measurement: The measurement rebuilt from the recorded fields.
        budget: Its exact budget (Fraction, or Infinity).
        record: The recorded fields, as written.
    """

    measurement: PlannedMeasurement
    budget: Amount
    record: Mapping[str, Any]

    @property
    def key(self) -> str:
        return self.measurement.key


@dataclass
class RunAttempt:
    """One attempt of a run: from its RUN_STARTED or RUN_RESUMED entry to how it ended.

    Attributes:
        number: 1 for the attempt RUN_STARTED opened, then 2, 3, ... per RUN_RESUMED.
        seq: The RUN_STARTED or RUN_RESUMED entry that opened it.
        time: That entry's time.
        code_version: The code version that ran it.
        lifetime_cap: The run's lifetime cap during this attempt.
        cap_reason: The cap reason recorded with that cap (None if none was given).
        resume_reason: Why the run was resumed (None for the first attempt).
        end: FINISHED or FAILED when it recorded that terminal entry; RUNNING when it has none
            (still running, or -- if a later attempt exists -- crashed).
        end_seq: The terminal entry, when there is one.
        end_time: Its time.
        end_reason: The RUN_FAILED reason, when it failed.
    """

    number: int
    seq: int
    time: str
    code_version: str
    lifetime_cap: Amount
    cap_reason: str | None
    resume_reason: str | None = None
    end: RunStatus = RunStatus.RUNNING
    end_seq: int | None = None
    end_time: str | None = None
    end_reason: str | None = None


@dataclass
class RunState:
    """Everything the ledger says about one run.

    The RUN_STARTED fields stay as recorded at start, except ``lifetime_cap`` and ``cap_reason``,
    which are the run's current cap (the latest recorded at start or resume); every attempt's own
    values are in ``attempts``. ``status``, ``terminal_seq``, ``terminal_time`` and
    ``failure_reason`` describe the current attempt (a resume sets them back to running).
    """

    run_id: str
    started_seq: int
    started_time: str
    dataset_id: str
    privacy_defn: PrivacyDefinition
    input_digests: dict[str, str]
    config_digest: str
    code_version: str
    truncation_key: str
    planned: dict[str, PlannedSpend]
    planned_total: Amount
    lifetime_cap: Amount
    cap_reason: str | None
    non_confidential: bool
    spent_before: Amount
    intents: dict[str, list[int]] = field(default_factory=dict)  # key -> every INTENT seq, in order
    intent_hashes: dict[str, str] = field(default_factory=dict)  # key -> hash of its latest INTENT
    committed: dict[str, str] = field(default_factory=dict)  # key -> noisy digest of its latest COMMITTED
    committed_seq: dict[str, int] = field(default_factory=dict)  # key -> seq of its latest COMMITTED
    committed_intent: dict[str, int] = field(default_factory=dict)  # key -> INTENT seq that COMMITTED names
    outputs: dict[str, str] | None = None
    outputs_seq: int | None = None
    status: RunStatus = RunStatus.RUNNING
    terminal_seq: int | None = None
    terminal_time: str | None = None
    failure_reason: str | None = None
    attempts: list[RunAttempt] = field(default_factory=list)

    @property
    def attempt(self) -> int:
        """The current attempt's number: 1 + the number of RUN_RESUMED entries of the run."""
        return len(self.attempts)

    @property
    def attempt_seq(self) -> int:
        """The entry (RUN_STARTED or the latest RUN_RESUMED) that opened the current attempt."""
        return self.attempts[-1].seq if self.attempts else self.started_seq

    @property
    def failures(self) -> list[RunAttempt]:
        """The attempts that ended without finishing, in order.

        Those that recorded RUN_FAILED (the current one too, once it has), and the crashed ones:
        attempts with no terminal entry that a later RUN_RESUMED replaced.
        """
        last = len(self.attempts) - 1
        return [
            a for i, a in enumerate(self.attempts)
            if a.end is RunStatus.FAILED or (a.end is RunStatus.RUNNING and i < last)
        ]

    @property
    def reusable(self) -> dict[str, str]:
        """Key -> noisy digest, for the keys whose latest INTENT is COMMITTED.

        A resumed attempt may release such a key's stored vector, if it hashes to this digest,
        instead of spending the key again.
        """
        return {
            key: digest
            for key, digest in self.committed.items()
            if self.committed_intent[key] == self.intents[key][-1]
        }

    @property
    def respent(self) -> dict[str, int]:
        """Key -> number of INTENTs, for the keys spent more than once."""
        return {key: len(seqs) for key, seqs in self.intents.items() if len(seqs) > 1}

    def spent_in_attempt(self, key: str) -> int | None:
        """The key's INTENT in the current attempt, if it has one."""
        seqs = self.intents.get(key)
        if seqs and seqs[-1] > self.attempt_seq:
            return seqs[-1]
        return None

    def outputs_in_attempt(self) -> bool:
        """Whether the current attempt already recorded OUTPUTS_PUBLISHED."""
        return self.outputs_seq is not None and self.outputs_seq > self.attempt_seq

    def charged_keys(self) -> list[str]:
        """Measurements the run charges at least once: its INTENTs if it failed, else its plan."""
        if self.status is RunStatus.FAILED:
            return list(self.intents)
        return list(self.planned)

    def multiplicity(self, key: str, status: RunStatus | None = None) -> int:
        """How many times ``key``'s budget is charged (see the module docstring)."""
        n = len(self.intents.get(key, ()))
        if (status or self.status) is RunStatus.FAILED:
            return n
        return max(1, n) if key in self.planned else 0

    def key_charge(self, key: str, unit: PrivacyDefinition | None = None) -> Amount:
        """What ``key`` charges against the dataset, in ``unit`` (default: the run's own)."""
        return _times(_convert(self.planned[key].budget, self.privacy_defn, unit or self.privacy_defn),
                      self.multiplicity(key))

    def charge(self, unit: PrivacyDefinition | None = None, *, status: RunStatus | None = None) -> Amount:
        """What this run counts against its dataset, in ``unit`` (default: its own).

        Args:
            unit: The privacy definition to count in.
            status: Charge as if the run had this status (default: its own); the resume check
                charges a failed run as running again.
        """
        unit = unit or self.privacy_defn
        total: Amount = Fraction(0)
        for key in self.planned:
            times = self.multiplicity(key, status)
            if times:
                total = add_amounts(total, _times(_convert(self.planned[key].budget, self.privacy_defn, unit), times))
        return total

    def intended_total(self) -> Amount:
        """The budgets of every INTENT entry of the run, re-spends included."""
        total: Amount = Fraction(0)
        for key, seqs in self.intents.items():
            total = add_amounts(total, _times(self.planned[key].budget, len(seqs)))
        return total


def _times(amount: Amount, n: int) -> Amount:
    """``n`` times an amount (Infinity times 0 is 0: nothing was charged)."""
    if n == 0:
        return Fraction(0)
    return INFINITE if _is_inf(amount) else Fraction(amount) * n


def _convert(budget: Amount, source: PrivacyDefinition, unit: PrivacyDefinition) -> Amount:
    """One measurement's budget in ``unit``: eps-DP is eps^2/2-zCDP; zCDP has no pure-DP bound."""
    if source is unit:
        return budget
    if _is_inf(budget):
        return INFINITE
    if source is PrivacyDefinition.PUREDP and unit is PrivacyDefinition.ZCDP:
        return Fraction(budget) ** 2 / 2
    return INFINITE if budget > 0 else Fraction(0)


class LedgerState:
    """The verified content of a ledger, built entry by entry.

    :meth:`apply` checks one line against every rule (encoding, chain, sequence, and the run
    state machine including the lifetime cap) and only then updates the state, so a state is
    always the state of a valid prefix.
    """

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.lines: list[bytes] = []
        self.runs: dict[str, RunState] = {}
        self.head_hash: str = GENESIS_HASH

    @property
    def size(self) -> int:
        return len(self.entries)

    def dataset_spent(self, dataset: str, unit: PrivacyDefinition) -> Amount:
        """The odometer: the sum of every run's charge against ``dataset``, in ``unit``."""
        total: Amount = Fraction(0)
        for run in self.runs.values():
            if run.dataset_id == dataset:
                total = add_amounts(total, run.charge(unit))
        return total

    def resume_odometer(self, run: RunState) -> Amount:
        """The dataset's odometer, in ``run``'s unit, with ``run`` running again.

        A resumed run reserves its whole plan again (plus its re-spends), so this is what the cap
        of a RUN_RESUMED must cover. It is never below the odometer now.
        """
        unit = run.privacy_defn
        total: Amount = run.charge(unit, status=RunStatus.RUNNING)
        for other in self.runs.values():
            if other.dataset_id == run.dataset_id and other is not run:
                total = add_amounts(total, other.charge(unit))
        return total

    def respend_odometer(self, run: RunState, key: str) -> Amount | None:
        """The odometer after a new INTENT of ``key``, or None if that INTENT adds nothing.

        Only a re-spend (a key that already has an INTENT, in a running run) adds to the charge:
        a first INTENT was reserved at start or resume.
        """
        if not run.intents.get(key):
            return None
        return add_amounts(self.dataset_spent(run.dataset_id, run.privacy_defn), run.planned[key].budget)

    def datasets(self) -> dict[str, list[RunState]]:
        out: dict[str, list[RunState]] = {}
        for run in self.runs.values():
            out.setdefault(run.dataset_id, []).append(run)
        return out

    # -- parsing --------------------------------------------------------------------------

    def parse_line(self, line: bytes) -> dict[str, Any]:
        """Decode one line (without its newline) and check its encoding and chain fields."""
        seq = self.size
        try:
            text = line.decode("utf-8")
            entry = json.loads(
                text,
                parse_float=_no_float,
                parse_constant=_no_float,
                object_pairs_hook=_no_duplicate_keys,
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise LedgerError(f"not a valid ledger line ({_short(exc)})", seq=seq) from None
        if not isinstance(entry, dict):
            raise LedgerError("not a JSON object", seq=seq)
        kind_text = entry.get("kind")
        kind = kind_text if isinstance(kind_text, str) else None
        try:
            if canonical_json(entry) != line:
                raise _Invalid("not in canonical JSON form (sorted keys, no whitespace)")
            try:
                kind_enum = EntryKind(kind_text)
            except ValueError:
                raise _Invalid(f"unknown kind {kind_text!r}") from None
            expected = _COMMON | _BODY[kind_enum]
            if set(entry) != expected:
                missing = sorted(expected - set(entry))
                extra = sorted(set(entry) - expected)
                raise _Invalid(f"wrong fields (missing {missing}, unexpected {extra})")
            if entry["seq"] != seq or not _is_int(entry["seq"]):
                raise _Invalid(f"sequence number is {entry['seq']!r}, expected {seq}")
            if entry["prev"] != self.head_hash:
                raise _Invalid("prev does not match the hash of the previous entry")
            if not isinstance(entry["hash"], str) or entry["hash"] != entry_hash(entry):
                raise _Invalid("hash does not match the entry's content")
            if not isinstance(entry["time"], str) or not _TIME.fullmatch(entry["time"]):
                raise _Invalid("time is not a UTC timestamp YYYY-MM-DDTHH:MM:SS.ffffffZ")
            try:
                datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
            except ValueError:
                raise _Invalid("time is not a valid date and time") from None
            if not isinstance(entry["run_id"], str) or not _RUN_ID.fullmatch(entry["run_id"]):
                raise _Invalid("run_id is not a valid run id")
        except _Invalid as exc:
            raise LedgerError(str(exc), seq=seq, kind=kind) from None
        return entry

    def apply(self, line: bytes) -> dict[str, Any]:
        """Check ``line`` (no trailing newline) as the next entry and add it to the state.

        Raises:
            LedgerError: naming the entry and the rule it breaks.
        """
        entry = self.parse_line(line)
        kind = EntryKind(entry["kind"])
        try:
            commit = getattr(self, f"_check_{kind.value.lower()}")(entry)
        except _Invalid as exc:
            raise LedgerError(str(exc), seq=entry["seq"], kind=kind.value) from None
        commit()
        self.entries.append(entry)
        self.lines.append(line)
        self.head_hash = entry["hash"]
        return entry

    # -- the run state machine -------------------------------------------------------------

    def _running(self, entry: Mapping[str, Any]) -> RunState:
        run = self.runs.get(entry["run_id"])
        if run is None:
            raise _Invalid(f"run {entry['run_id']!r} was never started")
        if run.status is not RunStatus.RUNNING:
            raise _Invalid(f"run {entry['run_id']!r} already ended at entry {run.terminal_seq}")
        return run

    def _check_run_started(self, e: Mapping[str, Any]):
        run_id = e["run_id"]
        if run_id in self.runs:
            raise _Invalid(f"run id {run_id!r} was already started at entry {self.runs[run_id].started_seq}")
        digests = e["input_digests"]
        if not isinstance(digests, dict) or not digests:
            raise _Invalid("input_digests must be a non-empty object")
        for name, digest in digests.items():
            if not _NAME.fullmatch(name) or not _is_hex64(digest):
                raise _Invalid("input_digests must map file names to SHA-256 hex digests")
        if e["dataset_id"] != dataset_id(digests):
            raise _Invalid("dataset_id is not the digest of the input digests")
        if not _is_hex64(e["config_digest"]):
            raise _Invalid("config_digest is not a SHA-256 hex digest")
        if not _is_text(e["code_version"]):
            raise _Invalid("code_version must be a short string")
        if not isinstance(e["truncation_key"], str) or not re.fullmatch(r"(?:[0-9a-f]{2}){8,128}", e["truncation_key"]):
            raise _Invalid("truncation_key must be 8 to 128 bytes of lowercase hex")
        try:
            defn = PrivacyDefinition(e["privacy_defn"])
        except ValueError:
            raise _Invalid("privacy_defn must be 'zcdp' or 'puredp'") from None
        if not isinstance(e["non_confidential"], bool):
            raise _Invalid("non_confidential must be true or false")
        non_conf = e["non_confidential"]
        planned = _parse_planned(e["planned"], defn)
        total: Amount = Fraction(0)
        for spend in planned.values():
            total = add_amounts(total, spend.budget)
        recorded_total = _amount(e, "planned_total")
        if recorded_total != total:
            raise _Invalid(f"planned_total {e['planned_total']} is not the sum of the planned budgets ({format_exact(total)})")
        if _is_inf(total) and not non_conf:
            raise _Invalid("an Infinity budget is allowed only in a non-confidential run")
        cap = _amount(e, "lifetime_cap")
        if _is_inf(cap) and not non_conf:
            raise _Invalid("an Infinity lifetime cap is allowed only in a non-confidential run")
        reason = e["cap_reason"]
        if reason is not None and not _is_text(reason):
            raise _Invalid("cap_reason must be null or a short string")
        if amount_exceeds(cap, total) and not (reason and reason.strip()):
            raise _Invalid("a lifetime cap above the planned total needs a recorded cap_reason")
        spent_before = _amount(e, "spent_before")
        odometer = self.dataset_spent(e["dataset_id"], defn)
        if spent_before != odometer:
            raise _Invalid(
                f"spent_before {e['spent_before']} differs from the ledger's spends on this dataset "
                f"({format_exact(odometer)})"
            )
        if not non_conf and amount_exceeds(add_amounts(odometer, total), cap):
            raise _Invalid(
                f"run exceeds the lifetime cap: spent {format_exact(odometer)} + planned "
                f"{format_exact(total)} > cap {format_exact(cap)}"
            )

        def commit() -> None:
            self.runs[run_id] = RunState(
                run_id=run_id,
                started_seq=e["seq"],
                started_time=e["time"],
                dataset_id=e["dataset_id"],
                privacy_defn=defn,
                input_digests=dict(digests),
                config_digest=e["config_digest"],
                code_version=e["code_version"],
                truncation_key=e["truncation_key"],
                planned=planned,
                planned_total=total,
                lifetime_cap=cap,
                cap_reason=reason,
                non_confidential=non_conf,
                spent_before=odometer,
                attempts=[
                    RunAttempt(
                        number=1,
                        seq=e["seq"],
                        time=e["time"],
                        code_version=e["code_version"],
                        lifetime_cap=cap,
                        cap_reason=reason,
                    )
                ],
            )

        return commit

    def _check_intent(self, e: Mapping[str, Any]):
        run = self._running(e)
        key = e["key"]
        if not isinstance(key, str) or key not in run.planned:
            raise _Invalid(f"measurement {key!r} is not in the run's plan")
        earlier = run.spent_in_attempt(key)
        if earlier is not None:
            raise _Invalid(
                f"measurement {key!r} was already spent at entry {earlier} in this attempt "
                "(a key is spent again only after a RUN_RESUMED)"
            )
        if run.outputs_in_attempt():
            raise _Invalid(f"no spend may follow the attempt's OUTPUTS_PUBLISHED (entry {run.outputs_seq})")
        rec = run.planned[key].record
        for name in ("budget", "sensitivity", "n_cells"):
            if e[name] != rec[name] or type(e[name]) is not type(rec[name]):
                raise _Invalid(f"{name} {e[name]!r} differs from the plan ({rec[name]!r})")
        after = self.respend_odometer(run, key)
        if after is not None and not run.non_confidential and amount_exceeds(after, run.lifetime_cap):
            raise _Invalid(
                f"re-spending {key} exceeds the run's lifetime cap: the dataset's odometer would be "
                f"{format_exact(after)} > cap {format_exact(run.lifetime_cap)}"
            )

        def commit() -> None:
            run.intents.setdefault(key, []).append(e["seq"])
            run.intent_hashes[key] = e["hash"]

        return commit

    def _check_committed(self, e: Mapping[str, Any]):
        run = self._running(e)
        key = e["key"]
        if not isinstance(key, str) or key not in run.intents:
            raise _Invalid(f"no INTENT of measurement {key!r} precedes this commit")
        latest = run.intents[key][-1]
        if run.committed_intent.get(key) == latest:
            raise _Invalid(f"measurement {key!r} was already committed at entry {run.committed_seq[key]}")
        if e["intent_seq"] != latest or not _is_int(e["intent_seq"]):
            raise _Invalid(f"intent_seq does not point at the latest INTENT of {key!r} (entry {latest})")
        if e["intent_hash"] != run.intent_hashes[key]:
            raise _Invalid("intent_hash is not the hash of the INTENT entry")
        if latest < run.attempt_seq:
            # The noise of an earlier attempt's INTENT cannot be vouched for now: spend again.
            raise _Invalid(
                f"the INTENT of {key!r} (entry {latest}) belongs to an earlier attempt; "
                f"the run was resumed at entry {run.attempt_seq}"
            )
        if not _is_hex64(e["noisy_digest"]):
            raise _Invalid("noisy_digest is not a SHA-256 hex digest")

        def commit() -> None:
            run.committed[key] = e["noisy_digest"]
            run.committed_seq[key] = e["seq"]
            run.committed_intent[key] = latest

        return commit

    def _check_outputs_published(self, e: Mapping[str, Any]):
        run = self._running(e)
        if run.outputs_in_attempt():
            raise _Invalid(f"outputs were already published at entry {run.outputs_seq}")
        reusable = run.reusable
        missing = [k for k in run.planned if k not in reusable]
        if missing:
            raise _Invalid(f"outputs published before every measurement was committed (missing {missing[0]})")
        files = e["files"]
        if not isinstance(files, dict):
            raise _Invalid("files must be an object")
        for rel, digest in files.items():
            if not _safe_relpath(rel) or not _is_hex64(digest):
                raise _Invalid("files must map relative paths to SHA-256 hex digests")

        def commit() -> None:
            run.outputs = dict(files)
            run.outputs_seq = e["seq"]

        return commit

    def _check_run_finished(self, e: Mapping[str, Any]):
        run = self._running(e)
        reusable = run.reusable
        missing = [k for k in run.planned if k not in reusable]
        if missing:
            raise _Invalid(f"run finished without committing {missing[0]}")
        charge = run.charge()
        if _amount(e, "spent") != charge:
            raise _Invalid(
                f"spent {e['spent']} differs from the run's charge {format_exact(charge)} "
                "(its planned total plus any re-spends)"
            )

        def commit() -> None:
            run.status = RunStatus.FINISHED
            run.terminal_seq = e["seq"]
            run.terminal_time = e["time"]
            run.attempts[-1].end = RunStatus.FINISHED
            run.attempts[-1].end_seq = e["seq"]
            run.attempts[-1].end_time = e["time"]

        return commit

    def _check_run_failed(self, e: Mapping[str, Any]):
        run = self._running(e)
        if not _is_text(e["reason"]):
            raise _Invalid("reason must be a short string")
        if _amount(e, "spent") != run.intended_total():
            raise _Invalid(f"spent {e['spent']} differs from the sum of the run's INTENTs")

        def commit() -> None:
            run.status = RunStatus.FAILED
            run.terminal_seq = e["seq"]
            run.terminal_time = e["time"]
            run.failure_reason = e["reason"]
            run.attempts[-1].end = RunStatus.FAILED
            run.attempts[-1].end_seq = e["seq"]
            run.attempts[-1].end_time = e["time"]
            run.attempts[-1].end_reason = e["reason"]

        return commit

    def _check_run_resumed(self, e: Mapping[str, Any]):
        run = self.runs.get(e["run_id"])
        if run is None:
            raise _Invalid(f"run {e['run_id']!r} was never started")
        if run.status is RunStatus.FINISHED:
            raise _Invalid(
                f"run {e['run_id']!r} finished at entry {run.terminal_seq}; a finished run cannot be resumed"
            )
        if not _is_hex64(e["config_digest"]):
            raise _Invalid("config_digest is not a SHA-256 hex digest")
        if e["config_digest"] != run.config_digest:
            raise _Invalid(
                f"config_digest differs from the run's RUN_STARTED (entry {run.started_seq}): another config"
            )
        if not _is_hex64(e["dataset_id"]):
            raise _Invalid("dataset_id is not a SHA-256 hex digest")
        if e["dataset_id"] != run.dataset_id:
            raise _Invalid(
                f"dataset_id differs from the run's RUN_STARTED (entry {run.started_seq}): other inputs"
            )
        if not _is_text(e["code_version"]):
            raise _Invalid("code_version must be a short string")
        reason = e["reason"]
        if not _is_text(reason) or not reason.strip():
            raise _Invalid("reason must be a non-empty short string")
        cap = _amount(e, "lifetime_cap")
        if _is_inf(cap) and not run.non_confidential:
            raise _Invalid("an Infinity lifetime cap is allowed only in a non-confidential run")
        cap_reason = e["cap_reason"]
        if cap_reason is not None and not _is_text(cap_reason):
            raise _Invalid("cap_reason must be null or a short string")
        if amount_exceeds(run.lifetime_cap, cap):
            raise _Invalid(
                f"lifetime_cap {e['lifetime_cap']} is below the run's cap {format_exact(run.lifetime_cap)}: "
                "a cap is kept or raised, never lowered"
            )
        if amount_exceeds(cap, run.lifetime_cap) and not (cap_reason and cap_reason.strip()):
            raise _Invalid("a lifetime cap above the run's previous cap needs a recorded cap_reason")
        after = self.resume_odometer(run)
        if not run.non_confidential and amount_exceeds(after, cap):
            raise _Invalid(
                f"resumed run exceeds the lifetime cap: the dataset's odometer with the run reserved "
                f"again is {format_exact(after)} > cap {format_exact(cap)}"
            )

        def commit() -> None:
            # A crashed attempt keeps end RUNNING (it has no terminal entry); the next one starts.
            run.status = RunStatus.RUNNING
            run.terminal_seq = None
            run.terminal_time = None
            run.failure_reason = None
            run.lifetime_cap = cap
            run.cap_reason = cap_reason
            run.attempts.append(
                RunAttempt(
                    number=len(run.attempts) + 1,
                    seq=e["seq"],
                    time=e["time"],
                    code_version=e["code_version"],
                    lifetime_cap=cap,
                    cap_reason=cap_reason,
                    resume_reason=reason,
                )
            )

        return commit


def _parse_planned(items: Any, defn: PrivacyDefinition) -> dict[str, PlannedSpend]:
    if not isinstance(items, list):
        raise _Invalid("planned must be a list")
    out: dict[str, PlannedSpend] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != _PLANNED_KEYS:
            raise _Invalid(f"planned[{i}] has the wrong fields")
        table, level_key = item["table"], item["level"]
        if table not in TABLES or not isinstance(level_key, str) or level_key not in _LEVELS[table]:
            raise _Invalid(f"planned[{i}] names no measured table and level")
        level = _LEVELS[table][level_key]
        try:
            budget = parse_exact(item["budget"])
            if not _is_inf(budget) and not _DECIMAL.fullmatch(item["budget"]):
                raise ValueError("budgets are decimals")
        except ValueError:
            raise _Invalid(f"planned[{i}].budget is not a canonical decimal or Infinity") from None
        if budget == 0:
            raise _Invalid(f"planned[{i}].budget is 0 (a level with budget 0 is not measured)")
        spec = TABLES[table]
        tau, sens, n_cells = item["tau"], item["sensitivity"], item["n_cells"]
        if spec.kind is TableKind.PERSON:
            if not _is_int(tau) or tau < 1 or not _is_int(sens) or sens != 2 * tau + 2:
                raise _Invalid(f"planned[{i}]: a person table needs tau >= 1 and sensitivity 2*tau+2")
        elif tau is not None or not _is_int(sens) or sens != 2:
            raise _Invalid(f"planned[{i}]: a unit table has no tau and sensitivity 2")
        if not _is_int(n_cells) or n_cells < 1 or n_cells % len(spec.basis_numbers) or n_cells % len(level.iteration.codes):
            raise _Invalid(f"planned[{i}].n_cells does not fit the table's domain")
        m = PlannedMeasurement(
            table=table,
            level=level,
            privacy_defn=defn,
            budget=INFINITE if _is_inf(budget) else Decimal(item["budget"]),
            sensitivity=sens,
            tau=tau,
            n_cells=n_cells,
        )
        if item["key"] != m.key:
            raise _Invalid(f"planned[{i}].key is not TABLE/level")
        if m.key in out:
            raise _Invalid(f"planned[{i}] repeats {m.key}")
        if item != _planned_item(m):
            bad = sorted(k for k, v in _planned_item(m).items() if item.get(k) != v)
            raise _Invalid(f"planned[{i}] ({m.key}): {', '.join(bad)} inconsistent with its budget and sensitivity")
        out[m.key] = PlannedSpend(measurement=m, budget=budget, record=item)
    return out


def _amount(e: Mapping[str, Any], name: str) -> Amount:
    try:
        return parse_exact(e[name])
    except ValueError:
        raise _Invalid(f"{name} is not a canonical exact amount") from None


def _no_float(text: str) -> Any:
    raise ValueError(f"non-exact number {text}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_hex64(v: Any) -> bool:
    return isinstance(v, str) and _HEX64.fullmatch(v) is not None


def _is_text(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= _MAX_TEXT and v.isprintable()


def _safe_relpath(rel: Any) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _split_lines(data: bytes, first_seq: int) -> list[bytes]:
    if not data:
        return []
    if not data.endswith(b"\n"):
        n = data.count(b"\n")
        raise LedgerError(
            "the ledger ends in an incomplete line (torn write or truncation)", seq=first_seq + n
        )
    return data[:-1].split(b"\n")


def read_ledger(path: Path) -> LedgerState:
    """Read and fully verify the ledger at ``path``.

    Raises:
        LedgerError: naming the first entry that breaks a rule, and the rule.
    """
    path = Path(path)
    lock = path.with_name(path.name + ".lock")
    # A shared lock, when the lock file exists, keeps a live run's append from looking torn.
    fd = os.open(lock, os.O_RDONLY) if lock.exists() else None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        data = path.read_bytes()
    finally:
        if fd is not None:
            os.close(fd)
    state = LedgerState()
    for line in _split_lines(data, 0):
        state.apply(line)
    return state


# --------------------------------------------------------------------------------------------
# Durable appends
# --------------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """``mkdir -p`` that fsyncs each parent of a directory it creates."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir()
        _fsync_dir(d.parent)


class Ledger:
    """An append-only privacy-loss ledger file (see the module docstring for the rules)."""

    def __init__(self, path: Path) -> None:
        """Use :meth:`open`."""
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._state = LedgerState()
        self._offset = 0
        self._mutex = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> "Ledger":
        """Open (creating it and its directory if missing) and verify the ledger at ``path``.

        Raises:
            LedgerError: The existing ledger is broken.
        """
        ledger = cls(Path(path))
        _make_dirs(ledger.path.parent)
        with ledger._locked():
            pass  # _locked creates the file and replays everything on disk
        return ledger

    @property
    def state(self) -> LedgerState:
        """The verified state as of the last read (refresh with :meth:`verify`)."""
        return self._state

    def verify(self) -> None:
        """Re-read and verify the whole ledger from disk.

        Raises:
            LedgerError: naming the first entry that breaks a rule.
        """
        with self._mutex:
            state = read_ledger(self.path)
            data_len = sum(len(line) + 1 for line in state.lines)
            self._state, self._offset = state, data_len

    @contextlib.contextmanager
    def _locked(self) -> Iterator[LedgerState]:
        """Hold the process lock and the file lock, with the state caught up with the file."""
        with self._mutex:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._ensure_file()
                self._catch_up()
                yield self._state
            finally:
                os.close(fd)  # releases the flock

    def _ensure_file(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(self.path.parent)  # the new name must survive a crash too

    def _catch_up(self) -> None:
        """Verify and apply whatever was appended (by any process) since the last read."""
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < self._offset:
                raise LedgerError(
                    f"the ledger shrank from {self._offset} to {size} bytes since it was read",
                    seq=self._state.size,
                )
            if self._state.lines:
                # Cheap guard against the file having been replaced under us.
                last = self._state.lines[-1]
                f.seek(self._offset - len(last) - 1)
                if f.read(len(last) + 1) != last + b"\n":
                    raise LedgerError("the ledger's last known entry changed on disk", seq=self._state.size - 1)
            f.seek(self._offset)
            data = f.read(size - self._offset)
        for line in _split_lines(data, self._state.size):
            self._state.apply(line)
            self._offset += len(line) + 1

    def _append(self, kind: EntryKind, run_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Append one entry; must be called with the lock held (inside :meth:`_locked`)."""
        state = self._state
        entry: dict[str, Any] = {
            "seq": state.size,
            "prev": state.head_hash,
            "kind": kind.value,
            "time": _now(),
            "run_id": run_id,
            **body,
        }
        entry["hash"] = entry_hash(entry)
        line = canonical_json(entry)
        # Check every rule before writing, so nothing invalid ever reaches the file.
        probe = state.parse_line(line)
        commit = getattr(state, f"_check_{kind.value.lower()}")
        try:
            apply_state = commit(probe)
        except _Invalid as exc:
            raise LedgerError(str(exc), seq=probe["seq"], kind=kind.value) from None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            data = line + b"\n"
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError as exc:
            # A partial line may be on disk; the ledger refuses further appends until repaired.
            raise LedgerError(f"could not write the ledger ({errno.errorcode.get(exc.errno, exc.errno)})") from exc
        finally:
            os.close(fd)
        apply_state()
        state.entries.append(probe)
        state.lines.append(line)
        state.head_hash = probe["hash"]
        self._offset += len(data)
        return probe

    # -- runs -------------------------------------------------------------------------------

    def start_run(
        self,
        *,
        run_id: str,
        plan: RunPlan,
        config_digest: str,
        input_digests: dict[str, str],
        code_version: str,
        truncation_key_hex: str,
        lifetime_cap: Fraction | Decimal | None = None,
        cap_reason: str | None = None,
        non_confidential: bool = False,
    ) -> "RunRecorder":
        """Check the dataset's lifetime budget and record RUN_STARTED, atomically.

        Args:
            run_id: Unique id of the run.
            plan: Every measurement of the run.
            config_digest: SHA-256 of the config file.
            input_digests: Input file name -> SHA-256 of its bytes.
            code_version: Version of the code that runs.
            truncation_key_hex: Key of the truncation ordering, hex.
            lifetime_cap: Cap on everything ever spent on this dataset, in the run's unit;
                default: the run's planned total.
            cap_reason: Why the cap is above the planned total (required then; recorded).
            non_confidential: The data is synthetic or public: Infinity budgets are allowed and
                the cap is not enforced (both recorded).

        Raises:
            BudgetError: The run would exceed the cap, or uses Infinity budgets on data not
                declared non-confidential, or raises the cap without a reason.
            LedgerError: The ledger is broken or an argument cannot be recorded.
        """
        total: Amount = plan.total
        defn = plan.privacy_defn
        if _is_inf(total) and not non_confidential:
            raise BudgetError(
                "an Infinity (no-noise) budget is allowed only for non-production test runs on "
                "data declared non-confidential (--non-confidential)"
            )
        cap: Amount = total if lifetime_cap is None else _as_amount(lifetime_cap)
        if _is_inf(cap) and not non_confidential:
            raise BudgetError("an Infinity lifetime cap is allowed only for non-confidential data")
        if cap_reason is not None:
            cap_reason = _clean_text(cap_reason) or None
        if amount_exceeds(cap, total) and not cap_reason:
            raise BudgetError(
                f"the lifetime cap {format_exact(cap)} is above this run's planned total "
                f"{format_exact(total)}: give the reason for raising it (--cap-reason TEXT); "
                "it is recorded in the ledger"
            )
        digests = {str(k): str(v).lower() for k, v in input_digests.items()}
        dataset = dataset_id(digests)
        body = {
            "dataset_id": dataset,
            "input_digests": digests,
            "config_digest": config_digest,
            "code_version": code_version,
            "truncation_key": truncation_key_hex.lower(),
            "privacy_defn": defn.value,
            "planned": [_planned_item(m) for m in plan.measurements],
            "planned_total": format_exact(total),
            "lifetime_cap": format_exact(cap),
            "cap_reason": cap_reason,
            "non_confidential": bool(non_confidential),
        }
        with self._locked() as state:
            spent = state.dataset_spent(dataset, defn)
            if not non_confidential and amount_exceeds(add_amounts(spent, total), cap):
                unit = "rho (zCDP)" if defn is PrivacyDefinition.ZCDP else "epsilon (pure DP)"
                need = add_amounts(spent, total)
                raise BudgetError(
                    f"privacy-loss budget refused for dataset {dataset[:16]}: already spent "
                    f"{format_exact(spent)}, this run plans {format_exact(total)}, lifetime cap "
                    f"{format_exact(cap)} ({unit}); spent + planned = {format_exact(need)} exceeds "
                    "the cap. Spends are never refunded. To run anyway, raise the cap to at least "
                    f"{format_exact(need)} with --lifetime-cap and say why with --cap-reason "
                    "(both are recorded in the ledger)."
                )
            self._append(EntryKind.RUN_STARTED, run_id, {**body, "spent_before": format_exact(spent)})
        return RunRecorder(self, run_id, plan)

    def run(self, run_id: str) -> RunState | None:
        """A snapshot of what the ledger says about ``run_id`` now, or None if it was never started.

        The ledger is caught up with the file first (other processes may have appended); the
        snapshot is a copy, safe to read while other threads keep recording.
        """
        with self._locked() as state:
            run = state.runs.get(run_id)
            return None if run is None else copy.deepcopy(run)

    def resume_run(
        self,
        run_id: str,
        *,
        config_digest: str,
        input_digests: Mapping[str, str],
        code_version: str,
        reason: str,
        lifetime_cap: Fraction | Decimal | None = None,
        cap_reason: str | None = None,
        plan: RunPlan | None = None,
    ) -> "RunRecorder":
        """Record RUN_RESUMED for a failed or crashed run and return its recorder, atomically.

        The run is running again, as attempt ``n + 1``. Its plan is the one recorded at start:
        the returned recorder spends from it, and :attr:`RunState.reusable` (see :meth:`run`)
        says which measurements may be released from their stored vectors instead of spent again.
        Everything else is spent again through the recorder and charged again.

        Args:
            run_id: The run to resume.
            config_digest: SHA-256 of the config file; must be the run's.
            input_digests: Input file name -> SHA-256; must give the run's dataset id.
            code_version: Version of the code that resumes (may differ from the start's; recorded).
            reason: Why the run is resumed (non-empty; recorded, one line of at most 500
                characters).
            lifetime_cap: The run's new lifetime cap, in its unit; None keeps its current cap. A
                cap is kept or raised, never lowered.
            cap_reason: Why the cap is raised above the run's current cap (required then).
            plan: The plan the caller computed from the config, if any. It is only checked: it
                must record exactly as the run's recorded plan (same measurements, budgets,
                sensitivities, cells and variances, same order), so that code that would now plan
                differently cannot reuse the old measurements. The recorder always uses the
                recorded plan.

        Raises:
            LedgerError: The run is unknown or finished, the config, the inputs or ``plan`` differ
                from the run's, ``reason`` is empty, or the ledger is broken. Nothing is appended.
            BudgetError: The cap is lowered, raised without a reason, Infinity for confidential
                data, or below the dataset's odometer with the run reserved again. Nothing is
                appended.
        """
        reason = _clean_text(reason)
        if not reason:
            raise LedgerError(f"give the reason for resuming run {run_id} (it is recorded in the ledger)")
        if cap_reason is not None:
            cap_reason = _clean_text(cap_reason) or None
        new_cap = None if lifetime_cap is None else _as_amount(lifetime_cap)
        digests = {str(k): str(v).lower() for k, v in input_digests.items()}
        dataset = dataset_id(digests)
        with self._locked() as state:
            run = state.runs.get(run_id)
            if run is None:
                raise LedgerError(f"cannot resume run {run_id}: it was never started in this ledger")
            if run.status is RunStatus.FINISHED:
                raise LedgerError(
                    f"cannot resume run {run_id}: it finished at entry {run.terminal_seq}; a finished run "
                    "is never resumed (start a new run instead)"
                )
            if config_digest != run.config_digest:
                raise LedgerError(
                    f"cannot resume run {run_id}: the config differs from the one it started with "
                    f"(SHA-256 {config_digest[:16]}, recorded {run.config_digest[:16]}); reused "
                    "measurements would be inconsistent -- start a new run instead"
                )
            if dataset != run.dataset_id:
                raise LedgerError(
                    f"cannot resume run {run_id}: the inputs differ from the ones it started with "
                    f"(dataset {dataset[:16]}, recorded {run.dataset_id[:16]}); start a new run instead"
                )
            if plan is not None:
                self._check_same_plan(run, plan)
            cap = run.lifetime_cap if new_cap is None else new_cap
            if _is_inf(cap) and not run.non_confidential:
                raise BudgetError("an Infinity lifetime cap is allowed only for non-confidential data")
            if amount_exceeds(run.lifetime_cap, cap):
                raise BudgetError(
                    f"cannot resume run {run_id} with lifetime cap {format_exact(cap)}: it is below the "
                    f"run's cap {format_exact(run.lifetime_cap)}; a cap is kept or raised, never lowered"
                )
            if amount_exceeds(cap, run.lifetime_cap) and not cap_reason:
                raise BudgetError(
                    f"the lifetime cap {format_exact(cap)} is above run {run_id}'s cap "
                    f"{format_exact(run.lifetime_cap)}: give the reason for raising it (--cap-reason "
                    "TEXT); it is recorded in the ledger"
                )
            after = state.resume_odometer(run)
            if not run.non_confidential and amount_exceeds(after, cap):
                raise BudgetError(
                    f"privacy-loss budget refused: resuming run {run_id} reserves its whole plan again, "
                    f"so dataset {run.dataset_id[:16]} would have spent {format_exact(after)} "
                    f"({_unit_name(run.privacy_defn)}), above the lifetime cap {format_exact(cap)}. "
                    "Spends are never refunded. To resume anyway, raise the cap to at least "
                    f"{format_exact(after)} (plus the budget of every measurement that must be spent "
                    "again) with --lifetime-cap and say why with --cap-reason (both are recorded)."
                )
            self._append(
                EntryKind.RUN_RESUMED,
                run_id,
                {
                    "config_digest": config_digest,
                    "dataset_id": dataset,
                    "code_version": code_version,
                    "reason": reason,
                    "lifetime_cap": format_exact(cap),
                    "cap_reason": cap_reason,
                },
            )
            attempt = run.attempt
            recorded = RunPlan(run.privacy_defn, tuple(s.measurement for s in run.planned.values()))
        return RunRecorder(self, run_id, recorded, attempt=attempt)

    @staticmethod
    def _check_same_plan(run: RunState, plan: RunPlan) -> None:
        """Raise LedgerError unless ``plan`` records exactly as ``run``'s recorded plan."""
        if plan.privacy_defn is not run.privacy_defn:
            raise LedgerError(
                f"cannot resume run {run.run_id}: it was planned in {run.privacy_defn.value}, not "
                f"{plan.privacy_defn.value}"
            )
        given = [_planned_item(m) for m in plan.measurements]
        recorded = [s.record for s in run.planned.values()]
        if given != recorded:
            keys = [g["key"] for g in given]
            if keys != [r["key"] for r in recorded]:
                detail = "other measurements or another order"
            else:
                g, r = next((g, r) for g, r in zip(given, recorded) if g != r)
                fields = ", ".join(sorted(k for k in g if g[k] != r[k]))
                detail = f"{g['key']} differs in {fields}"
            raise LedgerError(
                f"cannot resume run {run.run_id}: the plan computed now differs from the recorded "
                f"one ({detail}); reused measurements would be inconsistent"
            )

    def checkpoint(self, signing_key: Path | None = None) -> dict[str, Any]:
        """Size and head hash of the ledger now, signed with an Ed25519 PEM key if given.

        Returns:
            ``{"ledger_size", "head_hash", "signature", "public_key"}``; the signature is
            base64 over :func:`checkpoint_message`, the public key PEM text (both None unsigned).
        """
        with self._locked() as state:
            size, head = state.size, state.head_hash
        signature = public_pem = None
        if signing_key is not None:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            try:
                key = serialization.load_pem_private_key(Path(signing_key).read_bytes(), password=None)
            except (ValueError, TypeError, OSError) as exc:
                raise LedgerError(f"cannot load the signing key {Path(signing_key).name}: {_short(exc)}") from None
            if not isinstance(key, Ed25519PrivateKey):
                raise LedgerError("the signing key must be an Ed25519 private key (PEM)")
            signature = base64.b64encode(key.sign(checkpoint_message(size, head))).decode("ascii")
            public_pem = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ).decode("ascii")
        return {"ledger_size": size, "head_hash": head, "signature": signature, "public_key": public_pem}


def _as_amount(value: Any) -> Amount:
    if isinstance(value, Decimal):
        if value.is_nan() or value < 0:
            raise BudgetError("the lifetime cap must be a non-negative number")
        return INFINITE if value.is_infinite() else Fraction(value)
    if isinstance(value, (Fraction, int)) and not isinstance(value, bool):
        if value < 0:
            raise BudgetError("the lifetime cap must be a non-negative number")
        return Fraction(value)
    raise BudgetError("the lifetime cap must be an exact number (Fraction or Decimal), not a float")


def _unit_name(defn: PrivacyDefinition) -> str:
    return "rho (zCDP)" if defn is PrivacyDefinition.ZCDP else "epsilon (pure DP)"


def _clean_text(text: str) -> str:
    """A single printable line of at most 500 characters (what the ledger accepts)."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in str(text)).strip()
    return cleaned[:_MAX_TEXT]


class RunRecorder:
    """Records one attempt of one run's spends; satisfies :class:`phsafe.noise.SpendRecorder`.

    Obtained from :meth:`Ledger.start_run` (attempt 1) or :meth:`Ledger.resume_run`; every method
    appends durably before returning. Safe to share between threads: it holds no mutable state,
    and every method reads and appends under the ledger's thread mutex and file lock.

    A recorder belongs to its attempt: once the run is resumed (by anyone, in any process) the
    recorders of earlier attempts are refused, so a process thought dead cannot spend, commit,
    publish, finish or fail on behalf of the attempt that replaced it.
    """

    def __init__(self, ledger: Ledger, run_id: str, plan: RunPlan, *, attempt: int = 1) -> None:
        self._ledger = ledger
        self.run_id = run_id
        self.attempt = attempt
        self._plan = {m.key: m for m in plan.measurements}

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    def _run(self, state: LedgerState) -> RunState:
        return state.runs[self.run_id]

    def _current(self, state: LedgerState) -> RunState:
        """The run, if this recorder's attempt is still its current attempt."""
        run = self._run(state)
        if run.attempt != self.attempt:
            raise BudgetError(
                f"run {self.run_id} was resumed (attempt {run.attempt}, entry {run.attempt_seq}) after this "
                f"recorder's attempt {self.attempt}; refusing to record for a replaced attempt"
            )
        return run

    def record_intent(self, measurement: PlannedMeasurement) -> SpendReceipt:
        """Durably record that ``measurement``'s budget is being spent (before its noise).

        Raises:
            BudgetError: The measurement is not in the run's plan or differs from it, was already
                spent in this attempt, the run has ended or was resumed since, or the spend is a
                re-spend that would take the dataset's odometer above the run's lifetime cap.
                Nothing is appended then.
        """
        key = measurement.key
        if self._plan.get(key) != measurement:
            raise BudgetError(f"{key} is not a measurement of run {self.run_id}'s plan; refusing to spend")
        with self._ledger._locked() as state:
            run = self._current(state)
            earlier = run.spent_in_attempt(key)
            if earlier is not None:
                raise BudgetError(
                    f"{key} was already spent in run {self.run_id} (entry {earlier}, attempt {run.attempt}); "
                    "a measurement is spent at most once per attempt"
                )
            if run.status is not RunStatus.RUNNING:
                raise BudgetError(f"run {self.run_id} has ended; refusing to spend")
            if run.outputs_in_attempt():
                raise BudgetError(f"run {self.run_id} already published its outputs; refusing to spend")
            after = state.respend_odometer(run, key)
            if after is not None and not run.non_confidential and amount_exceeds(after, run.lifetime_cap):
                previous = run.intents[key]
                raise BudgetError(
                    f"privacy-loss budget refused: re-spending {key} in run {self.run_id} (attempt "
                    f"{run.attempt}; spent {len(previous)} time(s) before, last at entry {previous[-1]}) "
                    f"would take dataset {run.dataset_id[:16]} to spent {format_exact(after)}, above the "
                    f"run's lifetime cap {format_exact(run.lifetime_cap)} ({_unit_name(run.privacy_defn)}). "
                    "Spends are never refunded. To spend it again, record the failure and resume the run "
                    f"with the cap raised to at least {format_exact(after)} (--lifetime-cap) and the "
                    "reason (--cap-reason); both are recorded."
                )
            rec = run.planned[key].record
            entry = self._ledger._append(
                EntryKind.INTENT,
                self.run_id,
                {"key": key, "budget": rec["budget"], "sensitivity": rec["sensitivity"], "n_cells": rec["n_cells"]},
            )
        return SpendReceipt(measurement_key=key, sequence=entry["seq"], entry_hash=entry["hash"])

    def record_committed(self, receipt: SpendReceipt, *, noisy_digest: str) -> None:
        """Record that the noise of ``receipt``'s spend was drawn; ``noisy_digest`` hashes it.

        Raises:
            BudgetError: The run was resumed since this recorder's attempt.
            LedgerError: The receipt is not the key's latest INTENT of this attempt, the key is
                already committed, or the digest is malformed.
        """
        with self._ledger._locked() as state:
            self._current(state)
            self._ledger._append(
                EntryKind.COMMITTED,
                self.run_id,
                {
                    "key": receipt.measurement_key,
                    "intent_seq": receipt.sequence,
                    "intent_hash": receipt.entry_hash,
                    "noisy_digest": noisy_digest,
                },
            )

    def record_outputs_published(self, file_digests: dict[str, str]) -> None:
        """Record the digests of every released file (relative path -> SHA-256)."""
        files = {str(k): str(v).lower() for k, v in file_digests.items()}
        with self._ledger._locked() as state:
            self._current(state)
            self._ledger._append(EntryKind.OUTPUTS_PUBLISHED, self.run_id, {"files": files})

    def finish(self) -> None:
        """Record that the run ended successfully (every planned measurement committed).

        ``spent`` is the run's charge: its planned total plus every re-spend.
        """
        with self._ledger._locked() as state:
            spent = self._current(state).charge()
            self._ledger._append(EntryKind.RUN_FINISHED, self.run_id, {"spent": format_exact(spent)})

    def fail(self, reason: str) -> None:
        """Record that the run failed; a no-op if it already ended or was resumed since.

        Args:
            reason: A short, fixed, safe message (never data); cut to one line of 500 characters.
        """
        with self._ledger._locked() as state:
            run = self._run(state)
            if run.status is not RunStatus.RUNNING or run.attempt != self.attempt:
                # Ended, or a later attempt owns the run now: failing it would be a lie.
                return
            spent = run.intended_total()
            self._ledger._append(
                EntryKind.RUN_FAILED,
                self.run_id,
                {"spent": format_exact(spent), "reason": _clean_text(reason) or "unspecified failure"},
            )

    def checkpoint(self, signing_key: Path | None = None) -> dict[str, Any]:
        """See :meth:`Ledger.checkpoint`."""
        return self._ledger.checkpoint(signing_key)
