"""``phsafe keys``: the operator's Ed25519 signing key pair (:mod:`phsafe.signing`).

``phsafe keys generate DIR`` writes ``DIR/signing-key.pem`` (0600, never overwritten) and
``DIR/public-key.pem``, and says what each is for.
"""

from __future__ import annotations

import stat
from pathlib import Path

import click

from phsafe.cli._common import PATH, handle_errors, start


@click.group()
def keys() -> None:
    """The Ed25519 key pair that signs the ledger checkpoints of every release."""


@keys.command("generate")
@click.argument("folder", type=PATH)
@handle_errors
def generate_command(folder: Path) -> None:
    """Make a new signing key pair in FOLDER (created 0700 if missing).

    FOLDER/signing-key.pem is the private key (PEM, mode 0600): confidential, kept inside the
    enclave; runs sign with it (--signing-key). FOLDER/public-key.pem goes to the auditors
    (phsafe audit verify ... --public-key). An existing key is never overwritten.
    """
    start(None)
    from phsafe.signing import generate_signing_key

    pair = generate_signing_key(folder)
    mode = stat.S_IMODE(pair.private_key.parent.stat().st_mode)
    click.echo(f"phsafe: made an Ed25519 signing key pair; public key fingerprint SHA256:{pair.fingerprint}")
    click.echo(f"phsafe: private key {pair.private_key} (mode 0600) -- confidential: keep it inside the enclave, "
               "readable by the service account only, and back it up there; runs sign their ledger checkpoints "
               "with it (--signing-key; the deployments' signing_key setting)")
    click.echo(f"phsafe: public key {pair.public_key} -- give it and the fingerprint to the auditors, who check "
               f"every release with `phsafe audit verify LEDGER --outputs RELEASE --public-key {pair.public_key.name}`; "
               "runs check the pair with it before spending (--public-key; the deployments' public_key setting)")
    if mode & 0o077:
        click.echo(f"phsafe: warning: the folder {pair.private_key.parent} is open to other users (mode {mode:04o}); "
                   "the private key itself is 0600", err=True)
