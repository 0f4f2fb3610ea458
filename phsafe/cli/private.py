"""``phsafe private CONFIG DATA OUT``: the private run (spec §8), a thin layer over the engine."""

from __future__ import annotations

from pathlib import Path

import click

from phsafe import logs
from phsafe.cli._common import EXISTING, PATH, fail, log_option, parse_cap


@click.command()
@click.argument("config", type=EXISTING)
@click.argument("data", type=EXISTING)
@click.argument("output", type=PATH)
@click.option("-v", "--validate", "validate_inputs", is_flag=True, help="Validate the inputs first.")
@click.option("-vo", "--validate-private-output", "validate_outputs", is_flag=True,
              help="Validate the output tables before publishing them.")
@log_option
@click.option("--ledger", type=PATH, default=None,
              help="Audit ledger (JSON Lines). Default: phsafe-ledger/ledger.jsonl in the working directory.")
@click.option("--lifetime-cap", default=None,
              help="Lifetime privacy-loss cap of this dataset (default: this run's planned total).")
@click.option("--cap-reason", default=None, help="Why the cap is raised (recorded in the ledger).")
@click.option("--signing-key", type=EXISTING, default=None,
              help="Ed25519 private key (PEM) to sign the ledger checkpoint.")
@click.option("--non-confidential", is_flag=True,
              help="Declare the data synthetic/non-confidential (allows Infinity budgets).")
@click.option("--truncation-key", default=None, help="Replay a run with its recorded truncation key (hex).")
@click.option("--resume", "resume_run_id", default=None, metavar="RUN_ID",
              help="Resume the failed run RUN_ID (same CONFIG, DATA and OUTPUT): its committed "
                   "measurements are reused, the rest are new spends.")
@click.option("--resume-reason", default=None, help="Why the run is resumed (recorded in the ledger).")
def private(config: Path, data: Path, output: Path, validate_inputs: bool, validate_outputs: bool,
            log_file: Path | None, ledger: Path | None, lifetime_cap: str | None, cap_reason: str | None,
            signing_key: Path | None, non_confidential: bool, truncation_key: str | None,
            resume_run_id: str | None, resume_reason: str | None) -> None:
    """Run PHSafe on DATA with CONFIG and publish the eleven tables to OUTPUT."""
    logs.configure(log_file)
    try:
        from phsafe.engine import DEFAULT_LEDGER, PrivateRunOptions, run_private

        options = PrivateRunOptions(
            ledger=ledger or DEFAULT_LEDGER, lifetime_cap=parse_cap(lifetime_cap),
            cap_reason=cap_reason, signing_key=signing_key, non_confidential=non_confidential,
            validate_inputs=validate_inputs, validate_outputs=validate_outputs,
            truncation_key=truncation_key, resume_reason=resume_reason,
        )
        result = run_private(config, data, output, options, run_id=resume_run_id, resume=resume_run_id is not None)
    except click.BadParameter:
        raise
    except Exception as exc:  # noqa: BLE001
        fail(exc, log_file)
        return
    click.echo(f"phsafe: published {len(result.files)} files to {result.output_dir} (run {result.run_id})")
