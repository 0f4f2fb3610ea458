"""The ``phsafe audit`` command group (mounted by :mod:`phsafe.cli` as ``main.add_command(audit)``).

``phsafe audit verify LEDGER [--checkpoint FILE]... [--public-key KEY] [--outputs DIR]`` exits 0 only
if everything holds; otherwise it prints the first failing entry or file and why, and exits 1.

``phsafe audit public OUT --key VKEY --witness-key VKEY... [--log LOG]`` checks a release with
public files only (:mod:`phsafe.audit.public`); the same exit rule.

``phsafe audit report LEDGER [--out DIR] [--overwrite]`` writes ``audit_report.md`` and ``audit_report.html``
(confidential; by default into ``audit-report/`` beside the ledger).

``phsafe audit empirical [--tables T,...] [--mode quick|full] [--budget-scale K] [--seed S] [--out DIR]``
runs the release code on generated neighbouring datasets and bounds its privacy loss from below
(:mod:`phsafe.audit.empirical`); it writes ``audit.json`` and ``audit.html`` and exits 1 on a
VIOLATION, an EXCESS or a failed check. It reads no input data.
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import handle_errors
from phsafe.cli._output import overwrite_option
from phsafe.errors import LedgerError, ReportFolderExists, VerificationFailure

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


@click.group()
def audit() -> None:
    """Verify the privacy-loss ledger and report on it, offline."""


@audit.command("verify")
@click.argument("ledger", type=_FILE)
@click.option("--checkpoint", "checkpoints", type=_FILE, multiple=True,
              help="Checkpoint JSON (or a manifest holding one) to check; may be repeated.")
@click.option("--public-key", type=_FILE, help="The operator's Ed25519 public key (PEM) to trust.")
@click.option("--outputs", type=_DIR, help="Output directory to check against the ledger.")
@click.option("--lineage-key", type=_FILE, default=None,
              help="The ledger's lineage key (default: LEDGER.key beside the ledger, if there).")
@handle_errors
def verify_command(ledger: Path, checkpoints: tuple[Path, ...], public_key: Path | None, outputs: Path | None,
                   lineage_key: Path | None) -> None:
    """Recompute the ledger's chain and check checkpoints, caps and outputs.

    Exits 0 only if everything holds; otherwise prints the first failing entry or file and why
    and exits 1.
    """
    from phsafe.audit.verify import verify

    try:
        result = verify(ledger, checkpoints=checkpoints, public_key=public_key, outputs=outputs,
                        lineage_key=lineage_key)
    except VerificationFailure as exc:
        click.echo(f"FAILED: {exc}", err=True)
        raise SystemExit(1) from None
    for note in result.notes:
        click.echo(note)
    click.echo("OK")


@audit.command("public")
@click.argument("out", type=_DIR)
@click.option("--key", "key", type=_FILE, required=True, metavar="VKEY",
              help="The public log's verifier key (one line), obtained from the publisher, not from OUT.")
@click.option("--log", "log", type=_DIR, default=None, metavar="LOG",
              help="A copy of the published log folder (checkpoint, entries): check the whole log, its "
                   "consistency with the checkpoint seen before, and every dataset's privacy-loss statement.")
@click.option("--witness-key", "witness_keys", type=_FILE, multiple=True, metavar="VKEY",
              help="A witness's verifier key, obtained from the witness; may be repeated. Checkpoints need "
                   "cosignatures from --witness-quorum of them (default: all). Required unless --no-witness.")
@click.option("--no-witness", is_flag=True,
              help="Check without witnesses; the output says what such a check cannot rule out.")
@click.option("--max-age", "max_age", default="7d", show_default=True, metavar="AGE",
              help="Refuse the log's checkpoint as stale when a counted cosignature is older (e.g. 36h, 7d).")
@click.option("--witness-quorum", type=click.IntRange(min=0), default=None, metavar="K",
              help="How many of the --witness-key witnesses must have cosigned (default: all of them).")
@click.option("--state", "state_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="Where the last checkpoint seen of each log is kept "
                                   "(default: $XDG_CONFIG_HOME/phsafe/public-log-checkpoints.json).")
@handle_errors
def public_command(out: Path, key: Path, log: Path | None, witness_keys: tuple[Path, ...], no_witness: bool,
                   max_age: str, witness_quorum: int | None, state_file: Path | None) -> None:
    """Check the release OUT with public files only: what an outsider can verify.

    The release's proof (its log entry is in the log, as a checkpoint signed by the log key --
    and cosigned by the witnesses -- says), its manifest's and every table file's digest, and
    that every VARIANCE is the one the logged spends imply. With --log, the whole log, its
    consistency with the checkpoint seen before, and each dataset's statement: releases, total
    spent, cap, left. Exits 0 only if everything holds; else prints one line and exits 1.
    """
    from phsafe.audit.public import audit_public

    try:
        lines = audit_public(out, key, log=log, witness_keys=witness_keys, quorum=witness_quorum,
                             state_file=state_file, no_witness=no_witness, max_age=_age(max_age))
    except VerificationFailure as exc:
        click.echo(f"FAILED: {exc}", err=True)
        raise SystemExit(1) from None
    for line in lines:
        click.echo(line)
    click.echo("OK")


@audit.command("report")
@click.argument("ledger", type=_FILE)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for audit_report.md and audit_report.html (default: audit-report/ beside the ledger; "
         "the report is confidential).",
)
@overwrite_option
@handle_errors
def report_command(ledger: Path, out: Path | None, overwrite: bool) -> None:
    """Write the auditors' report (Markdown and HTML) of a verified ledger: CONFIDENTIAL."""
    from phsafe.audit.report import write_report

    try:
        md, page = write_report(ledger, out, overwrite=overwrite)
    except LedgerError as exc:
        click.echo(f"FAILED: the ledger does not verify ({exc}); run `phsafe audit verify`", err=True)
        raise SystemExit(1) from None
    except ReportFolderExists as exc:
        click.echo(f"phsafe: error: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"wrote {md} (confidential: keep it with the ledger)")
    click.echo(f"wrote {page}")


@audit.command("empirical", context_settings={"allow_extra_args": True})
@click.option("--tables", "tables", multiple=True, metavar="T[,T...]",
              help="Tables to audit, comma-separated or repeated (default: the nine measured tables).")
@click.option("--mode", type=click.Choice(["quick", "full"]), default="quick", show_default=True,
              help="quick: PH1_num, PH2, PH3, PH4, PH7 at production budgets, PH6 at x10 and the unit tables at "
                   "x100 (marked as scaled); full: every table at production budgets (hours).")
@click.option("--budget-scale", type=click.FloatRange(min=0, min_open=True), default=None, metavar="K",
              help="Multiply every audited table's budgets by K (overrides the mode's scales; rows are marked).")
@click.option("--seed", type=click.IntRange(min=0), default=None, metavar="S",
              help="Seed of the generated data and of the canaries' coins (default: a fresh one, recorded). "
                   "Never seeds the noise or the truncation keys.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("empirical-audit"),
              show_default=True, help="Folder for audit.json, audit.html and its plots.")
@click.option("--config", "config_path", type=_FILE, default=None, metavar="CONFIG",
              help="Audit the budgets, tau and states of this config.json (default: the production US run's).")
@click.option("--runs", type=click.IntRange(min=2), default=None, metavar="N",
              help="Runs of every table instead of the planned number (fewer runs: wider bounds).")
@click.option("--sensitivity", type=click.Choice(["paper", "exact", "both"]), default=None,
              help="The calibration audited: the paper's sensitivities (2 tau + 2, 2), the exact ones "
                   "(docs/sensitivity.md), or both side by side (default: what the config says).")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Processes running the audit's runs (default: one per core of this machine).")
@click.option("--alpha", type=click.FloatRange(min=0, max=0.5, min_open=True), default=0.05, show_default=True,
              help="Family-wise probability of a false VIOLATION or EXCESS (and of a false WEAK), per calibration.")
@click.option("--check-alpha", type=click.FloatRange(min=0, max=0.5, min_open=True), default=1e-3,
              show_default=True, help="Family-wise probability that correct code fails a statistical check.")
@overwrite_option
@click.pass_context
@handle_errors
def empirical_command(ctx: click.Context, tables: tuple[str, ...], mode: str, budget_scale: float | None,
                      seed: int | None, out: Path, config_path: Path | None, runs: int | None,
                      sensitivity: str | None, workers: int | None, alpha: float, check_alpha: float,
                      overwrite: bool) -> None:
    """Audit the release code empirically: a lower bound on its privacy loss, on generated data.

    Runs the release path of `phsafe private` (fresh truncation key per run, truncation,
    tabulation, OpenDP's noise) many times on neighbouring datasets it generates -- canary
    households in or out -- and bounds mu (Gaussian DP) and epsilon from below and above, per
    table and level. Verdicts: VIOLATION (more loss than declared), EXCESS (more than correct
    code can show), WEAK (less signal than correct code gives), INCONCLUSIVE (the bounds hold
    both 0 and the declared value), PASS; plus residual and white-box checks. Exits 1 on a
    VIOLATION, an EXCESS or a failed check.

    It takes no input data and refuses any: the audit publishes residuals, exact functions of
    the records it runs on, so it only runs on records it made.
    """
    import secrets

    from phsafe.audit.empirical import AuditSettings, default_workers, run_audit, write_report
    from phsafe.cli._output import command_progress, result_line
    from phsafe.config import load_config
    from phsafe.errors import PHSafeError
    from phsafe._plots import report_folder

    if ctx.args:
        raise click.UsageError(
            "phsafe audit empirical takes no input data (got " + " ".join(ctx.args[:2]) + "): it generates its own "
            "records -- a synthetic background and canary households -- and runs the release code on them. Inputs, "
            "confidential or not, are refused: the audit's report holds exact residuals, which are functions of "
            "the records it ran on.")
    names = tuple(t.strip() for item in tables for t in item.split(",") if t.strip())
    seed = secrets.randbelow(2**31) if seed is None else seed
    options = {"mode": mode, "budget_scale": budget_scale, "seed": seed, "runs": runs, "alpha": alpha,
               "check_alpha": check_alpha,
               "sensitivity": sensitivity, "workers": default_workers() if workers is None else workers}
    if names:
        options["tables"] = names
    if config_path is not None:
        options["config"] = load_config(config_path)
    try:
        settings = AuditSettings(**options)
    except ValueError as exc:
        raise PHSafeError(str(exc)) from None
    folder = report_folder(out, overwrite=overwrite, what="audit folder")
    with command_progress() as progress:
        progress.note(f"empirical audit, {mode} mode, seed {seed}, "
                      f"{' and '.join(b.value for b in settings.calibrations)} sensitivities, "
                      f"{settings.workers} process(es): generated data only")
        result = run_audit(settings, progress=progress)
    json_path, html_path = write_report(result, folder)
    for row in result.rows:
        if row.verdict not in ("PASS", "INCONCLUSIVE"):
            click.echo(f"{row.verdict}: {row.table} {row.level} ({row.sensitivity} sensitivities)", err=True)
    for check in result.checks:
        if check.status == "FAIL":
            where = f"{check.table} {check.level}" + (f", {check.sensitivity} sensitivities" if check.sensitivity else "")
            click.echo(f"FAILED CHECK: {check.name} ({where}): {check.detail}", err=True)
    inconclusive = sum(r.verdict == "INCONCLUSIVE" for r in result.rows)
    result_line(f"{result.verdict}: wrote {html_path} and {json_path.name} "
                f"({len(result.rows)} rows, {inconclusive} inconclusive; {result.seconds:,.0f} s, "
                f"{result.cpu_seconds:,.0f} CPU-s)")
    if result.failed:
        raise SystemExit(1)


def _age(text: str):  # noqa: ANN202 -- a timedelta
    """``7d``, ``36h``, ``90m``, ``3600s``: a duration."""
    import re
    from datetime import timedelta

    match = re.fullmatch(r"\s*(\d+)\s*([dhms])\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration such as 7d, 36h, 90m or 3600s", param_hint="--max-age")
    value, unit = int(match.group(1)), match.group(2)
    return timedelta(**{{"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}[unit]: value})
