"""The operator's Ed25519 key pair that signs ledger checkpoints.

Every release carries a checkpoint of its dataset's ledger (size and head hash) signed with the
operator's private key; auditors hold the public key and check the signature offline
(``phsafe audit verify LEDGER --outputs DIR --public-key KEY``). :func:`generate_signing_key`
makes the pair in the formats :func:`phsafe.ledger.load_signing_key` and the auditors' check
read: the private key as unencrypted PKCS#8 PEM, readable by its owner only (0600), and the
public key as SubjectPublicKeyInfo PEM beside it.

The private key is confidential (the enclave's zone, like the ledger): whoever holds it can sign
a checkpoint. The public key and its fingerprint are public: they go to the auditors.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from phsafe import durable
from phsafe.errors import PHSafeError, os_reason

PRIVATE_KEY_NAME = "signing-key.pem"
PUBLIC_KEY_NAME = "public-key.pem"


@dataclass(frozen=True)
class SigningKeyPair:
    """Where :func:`generate_signing_key` wrote the pair."""

    private_key: Path
    """PEM, PKCS#8, unencrypted, mode 0600: the runs' ``--signing-key``. Confidential."""
    public_key: Path
    """PEM, SubjectPublicKeyInfo: the runs' ``--public-key`` and the auditors' trust anchor."""
    fingerprint: str
    """SHA-256 of the raw 32-byte public key, hex: for auditors to confirm the key out of band."""


def public_key_fingerprint(public_key_pem: bytes) -> str:
    """The SHA-256 (hex) of the raw Ed25519 public key in ``public_key_pem``."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(public_key_pem)
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def generate_signing_key(folder: str | Path) -> SigningKeyPair:
    """Make a new Ed25519 key pair in ``folder``: ``signing-key.pem`` and ``public-key.pem``.

    The folder is created with mode 0700 if it does not exist. Neither file may exist: a key is
    never overwritten (releases already signed with it could no longer be tied to a key the
    operator holds). The private key is created exclusively with mode 0600, written and synced
    before the public key; if the public key cannot be written, the private key is removed again.

    Args:
        folder: Where the pair goes: a folder inside the enclave, owned by the service account.

    Returns:
        The paths of the two files and the public key's fingerprint.

    Raises:
        PHSafeError: The folder is not a folder or cannot be created, or either file exists.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PHSafeError(f"{folder} is not a folder; give the folder the key pair goes to")
    private, public = folder / PRIVATE_KEY_NAME, folder / PUBLIC_KEY_NAME
    for path in (private, public):
        if path.exists() or path.is_symlink():
            raise PHSafeError(f"{path} already exists: a signing key is never overwritten "
                              "(give a new folder, or move the old pair away first)")
    try:
        if not folder.is_dir():
            folder.mkdir(mode=0o700, parents=True)
            os.chmod(folder, 0o700)  # whatever the umask
    except OSError as exc:
        raise PHSafeError(f"cannot create the folder {folder}: {os_reason(exc)}") from None

    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_new(private, private_pem, 0o600)
    try:
        _write_new(public, public_pem, 0o644)
    except BaseException:
        private.unlink(missing_ok=True)
        raise
    return SigningKeyPair(private.absolute(), public.absolute(), public_key_fingerprint(public_pem))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` exclusively (never follow or replace anything there) with ``mode``, durably."""
    try:
        durable.create(path, data, mode=mode)
    except FileExistsError:
        raise PHSafeError(f"{path} already exists: a signing key is never overwritten") from None
    except OSError as exc:
        raise PHSafeError(f"cannot create {path}: {os_reason(exc)}") from None
