"""The ``phsafe audit`` command group (mounted by :mod:`phsafe.cli` as ``main.add_command(audit)``).

``phsafe audit verify LEDGER [--checkpoint FILE]... [--public-key KEY] [--outputs DIR]`` exits 0 only
if everything holds; otherwise it prints the first failing entry or file and why, and exits 1.

``phsafe audit report LEDGER [--out DIR] [--overwrite]`` writes ``audit_report.md`` and ``audit_report.html``
(confidential; by default into ``audit-report/`` beside the ledger).
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.audit.report import write_report
from phsafe.audit.verify import VerificationFailure, verify
from phsafe.cli._common import handle_errors
from phsafe.cli._output import overwrite_option
from phsafe.errors import LedgerError, ReportFolderExists

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
    try:
        result = verify(ledger, checkpoints=checkpoints, public_key=public_key, outputs=outputs,
                        lineage_key=lineage_key)
    except VerificationFailure as exc:
        click.echo(f"FAILED: {exc}", err=True)
        raise SystemExit(1) from None
    for note in result.notes:
        click.echo(note)
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
