"""The ``phsafe audit`` command group (mounted by :mod:`phsafe.cli` as ``main.add_command(audit)``).

``phsafe audit verify LEDGER [--checkpoint FILE]... [--public-key KEY] [--outputs DIR]`` exits 0 only
if everything holds and nothing needs the operator; 3 if everything holds but the operator must
act (each action printed with the command that does it); otherwise it prints the first failing
entry or file and why, and exits 1.

``phsafe audit public [OUT] --key VKEY --witness-key VKEY... [--log LOG]`` checks a release, the
published log, or both, with public files only (:mod:`phsafe.audit.public`); the same exit rule.
``phsafe audit evidence SOURCE... --key VKEY`` checks evidence of equivocation offline (exit 1: it
proves the log signed two histories).

``phsafe audit monitor LOG --key VKEY (--witness-key VKEY... | --no-witness) --state FILE [--once |
--interval S]`` follows a published log (:mod:`phsafe.audit.monitor`); a distinct exit status per
class of finding (0: all good).

``phsafe audit report LEDGER [--out DIR] [--overwrite]`` writes ``audit_report.md`` and ``audit_report.html``
(confidential; by default into ``audit-report/`` beside the ledger).

``phsafe audit empirical [--tables T,...] [--mode quick|full] [--budget-scale K] [--seed S] [--out DIR]``
runs the release code on generated neighbouring datasets and bounds its privacy loss from below
(:mod:`phsafe.audit.empirical`); it writes ``audit.json`` and ``audit.html`` and exits 1 on a
VIOLATION, an EXCESS or a failed check. It reads no input data.
"""

from __future__ import annotations

from datetime import datetime, timezone
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
@click.option("--work-dir", type=_DIR, default=None, metavar="DIR",
              help="Where the runs' work folders are, if the runs were given --work-dir (default: runs/ beside "
                   "the ledger).")
@handle_errors
def verify_command(ledger: Path, checkpoints: tuple[Path, ...], public_key: Path | None, outputs: Path | None,
                   lineage_key: Path | None, work_dir: Path | None) -> None:
    """Recompute the ledger's chain and check checkpoints, caps and outputs.

    Exits 0 if everything holds and nothing needs the operator; 3 if everything holds but the
    operator must act (an interrupted write or repair to finish, a finished run's leftovers, a
    release without its public log files, a public log behind the ledger or short of its
    quorum), printing each action with the command that does it; otherwise prints the first
    failing entry or file and why and exits 1.
    """
    from phsafe.audit.verify import verify

    try:
        result = verify(ledger, checkpoints=checkpoints, public_key=public_key, outputs=outputs,
                        lineage_key=lineage_key, work_dir=work_dir)
    except VerificationFailure as exc:
        click.echo(f"FAILED: {exc}", err=True)
        raise SystemExit(1) from None
    for note in result.notes:
        click.echo(note)
    for action in result.actions:
        click.echo(f"ACTION NEEDED: {action}")
    if result.actions:
        raise SystemExit(result.exit_status)
    click.echo("OK")


def _log_source(ctx: click.Context, param: click.Parameter, value: str | None) -> str | Path | None:
    """--log / LOG: a published log's folder, or its http(s) URL."""
    if value is None:
        return None
    from phsafe.tlog.fetch import is_url

    if is_url(value):
        return value.rstrip("/")
    path = Path(value)
    if not path.is_dir():
        raise click.BadParameter(f"{value!r} is neither a folder nor an http(s) URL of a published log")
    return path


def _evidence_documents(sources: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """The evidence documents of each --evidence source (a file, a folder, a witness's URL)."""
    from phsafe.errors import PHSafeError, TlogError
    from phsafe.tlog.fetch import fetch_evidence

    documents = []
    for source in sources:
        try:
            documents += fetch_evidence(source)
        except TlogError as exc:
            raise PHSafeError(f"--evidence {source}: {exc}") from None
    return documents


def _show_failure(exc: VerificationFailure) -> None:
    """``FAILED: ...`` on stderr; evidence of equivocation, when that is what failed, on stdout."""
    if exc.evidence is not None:
        click.echo(exc.evidence.decode("utf-8"), nl=False)
    click.echo(f"FAILED: {exc}", err=True)


_EVIDENCE_HELP = ("Evidence of equivocation to check against the log's key: an evidence file, a folder of them, or "
                  "the URL of a witness (its GET /evidence); may be repeated.")


@audit.command("public")
@click.argument("out", type=_DIR, required=False)
@click.option("--key", "key", type=_FILE, required=True, metavar="VKEY",
              help="The public log's verifier key (one line), obtained from the publisher, not from OUT.")
@click.option("--log", "log", default=None, metavar="LOG", callback=_log_source,
              help="The published log: a copy of its folder, or its URL (fetched with plain GETs): check the whole "
                   "log, its consistency with the checkpoint seen before, and every dataset's privacy-loss "
                   "statement. Without OUT, the log alone.")
@click.option("--witness-key", "witness_keys", type=_FILE, multiple=True, metavar="VKEY",
              help="A witness's verifier key, obtained from the witness; may be repeated. Checkpoints need "
                   "cosignatures from the log's own quorum of them, or --witness-quorum. Required unless --no-witness.")
@click.option("--no-witness", is_flag=True,
              help="Check without witnesses; the output says what such a check cannot rule out.")
@click.option("--max-age", "max_age", default="7d", show_default=True, metavar="AGE",
              help="Refuse the log's checkpoint as stale when a counted cosignature is older (e.g. 36h, 7d).")
@click.option("--witness-quorum", type=click.IntRange(min=0), default=None, metavar="K",
              help="How many of the --witness-key witnesses must have cosigned: at least the log's policy quorum "
                   "(its default; fewer, or 0, is refused). Without --log: all the keys given by default, and more "
                   "than half of them.")
@click.option("--state", "state_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="Where the last checkpoint seen of each log is kept "
                                   "(default: $XDG_CONFIG_HOME/phsafe/public-log-checkpoints.json).")
@click.option("--evidence", "evidence", multiple=True, metavar="SOURCE", help=_EVIDENCE_HELP)
@handle_errors
def public_command(out: Path | None, key: Path, log: str | Path | None, witness_keys: tuple[Path, ...],
                   no_witness: bool, max_age: str, witness_quorum: int | None, state_file: Path | None,
                   evidence: tuple[str, ...]) -> None:
    """Check the release OUT, or the published log alone, with public files only: what an
    outsider can verify.

    The release's proof (its log entry is in the log, as a checkpoint signed by the log key --
    and cosigned by the witnesses -- says), its manifest's and every table file's digest, and
    that every VARIANCE is the one the logged spends imply. With --log (a folder or a URL), the
    whole log: its checkpoint and the quorum of its own policy, its consistency with the
    checkpoint seen before, the ledger's rules over every entry, and each dataset's statement:
    releases, failures, total spent, cap, left. Two checkpoints of the log that prove two
    histories (from the state, a witness or a file) are printed as evidence. Exits 0 only if
    everything holds; else prints one line (and any evidence) and exits 1.
    """
    from phsafe.audit.public import audit_public

    if out is None and log is None:
        raise click.UsageError("give a release folder OUT, the published log (--log LOG), or both")
    try:
        lines = audit_public(out, key, log=log, witness_keys=witness_keys, quorum=witness_quorum,
                             state_file=state_file, no_witness=no_witness, max_age=_age(max_age),
                             evidence=_evidence_documents(evidence))
    except VerificationFailure as exc:
        _show_failure(exc)
        raise SystemExit(1) from None
    for line in lines:
        click.echo(line)
    click.echo("OK")


@audit.command("evidence")
@click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")
@click.option("--key", "key", type=_FILE, required=True, metavar="VKEY",
              help="The log's verifier key (one line), obtained from its publisher.")
@handle_errors
def evidence_command(sources: tuple[str, ...], key: Path) -> None:
    """Check evidence of equivocation offline: does it prove the log's key signed two histories?

    SOURCE is an evidence file (phsafe-equivocation/1, as a witness keeps and serves it, or as
    audit public and audit monitor print and keep it), a folder of them, or a witness's URL.
    Evidence needs nothing but the log's key: both checkpoints carry valid signatures by it, and
    they are of one size with different roots, or a consistency proof ties the larger one to
    another prefix than the smaller. Exits 1 when one proves it (printing both checkpoints), 0
    when none does (saying why each proves nothing).
    """
    from phsafe.audit.public import read_log_key, check_evidence

    proved, notes = check_evidence(_evidence_documents(sources), read_log_key(key))
    for note in notes:
        click.echo(note)
    for failure in proved:
        _show_failure(failure)
    if proved:
        raise SystemExit(1)
    click.echo("no evidence of equivocation: nothing given proves the log signed two histories")


@audit.command("monitor")
@click.argument("log", metavar="LOG", callback=_log_source)
@click.option("--key", "key", type=_FILE, required=True, metavar="VKEY",
              help="The public log's verifier key (one line), obtained from the publisher.")
@click.option("--witness-key", "witness_keys", type=_FILE, multiple=True, metavar="VKEY",
              help="A witness's verifier key, obtained from the witness; may be repeated. Required unless "
                   "--no-witness.")
@click.option("--no-witness", is_flag=True,
              help="Monitor without witnesses; the output says what that cannot rule out.")
@click.option("--witness-quorum", type=click.IntRange(min=0), default=None, metavar="K",
              help="How many of the witnesses must have cosigned: at least the log's policy quorum (its default).")
@click.option("--state", "state_file", type=click.Path(dir_okay=False, path_type=Path), required=True,
              metavar="FILE", help="The monitor's memory: the largest checkpoint seen of each log (with its leaf "
                                   "hashes) and which log accounts each dataset; evidence found is kept in "
                                   "FILE.evidence/.")
@click.option("--once", "once", is_flag=True, help="One check, then its exit status (the default).")
@click.option("--interval", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Check again every SECONDS until stopped (SIGINT, SIGTERM); alerts once per new set of findings.")
@click.option("--max-age", "max_age", default="7d", show_default=True, metavar="AGE",
              help="A finding when a counted cosignature of the log's checkpoint is older (e.g. 36h, 7d).")
@click.option("--evidence", "evidence", multiple=True, metavar="SOURCE", help=_EVIDENCE_HELP)
@click.option("--webhook", default=None, metavar="URL",
              help="POST each new set of findings here as JSON (subject, body, text -- as the Prefect alerts -- and "
                   "the findings).")
@handle_errors
def monitor_command(log: str | Path, key: Path, witness_keys: tuple[Path, ...], no_witness: bool,
                    witness_quorum: int | None, state_file: Path, once: bool, interval: float | None, max_age: str,
                    evidence: tuple[str, ...], webhook: str | None) -> None:
    """Follow the published log LOG (a folder, or its URL fetched with plain GETs) and report
    what an outsider must know.

    Each round checks the whole log as `audit public --log` does -- against the checkpoint seen
    before (kept in --state) and the quorum of the log's own witness policy -- and reports every
    finding: equivocation (exit 1, with the evidence), a fork (3), a rollback (4), a quorum not
    met (5), a stale checkpoint (6), a spend past a cap (7), a second release of one run (8),
    another rule broken (9), a log that does not verify (10), a dataset another log already
    accounts (11), a log that cannot be fetched (12). Exit 0: all good. The exit status is the
    most severe finding's (of the last round, with --interval).
    """
    from phsafe.audit.monitor import monitor

    if once and interval is not None:
        raise click.UsageError("--once and --interval: choose one")

    def show(report) -> None:  # noqa: ANN001 -- a monitor Round
        if interval is not None:
            click.echo(f"-- {datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')} {report.source}")
        for line in report.lines:
            click.echo(line)
        for finding in report.findings:
            if finding.evidence is not None:
                click.echo(finding.evidence.decode("utf-8"), nl=False)
            click.echo(f"FAILED [{finding.finding}]: {finding}", err=True)
        for path in report.evidence_kept:
            click.echo(f"evidence kept: {path}")
        click.echo("OK" if not report.findings else f"exit {report.status}")

    try:
        status = monitor(log, key, state_file=state_file, show=show, interval=interval, webhook=webhook,
                         witness_keys=witness_keys, quorum=witness_quorum, no_witness=no_witness,
                         evidence_sources=evidence, max_age=_age(max_age))
    except VerificationFailure as exc:
        click.echo(f"FAILED: {exc}", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(0) from None
    if status:
        raise SystemExit(status)


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
