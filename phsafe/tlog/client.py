"""A verifier's memory of the logs it has seen: every new checkpoint must agree with it.

As Go's checksum-database client does, a person who checks a log keeps the largest checkpoint
they verified (per log, in a :class:`~phsafe.tlog.state.SeenLogStore`, e.g. a small file in
their home folder) -- with its witnesses' cosignatures, whose times say how fresh that view was
-- and the leaf hashes of its tree. Each newly seen checkpoint is checked against it:

- larger: a consistency proof from the kept one must verify; the new one is kept;
- the same size: the root hashes must be equal (the new one is kept: its cosignatures may be
  newer);
- smaller: never accepted, because the log was seen larger. With the kept leaf hashes the
  smaller tree is recomputed: the same root means the log shows an older view of itself (a
  *rollback*, :class:`~phsafe.errors.RollbackError`: a stale copy, or a log rolled back);
  another root means it is not even a prefix (a *fork*).

Anything inconsistent is a :class:`~phsafe.errors.ForkError` carrying both signed checkpoints:
two statements signed by the log's key that no append-only log can have made -- the log showed
different histories to different people, or rewrote its own. Messages give both sizes and
both root hashes (base64, as checkpoints write them).

Proofs for a larger checkpoint come from a caller-supplied ``prove(smaller size, larger size)``
(the verifier's copy of the published entries), called only for 0 < smaller < larger.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phsafe.errors import (
    EquivocationError,
    ForkError,
    MalformedError,
    ProofError,
    RollbackError,
    SignatureError,
    StaleStateError,
    StoreError,
)
from phsafe.tlog.checkpoint import VerifiedCheckpoint, verify_checkpoint
from phsafe.tlog.evidence import evidence_from_tree, same_size_evidence
from phsafe.tlog.log import MemoryHashStore, TransparencyLog
from phsafe.tlog.merkle import HASH_SIZE, hashes_to_store, tree_hash, verify_consistency
from phsafe.tlog.note import Verifier
from phsafe.tlog.state import SeenLog, SeenLogStore

ConsistencyProver = Callable[[int, int], Sequence[bytes]]
"""``prove(old_size, new_size)``: the consistency proof between the trees of those sizes."""

_ATTEMPTS = 5  # compare-and-swap retries when another process updates the state meanwhile


def _root(checkpoint: VerifiedCheckpoint) -> str:
    return base64.b64encode(checkpoint.checkpoint.root_hash).decode("ascii")


def tree_of_leaves(leaf_hashes: bytes) -> TransparencyLog:
    """The tree whose leaf hashes are ``leaf_hashes`` (32 bytes each), in memory."""
    store = MemoryHashStore()
    for index in range(len(leaf_hashes) // HASH_SIZE):
        store.append_hashes(hashes_to_store(index, leaf_hashes[index * HASH_SIZE:(index + 1) * HASH_SIZE], store))
    return TransparencyLog(store)


def prefix_root(leaf_hashes: bytes, size: int) -> bytes:
    """The RFC 6962 root of the first ``size`` leaves, from their leaf hashes."""
    return tree_hash(size, tree_of_leaves(leaf_hashes[:size * HASH_SIZE]).store)


def _fork(message: str, kept: VerifiedCheckpoint, new: VerifiedCheckpoint, leaves: bytes) -> ForkError:
    """A fork, as :class:`EquivocationError` with its evidence when ``leaves`` (the leaf hashes of
    the larger tree: the new one, or the kept one) make it provable by itself."""
    evidence = None
    if leaves:
        tree = tree_of_leaves(leaves)
        evidence = evidence_from_tree(kept.message, new.message, tree, found_by="a client's saved state")
    if evidence is None:
        return ForkError(message, first=kept.message, second=new.message)
    return EquivocationError(message, first=kept.message, second=new.message, evidence=evidence)


@dataclass(frozen=True)
class Observation:
    """A new checkpoint, verified and consistent with what was seen before."""

    checkpoint: VerifiedCheckpoint
    previous: VerifiedCheckpoint | None
    """The largest checkpoint seen before this one (None: the log is seen for the first time)."""


class SeenCheckpoints:
    """The largest checkpoint seen of one log, and the check of every new one.

    Args:
        store: Where it is kept (per origin).
        log_verifier: The log's verifier key.
        witnesses: Witness keys; with ``quorum``, how many must have cosigned a new checkpoint.
        origin: The log's origin, if not its key's name.
    """

    def __init__(self, store: SeenLogStore, log_verifier: Verifier, *, witnesses: Sequence[Verifier] = (),
                 quorum: int = 0, origin: str | None = None) -> None:
        self._store = store
        self._verifier = log_verifier
        self._witnesses = tuple(witnesses)
        self._quorum = quorum
        self.origin = log_verifier.name if origin is None else origin

    def latest(self) -> VerifiedCheckpoint | None:
        """The checkpoint kept (verified again with the log's key), or None before the first."""
        return self._load()[1]

    def _load(self) -> tuple[SeenLog | None, VerifiedCheckpoint | None]:
        stored = self._store.load(self.origin)
        if stored is None:
            return None, None
        try:
            return stored, verify_checkpoint(stored.checkpoint, self._verifier, witnesses=self._witnesses,
                                             origin=self.origin)
        except (MalformedError, SignatureError, ProofError) as exc:
            raise StoreError(f"the kept checkpoint of {self.origin} does not verify ({exc})") from None

    def observe(self, message: bytes, prove: ConsistencyProver, leaf_hashes: bytes = b"", *,
                keep: bool = True) -> Observation:
        """Verify a newly seen signed checkpoint and check it against the one kept; keep it
        (with ``leaf_hashes``, the leaf hashes of its tree) unless it is smaller, or ``keep`` is
        False (a checkpoint checked for conflicts that is not to be trusted: e.g. its witness
        quorum is not met).

        Raises:
            SignatureError, MalformedError, ProofError: As :func:`verify_checkpoint`.
            RollbackError: It is smaller than the checkpoint kept and a prefix of its tree.
            ForkError: It is inconsistent with the checkpoint kept.
        """
        new = verify_checkpoint(message, self._verifier, witnesses=self._witnesses, quorum=self._quorum,
                                origin=self.origin)
        if leaf_hashes and len(leaf_hashes) != HASH_SIZE * new.checkpoint.size:
            raise ValueError("the leaf hashes given are not those of the checkpoint's tree")
        for _ in range(_ATTEMPTS):
            stored, kept = self._load()
            leaves, keep_it = leaf_hashes, keep
            if stored is not None and kept is not None:
                self._check(stored, kept, new, prove, leaf_hashes)  # refuses a smaller checkpoint
                if not leaves and kept.checkpoint.size == new.checkpoint.size:
                    leaves = stored.leaf_hashes
            if not keep_it:
                return Observation(new, kept)
            try:
                self._store.replace(self.origin, None if stored is None else stored.checkpoint,
                                    SeenLog(new.message, leaves))
            except StaleStateError:
                continue
            return Observation(new, kept)
        raise StoreError(f"the kept checkpoint of {self.origin} kept changing while it was being updated")

    def _check(self, stored: SeenLog, kept: VerifiedCheckpoint, new: VerifiedCheckpoint,
               prove: ConsistencyProver, new_leaves: bytes = b"") -> None:
        old, cur = kept.checkpoint, new.checkpoint
        both = (f"the checkpoint of size {cur.size} (root {_root(new)}) seen now, and the one of size {old.size} "
                f"(root {_root(kept)}) seen before")
        if cur.size == old.size:
            if cur.root_hash != old.root_hash:
                raise EquivocationError(
                    f"fork: two checkpoints of {self.origin} of size {old.size} have different root hashes "
                    f"({_root(kept)} seen before, {_root(new)} now): the log forked or rewrote its history",
                    first=kept.message, second=new.message,
                    evidence=same_size_evidence(kept.message, new.message, found_by="a client's saved state"))
            return
        if cur.size > old.size:
            try:
                verify_consistency(old.size, old.root_hash, cur.size, cur.root_hash,
                                   prove(old.size, cur.size) if old.size else ())
            except ProofError as exc:
                raise _fork(f"fork: {both} -- the larger does not extend the smaller ({exc}): the log forked or "
                            "rewrote its history", kept, new, new_leaves) from None
            return
        leaves = stored.leaf_hashes
        if len(leaves) == HASH_SIZE * old.size:
            if prefix_root(leaves, cur.size) == cur.root_hash:
                raise RollbackError(f"rollback: {both} -- the smaller is a prefix of the larger: this log shows an "
                                    "older view of itself than one seen before (a stale copy, or a log rolled back)",
                                    first=kept.message, second=new.message)
            raise _fork(f"fork: {both} -- the smaller is not a prefix of the larger: the log forked or rewrote its "
                        "history", kept, new, leaves)
        raise RollbackError(f"rollback or fork: {both} -- a log never shrinks (the state kept has no leaf hashes to "
                            "tell which)", first=kept.message, second=new.message)
