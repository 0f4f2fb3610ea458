"""Wall time, CPU time, memory and machine load of a command run in a child process (Linux).

Peak memory is measured three ways, because a phase may run several processes at once (input
validation checks the persons file in a second process; the pass counts in worker processes):

* ``peak_pss_mib``: the largest *proportional* set size of the child and all its descendants
  added up (``/proc/<pid>/smaps_rollup``, sampled every 0.2 s): what the process tree holds, each
  shared page counted once -- the memory figure the benchmarks report;
* ``peak_rss_mib``: the largest total resident memory of the tree, sampled the same way (counts
  pages shared between processes once per process);
* ``max_process_rss_mib``: the largest peak RSS of any single process of the phase, exact
  (``ru_maxrss`` from ``wait4``, which covers the child and its waited-for descendants).

The machine is shared: the 1-minute load average is sampled every second during the phase
(``load_mean``, ``load_max``).
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
    peak_pss_mib: float = 0.0
    load_mean: float = 0.0
    load_max: float = 0.0

    def as_dict(self) -> dict[str, float | str | int]:
        out = asdict(self)
        for k in ("wall_seconds", "cpu_seconds"):
            out[k] = round(out[k], 2)
        for k in ("peak_rss_mib", "max_process_rss_mib", "peak_pss_mib"):
            out[k] = round(out[k])
        for k in ("load_mean", "load_max"):
            out[k] = round(out[k], 1)
        return out


def _tree(root: int) -> set[int]:
    """``root`` and its descendants."""
    parent: dict[int, int] = {}
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
    return tree


def _tree_memory(root: int) -> tuple[int, int]:
    """(RSS, PSS) bytes of ``root`` and its descendants added up (processes that vanish are skipped)."""
    rss = pss = 0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith(b"Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


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
        peak = [0, 0]
        loads: list[float] = []
        done = threading.Event()

        def sample() -> None:
            last_load = 0.0
            while not done.is_set():
                try:
                    rss, pss = _tree_memory(proc.pid)
                    peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
                    if time.perf_counter() - last_load >= 1.0:
                        loads.append(os.getloadavg()[0])
                        last_load = time.perf_counter()
                except Exception:  # noqa: BLE001 -- sampling must never break the run
                    pass
                done.wait(0.2)

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
                  usage.ru_maxrss / 1024, proc.returncode, max(peak[1], 1) / 2**20,
                  sum(loads) / len(loads) if loads else os.getloadavg()[0], max(loads, default=os.getloadavg()[0]))
    if check and proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}): {' '.join(cmd)}"
                         + (f"; see {log}" if log else ""))
    return phase
