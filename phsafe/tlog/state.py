"""Where a witness or a client keeps the latest checkpoint per log: a compare-and-swap store.

Both a witness (the checkpoint it last cosigned) and a client (the checkpoint it last saw, with
its tree's leaf hashes: :class:`SeenLog`) keep one signed checkpoint per origin, and both must
check-then-update atomically: the tlog-witness
spec shows how two interleaved requests could otherwise roll a witness back. So the interface
is a compare-and-swap, :meth:`CheckpointStore.replace`, rather than a plain write. The values
are the signed notes' bytes; the stores neither parse nor verify them (their users do, on load).

:class:`MemoryCheckpointStore` is here; the file-backed JSON store is
:class:`phsafe.tlog.files.FileCheckpointStore`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from phsafe.errors import StaleStateError


class CheckpointStore(Protocol):
    """The latest signed checkpoint per origin, replaced by compare-and-swap."""

    def load(self, origin: str) -> bytes | None:
        """The stored checkpoint of ``origin``, or None if there is none."""
        ...

    def replace(self, origin: str, expected: bytes | None, new: bytes) -> None:
        """Store ``new`` for ``origin`` if the stored value is still ``expected`` (None: absent).

        Raises:
            StaleStateError: The stored value is not ``expected``; nothing was written.
        """
        ...


class MemoryCheckpointStore:
    """A :class:`CheckpointStore` in a dict, safe across threads."""

    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def load(self, origin: str) -> bytes | None:
        with self._lock:
            return self._values.get(origin)

    def replace(self, origin: str, expected: bytes | None, new: bytes) -> None:
        with self._lock:
            if self._values.get(origin) != expected:
                raise StaleStateError(f"the stored checkpoint of {origin} changed meanwhile")
            self._values[origin] = bytes(new)


@dataclass(frozen=True)
class SeenLog:
    """What a client keeps of one log: the largest signed checkpoint it has seen (with the
    witnesses' cosignatures, and so their times) and the leaf hashes of that tree, by which a
    smaller checkpoint seen later is told apart as an older view (a prefix) or a fork."""

    checkpoint: bytes
    leaf_hashes: bytes = b""
    """The RFC 6962 leaf hashes of the checkpoint's tree, 32 bytes each, concatenated; empty
    when not kept (a state written before they were)."""


class SeenLogStore(Protocol):
    """The :class:`SeenLog` per origin, replaced by compare-and-swap (on the checkpoint's bytes)."""

    def load(self, origin: str) -> SeenLog | None: ...

    def replace(self, origin: str, expected: bytes | None, new: SeenLog) -> None:
        """Store ``new`` if the stored checkpoint is still ``expected`` (None: absent).

        Raises:
            StaleStateError: It is not; nothing was written.
        """
        ...


class MemorySeenLogs:
    """A :class:`SeenLogStore` in a dict, safe across threads."""

    def __init__(self) -> None:
        self._values: dict[str, SeenLog] = {}
        self._lock = threading.Lock()

    def load(self, origin: str) -> SeenLog | None:
        with self._lock:
            return self._values.get(origin)

    def replace(self, origin: str, expected: bytes | None, new: SeenLog) -> None:
        with self._lock:
            current = self._values.get(origin)
            if (None if current is None else current.checkpoint) != expected:
                raise StaleStateError(f"the kept checkpoint of {origin} changed meanwhile")
            self._values[origin] = new
