"""``phsafe keys generate`` and :func:`phsafe.signing.generate_signing_key`: the pair the ledger's
``load_signing_key`` accepts, with the modes and refusals an operator relies on."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from phsafe.cli import main
from phsafe.errors import PHSafeError
from phsafe.ledger import load_signing_key
from phsafe.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, generate_signing_key, public_key_fingerprint


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_pair_is_what_the_ledger_loads_and_the_modes_are_strict(tmp_path: Path) -> None:
    old = os.umask(0o000)  # the modes must not depend on the operator's umask
    try:
        pair = generate_signing_key(tmp_path / "keys" / "us")
    finally:
        os.umask(old)
    assert pair.private_key == tmp_path / "keys" / "us" / PRIVATE_KEY_NAME
    assert pair.public_key == tmp_path / "keys" / "us" / PUBLIC_KEY_NAME
    assert _mode(pair.private_key) == 0o600
    assert _mode(pair.private_key.parent) == 0o700
    assert _mode(pair.public_key) == 0o644
    key = load_signing_key(pair.private_key, public_key=pair.public_key)  # matches its public key
    assert type(key).__name__.endswith("Ed25519PrivateKey")
    assert pair.private_key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert pair.public_key.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert len(pair.fingerprint) == 64 and pair.fingerprint == public_key_fingerprint(pair.public_key.read_bytes())


def test_a_new_pair_each_time_and_not_another_pair_s_public_key(tmp_path: Path) -> None:
    first, second = generate_signing_key(tmp_path / "a"), generate_signing_key(tmp_path / "b")
    assert first.fingerprint != second.fingerprint
    with pytest.raises(PHSafeError, match="does not match the public key"):
        load_signing_key(first.private_key, public_key=second.public_key)


def test_an_existing_folder_keeps_its_mode(tmp_path: Path) -> None:
    folder = tmp_path / "enclave"
    folder.mkdir(mode=0o750)
    os.chmod(folder, 0o750)
    pair = generate_signing_key(folder)
    assert _mode(folder) == 0o750 and _mode(pair.private_key) == 0o600


@pytest.mark.parametrize("existing", [PRIVATE_KEY_NAME, PUBLIC_KEY_NAME])
def test_never_overwrites_either_key(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_text("an earlier key\n")
    with pytest.raises(PHSafeError, match="already exists: a signing key is never overwritten"):
        generate_signing_key(tmp_path)
    assert (tmp_path / existing).read_text() == "an earlier key\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]  # nothing else written


def test_a_dangling_symlink_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / PRIVATE_KEY_NAME).symlink_to(tmp_path / "elsewhere.pem")
    with pytest.raises(PHSafeError, match="already exists"):
        generate_signing_key(tmp_path)
    assert not (tmp_path / "elsewhere.pem").exists()


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("")
    with pytest.raises(PHSafeError, match="is not a folder"):
        generate_signing_key(tmp_path / "keys")


def test_the_command_says_where_each_key_is_and_what_it_is_for(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    result = CliRunner().invoke(main, ["keys", "generate", str(folder)])
    assert result.exit_code == 0, result.output
    out = result.output
    fingerprint = public_key_fingerprint((folder / PUBLIC_KEY_NAME).read_bytes())
    assert f"fingerprint SHA256:{fingerprint}" in out
    assert f"private key {folder / PRIVATE_KEY_NAME} (mode 0600) -- confidential" in out
    assert f"public key {folder / PUBLIC_KEY_NAME} -- give it and the fingerprint to the auditors" in out
    assert "--public-key public-key.pem" in out and "--signing-key" in out
    assert "warning" not in out

    again = CliRunner().invoke(main, ["keys", "generate", str(folder)])
    assert again.exit_code == 1
    assert again.output.strip().splitlines() == [
        f"phsafe: error: {folder / PRIVATE_KEY_NAME} already exists: a signing key is never overwritten "
        "(give a new folder, or move the old pair away first)"]


def test_the_command_warns_about_a_folder_open_to_others(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o755)
    result = CliRunner().invoke(main, ["keys", "generate", str(folder)])
    assert result.exit_code == 0
    assert "warning: the folder" in result.output and "mode 0755" in result.output


def test_the_pair_signs_a_checkpoint_that_the_auditors_check_verifies(tmp_path: Path) -> None:
    """The public key is what `phsafe audit verify --checkpoint ... --public-key` trusts, and the
    fingerprint the command prints is the one the check names."""
    import json

    from phsafe.audit.verify import VerificationFailure, verify
    from phsafe.publog import create_ledger

    pair, other = generate_signing_key(tmp_path / "keys"), generate_signing_key(tmp_path / "other")
    ledger = create_ledger(tmp_path / "ledger.jsonl", lifetime_cap=1, reason="test policy",
                           code_version="test")
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(json.dumps(ledger.checkpoint(pair.private_key)))
    result = verify(tmp_path / "ledger.jsonl", checkpoints=[checkpoint], public_key=pair.public_key)
    assert any(f"signature verified with the trusted public key {pair.fingerprint[:16]}" in n for n in result.notes)
    with pytest.raises(VerificationFailure, match="signed by a key other than the trusted public key"):
        verify(tmp_path / "ledger.jsonl", checkpoints=[checkpoint], public_key=other.public_key)
