"""A model of what a power cut leaves of a folder: file data and directory entries.

:class:`Recorder` watches, in this process, the file operations under one folder -- creates,
writes, truncations, file and folder fsyncs, renames, unlinks, mkdirs and rmdirs, as the code
makes them through :mod:`os` (``phsafe.durable`` and everything else) -- and keeps a model of
the folder (:class:`FsModel`) in which each inode has its *current* data and its *durable* data,
and each folder its *current* entries and its *durable* entries:

* a file's data is durable up to its last ``fsync`` (the content it had then);
* a name -- a create, a rename, an unlink, a mkdir, an rmdir -- is durable once the folder that
  holds it has been ``fsync``\\ ed after it (the rule of POSIX; ext4 and others may keep more, never
  less -- the approach of ALICE and of file-system crash testers).

After every operation the recorder takes the two states a power cut at that point may leave:
``synced`` (only what was fsynced survives: durable entries, durable data; a file whose data was
never synced is empty) and ``everything`` (every operation so far survived); and, after a write,
``torn`` (everything, with that write cut in half). Files that other code writes without
:mod:`os` (pandas, pyarrow, ``shutil.copyfile``, ``Path.write_text``) are seen when they are
fsynced (``durable.fsync_file``) or when their folder is. States are kept as ``{relative path:
content digest}`` (folders: ``None``), deduplicated; :func:`materialize` writes one back in place
(absolute paths recorded in the ledger stay true).

Test-only; no phsafe code depends on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

DIR = None  # the "content" of a folder in a state


@dataclass
class Inode:
    is_dir: bool
    data: str = ""  # current content digest (files)
    durable: str = ""  # durable content digest (files)
    entries: dict[str, int] = field(default_factory=dict)  # current (folders)
    durable_entries: dict[str, int] = field(default_factory=dict)  # durable (folders)


EMPTY = hashlib.sha256(b"").hexdigest()


class FsModel:
    """Inodes under ``root`` with their current and durable data and entries."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs: dict[str, bytes] = {EMPTY: b""}
        self.inodes: dict[int, Inode] = {}
        self.modes: dict[str, int] = {}  # relative path -> permission bits, as last seen
        self.root_ino = self._scan(self.root)

    def note_mode(self, path: Path) -> None:
        try:
            self.modes[Path(path).relative_to(self.root).as_posix()] = stat.S_IMODE(os.lstat(path).st_mode)
        except (OSError, ValueError):
            pass

    def blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.blobs.setdefault(digest, data)
        return digest

    def _new(self, node: Inode) -> int:
        ino = len(self.inodes)
        self.inodes[ino] = node
        return ino

    def _scan(self, path: Path) -> int:
        """What is on disk when recording starts: all of it durable."""
        self.note_mode(path)
        if path.is_dir() and not path.is_symlink():
            node = Inode(True)
            for child in sorted(path.iterdir()):
                node.entries[child.name] = self._scan(child)
            node.durable_entries = dict(node.entries)
            return self._new(node)
        digest = self.blob(path.read_bytes())
        return self._new(Inode(False, digest, digest))

    # -- paths ----------------------------------------------------------------------------------

    def parts(self, path: Path) -> list[str] | None:
        try:
            rel = Path(os.path.abspath(path)).relative_to(self.root)
        except ValueError:
            return None
        return list(rel.parts)

    def lookup(self, parts: list[str]) -> int | None:
        ino = self.root_ino
        for name in parts:
            node = self.inodes[ino]
            if not node.is_dir or name not in node.entries:
                return None
            ino = node.entries[name]
        return ino

    def parent(self, parts: list[str]) -> Inode | None:
        ino = self.lookup(parts[:-1]) if parts else None
        if ino is None:
            return None
        node = self.inodes[ino]
        return node if node.is_dir else None

    # -- operations -----------------------------------------------------------------------------

    def create(self, parts: list[str], is_dir: bool = False) -> int | None:
        parent = self.parent(parts)
        if parent is None:
            return None
        ino = self._new(Inode(is_dir, EMPTY, EMPTY))
        parent.entries[parts[-1]] = ino
        return ino

    def file(self, parts: list[str]) -> Inode | None:
        """The file at ``parts``, made if the model has not seen it (written without :mod:`os`)."""
        ino = self.lookup(parts)
        if ino is None:
            ino = self.create(parts)
            if ino is None:
                return None
        node = self.inodes[ino]
        return None if node.is_dir else node

    def write(self, parts: list[str], data: bytes) -> None:
        node = self.file(parts)
        if node is not None:
            node.data = self.blob(data)

    def fsync_file(self, parts: list[str], data: bytes) -> None:
        node = self.file(parts)
        if node is not None:
            node.data = node.durable = self.blob(data)

    def fsync_dir(self, parts: list[str], real: Path) -> None:
        ino = self.lookup(parts)
        if ino is None:
            return
        node = self.inodes[ino]
        # Entries made without os (pyarrow, copyfile): seen now, with what they hold now.
        for child in sorted(real.iterdir()):
            if child.name not in node.entries:
                self.note_mode(child)
                if child.is_dir():
                    node.entries[child.name] = self._scan_new(child)
                else:
                    node.entries[child.name] = self._new(Inode(False, self.blob(child.read_bytes()), EMPTY))
        node.durable_entries = dict(node.entries)

    def _scan_new(self, path: Path) -> int:
        self.note_mode(path)
        node = Inode(True)
        for child in sorted(path.iterdir()):
            self.note_mode(child)
            node.entries[child.name] = (self._scan_new(child) if child.is_dir()
                                        else self._new(Inode(False, self.blob(child.read_bytes()), EMPTY)))
        return self._new(node)

    def rename(self, src: list[str], dst: list[str]) -> None:
        a, b = self.parent(src), self.parent(dst)
        if a is None or b is None or src[-1] not in a.entries:
            return
        b.entries[dst[-1]] = a.entries.pop(src[-1])

    def remove(self, parts: list[str]) -> None:
        parent = self.parent(parts)
        if parent is not None:
            parent.entries.pop(parts[-1], None)

    # -- states ---------------------------------------------------------------------------------

    def state(self, view: str, torn: tuple[list[str], str] | None = None) -> dict[str, str | None]:
        """``{relative path: digest or None (folder)}`` of what survives: ``synced`` or
        ``everything`` (``torn``: one file's content replaced)."""
        out: dict[str, str | None] = {}
        durable = view == "synced"
        torn_ino = self.lookup(torn[0]) if torn else None

        def walk(ino: int, prefix: str) -> None:
            node = self.inodes[ino]
            for name, child in sorted((node.durable_entries if durable else node.entries).items()):
                rel = f"{prefix}{name}"
                inode = self.inodes[child]
                if inode.is_dir:
                    out[rel] = DIR
                    walk(child, rel + "/")
                elif torn is not None and child == torn_ino:
                    out[rel] = torn[1]
                else:
                    out[rel] = inode.durable if durable else inode.data

        walk(self.root_ino, "")
        return out


def state_key(state: dict[str, str | None]) -> str:
    return hashlib.sha256(repr(sorted(state.items())).encode()).hexdigest()


@dataclass
class CrashState:
    """One state a power cut may leave: ``at`` is the operation it follows, ``view`` how it was taken."""

    at: int
    view: str
    files: dict[str, str | None]
    events: tuple[tuple[str, str], ...]  # ("draw", key) and markers that happened before it
    op: str


class Recorder:
    """Records the file operations under ``root`` made through :mod:`os` while it is active, and
    the crash states after each (see the module docstring). ``event(kind, detail)`` adds a marker
    (a noise draw) that the states after it know of."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.model = FsModel(self.root)
        self.states: list[CrashState] = []
        self.seen: set[str] = set()
        self.ops: list[str] = []
        self.taken = 0  # states taken, before deduplication
        self.events: list[tuple[str, str]] = []
        self._fds: dict[int, list[str]] = {}

    # -- bookkeeping ------------------------------------------------------------------------------

    def event(self, kind: str, detail: str) -> None:
        self.events.append((kind, detail))

    def _take(self, op: str, torn: tuple[list[str], str] | None = None) -> None:
        self.ops.append(op)
        views = [("synced", None), ("everything", None)] + ([("torn", torn)] if torn else [])
        for view, cut in views:
            files = self.model.state("synced" if view == "synced" else "everything", cut)
            self.taken += 1
            key = state_key(files)
            if key in self.seen:
                continue
            self.seen.add(key)
            self.states.append(CrashState(len(self.ops) - 1, view, files, tuple(self.events), op))

    def _parts(self, path: object, dir_fd: int | None = None) -> list[str] | None:
        if isinstance(path, int):
            return None
        text = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(text):
            text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
        return self.model.parts(Path(text))

    def _fd_parts(self, fd: int) -> list[str] | None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        if target.endswith(" (deleted)"):
            return None
        return self.model.parts(Path(target))

    @staticmethod
    def _read(parts: list[str], root: Path) -> bytes:
        return (root.joinpath(*parts)).read_bytes()

    # -- the operating system, watched --------------------------------------------------------------

    @contextlib.contextmanager
    def recording(self) -> Iterator["Recorder"]:
        real = {name: getattr(os, name) for name in
                ("open", "write", "fsync", "ftruncate", "rename", "replace", "unlink", "remove", "rmdir", "mkdir",
                 "close")}
        rec = self

        def open_(path, flags, mode=0o777, *, dir_fd=None):  # noqa: ANN001, ANN202
            parts = rec._parts(path, dir_fd)
            existed = parts is None or os.path.lexists(rec.root.joinpath(*parts))
            fd = real["open"](path, flags, mode, dir_fd=dir_fd)
            if parts is not None:
                if (flags & os.O_CREAT) and not existed:
                    rec.model.note_mode(rec.root.joinpath(*parts))
                    if rec.model.lookup(parts) is None:
                        rec.model.create(parts)
                    rec._take(f"create {'/'.join(parts)}")
                if flags & os.O_TRUNC:
                    rec.model.write(parts, b"")
                    rec._take(f"truncate {'/'.join(parts)}")
            return fd

        def write_(fd, data):  # noqa: ANN001, ANN202
            parts = rec._fd_parts(fd)
            before = None
            if parts is not None and not stat.S_ISDIR(os.fstat(fd).st_mode):
                node = rec.model.file(parts)
                before = rec.model.blobs[node.data] if node is not None else b""
            n = real["write"](fd, data)
            if parts is not None and before is not None:
                now = rec._read(parts, rec.root)
                rec.model.write(parts, now)
                torn = None
                if n > 1 and now.startswith(before) and len(now) == len(before) + n:
                    torn = (parts, rec.model.blob(now[: len(before) + n // 2]))
                rec._take(f"write {'/'.join(parts)} +{n}", torn)
            return n

        def fsync_(fd):  # noqa: ANN001, ANN202
            real["fsync"](fd)
            parts = rec._fd_parts(fd)
            if parts is None:
                return
            path = rec.root.joinpath(*parts)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                rec.model.fsync_dir(parts, path)
                rec._take(f"fsync-dir {'/'.join(parts) or '.'}")
            else:
                rec.model.note_mode(path)
                rec.model.fsync_file(parts, path.read_bytes())
                rec._take(f"fsync {'/'.join(parts)}")

        def ftruncate_(fd, length):  # noqa: ANN001, ANN202
            real["ftruncate"](fd, length)
            parts = rec._fd_parts(fd)
            if parts is not None:
                rec.model.write(parts, rec._read(parts, rec.root))
                rec._take(f"ftruncate {'/'.join(parts)} {length}")

        def rename_like(name):  # noqa: ANN001, ANN202
            def op(src, dst, *, src_dir_fd=None, dst_dir_fd=None):  # noqa: ANN001, ANN202
                a, b = rec._parts(src, src_dir_fd), rec._parts(dst, dst_dir_fd)
                real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
                if a is not None and b is not None:
                    rec.model.note_mode(rec.root.joinpath(*b))
                    rec.model.rename(a, b)
                    rec._take(f"rename {'/'.join(a)} -> {'/'.join(b)}")
            return op

        def remove_like(name):  # noqa: ANN001, ANN202
            def op(path, *, dir_fd=None):  # noqa: ANN001, ANN202
                parts = rec._parts(path, dir_fd)
                real[name](path, dir_fd=dir_fd)
                if parts is not None:
                    rec.model.remove(parts)
                    rec._take(f"{name} {'/'.join(parts)}")
            return op

        def mkdir_(path, mode=0o777, *, dir_fd=None):  # noqa: ANN001, ANN202
            parts = rec._parts(path, dir_fd)
            real["mkdir"](path, mode, dir_fd=dir_fd)
            if parts is not None:
                rec.model.note_mode(rec.root.joinpath(*parts))
                rec.model.create(parts, is_dir=True)
                rec._take(f"mkdir {'/'.join(parts)}")

        patched = {"open": open_, "write": write_, "fsync": fsync_, "ftruncate": ftruncate_,
                   "rename": rename_like("rename"), "replace": rename_like("replace"),
                   "unlink": remove_like("unlink"), "remove": remove_like("remove"),
                   "rmdir": remove_like("rmdir"), "mkdir": mkdir_}
        for name, fn in patched.items():
            setattr(os, name, fn)
        try:
            yield self
        finally:
            for name, fn in real.items():
                setattr(os, name, fn)


def materialize(model: FsModel, files: dict[str, str | None]) -> None:
    """Make ``model.root`` hold exactly ``files`` (its earlier content is removed)."""
    root = model.root
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for rel, digest in files.items():  # sorted: a folder comes before what it holds
        path = root / rel
        if digest is DIR:
            path.mkdir()
            path.chmod(model.modes.get(rel, 0o755))
        else:
            path.write_bytes(model.blobs[digest])
            path.chmod(model.modes.get(rel, 0o644))
