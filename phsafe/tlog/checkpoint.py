"""C2SP checkpoints (c2sp.org/tlog-checkpoint): a log's signed tree head, and its verification.

Note text of a checkpoint (every line ends in a newline)::

    <origin>                  non-empty; names the log (here: the log key's name, see below)
    <tree size>               ASCII decimal, no leading zeros ("0" for the empty tree), < 2^63
    <root hash>               standard base64 of the 32-byte RFC 6962 root (44 characters)
    [<extension line> ...]    optional, opaque, non-empty; none are written by phsafe

for example (illustrative values, the signature shortened)::

    census.example/phsafe/privacy-loss/cef2020-us
    17
    fl4FH3i0G3ZbTsGjmEoDj1F6R0mK8sPXkd1vqLvE7xk=

    — census.example/phsafe/privacy-loss/cef2020-us ZHs5+1Fr...

:func:`parse_checkpoint` refuses anything else (a missing line, an empty line, a size with a
sign, a leading zero or a space, a root that is not canonical base64 of exactly 32 bytes, a
control character). :func:`verify_checkpoint` opens the signed note with the log's verifier key
and any witnesses' keys, and requires: a valid signature by the log key; the origin line equal
to the expected origin (by default the log key's name, as tlog-checkpoint recommends); for
size 0 the empty tree's root hash; and, when a quorum k is asked, valid cosignatures by at
least k *distinct* witness keys (distinct public keys: an Ed25519 cosignature does not commit
to the cosigner's name, so one key listed under two names must not count twice; the log's own
key never counts as a witness).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

from phsafe.errors import MalformedError, ProofError, SignatureError
from phsafe.tlog.merkle import EMPTY_ROOT, HASH_SIZE, MAX_TREE_SIZE
from phsafe.tlog.note import Note, Signer, Verifier, decode_base64, open_note, sign_note

_SIZE = re.compile(r"0|[1-9][0-9]*")


@dataclass(frozen=True)
class Checkpoint:
    """A log's tree head: origin, tree size, root hash and optional extension lines."""

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        """The checkpoint's note text (see :func:`format_checkpoint`)."""
        return format_checkpoint(self)


def format_checkpoint(checkpoint: Checkpoint) -> str:
    """The note text of ``checkpoint``; refuses values :func:`parse_checkpoint` would refuse."""
    text = (f"{checkpoint.origin}\n{checkpoint.size}\n"
            f"{base64.b64encode(checkpoint.root_hash).decode('ascii')}\n"
            + "".join(f"{line}\n" for line in checkpoint.extensions))
    if parse_checkpoint(text) != checkpoint:  # one rule set: what is written can be read back
        raise MalformedError("checkpoint", "its values do not survive formatting")
    return text


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint a note text states; MalformedError on anything but the exact format."""
    if not text.endswith("\n"):
        raise MalformedError("checkpoint", "its text must end in a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise MalformedError("checkpoint", "it needs an origin, a tree size and a root hash line")
    for number, line in enumerate(lines, 1):
        if not line:
            raise MalformedError("checkpoint", f"line {number} is empty")
        for ch in line:
            if ord(ch) < 0x20:
                raise MalformedError("checkpoint", f"line {number} contains a control character")
    origin, size_line, root_line, *extensions = lines
    if not _SIZE.fullmatch(size_line):
        raise MalformedError("checkpoint", "the tree size is not a decimal number without leading zeros")
    size = int(size_line)
    if size > MAX_TREE_SIZE:
        raise MalformedError("checkpoint", "the tree size is 2^63 or more")
    root = decode_base64(root_line, "checkpoint root hash")
    if len(root) != HASH_SIZE:
        raise MalformedError("checkpoint", f"the root hash is {len(root)} bytes, not {HASH_SIZE}")
    return Checkpoint(origin, size, root, tuple(extensions))


def sign_checkpoint(checkpoint: Checkpoint, signers: Sequence[Signer]) -> bytes:
    """The signed note of ``checkpoint`` (the log's signer first, by convention)."""
    return sign_note(format_checkpoint(checkpoint), signers)


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint whose log signature (and witness quorum, if asked) verified."""

    checkpoint: Checkpoint
    note: Note
    message: bytes
    cosigners: tuple[str, ...]
    """Names of the given witness keys whose cosignature verified, in note order."""


def _check_witnesses(log_verifier: Verifier, witnesses: Sequence[Verifier], quorum: int) -> None:
    """Refuse a witness policy that cannot be met or would count one cosignature twice."""
    if not 0 <= quorum <= len(witnesses):
        raise MalformedError("witness policy", f"a quorum of {quorum} out of {len(witnesses)} witness keys cannot be met")
    keys = [w.public_key for w in witnesses]
    if len(set(keys)) != len(keys):
        raise MalformedError("witness policy", "two witness keys share a public key: one cosignature would count twice")
    if log_verifier.public_key in keys:
        raise MalformedError("witness policy", "the log's key is not a witness of its own checkpoints")


def verify_checkpoint(message: bytes, log_verifier: Verifier, *, witnesses: Sequence[Verifier] = (),
                      quorum: int = 0, origin: str | None = None) -> VerifiedCheckpoint:
    """Open a signed checkpoint (see the module docstring for every check).

    Raises:
        MalformedError: Not a signed note, or its text not a checkpoint; a witness policy that
            cannot be met (quorum above the number of keys) or counts a key twice.
        SignatureError: No valid log signature; a trusted key's signature fails; another log's
            origin; fewer than ``quorum`` witness cosignatures.
        ProofError: A tree of size 0 with another root hash than the empty tree's.
    """
    witnesses = list(witnesses)
    _check_witnesses(log_verifier, witnesses, quorum)
    note = open_note(message, [log_verifier, *witnesses])
    if not note.signed_by(log_verifier):
        raise SignatureError(f"the checkpoint is not signed by the log key {log_verifier.name} "
                             f"({log_verifier.key_id:08x})")
    checkpoint = parse_checkpoint(note.text)
    expected = log_verifier.name if origin is None else origin
    if checkpoint.origin != expected:
        raise SignatureError(f"the checkpoint is for the log {checkpoint.origin!r}, not {expected!r}")
    if checkpoint.size == 0 and checkpoint.root_hash != EMPTY_ROOT:
        raise ProofError("a checkpoint of 0 entries must carry the empty tree's root hash")
    cosigners = tuple(w.name for s in note.signatures for w in witnesses
                      if (s.name, s.key_id) == (w.name, w.key_id))
    cosigners = tuple(dict.fromkeys(cosigners))  # a key that cosigned twice counts once
    if len(cosigners) < quorum:
        got = ", ".join(cosigners) or "none"
        raise SignatureError(f"{quorum} of {len(witnesses)} witness cosignatures are required and "
                             f"{len(cosigners)} verified ({got})")
    return VerifiedCheckpoint(checkpoint, note, bytes(message), cosigners)
