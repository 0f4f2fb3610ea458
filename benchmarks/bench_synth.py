"""Benchmark: generation speed of ``phsafe synth`` (persons per second, per core).

    .venv/bin/python benchmarks/bench_synth.py --persons 10000000 --format csv

Runs ``phsafe synth`` into a temporary folder under ``benchmarks/_work`` (deleted afterwards) and
prints wall time, CPU time, persons per wall second and per CPU second, and peak memory.
Target: at least 1M persons per 10 seconds per core, i.e. 100k persons per CPU second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from _data import WORK, synth_command  # benchmarks/ is the script's directory
from _measure import run_phase

TARGET_PER_CPU_SECOND = 100_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=10_000_000)
    parser.add_argument("--format", choices=("csv", "parquet", "parquet-partitioned"), default="csv")
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="synth-", dir=WORK))
    try:
        phase = run_phase("generate", synth_command(args.persons, args.format, out / "data"))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    per_cpu = args.persons / phase.cpu_seconds
    print(json.dumps({
        "persons": args.persons, "format": args.format, **phase.as_dict(),
        "persons_per_wall_second": round(args.persons / phase.wall_seconds),
        "persons_per_cpu_second": round(per_cpu),
        "meets_target": per_cpu >= TARGET_PER_CPU_SECOND,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
