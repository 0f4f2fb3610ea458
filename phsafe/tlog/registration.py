"""A log's registration with its witnesses: which datasets it accounts, proven from its own entries (pure).

A witness sees checkpoints, never entries. To keep one log per dataset it must still learn which
datasets a log accounts, from something it can check with the log's key alone: the log's first
entry -- its ``policy``, which names the datasets the log accounts (``datasets``, fixed when the
ledger is made) -- with an inclusion proof at index 0 into a checkpoint signed by the log's key.
A witness that accepts a registration keeps, durably, which log each of those datasets is
witnessed under (:class:`ClaimState`), and refuses a log whose policy names a dataset another
log holds -- unless the registration also carries that other log's **retirement** of the dataset:
its public ``dataset-retired`` entry, with an inclusion proof into a checkpoint of that log which
this witness cosigned (so the retirement is in the one history of that log this witness vouches
for). :meth:`phsafe.tlog.witness.Witness.register` applies these rules; this module holds the
format and the checks that need no state.

Format (``phsafe-log-registration/1``): canonical JSON (sorted keys), UTF-8, one newline at the
end::

    {"format": "phsafe-log-registration/1",
     "origin": "<the log's origin (its key's name)>",
     "policy": "<the log's entry 0, verbatim>",
     "proof": "<a c2sp.org/tlog-proof@v1 of entry 0, verbatim: index 0, the inclusion proof,
               a checkpoint signed by the log's key>",
     "retirements": [                                   (optional; absent when empty)
        {"origin": "<the log that retired a dataset>",
         "entry": "<its dataset-retired entry, verbatim>",
         "proof": "<a tlog-proof of that entry against a checkpoint of that log>"}, ...]}

:func:`format_registration` and :func:`parse_registration` are the encoder/decoder pair;
:func:`make_registration` builds one from a published log's files (public files only: anyone can
make a log's registration, and no one can make a false one without its key).

The entries are read as the public log's (:mod:`phsafe.publog.projection`): a ``policy`` entry
whose ``datasets``, when present, is a sorted list of distinct dataset names; a
``dataset-retired`` entry with ``dataset`` and, optionally, ``successor`` (``origin`` and
``key_id``, 8 hex digits, of the log that accounts the dataset from then on).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from phsafe.errors import MalformedError, ProofError
from phsafe.tlog.checkpoint import VerifiedCheckpoint
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.note import Verifier, parse_note
from phsafe.tlog.proof import TlogProof, format_tlog_proof, make_tlog_proof, parse_tlog_proof, verify_tlog_proof

REGISTRATION_FORMAT = "phsafe-log-registration/1"
REGISTRATION_SUFFIX = ".registration"
MAX_REGISTRATION_BYTES = 1 << 20
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A dataset name, as the ledger writes it (:data:`phsafe.ledger.format.NAME`)."""
POLICY_TYPE = "policy"
RETIRED_TYPE = "dataset-retired"

_WHAT = "log registration"


@dataclass(frozen=True)
class Retirement:
    """A log's ``dataset-retired`` entry and its inclusion proof in that log."""

    origin: str
    entry: bytes
    proof: TlogProof


@dataclass(frozen=True)
class Registration:
    """A log's policy entry (its entry 0), proven, and the retirements it carries."""

    origin: str
    policy: bytes
    proof: TlogProof
    retirements: tuple[Retirement, ...] = field(default=())


def format_registration(registration: Registration) -> bytes:
    """The registration file's bytes (see the module docstring)."""
    if registration.proof.index != 0:
        raise ValueError("a registration proves the log's entry 0")
    document: dict[str, object] = {
        "format": REGISTRATION_FORMAT, "origin": registration.origin,
        "policy": registration.policy.decode("utf-8"),
        "proof": format_tlog_proof(registration.proof).decode("utf-8")}
    if registration.retirements:
        document["retirements"] = [{"origin": r.origin, "entry": r.entry.decode("utf-8"),
                                    "proof": format_tlog_proof(r.proof).decode("utf-8")}
                                   for r in registration.retirements]
    return (json.dumps(document, sort_keys=True, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def _text(document: dict, name: str, what: str = "") -> str:
    value = document.get(name)
    if not isinstance(value, str) or not value:
        raise MalformedError(_WHAT, f"{what}{name} is missing or not text")
    return value


def _proof(text: str, what: str) -> TlogProof:
    try:
        return parse_tlog_proof(text.encode("utf-8"))
    except MalformedError as exc:
        raise MalformedError(_WHAT, f"{what} is not a tlog-proof ({exc.rule})") from None


def parse_registration(data: bytes) -> Registration:
    """The registration a file holds; MalformedError on anything but the format."""
    if len(data) > MAX_REGISTRATION_BYTES:
        raise MalformedError(_WHAT, f"it is over {MAX_REGISTRATION_BYTES} bytes")
    try:
        document = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise MalformedError(_WHAT, "it is not UTF-8 JSON") from None
    if not isinstance(document, dict) or document.get("format") != REGISTRATION_FORMAT:
        raise MalformedError(_WHAT, f"it is not a {REGISTRATION_FORMAT} document")
    unknown = set(document) - {"format", "origin", "policy", "proof", "retirements"}
    if unknown:
        raise MalformedError(_WHAT, f"unknown fields {', '.join(sorted(unknown))}")
    origin, policy = _text(document, "origin"), _text(document, "policy")
    proof = _proof(_text(document, "proof"), "proof")
    if proof.index != 0:
        raise MalformedError(_WHAT, f"its proof is of entry {proof.index}, not of the log's entry 0 (its policy)")
    items = document.get("retirements", [])
    if not isinstance(items, list) or ("retirements" in document and not items):
        raise MalformedError(_WHAT, "retirements is not a non-empty list")
    retirements = []
    for i, item in enumerate(items):
        what = f"retirements[{i}]."
        if not isinstance(item, dict) or set(item) != {"origin", "entry", "proof"}:
            raise MalformedError(_WHAT, f"retirements[{i}] does not hold exactly origin, entry and proof")
        retirements.append(Retirement(_text(item, "origin", what), _text(item, "entry", what).encode("utf-8"),
                                      _proof(_text(item, "proof", what), f"{what}proof")))
    return Registration(origin, policy.encode("utf-8"), proof, tuple(retirements))


# --------------------------------------------------------------------------------------------
# The entries it carries
# --------------------------------------------------------------------------------------------


def _entry(data: bytes, what: str) -> dict:
    try:
        entry = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise MalformedError(_WHAT, f"{what} is not a JSON entry") from None
    if not isinstance(entry, dict):
        raise MalformedError(_WHAT, f"{what} is not a JSON object")
    return entry


def policy_datasets(entry: bytes) -> tuple[str, ...] | None:
    """The datasets a ``policy`` entry declares the log accounts; None when it declares none
    (a log of a ledger made before declarations).

    Raises:
        MalformedError: It is not a policy entry, or its ``datasets`` is not a sorted list of
            distinct dataset names.
    """
    e = _entry(entry, "the policy entry")
    if e.get("type") != POLICY_TYPE:
        raise MalformedError(_WHAT, f"the log's entry 0 is a {e.get('type')!r} entry, not its policy")
    if "datasets" not in e:
        return None
    names = e["datasets"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and DATASET_NAME.fullmatch(n)
                                                           for n in names) or names != sorted(set(names)):
        raise MalformedError(_WHAT, "the policy's datasets is not a sorted list of distinct dataset names")
    return tuple(names)


@dataclass(frozen=True)
class RetiredDataset:
    """What a ``dataset-retired`` entry states: the dataset and, when named, its successor log."""

    dataset: str
    successor_origin: str | None = None
    successor_key_id: int | None = None


def retired_dataset(entry: bytes) -> RetiredDataset:
    """What a ``dataset-retired`` entry states; MalformedError when it is not one."""
    e = _entry(entry, "the retirement entry")
    if e.get("type") != RETIRED_TYPE:
        raise MalformedError(_WHAT, f"a retirement's entry is a {e.get('type')!r} entry, not {RETIRED_TYPE!r}")
    name = e.get("dataset")
    if not isinstance(name, str) or not DATASET_NAME.fullmatch(name):
        raise MalformedError(_WHAT, "a retirement's entry names no dataset")
    successor = e.get("successor")
    if successor is None:
        return RetiredDataset(name)
    if not isinstance(successor, dict) or not isinstance(successor.get("origin"), str) \
            or not re.fullmatch(r"[0-9a-f]{8}", str(successor.get("key_id"))):
        raise MalformedError(_WHAT, "a retirement's successor is not an origin and an 8-hex-digit key ID")
    return RetiredDataset(name, successor["origin"], int(successor["key_id"], 16))


@dataclass(frozen=True)
class VerifiedRegistration:
    """A registration whose policy proof verified with the log's key: the checkpoint it is
    proven against and the datasets the policy declares (None: none)."""

    registration: Registration
    checkpoint: VerifiedCheckpoint
    datasets: tuple[str, ...] | None


def verify_registration(registration: Registration, log_verifier: Verifier) -> VerifiedRegistration:
    """Check that the registration's policy is entry 0 of the log of ``log_verifier``, as a
    checkpoint signed by that key states it (nothing about the witness's own state).

    Raises:
        SignatureError: The checkpoint is not signed by the log's key, or is another log's.
        ProofError: The policy is not the checkpoint's entry 0.
        MalformedError: It is not a policy entry.
    """
    checkpoint = verify_tlog_proof(registration.proof, registration.policy, log_verifier,
                                   origin=registration.origin)
    if registration.origin != log_verifier.name:
        raise MalformedError(_WHAT, f"it registers {registration.origin!r}, not the log {log_verifier.name!r}")
    return VerifiedRegistration(registration, checkpoint, policy_datasets(registration.policy))


def verify_retirement(retirement: Retirement, log_verifier: Verifier) -> tuple[VerifiedCheckpoint, RetiredDataset]:
    """Check that the retirement's entry is in the log of ``log_verifier`` at its index, as a
    checkpoint signed by that key states it; returns that checkpoint and what the entry states.

    Raises:
        SignatureError, ProofError, MalformedError: As :func:`verify_registration`.
    """
    checkpoint = verify_tlog_proof(retirement.proof, retirement.entry, log_verifier, origin=retirement.origin)
    return checkpoint, retired_dataset(retirement.entry)


# --------------------------------------------------------------------------------------------
# Making one, from a published log's files
# --------------------------------------------------------------------------------------------


def _origin(checkpoint: bytes) -> str:
    text, _ = parse_note(checkpoint)
    return text.split("\n", 1)[0]


def retirements_in(checkpoint: bytes, entries: Sequence[bytes], datasets: Sequence[str]) -> list[Retirement]:
    """The ``dataset-retired`` entries of ``datasets`` in a log (its published checkpoint and
    entries), each with its inclusion proof against that checkpoint."""
    log = TransparencyLog.of_entries(list(entries))
    origin = _origin(checkpoint)
    found = []
    for index, entry in enumerate(entries):
        try:
            retired = retired_dataset(entry)
        except MalformedError:
            continue
        if retired.dataset in datasets:
            found.append(Retirement(origin, bytes(entry), make_tlog_proof(log, index, checkpoint)))
    return found


def make_registration(checkpoint: bytes, entries: Sequence[bytes],
                      predecessors: Sequence[tuple[bytes, Sequence[bytes]]] = ()) -> Registration:
    """A log's registration from its published files (its signed ``checkpoint``, its
    ``entries``), with the retirements of its datasets found in ``predecessors`` (the published
    checkpoint and entries of each log that accounted them before).

    Raises:
        ProofError: The checkpoint is not a tree head of the entries.
        MalformedError: Entry 0 is not a policy entry.
    """
    if not entries:
        raise MalformedError(_WHAT, "the log has no entry: its policy is its entry 0")
    datasets = policy_datasets(entries[0]) or ()
    log = TransparencyLog.of_entries(list(entries))
    proof = make_tlog_proof(log, 0, checkpoint)
    retirements: list[Retirement] = []
    for other_checkpoint, other_entries in predecessors:
        if _origin(other_checkpoint) == _origin(checkpoint):
            raise ProofError("a log does not retire datasets in favour of itself: give its predecessor's log")
        retirements += retirements_in(other_checkpoint, other_entries, datasets)
    return Registration(_origin(checkpoint), bytes(entries[0]), proof, tuple(retirements))


# --------------------------------------------------------------------------------------------
# What a witness keeps
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredLog:
    """A log whose registration a witness accepted: the verifier key it was registered under
    and the datasets its policy declares (None: none -- a log witnessed before declarations)."""

    vkey: str
    datasets: tuple[str, ...] | None


@dataclass(frozen=True)
class ClaimState:
    """What a witness keeps of registrations: the registered logs, which log holds each dataset,
    and the logs that retired each dataset, oldest first."""

    logs: dict[str, RegisteredLog] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    retired: dict[str, tuple[str, ...]] = field(default_factory=dict)


class ClaimStore:
    """Where a witness keeps its :class:`ClaimState` (in memory here; a file:
    :class:`phsafe.tlog.files.FileClaimStore`). Its users serialise their updates (a witness
    answers one request at a time); :meth:`save` replaces the whole state atomically.

    ``refusals`` holds, in memory only, why the last registration seen of each log was refused
    (said again in every refusal to cosign that log; found again from the files after a restart).
    """

    def __init__(self) -> None:
        self._state = ClaimState()
        self.refusals: dict[str, str] = {}

    def load(self) -> ClaimState:
        return self._state

    def save(self, state: ClaimState) -> None:
        self._state = state
