"""The ledger's files: paths, the lock, catching up, appends that are durable or rolled back.

The rules are not here (:mod:`phsafe.ledger.rules`, applied by :mod:`phsafe.ledger.replay`): this
module reads bytes for the replay and writes the lines the replay accepted. See "Write-ahead
spends" in :mod:`phsafe.ledger.format` for the protocol: every append happens under an exclusive
``flock`` on ``<ledger>.lock``, after catching up with (and verifying) what other processes
appended, with one ``write`` and an ``fsync`` before the lock is released; a failed write is cut
back so that the file never keeps a partial entry of a live process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
from pathlib import Path
from typing import Any, Iterator, Mapping, Self

from phsafe import durable
from phsafe.errors import LedgerError, TornTailError, os_reason
from phsafe.ledger.format import EntryKind, canonical_json, entry_hash, now
from phsafe.ledger.replay import apply, apply_all
from phsafe.ledger.state import LedgerState

LOCK_SUFFIX = ".lock"
_UNKNOWN = object()  # the ledger's public log has not been looked for yet


def lock_path(path: Path) -> Path:
    """``<ledger>.lock``: the file every append holds an exclusive ``flock`` on."""
    return Path(path).with_name(Path(path).name + LOCK_SUFFIX)


def regular_file(path: Path, what: str) -> os.stat_result | None:
    """``path``'s stat if it exists, None if it does not; a LedgerError if it is not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"{what} {path}: {os_reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise LedgerError(f"{what} {path} is {kind}; a ledger and its lock and key files are regular files")
    return st


def check_ledger_file(path: Path, *, write: bool = True) -> None:
    """Check that ``path`` is an existing ledger this process can use, touching nothing.

    The ledger must be a regular file (readable, and with ``write``: appendable and fsync-able,
    checked by opening it for appending and fsyncing it without writing); its lock file must be
    a regular file or creatable next to it. Nothing is created.

    Raises:
        LedgerError: Saying what is wrong and what to do.
    """
    path = Path(path)
    st = regular_file(path, "the ledger")
    if st is None:
        raise LedgerError(
            f"the ledger {path} does not exist. A ledger is created once, before any data is seen: "
            f"`phsafe ledger init {path} --lifetime-cap RHO --reason TEXT`"
        )
    if st.st_size == 0:
        raise LedgerError(f"{path} is empty (0 bytes; entry 0: missing): it is not a ledger, which always holds at "
                          "least the entry that created it. Give the right file, or restore the ledger from its backup")
    lock = lock_path(path)
    lock_exists = regular_file(lock, "the ledger's lock file") is not None
    try:
        if write:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if lock_exists:
                os.close(os.open(lock, os.O_RDWR))
            elif not os.access(path.parent, os.W_OK | os.X_OK):
                raise LedgerError(f"cannot create the ledger's lock file {lock}: its folder is not writable")
        else:
            os.close(os.open(path, os.O_RDONLY))
    except OSError as exc:
        raise LedgerError(f"cannot {'append to' if write else 'read'} the ledger {path}: {os_reason(exc)}") from None


PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def make_private_folders(folder: Path) -> None:
    """Create ``folder`` and any missing parent, each of mode 0700 (whatever the umask); existing
    folders are left as they are."""
    folder = Path(folder)
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=PRIVATE_FOLDER)
        except FileExistsError:
            continue
        os.chmod(path, PRIVATE_FOLDER)


def check_private(path: Path, what: str) -> None:
    """Refuse a confidential file (the ledger, its lineage key) that others may read or write.

    Raises:
        LedgerError: One line saying what to run to fix it.
    """
    st = regular_file(path, what)
    if st is not None and st.st_mode & 0o077:
        raise LedgerError(f"{what} {path} is open to others (mode {stat.S_IMODE(st.st_mode):04o}); it is "
                          f"confidential: make it private to its owner with `chmod 600 {path}`, then run again")


def read_ledger(path: Path) -> LedgerState:
    """Read and fully verify the ledger at ``path``.

    Raises:
        LedgerError: naming the first entry that breaks a rule, and the rule (a
            :class:`TornTailError` if the last line is incomplete), or that the file cannot be read.
    """
    path = Path(path)
    check_ledger_file(path, write=False)
    lock = lock_path(path)
    try:
        # A shared lock, when the lock file exists, keeps a live run's append from looking torn.
        fd = os.open(lock, os.O_RDONLY) if lock.is_file() else None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)
            data = path.read_bytes()
        finally:
            if fd is not None:
                os.close(fd)
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path}: {os_reason(exc)}") from None
    state = LedgerState()
    try:
        apply_all(state, data)
    except LedgerError as exc:
        raise not_a_ledger(path, exc) from None
    return state


def not_a_ledger(path: Path, exc: LedgerError) -> LedgerError:
    """``exc``, or -- when the file's very first line is no ledger entry -- that it is not a ledger."""
    if exc.seq != 0 or isinstance(exc, TornTailError) or exc.kind is not None:
        return exc
    return LedgerError(f"{path} is not a ledger: its first line (entry 0) is not a ledger entry ({exc.reason}). Give the "
                       "right file, or restore the ledger from its backup")


# --------------------------------------------------------------------------------------------
# Durable appends
# --------------------------------------------------------------------------------------------


class LedgerFile:
    """A ledger file kept open: its verified state, caught up under the lock before every use.

    The base of :class:`phsafe.ledger.runs.Ledger`. :meth:`locked` holds the process's mutex and the
    file lock with the state caught up with whatever other processes appended; inside it,
    :meth:`append_entries` checks new entries against every rule and appends them durably.
    """

    def __init__(self, path: Path) -> None:
        """Use :meth:`open` (an existing ledger) or :func:`~phsafe.ledger.admin.init_ledger` (a new one)."""
        self.path = Path(path)
        self.lock_path = lock_path(self.path)
        self._state = LedgerState()
        self._offset = 0
        self._mutex = threading.Lock()
        self._public_log: Any = _UNKNOWN

    @classmethod
    def open(cls, path: Path) -> Self:
        """Open and verify the existing ledger at ``path`` (nothing is created but its lock file).

        Raises:
            LedgerError: The ledger does not exist, is not a usable regular file, or is broken.
        """
        check_ledger_file(Path(path))
        ledger = cls(Path(path))
        with ledger.locked():
            pass  # locked() replays everything on disk
        return ledger

    @property
    def state(self) -> LedgerState:
        """The verified state as of the last read (refresh with :meth:`verify`)."""
        return self._state

    def verify(self) -> None:
        """Re-read and verify the whole ledger from disk.

        Raises:
            LedgerError: naming the first entry that breaks a rule.
        """
        with self._mutex:
            state = read_ledger(self.path)
            self._state, self._offset = state, sum(len(line) + 1 for line in state.lines)

    @contextlib.contextmanager
    def locked(self) -> Iterator[LedgerState]:
        """Hold the process lock and the file lock, with the state caught up with the file."""
        with self._mutex:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
            except OSError as exc:
                raise LedgerError(f"cannot open the ledger's lock file {self.lock_path}: {os_reason(exc)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._catch_up()
                self._sync_public_log()
                yield self._state
            finally:
                os.close(fd)  # releases the flock

    def _catch_up(self) -> None:
        """Verify and apply whatever was appended (by any process) since the last read."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset:
                    raise LedgerError(
                        f"the ledger shrank from {self._offset} to {size} bytes since it was read",
                        seq=self._state.size,
                    )
                if self._state.lines:
                    # Cheap guard against the file having been replaced under us.
                    last = self._state.lines[-1]
                    f.seek(self._offset - len(last) - 1)
                    if f.read(len(last) + 1) != last + b"\n":
                        raise LedgerError("the ledger's last known entry changed on disk", seq=self._state.size - 1)
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {os_reason(exc)}") from None

        def advance(line: bytes) -> None:
            self._offset += len(line) + 1

        try:
            apply_all(self._state, data, advance)
        except LedgerError as exc:
            raise (not_a_ledger(self.path, exc) if self._offset == 0 else exc) from None

    def _reload(self) -> None:
        """Forget the in-memory state and replay the file (after a failed append)."""
        self._state, self._offset = LedgerState(), 0
        self._catch_up()

    def append_entries(self, items: list[tuple[EntryKind, str | None, Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """Append entries atomically; must be called with the lock held (inside :meth:`locked`).

        Every entry is checked against the rules (each after the ones before it) before anything
        is written; then all are written with one ``write`` and fsynced. If the write fails
        (``ENOSPC``, ``EFBIG``, an I/O error) the file is cut back to where it ended, so nothing
        of it stays, and a :class:`LedgerError` names the cause.
        """
        state = self._state
        lines: list[bytes] = []
        entries: list[dict[str, Any]] = []
        try:
            for kind, run_id, body in items:
                entry: dict[str, Any] = {"seq": state.size, "prev": state.head_hash, "kind": kind.value,
                                         "time": now(), "run_id": run_id, **body}
                entry["hash"] = entry_hash(entry)
                line = canonical_json(entry)
                entries.append(apply(state, line))  # checks every rule, then updates the state
                lines.append(line)
        except BaseException:
            if lines:
                self._reload()  # the earlier entries of this batch are in memory only
            raise
        data = b"".join(line + b"\n" for line in lines)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self._reload()
            raise LedgerError(f"cannot append to the ledger {self.path}: {os_reason(exc)}") from None
        try:
            durable.append(fd, data, end=self._offset)
        except OSError as exc:
            cause = os_reason(exc)
            left = ("the ledger may end in an incomplete entry: run `phsafe ledger repair LEDGER`"
                    if isinstance(exc, durable.TornAppend) else "nothing of it was kept")
            os.close(fd)
            fd = -1
            self._reload_quietly()
            raise LedgerError(f"could not write the ledger {self.path}: {cause}; {left}. "
                              "Free space (or fix the file system) and run again") from None
        finally:
            if fd >= 0:
                os.close(fd)
        self._offset += len(data)
        self._sync_public_log()
        return entries

    # -- the public log (phsafe.publog): kept in step under this lock ------------------------

    @property
    def public_log(self) -> Any:
        """The ledger's :class:`phsafe.publog.PublicLog`, or None (a ledger made without one)."""
        if self._public_log is _UNKNOWN:
            from phsafe.publog.log import PublicLog

            self._public_log = PublicLog.for_ledger(self.path)
        return self._public_log

    def _sync_public_log(self) -> None:
        if self.public_log is not None:
            self.public_log.sync(self._state.lines)

    def require_witnesses(self) -> int:
        """With the lock held: the public log cosigned by the ledger's witness quorum (if any).

        Raises:
            ForkRefused: The witnesses refuse this ledger's history (a copy, a rollback).
        """
        return 0 if self.public_log is None else self.public_log.require_witnesses(self._state.lines)

    def _reload_quietly(self) -> None:
        try:
            self._reload()
        except LedgerError:
            self._state, self._offset = LedgerState(), 0  # replayed on the next lock
