"""The log as a folder of files (:mod:`.layout`): its writer, its recovery and its reader.

:class:`LogDirectory` is the writer. Its owner serialises every call (the ledger calls it under
its lock); it takes no lock of its own. One :meth:`LogDirectory.append` writes, in this order:

1. the new lines of ``entries`` (one ``write``, ``fsync``);
2. their stored hashes to ``hashes`` (one ``write``, ``fsync``);

and :meth:`LogDirectory.publish_checkpoint` then replaces ``checkpoint`` atomically (after
checking it is a tree head of these entries). Killed at any point, the folder is left in a
state :meth:`LogDirectory.recover` repairs without guessing: a torn last entry line (never
hashed, never signed) is cut off; a torn hash append is cut back to the last whole tree; hashes
missing for whole entry lines are recomputed from them. Nothing signed is ever cut: a checkpoint
is only published over entries and hashes already durable. :meth:`LogDirectory.open` refuses a
folder in need of recovery, so the owner decides when it runs (for the ledger: ``ledger
repair``, or under its lock before the next append).

Opening reads the whole ``entries`` file once, to check it against ``hashes`` (cheap at the
thousands of entries these logs hold), and keeps the files open: an owner that appends for hours
opens them once.

:func:`read_published_log` is the reader: it reads ``checkpoint`` then ``entries`` and verifies
them (:func:`~phsafe.tlog.layout.verify_published_log`), whether the folder is the writer's or
a copy served elsewhere.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path

from phsafe.tlog.checkpoint import Checkpoint, parse_checkpoint, sign_checkpoint
from phsafe.errors import StoreError
from phsafe import durable
from phsafe.tlog.files import FileHashStore, write_new_file, write_verifier_key
from phsafe.tlog.layout import (
    CHECKPOINT_FILE,
    ENTRIES_FILE,
    HASHES_FILE,
    VERIFIER_KEY_FILE,
    PublishedLog,
    decode_entries,
    encode_entries,
    verify_published_log,
)
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.merkle import HASH_SIZE, largest_tree_in_stored_count, stored_hash_count
from phsafe.tlog.note import Signer, Verifier, parse_note
from phsafe.tlog.proof import TlogProof, make_tlog_proof


class LogDirectory:
    """A transparency log kept as files in ``path`` (see the module docstring).

    Open, it keeps ``entries`` and ``hashes`` open and knows how long each is: appends write at
    the end of the open files, and :meth:`changed` tells -- by the files' sizes, without reading
    them -- whether another process wrote to the folder meanwhile (then the owner opens it anew).
    """

    def __init__(self, path: Path, entries_fd: int, hashes: FileHashStore, size: int, entries_bytes: int,
                 checkpoint: bytes | None) -> None:
        self.path = Path(path)
        self._entries_fd = entries_fd
        # Dropped unclosed, the folder closes its entries file when collected (its hash store
        # does the same for its own).
        self._closer = weakref.finalize(self, os.close, entries_fd)
        self._closer.atexit = False
        self._hashes = hashes
        self.log = TransparencyLog(hashes)
        self._size = size
        self._entries_bytes = entries_bytes
        self._checkpoint = checkpoint
        self._checkpoint_stat = _identity(self.path / CHECKPOINT_FILE)
        self._files_stat = self._stat_files()
        self._interrupted = False  # an append failed part-way: the files need recover()

    # ---- making, opening, recovering ---------------------------------------------------------

    @classmethod
    def create(cls, path: Path, verifier_key: str | None = None) -> "LogDirectory":
        """A new, empty log in ``path`` (created; it must not exist or be an empty folder)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if any(path.iterdir()):
            raise StoreError(f"{path} is not empty; a log is created in a new folder")
        write_new_file(path / ENTRIES_FILE, b"", 0o644)
        FileHashStore.create(path / HASHES_FILE).close()
        if verifier_key is not None:
            write_verifier_key(path / VERIFIER_KEY_FILE, verifier_key)
        durable.fsync_folder(path.parent)
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> "LogDirectory":
        """The log in ``path``; StoreError if it needs :meth:`recover` or is not a log."""
        path = Path(path)
        try:
            entries_fd = os.open(path / ENTRIES_FILE, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            raise StoreError(f"cannot open {path / ENTRIES_FILE}: {exc.strerror or exc}") from None
        try:
            data = _read_fd(entries_fd)
            whole, torn = decode_entries(data)
            hashes = FileHashStore.open(path / HASHES_FILE, check=False)
            try:
                try:
                    hashed = TransparencyLog(hashes).size
                except StoreError as exc:
                    raise StoreError(f"the log in {path}: {exc}; an append was interrupted; recover it") from None
                if torn or hashed != len(whole):
                    raise StoreError(f"the log in {path} has {len(whole)} whole entries"
                                     f"{' and a torn last line' if torn else ''} and hashes for {hashed}: "
                                     "an append was interrupted; recover it")
                try:
                    checkpoint: bytes | None = (path / CHECKPOINT_FILE).read_bytes()
                except FileNotFoundError:
                    checkpoint = None
            except BaseException:
                hashes.close()
                raise
        except BaseException:
            os.close(entries_fd)
            raise
        directory = cls(path, entries_fd, hashes, hashed, len(data), checkpoint)
        directory.entries = whole
        return directory

    entries: list[bytes]
    """The entries read when the folder was opened (a new entry is appended here too)."""

    @classmethod
    def recover(cls, path: Path) -> list[str]:
        """Repair an interrupted append (see the module docstring); returns what was done."""
        path = Path(path)
        done: list[str] = []
        data = (path / ENTRIES_FILE).read_bytes()
        whole, torn = decode_entries(data)
        if torn:
            fd = os.open(path / ENTRIES_FILE, os.O_WRONLY)
            try:
                durable.truncate(fd, len(data) - torn)
            finally:
                os.close(fd)
            done.append(f"cut a torn last entry line of {torn} bytes")
        if not (path / HASHES_FILE).exists():  # derivable from the entries: made again
            FileHashStore.create(path / HASHES_FILE).close()
            done.append("made the missing hash file again")
        with FileHashStore.open(path / HASHES_FILE, check=False) as hashes:
            length = hashes.byte_size()
            size = largest_tree_in_stored_count(length // HASH_SIZE)
            if length != stored_hash_count(size) * HASH_SIZE:
                hashes.truncate(stored_hash_count(size))
                done.append(f"cut the hash file back to the tree of {size} entries")
            if size > len(whole):
                raise StoreError(f"the log in {path} has hashes for {size} entries and only {len(whole)} "
                                 "entries: the entries file lost lines it had; not repairable here")
            if size < len(whole):
                log = TransparencyLog(hashes)
                log.append(whole[size:])
                done.append(f"hashed entries {size} to {len(whole) - 1}, written before their hashes")
        checkpoint = path / CHECKPOINT_FILE
        if checkpoint.exists():
            stated = parse_checkpoint(parse_note(checkpoint.read_bytes())[0])
            if stated.size > len(whole):
                raise StoreError(f"the checkpoint in {path} signs {stated.size} entries and the log has "
                                 f"{len(whole)}: entries were lost; not repairable here")
        return done

    def close(self) -> None:
        self._hashes.close()
        if self._entries_fd >= 0:
            self._closer()  # closes it, once: never again when collected
            self._entries_fd = -1

    def __enter__(self) -> "LogDirectory":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _stat_files(self) -> tuple[int, int, int, int]:
        entries, hashes = os.fstat(self._entries_fd), os.fstat(self._hashes.fileno())
        return entries.st_size, entries.st_mtime_ns, hashes.st_size, hashes.st_mtime_ns

    def changed(self) -> bool:
        """Whether anyone else wrote to the folder since this object read or wrote it: the files'
        sizes or modification times, or the published checkpoint's file, are not the ones it
        left (one ``fstat`` each; nothing is read)."""
        try:
            return (self._stat_files() != self._files_stat
                    or os.fstat(self._entries_fd).st_size != self._entries_bytes
                    or _identity(self.path / CHECKPOINT_FILE) != self._checkpoint_stat)
        except OSError:
            return True

    # ---- writing ----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Entries in the log (signed or not yet)."""
        return self._size

    def append(self, entries: Sequence[bytes]) -> range:
        """Append ``entries`` durably (entries file, then hashes); returns their indexes.

        If writing fails part-way, this object refuses every later append: the folder then
        needs :meth:`recover` (another process may run it) and a fresh :meth:`open`.
        """
        if self._interrupted:
            raise StoreError(f"an earlier append to the log in {self.path} failed part-way; recover it first")
        lines = encode_entries(entries)  # refuses an entry the file cannot hold, before writing
        if not entries:
            return range(self._size, self._size)
        first = self._size
        hashes = self.log.hashes_for(entries)
        self._interrupted = True
        durable.append(self._entries_fd, lines, end=self._entries_bytes)
        self._entries_bytes += len(lines)
        self._hashes.append_hashes(hashes)
        self._interrupted = False
        self._size = first + len(entries)
        self.entries.extend(bytes(e) for e in entries)
        self._files_stat = self._stat_files()
        return range(first, self._size)

    def stored_hashes(self) -> bytes:
        """The hash file's bytes (read in full: for a comparison when the folder is opened)."""
        return _read_fd(self._hashes.fileno())

    def checkpoint(self) -> bytes | None:
        """The published signed checkpoint, or None before the first."""
        return self._checkpoint

    def publish_checkpoint(self, message: bytes) -> None:
        """Replace the published checkpoint with ``message`` (e.g. after witnesses cosigned it).

        Refused unless it is a tree head of this log's entries, no smaller than the one it
        replaces: the folder never publishes a checkpoint of another history.
        """
        stated = parse_checkpoint(parse_note(message)[0])
        if stated.size > self._size or self.log.root(stated.size) != stated.root_hash:
            raise StoreError(f"the checkpoint (size {stated.size}) is not a tree head of the log in {self.path}")
        previous = self._checkpoint
        if previous is not None and parse_checkpoint(parse_note(previous)[0]).size > stated.size:
            raise StoreError(f"the log in {self.path} has a checkpoint larger than size {stated.size} already")
        durable.replace(self.path / CHECKPOINT_FILE, bytes(message))
        self._checkpoint = bytes(message)
        self._checkpoint_stat = _identity(self.path / CHECKPOINT_FILE)

    def sign_checkpoint(self, signer: Signer, *, origin: str | None = None) -> bytes:
        """Sign a checkpoint of all entries with the log's key (origin: the key's name); not
        published -- pass it to witnesses, then to :meth:`publish_checkpoint`."""
        return sign_checkpoint(Checkpoint(origin or signer.name, self._size, self.log.root()), [signer])

    def proof(self, index: int, checkpoint: bytes | None = None) -> TlogProof:
        """The tlog-proof of entry ``index`` against ``checkpoint`` (default: the published one)."""
        message = self.checkpoint() if checkpoint is None else checkpoint
        if message is None:
            raise StoreError(f"the log in {self.path} has no checkpoint yet")
        return make_tlog_proof(self.log, index, message)


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """What tells a replaced file from the one seen: inode, size, modification time."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _read_fd(fd: int) -> bytes:
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def read_published_log(path: Path, log_verifier: Verifier, *, witnesses: Iterable[Verifier] = (),
                       quorum: int = 0, origin: str | None = None) -> PublishedLog:
    """Read and verify the published log in ``path`` (``checkpoint`` first, then ``entries``)."""
    path = Path(path)
    try:
        checkpoint = (path / CHECKPOINT_FILE).read_bytes()
        entries = (path / ENTRIES_FILE).read_bytes()
    except OSError as exc:
        raise StoreError(f"cannot read the published log in {path}: {exc.strerror or exc}") from None
    return verify_published_log(checkpoint, entries, log_verifier, witnesses=list(witnesses), quorum=quorum,
                                origin=origin)
