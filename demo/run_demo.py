"""Run PHSafe end to end on the bundled synthetic demo data (the README's demo command).

For each of the two demo datasets (US states, Puerto Rico) this validates the inputs, runs the
private algorithm with the production budgets, verifies the audit ledger against the published
outputs and writes the auditor's report. Each demo invocation gets its own output folder and its
own ledger, so the demo can be run any number of times; the data is synthetic and is declared
non-confidential on the command line.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
PHSAFE = Path(sys.executable).parent / "phsafe"


def _run(*args: str | Path) -> None:
    cmd = [str(PHSAFE), *map(str, args)]
    print("$ phsafe " + " ".join(map(str, args[:1])) + " ...", flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    root = HERE / "output" / stamp
    for name in ("us", "pr"):
        data = HERE / "data" / name
        config = data / "config.json"
        run_dir = root / name
        out = run_dir / "tables"
        ledger = run_dir / "ledger.jsonl"
        _run("validate", config, data, "--report-dir", run_dir / "validation")
        _run("private", config, data, out, "--validate", "--validate-private-output",
             "--ledger", ledger, "--log", run_dir / "phsafe.log", "--non-confidential")
        _run("audit", "verify", ledger, "--outputs", out)
        _run("audit", "report", ledger, "--out", run_dir / "audit-report")
        frame = pd.read_csv(out / "PH1_num" / "PH1_num.csv", sep="|", dtype={"REGION_ID": str})
        print(f"\n{name.upper()}: PH1_num, first rows of {len(frame)}:")
        print(frame.head(6).to_string(index=False))
        print()
    print(f"Demo outputs: {root}")
    print("  <run>/tables/<TABLE>/<TABLE>.csv   the eleven tables ('|'-separated)")
    print("  <run>/tables/manifest.json         file digests, lineage and signed-ledger checkpoint")
    print("  <run>/ledger.jsonl                 the audit ledger; <run>/audit-report/ the auditor's report")
    print("  <run>/validation/                  validation results and Data Docs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
