"""Benchmark: N synthetic persons end to end -- input validation plus the private run.

    .venv/bin/python benchmarks/bench_end_to_end.py --persons 10M --format csv
    .venv/bin/python benchmarks/bench_end_to_end.py --persons 100M --format parquet-partitioned

Phases, each a separate process measured for wall time, CPU time and peak memory (the resident
memory of the process and all its children, sampled; see ``_measure.py``):

1. ``generate`` -- ``phsafe synth`` (only when the dataset is not cached in ``benchmarks/_work``);
2. ``pyarrow read`` -- a bare pyarrow read of the same input files (``pyarrow_read.py``);
3. ``validate`` -- ``phsafe validate CONFIG DATA``;
4. ``private`` -- ``phsafe private CONFIG DATA OUT`` with a fresh ledger (its stage timings come
   from its JSON log).

The end-to-end total is validate + private; it is reported as a multiple of the bare read.
Results are printed as JSON and appended to ``benchmarks/_work/results.jsonl``. The config is
the production US config (``shared/fixtures/production_config_us.json``).

Targets on the 2-core, 24 GB machine: 10M persons <= 90 s including validation; the full US
(~331M persons) <= 20 minutes with peak memory <= 16 GB; total <= 3x the bare read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _data import PHSAFE, US_CONFIG, WORK, ensure_dataset, synth_command  # benchmarks/ is the script's directory
from _measure import Phase, run_phase

HERE = Path(__file__).resolve().parent
TARGETS_SECONDS = {10_000_000: 90.0, 331_000_000: 1200.0, 331_449_281: 1200.0}
TARGET_PEAK_MIB = 16 * 1024
TARGET_RATIO = 3.0


def _count(text: str) -> int:
    text = text.strip().upper().replace("_", "")
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if scale != 1 else text) * scale)


def _stages(log: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "stage finished":
            out[event["stage"]] = event["seconds"]
        elif event.get("event") == "partition stages":
            out.update({f"  {k}": v for k, v in event.items() if isinstance(v, (int, float))})
    return out


def machine_probe() -> float:
    """Seconds for a fixed numpy workload (sort and random gather of 20M integers).

    About 2 s on the reference machine when it is quiet; shared or throttled machines run it
    (and everything else) slower, which puts the other numbers in context.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.integers(0, 1 << 30, 20_000_000)
    b = rng.integers(0, 20_000_000, 20_000_000)
    start = time.perf_counter()
    np.sort(a)
    int(a[b].sum())
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=_count, default=1_000_000, help="e.g. 1000000, 10M, 331M")
    parser.add_argument("--format", choices=("csv", "parquet", "parquet-partitioned"), default="csv")
    parser.add_argument("--config", type=Path, default=US_CONFIG)
    parser.add_argument("--skip-validation", action="store_true", help="time the private run only")
    parser.add_argument("--skip-read", action="store_true",
                        help="no bare pyarrow read (it materializes each table: ~36 GB for a 331M-person CSV)")
    parser.add_argument("--keep", action="store_true", help="keep the run's outputs, ledger and log")
    args = parser.parse_args()

    probe_before = machine_probe()
    data, generated = ensure_dataset(args.persons, args.format)
    work = Path(tempfile.mkdtemp(prefix=f"e2e-{args.persons}-", dir=WORK))
    phases: list[Phase] = []
    try:
        if not args.skip_read:
            phases.append(run_phase("pyarrow read", [sys.executable, str(HERE / "pyarrow_read.py"), str(data)]))
        if not args.skip_validation:
            phases.append(run_phase("validate", [PHSAFE, "validate", str(args.config), str(data)],
                                    log=work / "validate.out"))
        phases.append(run_phase(
            "private",
            [PHSAFE, "private", str(args.config), str(data), str(work / "out"), "--ledger",
             str(work / "ledger.jsonl"), "--log", str(work / "run.log")],
            log=work / "private.out"))
        stages = _stages(work / "run.log")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    by_name = {p.name: p for p in phases}
    total = sum(by_name[n].wall_seconds for n in ("validate", "private") if n in by_name)
    peak = max(by_name[n].peak_rss_mib for n in ("validate", "private") if n in by_name)
    read = by_name["pyarrow read"].wall_seconds if "pyarrow read" in by_name else None
    target = TARGETS_SECONDS.get(args.persons)
    result = {
        "persons": args.persons,
        "format": args.format,
        "data": str(data),
        "data_bytes": sum(f.stat().st_size for f in data.rglob("*") if f.is_file()),
        "generate": generated.as_dict() if generated else "cached",
        "generate_command": " ".join(synth_command(args.persons, args.format, data)),
        "phases": [p.as_dict() for p in phases],
        "private_stages_seconds": stages,
        "end_to_end_seconds": round(total, 1),
        "end_to_end_peak_rss_mib": round(peak),
        "pyarrow_read_seconds": None if read is None else round(read, 1),
        "multiple_of_pyarrow_read": None if read is None else round(total / read, 2),
        "targets": {
            "seconds": target,
            "meets_seconds": None if target is None else total <= target,
            "meets_peak_16gib": peak <= TARGET_PEAK_MIB,
            "meets_3x_read": None if read is None else total / read <= TARGET_RATIO,
        },
        "load_average_1min_after": round(os.getloadavg()[0], 2),
        "machine_probe_seconds": [round(probe_before, 2), round(machine_probe(), 2)],
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    WORK.mkdir(exist_ok=True)
    with open(WORK / "results.jsonl", "a") as fh:
        fh.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
