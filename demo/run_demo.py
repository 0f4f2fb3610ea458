"""Run PHSafe end to end on the bundled synthetic demo data (the README's demo command).

For each of the two demo datasets (US states, Puerto Rico) this validates the inputs, runs the
private algorithm with the production budgets, signs the ledger checkpoint with a fresh Ed25519
key, verifies the audit ledger and its signature against the published outputs, and writes the
auditor's report. The demo data is synthetic, so each demo invocation gets its own output folder
and its own ledger and can be repeated; inside each ledger the lifetime-budget rule applies
exactly as for real data.
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


def _demo_keys(directory: Path) -> tuple[Path, Path]:
    """A fresh Ed25519 key pair for signing this demo run's ledger checkpoint."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private, public = directory / "signing-key.pem", directory / "signing-key.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def main() -> int:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    root = HERE / "output" / stamp
    for name in ("us", "pr"):
        data = HERE / "data" / name
        config = data / "config.json"
        run_dir = root / name
        out = run_dir / "tables"
        ledger = run_dir / "ledger.jsonl"
        signing_key, public_key = _demo_keys(run_dir / "keys")
        _run("validate", config, data, "--report-dir", run_dir / "validation")
        _run("private", config, data, out, "--validate", "--validate-private-output",
             "--ledger", ledger, "--log", run_dir / "phsafe.log", "--signing-key", signing_key)
        _run("audit", "verify", ledger, "--outputs", out, "--public-key", public_key)
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
