"""Offline proof files (c2sp.org/tlog-proof@v1): an entry is in a log, checked with nothing else.

A release carries ``privacy-loss.tlog-proof`` beside the exact bytes of its log entry; with the
log's verifier key (and, if asked, witness keys) anyone can check the entry is in the log.

Format: UTF-8 lines, each ending in a newline::

    c2sp.org/tlog-proof@v1
    extra <base64 of opaque extra data>        (optional line; unauthenticated, never trusted)
    index <zero-based index of the entry, decimal, no leading zeros>
    <base64 of one inclusion-proof hash>       (zero to 63 lines: RFC 6962 PATH, leaf's sibling first)
    <empty line>
    <the signed checkpoint the proof is against, verbatim, with any cosignatures>

Verification (:func:`verify_tlog_proof`), in the spec's order: the leaf hash is
SHA-256(0x00 || entry bytes); the checkpoint must verify with the log's key (origin = the key's
name unless another is given) and carry the witness quorum asked; the inclusion proof must
bind that leaf at ``index`` to the checkpoint's root hash in a tree of the checkpoint's size.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from phsafe.tlog.checkpoint import VerifiedCheckpoint, parse_checkpoint, verify_checkpoint
from phsafe.tlog.framing import MAX_PROOF_HASHES, parse_hash_lines, parse_tree_size, split_body
from phsafe.errors import MalformedError, ProofError
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.merkle import HASH_SIZE, MAX_TREE_SIZE, leaf_hash, verify_inclusion
from phsafe.tlog.note import Verifier, decode_base64, parse_note

PROOF_HEADER = "c2sp.org/tlog-proof@v1"
PROOF_FILE_SUFFIX = ".tlog-proof"


@dataclass(frozen=True)
class TlogProof:
    """An entry's index, its inclusion proof and the signed checkpoint it is proved against."""

    index: int
    inclusion_proof: tuple[bytes, ...]
    checkpoint: bytes
    extra: bytes | None = None


def format_tlog_proof(proof: TlogProof) -> bytes:
    """The proof file's bytes (see the module docstring)."""
    if not 0 <= proof.index <= MAX_TREE_SIZE:
        raise ValueError("the index is out of range")
    if len(proof.inclusion_proof) > MAX_PROOF_HASHES or any(len(h) != HASH_SIZE for h in proof.inclusion_proof):
        raise ValueError("an inclusion proof is at most 63 hashes of 32 bytes")
    parse_note(proof.checkpoint)  # a proof is never written around something that is not a note
    lines = [PROOF_HEADER]
    if proof.extra is not None:
        if not proof.extra:
            raise ValueError("extra data, when present, is not empty")
        lines.append("extra " + base64.b64encode(proof.extra).decode("ascii"))
    lines.append(f"index {proof.index}")
    lines.extend(base64.b64encode(h).decode("ascii") for h in proof.inclusion_proof)
    return ("\n".join(lines) + "\n\n").encode("ascii") + proof.checkpoint


def parse_tlog_proof(data: bytes) -> TlogProof:
    """The proof a file holds; MalformedError on any deviation from the format."""
    what = "tlog-proof"
    lines, checkpoint = split_body(data, what)
    if lines[0] != PROOF_HEADER:
        raise MalformedError(what, f"the first line is not {PROOF_HEADER}")
    position = 1
    extra = None
    if position < len(lines) and lines[position].startswith("extra "):
        extra = decode_base64(lines[position][len("extra "):], "tlog-proof extra data")
        if not extra:
            raise MalformedError(what, "the extra line holds no data")
        position += 1
    if position >= len(lines) or not lines[position].startswith("index "):
        raise MalformedError(what, "no 'index <n>' line")
    index = parse_tree_size(lines[position][len("index "):], what, "index")
    proof = parse_hash_lines(lines[position + 1:], what, "inclusion-proof")
    parse_note(checkpoint)
    return TlogProof(index, proof, checkpoint, extra)


def make_tlog_proof(log: TransparencyLog, index: int, checkpoint: bytes, extra: bytes | None = None) -> TlogProof:
    """The proof of entry ``index`` against a signed ``checkpoint`` of ``log``.

    The checkpoint's root must be ``log``'s root at the checkpoint's size: a proof is never
    made against a checkpoint of another log or of a rewritten one.
    """
    text, _ = parse_note(checkpoint)
    stated = parse_checkpoint(text)
    if stated.size > log.size or log.root(stated.size) != stated.root_hash:
        raise ProofError(f"the checkpoint (size {stated.size}) is not a tree head of this log")
    return TlogProof(index, tuple(log.inclusion_proof(index, stated.size)), bytes(checkpoint), extra)


def verify_tlog_proof(proof: TlogProof | bytes, entry: bytes, log_verifier: Verifier, *,
                      witnesses: Sequence[Verifier] = (), quorum: int = 0,
                      origin: str | None = None) -> VerifiedCheckpoint:
    """Check that ``entry`` is at the proof's index in the log, as the checkpoint signs it.

    Returns the verified checkpoint. Raises MalformedError, SignatureError (checkpoint not
    signed by the log key, too few witnesses) or ProofError (the entry is not there).
    """
    if not isinstance(proof, TlogProof):
        proof = parse_tlog_proof(proof)
    verified = verify_checkpoint(proof.checkpoint, log_verifier, witnesses=witnesses, quorum=quorum, origin=origin)
    size = verified.checkpoint.size
    try:
        verify_inclusion(leaf_hash(bytes(entry)), proof.index, size, proof.inclusion_proof,
                         verified.checkpoint.root_hash)
    except ProofError as exc:
        raise ProofError(f"the entry is not entry {proof.index} of {verified.checkpoint.origin} "
                         f"as of its checkpoint of size {size} ({exc})") from None
    return verified
