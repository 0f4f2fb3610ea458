"""The privacy-loss ledger: an append-only, hash-chained, durable record of every spend.

The ledger is confidential: it stays inside the enclave with the data. It holds no microdata,
but it does hold facts about the confidential inputs (file digests, keyed content fingerprints,
the truncation key), so it is never published; what the public sees of it is a signed
checkpoint (size and head hash) and, in each release's manifest, a keyed lineage commitment.

Format
    JSON Lines. Each line is the canonical JSON (sorted keys, no whitespace, UTF-8, no floats:
    exact numbers are strings) of one entry with the fields ``seq`` (0-based, consecutive),
    ``prev`` (hash of the previous entry, 64 zeros for the first), ``kind``, ``time`` (UTC ISO),
    ``run_id`` (null for entries about the ledger or a dataset rather than a run), the body
    fields of its kind, and ``hash`` = SHA-256 over ``ENTRY_DOMAIN`` followed by the canonical
    JSON of the entry without ``hash``.

    Ledger entries: ``LEDGER_INIT`` (entry 0 of every ledger made by ``phsafe ledger init``),
    ``LEDGER_MIGRATED`` (turns a ledger of the first format into this one, see "Migration"),
    ``CAP_RAISED``, ``DATASET_VERSION``, ``TAIL_REPAIRED``. Run entries: ``RUN_STARTED``,
    ``INTENT``, ``COMMITTED``, ``OUTPUTS_PUBLISHED``, ``RUN_FINISHED``, ``RUN_FAILED``,
    ``RUN_RESUMED``.

Policy, datasets and versions
    A ledger is created only by ``phsafe ledger init`` (:func:`init_ledger`), before any data is
    seen. Its ``LEDGER_INIT`` entry fixes the policy: the privacy definition whose unit every
    cap and charge is counted in (rho for zCDP, epsilon for pure DP), the lifetime cap of every
    dataset of the ledger, the reason, whether the ledger is a throwaway one for non-confidential
    (synthetic) data, the ledger id, and the id of its *lineage key* -- 32 random bytes created
    with the ledger in ``<ledger>.key`` (mode 0600), never published. Every keyed commitment of
    the ledger (content fingerprints, release lineage) is an HMAC under that key, so an auditor
    holding it can check lineage and nobody else can test guesses against what is published.

    Every run names its *dataset* (e.g. ``cef2020-us``). The lifetime cap is per dataset: every
    spend on any content version under that name counts against it. A dataset's content
    versions are told apart by their content fingerprint (:mod:`phsafe.fingerprint`, committed
    under the lineage key); a ``DATASET_VERSION`` entry (name, fingerprint, reason) declares
    one, and the operator must ask for it (a version never seen under a name is refused
    otherwise). A fingerprint declared under one name can never be declared under another: the
    same records cannot be released under a second name. ``CAP_RAISED`` (name, new cap, reason)
    raises one dataset's cap above the policy cap; caps are never lowered.

Write-ahead spends
    Every append happens under an exclusive ``flock`` on the sibling ``<ledger>.lock`` file: the
    writer reads (and verifies) whatever other processes appended since it last looked, appends
    its lines with one write, ``fsync``\\ s the file, and only then releases the lock and
    returns. :func:`phsafe.noise.measure` draws noise only after
    :meth:`RunRecorder.record_intent` returned, so a spend is on disk before its noise exists.
    Within one process a :class:`Ledger` object also holds a thread mutex around the same
    section, so recorders used from many threads (one per measurement task) append one at a time.

    A write that fails (a full disk: ``ENOSPC``) is rolled back to the previous end of the file
    before the error is raised, so the ledger never keeps a partial entry of a live process. A
    process killed in the middle of a write can still leave a torn last line; the ledger then
    refuses every use until ``phsafe ledger repair`` (:func:`repair_ledger`) truncates the torn
    tail and records ``TAIL_REPAIRED`` with the length and SHA-256 of the dropped bytes. That is
    safe: noise is drawn only after its ``INTENT`` is complete on disk, so a torn ``INTENT``
    drew nothing, and a torn ``COMMITTED`` leaves its ``INTENT`` uncommitted, to be spent again.

Runs, attempts and publication
    ``RUN_STARTED`` records the dataset, its fingerprint, the plan (every table x level: budget,
    Delta, tau, variance, cells), the config and input file digests (confidential lineage), the
    truncation key, whether the inputs were validated, and the dataset's odometer and cap at
    start. Two optional fields (absent when null; never written as null): ``orchestration``,
    the orchestrator's identity of the attempt (``{"system": "prefect", "flow_run_id": UUID,
    "parent_flow_run_id": UUID}``, the parent only for a subflow), by which a retried flow run
    finds the runs it started; and ``re_release`` (see "One release per content version").
    ``RUN_RESUMED`` may carry both too, for the attempt it opens. A run publishes by staging its release, renaming it into place, and only then
    recording ``OUTPUTS_PUBLISHED`` (the released files' digests and where they went) and
    ``RUN_FINISHED``: the ledger never says a release exists that does not.

    A run whose status is failed (it recorded ``RUN_FAILED``) or running (no terminal entry: it is
    running or it crashed) can be resumed by a ``RUN_RESUMED`` entry (:meth:`Ledger.resume_run`);
    a finished run never can. ``RUN_RESUMED`` records the config digest, dataset and fingerprint,
    which must equal the run's (the same config and records: otherwise reused measurements would
    be inconsistent with new ones), the ``code_version`` that resumes and the operator's
    ``reason``. Its attempt number is 1 + its number of ``RUN_RESUMED`` entries, and the earlier
    attempts stay in the history.

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
    (:attr:`RunState.truncation_key`). A :class:`RunRecorder` belongs to one attempt: once the
    run is resumed, recorders of earlier attempts (a worker thought dead) are refused.

One release per content version
    A content version (dataset name and fingerprint) is released once. A run on it *claims* the
    version while it is running (or crashed without a terminal entry) and once it has published;
    a failed run claims nothing. A ``RUN_STARTED`` -- and a ``RUN_RESUMED`` -- of a run whose
    version another run claims must carry ``re_release``, the operator's reason for releasing the
    same records again; a ``re_release`` where no other run claims the version is refused (the
    ledger never records a re-release that is not one). A re-release is charged and capped like
    any run. So at any time at most one run of a content version is released or on its way
    without a recorded reason, whatever room the cap leaves. In a non-confidential (throwaway)
    ledger a second release needs no declaration, as its caps are not enforced either.

Lifetime rule (the odometer)
    Write ``b_k`` for the budget of planned key ``k`` and ``n_k`` for its number of ``INTENT``
    entries over all the run's attempts. What a run *charges* against its dataset is:

    * a run whose status is failed: ``sum_k b_k * n_k`` -- every ``INTENT`` it recorded, re-spends
      included (an ``INTENT`` without ``COMMITTED`` counts: its noise may have been drawn); the
      unspent rest of its plan is released;
    * any other run -- finished, still running, or crashed without a terminal entry:
      ``sum over its planned keys of b_k * max(1, n_k)`` -- its whole plan stays reserved and every
      re-spend is charged on top. A crashed run's reservation is never released: nobody can prove
      which noise it drew. A resumed run is running again, so it reserves its whole plan again.

    ``RUN_FINISHED.spent`` is the run's charge and ``RUN_FAILED.spent`` the sum of all its
    INTENTs. Nothing is ever refunded. The dataset's odometer (the sum of its runs' charges, in
    the ledger's unit) plus what a run reserves must stay within the dataset's cap; this is
    checked in three places, each under the lock with the append it guards: at
    ``RUN_STARTED``, at ``RUN_RESUMED`` (the run reserving its whole plan again), and at a
    re-spending ``INTENT``. A first ``INTENT`` of a key adds nothing: it was reserved.

    Charges are counted in the ledger's unit. A pure-DP spend of epsilon counts as epsilon^2/2
    in a zCDP ledger (epsilon-DP implies epsilon^2/2-zCDP, per measurement); a zCDP spend cannot
    be bounded in pure DP, so it makes a pure-DP ledger's odometer infinite.

    A non-confidential ledger (``init --non-confidential``: synthetic or public data, for tests,
    demos and rehearsals) takes only non-confidential runs, and a confidential ledger only
    confidential ones: declaring data non-confidential cannot sidestep a production cap. Only
    non-confidential runs may use ``Infinity`` budgets; their caps are recorded but not enforced.

Migration
    Ledgers written before policies existed (first entry ``RUN_STARTED``; datasets identified by
    the SHA-256 of their input files; a cap per run) still verify under the rules they were
    written with, but take no new run until ``phsafe ledger migrate`` (:func:`migrate_ledger`)
    appends ``LEDGER_MIGRATED``: the policy (as ``LEDGER_INIT`` records it), a fresh lineage key,
    and the name of every old dataset id, so that the old runs' charges count against the named
    datasets from then on. The hash chain runs on unbroken, so the old history stays verifiable.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import enum
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from phsafe.accounting import PlannedMeasurement, RunPlan
from phsafe.config import INFINITE, PrivacyDefinition
from phsafe.errors import AlreadyReleasedError, BudgetError, LedgerError, PHSafeError, TornTailError, option, os_reason
from phsafe.iterations import PopulationGroupLevel
from phsafe.noise import SpendReceipt
from phsafe.tables import TABLE_LEVELS, TABLES, TableKind

ENTRY_DOMAIN = b"phsafe-ledger-entry-v1\x00"
CHECKPOINT_DOMAIN = b"phsafe-ledger-checkpoint-v1\x00"
DATASET_DOMAIN = b"phsafe-dataset-v1\x00"
KEY_ID_DOMAIN = b"phsafe-lineage-key-id-v1\x00"
LINEAGE_DOMAIN = b"phsafe-release-lineage-v1\x00"
GENESIS_HASH = "0" * 64
FORMAT = 2
"""The ledger format that LEDGER_INIT and LEDGER_MIGRATED introduce (the first had no genesis)."""
LINEAGE_KEY_BYTES = 32
KEY_SUFFIX = ".key"
LOCK_SUFFIX = ".lock"

Amount = Fraction | Decimal
"""An exact privacy-loss amount: a Fraction, or ``Decimal('Infinity')``."""


class EntryKind(str, enum.Enum):
    LEDGER_INIT = "LEDGER_INIT"
    LEDGER_MIGRATED = "LEDGER_MIGRATED"
    CAP_RAISED = "CAP_RAISED"
    DATASET_VERSION = "DATASET_VERSION"
    TAIL_REPAIRED = "TAIL_REPAIRED"
    RUN_STARTED = "RUN_STARTED"
    INTENT = "INTENT"
    COMMITTED = "COMMITTED"
    OUTPUTS_PUBLISHED = "OUTPUTS_PUBLISHED"
    RUN_FINISHED = "RUN_FINISHED"
    RUN_FAILED = "RUN_FAILED"
    RUN_RESUMED = "RUN_RESUMED"


LEDGER_KINDS = frozenset({EntryKind.LEDGER_INIT, EntryKind.LEDGER_MIGRATED, EntryKind.CAP_RAISED,
                          EntryKind.DATASET_VERSION, EntryKind.TAIL_REPAIRED})
"""Entries about the ledger or a dataset, not a run: their ``run_id`` is null."""


class RunStatus(str, enum.Enum):
    RUNNING = "running"  # no terminal entry: still running, or crashed
    FINISHED = "finished"
    FAILED = "failed"


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
_POLICY = frozenset({"ledger_id", "format", "privacy_defn", "lifetime_cap", "reason", "non_confidential",
                     "key_id", "code_version"})
_BODY: dict[EntryKind, frozenset[str]] = {
    EntryKind.LEDGER_INIT: _POLICY,
    EntryKind.LEDGER_MIGRATED: _POLICY | {"datasets"},
    EntryKind.CAP_RAISED: frozenset({"dataset", "lifetime_cap", "reason"}),
    EntryKind.DATASET_VERSION: frozenset({"dataset", "fingerprint", "reason"}),
    EntryKind.TAIL_REPAIRED: frozenset({"dropped_bytes", "dropped_sha256", "reason"}),
    EntryKind.RUN_STARTED: frozenset(
        {
            "dataset", "fingerprint", "input_digests", "config_digest", "code_version", "truncation_key",
            "privacy_defn", "planned", "planned_total", "lifetime_cap", "non_confidential", "spent_before",
            "validated",
        }
    ),
    EntryKind.INTENT: frozenset({"key", "budget", "sensitivity", "n_cells"}),
    EntryKind.COMMITTED: frozenset({"key", "intent_seq", "intent_hash", "noisy_digest"}),
    EntryKind.OUTPUTS_PUBLISHED: frozenset({"files", "output"}),
    EntryKind.RUN_FINISHED: frozenset({"spent"}),
    EntryKind.RUN_FAILED: frozenset({"spent", "reason"}),
    EntryKind.RUN_RESUMED: frozenset({"config_digest", "dataset", "fingerprint", "code_version", "reason"}),
}
_BODY_V1: dict[EntryKind, frozenset[str]] = {
    EntryKind.RUN_STARTED: frozenset(
        {
            "dataset_id", "input_digests", "config_digest", "code_version", "truncation_key",
            "privacy_defn", "planned", "planned_total", "lifetime_cap", "cap_reason",
            "non_confidential", "spent_before",
        }
    ),
    EntryKind.OUTPUTS_PUBLISHED: frozenset({"files"}),
    EntryKind.RUN_RESUMED: frozenset(
        {"config_digest", "dataset_id", "code_version", "reason", "lifetime_cap", "cap_reason"}
    ),
}
"""Entries of the first format (before LEDGER_INIT existed) whose fields differ."""
_OPTIONAL: dict[EntryKind, frozenset[str]] = {
    EntryKind.RUN_STARTED: frozenset({"orchestration", "re_release"}),
    EntryKind.RUN_RESUMED: frozenset({"orchestration", "re_release"}),
}
"""Fields a format-2 entry may leave out (absent means null; a present one is never null)."""
_ORCHESTRATION_KEYS = frozenset({"system", "flow_run_id", "parent_flow_run_id"})
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
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
        orchestration: The orchestrator's identity of the attempt (its Prefect flow run and the
            parent flow run), when an orchestrator ran it.
        re_release: The operator's reason for releasing a content version again, when the entry
            that opened the attempt declared one.
    """

    number: int
    seq: int
    time: str
    code_version: str
    lifetime_cap: Amount
    cap_reason: str | None
    resume_reason: str | None = None
    orchestration: "Orchestration | None" = None
    re_release: str | None = None
    end: RunStatus = RunStatus.RUNNING
    end_seq: int | None = None
    end_time: str | None = None
    end_reason: str | None = None


@dataclass
class RunState:
    """Everything the ledger says about one run.

    The RUN_STARTED fields stay as recorded at start, except ``lifetime_cap`` and ``cap_reason``,
    which are the cap the run was last checked against (at start or resume; for a run of the
    first ledger format, its own cap); every attempt's own values are in ``attempts``.
    ``status``, ``terminal_seq``, ``terminal_time`` and ``failure_reason`` describe the current
    attempt (a resume sets them back to running).

    ``dataset`` is the declared dataset name and ``fingerprint`` the keyed commitment of its
    content; a run of the first ledger format has neither, only ``legacy_dataset_id`` (the
    SHA-256 over its input file digests), and gets the name its id is mapped to at migration.
    ``validated`` says whether the full input suites ran before it spent (None: first format).
    """

    run_id: str
    started_seq: int
    started_time: str
    dataset: str | None
    fingerprint: str | None
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
    validated: bool | None = None
    legacy_dataset_id: str | None = None
    intents: dict[str, list[int]] = field(default_factory=dict)  # key -> every INTENT seq, in order
    intent_hashes: dict[str, str] = field(default_factory=dict)  # key -> hash of its latest INTENT
    committed: dict[str, str] = field(default_factory=dict)  # key -> noisy digest of its latest COMMITTED
    committed_seq: dict[str, int] = field(default_factory=dict)  # key -> seq of its latest COMMITTED
    committed_intent: dict[str, int] = field(default_factory=dict)  # key -> INTENT seq that COMMITTED names
    outputs: dict[str, str] | None = None
    outputs_seq: int | None = None
    output_path: str | None = None
    status: RunStatus = RunStatus.RUNNING
    terminal_seq: int | None = None
    terminal_time: str | None = None
    failure_reason: str | None = None
    attempts: list[RunAttempt] = field(default_factory=list)

    @property
    def re_release(self) -> str | None:
        """The reason recorded for releasing the run's content version again (at start or at a
        resume), or None: the run is its version's one release."""
        return next((a.re_release for a in reversed(self.attempts) if a.re_release), None)

    @property
    def claims_release(self) -> bool:
        """Whether the run claims its content version: published, or running (or crashed)."""
        return self.published or self.status is RunStatus.RUNNING

    @property
    def legacy(self) -> bool:
        """A run of the first ledger format (no declared dataset)."""
        return self.legacy_dataset_id is not None

    @property
    def account(self) -> str:
        """What the run's charges count against: its dataset name, or for a run of the first
        format not yet mapped to a name, its old dataset id."""
        return self.dataset if self.dataset is not None else f"legacy:{self.legacy_dataset_id}"

    @property
    def published(self) -> bool:
        """Whether the run recorded OUTPUTS_PUBLISHED (in any attempt)."""
        return self.outputs is not None

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


@dataclass(frozen=True)
class Orchestration:
    """Who ran an attempt: an orchestrator's flow run (and its parent, for a subflow).

    Public identifiers of the orchestrator's own database, recorded so that a retried flow run
    finds the ledger runs it started and resumes them instead of starting new ones.
    """

    flow_run_id: str
    parent_flow_run_id: str | None = None
    system: str = "prefect"

    def record(self) -> dict[str, str]:
        body = {"system": self.system, "flow_run_id": self.flow_run_id.lower()}
        if self.parent_flow_run_id:
            body["parent_flow_run_id"] = self.parent_flow_run_id.lower()
        return body

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Orchestration":
        return cls(record["flow_run_id"], record.get("parent_flow_run_id"), record["system"])

    def started(self, attempt: RunAttempt) -> bool:
        """Whether ``attempt`` was run by this flow run, or by a sibling under the same parent
        (a retried parent flow run starts its subflows anew, with new flow run ids)."""
        other = attempt.orchestration
        if other is None or other.system != self.system:
            return False
        if other.flow_run_id == self.flow_run_id:
            return True
        return self.parent_flow_run_id is not None and other.parent_flow_run_id == self.parent_flow_run_id


@dataclass(frozen=True)
class Policy:
    """What ``LEDGER_INIT`` (or ``LEDGER_MIGRATED``) fixed for the whole ledger.

    Attributes:
        ledger_id: Random id of the ledger (32 hex digits).
        privacy_defn: The unit of every cap and charge (rho for zCDP, epsilon for pure DP).
        lifetime_cap: Each dataset's cap until a ``CAP_RAISED`` raises it.
        reason: Why this policy (recorded at init).
        non_confidential: A throwaway ledger for synthetic or public data.
        key_id: Identifies the lineage key (``<ledger>.key``) without revealing it.
        seq: The entry that set the policy (0, or the ``LEDGER_MIGRATED`` entry).
    """

    ledger_id: str
    privacy_defn: PrivacyDefinition
    lifetime_cap: Amount
    reason: str
    non_confidential: bool
    key_id: str
    seq: int


@dataclass
class CapChange:
    """One ``CAP_RAISED`` entry."""

    seq: int
    time: str
    lifetime_cap: Amount
    reason: str


@dataclass
class DatasetVersion:
    """One ``DATASET_VERSION`` entry: a content version declared under a dataset name."""

    seq: int
    time: str
    fingerprint: str
    reason: str


@dataclass
class DatasetState:
    """A declared dataset: its cap (the policy's, or the latest raise) and its content versions."""

    name: str
    lifetime_cap: Amount
    raises: list[CapChange] = field(default_factory=list)
    versions: list[DatasetVersion] = field(default_factory=list)

    def has_version(self, fingerprint: str) -> bool:
        return any(v.fingerprint == fingerprint for v in self.versions)

    @property
    def cap_reason(self) -> str | None:
        """The reason of the raise that set the current cap (None: the policy's cap)."""
        return self.raises[-1].reason if self.raises else None


@dataclass
class TailRepair:
    """One ``TAIL_REPAIRED`` entry: bytes of an interrupted write that were dropped."""

    seq: int
    time: str
    dropped_bytes: int
    dropped_sha256: str
    reason: str


class LedgerState:
    """The verified content of a ledger, built entry by entry.

    :meth:`apply` checks one line against every rule (encoding, chain, sequence, the policy and
    the run state machine including the lifetime caps) and only then updates the state, so a
    state is always the state of a valid prefix.
    """

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.lines: list[bytes] = []
        self.runs: dict[str, RunState] = {}
        self.head_hash: str = GENESIS_HASH
        self.policy: Policy | None = None
        self.dataset_states: dict[str, DatasetState] = {}
        self.fingerprints: dict[str, str] = {}  # fingerprint -> the dataset it is declared under
        self.repairs: list[TailRepair] = []
        self.legacy_names: dict[str, str] = {}  # first-format dataset id -> name (at migration)

    @property
    def size(self) -> int:
        return len(self.entries)

    @property
    def format(self) -> int:
        """1 for a ledger of the first format (no policy yet), else :data:`FORMAT`."""
        return FORMAT if self.policy is not None else 1

    @property
    def unit(self) -> PrivacyDefinition | None:
        """The privacy definition every cap and charge is counted in (None: first format)."""
        return None if self.policy is None else self.policy.privacy_defn

    def dataset_spent(self, account: str, unit: PrivacyDefinition) -> Amount:
        """The odometer: the sum of every run's charge against ``account``, in ``unit``.

        ``account`` is a dataset name, or ``legacy:<id>`` for runs of the first format that no
        migration has named (see :attr:`RunState.account`).
        """
        total: Amount = Fraction(0)
        for run in self.runs.values():
            if run.account == account:
                total = add_amounts(total, run.charge(unit))
        return total

    def cap_of(self, run: RunState) -> Amount:
        """The cap ``run``'s spends are checked against: its dataset's (its own, first format)."""
        if run.dataset is not None and self.policy is not None:
            return self.dataset_cap(run.dataset)
        return run.lifetime_cap

    def dataset_cap(self, name: str) -> Amount:
        """A dataset's lifetime cap: the policy's, or its latest ``CAP_RAISED``."""
        assert self.policy is not None
        ds = self.dataset_states.get(name)
        return ds.lifetime_cap if ds is not None else self.policy.lifetime_cap

    def _unit_of(self, run: RunState) -> PrivacyDefinition:
        return self.unit or run.privacy_defn

    def resume_odometer(self, run: RunState) -> Amount:
        """The dataset's odometer with ``run`` running again (reserving its whole plan again).

        This is what the cap of a RUN_RESUMED must cover. It is never below the odometer now.
        """
        unit = self._unit_of(run)
        total: Amount = run.charge(unit, status=RunStatus.RUNNING)
        for other in self.runs.values():
            if other.account == run.account and other is not run:
                total = add_amounts(total, other.charge(unit))
        return total

    def respend_odometer(self, run: RunState, key: str) -> Amount | None:
        """The odometer after a new INTENT of ``key``, or None if that INTENT adds nothing.

        Only a re-spend (a key that already has an INTENT, in a running run) adds to the charge:
        a first INTENT was reserved at start or resume.
        """
        if not run.intents.get(key):
            return None
        unit = self._unit_of(run)
        return add_amounts(self.dataset_spent(run.account, unit),
                           _convert(run.planned[key].budget, run.privacy_defn, unit))

    def datasets(self) -> dict[str, list[RunState]]:
        """Account (dataset name, or ``legacy:<id>``) -> its runs, in ledger order."""
        out: dict[str, list[RunState]] = {}
        for run in self.runs.values():
            out.setdefault(run.account, []).append(run)
        return out

    def release_claims(self, dataset: str, fingerprint: str, *, besides: str | None = None) -> list[RunState]:
        """The runs (other than ``besides``) that claim the content version ``(dataset,
        fingerprint)``: published, or running or crashed -- see "One release per content version"."""
        return [r for r in self.runs.values()
                if r.run_id != besides and r.dataset == dataset and r.fingerprint == fingerprint
                and r.fingerprint is not None and r.claims_release]

    def runs_of(self, orchestration: "Orchestration", dataset: str) -> list[RunState]:
        """The runs of ``dataset`` that ``orchestration`` (or the flow run it retries) started or
        resumed, most recent first."""
        found = [r for r in self.runs.values()
                 if r.dataset == dataset and any(orchestration.started(a) for a in r.attempts)]
        return sorted(found, key=lambda r: r.attempt_seq, reverse=True)

    def unpublished(self) -> list[RunState]:
        """Runs that charge their dataset and published nothing: to be resumed.

        Those that recorded an INTENT, and those still running or crashed (they reserve their
        whole plan even before their first INTENT). A failed run with no INTENT charges nothing.
        """
        return [r for r in self.runs.values()
                if not r.published and (r.intents or r.status is RunStatus.RUNNING)]

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
        except RecursionError:
            raise LedgerError("not a valid ledger line (nested too deeply)", seq=seq) from None
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
            expected = _COMMON | self._body(kind_enum)
            optional = _OPTIONAL.get(kind_enum, frozenset()) if self.policy is not None else frozenset()
            for name in optional & set(entry):
                if entry[name] is None:
                    raise _Invalid(f"{name} is null: an optional field is left out, never written as null")
            if set(entry) - optional != expected:
                missing = sorted(expected - set(entry))
                extra = sorted(set(entry) - expected - optional)
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
            if kind_enum in LEDGER_KINDS:
                if entry["run_id"] is not None:
                    raise _Invalid("run_id must be null: the entry is about the ledger, not a run")
            elif not isinstance(entry["run_id"], str) or not _RUN_ID.fullmatch(entry["run_id"]):
                raise _Invalid("run_id is not a valid run id")
        except _Invalid as exc:
            raise LedgerError(str(exc), seq=seq, kind=kind) from None
        return entry

    def _body(self, kind: EntryKind) -> frozenset[str]:
        if self.policy is None and kind in _BODY_V1:
            return _BODY_V1[kind]
        return _BODY[kind]

    def check(self, entry: Mapping[str, Any]) -> Callable[[], None]:
        """Check a parsed entry against the rules; return the update that applies it.

        Raises:
            LedgerError: naming the entry and the rule it breaks.
        """
        kind = EntryKind(entry["kind"])
        try:
            # A ledger of the first format starts with its first RUN_STARTED.
            if self.size == 0 and kind not in (EntryKind.LEDGER_INIT, EntryKind.RUN_STARTED):
                raise _Invalid("a ledger starts with LEDGER_INIT")
            check = getattr(self, f"_check_{kind.value.lower()}")
            if self.policy is None and kind in (EntryKind.RUN_STARTED, EntryKind.RUN_RESUMED):
                check = getattr(self, f"_check_{kind.value.lower()}_v1")
            return check(entry)
        except _Invalid as exc:
            raise LedgerError(str(exc), seq=entry["seq"], kind=kind.value) from None

    def apply(self, line: bytes) -> dict[str, Any]:
        """Check ``line`` (no trailing newline) as the next entry and add it to the state.

        Raises:
            LedgerError: naming the entry and the rule it breaks.
        """
        entry = self.parse_line(line)
        commit = self.check(entry)
        commit()
        self.entries.append(entry)
        self.lines.append(line)
        self.head_hash = entry["hash"]
        return entry

    # -- the ledger's own entries ------------------------------------------------------------

    def _policy_fields(self, e: Mapping[str, Any]) -> tuple[PrivacyDefinition, Amount, str, bool]:
        defn = _privacy_defn_and_kind(e)
        cap = _amount(e, "lifetime_cap")
        if _is_inf(cap) and not e["non_confidential"]:
            raise _Invalid("an Infinity lifetime cap is allowed only in a non-confidential ledger")
        reason = e["reason"]
        if not _is_text(reason) or not reason.strip():
            raise _Invalid("reason must be a non-empty short string")
        if e["format"] != FORMAT:
            raise _Invalid(f"format must be {FORMAT}")
        if not isinstance(e["ledger_id"], str) or not re.fullmatch(r"[0-9a-f]{32}", e["ledger_id"]):
            raise _Invalid("ledger_id must be 32 lowercase hex digits")
        if not isinstance(e["key_id"], str) or not re.fullmatch(r"[0-9a-f]{32}", e["key_id"]):
            raise _Invalid("key_id must be 32 lowercase hex digits")
        if not _is_text(e["code_version"]):
            raise _Invalid("code_version must be a short string")
        return defn, cap, reason, e["non_confidential"]

    def _set_policy(self, e: Mapping[str, Any]) -> Callable[[], None]:
        defn, cap, reason, non_conf = self._policy_fields(e)

        def commit() -> None:
            self.policy = Policy(e["ledger_id"], defn, cap, reason, non_conf, e["key_id"], e["seq"])

        return commit

    def _check_ledger_init(self, e: Mapping[str, Any]):
        if e["seq"] != 0:
            raise _Invalid("LEDGER_INIT can only be the first entry")
        return self._set_policy(e)

    def _check_ledger_migrated(self, e: Mapping[str, Any]):
        if self.policy is not None:
            raise _Invalid("the ledger already has a policy (LEDGER_INIT or LEDGER_MIGRATED)")
        if not self.runs:
            raise _Invalid("only a ledger of the first format with runs is migrated; a new one is initialised")
        names = e["datasets"]
        if not isinstance(names, dict):
            raise _Invalid("datasets must map old dataset ids to names")
        legacy_ids = {r.legacy_dataset_id for r in self.runs.values()}
        if set(names) != legacy_ids:
            missing = sorted(legacy_ids - set(names))
            raise _Invalid(f"datasets must name every old dataset id exactly (missing {missing[:1]})"
                           if missing else "datasets names an id no run of the ledger has")
        for old, name in names.items():
            if not _is_hex64(old) or not isinstance(name, str) or not _NAME.fullmatch(name):
                raise _Invalid("datasets must map SHA-256 hex ids to dataset names")
        commit_policy = self._set_policy(e)
        non_conf = e["non_confidential"]
        if any(r.non_confidential != non_conf for r in self.runs.values()):
            raise _Invalid("a ledger's runs must all be confidential, or all non-confidential, as its policy says")

        def commit() -> None:
            commit_policy()
            self.legacy_names = dict(names)
            for run in self.runs.values():
                run.dataset = names[run.legacy_dataset_id]

        return commit

    def _needs_policy(self) -> Policy:
        if self.policy is None:
            raise _Invalid("a ledger of the first format takes no new entry: migrate it first "
                           "(phsafe ledger migrate)")
        return self.policy

    def _check_cap_raised(self, e: Mapping[str, Any]):
        policy = self._needs_policy()
        name = e["dataset"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _Invalid("dataset is not a valid dataset name")
        cap = _amount(e, "lifetime_cap")
        if _is_inf(cap) and not policy.non_confidential:
            raise _Invalid("an Infinity lifetime cap is allowed only in a non-confidential ledger")
        current = self.dataset_cap(name)
        if not amount_exceeds(cap, current):
            raise _Invalid(f"lifetime_cap {e['lifetime_cap']} does not raise {name}'s cap "
                           f"{format_exact(current)}: a cap is only ever raised")
        reason = e["reason"]
        if not _is_text(reason) or not reason.strip():
            raise _Invalid("a cap raise needs a reason (a non-empty short string)")

        def commit() -> None:
            ds = self.dataset_states.setdefault(name, DatasetState(name, policy.lifetime_cap))
            ds.lifetime_cap = cap
            ds.raises.append(CapChange(e["seq"], e["time"], cap, reason))

        return commit

    def _check_dataset_version(self, e: Mapping[str, Any]):
        policy = self._needs_policy()
        name, fp = _dataset_and_fingerprint(e)
        owner = self.fingerprints.get(fp)
        if owner is not None:
            raise _Invalid(f"this content version is already declared under dataset {owner!r}"
                           + ("" if owner != name else " (declared twice)"))
        reason = e["reason"]
        if not _is_text(reason) or not reason.strip():
            raise _Invalid("a dataset version needs a reason (a non-empty short string)")

        def commit() -> None:
            ds = self.dataset_states.setdefault(name, DatasetState(name, policy.lifetime_cap))
            ds.versions.append(DatasetVersion(e["seq"], e["time"], fp, reason))
            self.fingerprints[fp] = name

        return commit

    def _check_tail_repaired(self, e: Mapping[str, Any]):
        if not _is_int(e["dropped_bytes"]) or e["dropped_bytes"] < 1:
            raise _Invalid("dropped_bytes must be a positive integer")
        if not _is_hex64(e["dropped_sha256"]):
            raise _Invalid("dropped_sha256 is not a SHA-256 hex digest")
        if not _is_text(e["reason"]):
            raise _Invalid("reason must be a short string")

        def commit() -> None:
            self.repairs.append(TailRepair(e["seq"], e["time"], e["dropped_bytes"], e["dropped_sha256"], e["reason"]))

        return commit

    # -- the run state machine -------------------------------------------------------------

    def _running(self, entry: Mapping[str, Any]) -> RunState:
        run = self.runs.get(entry["run_id"])
        if run is None:
            raise _Invalid(f"run {entry['run_id']!r} was never started")
        if run.status is not RunStatus.RUNNING:
            raise _Invalid(f"run {entry['run_id']!r} already ended at entry {run.terminal_seq}")
        if run.legacy and self.policy is not None:
            raise _Invalid(f"run {entry['run_id']!r} is of the first ledger format; the ledger was migrated since")
        return run

    def _started_fields(self, e: Mapping[str, Any]) -> tuple[PrivacyDefinition, dict[str, PlannedSpend], Amount]:
        """The checks RUN_STARTED of both formats share: ids, digests, key, plan."""
        run_id = e["run_id"]
        if run_id in self.runs:
            raise _Invalid(f"run id {run_id!r} was already started at entry {self.runs[run_id].started_seq}")
        digests = e["input_digests"]
        if not isinstance(digests, dict) or not digests:
            raise _Invalid("input_digests must be a non-empty object")
        for name, digest in digests.items():
            if not _NAME.fullmatch(name) or not _is_hex64(digest):
                raise _Invalid("input_digests must map file names to SHA-256 hex digests")
        if not _is_hex64(e["config_digest"]):
            raise _Invalid("config_digest is not a SHA-256 hex digest")
        if not _is_text(e["code_version"]):
            raise _Invalid("code_version must be a short string")
        if not isinstance(e["truncation_key"], str) or not re.fullmatch(r"(?:[0-9a-f]{2}){8,128}", e["truncation_key"]):
            raise _Invalid("truncation_key must be 8 to 128 bytes of lowercase hex")
        defn = _privacy_defn_and_kind(e)
        planned = _parse_planned(e["planned"], defn)
        total: Amount = Fraction(0)
        for spend in planned.values():
            total = add_amounts(total, spend.budget)
        if _amount(e, "planned_total") != total:
            raise _Invalid(f"planned_total {e['planned_total']} is not the sum of the planned budgets ({format_exact(total)})")
        if _is_inf(total) and not e["non_confidential"]:
            raise _Invalid("an Infinity budget is allowed only in a non-confidential run")
        return defn, planned, total

    def _new_run(self, e: Mapping[str, Any], defn: PrivacyDefinition, planned: dict[str, PlannedSpend],
                 total: Amount, *, dataset: str | None, fingerprint: str | None, legacy_id: str | None,
                 cap: Amount, cap_reason: str | None, spent_before: Amount, validated: bool | None) -> RunState:
        return RunState(
            run_id=e["run_id"], started_seq=e["seq"], started_time=e["time"], dataset=dataset,
            fingerprint=fingerprint, privacy_defn=defn, input_digests=dict(e["input_digests"]),
            config_digest=e["config_digest"], code_version=e["code_version"],
            truncation_key=e["truncation_key"], planned=planned, planned_total=total,
            lifetime_cap=cap, cap_reason=cap_reason, non_confidential=e["non_confidential"],
            spent_before=spent_before, validated=validated, legacy_dataset_id=legacy_id,
            attempts=[RunAttempt(number=1, seq=e["seq"], time=e["time"], code_version=e["code_version"],
                                 lifetime_cap=cap, cap_reason=cap_reason,
                                 orchestration=_orchestration(e), re_release=e.get("re_release"))],
        )

    def _check_run_started(self, e: Mapping[str, Any]):
        policy = self._needs_policy()
        defn, planned, total = self._started_fields(e)
        name, fp = _dataset_and_fingerprint(e)
        owner = self.fingerprints.get(fp)
        if owner is None:
            raise _Invalid(f"this content version was never declared under dataset {name!r} (DATASET_VERSION)")
        if owner != name:
            raise _Invalid(f"this content version is declared under dataset {owner!r}, not {name!r}")
        if e["non_confidential"] != policy.non_confidential:
            raise _Invalid("a confidential ledger takes only confidential runs, a non-confidential ledger only "
                           "non-confidential ones")
        if not isinstance(e["validated"], bool):
            raise _Invalid("validated must be true or false")
        cap = self.dataset_cap(name)
        if _amount(e, "lifetime_cap") != cap:
            raise _Invalid(f"lifetime_cap {e['lifetime_cap']} is not dataset {name}'s cap {format_exact(cap)}")
        odometer = self.dataset_spent(name, policy.privacy_defn)
        if _amount(e, "spent_before") != odometer:
            raise _Invalid(f"spent_before {e['spent_before']} differs from the ledger's spends on dataset "
                           f"{name} ({format_exact(odometer)})")
        self._check_release_claims(e, name, fp, run_id=e["run_id"], declared=e.get("re_release"))
        raised = self.dataset_states.get(name)
        run = self._new_run(e, defn, planned, total, dataset=name, fingerprint=fp, legacy_id=None, cap=cap,
                            cap_reason=raised.cap_reason if raised else None, spent_before=odometer,
                            validated=e["validated"])
        reserved = run.charge(policy.privacy_defn)
        if not policy.non_confidential and amount_exceeds(add_amounts(odometer, reserved), cap):
            raise _Invalid(f"run exceeds dataset {name}'s lifetime cap: spent {format_exact(odometer)} + "
                           f"planned {format_exact(reserved)} > cap {format_exact(cap)}")

        def commit() -> None:
            self.runs[run.run_id] = run

        return commit

    def _check_release_claims(self, e: Mapping[str, Any], dataset: str, fingerprint: str, *, run_id: str,
                              declared: str | None) -> None:
        """One release per content version: ``re_release`` exactly when another run claims it."""
        if "re_release" in e and (not _is_text(e["re_release"]) or not e["re_release"].strip()):
            raise _Invalid("re_release must be a non-empty short string")
        _orchestration(e)  # checks the field's form
        claims = self.release_claims(dataset, fingerprint, besides=run_id)
        if claims and not declared and not self._needs_policy().non_confidential:
            other = claims[0]
            what = "published" if other.published else "open (running, or crashed)"
            raise _Invalid(f"run {other.run_id!r} (entry {other.started_seq}) already claims this content version "
                           f"({what}): a further release of the same records must declare re_release")
        if "re_release" in e and not claims:
            raise _Invalid("re_release is declared, but no other run released or is releasing this content version")

    def _check_run_started_v1(self, e: Mapping[str, Any]):
        """RUN_STARTED of the first format: dataset id from file digests, a cap per run."""
        defn, planned, total = self._started_fields(e)
        non_conf = e["non_confidential"]
        if e["dataset_id"] != dataset_id(e["input_digests"]):
            raise _Invalid("dataset_id is not the digest of the input digests")
        cap = _amount(e, "lifetime_cap")
        if _is_inf(cap) and not non_conf:
            raise _Invalid("an Infinity lifetime cap is allowed only in a non-confidential run")
        reason = e["cap_reason"]
        if reason is not None and not _is_text(reason):
            raise _Invalid("cap_reason must be null or a short string")
        if amount_exceeds(cap, total) and not (reason and reason.strip()):
            raise _Invalid("a lifetime cap above the planned total needs a recorded cap_reason")
        odometer = self.dataset_spent(f"legacy:{e['dataset_id']}", defn)
        if _amount(e, "spent_before") != odometer:
            raise _Invalid(
                f"spent_before {e['spent_before']} differs from the ledger's spends on this dataset "
                f"({format_exact(odometer)})"
            )
        if not non_conf and amount_exceeds(add_amounts(odometer, total), cap):
            raise _Invalid(
                f"run exceeds the lifetime cap: spent {format_exact(odometer)} + planned "
                f"{format_exact(total)} > cap {format_exact(cap)}"
            )
        run = self._new_run(e, defn, planned, total, dataset=None, fingerprint=None, legacy_id=e["dataset_id"],
                            cap=cap, cap_reason=reason, spent_before=odometer, validated=None)

        def commit() -> None:
            self.runs[run.run_id] = run

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
        cap = self.cap_of(run)
        if after is not None and not run.non_confidential and amount_exceeds(after, cap):
            raise _Invalid(
                f"re-spending {key} exceeds the lifetime cap: the dataset's odometer would be "
                f"{format_exact(after)} > cap {format_exact(cap)}"
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
        if not isinstance(files, dict) or not files:
            raise _Invalid("files must be a non-empty object")
        for rel, digest in files.items():
            if not _safe_relpath(rel) or not _is_hex64(digest):
                raise _Invalid("files must map relative paths to SHA-256 hex digests")
        output = e.get("output")
        if self.policy is not None and not (isinstance(output, str) and output.startswith("/")
                                            and 0 < len(output) <= 4096 and output.isprintable()):
            raise _Invalid("output must be the absolute path the release was published to")

        def commit() -> None:
            run.outputs = dict(files)
            run.outputs_seq = e["seq"]
            run.output_path = output

        return commit

    def _check_run_finished(self, e: Mapping[str, Any]):
        run = self._running(e)
        reusable = run.reusable
        missing = [k for k in run.planned if k not in reusable]
        if missing:
            raise _Invalid(f"run finished without committing {missing[0]}")
        if self.policy is not None and not run.outputs_in_attempt():
            raise _Invalid("run finished without OUTPUTS_PUBLISHED in this attempt: a run finishes by publishing")
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
        if self.policy is not None and run.outputs_in_attempt():
            raise _Invalid(f"the attempt recorded OUTPUTS_PUBLISHED at entry {run.outputs_seq}: it finishes, it cannot fail")
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

    def _resumable(self, e: Mapping[str, Any]) -> RunState:
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
        if not _is_text(e["code_version"]):
            raise _Invalid("code_version must be a short string")
        reason = e["reason"]
        if not _is_text(reason) or not reason.strip():
            raise _Invalid("reason must be a non-empty short string")
        return run

    def _resume_commit(self, e: Mapping[str, Any], run: RunState, cap: Amount, cap_reason: str | None):
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
                    resume_reason=e["reason"],
                    orchestration=_orchestration(e),
                    re_release=e.get("re_release"),
                )
            )

        return commit

    def _check_run_resumed(self, e: Mapping[str, Any]):
        self._needs_policy()
        run = self._resumable(e)
        if run.legacy:
            raise _Invalid(f"run {e['run_id']!r} is of the first ledger format; it cannot be resumed after migration")
        if e["dataset"] != run.dataset:
            raise _Invalid(f"dataset differs from the run's RUN_STARTED (entry {run.started_seq})")
        if e["fingerprint"] != run.fingerprint:
            raise _Invalid(f"fingerprint differs from the run's RUN_STARTED (entry {run.started_seq}): other records")
        self._check_release_claims(e, run.dataset or "", run.fingerprint or "", run_id=run.run_id,
                                   declared=e.get("re_release") or run.re_release)
        cap = self.cap_of(run)
        after = self.resume_odometer(run)
        if not run.non_confidential and amount_exceeds(after, cap):
            raise _Invalid(
                f"resumed run exceeds the lifetime cap: the dataset's odometer with the run reserved "
                f"again is {format_exact(after)} > cap {format_exact(cap)}"
            )
        raised = self.dataset_states.get(run.dataset or "")
        return self._resume_commit(e, run, cap, raised.cap_reason if raised else None)

    def _check_run_resumed_v1(self, e: Mapping[str, Any]):
        """RUN_RESUMED of the first format: it carries the run's cap (kept or raised)."""
        run = self._resumable(e)
        if not _is_hex64(e["dataset_id"]):
            raise _Invalid("dataset_id is not a SHA-256 hex digest")
        if e["dataset_id"] != run.legacy_dataset_id:
            raise _Invalid(
                f"dataset_id differs from the run's RUN_STARTED (entry {run.started_seq}): other inputs"
            )
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
        return self._resume_commit(e, run, cap, cap_reason)


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


def _orchestration(e: Mapping[str, Any]) -> Orchestration | None:
    """The entry's ``orchestration`` field, checked, or None when it has none."""
    record = e.get("orchestration")
    if record is None:
        return None
    if not isinstance(record, dict) or not {"system", "flow_run_id"} <= set(record) <= _ORCHESTRATION_KEYS:
        raise _Invalid("orchestration must hold system, flow_run_id and optionally parent_flow_run_id")
    if record["system"] != "prefect":
        raise _Invalid("orchestration.system must be \"prefect\"")
    for name in ("flow_run_id", "parent_flow_run_id"):
        if name in record and not (isinstance(record[name], str) and _UUID.fullmatch(record[name])):
            raise _Invalid(f"orchestration.{name} must be a lowercase UUID")
    return Orchestration.from_record(record)


def _privacy_defn_and_kind(e: Mapping[str, Any]) -> PrivacyDefinition:
    """The entry's ``privacy_defn``, once its ``non_confidential`` is checked to be a boolean."""
    try:
        defn = PrivacyDefinition(e["privacy_defn"])
    except ValueError:
        raise _Invalid("privacy_defn must be 'zcdp' or 'puredp'") from None
    if not isinstance(e["non_confidential"], bool):
        raise _Invalid("non_confidential must be true or false")
    return defn


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


def _dataset_and_fingerprint(e: Mapping[str, Any]) -> tuple[str, str]:
    """An entry's dataset name and content fingerprint, checked for form."""
    name, fp = e["dataset"], e["fingerprint"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _Invalid("dataset is not a valid dataset name")
    if not _is_hex64(fp):
        raise _Invalid("fingerprint is not a SHA-256 hex digest")
    return name, fp


def _is_text(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= _MAX_TEXT and v.isprintable()


def _safe_relpath(rel: Any) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _apply_all(state: "LedgerState", data: bytes, on_line: Callable[[bytes], None] | None = None) -> None:
    """Apply every complete line of ``data`` to ``state``; then, if ``data`` ends in an incomplete
    line, raise :class:`TornTailError`. A broken complete entry is reported first: a torn tail is
    repairable, a broken entry is not."""
    cut = data.rfind(b"\n") + 1
    if cut:
        for line in data[: cut - 1].split(b"\n"):
            state.apply(line)
            if on_line is not None:
                on_line(line)
    if cut < len(data):
        raise TornTailError(
            f"the ledger ends in an incomplete entry ({len(data) - cut} bytes of an interrupted write, e.g. on "
            "a full disk or a killed process); nothing was drawn for it. Repair it with "
            "`phsafe ledger repair LEDGER`, which drops the incomplete bytes and records that it did",
            seq=state.size,
        )




def read_ledger(path: Path) -> LedgerState:
    """Read and fully verify the ledger at ``path``.

    Raises:
        LedgerError: naming the first entry that breaks a rule, and the rule (a
            :class:`TornTailError` if the last line is incomplete), or that the file cannot be read.
    """
    path = Path(path)
    check_ledger_file(path, write=False)
    lock = lock_path(path)
    try:
        # A shared lock, when the lock file exists, keeps a live run's append from looking torn.
        fd = os.open(lock, os.O_RDONLY) if lock.is_file() else None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)
            data = path.read_bytes()
        finally:
            if fd is not None:
                os.close(fd)
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path}: {os_reason(exc)}") from None
    state = LedgerState()
    _apply_all(state, data)
    return state


# --------------------------------------------------------------------------------------------
# The files of a ledger
# --------------------------------------------------------------------------------------------


def lock_path(path: Path) -> Path:
    """``<ledger>.lock``: the file every append holds an exclusive ``flock`` on."""
    return Path(path).with_name(Path(path).name + LOCK_SUFFIX)


def key_path(path: Path) -> Path:
    """``<ledger>.key``: the lineage key, created with the ledger, never published."""
    return Path(path).with_name(Path(path).name + KEY_SUFFIX)


def _regular(path: Path, what: str) -> os.stat_result | None:
    """``path``'s stat if it exists; a LedgerError if it is not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"{what} {path}: {os_reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise LedgerError(f"{what} {path} is {kind}; a ledger and its lock and key files are regular files")
    return st


def check_ledger_file(path: Path, *, write: bool = True) -> None:
    """Check that ``path`` is an existing ledger this process can use, touching nothing.

    The ledger must be a regular file (readable, and with ``write``: appendable and fsync-able,
    checked by opening it for appending and fsyncing it without writing); its lock file must be
    a regular file or creatable next to it. Nothing is created.

    Raises:
        LedgerError: Saying what is wrong and what to do.
    """
    path = Path(path)
    if _regular(path, "the ledger") is None:
        raise LedgerError(
            f"the ledger {path} does not exist. A ledger is created once, before any data is seen: "
            f"`phsafe ledger init {path} --lifetime-cap RHO --reason TEXT`"
        )
    lock = lock_path(path)
    lock_exists = _regular(lock, "the ledger's lock file") is not None
    try:
        if write:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if lock_exists:
                os.close(os.open(lock, os.O_RDWR))
            elif not os.access(path.parent, os.W_OK | os.X_OK):
                raise LedgerError(f"cannot create the ledger's lock file {lock}: its folder is not writable")
        else:
            os.close(os.open(path, os.O_RDONLY))
    except OSError as exc:
        raise LedgerError(f"cannot {'append to' if write else 'read'} the ledger {path}: {os_reason(exc)}") from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` (it must not exist), write ``data``, fsync it and its folder."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)


def key_id(key: bytes) -> str:
    """Identifies a lineage key without revealing it (recorded by LEDGER_INIT)."""
    return hmac.new(key, KEY_ID_DOMAIN, hashlib.sha256).hexdigest()[:32]


def read_lineage_key(path: Path, policy: Policy) -> bytes:
    """The ledger's lineage key from ``<ledger>.key``, checked against the policy's key id.

    Raises:
        LedgerError: The key file is missing, unreadable, malformed or of another ledger.
    """
    kp = key_path(path)
    if _regular(kp, "the ledger's key file") is None:
        raise LedgerError(f"the ledger's lineage key {kp} is missing; it was created with the ledger and is "
                          "kept beside it (restore it from the ledger's backup)")
    try:
        key = bytes.fromhex(kp.read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else "not hex text"
        raise LedgerError(f"cannot read the ledger's lineage key {kp}: {reason}") from None
    if len(key) != LINEAGE_KEY_BYTES or not hmac.compare_digest(key_id(key), policy.key_id):
        raise LedgerError(f"{kp} is not this ledger's lineage key (its id differs from LEDGER_INIT's)")
    return key


def lineage_commitment(key: bytes, run: RunState) -> str:
    """The keyed commitment that links a public release to its confidential inputs.

    HMAC-SHA256, under the ledger's lineage key, of the run id, the dataset, the content
    fingerprint and the input and config digests the ledger recorded. Published in the release's
    manifest: an auditor holding the key recomputes it from the ledger; without the key it
    reveals nothing and admits no test of a guessed dataset.
    """
    message = LINEAGE_DOMAIN + canonical_json({
        "run_id": run.run_id, "dataset": run.dataset, "fingerprint": run.fingerprint,
        "input_digests": run.input_digests, "config_digest": run.config_digest,
    })
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def load_signing_key(path: Path, public_key: Path | None = None) -> Any:
    """The operator's Ed25519 signing key, checked before anything is spent.

    Args:
        path: PEM file of the private key (unencrypted PKCS#8 or OpenSSH).
        public_key: The operator's public key (PEM), if given: the private key must match it.

    Raises:
        PHSafeError: The file cannot be read, is not a PEM private key, is protected by a
            passphrase, is not Ed25519, or does not match ``public_key``.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    name = Path(path).name
    flag = option("signing_key")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PHSafeError(f"cannot read the signing key {path} ({flag}): {os_reason(exc)}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise PHSafeError(f"the signing key {name} ({flag}) is protected by a passphrase; give the unencrypted "
                          "Ed25519 key (PEM), kept on a protected volume") from None
    except (ValueError, UnsupportedAlgorithm):
        raise PHSafeError(f"the signing key {name} ({flag}) is not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PHSafeError(f"the signing key {name} ({flag}) is a {type(key).__name__.removeprefix('_')}, not an "
                          "Ed25519 key; checkpoints are signed with Ed25519")
    if public_key is not None:
        try:
            pub = serialization.load_pem_public_key(Path(public_key).read_bytes())
        except (OSError, ValueError, UnsupportedAlgorithm):
            raise PHSafeError(f"the public key {Path(public_key).name} ({option('public_key')}) is not a readable "
                              "PEM public key") from None
        raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
        if not isinstance(pub, Ed25519PublicKey) or pub.public_bytes(*raw) != key.public_key().public_bytes(*raw):
            raise PHSafeError(f"the signing key {name} does not match the public key {Path(public_key).name} "
                              f"({option('public_key')}): auditors could not verify the checkpoint")
    return key


# --------------------------------------------------------------------------------------------
# Creating, repairing and migrating a ledger
# --------------------------------------------------------------------------------------------


def _policy_body(lifetime_cap: Amount, reason: str, privacy_defn: PrivacyDefinition,
                 non_confidential: bool, key: bytes, code_version: str) -> dict[str, Any]:
    reason = _clean_text(reason)
    if not reason:
        raise LedgerError("give the reason for the ledger's policy (--reason TEXT); it is recorded")
    cap = _as_amount(lifetime_cap)
    if _is_inf(cap) and not non_confidential:
        raise BudgetError("an Infinity lifetime cap is allowed only for a non-confidential ledger")
    if cap == 0:
        raise BudgetError("the lifetime cap must be positive")
    return {
        "ledger_id": uuid.uuid4().hex,
        "format": FORMAT,
        "privacy_defn": privacy_defn.value,
        "lifetime_cap": format_exact(cap),
        "reason": reason,
        "non_confidential": bool(non_confidential),
        "key_id": key_id(key),
        "code_version": _clean_text(code_version) or "unknown",
    }


def init_ledger(
    path: Path,
    *,
    lifetime_cap: Amount,
    reason: str,
    privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP,
    non_confidential: bool = False,
    code_version: str = "unknown",
) -> "Ledger":
    """Create a ledger: its lineage key ``<path>.key`` (mode 0600) and the ``LEDGER_INIT`` entry.

    The only way a ledger comes to exist. The policy -- every dataset's lifetime cap, in the
    unit of ``privacy_defn`` -- is fixed here, before any data is seen; raising a dataset's cap
    later is a ``CAP_RAISED`` entry with its own reason.

    Args:
        path: The ledger file; neither it nor its key file may exist (parent folders are made).
        lifetime_cap: Each dataset's lifetime cap (rho for zCDP, epsilon for pure DP).
        reason: Why this policy (recorded).
        privacy_defn: The unit of caps and charges.
        non_confidential: A throwaway ledger for synthetic or public data (its caps are not
            enforced, and it takes only non-confidential runs).
        code_version: Recorded.

    Raises:
        LedgerError: The ledger or its key file exists, or cannot be written.
        BudgetError: The cap is not positive, or Infinity for a confidential ledger.
    """
    path = Path(path).absolute()
    key = secrets.token_bytes(LINEAGE_KEY_BYTES)
    body = _policy_body(lifetime_cap, reason, privacy_defn, non_confidential, key, code_version)
    for p, what in ((path, "the ledger"), (key_path(path), "its key file"), (lock_path(path), "its lock file")):
        if os.path.lexists(p):
            raise LedgerError(f"{what} {p} already exists; a ledger is never created twice or overwritten")
    entry: dict[str, Any] = {"seq": 0, "prev": GENESIS_HASH, "kind": EntryKind.LEDGER_INIT.value,
                             "time": _now(), "run_id": None, **body}
    entry["hash"] = entry_hash(entry)
    LedgerState().apply(canonical_json(entry))  # the same rules as every reader applies
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_new_file(key_path(path), key.hex().encode("ascii") + b"\n", 0o600)
        try:
            _write_new_file(path, canonical_json(entry) + b"\n", 0o600)
        except BaseException:
            # Both files were created here (O_EXCL): a failed init leaves nothing behind.
            if path.exists():
                path.unlink()
            key_path(path).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise LedgerError(f"cannot create the ledger {path}: {os_reason(exc)}") from None
    return Ledger.open(path)


@dataclass(frozen=True)
class Repair:
    """What :func:`repair_ledger` did: the bytes it dropped and the entry that records it."""

    dropped_bytes: int
    dropped_sha256: str
    seq: int


def repair_ledger(path: Path, *, reason: str = "incomplete last entry dropped by phsafe ledger repair") -> Repair | None:
    """Drop an incomplete last line (an interrupted write) and record ``TAIL_REPAIRED``.

    The standard write-ahead-log recovery: every complete entry must verify; the bytes after the
    last newline are cut off (fsynced), and a ``TAIL_REPAIRED`` entry records their length and
    SHA-256. Safe because noise is drawn only after its ``INTENT`` is complete on disk.

    Returns:
        What was dropped, or None if the ledger ends in a complete entry (nothing to repair).

    Raises:
        LedgerError: The ledger is missing or unwritable, a complete entry breaks a rule (that is
            not a torn write: nothing is changed), or it holds no complete entry.
    """
    path = Path(path)
    check_ledger_file(path)
    lock_fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        data = path.read_bytes()
        if not data or data.endswith(b"\n"):
            return None
        cut = data.rfind(b"\n") + 1
        state = LedgerState()
        _apply_all(state, data[:cut])
        if state.size == 0:
            raise LedgerError("the ledger holds no complete entry (its creation was interrupted): remove it "
                              "and its key file, and run `phsafe ledger init` again")
        dropped = data[cut:]
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, cut)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise LedgerError(f"cannot repair the ledger {path}: {os_reason(exc)}") from None
    finally:
        os.close(lock_fd)
    digest = hashlib.sha256(dropped).hexdigest()
    ledger = Ledger.open(path)
    with ledger._locked():
        entry = ledger._append_entries([(EntryKind.TAIL_REPAIRED, None, {
            "dropped_bytes": len(dropped), "dropped_sha256": digest, "reason": _clean_text(reason) or "repaired",
        })])[0]
    return Repair(len(dropped), digest, entry["seq"])


def migrate_ledger(
    path: Path,
    *,
    lifetime_cap: Amount,
    reason: str,
    names: Mapping[str, str] | str,
    privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP,
    code_version: str = "unknown",
) -> "Ledger":
    """Turn a ledger of the first format into this one, in place (``LEDGER_MIGRATED``).

    Args:
        path: The ledger.
        lifetime_cap, reason, privacy_defn: The policy from now on (see :func:`init_ledger`).
        names: The dataset name of every old dataset id (a mapping; a prefix of at least 8
            hex digits of an id is enough), or one name if the ledger has one dataset.
        code_version: Recorded.

    Raises:
        LedgerError: The ledger has a policy already, its key file exists, an old dataset id has
            no name, or its runs mix confidential and non-confidential data.
    """
    path = Path(path).absolute()
    ledger = Ledger.open(path)
    if key_path(path).exists():
        raise LedgerError(f"{key_path(path)} already exists; a ledger is migrated once")
    with ledger._locked() as state:
        if state.policy is not None:
            raise LedgerError("the ledger is already of the current format; nothing to migrate")
        legacy = sorted({r.legacy_dataset_id for r in state.runs.values() if r.legacy_dataset_id})
        if isinstance(names, str):
            if len(legacy) != 1:
                raise LedgerError(f"the ledger has {len(legacy)} old datasets; name each: --map ID=NAME")
            mapping = {legacy[0]: names}
        else:
            mapping = {}
            for prefix, name in names.items():
                hits = [i for i in legacy if len(prefix) >= 8 and i.startswith(prefix.lower())]
                if len(hits) != 1:
                    raise LedgerError(f"{prefix!r} names {len(hits)} old dataset ids; give 8 or more hex digits of one")
                mapping[hits[0]] = name
            missing = [i[:16] for i in legacy if i not in mapping]
            if missing:
                raise LedgerError(f"old dataset {missing[0]} has no name; name every old dataset (--map ID=NAME)")
        flags = {r.non_confidential for r in state.runs.values()}
        if len(flags) != 1:
            raise LedgerError("the ledger mixes confidential and non-confidential runs; it cannot take one policy")
        key = secrets.token_bytes(LINEAGE_KEY_BYTES)
        body = _policy_body(lifetime_cap, reason, privacy_defn, flags.pop(), key, code_version)
        try:
            _write_new_file(key_path(path), key.hex().encode("ascii") + b"\n", 0o600)
        except OSError as exc:
            raise LedgerError(f"cannot create the lineage key {key_path(path)}: {os_reason(exc)}") from None
        try:
            ledger._append_entries([(EntryKind.LEDGER_MIGRATED, None, {**body, "datasets": mapping})])
        except BaseException:
            key_path(path).unlink(missing_ok=True)
            raise
    return ledger


# --------------------------------------------------------------------------------------------
# Durable appends
# --------------------------------------------------------------------------------------------


class Ledger:
    """An append-only privacy-loss ledger file (see the module docstring for the rules)."""

    def __init__(self, path: Path) -> None:
        """Use :meth:`open` (an existing ledger) or :func:`init_ledger` (a new one)."""
        self.path = Path(path)
        self.lock_path = lock_path(self.path)
        self._state = LedgerState()
        self._offset = 0
        self._mutex = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> "Ledger":
        """Open and verify the existing ledger at ``path`` (nothing is created but its lock file).

        Raises:
            LedgerError: The ledger does not exist, is not a usable regular file, or is broken.
        """
        check_ledger_file(Path(path))
        ledger = cls(Path(path))
        with ledger._locked():
            pass  # _locked replays everything on disk
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
            self._state, self._offset = state, sum(len(line) + 1 for line in state.lines)

    def lineage_key(self) -> bytes:
        """The ledger's lineage key (see :func:`read_lineage_key`).

        Raises:
            LedgerError: The ledger has no policy yet (first format), or the key file is bad.
        """
        policy = self._state.policy
        if policy is None:
            raise LedgerError(f"the ledger {self.path} is of the first format: migrate it (phsafe ledger migrate)")
        return read_lineage_key(self.path, policy)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[LedgerState]:
        """Hold the process lock and the file lock, with the state caught up with the file."""
        with self._mutex:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise LedgerError(f"cannot open the ledger's lock file {self.lock_path}: {os_reason(exc)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._catch_up()
                yield self._state
            finally:
                os.close(fd)  # releases the flock

    def _catch_up(self) -> None:
        """Verify and apply whatever was appended (by any process) since the last read."""
        try:
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
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {os_reason(exc)}") from None
        def advance(line: bytes) -> None:
            self._offset += len(line) + 1

        _apply_all(self._state, data, advance)

    def _reload(self) -> None:
        """Forget the in-memory state and replay the file (after a failed append)."""
        self._state, self._offset = LedgerState(), 0
        self._catch_up()

    def _append_entries(self, items: list[tuple[EntryKind, str | None, Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """Append entries atomically; must be called with the lock held (inside :meth:`_locked`).

        Every entry is checked against the rules (each after the ones before it) before anything
        is written; then all are written with one ``write`` and fsynced. If the write fails
        (``ENOSPC``, ``EFBIG``, an I/O error) the file is cut back to where it ended, so nothing
        of it stays, and a :class:`LedgerError` names the cause.
        """
        state = self._state
        lines: list[bytes] = []
        entries: list[dict[str, Any]] = []
        try:
            for kind, run_id, body in items:
                entry: dict[str, Any] = {"seq": state.size, "prev": state.head_hash, "kind": kind.value,
                                         "time": _now(), "run_id": run_id, **body}
                entry["hash"] = entry_hash(entry)
                line = canonical_json(entry)
                entries.append(state.apply(line))  # checks every rule, then updates the state
                lines.append(line)
        except BaseException:
            if lines:
                self._reload()  # the earlier entries of this batch are in memory only
            raise
        data = b"".join(line + b"\n" for line in lines)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self._reload()
            raise LedgerError(f"cannot append to the ledger {self.path}: {os_reason(exc)}") from None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as exc:
            cause = os_reason(exc)
            try:
                os.ftruncate(fd, self._offset)
                os.fsync(fd)
                left = "nothing of it was kept"
            except OSError:
                left = "the ledger may end in an incomplete entry: run `phsafe ledger repair LEDGER`"
            os.close(fd)
            fd = -1
            self._reload_quietly()
            raise LedgerError(f"could not write the ledger {self.path}: {cause}; {left}. "
                              "Free space (or fix the file system) and run again") from None
        finally:
            if fd >= 0:
                os.close(fd)
        self._offset += len(data)
        return entries

    def _reload_quietly(self) -> None:
        try:
            self._reload()
        except LedgerError:
            self._state, self._offset = LedgerState(), 0  # replayed on the next lock

    # -- datasets -----------------------------------------------------------------------------

    def _cap_raise_item(self, state: LedgerState, dataset: str, cap: Amount, reason: str | None):
        reason = _clean_text(reason or "")
        current = state.dataset_cap(dataset)
        if not amount_exceeds(cap, current):
            raise BudgetError(
                f"the lifetime cap {format_exact(cap)} does not raise dataset {dataset}'s cap "
                f"{format_exact(current)}: a cap is only ever raised"
            )
        if not reason:
            raise BudgetError(
                f"raising dataset {dataset}'s lifetime cap to {format_exact(cap)} needs a reason "
                f"({option('cap_reason')}); it is recorded in the ledger"
            )
        return (EntryKind.CAP_RAISED, None, {"dataset": dataset, "lifetime_cap": format_exact(cap), "reason": reason})

    def raise_cap(self, dataset: str, lifetime_cap: Amount, reason: str) -> dict[str, Any]:
        """Record ``CAP_RAISED``: ``dataset``'s lifetime cap becomes ``lifetime_cap``.

        Raises:
            BudgetError: The cap is not above the current one, or there is no reason.
            LedgerError: The ledger has no policy (first format) or is broken.
        """
        cap = _as_amount(lifetime_cap)
        _check_dataset_name(dataset)
        with self._locked() as state:
            self._needs_policy(state)
            return self._append_entries([self._cap_raise_item(state, dataset, cap, reason)])[0]

    def _needs_policy(self, state: LedgerState) -> Policy:
        if state.policy is None:
            raise LedgerError(
                f"the ledger {self.path} was written before ledgers had a policy; it still verifies, "
                "but takes no new run until it is migrated: `phsafe ledger migrate LEDGER "
                "--lifetime-cap RHO --reason TEXT --dataset NAME`"
            )
        return state.policy

    # -- runs -------------------------------------------------------------------------------

    def start_run(
        self,
        *,
        run_id: str,
        plan: RunPlan,
        dataset: str,
        fingerprint: str,
        config_digest: str,
        input_digests: dict[str, str],
        code_version: str,
        truncation_key_hex: str,
        non_confidential: bool = False,
        validated: bool = True,
        new_version: str | None = None,
        cap_raise: tuple[Amount, str | None] | None = None,
        re_release: str | None = None,
        orchestration: Orchestration | None = None,
    ) -> "RunRecorder":
        """Check the dataset, its version and its lifetime cap, and record RUN_STARTED, atomically.

        Under the lock, in one write: ``CAP_RAISED`` (if ``cap_raise``), ``DATASET_VERSION`` (if
        the fingerprint is new and ``new_version`` says why), ``RUN_STARTED``.

        Args:
            run_id: Unique id of the run.
            plan: Every measurement of the run.
            dataset: The declared dataset name.
            fingerprint: The keyed commitment of the records' content (see
                :mod:`phsafe.fingerprint`), under this ledger's lineage key.
            config_digest: SHA-256 of the config file.
            input_digests: Input file name -> SHA-256 of its bytes (confidential lineage).
            code_version: Version of the code that runs.
            truncation_key_hex: Key of the truncation ordering, hex.
            non_confidential: The data is synthetic or public (must match the ledger's policy).
            validated: The full input suites ran and passed before this run (recorded).
            new_version: The operator's reason, if these records are a new version of ``dataset``.
            cap_raise: ``(cap, reason)``: raise the dataset's cap first (recorded).
            re_release: The operator's reason for releasing records that another run released
                or is releasing (recorded). Ignored, and not recorded, when no other run claims
                them.
            orchestration: The flow run that runs this attempt (recorded).

        Raises:
            AlreadyReleasedError: Another run released these records, or is releasing them, and
                no ``re_release`` reason was given -- whatever room the cap leaves.
            BudgetError: The run would exceed the dataset's cap, the records are a version never
                declared (without ``new_version``) or declared under another name, Infinity
                budgets on confidential data, or a bad cap raise.
            LedgerError: The ledger is broken, of the first format, or of the other kind
                (confidential vs non-confidential).
        """
        _check_dataset_name(dataset)
        total: Amount = plan.total
        if _is_inf(total) and not non_confidential:
            raise BudgetError(
                "an Infinity (no-noise) budget is allowed only for non-production test runs on "
                f"data declared non-confidential ({option('non_confidential')})"
            )
        body = {
            "dataset": dataset,
            "fingerprint": fingerprint,
            "input_digests": {str(k): str(v).lower() for k, v in input_digests.items()},
            "config_digest": config_digest,
            "code_version": code_version,
            "truncation_key": truncation_key_hex.lower(),
            "privacy_defn": plan.privacy_defn.value,
            "planned": [_planned_item(m) for m in plan.measurements],
            "planned_total": format_exact(total),
            "non_confidential": bool(non_confidential),
            "validated": bool(validated),
        }
        with self._locked() as state:
            policy = self._needs_policy(state)
            check_ledger_kind(policy, non_confidential)
            items: list[tuple[EntryKind, str | None, Mapping[str, Any]]] = []
            cap = state.dataset_cap(dataset)
            if cap_raise is not None:
                cap = _as_amount(cap_raise[0])
                items.append(self._cap_raise_item(state, dataset, cap, cap_raise[1]))
            owner = state.fingerprints.get(fingerprint)
            if owner is not None and owner != dataset:
                raise BudgetError(
                    f"these records are already declared as dataset {owner!r} in this ledger: the same "
                    f"records cannot be released under a second name ({dataset!r}); run them as {owner!r}"
                )
            if owner is None:
                if not new_version or not _clean_text(new_version):
                    known = state.dataset_states.get(dataset)
                    seen = (f"it has {len(known.versions)} declared version(s), and these records match none"
                            if known and known.versions else "it has no declared version yet")
                    raise BudgetError(
                        f"dataset {dataset!r} has never been run on these records ({seen}). If they are a "
                        f"new version of {dataset!r}, say so and why with {option('new_version')} (recorded "
                        "in the ledger); if they belong to another dataset, run them under its name"
                    )
                items.append((EntryKind.DATASET_VERSION, None, {
                    "dataset": dataset, "fingerprint": fingerprint, "reason": _clean_text(new_version)}))
            declared = self._re_release_field(state, policy, dataset, fingerprint, re_release, besides=run_id)
            if declared:
                body["re_release"] = declared
            if orchestration is not None:
                body["orchestration"] = orchestration.record()
            spent = state.dataset_spent(dataset, policy.privacy_defn)
            probe = plan_charge(plan, policy.privacy_defn)
            need = add_amounts(spent, probe)
            if not non_confidential and amount_exceeds(need, cap):
                raise BudgetError(
                    f"privacy-loss budget refused for dataset {dataset!r}: already spent {format_exact(spent)}, "
                    f"this run plans {format_exact(probe)}, lifetime cap {format_exact(cap)} "
                    f"({_unit_name(policy.privacy_defn)}); spent + planned = {format_exact(need)} exceeds the cap. "
                    f"Spends are never refunded. To run anyway, raise the cap to at least {format_exact(need)} "
                    f"with {option('lifetime_cap')} and say why with {option('cap_reason')} (both are recorded "
                    "in the ledger)."
                )
            body.update(lifetime_cap=format_exact(cap), spent_before=format_exact(spent))
            items.append((EntryKind.RUN_STARTED, run_id, body))
            self._append_entries(items)
        return RunRecorder(self, run_id, plan)

    @staticmethod
    def _re_release_field(state: LedgerState, policy: Policy, dataset: str, fingerprint: str,
                          reason: str | None, *, besides: str, resuming: RunState | None = None) -> str | None:
        """The ``re_release`` to record, or None; refuses a second release that declares none."""
        claims = state.release_claims(dataset, fingerprint, besides=besides)
        if not claims:
            return None  # the one release of these records: nothing to declare
        reason = _clean_text(reason or "")
        if reason or policy.non_confidential or (resuming is not None and resuming.re_release):
            return reason or None
        other = claims[0]
        again = f"resuming run {besides} would release them a second time" if resuming else "a content version is released once"
        if other.published:
            told = (f"these records were already released: run {other.run_id} published them to "
                    f"{other.output_path or 'its output folder'} (entry {other.outputs_seq})")
        else:
            told = (f"run {other.run_id} on these records is still open (started at entry {other.started_seq}; "
                    f"running, or crashed without ending): resume it ({option('resume')}) instead")
        raise AlreadyReleasedError(
            f"{told}; {again}, whatever room the lifetime cap leaves. To release the same records again, "
            f"declare it and say why with {option('re_release')} (recorded in the ledger; the cap still applies)"
        )

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
        dataset: str,
        fingerprint: str,
        code_version: str,
        reason: str,
        cap_raise: tuple[Amount, str | None] | None = None,
        plan: RunPlan | None = None,
        re_release: str | None = None,
        orchestration: Orchestration | None = None,
    ) -> "RunRecorder":
        """Record RUN_RESUMED for a failed or crashed run and return its recorder, atomically.

        The run is running again, as attempt ``n + 1``. Its plan is the one recorded at start:
        the returned recorder spends from it, and :attr:`RunState.reusable` (see :meth:`run`)
        says which measurements may be released from their stored vectors instead of spent again.
        Everything else is spent again through the recorder and charged again.

        Args:
            run_id: The run to resume.
            config_digest: SHA-256 of the config file; must be the run's.
            dataset, fingerprint: Must be the run's (the same records).
            code_version: Version of the code that resumes (may differ from the start's; recorded).
            reason: Why the run is resumed (non-empty; recorded, one line of at most 500
                characters).
            cap_raise: ``(cap, reason)``: raise the dataset's cap first (recorded, same write).
            plan: The plan the caller computed from the config, if any. It is only checked: it
                must record exactly as the run's recorded plan (same measurements, budgets,
                sensitivities, cells and variances, same order), so that code that would now plan
                differently cannot reuse the old measurements. The recorder always uses the
                recorded plan.
            re_release: Why the run releases records that another run released or is releasing
                (recorded; see :meth:`start_run`).
            orchestration: The flow run that runs this attempt (recorded).

        Raises:
            AlreadyReleasedError: Another run released these records, or is releasing them, and
                neither this resume nor the run's start declared a re-release.
            LedgerError: The run is unknown, finished or of the first format, the config, the
                dataset, the records or ``plan`` differ from the run's, ``reason`` is empty, or
                the ledger is broken. Nothing is appended.
            BudgetError: A bad cap raise, or the dataset's odometer with the run reserved again
                would exceed its cap. Nothing is appended.
        """
        reason = _clean_text(reason)
        if not reason:
            raise LedgerError(f"give the reason for resuming run {run_id} ({option('resume_reason')}); it is recorded")
        with self._locked() as state:
            policy = self._needs_policy(state)
            run = state.runs.get(run_id)
            if run is None:
                raise LedgerError(f"cannot resume run {run_id}: it was never started in this ledger")
            if run.status is RunStatus.FINISHED:
                raise LedgerError(
                    f"cannot resume run {run_id}: it finished at entry {run.terminal_seq} and published to "
                    f"{run.output_path or 'its output folder'}; a finished run is never resumed"
                )
            if run.legacy:
                raise LedgerError(f"cannot resume run {run_id}: it was started before the ledger was migrated")
            if config_digest != run.config_digest:
                raise LedgerError(
                    f"cannot resume run {run_id}: the config differs from the one it started with "
                    f"(SHA-256 {config_digest[:16]}, recorded {run.config_digest[:16]}); reused "
                    "measurements would be inconsistent -- start a new run instead"
                )
            if dataset != run.dataset:
                raise LedgerError(f"cannot resume run {run_id}: it was started as dataset {run.dataset!r}, "
                                  f"not {dataset!r}")
            if fingerprint != run.fingerprint:
                raise LedgerError(
                    f"cannot resume run {run_id}: the input records differ from the ones it started with "
                    "(another content version); start a new run instead"
                )
            if plan is not None:
                self._check_same_plan(run, plan)
            # One release per content version comes first: refused whatever room the cap has.
            declared = self._re_release_field(state, policy, dataset, fingerprint, re_release, besides=run_id,
                                              resuming=run)
            items: list[tuple[EntryKind, str | None, Mapping[str, Any]]] = []
            cap = state.cap_of(run)
            if cap_raise is not None:
                cap = _as_amount(cap_raise[0])
                items.append(self._cap_raise_item(state, run.dataset or "", cap, cap_raise[1]))
            after = state.resume_odometer(run)
            if not run.non_confidential and amount_exceeds(after, cap):
                raise BudgetError(
                    f"privacy-loss budget refused: resuming run {run_id} reserves its whole plan again, "
                    f"so dataset {run.dataset!r} would have spent {format_exact(after)} "
                    f"({_unit_name(policy.privacy_defn)}), above the lifetime cap {format_exact(cap)}. "
                    "Spends are never refunded. To resume anyway, raise the cap to at least "
                    f"{format_exact(after)} (plus the budget of every measurement that must be spent "
                    f"again) with {option('lifetime_cap')} and say why with {option('cap_reason')} (both "
                    "are recorded)."
                )
            resumed_body: dict[str, Any] = {
                "config_digest": config_digest, "dataset": dataset, "fingerprint": fingerprint,
                "code_version": code_version, "reason": reason,
            }
            if declared and declared != run.re_release:
                resumed_body["re_release"] = declared
            if orchestration is not None:
                resumed_body["orchestration"] = orchestration.record()
            items.append((EntryKind.RUN_RESUMED, run_id, resumed_body))
            self._append_entries(items)
            resumed = state.runs[run_id]
            attempt = resumed.attempt
            recorded = RunPlan(resumed.privacy_defn, tuple(s.measurement for s in resumed.planned.values()))
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

    def checkpoint(self, signing_key: Any = None) -> dict[str, Any]:
        """Size and head hash of the ledger now, signed with an Ed25519 key if given.

        Args:
            signing_key: An ``Ed25519PrivateKey`` (see :func:`load_signing_key`), a path to its
                PEM file, or None for an unsigned checkpoint.

        Returns:
            ``{"ledger_size", "head_hash", "signature", "public_key"}``; the signature is
            base64 over :func:`checkpoint_message`, the public key PEM text (both None unsigned).
        """
        with self._locked() as state:
            size, head = state.size, state.head_hash
        signature = public_pem = None
        if signing_key is not None:
            from cryptography.hazmat.primitives import serialization

            key = load_signing_key(signing_key) if isinstance(signing_key, (str, Path)) else signing_key
            signature = base64.b64encode(key.sign(checkpoint_message(size, head))).decode("ascii")
            public_pem = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ).decode("ascii")
        return {"ledger_size": size, "head_hash": head, "signature": signature, "public_key": public_pem}


def plan_charge(plan: RunPlan, unit: PrivacyDefinition) -> Amount:
    """What a plan reserves against its dataset, in a ledger's unit (before any re-spend)."""
    total: Amount = Fraction(0)
    for m in plan.measurements:
        total = add_amounts(total, _convert(_as_amount(m.budget), plan.privacy_defn, unit))
    return total


def _check_dataset_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LedgerError(
            f"{name!r} is not a dataset name ({option('dataset')}): letters, digits, '.', '_' and '-', "
            "at most 128, starting with a letter or digit (e.g. cef2020-us)"
        )


def check_ledger_kind(policy: Policy, non_confidential: bool) -> None:
    """A confidential ledger takes only confidential runs; a throwaway one only non-confidential ones.

    Raises:
        LedgerError: Saying which ledger the run needs.
    """
    if policy.non_confidential and not non_confidential:
        raise LedgerError(
            "this ledger was created for non-confidential (synthetic) data; a run on confidential data "
            f"needs a ledger made with `phsafe ledger init` without --non-confidential ({option('ledger')})"
        )
    if non_confidential and not policy.non_confidential:
        raise LedgerError(
            "this ledger is for confidential data; a run declared non-confidential must use its own "
            f"throwaway ledger ({option('ledger')}), so that it cannot sidestep a production cap"
        )


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
                re-spend that would take the dataset's odometer above its lifetime cap.
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
            cap = state.cap_of(run)
            if after is not None and not run.non_confidential and amount_exceeds(after, cap):
                previous = run.intents[key]
                raise BudgetError(
                    f"privacy-loss budget refused: re-spending {key} in run {self.run_id} (attempt "
                    f"{run.attempt}; spent {len(previous)} time(s) before, last at entry {previous[-1]}) "
                    f"would take dataset {run.account!r} to spent {format_exact(after)}, above its "
                    f"lifetime cap {format_exact(cap)}. Spends are never refunded. To spend it again, "
                    f"resume the run with the cap raised to at least {format_exact(after)} "
                    f"({option('lifetime_cap')}) and the reason ({option('cap_reason')}); both are recorded."
                )
            rec = run.planned[key].record
            entry = self._ledger._append_entries([(
                EntryKind.INTENT, self.run_id,
                {"key": key, "budget": rec["budget"], "sensitivity": rec["sensitivity"], "n_cells": rec["n_cells"]},
            )])[0]
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
            self._ledger._append_entries([(
                EntryKind.COMMITTED, self.run_id,
                {"key": receipt.measurement_key, "intent_seq": receipt.sequence,
                 "intent_hash": receipt.entry_hash, "noisy_digest": noisy_digest},
            )])

    def record_published(self, file_digests: Mapping[str, str], output: Path) -> None:
        """Record that the release is in place: ``OUTPUTS_PUBLISHED`` and ``RUN_FINISHED``, in one write.

        Called only after the release folder was renamed into place, so the ledger never says a
        release exists that does not.

        Args:
            file_digests: Relative path -> SHA-256 of every released file.
            output: Where the release was published (absolute path).
        """
        files = {str(k): str(v).lower() for k, v in file_digests.items()}
        with self._ledger._locked() as state:
            run = self._current(state)
            spent = run.charge()
            self._ledger._append_entries([
                (EntryKind.OUTPUTS_PUBLISHED, self.run_id, {"files": files, "output": str(Path(output).absolute())}),
                (EntryKind.RUN_FINISHED, self.run_id, {"spent": format_exact(spent)}),
            ])

    def fail(self, reason: str) -> None:
        """Record that the run failed; a no-op if it already ended or was resumed since.

        Args:
            reason: A short, fixed, safe message (never data); cut to one line of 500 characters.
        """
        with self._ledger._locked() as state:
            run = self._run(state)
            if run.status is not RunStatus.RUNNING or run.attempt != self.attempt or run.outputs_in_attempt():
                # Ended, published, or a later attempt owns the run now: failing it would be a lie.
                return
            spent = run.intended_total()
            self._ledger._append_entries([(
                EntryKind.RUN_FAILED, self.run_id,
                {"spent": format_exact(spent), "reason": _clean_text(reason) or "unspecified failure"},
            )])

    def checkpoint(self, signing_key: Any = None) -> dict[str, Any]:
        """See :meth:`Ledger.checkpoint`."""
        return self._ledger.checkpoint(signing_key)
