"""A transparency log: RFC 6962 Merkle hashing, C2SP signed notes, checkpoints and proofs."""

from __future__ import annotations

from phsafe.tlog.errors import ForkError, MalformedError, ProofError, SignatureError, StaleStateError, StoreError, TlogError, WitnessRefusal
from phsafe.tlog.log import HashStore, MemoryHashStore, TransparencyLog
from phsafe.tlog.merkle import EMPTY_ROOT, leaf_hash, node_hash, verify_consistency, verify_inclusion

__all__ = [
    "EMPTY_ROOT", "ForkError", "HashStore", "MalformedError", "MemoryHashStore", "ProofError",
    "SignatureError", "StaleStateError", "StoreError", "TlogError", "TransparencyLog", "WitnessRefusal",
    "leaf_hash", "node_hash", "verify_consistency", "verify_inclusion",
]
