"""The transparency log's errors: every refusal of :mod:`phsafe.tlog` is one of these.

They subclass the project's :class:`~phsafe.errors.PHSafeError`, so a front end that reports
``PHSafeError`` as one line reports these too. Messages are one line, say what was checked and
what failed, and carry only public facts (sizes, indexes, key names, origins, hashes of public
entries) -- never an entry's bytes, which a caller may not want echoed.

    TlogError                     base class
    ├── MalformedError            bytes that are not the documented format (note, checkpoint, key,
    │                             proof file, witness request, published log, store file)
    ├── SignatureError            a note lacks a valid signature by a trusted key, a trusted key's
    │                             signature fails, or too few witnesses cosigned
    ├── ProofError                an inclusion or consistency proof does not verify (or cannot be
    │                             made: index or sizes out of range)
    ├── ForkError                 two signed checkpoints of one log that cannot both be true
    ├── WitnessRefusal            a witness declines to cosign (status as in C2SP tlog-witness)
    └── StoreError                a hash store, state store or key file is unusable
        └── StaleStateError       a compare-and-swap of a checkpoint store lost a race
"""

from __future__ import annotations

from phsafe.errors import PHSafeError


class TlogError(PHSafeError):
    """Base class of the transparency log's errors."""


class MalformedError(TlogError):
    """Bytes that are not the documented format.

    Args:
        what: What was being read, e.g. ``"checkpoint"``, ``"signed note"``, ``"tlog-proof"``.
        rule: The rule that failed, in plain words.
    """

    def __init__(self, what: str, rule: str) -> None:
        self.what = what
        self.rule = rule
        super().__init__(f"malformed {what}: {rule}")


class SignatureError(TlogError):
    """A note is not validly signed by the keys it must be signed by."""


class ProofError(TlogError):
    """An inclusion or consistency proof does not verify, or cannot be made."""


class ForkError(TlogError):
    """Two checkpoints signed by one log's key that no append-only log can both have produced.

    Both notes are kept as evidence: published side by side, they prove the log misbehaved.

    Args:
        message: What was found, in one line.
        first: The earlier-seen signed checkpoint (note bytes).
        second: The newly seen signed checkpoint (note bytes).
    """

    def __init__(self, message: str, *, first: bytes, second: bytes) -> None:
        self.first = first
        self.second = second
        super().__init__(message)


class WitnessRefusal(TlogError):
    """A witness declined to cosign a checkpoint.

    ``status`` is the HTTP status the C2SP tlog-witness protocol assigns to the refusal, so a
    network front end can answer with it unchanged: 400 (bad request, e.g. old size larger than
    the checkpoint's), 403 (not signed by the log's key), 404 (unknown log), 409 (the old size is
    not the size the witness last cosigned; ``latest_size`` then says which it is), 422 (the
    consistency proof does not verify, or the same size came with another root hash).
    """

    def __init__(self, status: int, message: str, *, latest_size: int | None = None) -> None:
        self.status = status
        self.latest_size = latest_size
        super().__init__(message)


class StoreError(TlogError):
    """A store (hash file, checkpoint state, key file, log directory) is unusable as found."""


class StaleStateError(StoreError):
    """A checkpoint store's compare-and-swap found another value than the one expected."""
