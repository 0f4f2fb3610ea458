"""The transparency log's file I/O: a hash file, a checkpoint-state file and key files.

- :class:`FileHashStore` -- the :class:`~phsafe.tlog.log.HashStore` as an append-only file of
  32-byte hashes in stored-hash order (:mod:`.merkle`), nothing else: hash i is at byte 32 * i.
  Every append is one ``write`` then ``fsync``. A crash can leave a torn tail (a length that is
  not a multiple of 32, or a count that is no tree's); opening refuses it until
  :meth:`FileHashStore.truncate` cuts it back (the owner knows to what: see
  :class:`phsafe.tlog.publication.LogDirectory.recover`).
- :class:`FileCheckpointStore` -- the :class:`~phsafe.tlog.state.CheckpointStore` of a witness or
  a client, one JSON file::

      {"format": "phsafe-tlog-checkpoints/1", "checkpoints": {"<origin>": "<signed checkpoint>"}}

  Compare-and-swap holds an exclusive ``flock`` on ``<file>.lock`` (a separate file, because the
  JSON file's inode changes) while it reads, compares and replaces the file
  (:func:`phsafe.durable.replace`): a reader sees the old file or the new one, never a mixture;
  a crash leaves one of them.
- :class:`FileClaimStore` -- a witness's claims (:mod:`.registration`: which log holds each
  dataset), one JSON file replaced like the checkpoint state.
- Key files: a signer key (``PRIVATE+KEY+...``, :mod:`.keys`) is written once, created with mode
  0600 (never over an existing file), and read only if it is a regular file no one but its owner
  may read; a verifier key file is one public line.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import stat
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from phsafe import durable
from phsafe.errors import MalformedError, StaleStateError, StoreError
from phsafe.tlog.keys import AnySigner, AnyVerifier, signer_from_key, verifier_from_key
from phsafe.tlog.merkle import HASH_SIZE, tree_size_for_stored_count
from phsafe.tlog.registration import ClaimState, ClaimStore, RegisteredLog
from phsafe.tlog.state import SeenLog

CHECKPOINTS_FORMAT = "phsafe-tlog-checkpoints/1"


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` (it must not exist), durably (:func:`phsafe.durable.create`).

    Raises:
        StoreError: Something is at ``path`` already: it is never overwritten.
        OSError: It cannot be written.
    """
    try:
        durable.create(path, data, mode=mode)
    except FileExistsError:
        raise StoreError(f"{path} exists already; it is never overwritten") from None


# --------------------------------------------------------------------------------------------
# Hash file
# --------------------------------------------------------------------------------------------


class FileHashStore:
    """An append-only file of 32-byte stored hashes (see the module docstring).

    Use :meth:`create` for a new file and :meth:`open` for an existing one; close it (or use it
    as a context manager) when done. Not safe for concurrent writers: its owner serialises them.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = Path(path)
        self._fd = fd
        # A store dropped unclosed closes its descriptor when collected: a process that opens
        # many logs (a library user's session, a test run) would otherwise run out of them.
        self._closer = weakref.finalize(self, os.close, fd)
        self._closer.atexit = False

    @classmethod
    def create(cls, path: Path) -> "FileHashStore":
        """A new, empty hash file at ``path`` (which must not exist)."""
        write_new_file(Path(path), b"", 0o644)
        return cls.open(path)

    @classmethod
    def open(cls, path: Path, *, check: bool = True) -> "FileHashStore":
        """The hash file at ``path``; with ``check``, StoreError if its tail is torn."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            raise StoreError(f"cannot open the hash file {path}: {_reason(exc)}") from None
        store = cls(Path(path), fd)
        if check:
            try:
                tree_size_for_stored_count(store.stored_count())
            except StoreError:
                store.close()
                raise
        return store

    def __enter__(self) -> "FileHashStore":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            self._closer()  # closes it, once: never again when collected
            self._fd = -1

    def fileno(self) -> int:
        return self._fd

    def byte_size(self) -> int:
        return os.fstat(self._fd).st_size

    def stored_count(self) -> int:
        length = self.byte_size()
        if length % HASH_SIZE:
            raise StoreError(f"the hash file {self.path} ends in a torn hash ({length} bytes)")
        return length // HASH_SIZE

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]:
        count = self.byte_size() // HASH_SIZE
        hashes = []
        for i in indexes:
            if not 0 <= i < count:
                raise StoreError(f"the hash file {self.path} holds {count} hashes; there is none at index {i}")
            h = os.pread(self._fd, HASH_SIZE, i * HASH_SIZE)
            if len(h) != HASH_SIZE:
                raise StoreError(f"the hash file {self.path} was cut while being read")
            hashes.append(h)
        return hashes

    def append_hashes(self, hashes: Sequence[bytes]) -> None:
        data = b"".join(hashes)
        if len(data) != HASH_SIZE * len(hashes):
            raise ValueError("every stored hash is 32 bytes")
        durable.append(self._fd, data, end=self.byte_size())

    def truncate(self, count: int) -> None:
        """Cut the file back to its first ``count`` hashes (recovery from a torn append)."""
        durable.truncate(self._fd, count * HASH_SIZE)


# --------------------------------------------------------------------------------------------
# Checkpoint state file
# --------------------------------------------------------------------------------------------


class FileCheckpointStore:
    """A :class:`~phsafe.tlog.state.CheckpointStore` in one JSON file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def _read(self) -> dict[str, str]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"cannot read the checkpoint state {self.path}: {_reason(exc)}") from None
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise StoreError(f"the checkpoint state {self.path} is not JSON") from None
        checkpoints = document.get("checkpoints") if isinstance(document, dict) else None
        if (document.get("format") if isinstance(document, dict) else None) != CHECKPOINTS_FORMAT \
                or not isinstance(checkpoints, dict) \
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in checkpoints.items()):
            raise StoreError(f"the checkpoint state {self.path} is not a {CHECKPOINTS_FORMAT} document")
        return checkpoints

    def load(self, origin: str) -> bytes | None:
        text = self._read().get(origin)
        return None if text is None else text.encode("utf-8")

    def replace(self, origin: str, expected: bytes | None, new: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            checkpoints = self._read()
            current = checkpoints.get(origin)
            if (None if current is None else current.encode("utf-8")) != expected:
                raise StaleStateError(f"the stored checkpoint of {origin} in {self.path} changed meanwhile")
            checkpoints[origin] = bytes(new).decode("utf-8")
            document = {"format": CHECKPOINTS_FORMAT, "checkpoints": dict(sorted(checkpoints.items()))}
            durable.replace(self.path, (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
        finally:
            os.close(lock_fd)  # releases the lock


class FileSeenLogs:
    """A :class:`~phsafe.tlog.state.SeenLogStore` in one JSON file, for a client (``audit public``)::

        {"format": "phsafe-seen-logs/1",
         "logs": {"<origin>": {"checkpoint": "<signed checkpoint>", "leaf_hashes": "<base64>"}}}

    Replaced like :class:`FileCheckpointStore` (lock file, :func:`phsafe.durable.replace`). A
    ``phsafe-tlog-checkpoints/1`` file (written before leaf hashes were kept) is read as
    checkpoints without leaf hashes and rewritten in this format at the next update.

    It may also hold ``"claims": {"<name>": "<origin>"}``: names a client has seen claimed by one
    log each (the monitor keeps which log accounts each dataset: :meth:`claims`, :meth:`claim`),
    and ``"retired": {"<name>": [{"by": "<origin>", "successor": "<origin> (key ID <hex>)" or
    null}, ...]}``: the logs seen retiring each name, oldest first (:meth:`retirements`,
    :meth:`retire`).
    """

    FORMAT = "phsafe-seen-logs/1"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def _read(self) -> dict[str, SeenLog]:
        return self._read_all()[0]

    def _read_all(self) -> tuple[dict[str, SeenLog], dict[str, str]]:
        logs, claims, _ = self._read_document()
        return logs, claims

    def _read_document(self) -> tuple[dict[str, SeenLog], dict[str, str], dict[str, list[dict[str, str | None]]]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}, {}, {}
        except OSError as exc:
            raise StoreError(f"cannot read the checkpoints seen, {self.path}: {_reason(exc)}") from None
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise StoreError(f"the checkpoints seen, {self.path}, are not JSON") from None
        kind = document.get("format") if isinstance(document, dict) else None
        if kind == CHECKPOINTS_FORMAT and isinstance(document.get("checkpoints"), dict):
            return {origin: SeenLog(text.encode("utf-8")) for origin, text in document["checkpoints"].items()
                    if isinstance(origin, str) and isinstance(text, str)}, {}, {}
        logs = document.get("logs") if isinstance(document, dict) else None
        claims = document.get("claims", {}) if isinstance(document, dict) else None
        if kind != self.FORMAT or not isinstance(logs, dict) or not isinstance(claims, dict) \
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in claims.items()):
            raise StoreError(f"{self.path} is not a {self.FORMAT} document")
        out = {}
        for origin, record in logs.items():
            try:
                out[origin] = SeenLog(record["checkpoint"].encode("utf-8"),
                                      base64.b64decode(record.get("leaf_hashes") or "", validate=True))
            except (KeyError, TypeError, AttributeError, ValueError):
                raise StoreError(f"{self.path}: the record of {origin} is not a checkpoint and its leaf hashes") from None
        retired = document.get("retired", {})
        if not isinstance(retired, dict) or not all(
                isinstance(name, str) and isinstance(items, list) and all(
                    isinstance(i, dict) and isinstance(i.get("by"), str)
                    and isinstance(i.get("successor"), (str, type(None))) for i in items)
                for name, items in retired.items()):
            raise StoreError(f"{self.path} is not a {self.FORMAT} document (its retirements)")
        return out, dict(claims), {name: [dict(i) for i in items] for name, items in retired.items()}

    def load(self, origin: str) -> SeenLog | None:
        return self._read().get(origin)

    def replace(self, origin: str, expected: bytes | None, new: SeenLog) -> None:
        with self._locked():
            logs, claims, retired = self._read_document()
            current = logs.get(origin)
            if (None if current is None else current.checkpoint) != expected:
                raise StaleStateError(f"the kept checkpoint of {origin} in {self.path} changed meanwhile")
            logs[origin] = new
            self._write(logs, claims, retired)

    def claims(self) -> dict[str, str]:
        """The names kept with the log (origin) that claims each."""
        return self._read_all()[1]

    def claim(self, names: dict[str, str]) -> None:
        """Keep ``names`` (name -> origin), replacing what was kept for those names."""
        with self._locked():
            logs, claims, retired = self._read_document()
            claims.update(names)
            self._write(logs, claims, retired)

    def retirements(self) -> dict[str, list[dict[str, str | None]]]:
        """The logs seen retiring each name (``by``, and the ``successor`` it named), oldest first."""
        return self._read_document()[2]

    def retire(self, name: str, by: str, successor: str | None) -> None:
        """Keep that the log ``by`` retired ``name`` (once per log and name)."""
        with self._locked():
            logs, claims, retired = self._read_document()
            items = retired.setdefault(name, [])
            if not any(i["by"] == by for i in items):
                items.append({"by": by, "successor": successor})
                self._write(logs, claims, retired)

    def _write(self, logs: dict[str, SeenLog], claims: dict[str, str],
               retired: dict[str, list[dict[str, str | None]]] | None = None) -> None:
        document: dict[str, object] = {"format": self.FORMAT, "logs": {
            o: {"checkpoint": log.checkpoint.decode("utf-8"), "leaf_hashes": base64.b64encode(log.leaf_hashes).decode("ascii")}
            for o, log in sorted(logs.items())}}
        if claims:
            document["claims"] = dict(sorted(claims.items()))
        if retired:
            document["retired"] = dict(sorted(retired.items()))
        durable.replace(self.path, (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock_fd)


class FileClaimStore(ClaimStore):
    """A witness's :class:`~phsafe.tlog.registration.ClaimState` in one JSON file::

        {"format": "phsafe-witness-claims/1",
         "logs": {"<origin>": {"vkey": "<verifier key>", "datasets": ["<name>", ...] or null}},
         "claims": {"<dataset>": "<origin>"},
         "retired": {"<dataset>": ["<origin that retired it>", ...]}}

    Replaced whole by :func:`phsafe.durable.replace` (the new file synced, renamed over the
    old, the folder synced) under an exclusive ``flock`` on ``<file>.lock``: a reader, or a
    witness restarted after a kill at any point, finds the state before or after an update.
    """

    FORMAT = "phsafe-witness-claims/1"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def load(self) -> ClaimState:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return ClaimState()
        except OSError as exc:
            raise StoreError(f"cannot read the witness's claims {self.path}: {_reason(exc)}") from None
        try:
            document = json.loads(data)
            if document["format"] != self.FORMAT:
                raise ValueError(document["format"])
            logs = {str(origin): RegisteredLog(str(record["vkey"]), None if record["datasets"] is None
                                               else tuple(str(n) for n in record["datasets"]))
                    for origin, record in document["logs"].items()}
            claims = {str(name): str(origin) for name, origin in document["claims"].items()}
            retired = {str(name): tuple(str(o) for o in origins) for name, origins in document["retired"].items()}
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise StoreError(f"the witness's claims {self.path} are not a {self.FORMAT} document") from None
        if any(origin not in logs for origin in claims.values()):
            raise StoreError(f"the witness's claims {self.path} name a log that is not registered")
        return ClaimState(logs, claims, retired)

    def save(self, state: ClaimState) -> None:
        document = {"format": self.FORMAT,
                    "logs": {o: {"vkey": log.vkey, "datasets": None if log.datasets is None else list(log.datasets)}
                             for o, log in sorted(state.logs.items())},
                    "claims": dict(sorted(state.claims.items())),
                    "retired": {n: list(origins) for n, origins in sorted(state.retired.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            durable.replace(self.path, (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
        finally:
            os.close(lock_fd)


# --------------------------------------------------------------------------------------------
# Key files
# --------------------------------------------------------------------------------------------


def write_signer_key(path: Path, signer_key: str) -> None:
    """Write a signer key to a new file of mode 0600 (refuses an existing file)."""
    signer_from_key(signer_key)  # only a valid key is ever written
    write_new_file(Path(path), signer_key.strip().encode("ascii") + b"\n", 0o600)


def read_signer_key(path: Path, *, clock: Callable[[], int] = lambda: int(time.time())) -> AnySigner:
    """The signer in a key file; StoreError if it is not a regular file private to its owner."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise StoreError(f"cannot read the signer key {path}: {_reason(exc)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StoreError(f"the signer key {path} is not a regular file")
        if info.st_mode & 0o077:
            raise StoreError(f"the signer key {path} may be read by others (mode {stat.S_IMODE(info.st_mode):04o}); "
                             "make it private to its owner (chmod 600)")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        return signer_from_key(data.decode("ascii"), clock=clock)
    except (MalformedError, UnicodeDecodeError) as exc:
        raise StoreError(f"the signer key {path} is not a signer key ({getattr(exc, 'rule', 'not ASCII')})") from None


def write_verifier_key(path: Path, verifier_key: str) -> None:
    """Write a verifier key to a new public file (mode 0644; refuses an existing file)."""
    verifier_from_key(verifier_key)
    write_new_file(Path(path), verifier_key.strip().encode("utf-8") + b"\n", 0o644)


def read_verifier_key(path: Path) -> AnyVerifier:
    """The verifier in a verifier key file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read the verifier key {path}: {exc}") from None
    return verifier_from_key(text)
