"""C2SP checkpoint cosignatures, Ed25519 ``cosignature/v1`` (c2sp.org/tlog-cosignature).

A cosignature is a note signature line added to a checkpoint by a witness::

    — <witness name> base64(key ID || timestamp || Ed25519 signature)

- key ID = SHA-256(<witness name> || 0x0A || 0x04 || 32-byte Ed25519 public key)[:4];
- timestamp = the POSIX time of signing in seconds, 8 bytes big-endian, 1 <= t <= 2^63 - 1;
- the Ed25519 signature (64 bytes) is over the message::

      cosignature/v1
      time <timestamp in ASCII decimal, no leading zeros>
      <the checkpoint's whole note text: origin, size, root hash, any extension lines>

  each line ending in a newline. Its meaning: as of that time, the largest consistent tree the
  witness has seen for that origin has that root hash. The message does not name the witness:
  one Ed25519 key must serve one witness name only.

So the signature part of a cosignature line is 72 bytes (76 with the key ID). Both classes
refuse a note text that is not a checkpoint: a witness vouches for tree heads only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phsafe.tlog.checkpoint import parse_checkpoint
from phsafe.errors import MalformedError
from phsafe.tlog.note import ALG_COSIGNATURE_V1, Ed25519Signer, Ed25519Verifier, NoteSignature

COSIGNATURE_V1_HEADER = "cosignature/v1"
MAX_TIMESTAMP = (1 << 63) - 1
COSIGNATURE_SIZE = 8 + 64
"""Bytes after the key ID: the timestamp and the Ed25519 signature."""


def cosigned_message(checkpoint_text: bytes, timestamp: int) -> bytes:
    """The bytes a ``cosignature/v1`` signs for a checkpoint text at ``timestamp``."""
    return f"{COSIGNATURE_V1_HEADER}\ntime {timestamp}\n".encode("ascii") + checkpoint_text


def cosignature_timestamp(signature: NoteSignature) -> int:
    """The POSIX time a cosignature states it was made."""
    if len(signature.signature) != COSIGNATURE_SIZE:
        raise MalformedError("cosignature", f"it is {len(signature.signature)} bytes, not {COSIGNATURE_SIZE}")
    return int.from_bytes(signature.signature[:8], "big")


def _is_checkpoint(text: bytes) -> bool:
    try:
        parse_checkpoint(text.decode("utf-8"))
    except (MalformedError, UnicodeDecodeError):
        return False
    return True


class CosignatureSigner(Ed25519Signer):
    """A witness's Ed25519 cosigning key (signature type 0x04) under ``name``.

    Args:
        name: The witness's name (a key name: no spaces, no ``+``).
        private_key: Its Ed25519 private key.
        clock: Returns the current POSIX time in seconds (tests pass a fixed one).
    """

    alg = ALG_COSIGNATURE_V1

    def __init__(self, name: str, private_key: Ed25519PrivateKey,
                 clock: Callable[[], int] = lambda: int(time.time())) -> None:
        super().__init__(name, private_key)
        self._clock = clock

    def sign(self, text: bytes) -> bytes:
        if not _is_checkpoint(text):
            raise MalformedError("checkpoint", "a witness cosigns checkpoints only")
        timestamp = int(self._clock())
        if not 0 < timestamp <= MAX_TIMESTAMP:
            raise ValueError(f"the clock gave {timestamp}, not a positive 63-bit POSIX time")
        return timestamp.to_bytes(8, "big") + super().sign(cosigned_message(text, timestamp))


class CosignatureVerifier(Ed25519Verifier):
    """Verifies ``cosignature/v1`` cosignatures of the witness key ``public_key`` named ``name``."""

    alg = ALG_COSIGNATURE_V1
    signature_size = COSIGNATURE_SIZE

    def signed_message(self, text: bytes, signature: bytes) -> tuple[bytes, bytes] | None:
        timestamp = int.from_bytes(signature[:8], "big")
        if timestamp > MAX_TIMESTAMP or not _is_checkpoint(text):
            return None
        return cosigned_message(text, timestamp), signature[8:]
