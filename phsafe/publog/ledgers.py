"""A ledger with its public log: made, opened, repaired and bound together.

The ledger (:mod:`phsafe.ledger`) never reads its log's files; this module is where the two meet.
:data:`PUBLIC_LOG` is the ledger's :class:`~phsafe.ledger.store.FollowerSource` for its public
log: it checks the bound log's files and attaches :class:`~phsafe.publog.log.PublicLog` as the
ledger's follower. The functions below are what the command line, the flows and the API call:

- :func:`create_ledger` -- ``phsafe ledger init``: the log's key and folder, the witness list,
  then the ledger whose first entry binds them;
- :func:`open_ledger` -- every run, ``raise-cap``: the ledger with its log attached, or one
  line naming what is missing;
- :func:`repair_ledger` -- ``phsafe ledger repair``: refused when the log is missing, before
  anything is cut;
- :func:`bind_public_log` -- ``phsafe ledger migrate`` of a ledger of format 2: its log (and
  witness services) bound by ``LOG_BOUND``;
- :func:`cosign_public_log` -- ``phsafe ledger cosign``: fresh witness cosignatures of the
  log as it is (nothing is appended);
- :func:`write_release_log_files` -- a release's ``privacy-loss.entry`` and ``.tlog-proof``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phsafe import durable
from phsafe.amounts import Amount
from phsafe.config import PrivacyDefinition
from phsafe.errors import LedgerError
from phsafe.ledger import Ledger, LedgerState, Repair
from phsafe.ledger.admin import bind_public_log as bind_in_ledger
from phsafe.ledger.admin import init_ledger, new_ledger_id
from phsafe.ledger.admin import repair_ledger as repair_in_ledger
from phsafe.publog.log import (
    PublicLog,
    check_log_files,
    create_log_files,
    default_log_name,
    log_binding,
    log_key_path,
    log_path,
)
from phsafe.publog.witnesses import WitnessList, read_witness_list, witnesses_path, write_witness_list
from phsafe.tlog.layout import VERIFIER_KEY_FILE


class PublicLogSource:
    """The ledger's :class:`~phsafe.ledger.store.FollowerSource` for its public log.

    Args:
        transport: An ``httpx`` transport for the witnesses (tests); None: the network.
    """

    def __init__(self, transport: Any = None) -> None:
        self.transport = transport

    def check(self, ledger_path: Path, state: LedgerState) -> None:
        if state.public_log is not None:
            check_log_files(Path(ledger_path), state.public_log)

    def attach(self, ledger: Ledger) -> None:
        if ledger.state.public_log is not None:
            PublicLog.attach(ledger, transport=self.transport)


PUBLIC_LOG = PublicLogSource()
"""Attaches a ledger's public log, asking its witnesses over the network."""


def public_log_of(ledger: Ledger) -> PublicLog | None:
    """The public log following ``ledger``, if one does."""
    return next((f for f in ledger.followers if isinstance(f, PublicLog)), None)


def open_ledger(path: Path, *, transport: Any = None) -> Ledger:
    """The ledger at ``path`` with its public log attached (as its first entry binds it).

    Raises:
        LedgerError: The ledger is missing or broken, or its log's folder, key or witness list
            is missing or is not the bound one (one line naming it; nothing is changed).
    """
    return Ledger.open(Path(path), PUBLIC_LOG if transport is None else PublicLogSource(transport))


def create_ledger(
    path: Path,
    *,
    lifetime_cap: Amount,
    reason: str,
    privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP,
    non_confidential: bool = False,
    code_version: str = "unknown",
    log_name: str | None = None,
    witnesses: Sequence[tuple[str, str]] = (),
    witness_quorum: int | None = None,
    ledger_cap: Amount | None = None,
    transport: Any = None,
    datasets: Sequence[str] = (),
) -> Ledger:
    """Create a ledger bound to its public privacy-loss log: the log key ``<path>.log.key``
    (0600), the log folder ``<path>.public-log/`` with its verifier key ``log.vkey``, the witness
    list ``<path>.witnesses.json`` (when there are witnesses), then the ledger and its lineage key
    (:func:`phsafe.ledger.admin.init_ledger`), whose first entry binds the log, its witnesses'
    keys and the quorum.

    The witnesses are not asked here: they witness the log once their operators start them with
    its verifier key (``phsafe witness serve --log``); every run asks them before it spends.

    Args:
        witnesses: ``(URL, verifier key text)`` of each witness service.
        witness_quorum: How many of them must cosign (default: all).
        datasets: The datasets the ledger accounts: in its first entry and its log's policy,
            which its witnesses read from its registration (``phsafe ledger registration``).
        (the others: see :func:`phsafe.ledger.admin.init_ledger`)

    Raises:
        LedgerError: A file exists already, a witness or the quorum is not one, or a file
            cannot be written (nothing is left behind then).
        BudgetError: The cap is not positive, or Infinity for a confidential ledger.
    """
    path = Path(path).absolute()
    listed = WitnessList.of(list(witnesses), witness_quorum)
    for p, what in ((log_path(path), "its public log"), (log_key_path(path), "its public log's key"),
                    (witnesses_path(path), "its witness list")):
        if os.path.lexists(p):
            raise LedgerError(f"{what} {p} already exists; a ledger is never created twice or overwritten")
    if os.path.lexists(path):
        raise LedgerError(f"the ledger {path} already exists; a ledger is never created twice or overwritten")
    ledger_id = new_ledger_id()
    from phsafe.ledger.store import make_private_folders

    try:
        make_private_folders(path.parent)
    except OSError as exc:
        raise LedgerError(f"cannot create the folder of the ledger {path}: {exc.strerror or exc}") from None
    vkey = create_log_files(path, log_name or default_log_name(ledger_id))
    made: list[Path] = [log_key_path(path)]
    try:
        if listed.witnesses:
            write_witness_list(path, listed)
            made.append(witnesses_path(path))
        return init_ledger(path, lifetime_cap=lifetime_cap, reason=reason, privacy_defn=privacy_defn,
                           non_confidential=non_confidential, code_version=code_version, ledger_cap=ledger_cap,
                           ledger_id=ledger_id, public_log=log_binding(vkey, listed),
                           followers=PublicLogSource(transport), datasets=datasets)
    except BaseException:
        if not path.exists():  # nothing of a ledger was made: its log's files go too
            for p in made:
                p.unlink(missing_ok=True)
            _remove_log_folder(log_path(path))
        raise


def _remove_log_folder(folder: Path) -> None:
    for name in ("entries", "hashes", "checkpoint", VERIFIER_KEY_FILE):
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
        durable.fsync_folder(folder.parent)
    except OSError:
        pass


def repair_ledger(path: Path, *, transport: Any = None,
                  reason: str = "incomplete last entry dropped by phsafe ledger repair") -> Repair | None:
    """``phsafe ledger repair``: the ledger's torn tail dropped and recorded (refused, before
    anything is cut, when its bound log is missing or another's), and its public log caught up:
    a torn log line cut, hashes missing for written lines computed, the whole log compared with
    the projection. Returns the repair (None: the ledger ended in a complete entry)."""
    source = PublicLogSource(transport)
    repair = repair_in_ledger(Path(path), followers=source, reason=reason)
    if repair is None:
        Ledger.open(Path(path), source).close()  # the log caught up all the same
    return repair


def bind_public_log(path: Path, *, reason: str, witnesses: Sequence[tuple[str, str]] = (),
                    witness_quorum: int | None = None, transport: Any = None) -> Ledger:
    """``phsafe ledger migrate`` of a ledger of format 2: bind the public log it has had since its
    init (``LOG_BOUND``), with ``witnesses`` (services, replacing any witness folders it listed).

    Raises:
        LedgerError: The ledger is bound already or has no log; its log's folder or key is
            missing; it listed witnesses and none are given (no silent downgrade to none).
    """
    path = Path(path).absolute()
    ledger = Ledger.open(path)
    state = ledger.state
    if state.public_log is not None:
        raise LedgerError(f"the ledger {path} is bound to its public log already (entry {state.public_log_seq})")
    if not state.awaits_log_binding:
        raise LedgerError(f"the ledger {path} has no public log to bind (it was migrated from the first format)")
    folder, key = log_path(path), log_key_path(path)
    if not folder.is_dir() or not key.exists():
        raise LedgerError(f"the ledger's public log {folder} or its key {key} is missing: restore them before "
                          "binding them")
    vkey = (folder / VERIFIER_KEY_FILE).read_text(encoding="utf-8").strip()
    listed = WitnessList.of(list(witnesses), witness_quorum)
    old = witnesses_path(path)
    had_witnesses = False
    if old.exists():
        try:
            had_witnesses = bool(read_witness_list(path))
        except LedgerError:
            had_witnesses = True  # a list of witness folders
        if had_witnesses and not listed.witnesses:
            raise LedgerError(f"the ledger had witnesses ({old}); give the witness services that replace them "
                              "(--witness URL VKEY): a ledger is never downgraded to no witness")
    binding = log_binding(vkey, listed)
    if old.exists():
        durable.replace(old.with_name(old.name + ".before-binding"), old.read_bytes())
        old.unlink()
    if listed.witnesses:
        write_witness_list(path, listed)
    signer, checked = check_log_files(path, binding)
    log = PublicLog(path, binding, signer, checked, transport=transport)
    ledger.add_follower(log)
    bind_in_ledger(ledger, binding, reason)
    return ledger


def cosign_public_log(path: Path, *, transport: Any = None) -> tuple[Ledger, list[str]]:
    """``phsafe ledger cosign``: ask the witnesses to cosign the log's checkpoint as it is (nothing
    is appended), so that outsiders see fresh cosignatures. Returns the ledger and the witnesses
    that cosigned.

    Raises:
        ForkRefused: Fewer than the quorum cosigned.
    """
    ledger = open_ledger(path, transport=transport)
    with ledger.locked():
        ledger.confirm()
    log = public_log_of(ledger)
    return ledger, (log.cosigners() if log is not None else [])


def write_release_log_files(ledger: Ledger, run_id: str, output_dir: Path) -> bool:
    """Give a recorded release its public log files (:data:`~phsafe.publog.log.RELEASE_LOG_FILES`):
    the exact bytes of the run's ``release`` entry and its ``privacy-loss.tlog-proof`` against the
    log's checkpoint, cosigned by the witness quorum. Returns False for a ledger without a public
    log (nothing to write)."""
    with ledger.locked():
        log = public_log_of(ledger)
        if log is None:
            return False
        ledger.confirm()
        files = log.release_files(run_id)
    output_dir = Path(output_dir)
    # The release folder is public and verified file by file: the temporary files are written
    # beside it, so that a write killed before its rename leaves nothing in it. A kill between
    # the two renames leaves one of the files, which the audit reports as not yet written too.
    for stale in [*output_dir.glob(".privacy-loss.*.tmp"),  # left inside by an earlier version
                  *output_dir.parent.glob(f".{glob.escape(output_dir.name)}.privacy-loss.*.tmp")]:
        stale.unlink(missing_ok=True)
    for name, data in files.items():
        durable.replace(output_dir / name, data, beside=output_dir.parent)
    return True
