"""The ledger's keys: the lineage key (keyed commitments) and the operator's checkpoint signing key.

The lineage key -- 32 random bytes in ``<ledger>.key`` (mode 0600), made with the ledger, never
published -- keys every commitment of the ledger (content fingerprints, release lineage), so that
an auditor holding it can check lineage and nobody else can test guesses against what is
published. Checkpoints (the ledger's size and head hash) are signed with the operator's Ed25519
key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

from phsafe.errors import LedgerError, PHSafeError, os_reason
from phsafe.parameters import option
from phsafe.ledger.format import canonical_json, checkpoint_message
from phsafe.ledger.policy import Policy
from phsafe.ledger.state import RunState
from phsafe.ledger.store import regular_file, write_new_file

KEY_ID_DOMAIN = b"phsafe-lineage-key-id-v1\x00"
LINEAGE_DOMAIN = b"phsafe-release-lineage-v1\x00"
LINEAGE_KEY_BYTES = 32
KEY_SUFFIX = ".key"


def key_path(path: Path) -> Path:
    """``<ledger>.key``: the lineage key, created with the ledger, never published."""
    return Path(path).with_name(Path(path).name + KEY_SUFFIX)


def key_id(key: bytes) -> str:
    """Identifies a lineage key without revealing it (recorded by LEDGER_INIT)."""
    return hmac.new(key, KEY_ID_DOMAIN, hashlib.sha256).hexdigest()[:32]


def read_lineage_key(path: Path, policy: Policy) -> bytes:
    """The ledger's lineage key from ``<ledger>.key``, checked against the policy's key id.

    Raises:
        LedgerError: The key file is missing, unreadable, malformed or of another ledger.
    """
    kp = key_path(path)
    if regular_file(kp, "the ledger's key file") is None:
        raise LedgerError(f"the ledger's lineage key {kp} is missing; it was created with the ledger and is "
                          "kept beside it (restore it from the ledger's backup)")
    try:
        key = bytes.fromhex(kp.read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else "not hex text"
        raise LedgerError(f"cannot read the ledger's lineage key {kp}: {reason}") from None
    if len(key) != LINEAGE_KEY_BYTES or not hmac.compare_digest(key_id(key), policy.key_id):
        raise LedgerError(f"{kp} is not this ledger's lineage key (its id differs from LEDGER_INIT's)")
    return key


def lineage_commitment(key: bytes, run: RunState) -> str:
    """The keyed commitment that links a public release to its confidential inputs.

    HMAC-SHA256, under the ledger's lineage key, of the run id, the dataset, the content
    fingerprint and the input and config digests the ledger recorded. Published in the release's
    manifest: an auditor holding the key recomputes it from the ledger; without the key it
    reveals nothing and admits no test of a guessed dataset.
    """
    message = LINEAGE_DOMAIN + canonical_json({
        "run_id": run.run_id, "dataset": run.dataset, "fingerprint": run.fingerprint,
        "input_digests": run.input_digests, "config_digest": run.config_digest,
    })
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def new_lineage_key() -> bytes:
    """A fresh lineage key (secure randomness)."""
    return secrets.token_bytes(LINEAGE_KEY_BYTES)


def write_lineage_key(ledger_path: Path, key: bytes) -> None:
    """Create ``<ledger>.key`` (mode 0600; it must not exist) holding ``key``, fsynced.

    Raises:
        OSError: The file exists or cannot be written.
    """
    write_new_file(key_path(ledger_path), key.hex().encode("ascii") + b"\n", 0o600)


def load_signing_key(path: Path, public_key: Path | None = None) -> Any:
    """The operator's Ed25519 signing key, checked before anything is spent.

    Args:
        path: PEM file of the private key (unencrypted PKCS#8 or OpenSSH).
        public_key: The operator's public key (PEM), if given: the private key must match it.

    Raises:
        PHSafeError: The file cannot be read, is not a PEM private key, is protected by a
            passphrase, is not Ed25519, or does not match ``public_key``.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    name = Path(path).name
    flag = option("signing_key")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PHSafeError(f"cannot read the signing key {path} ({flag}): {os_reason(exc)}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise PHSafeError(f"the signing key {name} ({flag}) is protected by a passphrase; give the unencrypted "
                          "Ed25519 key (PEM), kept on a protected volume") from None
    except (ValueError, UnsupportedAlgorithm):
        raise PHSafeError(f"the signing key {name} ({flag}) is not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PHSafeError(f"the signing key {name} ({flag}) is a {type(key).__name__.removeprefix('_')}, not an "
                          "Ed25519 key; checkpoints are signed with Ed25519")
    if public_key is not None:
        try:
            pub = serialization.load_pem_public_key(Path(public_key).read_bytes())
        except (OSError, ValueError, UnsupportedAlgorithm):
            raise PHSafeError(f"the public key {Path(public_key).name} ({option('public_key')}) is not a readable "
                              "PEM public key") from None
        raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
        if not isinstance(pub, Ed25519PublicKey) or pub.public_bytes(*raw) != key.public_key().public_bytes(*raw):
            raise PHSafeError(f"the signing key {name} does not match the public key {Path(public_key).name} "
                              f"({option('public_key')}): auditors could not verify the checkpoint")
    return key


def sign_checkpoint(ledger_size: int, head_hash: str, signing_key: Any = None) -> dict[str, Any]:
    """A checkpoint of a ledger: its size and head hash, signed with an Ed25519 key if given.

    Args:
        signing_key: An ``Ed25519PrivateKey`` (see :func:`load_signing_key`), a path to its
            PEM file, or None for an unsigned checkpoint.

    Returns:
        ``{"ledger_size", "head_hash", "signature", "public_key"}``; the signature is
        base64 over :func:`~phsafe.ledger.format.checkpoint_message`, the public key PEM text
        (both None unsigned).
    """
    signature = public_pem = None
    if signing_key is not None:
        from cryptography.hazmat.primitives import serialization

        key = load_signing_key(signing_key) if isinstance(signing_key, (str, Path)) else signing_key
        signature = base64.b64encode(key.sign(checkpoint_message(ledger_size, head_hash))).decode("ascii")
        public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode("ascii")
    return {"ledger_size": ledger_size, "head_hash": head_hash, "signature": signature, "public_key": public_pem}
