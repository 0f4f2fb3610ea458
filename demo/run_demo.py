"""Run PHSafe end to end on the bundled synthetic demo data (the README's demo command).

First, as production does before any data is seen, it makes one audit ledger per dataset with
its policy (``phsafe ledger init``: every dataset's lifetime cap, the lineage key). Then it runs
the release flow (``flows/sdhc.py``: the US and Puerto Rico flows as subflows) in Prefect's
ephemeral mode -- no server to start -- on the two demo datasets, as a confidential run would:
preflight, input validation, the nine measurements per dataset with the production budgets,
output validation, publication and a ledger checkpoint signed with a fresh Ed25519 key. Then it
verifies each ledger offline against the published release and the public key, writes the
auditor's (confidential) reports, shows that a second release of the same records is refused,
publishes each ledger's public privacy-loss log and checks each release as an outsider would
(``phsafe audit public``: public files only, with the witness's key), and prints where everything
is -- the public release apart from the confidential zone.

Each ledger's public log is witnessed by a witness that is another party: ``phsafe witness serve``
started here as a service of its own (a subprocess on a loopback port the system picks), with its
own key and state; the ledgers know its URL and public key only, and every run asks it, over
HTTP, to cosign the log before and after every spend.

The demo data is synthetic, so each demo invocation gets its own folder and its own ledgers and
can be repeated; inside each ledger the lifetime-budget rule applies exactly as for real data.
"""

from __future__ import annotations

import os
import shutil
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

from phsafe.amounts import amount_text

HERE = Path(__file__).resolve().parent
PHSAFE = Path(sys.executable).parent / "phsafe"


def _run(*args: str | Path) -> None:
    cmd = [str(PHSAFE), *map(str, args)]
    print("$ phsafe " + " ".join(map(str, args[:1])) + " ...", flush=True)
    subprocess.run(cmd, check=True)


def _run_shown(*args: str | Path) -> None:
    """Run a command whose output is the point (the outsider's check): show the command too."""
    print("$ phsafe " + " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(PHSAFE), *map(str, args)], check=True)


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _start_witness(keys: Path, state: Path, logs: Path) -> tuple[subprocess.Popen, str]:
    """``phsafe witness serve`` as a service of its own, on a loopback port the system picks;
    returns the process and the URL it printed once it listens."""
    logs.mkdir(parents=True, exist_ok=True)
    command = [str(PHSAFE), "witness", "serve", "--key", str(keys / "witness.key"), "--state", str(state),
               "--logs", str(logs), "--bind", "127.0.0.1:0"]
    print("$ phsafe " + " ".join(command[1:]) + " &", flush=True)
    service = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert service.stdout is not None
    line = service.stdout.readline()  # printed once it accepts requests
    if "http://" not in line:
        service.kill()
        raise SystemExit(f"the witness did not start: {line.strip() or 'no output'}")
    print(line.rstrip(), flush=True)
    return service, line.split(" at ", 1)[1].split()[0]


def main() -> int:
    sys.path.insert(0, str(REPO))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    root = HERE / "output" / stamp
    enclave, public = root / "enclave", root / "public"
    public.mkdir(parents=True)
    _section("0. The operator's signing key pair (phsafe keys generate)")
    _run("keys", "generate", enclave / "keys")
    ledgers = {label: enclave / label / "ledger.jsonl" for label in ("us", "pr")}
    # The witness is another party (in production: another host, another operator): its key and
    # its state are its own; it cosigns each ledger's public log only where it extends what it
    # cosigned before.
    witness = root / "witness"
    _section("1. The witness, a service of its own; the audit ledgers with their public logs, made before any data")
    _run("witness", "init", witness / "key", "--name", "witness.demo.example")
    service, url = _start_witness(witness / "key", witness / "state", witness / "logs")
    try:
        for label, ledger in ledgers.items():
            # The cap is the dataset's policy limit (room for more than one release): a second
            # release of the same records is refused by its own rule, not by the cap (step 4).
            _run("ledger", "init", ledger, "--lifetime-cap", "3",
                 "--reason", f"demo policy: the {label.upper()} demo dataset's lifetime privacy-loss limit",
                 "--log-name", f"demo.example/phsafe/privacy-loss/{label}", "--dataset", f"demo-{label}",
                 "--witness", url, witness / "key" / "witness.vkey")
            # The log's verifier key and its registration (its policy, naming its dataset) go to the
            # witness's operator (out of band): it witnesses the log from now on.
            _run("ledger", "registration", ledger, "--out", witness / "logs" / f"{label}.registration")
            shutil.copy(f"{ledger}.public-log/log.vkey", witness / "logs" / f"{label}.vkey")
        return _release_and_check(root, enclave, public, ledgers, witness)
    finally:
        service.terminate()
        service.wait(timeout=30)


def _release_and_check(root: Path, enclave: Path, public: Path, ledgers: dict[str, Path], witness: Path) -> int:
    from flows.sdhc import release_flow

    signing_key, public_key = enclave / "keys" / "signing-key.pem", enclave / "keys" / "public-key.pem"
    where = os.environ.get("PREFECT_API_URL") or "Prefect ephemeral mode (no server)"
    _section(f"2. The release flow (US and Puerto Rico) on the demo data, in {where}")
    summaries = release_flow(
        us_config=str(HERE / "data" / "us" / "config.json"), us_data=str(HERE / "data" / "us"),
        us_ledger=str(ledgers["us"]),
        pr_config=str(HERE / "data" / "pr" / "config.json"), pr_data=str(HERE / "data" / "pr"),
        pr_ledger=str(ledgers["pr"]),
        output_root=str(public), signing_key=str(signing_key), public_key=str(public_key),
        new_version="the bundled synthetic demo records",
    )
    _section("3. The auditors' check, offline: each ledger against its release and the public key")
    for label, summary in summaries.items():
        _run("audit", "verify", summary["ledger"], "--outputs", summary["outputs"], "--public-key", public_key)
        _run("audit", "report", summary["ledger"])
        frame = pd.read_csv(Path(summary["outputs"]) / "PH1_num" / "PH1_num.csv", sep="|", dtype={"REGION_ID": str})
        print(f"\n{label.upper()}: run {summary['run_id']} of dataset {summary['dataset']}, {summary['privacy_defn']} "
              f"total {amount_text(summary['total_budget'])}; PH1_num, first rows of {len(frame)}:")
        print(frame.head(6).to_string(index=False))
    _section("4. The same records again: refused before any spend (a content version is released once)")
    again = subprocess.run([str(PHSAFE), "-q", "private", str(HERE / "data" / "us" / "config.json"),
                            str(HERE / "data" / "us"), str(public / "again"), "--ledger", str(ledgers["us"])],
                           capture_output=True, text=True)
    print(again.stderr.strip().splitlines()[-1] if again.stderr.strip() else f"(exit {again.returncode})")
    if again.returncode == 0:
        raise SystemExit("the second release was not refused")

    _section("5. The public privacy-loss logs, published; an outsider checks each release with public files only")
    published_logs = public / "privacy-loss-logs"
    shutil.copy(witness / "key" / "witness.vkey", public / "witness.vkey")
    for label, summary in summaries.items():
        ledger = Path(summary["ledger"])
        shutil.copytree(f"{ledger}.public-log", published_logs / label)  # as a web server would serve it
    outsider = root / "outsider"  # the auditor's own machine: the checkpoints they saw are kept here
    for label, summary in summaries.items():
        print(f"\n{label.upper()}:", flush=True)
        _run_shown("audit", "public", summary["outputs"], "--key", published_logs / label / "log.vkey",
                   "--log", published_logs / label, "--witness-key", public / "witness.vkey",
                   "--state", outsider / "seen-checkpoints.json")

    print(f"\nDemo outputs: {root}")
    print(f"  PUBLIC (what is published)        {public}")
    for label, summary in summaries.items():
        print(f"    {label.upper()} release (tables, data package, manifest, log entry and proof)  {summary['outputs']}")
    print(f"    the public privacy-loss logs and the witness's key  {published_logs}  {public / 'witness.vkey'}")
    print(f"  WITNESS (another party: its key, its state, the logs it witnesses)  {witness}")
    print(f"  CONFIDENTIAL (stays with the data) {enclave}")
    for label, summary in summaries.items():
        ledger = Path(summary["ledger"])
        print(f"    {label.upper()} audit ledger and lineage key  {ledger}  {ledger}.key")
        print(f"    {label.upper()} public log's signing key      {ledger}.log.key")
        print(f"    {label.upper()} run work folder (validation reports, checkpoint)  {summary['work_folder']}")
        print(f"    {label.upper()} auditor's report             {ledger.parent / 'audit-report'}")
    for label, ledger in ledgers.items():
        print(f"    {label.upper()} JSON-lines log                {ledger.parent / 'phsafe-log.jsonl'}")
    print(f"  public key for the auditors    {public_key}")
    print("  Prefect artifacts (budget spends, validation, manifest, checkpoint) are in the run's")
    print("  ephemeral database; run against a server to browse them in the UI (docs/operations.md).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
