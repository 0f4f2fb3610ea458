"""The memory budget of the input pass: how much it may use, and how it plans for it.

A run reads its inputs within ``--memory-limit`` (:func:`default_memory_limit`: half of this
machine's memory, or of the container's limit when lower). The pass (:class:`phsafe.intake.InputPass`)
works one *partition* at a time -- a state's folders for data stored by state, else the whole
input -- and a partition whose records do not fit in the budget is *spilled*: its files are
streamed once, checked and validated batch by batch, and their compact records written to MAFID
ranges ("buckets") in the run's confidential work folder (:mod:`phsafe.intake.spill`); the buckets are
then joined, validated and counted one at a time. Every rule of the count and of the cross-file
validation is decided per MAFID, so the buckets give exactly what the whole partition gives.

The plan (:func:`plan_part`) follows a cost model of the pass, in bytes per row of each file,
measured on this code (``benchmarks/README.md``):

* a partition held in memory costs its compact columns, the MAFID join, the validation's
  derived frames and the counting's temporaries: :data:`BYTES_PER_ROW` for each file;
* a spilled partition costs, while it is streamed, the batches in flight (:data:`STREAM_BYTES`),
  then one bucket at a time at the same bytes per row;
* every run costs the interpreter and its libraries (:data:`BASE_BYTES`), and with validation,
  Great Expectations' second process (:data:`VALIDATION_BYTES`);
* data stored by state also keeps one bit per possible MAFID for its layout check
  (:data:`LAYOUT_BYTES`).

A partition that fits is held in memory (no spill). One that does not is cut into the fewest
buckets that fit, and no larger than :data:`MAX_BUCKET_PERSONS` persons (larger ones are no
faster). An input that cannot be processed within the limit even in buckets of
:data:`MIN_BUCKET_PERSONS` is refused before anything is read (:func:`check_memory`, called by
the run's preflight) with one line that says what limit it needs.

The limit decides what is refused; what the pass *aims* at is its target (:func:`plan_target`):
the limit when one is given, and by default the smaller of the default limit and
:data:`DEFAULT_TARGET_BYTES` -- a spilled partition's buckets, and the states of data stored by
state counted at once, are planned for the target, so that a run with the default settings stays
within about 4 GB whatever the machine (the full US from national CSV files or from Parquet stored
by state: ``benchmarks/README.md``). A partition that fits in the limit is still held in memory
(spilling it would cost more than it saves); one that cannot be planned within the target is
planned within the limit.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from phsafe.errors import PHSafeError
from phsafe.parameters import option
from phsafe.sizes import GIB, MIB, format_size


BASE_BYTES = 400 * MIB
"""The run's process before it reads: interpreter, numpy, pyarrow, pandas, the engine."""
VALIDATION_BYTES = 600 * MIB
"""Great Expectations' second process (imported libraries and the frames it evaluates) and the
validation's own state in this process (combination counters, the jobs in flight). The second
process imports Great Expectations without what its suites never use
(:func:`phsafe.validation._gx.trim_imports`: about 80 MiB less)."""
STREAM_BYTES = 600 * MIB
"""A spilled partition while it is streamed: parsed batches read ahead, their checked compact
columns, the batches queued for the spill writer."""
LAYOUT_BYTES = 250 * MIB
"""Data stored by state: one bit per possible MAFID of units and of geo (the layout check)."""
BYTES_PER_ROW: Mapping[str, int] = {"persons": 72, "units": 88, "geo": 56}
"""What a row of each file costs in a partition held in memory (compact columns, join, validation
frames, counting temporaries); measured on synthetic national data with a margin."""
MAX_BUCKET_PERSONS = 8_000_000
"""Buckets are no larger than this: larger ones use more memory and are no faster (the full US
from national files, 331M persons: 44 buckets counted two at a time, each worker process holding
about 1 GiB)."""
MIN_BUCKET_PERSONS = 1_000_000
"""Buckets are no smaller than this: the fixed cost of each would dominate."""
MAX_BUCKETS = 4096
WORKER_BYTES = 350 * MIB
"""A worker process that counts MAFID ranges (:class:`phsafe.intake.WorkerProcesses`), before its
range: interpreter, libraries and, with validation, Great Expectations (imported as the second
process imports it: about 190 MiB resident)."""
STATE_BASE_BYTES = 250 * MIB
STATE_BYTES_PER_ROW: Mapping[str, int] = {"persons": 40, "units": 45, "geo": 33}
"""What a state's folders cost while a worker process reads, validates and counts them
(:func:`state_bytes`), measured at full US: California (39.5M persons, 17M units and geo rows)
peaks at about 3.0 GiB beside the process's own 0.2 GiB; a 10M-person state at about 1.0 GiB.
:data:`BYTES_PER_ROW` is the planning model of a partition held in memory, with its margins;
this is what decides how many states are counted at once."""
BY_STATE_FIXED_BYTES = 1350 * MIB
"""Data stored by state: the pass's own process (the layout check's bits, the pieces merged, the
report), Great Expectations' second process and the two worker processes between states --
measured at full US: at most about 1.3 GiB together."""
DEFAULT_TARGET_BYTES = 3750 * MIB
"""What a pass aims at by default (:func:`plan_target`): with this model's margins, the full US
measured at about 3.4-3.5 GiB of process-tree memory (summed PSS) from national CSV files and from
Parquet stored by state, under the 4 GB goal of issue 36 (``benchmarks/README.md``)."""


WORKERS_MIN_PERSONS = 16_000_000
"""Passes over fewer persons use no worker processes: starting them and importing Great
Expectations in each (about 2.5 CPU-s a process) would cost more CPU than the second core saves
time -- the pass counts about 2M persons a CPU-second."""


def worker_processes() -> int:
    """How many MAFID ranges of a national partition are counted at once (one per core, at most two:
    beyond, the reading is the bottleneck)."""
    return max(1, min(2, os.cpu_count() or 1))

SPILL_BYTES_PER_ROW: Mapping[str, int] = {"persons": 12, "units": 20, "geo": 9}
"""Disk a spilled row takes (its compact columns, Arrow IPC), with a margin."""

def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
    return None


def machine_memory() -> int:
    """This machine's memory, or its container's limit when lower (bytes)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    return min(total, limit) if limit else total


def plan_target(memory_limit: int | None) -> int:
    """The memory a pass aims at (see the module docstring): ``memory_limit`` when given, else
    the smaller of :func:`default_memory_limit` and :data:`DEFAULT_TARGET_BYTES`."""
    if memory_limit is not None:
        return memory_limit
    return min(default_memory_limit(), DEFAULT_TARGET_BYTES)


def default_memory_limit() -> int:
    """Half of :func:`machine_memory`: room for the system, the page cache that the spill files
    and the inputs pass through, and whatever else runs beside the release."""
    return machine_memory() // 2


def memory_limit_help() -> str:
    """The ``--memory-limit`` help text, with this machine's default."""
    return (f"Memory the input pass may use, e.g. 8G or 512M (default: half of this machine's memory, "
            f"{format_size(default_memory_limit())} here). Inputs too large for it are processed in "
            "MAFID ranges spilled to the confidential work folder; inputs that cannot fit are refused "
            "before anything is read.")


@dataclass(frozen=True)
class PartPlan:
    """How one partition of the pass is processed.

    Attributes:
        buckets: 1: in memory; more: spilled into this many MAFID ranges.
        peak_bytes: Estimated peak of the pass while it works on this partition.
        spill_bytes: Disk its spill files take (0 in memory).
    """

    buckets: int
    peak_bytes: int
    spill_bytes: int
    parallel: int = 1
    """Buckets counted at once (in worker processes when more than one)."""

    @property
    def spilled(self) -> bool:
        return self.buckets > 1


def part_bytes(rows: Mapping[str, int]) -> int:
    """Memory of a partition of ``rows`` (file stem -> rows) held at once."""
    return sum(rows.get(stem, 0) * cost for stem, cost in BYTES_PER_ROW.items())


def fixed_bytes(*, validate: bool, by_state: bool) -> int:
    """What the pass costs whatever its partitions."""
    return BASE_BYTES + (VALIDATION_BYTES if validate else 0) + (LAYOUT_BYTES if by_state else 0)


def plan_part(rows: Mapping[str, int], limit: int, *, validate: bool, by_state: bool,
              parallel: int = 1, target: int | None = None) -> PartPlan | None:
    """In memory if it fits, else the fewest buckets that fit -- ``parallel`` of them counted at
    once, each in a worker process of :data:`WORKER_BYTES` -- and no more than
    :data:`MAX_BUCKET_PERSONS` persons each; None when not even buckets of
    :data:`MIN_BUCKET_PERSONS` persons fit in ``limit``. Buckets are planned to fit ``target``
    (default: ``limit``) when they can, else ``limit``."""
    fixed = fixed_bytes(validate=validate, by_state=by_state)
    whole = part_bytes(rows)
    if fixed + whole <= limit:
        return PartPlan(1, fixed + whole, 0)
    if target is not None and target < limit:
        aimed = _buckets(rows, target, fixed, whole, parallel, fall_back=False)
        if aimed is not None:
            return aimed
    return _buckets(rows, limit, fixed, whole, parallel)


def _buckets(rows: Mapping[str, int], limit: int, fixed: int, whole: int, parallel: int, *,
             fall_back: bool = True) -> PartPlan | None:
    """The fewest buckets within ``limit`` (see :func:`plan_part`); with ``fall_back``, one at a
    time when ``parallel`` of them do not fit."""
    persons = max(1, rows.get("persons", 0))
    workers = WORKER_BYTES * parallel if parallel > 1 else 0
    room = (limit - fixed - STREAM_BYTES - workers) // max(1, parallel)
    need = max(math.ceil(persons / MAX_BUCKET_PERSONS), 2)
    if room > 0:
        need = max(need, math.ceil(whole / room))
    most = max(2, min(MAX_BUCKETS, math.ceil(persons / MIN_BUCKET_PERSONS)))
    if room <= 0 or need > most:
        return None if parallel == 1 or not fall_back else _buckets(rows, limit, fixed, whole, 1)
    per_bucket = math.ceil(whole / need)
    disk = sum(rows.get(stem, 0) * cost for stem, cost in SPILL_BYTES_PER_ROW.items())
    return PartPlan(need, fixed + STREAM_BYTES + workers + parallel * per_bucket, disk, parallel)


def state_bytes(rows: Mapping[str, int]) -> int:
    """What one state's folders cost in a worker process (:data:`STATE_BYTES_PER_ROW`)."""
    return STATE_BASE_BYTES + sum(rows.get(stem, 0) * cost for stem, cost in STATE_BYTES_PER_ROW.items())


def parallel_budget(parts: list[Mapping[str, int]], limit: int, *, validate: bool,
                    target: int | None = None) -> int | None:
    """For data stored by state held in memory: the bytes of states that may be counted at once
    in :func:`worker_processes` worker processes (each state's cost by :func:`state_bytes`) --
    what ``target`` (default: ``limit``) leaves beside the pass's other processes
    (:data:`BY_STATE_FIXED_BYTES`); a state larger than that is counted alone -- or None when the
    largest state does not fit ``limit`` beside the worker processes (by the planning model,
    :func:`part_bytes`), or the input is too small to be worth them (then states are counted one
    at a time in the pass's process)."""
    if worker_processes() < 2 or len(parts) < 2 or sum(p.get("persons", 0) for p in parts) < WORKERS_MIN_PERSONS:
        return None
    fixed = fixed_bytes(validate=validate, by_state=True) + worker_processes() * WORKER_BYTES
    largest = max(part_bytes(rows) for rows in parts)
    if limit - fixed < largest:
        return None
    return max(0, min(limit, target if target is not None else limit) - BY_STATE_FIXED_BYTES)


def needed_limit(rows: Mapping[str, int], *, validate: bool, by_state: bool) -> int:
    """The smallest limit :func:`plan_part` accepts for a partition of ``rows`` (its buckets
    counted one at a time)."""
    persons = max(1, rows.get("persons", 0))
    most = max(2, min(MAX_BUCKETS, math.ceil(persons / MIN_BUCKET_PERSONS)))
    bucket = math.ceil(part_bytes(rows) / most)
    return fixed_bytes(validate=validate, by_state=by_state) + STREAM_BYTES + bucket


@dataclass(frozen=True)
class MemoryPlan:
    """The plan of a whole pass: each partition's, the peak and the spill's disk."""

    limit: int
    parts: Mapping[str, PartPlan]

    @property
    def peak_bytes(self) -> int:
        return max((p.peak_bytes for p in self.parts.values()), default=0)

    @property
    def spill_bytes(self) -> int:
        """Disk of the largest partition's spill (one partition's spill exists at a time)."""
        return max((p.spill_bytes for p in self.parts.values()), default=0)

    @property
    def spills(self) -> bool:
        return any(p.spilled for p in self.parts.values())

    @property
    def workers(self) -> int:
        """Worker processes the pass needs (1: none)."""
        return max((p.parallel for p in self.parts.values() if p.spilled), default=1)


def check_memory(plan: MemoryPlan | None, needed: int, spill_dir: Path | None) -> None:
    """Refuse, in one line that says what to do, a pass that cannot run within its limit or
    whose spill does not fit on the work folder's file system.

    Args:
        plan: The pass's plan (None: some partition does not fit at any bucket size).
        needed: The smallest limit that would do.
        spill_dir: Where the spill files would go (its nearest existing parent is checked).

    Raises:
        PHSafeError: One line, nothing read, nothing spent.
    """
    # The sizes are functions of the confidential records, and a refusal's message may leave the
    # enclave (a flow run's state, an alert): they go to the confidential log, and the message says
    # where -- or, with no log file (the command line without --log, whose console is the
    # enclave's), what they are.
    if plan is None:
        suggested = f"{math.ceil(needed / GIB * 10) / 10:g}G"
        log_file = _log_figures("the inputs need more than the memory limit", needed_bytes=needed,
                                suggested_limit=suggested)
        if log_file is not None:
            figures = f"the figures are in the enclave log at {log_file} (give {option('memory_limit')} more"
        else:
            figures = f"at least {format_size(needed)} (give {option('memory_limit')} {suggested} or more"
        raise PHSafeError(f"the inputs need more than the memory limit; {figures}, on a machine that has it)")
    if not plan.spills:
        return
    existing = Path(spill_dir) if spill_dir is not None else Path(tempfile.gettempdir())
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return  # the work folder's own checks say what is wrong with it
    if _in_memory_file_system(existing):
        raise PHSafeError(
            f"the inputs do not fit in the memory limit and must be spilled to disk, but {existing} is in memory "
            f"(tmpfs): choose a work folder on disk ({option('work_dir')}), or raise {option('memory_limit')}")
    need = plan.spill_bytes + (1 << 30)
    if free < need:
        log_file = _log_figures("the spill needs more than the work folder's free space", spill_bytes=need,
                                free_bytes=free, memory_limit_bytes=plan.limit)
        figures = (f"the figures are in the enclave log at {log_file}" if log_file is not None
                   else f"{format_size(free)} free of the {format_size(need)} the spill needs")
        raise PHSafeError(
            f"the inputs need more than the memory limit and are processed in MAFID ranges spilled to the "
            f"work folder, whose file system has too little free space for the spill ({figures}): free space, "
            f"choose another work folder ({option('work_dir')}), or raise {option('memory_limit')}")


def _log_figures(event: str, **figures: object) -> Path | None:
    """Log a refusal's figures (to the confidential log); that log's path, if events go to a file."""
    from phsafe.logs import current_log_file, get_logger

    get_logger("phsafe.memory").info(event, **figures)
    return current_log_file()


def _in_memory_file_system(path: Path) -> bool:
    """Whether ``path`` is on a tmpfs or ramfs (its mount, from ``/proc/mounts``)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    resolved = str(Path(path).resolve())
    best, kind = "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind in ("tmpfs", "ramfs")
