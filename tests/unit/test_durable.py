"""phsafe.durable: the one module every file the library must not lose is written through.

* create: exactly its mode whatever the umask, never over anything (a file, a symbolic link),
  synced with its folder, nothing left behind when the write fails;
* replace: the old bytes or the new ones, never a mixture or an empty file, when any step fails;
  no temporary file left; the folder synced after the rename;
* append: all or nothing -- a failed write or sync is cut back to the file's end; when cutting
  back fails too, TornAppend says the file may end in a part of the append;
* truncate: cut and synced.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from phsafe import durable


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What was fsynced, in order: 'dir' for a folder, 'file' for a file."""
    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        import stat

        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    return calls


def test_create_writes_exactly_its_mode_and_syncs_the_file_then_its_folder(tmp_path: Path, syncs: list[str]) -> None:
    old = os.umask(0o077)
    try:
        durable.create(tmp_path / "public", b"one\n", mode=0o644)
    finally:
        os.umask(old)
    durable.create(tmp_path / "secret", b"two\n", mode=0o600)
    assert (tmp_path / "public").read_bytes() == b"one\n"
    assert (tmp_path / "public").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert syncs == ["file", "dir", "file", "dir"]


def test_create_never_writes_over_a_file_or_a_symbolic_link(tmp_path: Path) -> None:
    (tmp_path / "there").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        durable.create(tmp_path / "there", b"new")
    assert (tmp_path / "there").read_bytes() == b"keep"
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        durable.create(tmp_path / "link", b"new")
    assert not (tmp_path / "elsewhere").exists()


def test_create_leaves_nothing_when_the_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable.os, "write", full)
    with pytest.raises(OSError, match="No space"):
        durable.create(tmp_path / "key", b"secret")
    assert list(tmp_path.iterdir()) == []


def test_replace_swaps_the_whole_file_and_syncs_the_folder_after_the_rename(tmp_path: Path,
                                                                            syncs: list[str]) -> None:
    target = tmp_path / "checkpoint"
    durable.replace(target, b"old\n")
    syncs.clear()
    durable.replace(target, b"new\n", mode=0o600)
    assert target.read_bytes() == b"new\n" and target.stat().st_mode & 0o777 == 0o600
    assert syncs == ["file", "dir"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]  # no temporary file left


@pytest.mark.parametrize("failing", ["write", "fsync", "replace"])
def test_a_failed_replace_keeps_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              failing: str) -> None:
    target = tmp_path / "state.json"
    durable.replace(target, b"old\n")

    def broken(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(durable.os, failing, broken)
    with pytest.raises(OSError, match="Input/output"):
        durable.replace(target, b"new\n")
    monkeypatch.undo()
    assert target.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_append_adds_and_syncs(tmp_path: Path, syncs: list[str]) -> None:
    path = tmp_path / "ledger"
    path.write_bytes(b"a\n")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        durable.append(fd, b"b\nc\n", end=2)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"a\nb\nc\n" and syncs == ["file"]


def test_a_failed_append_is_cut_back_to_where_the_file_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger"
    path.write_bytes(b"a\n")
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        if len(data) > 2:
            return real_write(fd, bytes(data[:2]))  # a part of the append reaches the file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable.os, "write", half_then_full)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(OSError, match="No space") as raised:
            durable.append(fd, b"bbbb\n", end=2)
        assert not isinstance(raised.value, durable.TornAppend)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"a\n"


def test_an_append_that_cannot_be_cut_back_says_the_file_may_be_torn(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger"
    path.write_bytes(b"a\n")

    def failing(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(durable.os, "fsync", failing)
    monkeypatch.setattr(durable.os, "ftruncate", failing)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(durable.TornAppend) as raised:
            durable.append(fd, b"b\n", end=2)
    finally:
        os.close(fd)
    assert raised.value.errno == errno.EIO


def test_truncate_cuts_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "hashes"
    path.write_bytes(b"x" * 40)
    fd = os.open(path, os.O_WRONLY)
    try:
        durable.truncate(fd, 32)
    finally:
        os.close(fd)
    assert path.stat().st_size == 32


def test_durable_writes_are_written_once() -> None:
    """Every ``fsync`` and atomic file rename of the library goes through phsafe.durable. Allowed
    besides: the ledger's preflight probe (can this process sync the file it will append to?) and
    the renames of whole folders -- a release published (outputs.Publication, used by postprocess
    too) and an old estimate folder moved aside before it."""
    import ast

    package = Path(durable.__file__).parent
    allowed = {("ledger/store.py", "fsync"), ("outputs.py", "rename"), ("postprocess/command.py", "rename")}
    found = []
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        if name == "durable.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
                    and node.func.attr in ("fsync", "fdatasync", "replace", "rename")
                    and (name, node.func.attr) not in allowed):
                found.append(f"{name}:{node.lineno} os.{node.func.attr}")
    assert not found, found


@pytest.fixture
def synced_folders(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders fsynced, in order."""
    calls: list[Path] = []
    real = durable.fsync_folder

    def fsync_folder(folder: os.PathLike[str] | str) -> None:
        calls.append(Path(folder))
        real(folder)

    monkeypatch.setattr(durable, "fsync_folder", fsync_folder)
    return calls


def test_make_folders_syncs_each_new_folder_into_its_parent(tmp_path: Path, synced_folders: list[Path]) -> None:
    # A folder made without its parent synced may vanish in a power cut with all it holds: a
    # work folder's committed noisy vectors were lost that way (tests/system/test_crash_states.py).
    made = durable.make_folders(tmp_path / "runs" / "r1" / "measurements", mode=0o700)
    assert made == [tmp_path / "runs", tmp_path / "runs" / "r1", tmp_path / "runs" / "r1" / "measurements"]
    assert synced_folders == [tmp_path, tmp_path / "runs", tmp_path / "runs" / "r1"]
    synced_folders.clear()
    assert durable.make_folders(tmp_path / "runs" / "r1") == [] and synced_folders == []  # there: nothing to sync
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(FileExistsError):
        durable.make_folders(tmp_path / "file")


def test_replace_beside_syncs_the_folder_its_temporary_left(tmp_path: Path, synced_folders: list[Path]) -> None:
    # Otherwise the temporary's name may come back after a power cut, beside a published release.
    release, beside = tmp_path / "out", tmp_path
    release.mkdir()
    durable.replace(release / "privacy-loss.entry", b"entry\n", beside=beside)
    assert synced_folders == [release, beside]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_rename_and_remove_sync_the_folders_that_hold_the_names(tmp_path: Path, synced_folders: list[Path]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x")
    durable.rename(tmp_path / "a" / "f", tmp_path / "b" / "g")
    assert synced_folders == [tmp_path / "b", tmp_path / "a"] and (tmp_path / "b" / "g").read_bytes() == b"x"
    synced_folders.clear()
    (tmp_path / "b" / "sub").mkdir()
    (tmp_path / "b" / "sub" / "v.npy").write_bytes(b"v")
    assert durable.remove(tmp_path / "b" / "sub") and durable.remove(tmp_path / "b" / "g")
    assert not durable.remove(tmp_path / "b" / "gone")
    assert synced_folders == [tmp_path / "b", tmp_path / "b"] and list((tmp_path / "b").iterdir()) == []
