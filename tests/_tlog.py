"""Keys and logs for the transparency-log tests: fixed seeds, so failures reproduce."""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phsafe.tlog.checkpoint import Checkpoint, sign_checkpoint
from phsafe.tlog.cosignature import CosignatureSigner, CosignatureVerifier
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.note import Ed25519Signer, Ed25519Verifier

ORIGIN = "census.example/phsafe/privacy-loss/test"
NOW = 1_750_000_000


def private_key(label: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(label.encode()).digest())


def log_signer(name: str = ORIGIN, label: str = "log") -> Ed25519Signer:
    return Ed25519Signer(name, private_key(label))


def log_verifier(name: str = ORIGIN, label: str = "log") -> Ed25519Verifier:
    return Ed25519Verifier(name, log_signer(name, label).public_key)


def witness_signer(number: int, clock: int = NOW) -> CosignatureSigner:
    return CosignatureSigner(f"witness{number}.example", private_key(f"witness {number}"), lambda: clock)


def witness_verifier(number: int) -> CosignatureVerifier:
    return CosignatureVerifier(f"witness{number}.example", witness_signer(number).public_key)


def entries(n: int, tag: str = "") -> list[bytes]:
    return [f'{{"entry":{i}{tag}}}'.encode() for i in range(n)]


def signed_checkpoint(log: TransparencyLog, size: int | None = None, *, signer: Ed25519Signer | None = None,
                      origin: str = ORIGIN) -> bytes:
    size = log.size if size is None else size
    return sign_checkpoint(Checkpoint(origin, size, log.root(size)), [signer or log_signer()])
