"""Durable writes: every file this package must not lose is written through these few functions.

A write is *durable* when a crash (a killed process, or the machine losing power) afterwards
cannot lose it or leave half of it where the whole was expected. Four shapes cover every file
the library keeps:

==========================  ==========================================================================
:func:`create`              a new file that must not exist yet (a key, a ledger's first entry):
                            ``O_CREAT | O_EXCL`` with its mode, write, ``fsync``, ``fsync`` the folder;
                            a failure removes what it created
:func:`replace`             a file replaced as a whole (a checkpoint, a state file): a temporary
                            file beside it, write, ``fsync``, ``rename`` over the old one, ``fsync``
                            the folder -- a reader, and a crash, see the old file or the new one
:func:`append`              lines added at the end of an open append-only file (the ledger, the
                            public log): one ``write`` loop, ``fsync``; on a failure the file is cut
                            back to where it ended, so it never keeps half an append of a live process
:func:`truncate`            an append-only file cut back (``ftruncate``, ``fsync``): the recovery of a
                            torn append
==========================  ==========================================================================

plus :func:`fsync_folder` (a new or renamed name in a folder survives a crash only once the
folder is synced) and :func:`write_all` (``os.write`` may write less than it was given), and
for names: :func:`make_folders` (new folders, each synced into its parent), :func:`rename`
(a rename, then its folder synced) and :func:`remove` (a file or a whole folder removed, then its
parent synced) -- a create, rename or removal is made durable by syncing the folder that holds
the name, never by syncing the file.

They raise :class:`OSError` as the operating system gives it (``FileExistsError`` from
:func:`create`, ``ENOSPC`` ...): each caller says in its own words which file failed and what
to do. Nothing here takes a lock; the owner of a file serialises its writers.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

__all__ = ["create", "replace", "append", "truncate", "fsync_file", "fsync_folder", "write_all", "TornAppend",
           "make_folders", "rename", "remove"]

PathLike = str | os.PathLike[str]


def fsync_folder(folder: PathLike) -> None:
    """Make the names in ``folder`` (a file created, renamed or removed there) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: PathLike) -> None:
    """Make the bytes of ``path`` durable: a file another library wrote (pyarrow, a copy)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may take less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def create(path: PathLike, data: bytes, *, mode: int = 0o644) -> None:
    """Create ``path`` -- it must not exist, not even as a symbolic link -- with exactly ``mode``
    (whatever the umask), write ``data``, and make both durable.

    Raises:
        FileExistsError: Something is at ``path`` already; it is left untouched.
        OSError: The file cannot be created or written; nothing of it is left.
    """
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    fsync_folder(path.parent)


def replace(path: PathLike, data: bytes, *, mode: int = 0o644, beside: PathLike | None = None) -> None:
    """Replace ``path`` as a whole with ``data`` (of ``mode``), atomically and durably.

    The new bytes go to a temporary file, which is synced and renamed over ``path``; then the
    folder is synced (and ``beside``, which the temporary's name left). Killed at any point, ``path`` holds the old bytes or the new ones (a
    temporary file may be left behind, never read). The temporary file is in ``path``'s folder,
    or in ``beside`` (a folder on the same file system) when nothing but the finished file may
    ever appear in ``path``'s folder -- a published release -- and is then named after that
    folder too: ``.<folder>.<name>.<pid>.<random>.tmp``.

    Raises:
        OSError: The file cannot be written; ``path`` is unchanged.
    """
    path = Path(path)
    suffix = f"{os.getpid()}.{secrets.token_hex(4)}.tmp"
    if beside is None:
        temporary = path.with_name(f".{path.name}.{suffix}")
    else:
        temporary = Path(beside) / f".{path.parent.name}.{path.name}.{suffix}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    if temporary.parent != path.parent:
        fsync_folder(temporary.parent)  # the temporary's name is gone from there too, durably


class TornAppend(OSError):
    """An append failed, and cutting the file back failed too: the file may end in a part of it.

    Its ``errno`` and ``strerror`` are the failed write's (the first cause).
    """


def append(fd: int, data: bytes, *, end: int | None = None) -> None:
    """Append ``data`` to the file open as ``fd`` (opened with ``O_APPEND``) and ``fsync`` it.

    Args:
        end: Where the file ends now, if the caller knows: on a failed write the file is cut
            back to it (and synced), so that no part of the append stays. Without it a failed
            write may leave a part of ``data`` behind.

    Raises:
        TornAppend: The write failed and so did cutting the file back (only with ``end``).
        OSError: The write or the sync failed (``ENOSPC``, ``EFBIG``, ``EIO``); with ``end``,
            the file ends where it did.
    """
    try:
        write_all(fd, data)
        os.fsync(fd)
    except OSError as exc:
        if end is not None:
            try:
                truncate(fd, end)
            except OSError:
                raise TornAppend(exc.errno, exc.strerror) from exc
        raise


def truncate(fd: int, size: int) -> None:
    """Cut the file open as ``fd`` back to ``size`` bytes, durably."""
    os.ftruncate(fd, size)
    os.fsync(fd)


def make_folders(folder: PathLike, *, mode: int = 0o777) -> list[Path]:
    """Create ``folder`` and any missing parent (``mode``, less the umask), durably: each new
    folder's parent is synced after it is made, so no crash afterwards loses a folder -- or
    what is later made durable inside it. Returns the folders made (outermost first).

    Raises:
        OSError: A folder cannot be made (``FileExistsError`` if a non-folder is in the way).
    """
    folder = Path(folder)
    missing: list[Path] = []
    while not folder.is_dir():
        missing.append(folder)
        if folder == folder.parent:
            break
        folder = folder.parent
    made = []
    for path in reversed(missing):
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue  # made meanwhile by another process, which syncs it itself
        made.append(path)
        fsync_folder(path.parent)
    return made


def rename(source: PathLike, target: PathLike) -> None:
    """``os.rename`` then sync the target's folder (and the source's, if another): the new name,
    and the old one's removal, survive a crash once this returns."""
    source, target = Path(source), Path(target)
    os.rename(source, target)
    fsync_folder(target.parent)
    if source.parent != target.parent:
        fsync_folder(source.parent)


def remove(path: PathLike) -> bool:
    """Remove the file or folder ``path`` (a folder with everything in it), then sync its parent:
    once this returns no crash brings it back. A crash before may leave all or part of it.
    Returns False if nothing was there."""
    path = Path(path)
    if not os.path.lexists(path):
        return False
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    fsync_folder(path.parent)
    return True
