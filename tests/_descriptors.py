"""What this process holds open: for tests that a dropped object closes its files."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def open_files() -> set[str]:
    """The targets of this process's open descriptors (those it can still read)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return found


def assert_closes_its_files_once(open_it: Callable[[], Any], files: set[Path]) -> None:
    """An object ``open_it()`` returns holds ``files`` open; dropped without ``close()``, the
    collector closes them; closed, the collector never closes them again (a descriptor number
    the object had may belong to another file by then)."""
    ours = {str(f) for f in files}
    held = open_it()
    assert ours <= open_files()
    del held
    gc.collect()
    assert not ours & open_files()  # dropped without close(): collected, its files closed
    closed = open_it()
    closed.close()
    other = os.open(min(ours), os.O_RDONLY)  # may take a number the object had
    try:
        del closed
        gc.collect()
        os.fstat(other)  # still open: close() closed the object's files once, the collector not again
    finally:
        os.close(other)
