"""A witness (c2sp.org/tlog-witness): cosigns a log's checkpoint only if it extends the last one.

A :class:`Witness` holds a cosigning key (:class:`~phsafe.tlog.cosignature.CosignatureSigner`),
the verifier keys of the logs it witnesses (a log is known by its origin, which is its key's
name), and a :class:`~phsafe.tlog.state.CheckpointStore` with the last checkpoint it cosigned per
origin -- kept apart from the log it watches, or it protects nothing. :meth:`Witness.add_checkpoint`
is the protocol's ``add-checkpoint`` call; refusals are :class:`~phsafe.errors.WitnessRefusal`
with the protocol's HTTP status:

====  =======================================================================================
404   the checkpoint's origin is not a log this witness knows
403   no valid signature by that log's key (or a signature by it that fails); or the witness
      cosigned this origin under another key (a log's key rewritten under its name: refused,
      a new key is a new log)
400   malformed request or checkpoint; old size larger than the checkpoint's size
409   old size is not the size of the last checkpoint cosigned for the origin (0 if none);
      or old size, last size and the checkpoint's size are equal and the root hashes differ
      (another tree of the size it cosigned: a fork). ``latest_size`` says which size it
      last cosigned; a witness never goes back.
422   the consistency proof from (old size, last root) to the new checkpoint does not verify;
      old size 0 with a non-empty proof; size 0 with a root other than the empty tree's
====  =======================================================================================

The HTTP exchange is written down here without an HTTP library, as the spec defines it:
:func:`answer_add_checkpoint` is the witness's answer to a request body (status, content type,
body; the 409 answer is the size it last cosigned, ``text/x.tlog.size``), and
:func:`read_add_checkpoint_answer` is the log's reading of that answer. A server
(:mod:`phsafe.tlog.witness_server`) and a client (:mod:`phsafe.publog.witnesses`) put them on
the wire.

The log's side of the exchange is :func:`request_cosignature`: it sends the consistency proof
from the size it believes the witness last cosigned and, on a 409, once more from the size the
witness names. That is what makes a copied or rolled-back log unable to get a cosignature: the
witness has cosigned the original's larger tree, and the copy can prove no consistency with it.

A refused request whose checkpoint the log's key signed is handed to the ``evidence`` callback
with the proof of equivocation it gives, if any (:mod:`phsafe.tlog.evidence`: the checkpoint
cosigned before and the one refused, of one size with different roots, or tied by the request's
own consistency proof to another prefix); the service keeps both, durably.

On success the witness stores the checkpoint (with the log's verified signatures and its own
cosignature) by compare-and-swap -- check and update are one atomic step, so two concurrent
requests cannot roll it back -- before it returns its cosignature line: a cosignature is never
given for a state the witness could forget.

With a claim store (:class:`~phsafe.tlog.registration.ClaimStore`: the witness service always
has one), it cosigns a log only once it accepted the log's registration
(:meth:`Witness.register`), which names the datasets the log accounts, and refuses (403) a second
log naming a dataset another log holds here, unless its registration carries that log's
retirement of the dataset, proven in the history this witness cosigned.

Request body (``add-checkpoint``), every line ending in a newline::

    old <old size, decimal, no leading zeros>
    <base64 of one consistency-proof hash>        (zero to 63 lines)
    <empty line>
    <the signed checkpoint, verbatim>
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from phsafe.tlog.checkpoint import VerifiedCheckpoint, parse_checkpoint, verify_checkpoint
from phsafe.tlog.framing import DECIMAL, MAX_PROOF_HASHES, parse_hash_lines, parse_tree_size, split_body
from phsafe.tlog.log import TransparencyLog
from phsafe.errors import MalformedError, ProofError, SignatureError, StaleStateError, StoreError, WitnessRefusal
from phsafe.tlog.merkle import EMPTY_ROOT, HASH_SIZE, MAX_TREE_SIZE, verify_consistency
from phsafe.tlog.cosignature import CosignatureSigner
from phsafe.tlog.keys import format_verifier_key
from phsafe.tlog.evidence import Evidence, evidence_from_proof, same_size_evidence
from phsafe.tlog.note import NoteSignature, Verifier, format_note, parse_note, parse_signature_lines
from phsafe.tlog.registration import (
    ClaimState,
    ClaimStore,
    RegisteredLog,
    Registration,
    parse_registration,
    verify_registration,
    verify_retirement,
)
from phsafe.tlog.state import CheckpointStore


@dataclass(frozen=True)
class AddCheckpointRequest:
    """What a log sends a witness: the size it believes the witness last cosigned, the
    consistency proof from that size to the new checkpoint's, and the signed checkpoint."""

    old_size: int
    consistency_proof: tuple[bytes, ...]
    checkpoint: bytes


def format_add_checkpoint_request(request: AddCheckpointRequest) -> bytes:
    """The request body of ``add-checkpoint`` (see the module docstring)."""
    if not 0 <= request.old_size <= MAX_TREE_SIZE or len(request.consistency_proof) > MAX_PROOF_HASHES:
        raise ValueError("old size out of range, or more than 63 proof hashes")
    lines = [f"old {request.old_size}\n".encode("ascii")]
    for h in request.consistency_proof:
        if len(h) != HASH_SIZE:
            raise ValueError("a consistency-proof hash is not 32 bytes")
        lines.append(base64.b64encode(h) + b"\n")
    return b"".join(lines) + b"\n" + request.checkpoint


def parse_add_checkpoint_request(body: bytes) -> AddCheckpointRequest:
    """The request an ``add-checkpoint`` body carries; MalformedError on any deviation."""
    what = "add-checkpoint request"
    lines, checkpoint = split_body(body, what)
    if not lines[0].startswith("old "):
        raise MalformedError(what, "the first line is not 'old <size>'")
    old_size = parse_tree_size(lines[0][len("old "):], what, "old size")
    proof = parse_hash_lines(lines[1:], what, "consistency-proof")
    return AddCheckpointRequest(old_size, proof, checkpoint)


def with_cosignatures(checkpoint: bytes, lines: bytes) -> bytes:
    """The signed checkpoint with a witness's answer (signature lines) appended."""
    try:
        parse_signature_lines(bytes(lines).decode("utf-8"))
    except UnicodeDecodeError:
        raise MalformedError("witness answer", "it is not UTF-8") from None
    merged = bytes(checkpoint) + bytes(lines)
    parse_note(merged)
    return merged


class KeyChanged(StoreError):
    """The witness's state holds a checkpoint of the log signed by another key of the same name."""


class Witness:
    """Cosigns checkpoints of the logs it knows, never one that does not extend the last.

    Args:
        signer: The witness's cosigning key (signature type 0x04).
        logs: The verifier keys of the witnessed logs; each log's origin is its key's name.
        store: The last cosigned checkpoint per origin (kept apart from the logs).
    """

    def __init__(self, signer: CosignatureSigner, logs: Iterable[Verifier], store: CheckpointStore, *,
                 evidence: Callable[[str, bytes, Evidence | None], None] | None = None,
                 claims: ClaimStore | None = None) -> None:
        self.signer = signer
        self._keep_evidence = evidence
        self._claims = claims
        self._logs: dict[str, Verifier] = {}
        for log in logs:
            if log.name in self._logs:
                raise ValueError(f"two keys for the log {log.name}: a witness takes one per log")
            self._logs[log.name] = log
        self._store = store

    @property
    def origins(self) -> tuple[str, ...]:
        """The logs this witness witnesses."""
        return tuple(self._logs)

    def _evidence(self, request: AddCheckpointRequest, stored: bytes | None, new: VerifiedCheckpoint) -> None:
        """Keep a refused request whose log signature verified (the spec's MAY), with the
        evidence it gives when it proves the log signed two histories
        (:mod:`phsafe.tlog.evidence`): the checkpoint cosigned before and the one refused."""
        if self._keep_evidence is None:
            return
        proof: Evidence | None = None
        if stored is not None:
            found_by = f"witness {self.signer.name}"
            proof = same_size_evidence(stored, new.message, found_by=found_by) or \
                evidence_from_proof(stored, new.message, request.consistency_proof, found_by=found_by)
        self._keep_evidence(new.checkpoint.origin, format_add_checkpoint_request(request), proof)

    def latest(self, origin: str) -> VerifiedCheckpoint | None:
        """The last checkpoint cosigned for ``origin`` (verified again: the store is a file)."""
        verifier = self._logs.get(origin)
        if verifier is None:
            return None
        return self._load(origin, verifier)[1]

    def _load(self, origin: str, verifier: Verifier) -> tuple[bytes | None, VerifiedCheckpoint | None]:
        stored = self._store.load(origin)
        if stored is None:
            return None, None
        try:
            return stored, verify_checkpoint(stored, verifier)
        except (MalformedError, SignatureError, ProofError) as exc:
            try:
                ids = {s.key_id for s in parse_note(stored)[1] if s.name == verifier.name}
            except MalformedError:
                ids = set()
            if ids and verifier.key_id not in ids:
                raise KeyChanged(f"this witness has cosigned the log {origin} under another key (key ID "
                                 f"{min(ids):08x}, now {verifier.key_id:08x}): a log's key never changes -- a new key "
                                 "is a new log, with a name of its own") from None
            raise StoreError(f"the witness's stored checkpoint of {origin} does not verify ({exc})") from None

    # -- registrations: which datasets each log accounts (phsafe.tlog.registration) -----------

    @property
    def requires_registration(self) -> bool:
        """A witness with a claim store cosigns only the logs whose registration it accepted."""
        return self._claims is not None

    def claims(self) -> ClaimState:
        """The registrations accepted: logs, which log holds each dataset, retirements."""
        return self._claims.load() if self._claims is not None else ClaimState()

    def _require_registration(self, origin: str, verifier: Verifier) -> None:
        if self._claims is None:
            return
        registered = self._claims.load().logs.get(origin)
        if registered is not None and registered.vkey == format_verifier_key(verifier):
            return
        if registered is not None:
            raise WitnessRefusal(403, f"this witness has registered and cosigned the log {origin} under another key "
                                      f"({registered.vkey.split('+')[1]}, now {verifier.key_id:08x}): a log's key never "
                                      "changes -- a new key is a new log, with a name of its own")
        why = self._claims.refusals.get(origin)
        if why is None:
            why = (f"this witness has accepted no registration of the log {origin}: it witnesses a log once its "
                   "registration -- the log's policy, which names the datasets it accounts, proven as its entry 0 "
                   "(phsafe ledger registration) -- is in its logs folder beside the log's key")
        raise WitnessRefusal(403, why)

    def register(self, data: bytes) -> str:
        """Accept a log's registration, durably, and return one line saying what the log now
        holds here. Refuses (and remembers why, to say it to the log's requests) a registration
        that does not verify with the log's key, is not on the history this witness cosigned,
        declares no dataset for a log new to this witness, or names a dataset another log holds
        here without that log's retirement of it.

        Raises:
            WitnessRefusal: Why the registration is refused (400 malformed, 404 unknown log, 403).
        """
        if self._claims is None:
            raise ValueError("this witness keeps no claims")
        try:
            registration = parse_registration(data)
        except MalformedError as exc:
            raise WitnessRefusal(400, f"not a log registration ({exc})") from None
        try:
            line = self._register(registration)
        except WitnessRefusal as refusal:
            if registration.origin in self._logs:
                self._claims.refusals[registration.origin] = str(refusal)
            raise
        self._claims.refusals.pop(registration.origin, None)
        return line

    def _register(self, registration: Registration) -> str:
        assert self._claims is not None
        origin = registration.origin
        verifier = self._logs.get(origin)
        if verifier is None:
            raise WitnessRefusal(404, f"a registration of the log {origin!r}, which this witness does not witness (its "
                                      "key is not in its logs folder)")
        vkey = format_verifier_key(verifier)
        try:
            verified = verify_registration(registration, verifier)
        except (SignatureError, ProofError, MalformedError) as exc:
            raise WitnessRefusal(403, f"the registration of the log {origin} does not verify with its key: {exc}") from None
        state = self._claims.load()
        known = state.logs.get(origin)
        if known is not None and known.vkey == vkey and known.datasets == verified.datasets:
            return self._registered_line(origin, state)
        try:
            _, latest = self._load(origin, verifier)
        except KeyChanged as exc:
            raise WitnessRefusal(403, str(exc)) from None
        checkpoint = verified.checkpoint
        if latest is not None and not self._on_history(checkpoint.message, verifier, latest):
            raise WitnessRefusal(403, f"the registration of the log {origin} is proven against a checkpoint of "
                                      f"{checkpoint.checkpoint.size} entries that this witness did not cosign, and it "
                                      f"has cosigned {latest.checkpoint.size} entries of the log: make the registration "
                                      "again once the witnesses cosigned the log as it is (phsafe ledger cosign, then "
                                      "phsafe ledger registration)")
        datasets = verified.datasets
        if datasets is None and latest is None:
            raise WitnessRefusal(403, f"the log {origin}'s policy declares no dataset: this witness witnesses a new log "
                                      "only once its policy names the datasets it accounts (phsafe ledger init --dataset "
                                      "NAME), so that a second log for a dataset cannot go unseen")
        claims, retired = dict(state.claims), dict(state.retired)
        for name in datasets or ():
            holder = claims.get(name)
            if holder is not None and holder != origin:
                self._check_retirement(registration, name, holder, state, verifier)
                retired[name] = (*retired.get(name, ()), holder)
            claims[name] = origin
        if latest is None:  # its first checkpoint here: every later one must extend it (entry 0 fixed)
            self._cosign_first(origin, verifier, checkpoint)
        new = ClaimState({**state.logs, origin: RegisteredLog(vkey, datasets)}, claims, retired)
        self._claims.save(new)
        return self._registered_line(origin, new)

    @staticmethod
    def _registered_line(origin: str, state: ClaimState) -> str:
        datasets = state.logs[origin].datasets
        if datasets is None:
            return (f"the log {origin} is registered; its policy declares no dataset (a log this witness cosigned "
                    "before logs declared them): it is witnessed, and holds no dataset here")
        held = [f"{d} (taken over from {state.retired[d][-1]})" if state.retired.get(d) else d
                for d in datasets if state.claims.get(d) == origin]
        gone = [f"{d} (held by {state.claims[d]} since it retired it)" for d in datasets if state.claims.get(d) != origin]
        return (f"the log {origin} is registered; it holds "
                + (f"the dataset(s) {', '.join(held)} here" if held else "no dataset here")
                + (f"; it retired {', '.join(gone)}" if gone else ""))

    def _own_verifier(self) -> Verifier:
        from phsafe.tlog.cosignature import CosignatureVerifier

        return CosignatureVerifier(self.signer.name, self.signer.public_key)

    def _on_history(self, message: bytes, verifier: Verifier, latest: VerifiedCheckpoint) -> bool:
        """``message`` (signed by the log's key) is on the history of the log this witness
        cosigned: it carries this witness's own cosignature -- it cosigns only checkpoints that
        extend the last one, so each it cosigned is a prefix of its latest -- or it is the
        latest."""
        try:
            verify_checkpoint(message, verifier, witnesses=[self._own_verifier()], quorum=1)
            return True
        except (SignatureError, ProofError, MalformedError):
            pass
        try:
            mine = verify_checkpoint(message, verifier).checkpoint
        except (SignatureError, ProofError, MalformedError):
            return False
        return (mine.size, mine.root_hash) == (latest.checkpoint.size, latest.checkpoint.root_hash)

    def _check_retirement(self, registration: Registration, name: str, holder: str, state: ClaimState,
                          verifier: Verifier) -> None:
        """The registration carries ``holder``'s retirement of ``name``, proven in the history of
        ``holder`` this witness cosigned, naming this log (or no log) as its successor."""
        from phsafe.tlog.keys import verifier_from_key

        origin = registration.origin
        holder_key = verifier_from_key(state.logs[holder].vkey)
        why = ""
        for retirement in registration.retirements:
            if retirement.origin != holder:
                continue
            try:
                checkpoint, retired = verify_retirement(retirement, holder_key)
            except (SignatureError, ProofError, MalformedError) as exc:
                why = f" (a retirement given does not verify with {holder}'s key: {exc})"
                continue
            if retired.dataset != name:
                continue
            try:
                _, latest = self._load(holder, holder_key)
            except (KeyChanged, StoreError):
                latest = None
            if latest is None or not self._on_history(checkpoint.message, holder_key, latest):
                why = (f" (its retirement is proven against a checkpoint of {holder} this witness did not cosign: make "
                       f"the registration again once the witnesses cosigned {holder}: phsafe ledger cosign)")
                continue
            if retired.successor_origin is not None and \
                    (retired.successor_origin, retired.successor_key_id) != (origin, verifier.key_id):
                raise WitnessRefusal(403, f"{holder} retired the dataset {name} in favour of the log "
                                          f"{retired.successor_origin} (key ID {retired.successor_key_id:08x}), not "
                                          f"{origin} (key ID {verifier.key_id:08x})")
            return
        raise WitnessRefusal(403, f"the log's policy names the dataset {name}, which this witness holds under another "
                                  f"log, {holder}: a second log would account it again from zero (its cap spent "
                                  f"again); that log must first retire {name} publicly, recorded in it (phsafe ledger "
                                  "retire-dataset), and this log's registration carry the retirement (phsafe ledger "
                                  f"registration --retired-in ITS-PUBLISHED-LOG){why}")

    def _cosign_first(self, origin: str, verifier: Verifier, checkpoint: VerifiedCheckpoint) -> None:
        """Keep the registration's checkpoint as the first one cosigned of a log new to this
        witness: from then on it cosigns only checkpoints that extend it, so the log's entry 0
        is the policy it registered."""
        cosignature = NoteSignature(self.signer.name, self.signer.key_id,
                                    self.signer.sign(checkpoint.note.text.encode("utf-8")))
        log_signatures = [s for s in checkpoint.note.signatures if (s.name, s.key_id) == (verifier.name, verifier.key_id)]
        try:
            self._store.replace(origin, None, format_note(checkpoint.note.text, [*log_signatures, cosignature]))
        except StaleStateError:
            raise WitnessRefusal(409, f"a checkpoint of {origin} was cosigned meanwhile; the registration is read "
                                      "again at the next request") from None

    def add_checkpoint(self, request: AddCheckpointRequest) -> bytes:
        """Cosign ``request.checkpoint`` if it extends the last one cosigned; returns the
        cosignature line(s). Raises WitnessRefusal otherwise (see the module docstring)."""
        try:
            text, _ = parse_note(request.checkpoint)
            origin = parse_checkpoint(text).origin
        except MalformedError as exc:
            raise WitnessRefusal(400, str(exc)) from None
        verifier = self._logs.get(origin)
        if verifier is None:
            raise WitnessRefusal(404, f"this witness does not know the log {origin!r}")
        try:
            new = verify_checkpoint(request.checkpoint, verifier)
        except SignatureError as exc:
            raise WitnessRefusal(403, str(exc)) from None
        except ProofError as exc:
            raise WitnessRefusal(422, str(exc)) from None
        except MalformedError as exc:
            raise WitnessRefusal(400, str(exc)) from None
        self._require_registration(origin, verifier)
        size = new.checkpoint.size
        if request.old_size > size:
            raise WitnessRefusal(400, f"the old size {request.old_size} is larger than the checkpoint's {size}")
        try:
            stored, latest = self._load(origin, verifier)
        except KeyChanged as exc:
            raise WitnessRefusal(403, str(exc)) from None
        latest_size = latest.checkpoint.size if latest else 0
        if request.old_size != latest_size:
            raise WitnessRefusal(409, f"the last checkpoint cosigned for {origin} has size {latest_size}, "
                                      f"not {request.old_size}", latest_size=latest_size)
        old_root = latest.checkpoint.root_hash if latest else EMPTY_ROOT
        if size == latest_size and new.checkpoint.root_hash != old_root:
            self._evidence(request, stored, new)
            raise WitnessRefusal(409, f"the checkpoint of size {size} has another root hash than the one of that size "
                                      "cosigned before: the log forked", latest_size=latest_size)
        try:
            verify_consistency(latest_size, old_root, size, new.checkpoint.root_hash, request.consistency_proof)
        except ProofError as exc:
            self._evidence(request, stored, new)
            raise WitnessRefusal(422, f"the checkpoint of size {size} does not extend the one of size "
                                      f"{latest_size} cosigned before: {exc}") from None
        cosignature = NoteSignature(self.signer.name, self.signer.key_id,
                                    self.signer.sign(new.note.text.encode("utf-8")))
        log_signatures = [s for s in new.note.signatures if (s.name, s.key_id) == (verifier.name, verifier.key_id)]
        try:
            self._store.replace(origin, stored, format_note(new.note.text, [*log_signatures, cosignature]))
        except StaleStateError:
            _, now = self._load(origin, verifier)
            now_size = now.checkpoint.size if now else 0
            raise WitnessRefusal(409, f"another checkpoint of {origin} was cosigned meanwhile (size {now_size})",
                                 latest_size=now_size) from None
        return cosignature.line().encode("utf-8")

    def cosign(self, checkpoint: bytes, old_size: int, consistency_proof: Sequence[bytes]) -> bytes:
        """:meth:`add_checkpoint`, returning the checkpoint with the cosignature appended."""
        lines = self.add_checkpoint(AddCheckpointRequest(old_size, tuple(consistency_proof), checkpoint))
        return with_cosignatures(checkpoint, lines)


class CosigningWitness(Protocol):
    """Anything that answers ``add-checkpoint``: a :class:`Witness` here, or a network client."""

    def add_checkpoint(self, request: AddCheckpointRequest) -> bytes: ...


def request_cosignature(witness: CosigningWitness, log: TransparencyLog, checkpoint: bytes, *,
                        old_size: int = 0) -> bytes:
    """The log's side of ``add-checkpoint``: ``checkpoint`` (a tree head of ``log``) with the
    witness's cosignature appended.

    ``old_size`` is the size the log believes the witness last cosigned (0 if unknown); on a
    409 the request is sent once more with a proof from the size the witness names.

    Raises:
        WitnessRefusal: The witness refuses -- in particular 409 when it has cosigned a larger
            tree than ``log`` has (the log is a stale copy or was rolled back) and 422 when
            ``log`` does not extend the tree it cosigned (a fork).
    """
    size = parse_checkpoint(parse_note(checkpoint)[0]).size
    for attempt in range(2):
        if old_size > size:
            raise WitnessRefusal(409, f"the witness has cosigned a tree of {old_size} entries and this log "
                                      f"has {size}: the log is a stale copy or was rolled back",
                                 latest_size=old_size)
        proof = tuple(log.consistency_proof(old_size, size))
        try:
            return with_cosignatures(checkpoint, witness.add_checkpoint(AddCheckpointRequest(old_size, proof, checkpoint)))
        except WitnessRefusal as refusal:
            if refusal.status != 409 or refusal.latest_size is None or attempt:
                raise
            old_size = refusal.latest_size
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# The exchange over HTTP, without an HTTP library
# --------------------------------------------------------------------------------------------

SIZE_CONTENT_TYPE = "text/x.tlog.size"
"""The content type of a 409 answer: the size the witness last cosigned, then a newline."""
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
MAX_REQUEST_BYTES = 1 << 16
"""The largest add-checkpoint body a witness reads: a checkpoint, 63 proof lines and up to 100
signature lines fit many times over."""


@dataclass(frozen=True)
class HttpAnswer:
    """A witness's answer to one ``add-checkpoint`` POST: HTTP status, content type, body."""

    status: int
    content_type: str
    body: bytes


def answer_add_checkpoint(witness: Witness, body: bytes) -> HttpAnswer:
    """The witness's answer to an ``add-checkpoint`` request body, as the spec states it."""
    if len(body) > MAX_REQUEST_BYTES:
        return HttpAnswer(413, TEXT_CONTENT_TYPE, f"the request is over {MAX_REQUEST_BYTES} bytes\n".encode())
    try:
        request = parse_add_checkpoint_request(body)
        lines = witness.add_checkpoint(request)
    except MalformedError as exc:
        return HttpAnswer(400, TEXT_CONTENT_TYPE, f"{exc}\n".encode("utf-8"))
    except WitnessRefusal as refusal:
        if refusal.status == 409:
            return HttpAnswer(409, SIZE_CONTENT_TYPE, f"{refusal.latest_size or 0}\n".encode("ascii"))
        return HttpAnswer(refusal.status, TEXT_CONTENT_TYPE, f"{refusal}\n".encode("utf-8"))
    except StoreError as exc:  # its own state is unusable: it cosigns nothing until its operator looks
        return HttpAnswer(500, TEXT_CONTENT_TYPE, f"the witness cannot use its state: {exc}\n".encode("utf-8"))
    return HttpAnswer(200, TEXT_CONTENT_TYPE, lines)


def read_add_checkpoint_answer(status: int, content_type: str | None, body: bytes) -> bytes:
    """The cosignature lines of a witness's 200 answer; a :class:`WitnessRefusal` otherwise
    (a 409 carries the size the witness names, read from its ``text/x.tlog.size`` body).

    Raises:
        WitnessRefusal: The witness refused (its status), or its answer is not the protocol's.
    """
    if status == 200:
        try:
            parse_signature_lines(bytes(body).decode("utf-8"))
        except (MalformedError, UnicodeDecodeError):
            raise WitnessRefusal(502, "the witness answered 200 without signature lines") from None
        return bytes(body)
    text = bytes(body[:500]).decode("utf-8", "replace").strip()
    if status == 409:
        media = (content_type or "").split(";")[0].strip().lower()
        if media != SIZE_CONTENT_TYPE or not DECIMAL.fullmatch(text):
            raise WitnessRefusal(502, "the witness answered 409 without the size it last cosigned")
        return_size = int(text)
        raise WitnessRefusal(409, f"the witness last cosigned a tree of {return_size} entries", latest_size=return_size)
    first = text.splitlines()[0] if text else ""
    raise WitnessRefusal(status, first or f"HTTP status {status}")
