"""``phsafe private CONFIG DATA OUT``: the private run (spec §8), a thin layer over the engine."""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import EXISTING, EXISTING_FILE, PATH, fail, log_option, parse_amount, start
from phsafe.cli._output import command_progress, result_line, verbosity_options


@click.command()
@click.argument("config", type=EXISTING)
@click.argument("data", type=EXISTING)
@click.argument("output", type=PATH)
@click.option("--ledger", type=PATH, default=None, envvar="PHSAFE_LEDGER", show_envvar=True,
              help="The audit ledger, made once by `phsafe ledger init` (required for confidential data).")
@click.option("--dataset", default=None, metavar="NAME",
              help="The dataset this run spends against, e.g. cef2020-us (default: the config's \"dataset\").")
@click.option("--new-version", default=None, metavar="REASON",
              help="These records are a new content version of the dataset, and why (recorded).")
@click.option("--no-validate", "no_validate", is_flag=True,
              help="Skip the full input suites (recorded in the ledger); the config and file checks still run.")
@click.option("-v", "--validate", "validate_flag", is_flag=True,
              help="Validate the inputs first (the default; kept for the production release's scripts).")
@click.option("-vo", "--validate-private-output", "validate_outputs", is_flag=True,
              help="Validate the output tables before publishing them.")
@log_option
@click.option("--lifetime-cap", default=None, metavar="RHO",
              help="Raise the dataset's lifetime cap to RHO (epsilon for pure DP); needs --cap-reason.")
@click.option("--cap-reason", default=None, metavar="TEXT", help="Why the cap is raised (recorded in the ledger).")
@click.option("--signing-key", type=EXISTING_FILE, default=None, metavar="PEM",
              help="Ed25519 private key (PEM) that signs the ledger checkpoints.")
@click.option("--public-key", type=EXISTING_FILE, default=None, metavar="PEM",
              help="The operator's Ed25519 public key: the signing key must match it.")
@click.option("--work-dir", type=PATH, default=None, metavar="DIR",
              help="Folder of the runs' confidential work folders (default: runs/ beside the ledger).")
@click.option("--non-confidential", is_flag=True,
              help="Declare the data synthetic/non-confidential (Infinity budgets, a throwaway ledger).")
@click.option("--truncation-key", default=None, metavar="HEX",
              help="Replay a run with this truncation key -- non-confidential data only.")
@click.option("--resume", "resume_run_id", default=None, metavar="RUN_ID",
              help="Complete the failed run RUN_ID: its committed measurements are reused (no new noise), "
                   "the rest are new spends; OUT may be a new folder.")
@click.option("--resume-reason", default=None, metavar="TEXT", help="Why the run is resumed (recorded in the ledger).")
@click.option("--re-release", "re_release", default=None, metavar="REASON",
              help="Release records that the dataset already released (or is releasing) once more, and why "
                   "(recorded; the lifetime cap still applies). Without it such a run is refused before any spend.")
@verbosity_options
def private(config: Path, data: Path, output: Path, ledger: Path | None, dataset: str | None,
            new_version: str | None, no_validate: bool, validate_flag: bool, validate_outputs: bool,
            log_file: Path | None, lifetime_cap: str | None, cap_reason: str | None, signing_key: Path | None,
            public_key: Path | None, work_dir: Path | None, non_confidential: bool, truncation_key: str | None,
            resume_run_id: str | None, resume_reason: str | None, re_release: str | None) -> None:
    """Run PHSafe on DATA with CONFIG and publish the eleven tables to OUT.

    Checks everything first (config, ledger, keys, paths, space, inputs) and spends nothing
    if anything is wrong. The public release goes to OUT; the run's confidential work folder
    (validation reports, noisy vectors until published, the final checkpoint) is
    runs/<run id>/ beside the ledger.
    """
    if no_validate and validate_flag:
        raise click.UsageError("give either --validate or --no-validate")
    start(log_file)
    try:
        from phsafe.engine import PrivateRunOptions
        from phsafe.sequence import run_private

        options = PrivateRunOptions(
            ledger=ledger, dataset=dataset, new_version=new_version,
            lifetime_cap=parse_amount(lifetime_cap, "--lifetime-cap"), cap_reason=cap_reason,
            signing_key=signing_key, public_key=public_key, non_confidential=non_confidential,
            validate_inputs=not no_validate, validate_outputs=validate_outputs, work_dir=work_dir,
            truncation_key=truncation_key, resume_reason=resume_reason, re_release=re_release,
        )
        with command_progress(log_file) as progress:
            result = run_private(config, data, output, options, progress=progress, run_id=resume_run_id,
                                 resume=resume_run_id is not None)
    except click.ClickException:
        raise
    except Exception as exc:  # noqa: BLE001
        fail(exc, log_file)
        return
    throwaway = f"; throwaway ledger {result.ledger}" if ledger is None and non_confidential else ""
    result_line(f"phsafe: published {len(result.files)} files to {result.output_dir} (run {result.run_id}; "
                f"confidential work folder {result.run_dir}{throwaway})")
