"""A Merkle log over a hash store: append entries, read tree heads and proofs. No I/O here.

:class:`TransparencyLog` keeps no entries, only their stored hashes (see :mod:`.merkle` for the
numbering), through the small :class:`HashStore` interface; :class:`MemoryHashStore` is the
in-memory store, and :class:`phsafe.tlog.files.FileHashStore` the append-only file of 32-byte
hashes. The entries themselves live with their owner (the ledger's public projection, or a
published log's ``entries`` file).

The log's size is derived from the store's hash count (2n - popcount(n) for n entries), so a
store cut in the middle of an append is detected as such rather than mistaken for a smaller log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from phsafe.errors import StoreError
from phsafe.tlog.merkle import (
    HashReader,
    consistency_proof,
    hashes_to_store,
    inclusion_proof,
    leaf_hash,
    stored_hash_count,
    tree_hash,
    tree_size_for_stored_count,
)


class HashStore(HashReader, Protocol):
    """An append-only sequence of 32-byte stored hashes."""

    def stored_count(self) -> int:
        """How many hashes the store holds."""
        ...

    def append_hashes(self, hashes: Sequence[bytes]) -> None:
        """Append ``hashes`` (all of them, or -- on a crash -- a prefix the next open detects)."""
        ...


class MemoryHashStore:
    """A :class:`HashStore` in a Python list."""

    def __init__(self, hashes: Iterable[bytes] = ()) -> None:
        self._hashes: list[bytes] = list(hashes)

    def stored_count(self) -> int:
        return len(self._hashes)

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]:
        count = len(self._hashes)
        for i in indexes:
            if not 0 <= i < count:
                raise StoreError(f"the hash store holds {count} hashes; there is none at index {i}")
        return [self._hashes[i] for i in indexes]

    def append_hashes(self, hashes: Sequence[bytes]) -> None:
        self._hashes.extend(bytes(h) for h in hashes)


class _PendingHashes:
    """The store's hashes followed by hashes computed in this batch but not yet stored."""

    def __init__(self, store: HashStore, base: int, pending: list[bytes]) -> None:
        self._store = store
        self._base = base
        self._pending = pending

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]:
        stored = [i for i in indexes if i < self._base]
        found = dict(zip(stored, self._store.read_hashes(stored)))
        return [found[i] if i < self._base else self._pending[i - self._base] for i in indexes]


class TransparencyLog:
    """An append-only Merkle log (RFC 6962 hashing) whose hashes live in ``store``.

    It is not safe for concurrent writers: the owner serialises appends (the ledger appends
    under its lock).
    """

    def __init__(self, store: HashStore) -> None:
        self.store = store

    @classmethod
    def of_entries(cls, entries: Iterable[bytes]) -> "TransparencyLog":
        """A log in memory holding ``entries`` (e.g. to check a published log's tree head)."""
        log = cls(MemoryHashStore())
        log.append(entries)
        return log

    @property
    def size(self) -> int:
        """The number of entries (StoreError if the store was cut in the middle of an append)."""
        return tree_size_for_stored_count(self.store.stored_count())

    def hashes_for(self, entries: Iterable[bytes]) -> list[bytes]:
        """The stored hashes appending ``entries`` would add, computed without writing them.

        For owners that write something else first (the entries themselves) and the hashes
        after; :meth:`append` is this plus the store write.
        """
        first = self.size
        pending: list[bytes] = []
        reader = _PendingHashes(self.store, stored_hash_count(first), pending)
        for index, entry in enumerate(entries, start=first):
            pending.extend(hashes_to_store(index, leaf_hash(bytes(entry)), reader))
        return pending

    def append(self, entries: Iterable[bytes]) -> range:
        """Append ``entries`` in order with one store write; returns their indexes."""
        first = self.size
        pending = self.hashes_for(entries)
        if pending:
            self.store.append_hashes(pending)
        return range(first, self.size)

    def _check_size(self, size: int | None) -> int:
        current = self.size
        if size is None:
            return current
        if not 0 <= size <= current:
            raise ValueError(f"the log has {current} entries; no tree of {size} entries")
        return size

    def root(self, size: int | None = None) -> bytes:
        """The tree head (root hash) of the first ``size`` entries (default: all of them)."""
        return tree_hash(self._check_size(size), self.store)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """The inclusion proof of entry ``index`` in the tree of the first ``size`` entries."""
        return inclusion_proof(index, self._check_size(size), self.store)

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        """The consistency proof from the tree of ``old_size`` entries to that of ``new_size``."""
        return consistency_proof(old_size, self._check_size(new_size), self.store)
