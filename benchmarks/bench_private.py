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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
US_CONFIG = REPO.parent / "shared" / "fixtures" / "production_config_us.json"


def _dataset(n: int, fmt: str, states: list[str]) -> Path:
    from phsafe.synthetic import generate, write

    path = HERE / "_work" / f"{n}-{fmt}"
    if not (path / f"persons.{fmt}").exists():
        path.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        write(generate(n, states, seed=n), path, fmt=fmt)
        print(f"generated {n:,} persons in {time.perf_counter() - start:.1f} s -> {path}")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
    parser.add_argument("--config", type=Path, default=US_CONFIG)
    args = parser.parse_args()

    states = json.loads(args.config.read_text())["state_filter"]
    data = _dataset(args.persons, args.format, states)
    work = Path(tempfile.mkdtemp(prefix="phsafe-bench-"))
    try:
        cmd = [str(Path(sys.executable).parent / "phsafe"), "private", str(args.config), str(data),
               str(work / "out"), "--ledger", str(work / "ledger.jsonl"), "--log", str(work / "run.log")]
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
