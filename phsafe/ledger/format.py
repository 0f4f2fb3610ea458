"""The ledger's format: its specification, canonical JSON, hashing, entry kinds, line parsing.

The privacy-loss ledger is an append-only, hash-chained, durable record of every spend. This
docstring is its specification; the rules it states are checked by :mod:`phsafe.ledger.rules`
(and :mod:`phsafe.ledger.first_format` for ledgers of the first format), applied by
:mod:`phsafe.ledger.replay`, and the files are handled by :mod:`phsafe.ledger.store`.

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
    ``LOG_BOUND`` (binds its public log to a ledger of format 2, see "The public log"),
    ``CAP_RAISED``, ``DATASET_VERSION``, ``TAIL_REPAIRED``. Run entries: ``RUN_STARTED``,
    ``INTENT``, ``COMMITTED``, ``OUTPUTS_PUBLISHED``, ``RUN_FINISHED``, ``RUN_FAILED``,
    ``RUN_RESUMED``.

Policy, datasets and versions
    A ledger is created only by ``phsafe ledger init`` (:func:`~phsafe.ledger.admin.init_ledger`),
    before any data is seen. Its ``LEDGER_INIT`` entry fixes the policy: the privacy definition
    whose unit every cap and charge is counted in (rho for zCDP, epsilon for pure DP), the lifetime
    cap of every dataset of the ledger, the reason, whether the ledger is a throwaway one for
    non-confidential (synthetic) data, the ledger id, and the id of its *lineage key* -- 32 random
    bytes created with the ledger in ``<ledger>.key`` (mode 0600), never published. Every keyed
    commitment of the ledger (content fingerprints, release lineage) is an HMAC under that key, so
    an auditor holding it can check lineage and nobody else can test guesses against what is
    published.

    Every run names its *dataset* (e.g. ``cef2020-us``). The lifetime cap is per dataset: every
    spend on any content version under that name counts against it. A dataset's content
    versions are told apart by their content fingerprint (:mod:`phsafe.fingerprint`, committed
    under the lineage key); a ``DATASET_VERSION`` entry (name, fingerprint, reason) declares
    one, and the operator must ask for it (a version never seen under a name is refused
    otherwise). A fingerprint declared under one name can never be declared under another: the
    same records cannot be released under a second name. ``CAP_RAISED`` (name, new cap, reason)
    raises one dataset's cap above the policy cap; caps are never lowered.

Overlap between datasets
    A ``DATASET_VERSION`` of a confidential ledger may carry ``sketch``: a keyed sketch of the
    version's person records (:mod:`phsafe.overlap`: the number of records and sorted 48-bit
    HMAC tags, under the lineage key, of a consistent sample of them), recorded by every run that
    declares a version. Its estimated share of records that another dataset's declared versions
    also hold must not exceed 1% (:data:`phsafe.overlap.OVERLAP_LIMIT`) -- else the records are a
    version of that dataset and run under its name and cap -- unless the entry carries
    ``overlap``: ``{"dataset": the other dataset with the largest share, "share": that share in
    percent, "reason": why these records are another dataset, e.g. a disjoint population}``. An
    ``overlap`` where no share exceeds the limit is refused, as is one that names another
    dataset or share than the sketches give: the ledger records a relation exactly when there is
    one. The sketches are confidential like the fingerprints: never published.

    ``LEDGER_INIT`` may also fix ``ledger_cap``: a cap on the spends of all the ledger's datasets
    together (their odometers summed), checked wherever a dataset's cap is -- a run's start, a
    resume, a re-spend. Unlike a dataset's cap it is never raised.

The public log
    A ledger of this format (3) is bound to its public privacy-loss log from its first entry:
    ``LEDGER_INIT`` carries ``public_log``, ``{"origin": the log's name, "vkey": its verifier key,
    "witnesses": [the verifier key of every witness], "quorum": how many of them must cosign}``
    (no witness: ``[]`` and 0). The ledger appends nothing unless a follower with exactly that
    binding is attached (:meth:`~phsafe.ledger.store.LedgerFile.add_follower`: the public log,
    :mod:`phsafe.publog`, which refuses to attach when its folder, its key or its witness list is
    missing or is another's) -- so a ledger copied without its log, or with its witnesses
    removed, spends nothing. The ledger itself reads no log file: it only compares bindings.
    Ledgers of format 2 (made before the binding) verify as they are, but take no entry other
    than ``TAIL_REPAIRED`` until ``phsafe ledger migrate`` appends ``LOG_BOUND`` (``public_log``
    and a ``reason``); from then on they are of format 3. A ledger migrated from the first format
    has no public log (its first runs cannot be projected) and needs none.

    ``RUN_FAILED`` of format 3 carries ``code``, the reason's kind from :data:`FAILURE_CODES`, and
    ``stage``: ``measure`` while a planned measurement of the attempt is not committed,
    ``release`` once all are (writing, checking and publishing the release). The public log gets
    these two; ``reason``, the operator's message (it may name enclave paths), stays here.

The datasets a ledger accounts, and their retirement
    ``LEDGER_INIT`` may carry ``datasets``: the sorted, distinct names of the datasets the ledger
    accounts (``phsafe ledger init --dataset NAME``). It is public (the log's ``policy`` entry),
    and it is what the log's witnesses read from its registration: a witness refuses a second log
    whose policy names a dataset it witnesses under another log (``docs/public_log.md``, "One log
    per dataset"). A ledger that declares its datasets takes no ``CAP_RAISED``,
    ``DATASET_VERSION``, ``RUN_STARTED`` or ``RUN_RESUMED`` of another dataset; the list is
    never extended (a witness cannot see a later entry: a new dataset gets a ledger of its own). A
    ledger made before declarations (no ``datasets``) accounts any dataset, as it always did.

    ``DATASET_RETIRED`` (``dataset``, ``reason``, and optionally ``successor``: the ``origin`` and
    8-hex-digit ``key_id`` of the log that accounts it from now on) ends the ledger's accounting
    of a dataset it accounts, for good: no later ``CAP_RAISED``, ``DATASET_VERSION``,
    ``RUN_STARTED`` or ``RUN_RESUMED`` of it; it is refused while a run of the dataset is open
    (running, or crashed without a terminal entry), since an open run can still spend. Its public
    entry, proven in the log, is what lets another log claim the dataset at the witnesses.

Write-ahead spends
    Every append happens under an exclusive ``flock`` on the sibling ``<ledger>.lock`` file: the
    writer reads (and verifies) whatever other processes appended since it last looked, appends its
    lines with one write, ``fsync``\\ s the file, and only then releases the lock and returns.
    :func:`phsafe.noise.measure` draws noise only after
    :meth:`~phsafe.ledger.runs.RunRecorder.record_intent` returned, so a spend is on disk before its
    noise exists. Within one process a :class:`~phsafe.ledger.runs.Ledger` object also holds a
    thread mutex around the same section, so recorders used from many threads (one per measurement
    task) append one at a time.

    A write that fails (a full disk: ``ENOSPC``) is rolled back to the previous end of the file
    before the error is raised, so the ledger never keeps a partial entry of a live process. A
    process killed in the middle of a write can still leave a torn last line; the ledger then
    refuses every use until ``phsafe ledger repair`` (:func:`~phsafe.ledger.admin.repair_ledger`)
    truncates the torn tail and records ``TAIL_REPAIRED`` with the length and SHA-256 of the dropped
    bytes -- stated first in a record beside the ledger, ``<ledger>.repair``, synced before the cut
    (while it exists the ledger takes no other entry; a stop at any step is finished by running the
    repair again, so the cut is never without its record). That is safe: noise is drawn only after its ``INTENT`` is complete on disk, so a torn
    ``INTENT`` drew nothing, and a torn ``COMMITTED`` leaves its ``INTENT`` uncommitted, to be spent
    again.

Runs, attempts and publication
    ``RUN_STARTED`` records the dataset, its fingerprint, the plan (every table x level: budget,
    Delta, tau, variance, cells), the config and input file digests (confidential lineage), the
    truncation key, whether the inputs were validated, and the dataset's odometer and cap at start.
    Two optional fields (absent when null; never written as null): ``orchestration``, the
    orchestrator's identity of the attempt (``{"system": "prefect", "flow_run_id": UUID,
    "parent_flow_run_id": UUID}``, the parent only for a subflow), by which a retried flow run finds
    the runs it started; and ``re_release`` (see "One release per content version"). ``RUN_RESUMED``
    may carry both too, for the attempt it opens. A run publishes by staging its release, renaming
    it into place, and only then recording ``OUTPUTS_PUBLISHED`` (the released files' digests and
    where they went) and ``RUN_FINISHED``: the ledger never says a release exists that does not.

    A run whose status is failed (it recorded ``RUN_FAILED``) or running (no terminal entry: it is
    running or it crashed) can be resumed by a ``RUN_RESUMED`` entry
    (:meth:`~phsafe.ledger.runs.Ledger.resume_run`); a finished run never can. ``RUN_RESUMED``
    records the config digest, dataset and fingerprint, which must equal the run's (the same config
    and records: otherwise reused measurements would be inconsistent with new ones), the
    ``code_version`` that resumes and the operator's ``reason``. Its attempt number is 1 + its
    number of ``RUN_RESUMED`` entries, and the earlier attempts stay in the history.

    A measurement (planned key) has at most one ``INTENT`` per attempt: a further ``INTENT`` of a
    key is valid only if a ``RUN_RESUMED`` of its run lies between the key's previous ``INTENT`` and
    the new one. A ``COMMITTED`` refers to its key's latest ``INTENT`` (``intent_seq`` and
    ``intent_hash``) and must be in the same attempt; each attempt publishes outputs at most once
    and spends nothing after that. A key whose latest ``INTENT`` is committed is *reusable*: a
    resumed attempt releases the noisy vector it stored, checked against the ``COMMITTED`` digest,
    instead of drawing noise again. Anything else -- an ``INTENT`` without ``COMMITTED`` (its noise
    may have been drawn and lost) or a committed vector that is missing or corrupt -- is spent again
    by a new ``INTENT``, charged again. Noise is never re-drawn without a new spend. A resumed
    attempt must tabulate with the run's recorded truncation key
    (:attr:`~phsafe.ledger.state.RunState.truncation_key`). A
    :class:`~phsafe.ledger.runs.RunRecorder` belongs to one attempt: once the run is resumed,
    recorders of earlier attempts (a worker thought dead) are refused.

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
    * any other run -- finished, still running, or crashed without a terminal entry:

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
    Ledgers written before policies existed (first entry ``RUN_STARTED``; datasets identified by the
    SHA-256 of their input files; a cap per run) still verify under the rules they were written
    with, but take no new run until ``phsafe ledger migrate``
    (:func:`~phsafe.ledger.admin.migrate_ledger`) appends ``LEDGER_MIGRATED``: the policy (as
    ``LEDGER_INIT`` records it), a fresh lineage key, and the name of every old dataset id, so that
    the old runs' charges count against the named datasets from then on. The hash chain runs on
    unbroken, so the old history stays verifiable.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from datetime import datetime, timezone
from typing import Any, Mapping

from phsafe.accounting import PlannedMeasurement
from phsafe.amounts import format_exact
from phsafe.config import PrivacyDefinition
from phsafe.errors import LedgerError, LedgerRuleViolation
from phsafe.sensitivity import SensitivityBound

ENTRY_DOMAIN = b"phsafe-ledger-entry-v1\x00"
CHECKPOINT_DOMAIN = b"phsafe-ledger-checkpoint-v1\x00"
DATASET_DOMAIN = b"phsafe-dataset-v1\x00"
GENESIS_HASH = "0" * 64
FORMAT = 3
"""The ledger format that LEDGER_INIT and LEDGER_MIGRATED write now: 1 had no genesis, 2 no
binding to its public log (``LOG_BOUND`` brings a ledger of format 2 to 3)."""
FORMATS = (2, 3)
"""The formats a LEDGER_INIT or LEDGER_MIGRATED may state."""

FAILURE_CODES = (
    "interrupted",          # a stop request (Ctrl-C, SIGTERM, a cancelled flow run)
    "witness-unreachable",  # too few of the public log's witnesses answered
    "witness-refused",      # the witnesses refused the log: a copied or rolled-back ledger
    "budget-refused",       # a re-spend the cap does not admit
    "ledger-error",         # the ledger or its public log could not be written or read
    "outputs-invalid",      # the release failed its output validation
    "output-exists",        # the output folder holds something else
    "storage-error",        # a file system refused a write (space, permissions, I/O)
    "refused",              # another check refused the run (a key, a setting)
    "internal-error",       # a defect of this code
)
"""The kinds of failure a RUN_FAILED of format 3 names publicly (``code``)."""
FAILURE_STAGES = ("measure", "release")
"""Where an attempt failed (``stage``): before all its measurements were committed, or after."""


class EntryKind(str, enum.Enum):
    """The kind of a ledger entry (its ``kind`` field)."""

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
    LOG_BOUND = "LOG_BOUND"
    DATASET_RETIRED = "DATASET_RETIRED"


LEDGER_KINDS = frozenset({EntryKind.LEDGER_INIT, EntryKind.LEDGER_MIGRATED, EntryKind.CAP_RAISED,
                          EntryKind.DATASET_VERSION, EntryKind.TAIL_REPAIRED, EntryKind.LOG_BOUND,
                          EntryKind.DATASET_RETIRED})
"""Entries about the ledger or a dataset, not a run: their ``run_id`` is null."""


# --------------------------------------------------------------------------------------------
# Canonical encoding and hashing
# --------------------------------------------------------------------------------------------

HEX64 = re.compile(r"[0-9a-f]{64}")
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
MAX_TEXT = 500
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, UTF-8, no floats (exact numbers are strings)."""
    _reject_floats(obj)
    return _encode_canonical(obj)


def _encode_canonical(obj: Any) -> bytes:
    """Canonical JSON of an object already known to hold no float: what :func:`parse_line`
    decoded (its decoder refuses floats and JSON keys are strings), so not walked again."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


_SCALARS = frozenset({str, int, bool, type(None)})


def _reject_floats(obj: Any) -> None:
    # Exact types first, and no call for a scalar (a public log projects every entry); then the
    # same checks, in the same order, for subclasses.
    kind = type(obj)
    if kind in _SCALARS:
        return
    if kind is dict:
        for k, v in obj.items():
            if type(k) is not str and not isinstance(k, str):
                raise TypeError("ledger object keys must be strings")
            if type(v) not in _SCALARS:
                _reject_floats(v)
        return
    if kind is list or kind is tuple:
        for v in obj:
            if type(v) not in _SCALARS:
                _reject_floats(v)
        return
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


def _parsed_entry_hash(entry: Mapping[str, Any]) -> str:
    """:func:`entry_hash` of an entry :func:`parse_line` decoded (no float to look for)."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(ENTRY_DOMAIN + _encode_canonical(body)).hexdigest()


def checkpoint_message(ledger_size: int, head_hash: str) -> bytes:
    """The bytes an Ed25519 checkpoint signature covers."""
    return CHECKPOINT_DOMAIN + canonical_json({"head_hash": head_hash, "ledger_size": ledger_size})


def dataset_id(input_digests: Mapping[str, str]) -> str:
    """SHA-256 over the sorted input file digests (names are not part of a dataset's identity)."""
    digests = sorted(input_digests.values())
    return hashlib.sha256(DATASET_DOMAIN + "\n".join(digests).encode("ascii")).hexdigest()


def now() -> str:
    """The time field of a new entry: UTC, microseconds, ``Z``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------------------------
# The fields of each entry kind
# --------------------------------------------------------------------------------------------

COMMON_FIELDS = frozenset({"seq", "prev", "kind", "time", "run_id", "hash"})
POLICY_FIELDS = frozenset({"ledger_id", "format", "privacy_defn", "lifetime_cap", "reason", "non_confidential",
                           "key_id", "code_version"})
BODY_FIELDS: dict[EntryKind, frozenset[str]] = {
    EntryKind.LEDGER_INIT: POLICY_FIELDS,
    EntryKind.LEDGER_MIGRATED: POLICY_FIELDS | {"datasets"},
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
    EntryKind.RUN_FAILED: frozenset({"spent", "reason", "code", "stage"}),
    EntryKind.RUN_RESUMED: frozenset({"config_digest", "dataset", "fingerprint", "code_version", "reason"}),
    EntryKind.LOG_BOUND: frozenset({"public_log", "reason"}),
    EntryKind.DATASET_RETIRED: frozenset({"dataset", "reason"}),
}
FORMAT_2_BODY_FIELDS: dict[EntryKind, frozenset[str]] = {
    EntryKind.RUN_FAILED: frozenset({"spent", "reason"}),
}
"""Entries of format 2 (before the public log was bound) whose fields differ."""
LOG_BINDING_FIELDS = frozenset({"origin", "vkey", "witnesses", "quorum"})
"""The fields of ``public_log`` (LEDGER_INIT of format 3, LOG_BOUND)."""
SUCCESSOR_FIELDS = frozenset({"origin", "key_id"})
"""The fields of DATASET_RETIRED's ``successor``: the log that accounts the dataset from now on
(its origin and the key ID of its verifier key, 8 hex digits)."""
FIRST_FORMAT_BODY_FIELDS: dict[EntryKind, frozenset[str]] = {
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
OPTIONAL_FIELDS: dict[EntryKind, frozenset[str]] = {
    EntryKind.LEDGER_INIT: frozenset({"ledger_cap", "public_log", "datasets"}),
    EntryKind.DATASET_VERSION: frozenset({"sketch", "overlap"}),
    EntryKind.RUN_STARTED: frozenset({"orchestration", "re_release"}),
    EntryKind.RUN_RESUMED: frozenset({"orchestration", "re_release"}),
    EntryKind.DATASET_RETIRED: frozenset({"successor"}),
}
"""Fields an entry may leave out (absent means null; a present one is never null). LEDGER_INIT
of format 3 must have ``public_log`` and of format 2 must not (:mod:`phsafe.ledger.rules`)."""
ORCHESTRATION_FIELDS = frozenset({"system", "flow_run_id", "parent_flow_run_id"})
PLANNED_FIELDS = frozenset(
    {"key", "table", "level", "budget", "sensitivity", "tau", "n_cells", "distribution",
     "noise_parameter", "variance"}
)
"""The fields of each item of RUN_STARTED's ``planned`` list."""
PLANNED_OPTIONAL_FIELDS = frozenset({"sensitivity_bound"})
"""Fields a planned item may have besides: ``sensitivity_bound`` is written only for a run whose
noise is calibrated to the exact sensitivities (``"exact"``; absent means the paper's 2*tau+2 and
2), and then ``sensitivity`` is the proven one, an integer or ``"sqrt(N)"``
(:mod:`phsafe.sensitivity`)."""


def _variance_text(m: PlannedMeasurement) -> str:
    # repr of the float the outputs report in VARIANCE (shortest round-trip text).
    return repr(m.variance)


def _noise_parameter(m: PlannedMeasurement) -> str | None:
    if m.is_noiseless:
        return None
    if m.privacy_defn is PrivacyDefinition.ZCDP:
        return format_exact(m.gaussian_sigma_squared)
    return format_exact(m.geometric_scale)


def planned_item(m: PlannedMeasurement) -> dict[str, Any]:
    """One item of RUN_STARTED's ``planned`` list: how the ledger records a planned measurement."""
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
        **({"sensitivity_bound": m.bound.value} if m.bound is not SensitivityBound.PAPER else {}),
    }


# --------------------------------------------------------------------------------------------
# Field values
# --------------------------------------------------------------------------------------------


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_hex64(v: Any) -> bool:
    return isinstance(v, str) and HEX64.fullmatch(v) is not None


def is_text(v: Any) -> bool:
    """A short single-line text field (at most :data:`MAX_TEXT` printable characters)."""
    return isinstance(v, str) and 0 < len(v) <= MAX_TEXT and v.isprintable()


def is_safe_relpath(rel: Any) -> bool:
    """A relative path inside a release folder (no ``..``, no absolute path, ``/`` separators)."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def clean_text(text: str) -> str:
    """A single printable line of at most 500 characters (what the ledger accepts).

    For the package's own fixed messages (a failure's reason); an operator's text goes through
    :func:`operator_text`, which refuses what is too long instead of cutting it."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in str(text)).strip()
    return cleaned[:MAX_TEXT]


def operator_text(text: str | None, what: str) -> str:
    """An operator's reason as the ledger records it: one printable line (other characters
    become spaces); "" when none. ``what`` names it in the refusal (``--cap-reason``).

    Raises:
        LedgerError: It is longer than :data:`MAX_TEXT` characters: refused, never cut.
    """
    cleaned = "".join(ch if ch.isprintable() else " " for ch in str(text or "")).strip()
    if len(cleaned) > MAX_TEXT:
        raise LedgerError(f"{what} is {len(cleaned)} characters long; the ledger records at most {MAX_TEXT} "
                          "(never cut): shorten it")
    return cleaned


# --------------------------------------------------------------------------------------------
# Parsing one line
# --------------------------------------------------------------------------------------------


def parse_line(line: bytes, *, seq: int, prev: str, format: int) -> dict[str, Any]:
    """Decode one line (without its newline) and check its encoding and chain fields.

    Args:
        line: The line's bytes.
        seq: The sequence number the entry must have (the number of entries before it).
        prev: The hash of the previous entry (:data:`GENESIS_HASH` for the first).
        format: The ledger's format so far (1: no policy yet; 2: no bound public log; 3): the
            entries have the fields of :data:`FIRST_FORMAT_BODY_FIELDS` (format 1, and no
            optional field) or :data:`FORMAT_2_BODY_FIELDS` (format 2) where they differ.

    Raises:
        LedgerError: naming the entry and what is wrong with it.
    """
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
        if _encode_canonical(entry) != line:
            raise LedgerRuleViolation("not in canonical JSON form (sorted keys, no whitespace)")
        try:
            kind_enum = EntryKind(kind_text)
        except ValueError:
            raise LedgerRuleViolation(f"unknown kind {kind_text!r}") from None
        policy_entry = kind_enum in (EntryKind.LEDGER_INIT, EntryKind.LEDGER_MIGRATED)  # sets the format itself
        expected = COMMON_FIELDS | body_fields(kind_enum, format=FORMAT if policy_entry else format)
        optional = frozenset() if format == 1 and not policy_entry else OPTIONAL_FIELDS.get(kind_enum, frozenset())
        for name in optional & set(entry):
            if entry[name] is None:
                raise LedgerRuleViolation(f"{name} is null: an optional field is left out, never written as null")
        if set(entry) - optional != expected:
            missing = sorted(expected - set(entry))
            extra = sorted(set(entry) - expected - optional)
            raise LedgerRuleViolation(f"wrong fields (missing {missing}, unexpected {extra})")
        if entry["seq"] != seq or not is_int(entry["seq"]):
            raise LedgerRuleViolation(f"sequence number is {entry['seq']!r}, expected {seq}")
        if entry["prev"] != prev:
            raise LedgerRuleViolation("prev does not match the hash of the previous entry")
        if not isinstance(entry["hash"], str) or entry["hash"] != _parsed_entry_hash(entry):
            raise LedgerRuleViolation("hash does not match the entry's content")
        if not isinstance(entry["time"], str) or not TIME.fullmatch(entry["time"]):
            raise LedgerRuleViolation("time is not a UTC timestamp YYYY-MM-DDTHH:MM:SS.ffffffZ")
        try:
            datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        except ValueError:
            raise LedgerRuleViolation("time is not a valid date and time") from None
        if kind_enum in LEDGER_KINDS:
            if entry["run_id"] is not None:
                raise LedgerRuleViolation("run_id must be null: the entry is about the ledger, not a run")
        elif not isinstance(entry["run_id"], str) or not RUN_ID.fullmatch(entry["run_id"]):
            raise LedgerRuleViolation("run_id is not a valid run id")
    except LedgerRuleViolation as exc:
        raise LedgerError(str(exc), seq=seq, kind=kind) from None
    return entry


def body_fields(kind: EntryKind, *, format: int = FORMAT) -> frozenset[str]:
    """The body fields an entry of ``kind`` has (besides :data:`COMMON_FIELDS`) in a ledger of
    ``format``."""
    if format == 1 and kind in FIRST_FORMAT_BODY_FIELDS:
        return FIRST_FORMAT_BODY_FIELDS[kind]
    if format <= 2 and kind in FORMAT_2_BODY_FIELDS:
        return FORMAT_2_BODY_FIELDS[kind]
    return BODY_FIELDS[kind]


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
