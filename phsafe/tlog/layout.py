"""The published log's static files, and their verification; pure (bytes in, results out).

A log is published as one folder of static files (any web server or file share serves it)::

    <log>/checkpoint   the latest signed checkpoint (a C2SP checkpoint note, with any witness
                       cosignatures); replaced atomically, never edited in place
    <log>/entries      every entry, in log order: entry i is line i (0-based), its exact bytes
                       followed by one newline (0x0A); an entry never contains 0x0A; append-only
    <log>/log.vkey     the log's verifier key (one line) -- a convenience copy: a verifier must
                       get the key it trusts from somewhere else than the log it checks
    <log>/hashes       the writer's stored hashes (:mod:`.files`); derivable from ``entries``,
                       never read by a verifier

Why not C2SP tlog-tiles: tiles let a client download the O(log n) hashes of one proof from a log of
millions or billions of entries without the entries. Here a log has at most thousands of entries
of a few kilobytes, so the whole ``entries`` file is a few megabytes; every reader of the full
log needs every entry anyway (the public privacy-loss statement sums every spend of every
dataset); and the reader who needs one entry only -- checking one release -- has its offline
``.tlog-proof`` and needs nothing from the log. Tiles would add a path scheme, partial-tile
replacement and a 64 KiB entry limit for no reader's benefit. The Merkle tree, checkpoints and
proofs are still the standard ones, so a tiles view can be generated from these files later.

Verification of a published log (:func:`verify_published_log`): the checkpoint must verify
(log key, origin, witness quorum); ``entries`` must hold at least the checkpoint's size of
whole lines; the RFC 6962 tree of the first ``size`` entries must have the checkpoint's root
hash -- an entry changed, removed, added inside the tree or reordered changes it. Lines past the
signed size (entries appended before the next checkpoint was signed; a torn last line of an
append under way) are not part of the verified log and are only counted.

A reader reads ``checkpoint`` first, then ``entries``: the writer appends entries before it
replaces the checkpoint, so the entries read always cover the checkpoint read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from phsafe.tlog.checkpoint import VerifiedCheckpoint, verify_checkpoint
from phsafe.errors import MalformedError, ProofError
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.note import Verifier

CHECKPOINT_FILE = "checkpoint"
ENTRIES_FILE = "entries"
VERIFIER_KEY_FILE = "log.vkey"
HASHES_FILE = "hashes"
PUBLISHED_FILES = (CHECKPOINT_FILE, ENTRIES_FILE, VERIFIER_KEY_FILE)
"""What a published copy of the log holds (``hashes`` may be left out)."""

MAX_ENTRY_SIZE = 1 << 20
"""Bytes an entry may have: a bound on what a reader must hold, far above a run's spends."""


def check_entry(entry: bytes) -> None:
    """Refuse an entry the ``entries`` file cannot hold: one with a newline, or over 1 MiB."""
    if b"\n" in entry:
        raise MalformedError("log entry", "it contains a newline (0x0A), which ends an entry in the entries file")
    if len(entry) > MAX_ENTRY_SIZE:
        raise MalformedError("log entry", f"it is over {MAX_ENTRY_SIZE} bytes")


def encode_entries(entries: Iterable[bytes]) -> bytes:
    """The lines ``entries`` add to the entries file."""
    out = []
    for entry in entries:
        check_entry(entry)
        out.append(bytes(entry) + b"\n")
    return b"".join(out)


def decode_entries(data: bytes) -> tuple[list[bytes], int]:
    """The whole lines of an entries file, and the length of a torn last line (0 if none)."""
    end = data.rfind(b"\n") + 1
    whole = data[:end].split(b"\n")[:-1] if end else []
    for entry in whole:
        if len(entry) > MAX_ENTRY_SIZE:
            raise MalformedError("entries file", f"an entry is over {MAX_ENTRY_SIZE} bytes")
    return whole, len(data) - end


@dataclass(frozen=True)
class PublishedLog:
    """A verified published log: its checkpoint and exactly the entries it signs."""

    checkpoint: VerifiedCheckpoint
    entries: tuple[bytes, ...]
    unsigned_tail: int
    """Whole entries past the checkpoint's size, plus 1 for a torn last line (not verified)."""
    log: TransparencyLog
    """The tree of ``entries`` in memory, for proofs (e.g. a client's consistency checks)."""

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        """A :data:`~phsafe.tlog.client.ConsistencyProver` over the verified entries."""
        return self.log.consistency_proof(old_size, new_size)


def verify_published_log(checkpoint: bytes, entries_data: bytes, log_verifier: Verifier, *,
                         witnesses: Sequence[Verifier] = (), quorum: int = 0,
                         origin: str | None = None) -> PublishedLog:
    """Verify a published log's two files' bytes (see the module docstring for the checks)."""
    verified = verify_checkpoint(checkpoint, log_verifier, witnesses=witnesses, quorum=quorum, origin=origin)
    size = verified.checkpoint.size
    whole, torn = decode_entries(entries_data)
    if len(whole) < size:
        raise ProofError(f"the checkpoint signs {size} entries and the entries file has {len(whole)}: "
                         "entries were removed")
    signed = whole[:size]
    log = TransparencyLog.of_entries(signed)
    if log.root() != verified.checkpoint.root_hash:
        raise ProofError(f"the first {size} entries do not hash to the checkpoint's root hash: "
                         "an entry was changed, removed, inserted or reordered")
    return PublishedLog(verified, tuple(signed), len(whole) - size + (1 if torn else 0), log)
