"""A verifier's memory of the checkpoints it has seen: every new one must be consistent with it.

As Go's checksum-database client does, a person who checks a log keeps the latest checkpoint
they verified (per log, in a :class:`~phsafe.tlog.state.CheckpointStore`, e.g. a small file in
their home folder) and checks each newly seen checkpoint against it:

- larger than the one kept: a consistency proof from the kept one must verify; the new one is
  kept;
- smaller: a consistency proof from it to the kept one must verify; the kept one stays;
- the same size: the root hashes must be equal.

Anything else is a :class:`~phsafe.errors.ForkError` carrying both signed checkpoints: two
statements signed by the log's key that no append-only log can have made -- the log showed
different histories to different people, or rewrote its own.

Proofs come from a caller-supplied ``prove(smaller size, larger size)`` (a log server, or the
verifier's own copy of the published entries), called only for 0 < smaller < larger.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from phsafe.tlog.checkpoint import VerifiedCheckpoint, verify_checkpoint
from phsafe.errors import ForkError, MalformedError, ProofError, SignatureError, StaleStateError, StoreError
from phsafe.tlog.merkle import verify_consistency
from phsafe.tlog.note import Verifier
from phsafe.tlog.state import CheckpointStore

ConsistencyProver = Callable[[int, int], Sequence[bytes]]
"""``prove(old_size, new_size)``: the consistency proof between the trees of those sizes."""

_ATTEMPTS = 5  # compare-and-swap retries when another process updates the state meanwhile


class SeenCheckpoints:
    """The latest checkpoint seen of one log, and the fork check of every new one.

    Args:
        store: Where the latest checkpoint is kept (per origin).
        log_verifier: The log's verifier key.
        witnesses: Witness keys; with ``quorum``, how many must have cosigned a new checkpoint.
        origin: The log's origin, if not its key's name.
    """

    def __init__(self, store: CheckpointStore, log_verifier: Verifier, *, witnesses: Sequence[Verifier] = (),
                 quorum: int = 0, origin: str | None = None) -> None:
        self._store = store
        self._verifier = log_verifier
        self._witnesses = tuple(witnesses)
        self._quorum = quorum
        self.origin = log_verifier.name if origin is None else origin

    def latest(self) -> VerifiedCheckpoint | None:
        """The checkpoint kept (verified again with the log's key), or None before the first."""
        return self._load()[1]

    def _load(self) -> tuple[bytes | None, VerifiedCheckpoint | None]:
        stored = self._store.load(self.origin)
        if stored is None:
            return None, None
        try:
            return stored, verify_checkpoint(stored, self._verifier, origin=self.origin)
        except (MalformedError, SignatureError, ProofError) as exc:
            raise StoreError(f"the kept checkpoint of {self.origin} does not verify ({exc})") from None

    def observe(self, message: bytes, prove: ConsistencyProver) -> VerifiedCheckpoint:
        """Verify a newly seen signed checkpoint and its consistency with the one kept.

        Returns the verified new checkpoint; keeps it if it is larger than the one kept.

        Raises:
            SignatureError, MalformedError, ProofError: As :func:`verify_checkpoint`.
            ForkError: It is inconsistent with the checkpoint kept.
        """
        new = verify_checkpoint(message, self._verifier, witnesses=self._witnesses, quorum=self._quorum,
                                origin=self.origin)
        for _ in range(_ATTEMPTS):
            stored, kept = self._load()
            if stored is None or kept is None:
                try:
                    self._store.replace(self.origin, None, new.message)
                except StaleStateError:
                    continue
                return new
            self._check_consistent(kept, new, prove)
            if new.checkpoint.size <= kept.checkpoint.size:
                return new
            try:
                self._store.replace(self.origin, stored, new.message)
            except StaleStateError:
                continue
            return new
        raise StoreError(f"the kept checkpoint of {self.origin} kept changing while it was being updated")

    def _check_consistent(self, kept: VerifiedCheckpoint, new: VerifiedCheckpoint, prove: ConsistencyProver) -> None:
        small, large = sorted((kept, new), key=lambda v: v.checkpoint.size)
        old, cur = small.checkpoint, large.checkpoint
        proof: Sequence[bytes] = prove(old.size, cur.size) if 0 < old.size < cur.size else ()
        try:
            verify_consistency(old.size, old.root_hash, cur.size, cur.root_hash, proof)
        except ProofError as exc:
            if old.size == cur.size:
                what = f"two checkpoints of {self.origin} of size {old.size} have different root hashes"
            else:
                what = (f"the checkpoint of {self.origin} of size {cur.size} does not extend the one of "
                        f"size {old.size} ({exc})")
            raise ForkError(f"{what}: the log forked or rewrote its history",
                            first=kept.message, second=new.message) from None
