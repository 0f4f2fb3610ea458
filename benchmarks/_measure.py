"""Wall time and memory of a command run in a child process (Linux).

Peak memory is measured two ways, because a phase may run several processes at once (input
validation checks the persons file in a second process):

* ``peak_rss_mib``: the largest total resident memory of the child and all its descendants,
  sampled every 50 ms from ``/proc`` -- what the machine must hold;
* ``max_process_rss_mib``: the largest peak RSS of any single process of the phase, exact
  (``ru_maxrss`` from ``wait4``, which covers the child and its waited-for descendants).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Phase:
    """Measurements of one phase."""

    name: str
    wall_seconds: float
    cpu_seconds: float
    peak_rss_mib: float
    max_process_rss_mib: float
    returncode: int

    def as_dict(self) -> dict[str, float | str | int]:
        out = asdict(self)
        for k in ("wall_seconds", "cpu_seconds"):
            out[k] = round(out[k], 2)
        for k in ("peak_rss_mib", "max_process_rss_mib"):
            out[k] = round(out[k])
        return out


def _tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and its descendants (processes that vanish are skipped)."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces) start after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        pid = int(entry)
        parent[pid] = int(fields[1])
        rss[pid] = int(fields[21]) * _PAGE
    tree, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(rss.get(pid, 0) for pid in tree)


def run_phase(name: str, cmd: list[str], *, cwd: Path | None = None, log: Path | None = None,
              check: bool = True) -> Phase:
    """Run ``cmd``; return its wall time, CPU time and peak memory.

    Args:
        name: Phase name for the report.
        cmd: Command line.
        cwd: Working directory.
        log: File receiving the command's stdout and stderr (default: discarded).
        check: Raise if the command fails.
    """
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=out)
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                try:
                    peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
                except Exception:  # noqa: BLE001 -- sampling must never break the run
                    pass
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    phase = Phase(name, wall, usage.ru_utime + usage.ru_stime, max(peak[0], usage.ru_maxrss * 1024) / 2**20,
                  usage.ru_maxrss / 1024, proc.returncode)
    if check and proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}): {' '.join(cmd)}"
                         + (f"; see {log}" if log else ""))
    return phase
