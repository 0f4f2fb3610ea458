"""The unit lane: tests of the library's functions, in this process.

A unit test starts no process and no server (those tests live in ``tests/system`` or
``tests/flows``): the guard below turns an attempt into a failure that says so, so the lane
stays fast and its tests stay about one function at a time.
"""

from __future__ import annotations

import multiprocessing.process
import subprocess

import pytest

_WHY = "a unit test starts no process or server: move it to tests/system (or tests/flows)"


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(_WHY)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
