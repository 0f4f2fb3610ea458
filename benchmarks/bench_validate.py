"""Benchmark: generate N synthetic persons and time input validation (``phsafe validate``).

Runs ``phsafe validate CONFIG DATA`` in a fresh process -- Great Expectations' import included,
as an operator would see it -- and prints wall time, CPU time and the peak resident memory of
the validating processes. Data generation is excluded and cached under ``benchmarks/_work``
(shared with bench_private.py). Targets (issue 3, on the 2-core machine): 1M persons < 15 s,
10M persons < 3 min.

    .venv/bin/python benchmarks/bench_validate.py --persons 1000000
    .venv/bin/python benchmarks/bench_validate.py --persons 10000000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _data import US_CONFIG, dataset  # benchmarks/ is the script's directory

TARGETS = {1_000_000: 15.0, 10_000_000: 180.0}


def _run_once(config: Path, data: Path) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="phsafe-bench-validate-"))
    try:
        cmd = [str(Path(sys.executable).parent / "phsafe"), "validate", str(config), str(data)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"validation failed:\n{proc.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "peak_rss_mib": round(after.ru_maxrss / 1024)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("csv", "parquet", "parquet-partitioned"), default="csv")
    parser.add_argument("--config", type=Path, default=US_CONFIG)
    parser.add_argument("--repeat", type=int, default=1, help="runs; the best wall time is reported")
    args = parser.parse_args()

    states = json.loads(args.config.read_text())["state_filter"]
    data = dataset(args.persons, args.format, states)
    runs = [_run_once(args.config, data) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["wall_seconds"])
    target = TARGETS.get(args.persons)
    print(json.dumps({
        "persons": args.persons, "format": args.format, "runs": runs, "best_wall_seconds": best["wall_seconds"],
        "target_seconds": target, "meets_target": None if target is None else best["wall_seconds"] < target,
        "load_average_1min": round(os.getloadavg()[0], 2),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
