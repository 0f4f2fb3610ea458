"""Witnesses of the public log: a witness folder, and a ledger's list of the witnesses it needs.

A *witness folder* (``phsafe witness init DIR --name NAME``) is a witness kept apart from the
ledger it watches -- another folder, volume or host -- with::

    DIR/witness.key      its cosigning key (PRIVATE+KEY+..., type 0x04; mode 0600)
    DIR/witness.vkey     its verifier key (public: give it to the auditors)
    DIR/logs/*.vkey      the verifier keys of the logs it witnesses (one line each)
    DIR/state.json       the last checkpoint it cosigned per log (compare-and-swap, flock)

It cosigns a checkpoint only if it extends the last one it cosigned for that log
(:class:`phsafe.tlog.Witness`), so once it has cosigned one history of a log it refuses every
other: a copy of the ledger made earlier, or a rolled-back one, cannot get its cosignature.

A ledger *requires* witnesses when ``<ledger>.witnesses.json`` exists (written by ``phsafe
ledger init --witness DIR``)::

    {"format": "phsafe-witnesses/1", "quorum": K, "witnesses": ["/abs/DIR", ...]}

Then every run obtains at least K cosignatures on a checkpoint that includes its RUN_STARTED
(or RUN_RESUMED) before its first INTENT, and again before every later INTENT
(:mod:`phsafe.publog.log`); a refusal stops the run before it spends.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from phsafe.errors import LedgerError, StoreError
from phsafe.tlog import FileCheckpointStore, Witness, generate_keys, read_signer_key, read_verifier_key
from phsafe.tlog.cosignature import CosignatureSigner
from phsafe.tlog.files import write_signer_key, write_verifier_key
from phsafe.tlog.keys import verifier_from_key
from phsafe.tlog.note import ALG_COSIGNATURE_V1

WITNESS_KEY = "witness.key"
WITNESS_VKEY = "witness.vkey"
WITNESS_STATE = "state.json"
WITNESS_LOGS = "logs"
WITNESSES_FORMAT = "phsafe-witnesses/1"


def init_witness(path: Path, name: str) -> str:
    """Create a witness folder (see the module docstring); returns its verifier key."""
    path = Path(path).absolute()
    if path.exists() and any(path.iterdir()):
        raise StoreError(f"{path} is not empty; a witness is created in a new folder")
    skey, vkey = generate_keys(name, ALG_COSIGNATURE_V1)
    (path / WITNESS_LOGS).mkdir(parents=True, exist_ok=True)
    write_signer_key(path / WITNESS_KEY, skey)
    write_verifier_key(path / WITNESS_VKEY, vkey)
    return vkey


@dataclass(frozen=True)
class WitnessFolder:
    """A witness folder, opened: its signer, the logs it knows and its state."""

    path: Path

    def verifier_key(self) -> str:
        return (self.path / WITNESS_VKEY).read_text(encoding="utf-8").strip()

    def trust_log(self, log_vkey: str) -> None:
        """Witness the log with this verifier key from now on (idempotent)."""
        verifier = verifier_from_key(log_vkey)
        target = self.path / WITNESS_LOGS / f"{verifier.key_id:08x}.vkey"
        if target.exists():
            if target.read_text(encoding="utf-8").strip() != log_vkey.strip():
                raise StoreError(f"{target} holds another log's key")
            return
        write_verifier_key(target, log_vkey)

    def log_verifier(self, origin: str):  # noqa: ANN201 -- an Ed25519Verifier, or None
        """The verifier key of the log ``origin`` this witness witnesses, or None."""
        for path in sorted((self.path / WITNESS_LOGS).glob("*.vkey")):
            verifier = read_verifier_key(path)
            if verifier.name == origin:
                return verifier
        return None

    def witness(self) -> Witness:
        """The :class:`~phsafe.tlog.Witness` this folder is (StoreError if unusable)."""
        if not self.path.is_dir():
            raise StoreError(f"the witness folder {self.path} is not there")
        signer = read_signer_key(self.path / WITNESS_KEY, clock=lambda: int(time.time()))
        if not isinstance(signer, CosignatureSigner):
            raise StoreError(f"{self.path / WITNESS_KEY} is not a witness (cosignature) key")
        logs = [read_verifier_key(p) for p in sorted((self.path / WITNESS_LOGS).glob("*.vkey"))]
        return Witness(signer, logs, FileCheckpointStore(self.path / WITNESS_STATE))


@dataclass(frozen=True)
class WitnessPolicy:
    """The witnesses a ledger requires, and how many of them must cosign."""

    folders: tuple[WitnessFolder, ...]
    quorum: int


def witnesses_path(ledger: Path) -> Path:
    """``<ledger>.witnesses.json``: the witnesses this ledger requires (absent: none)."""
    return Path(ledger).with_name(Path(ledger).name + ".witnesses.json")


def write_witness_policy(ledger: Path, folders: list[Path], quorum: int | None) -> WitnessPolicy:
    folders = [Path(f).absolute() for f in folders]
    k = len(folders) if quorum is None else quorum
    if not 1 <= k <= len(folders):
        raise LedgerError(f"a witness quorum of {k} out of {len(folders)} witness folders cannot be met")
    document = {"format": WITNESSES_FORMAT, "quorum": k, "witnesses": [str(f) for f in folders]}
    target = witnesses_path(ledger)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, (json.dumps(document, indent=1) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return WitnessPolicy(tuple(WitnessFolder(f) for f in folders), k)


def read_witness_policy(ledger: Path) -> WitnessPolicy | None:
    """The ledger's witness policy, or None when it requires no witness."""
    target = witnesses_path(ledger)
    try:
        document = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise LedgerError(f"cannot read the ledger's witness list {target}: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != WITNESSES_FORMAT \
            or not isinstance(document.get("witnesses"), list) or not isinstance(document.get("quorum"), int):
        raise LedgerError(f"{target} is not a {WITNESSES_FORMAT} document")
    folders = tuple(WitnessFolder(Path(p)) for p in document["witnesses"])
    if not 1 <= document["quorum"] <= len(folders):
        raise LedgerError(f"{target}: its quorum cannot be met by its witnesses")
    return WitnessPolicy(folders, document["quorum"])
