"""Text encodings of note keys: verifier keys (public) and signer keys (private).

Verifier key (c2sp.org/signed-note), one line, public::

    <key name>+<key ID, 8 lowercase hex digits>+<base64(type byte || 32-byte Ed25519 public key)>

e.g. ``example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k``. The type byte is
0x01 for a log's key (Ed25519 note signatures) and 0x04 for a witness's key (``cosignature/v1``);
the key ID is computed from name, type and key and must match the one written.

Signer key, one line, private (a file of mode 0600, see :mod:`.files`)::

    PRIVATE+KEY+<key name>+<key ID hex>+<base64(type byte || 32-byte Ed25519 seed)>

This is the form Go's ``golang.org/x/mod/sumdb/note`` package reads and writes for type 0x01,
chosen over PEM because it carries what a note key is -- its name and signature type -- beside
the secret, and re-derives and checks the key ID on load, so a key file cannot be paired with
the wrong name; type 0x04 extends it to witness keys the same way. Errors never repeat a signer
key's text.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from phsafe.tlog.cosignature import CosignatureSigner, CosignatureVerifier
from phsafe.errors import MalformedError
from phsafe.tlog.note import (
    ALG_COSIGNATURE_V1,
    ALG_ED25519,
    Ed25519Signer,
    Ed25519Verifier,
    check_key_name,
    decode_base64,
    key_id,
    raw_public_key,
)

SIGNER_KEY_PREFIX = "PRIVATE+KEY+"
KEY_TYPES = {ALG_ED25519: "Ed25519 note signatures", ALG_COSIGNATURE_V1: "Ed25519 cosignature/v1"}

AnySigner = Ed25519Signer | CosignatureSigner
AnyVerifier = Ed25519Verifier | CosignatureVerifier


def _encode(alg: int, key: bytes) -> str:
    return base64.b64encode(bytes([alg]) + key).decode("ascii")


def format_verifier_key(verifier: AnyVerifier | AnySigner) -> str:
    """The verifier key string of a verifier or of a signer's public half."""
    return f"{verifier.name}+{verifier.key_id:08x}+{_encode(verifier.alg, verifier.public_key)}"


def _split_key(parts: list[str], what: str) -> tuple[str, int, int, bytes]:
    if len(parts) != 3:
        raise MalformedError(what, "it is not '<name>+<key ID hex>+<base64 key>'")
    name, hex_id, blob = parts
    check_key_name(name)
    if len(hex_id) != 8 or any(c not in "0123456789abcdef" for c in hex_id):
        raise MalformedError(what, "its key ID is not 8 lowercase hex digits")
    raw = decode_base64(blob, what)
    if len(raw) != 33 or raw[0] not in KEY_TYPES:
        raise MalformedError(what, "it is not an Ed25519 key of type 0x01 or 0x04 (33 bytes with the type)")
    return name, int(hex_id, 16), raw[0], raw[1:]


def verifier_from_key(vkey: str) -> AnyVerifier:
    """The verifier a verifier key string describes (type 0x01: a log; 0x04: a witness).

    The base64 part may itself contain ``+``: the string splits at its first two ``+`` only.
    """
    name, written_id, alg, public_key = _split_key(vkey.strip().split("+", 2), "verifier key")
    verifier: AnyVerifier = (Ed25519Verifier(name, public_key) if alg == ALG_ED25519
                             else CosignatureVerifier(name, public_key))
    if verifier.key_id != written_id:
        raise MalformedError("verifier key", "its key ID does not match its name and key")
    return verifier


def signer_from_key(skey: str, *, clock: Callable[[], int] = lambda: int(time.time())) -> AnySigner:
    """The signer a signer key string describes; ``clock`` is used by witness (0x04) keys."""
    text = skey.strip()
    if not text.startswith(SIGNER_KEY_PREFIX):
        raise MalformedError("signer key", f"it does not start with {SIGNER_KEY_PREFIX}")
    name, written_id, alg, seed = _split_key(text[len(SIGNER_KEY_PREFIX):].split("+", 2), "signer key")
    private_key = Ed25519PrivateKey.from_private_bytes(seed)
    signer: AnySigner = (Ed25519Signer(name, private_key) if alg == ALG_ED25519
                         else CosignatureSigner(name, private_key, clock))
    if signer.key_id != written_id:
        raise MalformedError("signer key", "its key ID does not match its name and key")
    return signer


def format_signer_key(name: str, private_key: Ed25519PrivateKey, alg: int = ALG_ED25519) -> str:
    """The signer key string of ``private_key`` under ``name`` for signature type ``alg``."""
    if alg not in KEY_TYPES:
        raise ValueError(f"signature type {alg:#04x} is not one of this package's")
    seed = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    kid = key_id(name, alg, raw_public_key(private_key.public_key()))
    return f"{SIGNER_KEY_PREFIX}{name}+{kid:08x}+{_encode(alg, seed)}"


def generate_keys(name: str, alg: int = ALG_ED25519) -> tuple[str, str]:
    """A new key: (signer key, verifier key). ``alg`` 0x01 for a log, 0x04 for a witness."""
    check_key_name(name)
    skey = format_signer_key(name, Ed25519PrivateKey.generate(), alg)
    return skey, format_verifier_key(signer_from_key(skey))
