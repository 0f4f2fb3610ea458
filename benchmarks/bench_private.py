"""Benchmark: generate N synthetic persons and run ``phsafe private`` end to end.

Prints wall time and the peak resident memory of the run (the ``phsafe`` process alone; data
generation is excluded and cached under ``benchmarks/_work``).

    .venv/bin/python benchmarks/bench_private.py --persons 1000000
    .venv/bin/python benchmarks/bench_private.py --persons 10000000 --format parquet
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _data import US_CONFIG, dataset  # benchmarks/ is the script's directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("csv", "parquet", "parquet-partitioned"), default="csv")
    parser.add_argument("--config", type=Path, default=US_CONFIG)
    args = parser.parse_args()

    states = json.loads(args.config.read_text())["state_filter"]
    data = dataset(args.persons, args.format, states)
    work = Path(tempfile.mkdtemp(prefix="phsafe-bench-"))
    try:
        phsafe = str(Path(sys.executable).parent / "phsafe")
        subprocess.run([phsafe, "ledger", "init", str(work / "ledger.jsonl"), "--lifetime-cap", "10",
                        "--reason", "benchmark"], check=True, capture_output=True)
        cmd = [phsafe, "private", str(args.config), str(data), str(work / "out"), "--ledger",
               str(work / "ledger.jsonl"), "--dataset", "benchmark", "--new-version", "synthetic benchmark records",
               "--log", str(work / "run.log")]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        stages = [json.loads(line) for line in (work / "run.log").read_text().splitlines()]
        timings = {e["stage"]: e["seconds"] for e in stages if e.get("event") == "stage finished"}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"persons": args.persons, "format": args.format, "wall_seconds": round(wall, 2),
                      "peak_rss_mib": round(peak_mib), "stages": timings}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
