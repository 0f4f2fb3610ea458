"""Run PHSafe end to end on the bundled synthetic demo data (the README's demo command).

Runs the release flow (``flows/sdhc.py``: the US and Puerto Rico flows as subflows) in Prefect's
ephemeral mode -- no server to start -- on the two demo datasets: input validation, the nine
measurements per dataset with the production budgets, output validation, atomic publication and
a ledger checkpoint signed with a fresh Ed25519 key. Then it verifies each audit ledger offline
against the published outputs and the public key, writes the auditor's reports, and prints where
everything is.

The demo data is synthetic, so each demo invocation gets its own folder and its own ledgers and
can be repeated; inside each ledger the lifetime-budget rule applies exactly as for real data.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PHSAFE = Path(sys.executable).parent / "phsafe"

# Prefect settings are read at import. Ephemeral mode unless the operator points at a server;
# offline: no telemetry (it costs seconds per start here), a generous start-up timeout.
os.environ.setdefault("PREFECT_HOME", str(HERE / "output" / ".prefect"))
Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect creates only the last level
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import pandas as pd

from phsafe.progress import budget_text

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
    sys.path.insert(0, str(REPO))
    from flows.sdhc import release_flow

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    root = HERE / "output" / stamp
    signing_key, public_key = _demo_keys(root / "keys")
    where = os.environ.get("PREFECT_API_URL") or "Prefect ephemeral mode (no server)"
    print(f"Running the release flow (US and Puerto Rico) on the demo data in {where} ...", flush=True)
    summaries = release_flow(
        us_config=str(HERE / "data" / "us" / "config.json"), us_data=str(HERE / "data" / "us"),
        us_ledger=str(root / "ledgers" / "us-ledger.jsonl"),
        pr_config=str(HERE / "data" / "pr" / "config.json"), pr_data=str(HERE / "data" / "pr"),
        pr_ledger=str(root / "ledgers" / "pr-ledger.jsonl"),
        output_root=str(root), signing_key=str(signing_key),
    )
    for label, summary in summaries.items():
        run_dir = Path(summary["outputs"]).parent
        _run("audit", "verify", summary["ledger"], "--outputs", summary["outputs"], "--public-key", public_key)
        _run("audit", "report", summary["ledger"], "--out", run_dir / "audit-report")
        frame = pd.read_csv(Path(summary["outputs"]) / "PH1_num" / "PH1_num.csv", sep="|", dtype={"REGION_ID": str})
        print(f"\n{label.upper()}: run {summary['run_id']}, {summary['privacy_defn']} total "
              f"{budget_text(summary['total_budget'])}; "
              f"PH1_num, first rows of {len(frame)}:")
        print(frame.head(6).to_string(index=False))
    print(f"\nDemo outputs: {root}")
    for label, summary in summaries.items():
        run_dir = Path(summary["outputs"]).parent
        print(f"  {label.upper()} run {summary['run_id']}")
        print(f"    tables (CSV '|' and Parquet) {summary['outputs']}")
        print(f"    manifest (digests, lineage)  {Path(summary['outputs']) / 'manifest.json'}")
        print(f"    validation reports           {summary['validation_reports']}")
        print(f"    audit ledger                 {summary['ledger']}")
        print(f"    signed ledger checkpoint     {summary['checkpoint']}")
        print(f"    auditor's report             {run_dir / 'audit-report'}")
    print(f"  JSON-lines log                 {root / 'phsafe-log.jsonl'}")
    print(f"  public key for the auditors    {public_key}")
    print("  Prefect artifacts (budget spends, validation, manifest, checkpoint) are in the run's")
    print("  ephemeral database; run against a server to browse them in the UI (README: Run it in production).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
