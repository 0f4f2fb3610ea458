"""Creating, repairing and migrating a ledger: the operator's ``phsafe ledger`` commands.

A ledger comes to exist only through :func:`init_ledger` (its policy fixed before any data is
seen, its public log bound from its first entry); an interrupted write is dropped, and recorded,
by :func:`repair_ledger`; a ledger of the first format gets a policy by :func:`migrate_ledger`, and
one of format 2 its log binding by :func:`bind_public_log`. Every entry they write goes through
the same rules as every other (:mod:`phsafe.ledger.replay`). The public log's files are not
handled here: :mod:`phsafe.publog` makes and checks them, and attaches the log as a follower.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from phsafe import durable
from phsafe.amounts import Amount, format_exact, is_infinite
from phsafe.config import PrivacyDefinition
from phsafe.errors import BudgetError, LedgerError, os_reason
from phsafe.ledger.format import (
    FORMAT, GENESIS_HASH, EntryKind, canonical_json, clean_text, entry_hash, now, operator_text,
)
from phsafe.ledger.keys import key_id, key_path, new_lineage_key, write_lineage_key
from phsafe.ledger.policy import cap_amount, check_dataset_name
from phsafe.ledger.replay import apply, replay
from phsafe.ledger.runs import Ledger
from phsafe.ledger.state import LedgerState
from phsafe.ledger.store import (
    PRIVATE_FILE, FollowerSource, check_ledger_file, lock_path, make_private_folders, not_a_ledger, repair_record_path,
)


def policy_body(lifetime_cap: Amount, reason: str, privacy_defn: PrivacyDefinition,
                non_confidential: bool, key: bytes, code_version: str,
                ledger_cap: Amount | None = None, *, ledger_id: str | None = None) -> dict[str, Any]:
    reason = operator_text(reason, "--reason")
    if not reason:
        raise LedgerError("give the reason for the ledger's policy (--reason TEXT); it is recorded")
    cap = cap_amount(lifetime_cap)
    if is_infinite(cap) and not non_confidential:
        raise BudgetError("an Infinity lifetime cap is allowed only for a non-confidential ledger")
    if cap == 0:
        raise BudgetError("the lifetime cap must be positive")
    extra: dict[str, Any] = {}
    if ledger_cap is not None:
        total = cap_amount(ledger_cap)
        if non_confidential or is_infinite(total) or total == 0:
            raise BudgetError("a ledger-wide cap is a positive number, for a confidential ledger only")
        extra["ledger_cap"] = format_exact(total)
    return {
        **extra,
        "ledger_id": ledger_id or new_ledger_id(),
        "format": FORMAT,
        "privacy_defn": privacy_defn.value,
        "lifetime_cap": format_exact(cap),
        "reason": reason,
        "non_confidential": bool(non_confidential),
        "key_id": key_id(key),
        "code_version": clean_text(code_version) or "unknown",
    }


def new_ledger_id() -> str:
    """A new ledger's id: 32 random hex digits (the public log's default name is made from it)."""
    return uuid.uuid4().hex


def init_ledger(
    path: Path,
    *,
    lifetime_cap: Amount,
    reason: str,
    public_log: Mapping[str, Any],
    followers: FollowerSource,
    privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP,
    non_confidential: bool = False,
    code_version: str = "unknown",
    ledger_cap: Amount | None = None,
    ledger_id: str | None = None,
    datasets: Sequence[str] = (),
) -> Ledger:
    """Create a ledger bound to its public log: its lineage key ``<path>.key`` (mode 0600) and
    the ``LEDGER_INIT`` entry, whose ``public_log`` binds the log from the start.

    The only way a ledger comes to exist, and the ledger's part of it: the public log's files
    and keys are made by its owner (:func:`phsafe.publog.create_ledger`, which calls this), and
    given here as ``public_log`` (its binding) and ``followers`` (which attach it). The policy --
    every dataset's lifetime cap, in the unit of ``privacy_defn`` -- is fixed here, before any
    data is seen; raising a dataset's cap later is a ``CAP_RAISED`` entry with its own reason.

    Args:
        path: The ledger file; neither it nor its key file may exist (parent folders are made).
        lifetime_cap: Each dataset's lifetime cap (rho for zCDP, epsilon for pure DP).
        reason: Why this policy (recorded).
        public_log: The public log's binding: origin, verifier key, witness keys, quorum.
        followers: Attaches the public log to the new ledger (it projects LEDGER_INIT).
        privacy_defn: The unit of caps and charges.
        non_confidential: A throwaway ledger for synthetic or public data (its caps are not
            enforced, and it takes only non-confidential runs).
        code_version: Recorded.
        ledger_cap: A cap on all datasets' spends together (optional; never raised).
        ledger_id: The ledger's id (default: a new random one).
        datasets: The datasets the ledger accounts (recorded in LEDGER_INIT and published; the
            ledger takes no run of another); none: any dataset, as ledgers made before this.

    Raises:
        LedgerError: The ledger or its key file exists, or cannot be written; the binding is
            not a valid one.
        BudgetError: The cap is not positive, or Infinity for a confidential ledger.
    """
    path = Path(path).absolute()
    key = new_lineage_key()
    body = policy_body(lifetime_cap, reason, privacy_defn, non_confidential, key, code_version, ledger_cap,
                       ledger_id=ledger_id)
    body["public_log"] = dict(public_log)
    if datasets:
        for name in datasets:
            check_dataset_name(name)
        body["datasets"] = sorted(set(datasets))
    for p, what in ((path, "the ledger"), (key_path(path), "its key file"), (lock_path(path), "its lock file")):
        if os.path.lexists(p):
            raise LedgerError(f"{what} {p} already exists; a ledger is never created twice or overwritten")
    entry: dict[str, Any] = {"seq": 0, "prev": GENESIS_HASH, "kind": EntryKind.LEDGER_INIT.value,
                             "time": now(), "run_id": None, **body}
    entry["hash"] = entry_hash(entry)
    apply(LedgerState(), canonical_json(entry))  # the same rules as every reader applies
    try:
        make_private_folders(path.parent)
        write_lineage_key(path, key)
        try:
            durable.create(path, canonical_json(entry) + b"\n", mode=PRIVATE_FILE)
            durable.create(lock_path(path), b"", mode=PRIVATE_FILE)  # 0600 from the start, not at first use
        except BaseException:
            # Every file was created here (O_EXCL): a failed init leaves nothing behind.
            for made in (path, lock_path(path), key_path(path)):
                made.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise LedgerError(f"cannot create the ledger {path}: {os_reason(exc)}") from None
    return Ledger.open(path, followers)  # the log projects LEDGER_INIT and signs its first checkpoint


def bind_public_log(ledger: Ledger, public_log: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """Record ``LOG_BOUND``: a ledger of format 2 is bound to its public log from now on.

    The log must follow the ledger already (:meth:`~phsafe.ledger.store.LedgerFile.add_follower`
    with this binding): :func:`phsafe.publog.bind_public_log` does both.

    Raises:
        LedgerError: The ledger is bound already, has no log to bind (migrated from the first
            format), or no reason is given.
    """
    reason = operator_text(reason, "--reason")
    if not reason:
        raise LedgerError("give the reason for binding the public log (--reason TEXT); it is recorded")
    with ledger.locked():
        return ledger.append_entries([(EntryKind.LOG_BOUND, None, {"public_log": dict(public_log), "reason": reason})])[0]


def _damaged(path: Path, exc: LedgerError) -> LedgerError:
    """What ``repair`` found when a complete entry breaks a rule: not an interrupted write."""
    if exc.seq == 0 and exc.kind is None:
        return not_a_ledger(path, exc)
    return LedgerError(
        f"cannot repair the ledger {path}: its entry {exc.seq} is damaged ({exc.reason}). Only an "
        "incomplete last entry (an interrupted write) can be repaired; a complete entry that breaks a "
        "rule means the file was altered (tampering) or the disk corrupted it. Nothing was changed: "
        "restore the ledger from its backup, and have the auditors compare the two"
    )


@dataclass(frozen=True)
class Repair:
    """What :func:`repair_ledger` did: the bytes it dropped and the entry that records it.

    ``finished_earlier``: the repair was begun by an earlier ``phsafe ledger repair`` that was
    stopped (its record was there) and this call finished it."""

    dropped_bytes: int
    dropped_sha256: str
    seq: int
    finished_earlier: bool = False


REPAIR_FORMAT = "phsafe-ledger-repair-v1"
REPAIR_FIELDS = frozenset({"format", "kept_bytes", "kept_entries", "head_hash", "dropped_bytes", "dropped_sha256",
                           "entry"})


@dataclass(frozen=True)
class RepairRecord:
    """The record of a repair in progress, ``<ledger>.repair``: what it keeps and what it drops.

    Written (``O_EXCL``, synced, its folder synced) before the torn tail is cut, it states
    everything the repair will do: the ledger's first ``kept_bytes`` bytes (``kept_entries``
    complete entries ending in ``head_hash``) stay; the ``dropped_bytes`` after them, of SHA-256
    ``dropped_sha256``, go; and ``entry``, the exact bytes of the ``TAIL_REPAIRED`` line that
    records it, follows. Removed (its folder synced) once that line is in the ledger.
    """

    kept_bytes: int
    kept_entries: int
    head_hash: str
    dropped_bytes: int
    dropped_sha256: str
    entry: bytes

    def encode(self) -> bytes:
        return canonical_json({
            "format": REPAIR_FORMAT, "kept_bytes": self.kept_bytes, "kept_entries": self.kept_entries,
            "head_hash": self.head_hash, "dropped_bytes": self.dropped_bytes, "dropped_sha256": self.dropped_sha256,
            "entry": self.entry.decode("utf-8"),
        }) + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> "RepairRecord | None":
        """The record in ``data``, or None if it is not a whole one (a write cut short)."""
        try:
            obj = json.loads(data.decode("utf-8"))
            if not isinstance(obj, dict) or set(obj) != REPAIR_FIELDS or obj["format"] != REPAIR_FORMAT:
                return None
            record = cls(int(obj["kept_bytes"]), int(obj["kept_entries"]), str(obj["head_hash"]),
                         int(obj["dropped_bytes"]), str(obj["dropped_sha256"]), str(obj["entry"]).encode("utf-8"))
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            return None
        return record if record.encode() == data else None

    @property
    def seq(self) -> int:
        return self.kept_entries


@dataclass(frozen=True)
class RepairStatus:
    """Where a ledger stands with its repair record (:func:`repair_status`).

    Attributes:
        record: The record, or None when there is none or it is not a whole one.
        stage: ``none`` (no record), ``unreadable`` (a record cut short: its write was
            interrupted, so nothing was cut), ``to-cut`` (the tail is still there),
            ``to-record`` (the tail is cut, or the record's entry torn: ``TAIL_REPAIRED`` is
            still to be written), ``to-remove`` (``TAIL_REPAIRED`` is in; the record remains).
        problem: Why the record does not describe this ledger (then ``stage`` is ``foreign``).
    """

    record: RepairRecord | None
    stage: str
    problem: str | None = None

    @property
    def pending(self) -> bool:
        return self.stage != "none"

    def action(self, path: Path) -> str:
        """What the operator reads: what is left to do, and the command that does it."""
        run = f"run `phsafe ledger repair {path}` to finish it"
        r = self.record
        if self.stage == "unreadable":
            return (f"a repair of the ledger was stopped while writing its record {repair_record_path(path)} "
                    f"(nothing was cut yet): {run}")
        assert r is not None
        if self.stage == "to-cut":
            return (f"a repair of the ledger is not finished: its record {repair_record_path(path)} says it drops the "
                    f"{r.dropped_bytes} bytes of an interrupted write after entry {r.kept_entries - 1} (SHA-256 "
                    f"{r.dropped_sha256[:16]}...), and they are still there; nothing is recorded until it is: {run}")
        if self.stage == "to-record":
            return (f"a repair of the ledger is not finished: the {r.dropped_bytes} bytes of an interrupted write "
                    f"(SHA-256 {r.dropped_sha256[:16]}...) were dropped and their record, entry {r.seq} "
                    f"(TAIL_REPAIRED), stated in {repair_record_path(path)}, is not yet in the ledger; nothing is "
                    f"recorded until it is: {run}")
        return (f"a repair of the ledger is recorded (entry {r.seq}, TAIL_REPAIRED) and its record "
                f"{repair_record_path(path)} is still there: {run} (it removes the record)")


def repair_status(path: Path, data: bytes, record_bytes: bytes | None) -> RepairStatus:
    """How far the repair stated by ``record_bytes`` (the bytes of ``<ledger>.repair``, None
    when it does not exist) went on the ledger whose bytes are ``data``. Reads nothing.

    The protocol (:func:`repair_ledger`) leaves exactly these states after a stop at any point:
    no record (nothing done, or all done); a record cut short (nothing cut); a whole record with
    the ledger holding its kept bytes followed by the dropped bytes, by nothing, by a part of the
    record's entry (its write cut short), or by the whole entry. Anything else does not come from
    the protocol: the record is foreign to the ledger (``stage="foreign"``, ``problem`` says why).
    """
    if record_bytes is None:
        return RepairStatus(None, "none")
    record = RepairRecord.decode(record_bytes)
    if record is None:
        return RepairStatus(None, "unreadable")
    kept, rest = data[:record.kept_bytes], data[record.kept_bytes:]
    if len(kept) != record.kept_bytes or (kept and not kept.endswith(b"\n")):
        return RepairStatus(record, "foreign", f"the ledger is {len(data)} bytes long; the record keeps its first "
                                               f"{record.kept_bytes} bytes, which do not end an entry")
    try:
        state = replay(kept)
    except LedgerError as exc:
        return RepairStatus(record, "foreign", f"the {record.kept_bytes} bytes it keeps do not verify ({exc})")
    if state.size != record.kept_entries or state.head_hash != record.head_hash:
        return RepairStatus(record, "foreign", f"the bytes it keeps are not the {record.kept_entries} entries ending in "
                                               f"{record.head_hash[:16]}... it states")
    line = record.entry + b"\n"
    if rest == line:
        return RepairStatus(record, "to-remove")
    if len(rest) == record.dropped_bytes and hashlib.sha256(rest).hexdigest() == record.dropped_sha256:
        return RepairStatus(record, "to-cut")
    if line.startswith(rest):  # nothing after the kept bytes, or a part of the record's entry
        return RepairStatus(record, "to-record")
    return RepairStatus(record, "foreign", f"the ledger holds {len(rest)} bytes after the {record.kept_bytes} it "
                                           "keeps that are neither the dropped bytes nor its TAIL_REPAIRED")


def read_repair_record(path: Path) -> bytes | None:
    """The bytes of ``<ledger>.repair``, or None when there is none."""
    try:
        return repair_record_path(path).read_bytes()
    except FileNotFoundError:
        return None


def repair_ledger(path: Path, *, followers: FollowerSource | None = None,
                  reason: str = "incomplete last entry dropped by phsafe ledger repair") -> Repair | None:
    """Drop an incomplete last line (an interrupted write) and record ``TAIL_REPAIRED``, so that
    no stop, at any point, leaves the one without the other.

    The standard write-ahead-log recovery, with its record written ahead: every complete entry
    must verify; then, under the ledger's lock,

    1. the repair's record ``<ledger>.repair`` (:class:`RepairRecord`: what is kept, what is
       dropped and its SHA-256, and the exact ``TAIL_REPAIRED`` line) is created and synced, and
       its folder synced;
    2. the bytes after the last newline are cut off (synced);
    3. the ``TAIL_REPAIRED`` line is appended (synced), and the public log follows;
    4. the record is removed, and its folder synced.

    While the record exists the ledger takes no other entry, and ``phsafe audit verify`` says
    the repair is not finished. Stopped anywhere, running this again finishes it
    (:func:`repair_status` tells how far it went): the tail it states is cut if it is still
    there, the line it states is written (a part of it, torn by the stop, is cut first), the
    record is removed. Safe because noise is drawn only after its ``INTENT`` is complete on disk.

    A ledger bound to its public log is repaired only with it: ``followers`` checks the log
    before anything is cut, and attaches it to record ``TAIL_REPAIRED``.

    Returns:
        What was dropped, or None if the ledger ends in a complete entry, verifies and has no
        repair in progress (nothing to repair).

    Raises:
        LedgerError: The ledger is missing, empty, not a ledger or unwritable; a complete entry
            breaks a rule (damage in the middle, not a torn write: the message names the entry and
            says to restore the ledger from its backup; nothing is changed); it holds no complete
            entry; or a repair record is there that does not describe this ledger.
    """
    path = Path(path)
    check_ledger_file(path)
    finishing = False
    try:
        lock_fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    except OSError as exc:
        raise LedgerError(f"cannot repair the ledger {path}: {os_reason(exc)}") from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        data = path.read_bytes()
        status = repair_status(path, data, read_repair_record(path))
        if status.stage == "foreign":
            raise LedgerError(
                f"cannot repair the ledger {path}: the repair record {repair_record_path(path)} does not describe it "
                f"({status.problem}). Nothing was changed: restore the ledger from its backup, and have the auditors "
                "compare the two")
        if status.stage == "unreadable":
            # Its write was cut short, so nothing was cut after it: start again.
            repair_record_path(path).unlink()
            durable.fsync_folder(path.parent)
            status = RepairStatus(None, "none")
        if status.record is None:
            record = _plan_repair(path, data, followers, reason)
            if record is None:
                return None
            durable.create(repair_record_path(path), record.encode(), mode=PRIVATE_FILE)  # 1
        else:
            record, finishing = status.record, True
            _check_followers(path, replay(data[:record.kept_bytes]), followers)
        if len(data) > record.kept_bytes and status.stage != "to-remove":
            fd = os.open(path, os.O_WRONLY)
            try:
                durable.truncate(fd, record.kept_bytes)  # 2: the dropped bytes, or a torn part of the entry
            finally:
                os.close(fd)
    except OSError as exc:
        raise LedgerError(f"cannot repair the ledger {path}: {os_reason(exc)}") from None
    finally:
        os.close(lock_fd)
    ledger = Ledger.open(path, followers)
    with ledger.locked() as state:
        if state.size == record.kept_entries:
            ledger.append_line(record.entry)  # 3
        try:
            repair_record_path(path).unlink()  # 4
            durable.fsync_folder(path.parent)
        except OSError as exc:
            raise LedgerError(f"the repair of the ledger {path} is recorded (entry {record.seq}), but its record "
                              f"{repair_record_path(path)} could not be removed: {os_reason(exc)}; run "
                              "`phsafe ledger repair` again") from None
    return Repair(record.dropped_bytes, record.dropped_sha256, record.seq, finished_earlier=finishing)


def _check_followers(path: Path, state: LedgerState, followers: FollowerSource | None) -> None:
    if state.public_log is not None:
        if followers is None:
            raise LedgerError(f"the ledger {path} is bound to its public log {state.public_log['origin']}: it is "
                              "repaired only with it (phsafe.publog.repair_ledger)")
        followers.check(path, state)  # a missing or foreign log refuses the repair: nothing is cut


def _plan_repair(path: Path, data: bytes, followers: FollowerSource | None, reason: str) -> RepairRecord | None:
    """What a repair of the ledger ``data`` does (None: it ends in a complete entry): checked
    against every rule before anything is written."""
    cut = data.rfind(b"\n") + 1
    try:
        state = replay(data[:cut])
    except LedgerError as exc:
        raise _damaged(path, exc) from None
    _check_followers(path, state, followers)
    if data.endswith(b"\n"):
        return None
    if state.size == 0:
        raise LedgerError("the ledger holds no complete entry (its creation was interrupted): remove it "
                          "and its key file, and run `phsafe ledger init` again")
    dropped = data[cut:]
    entry: dict[str, Any] = {"seq": state.size, "prev": state.head_hash, "kind": EntryKind.TAIL_REPAIRED.value,
                             "time": now(), "run_id": None, "dropped_bytes": len(dropped),
                             "dropped_sha256": hashlib.sha256(dropped).hexdigest(),
                             "reason": clean_text(reason) or "repaired"}
    entry["hash"] = entry_hash(entry)
    line = canonical_json(entry)
    apply(state, line)  # the record's entry is the next valid entry of the kept ledger
    return RepairRecord(cut, entry["seq"], entry["prev"], entry["dropped_bytes"], entry["dropped_sha256"], line)


def migrate_ledger(
    path: Path,
    *,
    lifetime_cap: Amount,
    reason: str,
    names: Mapping[str, str] | str,
    privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP,
    code_version: str = "unknown",
) -> Ledger:
    """Turn a ledger of the first format into this one, in place (``LEDGER_MIGRATED``).

    Args:
        path: The ledger.
        lifetime_cap, reason, privacy_defn: The policy from now on (see :func:`init_ledger`).
        names: The dataset name of every old dataset id (a mapping; a prefix of at least 8
            hex digits of an id is enough), or one name if the ledger has one dataset.
        code_version: Recorded.

    Raises:
        LedgerError: The ledger has a policy already, its key file exists, an old dataset id has
            no name, or its runs mix confidential and non-confidential data.
    """
    path = Path(path).absolute()
    ledger = Ledger.open(path)
    if key_path(path).exists():
        raise LedgerError(f"{key_path(path)} already exists; a ledger is migrated once")
    with ledger.locked() as state:
        if state.policy is not None:
            raise LedgerError("the ledger is already of the current format; nothing to migrate")
        legacy = sorted({r.legacy_dataset_id for r in state.runs.values() if r.legacy_dataset_id})
        if isinstance(names, str):
            if len(legacy) != 1:
                raise LedgerError(f"the ledger has {len(legacy)} old datasets; name each: --map ID=NAME")
            mapping = {legacy[0]: names}
        else:
            mapping = {}
            for prefix, name in names.items():
                hits = [i for i in legacy if len(prefix) >= 8 and i.startswith(prefix.lower())]
                if len(hits) != 1:
                    raise LedgerError(f"{prefix!r} names {len(hits)} old dataset ids; give 8 or more hex digits of one")
                mapping[hits[0]] = name
            missing = [i[:16] for i in legacy if i not in mapping]
            if missing:
                raise LedgerError(f"old dataset {missing[0]} has no name; name every old dataset (--map ID=NAME)")
        flags = {r.non_confidential for r in state.runs.values()}
        if len(flags) != 1:
            raise LedgerError("the ledger mixes confidential and non-confidential runs; it cannot take one policy")
        key = new_lineage_key()
        body = policy_body(lifetime_cap, reason, privacy_defn, flags.pop(), key, code_version)
        try:
            write_lineage_key(path, key)
        except OSError as exc:
            raise LedgerError(f"cannot create the lineage key {key_path(path)}: {os_reason(exc)}") from None
        try:
            ledger.append_entries([(EntryKind.LEDGER_MIGRATED, None, {**body, "datasets": mapping})])
        except BaseException:
            key_path(path).unlink(missing_ok=True)
            raise
    return ledger
