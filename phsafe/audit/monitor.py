"""``phsafe audit monitor``: follow a published privacy-loss log over time, as an outsider.

As Certificate Transparency monitors do, a monitor fetches a log again and again -- from a copy
of its folder or from any web server, with plain GETs of ``checkpoint`` then ``entries`` -- and
checks each fetch against what it saw before (its state file: the largest checkpoint seen per
log, with its tree's leaf hashes, and which log accounts each dataset). Each round runs the
outsider's check of the whole log (:func:`phsafe.audit.public.check_log`: the log key's
signature, the quorum of the log's own witness policy or more, the entries against the
checkpoint, the ledger's rules over every entry, the statement) and reports every finding of
:data:`phsafe.audit.public.FINDINGS`:

==========  ===================  ==================================================================
exit        finding              what it means
==========  ===================  ==================================================================
0           --                   all good
1           equivocation         two checkpoints signed by the log key that prove two histories
                                 (from the saved state, a witness's evidence, or a file): the
                                 evidence is printed, and kept in ``STATE.evidence/``
3           fork                 a checkpoint inconsistent with one seen before, not provable by
                                 itself (a state kept without leaf hashes)
4           rollback             an older view of the log than one seen before
5           quorum               fewer valid witness cosignatures than the quorum
6           stale                a counted cosignature older than ``--max-age`` (or future-dated)
7           over-cap             a spend past a dataset's (or the ledger-wide) cap
8           second-release       a run released a second time
9           rule                 another rule of the ledger broken by the entries
10          invalid              the log does not verify (signature, entries against checkpoint)
11          dataset-claimed      the log accounts a dataset another log already accounts: a new
                                 log for a known dataset spends its cap a second time (not once
                                 that log retired it publicly, naming this log or no successor)
12          unreadable           the log cannot be fetched or read
==========  ===================  ==================================================================

(2 is the command line's usage error.) With several findings, the exit status is the most
severe one's (the smallest number). Every finding is printed as one ``FAILED [class]: ...``
line on stderr, and, with ``--webhook URL``, POSTed as JSON in the shape of the Prefect alerts
(``{"subject", "body", "text"}``, which chat webhooks read, plus ``"findings"``: class, where,
message and any evidence) -- once per new set of findings when it runs with ``--interval``.

The monitor holds no key but the public ones and reads only public files: it is a pure function
of what the log publishes, what the witnesses serve and what it saw before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from phsafe import durable
from phsafe.audit.public import (
    DEFAULT_MAX_AGE,
    FINDINGS,
    LogCheck,
    read_log_key,
    read_witness_keys,
    check_log,
)
from phsafe.errors import TlogError, VerificationFailure
from phsafe.tlog import FileSeenLogs, parse_evidence
from phsafe.tlog.fetch import fetch_evidence, fetch_published_log

EXIT_STATUS = {"equivocation": 1, "fork": 3, "rollback": 4, "quorum": 5, "stale": 6, "over-cap": 7,
               "second-release": 8, "rule": 9, "invalid": 10, "dataset-claimed": 11, "unreadable": 12}
"""The monitor's exit status per finding class (0: none)."""
assert tuple(EXIT_STATUS) == FINDINGS

DATASET_KINDS = ("dataset-version", "cap-raised", "run-started")
"""Public entry types that name the dataset they account."""


@dataclass
class Round:
    """One round of the monitor: what it checked and what it found."""

    source: str
    origin: str
    lines: list[str] = field(default_factory=list)
    findings: list[VerificationFailure] = field(default_factory=list)
    evidence_kept: list[Path] = field(default_factory=list)

    @property
    def status(self) -> int:
        return min((EXIT_STATUS.get(f.finding or "rule", 9) for f in self.findings), default=0)

    def key(self) -> tuple[str, ...]:
        """What identifies this round's findings (a changed set alerts again)."""
        return tuple(sorted(f"{f.finding}: {f}" for f in self.findings))


def _entries(entries: Sequence[bytes]) -> list[dict[str, Any]]:
    out = []
    for data in entries:
        try:
            entry = json.loads(data)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def datasets_named(entries: Sequence[bytes]) -> set[str]:
    """The datasets a log accounts: those its policy declares, and those its entries name
    (versions, cap raises, runs)."""
    names: set[str] = set()
    for entry in _entries(entries):
        if entry.get("type") == "policy" and isinstance(entry.get("datasets"), list):
            names.update(n for n in entry["datasets"] if isinstance(n, str))
        if entry.get("type") in DATASET_KINDS and isinstance(entry.get("dataset"), str):
            names.add(entry["dataset"])
    return names


def retirements_named(entries: Sequence[bytes]) -> dict[str, str | None]:
    """The datasets a log retired, each with the successor it named (``origin (key ID hex)``)."""
    out: dict[str, str | None] = {}
    for entry in _entries(entries):
        if entry.get("type") == "dataset-retired" and isinstance(entry.get("dataset"), str):
            successor = entry.get("successor")
            out[entry["dataset"]] = (f"{successor.get('origin')} (key ID {successor.get('key_id')})"
                                     if isinstance(successor, dict) else None)
    return out


def check_claims(check: LogCheck, verifier: Any, store: FileSeenLogs, where: str) -> list[VerificationFailure]:
    """Which log accounts each dataset: a dataset this log names that another log already
    accounts is a finding -- unless that log retired it publicly (a ``dataset-retired`` entry
    seen by this monitor) naming this log as its successor, or no successor. The others are kept
    as this log's, and its own retirements are kept (once its checkpoint verified with its quorum
    and nothing more severe was found). A dataset this log retired is not its claim any more."""
    if check.published is None:
        return []
    origin = verifier.name
    me = f"{origin} (key ID {verifier.key_id:08x})"
    claims, retired = store.claims(), store.retirements()
    mine = retirements_named(check.published.entries)
    findings, new = [], {}
    for name in sorted(datasets_named(check.published.entries)):
        other = claims.get(name)
        if name in mine or other == origin:
            continue
        if other is None:
            new[name] = origin
            continue
        by_other = [item for item in retired.get(name, []) if item["by"] == other]
        if by_other and by_other[-1]["successor"] in (None, me):
            new[name] = origin  # retired publicly by the log that held it: this one takes it over
            continue
        if by_other:
            findings.append(VerificationFailure(where, f"dataset {name} is accounted in this log ({me}) and was retired by "
                                                f"the log {other} in favour of another log, {by_other[-1]['successor']}",
                                                finding="dataset-claimed"))
            continue
        findings.append(VerificationFailure(where, f"dataset {name} is accounted in this log ({origin}) and already in the log "
                                            f"{other}: a second log for a dataset spends its lifetime cap a second time; "
                                            "the first log must be retired publicly, recorded in it, before another "
                                            "accounts the dataset", finding="dataset-claimed"))
    severe = {"equivocation", "fork", "rollback", "quorum", "invalid", "unreadable"}
    if not any(f.finding in severe for f in check.findings):
        for name, successor in mine.items():
            store.retire(name, origin, successor)
        if new and not findings:
            store.claim(new)
    return findings


def _keep_evidence(state_file: Path, data: bytes) -> Path | None:
    """Keep evidence beside the state (``STATE.evidence/``), durably; returns its path."""
    try:
        evidence = parse_evidence(data)
    except TlogError:
        return None
    folder = state_file.with_name(state_file.name + ".evidence")
    path = folder / evidence.name()
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            durable.fsync_folder(folder.parent)
        if not path.exists():
            durable.create(path, data, mode=0o644)
    except OSError:
        return None
    return path


def monitor_once(source: str | Path, key: Path, *, state_file: Path, witness_keys: Sequence[Path] = (),
                 quorum: int | None = None, no_witness: bool = False, evidence_sources: Sequence[str] = (),
                 max_age: timedelta = DEFAULT_MAX_AGE, now: float | None = None, transport: Any = None) -> Round:
    """One round: fetch the log, check it against the state, keep what is new.

    Raises:
        VerificationFailure: The keys or options given are not usable (before anything is fetched).
    """
    verifier = read_log_key(Path(key))
    witnesses = read_witness_keys(witness_keys)
    if not witnesses and not no_witness:
        raise VerificationFailure("--witness-key", "give the witnesses' verifier keys (--witness-key VKEY, one per witness), or "
                    "--no-witness (the output says what a check without them cannot rule out)")
    if witnesses and no_witness:
        raise VerificationFailure("--no-witness", "is given with --witness-key: choose one")
    report = Round(str(source), verifier.name)
    documents: list[tuple[str, bytes]] = []
    for evidence_source in evidence_sources:
        try:
            documents += fetch_evidence(evidence_source, transport=transport)
        except TlogError as exc:
            report.lines.append(f"evidence: {evidence_source} could not be read ({exc}); asked again next round")
    try:
        checkpoint, entries = fetch_published_log(source, transport=transport)
    except TlogError as exc:
        report.findings.append(VerificationFailure(str(source), str(exc), finding="unreadable"))
        return report
    store = FileSeenLogs(state_file)
    check = check_log(checkpoint, entries, verifier, where=str(source), witnesses=witnesses, quorum=quorum,
                      no_witness=no_witness, seen=store, evidence=documents, max_age=max_age, now=now)
    report.lines += check.lines
    report.findings += check.findings
    report.findings += check_claims(check, verifier, store, str(source))
    for finding in report.findings:
        if finding.evidence is not None:
            kept = _keep_evidence(state_file, finding.evidence)
            if kept is not None:
                report.evidence_kept.append(kept)
    report.findings.sort(key=lambda f: EXIT_STATUS.get(f.finding or "rule", 9))  # the most severe first
    if no_witness:
        report.lines.append("witnesses: none checked (--no-witness): a split view -- this log showing this monitor "
                            "another history than it shows others -- is caught only by comparing checkpoints with them")
    return report


def alert(url: str, report: Round, *, transport: Any = None) -> str | None:
    """POST the round's findings to ``url`` (JSON: subject, body, text -- as the Prefect alerts --
    and the findings); returns why it failed, or None."""
    import httpx

    subject = (f"phsafe audit monitor: {len(report.findings)} finding(s) on the public log {report.origin} "
               f"(exit {report.status})")
    body = "\n".join([f"Log: {report.source}"] + [f"[{f.finding}] {f}" for f in report.findings]
                     + [f"Evidence kept: {p}" for p in report.evidence_kept])
    payload = {"subject": subject, "body": body, "text": f"{subject}\n{body}",
               "log": report.source, "origin": report.origin, "status": report.status,
               "checked_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "findings": [{"class": f.finding, "where": f.where, "message": f.reason,
                             "evidence": json.loads(f.evidence) if f.evidence else None} for f in report.findings]}
    try:
        with httpx.Client(timeout=30.0, transport=transport, trust_env=False) as client:
            reply = client.post(url, json=payload)
    except httpx.HTTPError as exc:
        return f"the webhook {url} could not be reached ({type(exc).__name__})"
    if reply.status_code >= 400:
        return f"the webhook {url} answered HTTP {reply.status_code}"
    return None


def monitor(source: str | Path, key: Path, *, state_file: Path, show: Callable[[Round], None],
            interval: float | None = None, webhook: str | None = None, rounds: int | None = None,
            sleep: Callable[[float], None] = time.sleep, **options: Any) -> int:
    """Run rounds (one, or every ``interval`` seconds until stopped or ``rounds`` are done);
    ``show`` prints each. Returns the last round's exit status."""
    last_key: tuple[str, ...] | None = None
    done, status = 0, 0
    while True:
        report = monitor_once(source, key, state_file=state_file, **options)
        status = report.status
        if webhook and report.findings and report.key() != last_key:
            failed = alert(webhook, report, transport=options.get("transport"))
            if failed:
                report.lines.append(f"alert: {failed}")
        last_key = report.key() if report.findings else None
        show(report)
        done += 1
        if interval is None or (rounds is not None and done >= rounds):
            return status
        sleep(interval)
