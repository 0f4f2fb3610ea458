"""The ledger's files: paths, the lock, the file kept open, followers, durable appends.

The rules are not here (:mod:`phsafe.ledger.rules`, applied by :mod:`phsafe.ledger.replay`): this
module reads bytes for the replay and writes the lines the replay accepted. See "Write-ahead
spends" in :mod:`phsafe.ledger.format` for the protocol: every append happens under an exclusive
``flock`` on ``<ledger>.lock``, after catching up with (and verifying) what other processes
appended, with one ``write`` and an ``fsync`` before the lock is released; a failed write is cut
back so that the file never keeps a partial entry of a live process (:func:`phsafe.durable.append`).

A process opens the file once and follows it (:class:`LedgerFile`): it knows how far it has read,
and on each use reads only what was appended since. What follows the ledger -- its public log --
is an :class:`AppendFollower` that registers itself: the ledger calls it under its lock and never
reads its files, and a ledger whose policy binds a log appends nothing without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import threading
import weakref
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Self, Sequence

from phsafe import durable
from phsafe.errors import LedgerError, TornTailError, os_reason
from phsafe.ledger.format import EntryKind, canonical_json, entry_hash, now
from phsafe.ledger.replay import apply, apply_all
from phsafe.ledger.state import LedgerState

LOCK_SUFFIX = ".lock"
REPAIR_SUFFIX = ".repair"


def lock_path(path: Path) -> Path:
    """``<ledger>.lock``: the file every append holds an exclusive ``flock`` on."""
    return Path(path).with_name(Path(path).name + LOCK_SUFFIX)


def repair_record_path(path: Path) -> Path:
    """``<ledger>.repair``: the record of a repair in progress (:func:`phsafe.ledger.admin.repair_ledger`),
    written and synced before the torn tail is cut and removed once ``TAIL_REPAIRED`` is in the
    ledger. While it exists the ledger takes no entry but that repair's own."""
    return Path(path).with_name(Path(path).name + REPAIR_SUFFIX)


class FollowerUnwritable(LedgerError):
    """A follower (the public log) cannot write its files: the operating system refused (no
    permission, a read-only or full file system). Not damage: nothing it holds is wrong, it
    lags behind the ledger and catches up once it can be written.

    Attributes:
        errno: The refusal's ``errno`` (``EACCES``, ``ENOSPC`` ...), or None.
        appended: The entries the ledger had written durably when the follower failed to follow
            them (empty when it failed before anything was appended).
    """

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.appended: list[dict[str, Any]] = []


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
    """Create ``folder`` and any missing parent, each of mode 0700 (whatever the umask) and each
    synced into its parent (:func:`phsafe.durable.make_folders`: a power cut cannot lose the
    folder, or what is later made durable in it); existing folders are left as they are."""
    for path in durable.make_folders(folder, mode=PRIVATE_FOLDER):
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
    state, torn, _tail = _read_verified(Path(path))
    if torn is not None:
        raise torn from None
    return state


def read_ledger_prefix(path: Path) -> tuple[LedgerState, bytes]:
    """Read and fully verify the ledger's complete entries, whatever follows them.

    Returns:
        The verified state of every complete entry, and the bytes after the last newline (an
        interrupted write: empty when the ledger ends in a complete entry).

    Raises:
        LedgerError: The file cannot be read, or a complete entry breaks a rule.
    """
    state, _torn, tail = _read_verified(Path(path))
    return state, tail


def _read_verified(path: Path) -> tuple[LedgerState, TornTailError | None, bytes]:
    """The verified state of the ledger's complete entries, read once under the shared lock;
    when it ends in an incomplete line, the :class:`TornTailError` saying so and the incomplete
    bytes. Every complete line is applied before the tail is looked at
    (:func:`~phsafe.ledger.replay.apply_all`), so the state is that of the whole prefix (the
    prefix is replayed once, not once to find the tail and again without it).

    Raises:
        LedgerError: The file cannot be read, or a complete entry breaks a rule.
    """
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
    except TornTailError as exc:
        return state, exc, data[data.rfind(b"\n") + 1:]
    except LedgerError as exc:
        raise not_a_ledger(path, exc) from None
    return state, None, b""


def not_a_ledger(path: Path, exc: LedgerError) -> LedgerError:
    """``exc``, or -- when the file's very first line is no ledger entry -- that it is not a ledger."""
    if exc.seq != 0 or isinstance(exc, TornTailError) or exc.kind is not None:
        return exc
    return LedgerError(f"{path} is not a ledger: its first line (entry 0) is not a ledger entry ({exc.reason}). Give the "
                       "right file, or restore the ledger from its backup")


# --------------------------------------------------------------------------------------------
# The ledger kept open, its followers, durable appends
# --------------------------------------------------------------------------------------------


class AppendFollower(Protocol):
    """What the ledger keeps in step with itself, under its lock: its public log
    (:class:`phsafe.publog.PublicLog`), which registers itself (:meth:`LedgerFile.add_follower`).

    The ledger knows its followers by this protocol only -- it reads none of their files -- as
    Go's tlog knows its hashes through a ``HashReader``: the rules, the ledger's file and the log
    are read apart.
    """

    @property
    def binding(self) -> Mapping[str, Any]:
        """What it is, as the ledger's policy binds it (``public_log``: origin, keys, quorum)."""
        ...

    def follow(self, lines: Sequence[bytes]) -> None:
        """Be in step with the ledger whose verified lines are ``lines``: called under the lock
        after every catch-up with the file and after every append. Raises LedgerError when it
        cannot be (then nothing more is appended until it can)."""
        ...

    def confirm(self, lines: Sequence[bytes], *, fresh: bool) -> None:
        """Vouch for the ledger as it is now, before (``fresh``) and after every entry that
        spends or lets spend (for the public log: in step, and cosigned by its witness quorum --
        asked anew when ``fresh``). Raises -- a :class:`~phsafe.errors.BudgetError` -- to refuse."""
        ...


class FollowerSource(Protocol):
    """Finds a ledger's followers and attaches them: :data:`phsafe.publog.PUBLIC_LOG` for the
    public log. Given to :meth:`LedgerFile.open` (and to ``init_ledger`` and ``repair_ledger``),
    so the ledger never has to know where its log lives."""

    def check(self, ledger_path: Path, state: LedgerState) -> None:
        """Refuse -- a LedgerError naming what is missing -- unless the followers ``state`` binds
        are there and are the bound ones. Changes nothing."""
        ...

    def attach(self, ledger: "LedgerFile") -> None:
        """Check, then attach the followers to ``ledger`` (:meth:`LedgerFile.add_follower`)."""
        ...


APPENDS_WITHOUT_LOG = frozenset({EntryKind.TAIL_REPAIRED})
"""What a ledger awaiting its log binding (format 2) may still take: the repair of a torn tail."""


class _Descriptors:
    """The ledger's and its lock file's descriptors, and the process that opened them -- apart
    from the :class:`LedgerFile`, so that one dropped unclosed closes them when collected (raw
    descriptors are never closed otherwise: a process that opens many ledgers would run out)."""

    __slots__ = ("fd", "lock_fd", "pid")

    def __init__(self) -> None:
        self.fd = self.lock_fd = self.pid = -1

    def close(self) -> None:
        """Close both, in the process that opened them only (a forked child leaves the parent's)."""
        for fd in (self.fd, self.lock_fd):
            if fd >= 0 and self.pid == os.getpid():
                os.close(fd)
        self.fd = self.lock_fd = -1


def _descriptor(name: str) -> property:
    def get(self: "LedgerFile") -> int:
        return getattr(self._descriptors, name)

    def put(self: "LedgerFile", value: int) -> None:
        setattr(self._descriptors, name, value)

    return property(get, put)


class LedgerFile:
    """A ledger file kept open: its verified state, caught up under the lock before every use.

    The base of :class:`phsafe.ledger.runs.Ledger`. The file is opened once (with its lock file)
    and followed: every use takes the process's mutex and the file lock, reads only what other
    processes appended since (the file's size, then those bytes), and verifies it. Inside
    :meth:`locked`, :meth:`append_entries` checks new entries against every rule and appends
    them durably; followers (:class:`AppendFollower`) are kept in step under the same lock.
    """

    def __init__(self, path: Path) -> None:
        """Use :meth:`open` (an existing ledger) or :func:`~phsafe.ledger.admin.init_ledger` (a new one)."""
        self.path = Path(path)
        self.lock_path = lock_path(self.path)
        self._state = LedgerState()
        self._offset = 0
        self._mutex = threading.Lock()
        self._descriptors = _Descriptors()
        weakref.finalize(self, self._descriptors.close).atexit = False
        self._followers: list[AppendFollower] = []

    @classmethod
    def open(cls, path: Path, followers: FollowerSource | None = None) -> Self:
        """Open and verify the existing ledger at ``path`` (nothing is created but its lock file),
        with its followers attached when ``followers`` is given. Without them the ledger reads,
        but one bound to a public log appends nothing.

        Raises:
            LedgerError: The ledger does not exist, is not a usable regular file, or is broken;
                a follower it binds is missing or is another's.
        """
        check_ledger_file(Path(path))
        ledger = cls(Path(path))
        with ledger.locked():
            pass  # locked() replays everything on disk
        if followers is not None:
            followers.attach(ledger)
        return ledger

    _fd = _descriptor("fd")
    _lock_fd = _descriptor("lock_fd")
    _pid = _descriptor("pid")

    @property
    def state(self) -> LedgerState:
        """The verified state as of the last read (refresh with :meth:`verify`)."""
        return self._state

    # -- the file, opened once -----------------------------------------------------------------

    def _files(self) -> None:
        """The ledger and its lock file open in this process (again after a fork: a child must
        not share the parent's open file, whose lock would then be the parent's too)."""
        if self._pid == os.getpid() and self._fd >= 0:
            return
        self._fd = self._lock_fd = -1  # a parent's descriptors are left to the parent
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            raise LedgerError(f"cannot open the ledger {self.path}: {os_reason(exc)}") from None
        try:
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        except OSError as exc:
            os.close(self._fd)
            self._fd = -1
            raise LedgerError(f"cannot open the ledger's lock file {self.lock_path}: {os_reason(exc)}") from None
        self._pid = os.getpid()
        if self._offset:
            self._check_same_file()

    def _take_lock(self) -> None:
        """The exclusive flock on the lock file -- the one at ``lock_path`` now (a lock file removed
        and made anew by someone is opened again: a lock on a removed file excludes nobody)."""
        while True:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                st_path = os.stat(self.lock_path)
            except FileNotFoundError:
                st_path = None
            st_open = os.fstat(self._lock_fd)
            if st_path is not None and (st_path.st_dev, st_path.st_ino) == (st_open.st_dev, st_open.st_ino):
                return
            os.close(self._lock_fd)  # releases it
            try:
                self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
            except OSError as exc:
                self._lock_fd = -1
                self._pid = -1
                raise LedgerError(f"cannot open the ledger's lock file {self.lock_path}: {os_reason(exc)}") from None

    def _check_same_file(self) -> None:
        """The path still names the file this process read (it was not replaced under it)."""
        try:
            st_path, st_open = os.stat(self.path), os.fstat(self._fd)
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {os_reason(exc)}") from None
        if (st_path.st_dev, st_path.st_ino) != (st_open.st_dev, st_open.st_ino):
            raise LedgerError(f"the ledger {self.path} was replaced by another file while in use; nothing more is "
                              "recorded in it from this process", seq=self._state.size)

    def same_file(self) -> bool:
        """Whether ``path`` still names the file this object reads (while it is open, its inode
        cannot be reused by another file)."""
        if self._fd < 0 or self._pid != os.getpid():
            return False
        try:
            st_path, st_open = os.stat(self.path), os.fstat(self._fd)
        except OSError:
            return False
        return (st_path.st_dev, st_path.st_ino) == (st_open.st_dev, st_open.st_ino)

    def close(self) -> None:
        """Close the file and its lock file (a later use opens them again)."""
        with self._mutex:
            self._descriptors.close()

    def verify(self) -> None:
        """Re-read and verify the whole ledger from disk.

        Raises:
            LedgerError: naming the first entry that breaks a rule.
        """
        with self._mutex:
            state = read_ledger(self.path)
            self._state, self._offset = state, sum(len(line) + 1 for line in state.lines)

    @contextlib.contextmanager
    def locked(self, *, lagging: bool = False) -> Iterator[LedgerState]:
        """Hold the process lock and the file lock, with the state caught up with the file and
        every follower in step -- or, with ``lagging``, behind it when it cannot write its files
        (:class:`FollowerUnwritable`: recording a run's failure must not depend on its log)."""
        with self._mutex:
            self._files()
            self._take_lock()
            try:
                self._catch_up()
                for follower in self._followers:
                    try:
                        follower.follow(self._state.lines)
                    except FollowerUnwritable:
                        if not lagging:
                            raise
                yield self._state
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _catch_up(self) -> None:
        """Verify and apply whatever was appended (by any process) since the last read."""
        try:
            self._check_same_file()
            size = os.fstat(self._fd).st_size
            if size < self._offset:
                raise LedgerError(f"the ledger shrank from {self._offset} to {size} bytes since it was read",
                                  seq=self._state.size)
            if size == self._offset:
                return
            if self._state.lines:
                # Cheap guard against the bytes already read having been changed.
                last = self._state.lines[-1]
                if os.pread(self._fd, len(last) + 1, self._offset - len(last) - 1) != last + b"\n":
                    raise LedgerError("the ledger's last known entry changed on disk", seq=self._state.size - 1)
            data = _pread_all(self._fd, size - self._offset, self._offset)
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

    # -- followers ------------------------------------------------------------------------------

    def add_follower(self, follower: AppendFollower) -> None:
        """Keep ``follower`` in step from now on (it is brought in step here, under the lock).

        Raises:
            LedgerError: The ledger's policy binds another public log (or none) than ``follower``.
        """
        with self.locked() as state:
            if state.public_log is not None and dict(follower.binding) != state.public_log:
                raise LedgerError(f"the public log offered to the ledger {self.path} is not the one its entry "
                                  f"{state.public_log_seq} binds (origin {state.public_log['origin']})")
            self._followers.append(follower)
            follower.follow(state.lines)

    @property
    def followers(self) -> tuple[AppendFollower, ...]:
        return tuple(self._followers)

    def _bound_follower(self, state: LedgerState, binding: Mapping[str, Any] | None) -> None:
        if binding is None:
            return
        if not any(dict(f.binding) == dict(binding) for f in self._followers):
            raise LedgerError(
                f"the ledger {self.path} is bound to its public log {binding['origin']} (entry "
                f"{state.public_log_seq if state.public_log is not None else state.size}) and was opened without it: "
                "nothing is recorded without the log (open the ledger with phsafe.publog.open_ledger)")

    def _may_append(self, state: LedgerState, items: Sequence[tuple[EntryKind, str | None, Mapping[str, Any]]]) -> None:
        """A ledger bound to a public log appends only with that log following it; one awaiting
        its binding (format 2) takes nothing but a repair until ``phsafe ledger migrate``."""
        for kind, _, body in items:
            if kind is EntryKind.LOG_BOUND:
                self._bound_follower(state, body.get("public_log"))
            elif state.public_log is not None:
                self._bound_follower(state, state.public_log)
            elif state.awaits_log_binding and kind not in APPENDS_WITHOUT_LOG:
                raise LedgerError(
                    f"the ledger {self.path} was made before ledgers were bound to their public log: bind its log "
                    f"to it with `phsafe ledger migrate {self.path}` (recorded), then run again")

    def confirm(self, *, fresh: bool = True) -> None:
        """With the lock held: every follower vouches for the ledger as it is now (the public log:
        in step and cosigned by its witness quorum). Called before (``fresh``: the witnesses are
        asked anew) and after (``fresh=False``) every entry that spends or lets spend.

        Raises:
            BudgetError: A follower refuses (e.g. :class:`~phsafe.errors.ForkRefused`).
            LedgerError: The ledger is bound to a log that is not following it.
        """
        self._bound_follower(self._state, self._state.public_log)
        for follower in self._followers:
            follower.confirm(self._state.lines, fresh=fresh)

    # -- appends --------------------------------------------------------------------------------

    def append_entries(self, items: list[tuple[EntryKind, str | None, Mapping[str, Any]]], *,
                       lagging: bool = False) -> list[dict[str, Any]]:
        """Append entries atomically; must be called with the lock held (inside :meth:`locked`).

        Every entry is checked against the rules (each after the ones before it) before anything
        is written; then all are written with one ``write`` and fsynced
        (:func:`phsafe.durable.append`). If the write fails (``ENOSPC``, ``EFBIG``, an I/O error)
        the file is cut back to where it ended, so nothing of it stays, and a
        :class:`LedgerError` names the cause. Then every follower follows: one that cannot write
        its files raises :class:`FollowerUnwritable` with the entries appended -- unless
        ``lagging`` (a run's failure: it spends nothing and lets nothing spend, and the log
        records it once it can be written, before any later spend).
        """
        state = self._state
        self._may_append(state, items)
        self._no_repair_pending()
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
        self._write(lines, entries, lagging=lagging)
        return entries

    def append_line(self, line: bytes) -> dict[str, Any]:
        """Append one entry whose exact bytes were fixed beforehand -- the ``TAIL_REPAIRED`` of a
        repair, stated in its record (:func:`~phsafe.ledger.admin.repair_ledger`) before the tail
        was cut; must be called with the lock held. The only append a pending repair admits.

        Raises:
            LedgerError: The line breaks a rule (it is not the next entry), or cannot be written.
        """
        try:
            kind = EntryKind(json.loads(line)["kind"])
        except (ValueError, KeyError, TypeError):
            raise LedgerError("not a valid ledger line", seq=self._state.size) from None
        self._may_append(self._state, [(kind, None, {})])
        entry = apply(self._state, line)  # checks every rule, then updates the state
        self._write([line], [entry])
        return entry

    def _no_repair_pending(self) -> None:
        """Refuse to append while a repair is in progress (its record exists): its truncation,
        or its ``TAIL_REPAIRED``, is still to come, and must come next."""
        if os.path.lexists(repair_record_path(self.path)):
            raise LedgerError(
                f"a repair of the ledger {self.path} is not finished (its record {repair_record_path(self.path)} "
                f"is there): nothing is recorded until it is -- run `phsafe ledger repair {self.path}`")

    def _write(self, lines: list[bytes], entries: list[dict[str, Any]], *, lagging: bool = False) -> None:
        """Write ``lines`` (already applied to the state) durably, then let every follower follow.

        A follower that cannot write its files (:class:`FollowerUnwritable`) is raised with the
        entries the ledger holds now (``appended``): they are recorded, and the follower lags."""
        data = b"".join(line + b"\n" for line in lines)
        try:
            durable.append(self._fd, data, end=self._offset)
        except OSError as exc:
            left = ("the ledger may end in an incomplete entry: run `phsafe ledger repair LEDGER`"
                    if isinstance(exc, durable.TornAppend) else "nothing of it was kept")
            self._reload_quietly()
            raise LedgerError(f"could not write the ledger {self.path}: {os_reason(exc)}; {left}. "
                              "Free space (or fix the file system) and run again") from None
        self._offset += len(data)
        for follower in self._followers:
            try:
                follower.follow(self._state.lines)
            except FollowerUnwritable as exc:
                if lagging:
                    continue
                exc.appended = list(entries)
                raise

    def _reload_quietly(self) -> None:
        try:
            self._reload()
        except LedgerError:
            self._state, self._offset = LedgerState(), 0  # replayed on the next lock


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)
