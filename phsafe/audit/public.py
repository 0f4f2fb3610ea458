"""``phsafe audit public``: what a person outside the enclave can check, with public files only.

Given a release folder, the log's verifier key (obtained out of band, not from the folder), the
witnesses' verifier keys (required: without them -- ``--no-witness`` -- the check says in words
what it cannot rule out), and optionally the published log:

1. ``privacy-loss.tlog-proof`` verifies: its checkpoint is signed by the log key and cosigned by
   k of the n witness keys given (each cosignature's time is shown), and ``privacy-loss.entry``
   is the entry at its index;
2. the entry is a ``release`` entry whose ``manifest_sha256`` is the SHA-256 of ``manifest.json``;
   the manifest names the same run and dataset; every file listed in it has its digest, and the
   folder holds nothing else (besides the manifest and the two log files);
3. every released cell's VARIANCE (and NOISE_DISTRIBUTION) is exactly what the logged plan
   implies -- budget, sensitivity and the noise it gives -- and every measured domain has the
   logged number of cells (:func:`phsafe.audit.tables.verify_tables`, without the noisy digests,
   which are confidential);

and with ``--log``:

4. the log's checkpoint verifies (same keys and quorum); its entries hash to it; every
   cosignature counted for the quorum is younger than ``--max-age`` (a week by default) -- an
   older one is a *stale* view: the log may have moved on since;
5. the checkpoint agrees with the largest one this person saw of the log, kept in a small local
   state file with its tree's leaf hashes (:class:`phsafe.tlog.SeenCheckpoints`): a larger one
   must extend it; a smaller one is refused as a *rollback* (a prefix of what was seen: an older
   view) or a *fork* (not even a prefix), with both sizes and root hashes; the release's own
   checkpoint must be a prefix of the log's, and the release's entry in the log at its index;
6. the log's entries are read as the privacy-loss accounting they are (:func:`statement`), and
   each release is bound to what its run was charged: a run has at most one ``release`` (a
   declared re-release is a run of its own), and its release states exactly the dataset, the
   plan (every table x level: definition, budget, sensitivity, cells), the spends (every
   ``spend`` entry of the run, re-spends included) and the total its ``run-started`` and
   ``spend`` entries give; every run's ``spent_before`` is the odometer recomputed from the log,
   every start, resume and re-spend was within the dataset's cap (and the ledger-wide cap);
   then, per dataset: its releases, what runs spent without (yet) releasing -- failed runs (every
   spend) and open ones (their whole plan) -- the total, the cap and what is left.

Any mismatch raises :class:`~phsafe.errors.VerificationFailure`: one line naming what (the run,
the entry) and the difference.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any

from phsafe.amounts import Amount, add_amounts, amount_exceeds, format_exact, is_infinite, parse_exact, times
from phsafe.audit.tables import verify_tables
from phsafe.config import PrivacyDefinition
from phsafe.errors import (
    EquivocationError,
    ForkError,
    LedgerRuleViolation,
    QuorumPolicyError,
    RollbackError,
    TlogError,
    VerificationFailure,
)
from phsafe.ledger.format import FAILURE_CODES, FAILURE_STAGES, HEX64
from phsafe.ledger.policy import convert
from phsafe.ledger.rules import parse_planned
from phsafe.publog.log import ENTRY_FILE, PROOF_FILE, RELEASE_LOG_FILES
from phsafe.publog.projection import MANIFEST
from phsafe.reader import file_digest
from phsafe.tlog import (
    ALG_ED25519,
    CosignatureVerifier,
    Ed25519Verifier,
    FileSeenLogs,
    PublishedLog,
    SeenCheckpoints,
    SeenLogStore,
    VerifiedCheckpoint,
    VerifiedEvidence,
    WitnessPolicy,
    cosignature_timestamp,
    format_evidence,
    leaf_hash,
    parse_evidence,
    parse_tlog_proof,
    read_verifier_key,
    verifier_from_key,
    verify_checkpoint,
    verify_consistency,
    verify_evidence,
    verify_published_log,
    verify_tlog_proof,
)
from phsafe.tlog.fetch import fetch_published_log
from phsafe.tlog.policy import RULE
from phsafe.tlog.registration import DATASET_NAME

HEX8 = re.compile(r"[0-9a-f]{8}")

DEFAULT_MAX_AGE = timedelta(days=7)
"""How old the youngest counted cosignature of the log's checkpoint may be by default."""
CLOCK_SKEW = timedelta(minutes=10)
"""How far in the future a cosignature's time may be (clocks differ) before it is refused."""

UNWITNESSED = ("witnesses: none checked (--no-witness). Without a witness you trust, this check cannot rule out "
               "that the log showed you another history than it shows others (a split view), nor that the "
               "enclave's operator copied the ledger and spent a dataset's cap a second time on the copy: each "
               "copy's log verifies on its own; only witnesses, or comparing checkpoints with others, catch it")


def default_state_file() -> Path:
    """Where ``audit public`` keeps the checkpoints it saw: ``$XDG_CONFIG_HOME/phsafe/...``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "phsafe" / "public-log-checkpoints.json"


def _fail(where: str, reason: str, finding: str | None = None, evidence: bytes | None = None) -> VerificationFailure:
    return VerificationFailure(where, reason, finding=finding, evidence=evidence)


def read_log_key(path: Path) -> Ed25519Verifier:
    try:
        verifier = read_verifier_key(path)
    except TlogError as exc:
        raise _fail(str(path), f"is not a verifier key ({exc})") from None
    if verifier.alg != ALG_ED25519:
        raise _fail(str(path), "is a witness key, not a log key (give the log's key with --key)")
    return verifier  # type: ignore[return-value]


def read_witness_keys(paths: Sequence[Path]) -> list[CosignatureVerifier]:
    out = []
    for path in paths:
        try:
            verifier = read_verifier_key(path)
        except TlogError as exc:
            raise _fail(str(path), f"is not a verifier key ({exc})") from None
        if not isinstance(verifier, CosignatureVerifier):
            raise _fail(str(path), "is not a witness (cosignature/v1) key")
        out.append(verifier)
    return out


def _planned(items: Any, defn: str, where: str) -> dict[str, Any]:
    try:
        return parse_planned(items, PrivacyDefinition(defn))
    except (LedgerRuleViolation, ValueError) as exc:
        raise _fail(where, f"its plan is not a valid plan ({exc})") from None


def _utc(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = seconds // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def cosignature_times(verified: VerifiedCheckpoint) -> dict[str, int]:
    """The time each counted witness states it cosigned, by witness name."""
    out: dict[str, int] = {}
    for signature in verified.note.signatures:
        if signature.name in verified.cosigners:
            out[signature.name] = cosignature_timestamp(signature)
    return out


def _times_text(times_: dict[str, int], now: float) -> str:
    return "; ".join(f"{name} at {_utc(t)} ({_age(now - t)} ago)" if t <= now else f"{name} at {_utc(t)}"
                     for name, t in times_.items())


def _check_fresh(verified: VerifiedCheckpoint, where: str, max_age: timedelta, now: float) -> None:
    """Every cosignature counted for the quorum is younger than ``max_age``, and none is from
    the future (beyond the clock skew allowed)."""
    for name, stamp in cosignature_times(verified).items():
        if stamp - now > CLOCK_SKEW.total_seconds():
            raise _fail(where, f"the cosignature by {name} states the time {_utc(stamp)}, in the future: refused",
                        "stale")
        if now - stamp > max_age.total_seconds():
            raise _fail(where, f"stale: the cosignature by {name} is from {_utc(stamp)}, {_age(now - stamp)} ago, "
                        f"older than --max-age {_age(max_age.total_seconds())}: the log may have moved on since; "
                        "fetch it again, or ask its publisher to have it cosigned (`phsafe ledger cosign`)", "stale")


FINDINGS = ("equivocation", "fork", "rollback", "quorum", "stale", "over-cap", "second-release", "rule", "invalid",
            "dataset-claimed", "unreadable")
"""The classes of what a check of the public log can find, most severe first (the monitor's exit
statuses are in this order: :data:`phsafe.audit.monitor.EXIT_STATUS`):

==================  =============================================================================
equivocation        two checkpoints signed by the log key that prove two histories (evidence)
fork                a checkpoint inconsistent with one seen before, without evidence by itself
rollback            a smaller checkpoint after a larger one, a prefix of it: an older view
quorum              fewer valid witness cosignatures than the quorum (the log's, or more)
stale               a counted cosignature older than --max-age (or from the future)
over-cap            a spend past a dataset's cap (or the ledger-wide cap)
second-release      a run released a second time
rule                another rule of the ledger broken by the log's entries
invalid             the log does not verify: its signature, its entries against its checkpoint
dataset-claimed     a log accounts a dataset another log already accounts
unreadable          the log cannot be read or fetched
==================  =============================================================================
"""


_ACCOUNTING = ("over-cap", "second-release", "rule")
"""Findings of the log's accounting (its entries read as the ledger's rules read them)."""


@dataclass(frozen=True)
class LogPolicy:
    """The witness policy a log states (its ``policy`` entry, or a later ``log-bound``)."""

    witnesses: tuple[str, ...] | None
    """The witnesses' verifier keys; None when the log states no policy (a log of a ledger made
    before logs were bound to their ledgers, not bound since)."""
    quorum: int


def log_policy(entries: Sequence[bytes], where: str = "log") -> LogPolicy:
    """The witness policy ``entries`` state (read before the rest of the log is checked: the
    quorum an outsider applies is never below it)."""
    found = LogPolicy(None, 0)
    for index, data in enumerate(entries):
        try:
            e = json.loads(data)
            kind = e.get("type")
            if (index == 0 and kind == "policy" and "witnesses" in e) or kind == "log-bound":
                found = LogPolicy(tuple(str(v) for v in e["witnesses"]), int(e["quorum"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise _fail(f"{where}: entry {index}", "is not a public log entry", "rule") from None
    return found


def _resolve_quorum(given: Sequence[CosignatureVerifier], asked: int | None, policy: LogPolicy | None,
                    no_witness: bool) -> tuple[int, str]:
    """The quorum applied to the witness keys ``given``, and a line that says which policy it
    follows. The log's own policy is the floor (:meth:`phsafe.tlog.policy.WitnessPolicy.at_least`);
    without the log (a release alone), the keys given must form a policy of their own (K > N/2)."""
    if no_witness:
        if policy is not None and policy.witnesses:
            return 0, (f"log: its policy binds {len(policy.witnesses)} witness(es), quorum {policy.quorum}: not checked "
                       "(--no-witness)")
        return 0, ""
    if policy is None:
        try:
            k = WitnessPolicy.of(list(given), asked).quorum
        except QuorumPolicyError as exc:
            raise _fail("--witness-quorum", str(exc), "quorum") from None
        return k, (f"witnesses: {k} of the {len(given)} keys given must have cosigned; the log's own policy is not "
                   "checked without --log")
    if not policy.witnesses:
        raise _fail("--witness-key", "the log's policy binds no witness, so no witness cosigns its checkpoints: check it "
                    "with --no-witness, which says what that cannot rule out", "quorum")
    bound = [verifier_from_key(v) for v in policy.witnesses]
    keys = {v.public_key for v in bound}
    for witness in given:
        if witness.public_key not in keys:
            raise _fail(f"--witness-key {witness.name}", f"is not one of the {len(bound)} witnesses the log's policy binds "
                        f"({', '.join(v.name for v in bound)}): its cosignature is never asked for", "quorum")
    try:
        k = WitnessPolicy(tuple(bound), policy.quorum).at_least(asked)
    except QuorumPolicyError as exc:
        raise _fail("--witness-quorum", str(exc), "quorum") from None
    if len(given) < k:
        raise _fail("--witness-key", f"the log's policy needs {k} cosignatures and the keys of {len(given)} of its "
                    f"witnesses were given: give at least {k} (--witness-key, one per witness)", "quorum")
    raised = f" (raised from the policy's {policy.quorum}: {RULE})" if k > policy.quorum and asked is None else ""
    return k, (f"log: its policy binds {len(bound)} witness(es), quorum {policy.quorum}: "
               f"{', '.join(sorted(v.name for v in bound))}; {k} of the {len(given)} you gave must have cosigned{raised}")


def _evidence_failure(where: str, verified: VerifiedEvidence, found: str = "") -> VerificationFailure:
    """The failure that shows evidence of equivocation (its bytes ride along, to be printed)."""
    return _fail(where, f"equivocation: {verified.statement()}{' (' + found + ')' if found else ''} -- proof that the "
                 "log showed two histories, which no quorum with an honest witness can both have cosigned (the "
                 "evidence is printed; anyone can check it: phsafe audit evidence FILE --key VKEY)", "equivocation",
                 format_evidence(verified.evidence))


def check_evidence(documents: Sequence[tuple[str, bytes]], verifier: Ed25519Verifier) -> tuple[
        list[VerificationFailure], list[str]]:
    """Evidence of equivocation of the log of ``verifier`` among ``documents`` (where each came
    from, its bytes): the failures it proves, and a line for each document that proves nothing."""
    proved, notes = [], []
    for source, data in documents:
        try:
            evidence = parse_evidence(data)
            if evidence.origin != verifier.name:
                notes.append(f"evidence: {source} is about another log ({evidence.origin}); not this one's")
                continue
            proved.append(_evidence_failure(source, verify_evidence(evidence, verifier)))
        except TlogError as exc:
            notes.append(f"evidence: {source} proves nothing ({exc})")
    return proved, notes


@dataclass
class LogCheck:
    """What a check of a published log found: the lines verified, the findings (each a
    :class:`~phsafe.errors.VerificationFailure` with its ``finding``), and what was read."""

    lines: list[str] = field(default_factory=list)
    findings: list[VerificationFailure] = field(default_factory=list)
    published: PublishedLog | None = None
    statement: Statement | None = None

    def first(self) -> VerificationFailure | None:
        """The most severe finding (:data:`FINDINGS` order), or None."""
        ranked = sorted(self.findings, key=lambda f: FINDINGS.index(f.finding) if f.finding in FINDINGS else len(FINDINGS))
        return ranked[0] if ranked else None


def check_log(checkpoint: bytes, entries: bytes, verifier: Ed25519Verifier, *, where: str,
              witnesses: Sequence[CosignatureVerifier] = (), quorum: int | None = None, no_witness: bool = False,
              seen: SeenLogStore | None = None, evidence: Sequence[tuple[str, bytes]] = (),
              max_age: timedelta = DEFAULT_MAX_AGE, now: float | None = None) -> LogCheck:
    """Check a published log's two files (steps 4 to 6 of the module docstring) and collect
    every finding rather than stopping at the first where the checks are independent: a
    checkpoint short of its quorum is still compared with the one seen before (so a fork shows
    as one), but is not kept as seen.

    Args:
        checkpoint, entries: The files' bytes, as read or fetched.
        where: How the log is named in messages (its folder or URL).
        witnesses, quorum, no_witness: As :func:`audit_public`; the log's policy is the floor.
        seen: Where the largest checkpoint seen of each log is kept (None: nothing kept).
        evidence: Evidence documents given (a witness's, files), with where each came from.
    """
    now = time.time() if now is None else now
    result = LogCheck()
    try:
        published = verify_published_log(checkpoint, entries, verifier)
    except TlogError as exc:
        result.findings.append(_fail(where, str(exc), "invalid"))
        proved, notes = check_evidence(evidence, verifier)
        result.findings += proved
        result.lines += notes
        return result
    result.published = published
    try:
        policy = log_policy(published.entries, where)
        k, policy_line = _resolve_quorum(witnesses, quorum, policy, no_witness)
    except VerificationFailure as exc:
        result.findings.append(exc)
        return result
    quorum_met = True
    try:
        current = verify_checkpoint(checkpoint, verifier, witnesses=list(witnesses), quorum=k)
    except TlogError as exc:
        result.findings.append(_fail(f"{where}/checkpoint", str(exc), "quorum"))
        current, quorum_met = published.checkpoint, False
    size = current.checkpoint.size
    previous = None
    if seen is not None:
        leaves = b"".join(leaf_hash(e) for e in published.entries)
        try:
            observed = SeenCheckpoints(seen, verifier).observe(checkpoint, published.consistency_proof, leaves,
                                                               keep=quorum_met)
            previous = observed.previous
        except EquivocationError as exc:
            result.findings.append(_evidence_failure(where, verify_evidence(exc.evidence, verifier), str(exc)))
        except RollbackError as exc:
            result.findings.append(_fail(where, str(exc), "fork" if str(exc).startswith("rollback or fork") else "rollback"))
        except ForkError as exc:
            result.findings.append(_fail(where, str(exc), "fork"))
        except TlogError as exc:
            result.findings.append(_fail(where, str(exc), "unreadable"))
    proved, notes = check_evidence(evidence, verifier)
    result.findings += proved
    result.lines += notes
    if quorum_met:
        try:
            _check_fresh(current, f"{where}/checkpoint", max_age, now)
        except VerificationFailure as exc:
            result.findings.append(exc)
    was = (f"consistent with the checkpoint of {previous.checkpoint.size} entries seen before"
           if previous is not None else "first seen (kept, with its leaf hashes, to check the next one)"
           if seen is not None else "not compared with one seen before")
    log_times = cosignature_times(current) if quorum_met else {}
    result.lines.append(f"log: {size} entries hash to its checkpoint, signed by the log key"
                        f"{', cosigned by ' + _times_text(log_times, now) if log_times else ''}; {was}")
    if policy_line:
        result.lines.append(policy_line)
    try:
        result.statement = statement(published.entries, where)
    except VerificationFailure as exc:
        result.findings.append(exc)
        return result
    result.lines.append(result.statement.declaration_line())
    result.lines.extend(s.line() for s in result.statement.datasets.values())
    return result


def audit_public(out: Path | None, key: Path, *, log: Path | str | None = None, witness_keys: Sequence[Path] = (),
                 quorum: int | None = None, state_file: Path | None = None, no_witness: bool = False,
                 max_age: timedelta = DEFAULT_MAX_AGE, now: float | None = None,
                 evidence: Sequence[tuple[str, bytes]] = ()) -> list[str]:
    """Run the checks of the module docstring; returns what was verified, one line each.

    Args:
        out: The release folder (None: the log alone -- ``log`` is then required).
        key: The log's verifier key file.
        log: The published log: a copy of its folder, or its URL (fetched with plain GETs).
        witness_keys: The witnesses' verifier key files; required unless ``no_witness``.
        quorum: How many of them must have cosigned: never fewer than the log's policy (default:
            the policy's quorum with ``log``; all the keys given without it).
        state_file: Where the largest checkpoint seen of each log is kept.
        no_witness: Check without witnesses (the output says what that cannot rule out).
        max_age: How old a counted cosignature of the log's checkpoint may be.
        now: The time of the check (POSIX seconds; default: the clock).
        evidence: Evidence of equivocation to check against the log's key: (where it came from,
            its bytes) -- from a witness, or a file.

    Raises:
        VerificationFailure: The first check that fails (the most severe finding of the log's
            check), with what and why; ``finding`` says its class, ``evidence`` holds the
            evidence of equivocation when that is what was found.
    """
    now = time.time() if now is None else now
    verifier = read_log_key(Path(key))
    witnesses = read_witness_keys(witness_keys)
    if not witnesses and not no_witness:
        raise _fail("--witness-key", "give the witnesses' verifier keys (--witness-key VKEY, one per witness): a "
                    "log checked without witnesses can show you a history it hides from others; --no-witness "
                    "checks without them, and says what that cannot rule out")
    if witnesses and no_witness:
        raise _fail("--no-witness", "is given with --witness-key: choose one")
    if no_witness and quorum is not None:
        raise _fail("--witness-quorum", "is given with --no-witness: choose one")
    if out is None and log is None:
        raise _fail("audit public", "give a release folder, the published log (--log LOG), or both")
    lines: list[str] = []
    check: LogCheck | None = None
    if log is not None:
        try:
            checkpoint_bytes, entries_bytes = fetch_published_log(log)
        except TlogError as exc:
            raise _fail(str(log), str(exc), "unreadable") from None
        seen = FileSeenLogs(Path(state_file) if state_file else default_state_file())
        check = check_log(checkpoint_bytes, entries_bytes, verifier, where=str(log), witnesses=witnesses,
                          quorum=quorum, no_witness=no_witness, seen=seen, evidence=evidence, max_age=max_age, now=now)
        first = check.first()
        if first is not None and (first.finding not in _ACCOUNTING or out is None):
            raise first  # the log itself first; its accounting after the release is checked against it
        assert check.published is not None
        policy = log_policy(check.published.entries, str(log))
        k, _ = _resolve_quorum(witnesses, quorum, policy, no_witness)
    else:
        proved, notes = check_evidence(evidence, verifier)
        if proved:
            raise proved[0]
        lines += notes
        k, line = _resolve_quorum(witnesses, quorum, None, no_witness)
        if line:
            lines.append(line)
    if out is not None:
        lines += _check_release_folder(Path(out), verifier, witnesses, k, now, check.published if check else None, log)
        if check is not None and check.first() is not None:
            raise check.first()  # type: ignore[misc]
    if no_witness:
        lines.append(UNWITNESSED)
    if check is None:
        lines.append("log: not checked (give --log LOG: without the whole log, a rollback, a fork, a second release "
                     "of this run or spends not released cannot be seen)")
        return lines
    return lines + check.lines


def _check_release_folder(out: Path, verifier: Ed25519Verifier, witnesses: Sequence[CosignatureVerifier], k: int, now: float,
                   published: PublishedLog | None, log: Path | str | None) -> list[str]:
    """Steps 1 to 3 of the module docstring, and the release against the log (``published``)."""
    lines: list[str] = []
    # 1. the release's entry is in the log, as a checkpoint signed by the log key says
    try:
        entry = (out / ENTRY_FILE).read_bytes()
        proof = parse_tlog_proof((out / PROOF_FILE).read_bytes())
    except OSError as exc:
        raise _fail(str(out), f"has no readable {ENTRY_FILE} and {PROOF_FILE} ({exc.strerror}): "
                    "the release is not in the public log") from None
    except TlogError as exc:
        raise _fail(PROOF_FILE, str(exc)) from None
    try:
        proved = verify_tlog_proof(proof, entry, verifier, witnesses=witnesses, quorum=k)
    except TlogError as exc:
        raise _fail(PROOF_FILE, str(exc), "quorum" if "witness cosignatures are required" in str(exc) else None) \
            from None
    stamps = cosignature_times(proved)
    cosigned = f", cosigned by {_times_text(stamps, now)}" if stamps else ""
    lines.append(f"proof: {ENTRY_FILE} is entry {proof.index} of {proved.checkpoint.origin}, in its checkpoint of "
                 f"{proved.checkpoint.size} entries signed by the log key {verifier.key_id:08x}{cosigned}")

    # 2. the entry pins the manifest, the manifest every file
    try:
        release = json.loads(entry)
    except ValueError:
        raise _fail(ENTRY_FILE, "is not a JSON entry") from None
    if not isinstance(release, dict) or release.get("type") != "release":
        raise _fail(ENTRY_FILE, "is not a release entry of the public log")
    run_id = release.get("run_id")
    try:
        manifest = json.loads((out / MANIFEST).read_bytes())
    except (OSError, ValueError):
        raise _fail(MANIFEST, "is missing or not JSON") from None
    if release.get("manifest_sha256") != file_digest(out / MANIFEST):
        raise _fail(MANIFEST, f"its SHA-256 is not the one the public log records for run {run_id}")
    if not isinstance(manifest, dict) or manifest.get("run_id") != run_id \
            or manifest.get("dataset") != release.get("dataset") or not isinstance(manifest.get("files"), dict):
        raise _fail(MANIFEST, "does not name the run and dataset of its log entry, or lists no files")
    files: dict[str, str] = manifest["files"]
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    on_disk -= {MANIFEST, *RELEASE_LOG_FILES}
    for rel in sorted(on_disk | set(files)):
        if rel not in files:
            raise _fail(rel, "is in the release folder but not in its manifest")
        if rel not in on_disk:
            raise _fail(rel, "is listed in the manifest but missing")
        if file_digest(out / rel) != files[rel]:
            raise _fail(rel, "its SHA-256 differs from the manifest's (the file was changed)")
    lines.append(f"release: {MANIFEST} has the SHA-256 the log records for run {run_id} of dataset "
                 f"{release.get('dataset')}; its {len(files)} files have the manifest's digests")

    # 3. the VARIANCE columns are the ones the logged spends imply
    planned = _planned(release.get("planned"), release.get("privacy_defn", ""), ENTRY_FILE)
    problem = _release_problem(release, planned)
    if problem:
        raise _fail(ENTRY_FILE, problem)
    lines.extend(f"tables: {note.removeprefix('outputs: ')}" for note in verify_tables(planned, out, files))
    if published is None:
        return lines

    # 5. the release's checkpoint is a prefix of the log's, and its entry is in it
    size, proof_size = published.checkpoint.checkpoint.size, proved.checkpoint.size
    if proof_size > size:
        raise _fail(str(log), f"signs {size} entries and the release was proved in a checkpoint of {proof_size}: "
                    "this copy of the log is older than the release (fetch it again)")
    try:
        verify_consistency(proof_size, proved.checkpoint.root_hash, size, published.checkpoint.checkpoint.root_hash,
                           published.consistency_proof(proof_size, size) if 0 < proof_size < size else [])
    except TlogError:
        raise _fail(str(log), f"does not extend the checkpoint of {proof_size} entries the release was proved in: "
                    "the log forked or rewrote its history", "fork") from None
    if published.entries[proof.index] != entry:
        raise _fail(str(log), f"the release of run {run_id} is not in the log")
    lines.append(f"log: the release's checkpoint of {proof_size} entries is a prefix of the log's of {size}")
    return lines


def read_name(vkey: str) -> str:
    return vkey.split("+", 1)[0]


def _release_problem(release: dict[str, Any], planned: dict[str, Any]) -> str | None:
    """What is wrong with a release entry on its own: its spends against its plan, its total
    against its plan and spends (the ledger's rule: every planned measurement at least once,
    plus re-spends)."""
    spends = release.get("spends")
    if not isinstance(spends, list) or [s.get("key") if isinstance(s, dict) else None for s in spends] != list(planned):
        return "its spends are not those of its plan (one per planned measurement, in plan order)"
    for s in spends:
        if s.get("budget") != planned[s["key"]].record["budget"]:
            return f"its spend of {s['key']} has budget {s.get('budget')}; its plan says {planned[s['key']].record['budget']}"
        if not isinstance(s.get("times"), int) or isinstance(s.get("times"), bool) or s["times"] < 1:
            return f"a planned measurement of the release was never spent ({s['key']})"
    defn = PrivacyDefinition(release["privacy_defn"])
    total: Amount = Fraction(0)
    for s in spends:
        total = add_amounts(total, times(planned[s["key"]].budget, s["times"]))
    try:
        stated = parse_exact(release.get("spent"))
    except ValueError:
        return "its total (spent) is not an exact amount"
    if stated != total:
        return (f"the release of run {release.get('run_id')} states it spent {release.get('spent')}; its plan and "
                f"spends give {format_exact(total)} ({defn.value})")
    return None


@dataclass
class DatasetStatement:
    """One dataset's public privacy-loss statement, recomputed from the log."""

    dataset: str
    unit: str
    cap: Amount
    spent: Amount = Fraction(0)
    releases: list[str] = field(default_factory=list)
    released: Amount = Fraction(0)
    open_runs: list[str] = field(default_factory=list)
    failed_runs: list[str] = field(default_factory=list)
    unreleased: Amount = Fraction(0)
    retired_at: int | None = None
    """The entry that retired the dataset from this log (its accounting ended there), if any."""
    successor: str | None = None
    """The log the retirement names as the dataset's successor (origin and key ID), if any."""

    def line(self) -> str:
        cap = "no cap (non-confidential)" if is_infinite(self.cap) else f"cap {format_exact(self.cap)}"
        left = "" if is_infinite(self.cap) else \
            f", left {format_exact(self.cap - self.spent) if not is_infinite(self.spent) else '0'}"
        if self.open_runs or self.failed_runs:
            parts = []
            if self.failed_runs:
                parts.append(f"{len(self.failed_runs)} failed run(s), every spend charged: {', '.join(self.failed_runs)}")
            if self.open_runs:
                parts.append(f"{len(self.open_runs)} open run(s), their whole plan charged: {', '.join(self.open_runs)}")
            unreleased = f"; not (yet) released: {format_exact(self.unreleased)} ({'; '.join(parts)})"
        else:
            unreleased = "; nothing spent without a release"
        retired = "" if self.retired_at is None else (
            f"; retired at entry {self.retired_at}, nothing more is spent on it in this log"
            + (f" (its successor: the log {self.successor})" if self.successor else ""))
        return (f"dataset {self.dataset}: {len(self.releases)} release(s) ({', '.join(self.releases) or 'none'}) "
                f"charged {format_exact(self.released)}{unreleased}; spent {format_exact(self.spent)} of {cap} "
                f"({self.unit}){left}{retired}")


@dataclass
class Statement:
    """The statement of a whole log: every dataset's, and the witness policy the log states."""

    datasets: dict[str, DatasetStatement]
    witnesses: list[str] | None = None
    quorum: int = 0
    declared: tuple[str, ...] | None = None
    """The datasets the log's policy declares it accounts (None: it declares none -- a ledger made
    before declarations -- so no witness holds its datasets for it)."""

    def declaration_line(self) -> str:
        if self.declared is None:
            return ("log: its policy declares no datasets (a ledger made before logs declared them): no witness holds "
                    "its datasets for it, so a second log for one of them is seen only by a monitor that follows both")
        retired = [d for d in self.declared if self.datasets.get(d) and self.datasets[d].retired_at is not None]
        return (f"log: its policy declares the dataset(s) {', '.join(self.declared)}, and every run is of one of them"
                + (f"; retired since: {', '.join(retired)}" if retired else ""))


@dataclass
class _Run:
    run_id: str
    started_at: int
    started: dict[str, Any]
    dataset: str
    defn: PrivacyDefinition
    planned: dict[str, Any]
    budgets: dict[str, Amount]
    spends: Counter = field(default_factory=Counter)
    this_attempt: set[str] = field(default_factory=set)
    attempt: int = 1
    status: str = "running"
    released_at: int | None = None


def _plan_difference(release: list[dict[str, Any]], started: list[dict[str, Any]]) -> str:
    """How a release's plan differs from its run's, in a few words."""
    keys_r, keys_s = [p.get("key") for p in release], [p.get("key") for p in started]
    if keys_r != keys_s:
        extra = [k for k in keys_r if k not in keys_s]
        missing = [k for k in keys_s if k not in keys_r]
        if extra or missing:
            return (f"measurements {', '.join(map(str, extra))} not in its run's plan" if extra
                    else f"it leaves out {', '.join(map(str, missing))}")
        return "its measurements are in another order"
    for r, s in zip(release, started):
        fields = sorted(name for name in set(r) | set(s) if r.get(name) != s.get(name))
        if fields:
            shown = "; ".join(f"{name} {r.get(name)!r} where the run planned {s.get(name)!r}" for name in fields[:3])
            return f"{r.get('key')}: {shown}"
    return "another plan"


def statement(entries: Sequence[bytes], where: str = "log") -> Statement:
    """Each dataset's privacy-loss statement, recomputed from the public entries, every entry
    checked against the ledger's rules as far as public facts allow (see the module docstring).

    Raises:
        VerificationFailure: One line naming the entry, the run and the difference.
    """
    unit: PrivacyDefinition | None = None
    policy_cap: Amount = Fraction(0)
    ledger_cap: Amount | None = None
    enforced = True
    non_confidential = False
    witnesses: list[str] | None = None
    quorum = 0
    codes_required = False  # a log bound to its ledger: failures are public as codes, never as text
    caps: dict[str, Amount] = {}
    versions: Counter = Counter()
    runs: dict[str, _Run] = {}
    declared: tuple[str, ...] | None = None
    retired: dict[str, tuple[int, str | None]] = {}  # dataset -> its dataset-retired entry, the successor named

    def bad(index: int, reason: str, finding: str = "rule") -> VerificationFailure:
        return _fail(f"{where}: entry {index}", reason, finding)

    def charge(run: _Run, status: str | None = None, *, own_unit: bool = False) -> Amount:
        """What the run counts against its dataset: every spend if it failed, else every planned
        measurement at least once plus re-spends -- in the ledger's unit, or (``own_unit``, as
        its ``spent`` fields state it) in its own."""
        assert unit is not None
        failed = (status or run.status) == "failed"
        total: Amount = Fraction(0)
        for key, budget in run.budgets.items():
            n = run.spends[key] if failed else max(1, run.spends[key])
            total = add_amounts(total, times(budget if own_unit else convert(budget, run.defn, unit), n))
        return total

    def odometer(dataset: str, *, besides: _Run | None = None) -> Amount:
        total: Amount = Fraction(0)
        for run in runs.values():
            if run.dataset == dataset and run is not besides:
                total = add_amounts(total, charge(run))
        return total

    def all_datasets(besides: _Run | None = None) -> Amount:
        total: Amount = Fraction(0)
        for run in runs.values():
            if run is not besides:
                total = add_amounts(total, charge(run))
        return total

    def accounted(index: int, dataset: str, what: str) -> None:
        """The log accounts ``dataset``: its policy declares it (when it declares its datasets),
        and it was not retired."""
        if dataset in retired:
            raise bad(index, f"{what} of dataset {dataset}, which this log retired at entry {retired[dataset][0]}: "
                      "a retired dataset is accounted no more in the log that retired it")
        if declared is not None and dataset not in declared:
            raise bad(index, f"{what} of dataset {dataset}, which the log's policy does not declare (it declares "
                      f"{', '.join(declared)}): a log accounts only the datasets its policy names")

    def within_caps(index: int, run: _Run, dataset_after: Amount, what: str) -> None:
        if not enforced:
            return
        cap = caps.get(run.dataset, policy_cap)
        if amount_exceeds(dataset_after, cap):
            raise bad(index, f"run {run.run_id}: {what} takes dataset {run.dataset} to {format_exact(dataset_after)}, "
                      f"above its cap {format_exact(cap)}", "over-cap")
        if ledger_cap is not None:
            total = add_amounts(all_datasets(besides=run), charge(run))
            if amount_exceeds(total, ledger_cap):
                raise bad(index, f"run {run.run_id}: {what} takes all datasets to {format_exact(total)}, above the "
                          f"ledger-wide cap {format_exact(ledger_cap)}", "over-cap")

    for index, data in enumerate(entries):
        try:
            e = json.loads(data)
            kind = e["type"]
        except (ValueError, KeyError, TypeError):
            raise bad(index, "is not a public log entry") from None
        try:
            if index == 0 or kind == "policy":
                if index != 0 or kind != "policy":
                    raise bad(index, "the log does not begin with its one policy entry")
                unit = PrivacyDefinition(e["privacy_defn"])
                policy_cap = parse_exact(e["lifetime_cap"])
                non_confidential = bool(e["non_confidential"])
                enforced = not non_confidential  # a throwaway ledger's caps are recorded, not enforced
                ledger_cap = parse_exact(e["ledger_cap"]) if "ledger_cap" in e else None
                if "witnesses" in e:
                    witnesses, quorum = list(e["witnesses"]), int(e["quorum"])
                    codes_required = True
                if "datasets" in e:
                    names = e["datasets"]
                    if not isinstance(names, list) or not names or names != sorted(set(names)) \
                            or not all(isinstance(n, str) and DATASET_NAME.fullmatch(n) for n in names):
                        raise bad(index, "the policy's datasets is not a sorted list of distinct dataset names")
                    declared = tuple(names)
                continue
            if kind == "log-bound":
                if witnesses is not None:
                    raise bad(index, "the log binds its witnesses a second time")
                witnesses, quorum = list(e["witnesses"]), int(e["quorum"])
                codes_required = True
            elif kind == "cap-raised":
                accounted(index, e["dataset"], "a cap raise")
                new, current = parse_exact(e["lifetime_cap"]), caps.get(e["dataset"], policy_cap)
                if not amount_exceeds(new, current):
                    raise bad(index, f"dataset {e['dataset']}'s cap is lowered from {format_exact(current)} to "
                              f"{e['lifetime_cap']}: a cap is only ever raised")
                caps[e["dataset"]] = new
            elif kind == "dataset-version":
                accounted(index, e["dataset"], "a version")
                versions[e["dataset"]] += 1
                if e["version"] != versions[e["dataset"]]:
                    raise bad(index, f"dataset {e['dataset']}'s version {e['version']} follows version "
                              f"{versions[e['dataset']] - 1}")
            elif kind == "ledger-repaired":
                pass
            elif kind == "dataset-retired":
                name = e["dataset"]
                if name in retired:
                    raise bad(index, f"dataset {name} is retired a second time (first at entry {retired[name][0]})")
                known = versions[name] or name in caps or any(r.dataset == name for r in runs.values())
                if (declared is not None and name not in declared) or (declared is None and not known):
                    raise bad(index, f"the log retires dataset {name}, which it does not account")
                still = [r.run_id for r in runs.values() if r.dataset == name and r.status == "running"]
                if still:
                    raise bad(index, f"the log retires dataset {name} while its run {still[0]} is open (it can still "
                              "spend)")
                successor = e.get("successor")
                if successor is not None and not (isinstance(successor, dict) and set(successor) == {"origin", "key_id"}
                                                  and isinstance(successor["origin"], str)
                                                  and HEX8.fullmatch(str(successor["key_id"]))):
                    raise bad(index, "the retirement's successor is not a log's origin and 8-hex-digit key ID")
                if not isinstance(e["reason"], str) or not e["reason"].strip():
                    raise bad(index, "the retirement states no reason")
                retired[name] = (index, None if successor is None else f"{successor['origin']} "
                                                                        f"(key ID {successor['key_id']})")
            elif kind == "run-started":
                run_id = e["run_id"]
                if run_id in runs:
                    raise bad(index, f"run {run_id} is started twice (entry {runs[run_id].started_at} and here)")
                accounted(index, e["dataset"], f"run {run_id}")
                planned = _planned(e["planned"], e["privacy_defn"], f"{where}: entry {index}")
                total: Amount = Fraction(0)
                for spend in planned.values():
                    total = add_amounts(total, spend.budget)
                if parse_exact(e["planned_total"]) != total:
                    raise bad(index, f"run {run_id} states a planned total of {e['planned_total']}; its plan adds up "
                              f"to {format_exact(total)}")
                if bool(e["non_confidential"]) != non_confidential:
                    raise bad(index, f"run {run_id} is of another kind (confidential or not) than its ledger")
                before = odometer(e["dataset"])
                if parse_exact(e["spent_before"]) != before:
                    raise bad(index, f"run {run_id} states dataset {e['dataset']} had spent {e['spent_before']} "
                              f"before it; the log's spends add up to {format_exact(before)}")
                cap = caps.get(e["dataset"], policy_cap)
                if parse_exact(e["lifetime_cap"]) != cap:
                    raise bad(index, f"run {run_id} states dataset {e['dataset']}'s cap is {e['lifetime_cap']}; the "
                              f"log's policy and raises give {format_exact(cap)}")
                run = _Run(run_id, index, e, e["dataset"], PrivacyDefinition(e["privacy_defn"]), planned,
                           {k: p.budget for k, p in planned.items()})
                runs[run_id] = run
                within_caps(index, run, add_amounts(before, charge(run)), "its start")
            else:
                run = runs.get(e["run_id"])
                if run is None:
                    raise bad(index, f"{kind} of run {e['run_id']}, which was never started in the log")
                if kind == "spend":
                    spend = run.planned.get(e["key"])
                    if spend is None or any(spend.record[f] != e[f] for f in ("budget", "sensitivity", "n_cells")):
                        raise bad(index, f"a spend of run {run.run_id} that its plan does not hold ({e['key']})")
                    if run.status != "running":
                        raise bad(index, f"a spend of run {run.run_id}, which had {run.status}")
                    if e["key"] in run.this_attempt:
                        raise bad(index, f"run {run.run_id} spends {e['key']} twice in one attempt")
                    respend = run.spends[e["key"]] > 0
                    run.spends[e["key"]] += 1
                    run.this_attempt.add(e["key"])
                    if respend:
                        within_caps(index, run, odometer(run.dataset), f"re-spending {e['key']}")
                elif kind == "run-resumed":
                    if run.status == "finished":
                        raise bad(index, f"run {run.run_id} is resumed after its release (entry {run.released_at})")
                    accounted(index, run.dataset, f"a resume of run {run.run_id}")
                    if e["dataset"] != run.dataset or e["attempt"] != run.attempt + 1:
                        raise bad(index, f"run {run.run_id}'s resume states dataset {e['dataset']}, attempt "
                                  f"{e['attempt']}; its run is of {run.dataset}, attempt {run.attempt}")
                    run.status, run.attempt, run.this_attempt = "running", run.attempt + 1, set()
                    within_caps(index, run, odometer(run.dataset), "its resume")
                elif kind == "run-failed":
                    if run.status != "running":
                        raise bad(index, f"run {run.run_id} fails after it had {run.status}")
                    if "reason" in e and (codes_required or "code" in e):
                        raise bad(index, f"run {run.run_id}'s failure carries operator text (a reason), where the log "
                                  "publishes a failure as a code and a stage only: text can name enclave paths")
                    if codes_required and (e.get("code") not in FAILURE_CODES or e.get("stage") not in FAILURE_STAGES):
                        raise bad(index, f"run {run.run_id}'s failure names no known code and stage")
                    if e.get("stage") == "release" and any(run.spends[k] == 0 for k in run.planned):
                        raise bad(index, f"run {run.run_id} failed at its release stage with a measurement never spent")
                    run.status = "failed"
                    if parse_exact(e["spent"]) != charge(run, own_unit=True):
                        raise bad(index, f"run {run.run_id} failed stating it spent {e['spent']}; its spends in the "
                                  f"log add up to {format_exact(charge(run, own_unit=True))}")
                elif kind == "release":
                    _check_release(index, e, run, charge, bad)
                    run.status, run.released_at = "finished", index
                else:
                    raise bad(index, f"has an unknown type {kind!r}")
        except VerificationFailure:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise bad(index, f"is not a well-formed {kind} entry ({type(exc).__name__})") from None
    if unit is None:
        raise _fail(where, "is empty", "invalid")
    unit_name = "rho" if unit is PrivacyDefinition.ZCDP else "epsilon"
    out: dict[str, DatasetStatement] = {}
    for name in [*(declared or ()), *retired]:  # a dataset declared or retired with no run yet: nothing spent
        out.setdefault(name, DatasetStatement(name, unit_name, caps.get(name, policy_cap)))
    for run_id, run in runs.items():
        s = out.setdefault(run.dataset, DatasetStatement(run.dataset, unit_name, caps.get(run.dataset, policy_cap)))
        charged = charge(run)
        s.spent = add_amounts(s.spent, charged)
        if run.status == "finished":
            s.releases.append(run_id)
            s.released = add_amounts(s.released, charged)
        else:
            (s.open_runs if run.status == "running" else s.failed_runs).append(run_id)
            s.unreleased = add_amounts(s.unreleased, charged)
    for name, (at, successor) in retired.items():
        out[name].retired_at, out[name].successor = at, successor
    for s in out.values():
        if enforced and amount_exceeds(s.spent, s.cap):
            raise _fail(where, f"dataset {s.dataset} spent {format_exact(s.spent)}, above its cap "
                        f"{format_exact(s.cap)}", "over-cap")
    return Statement(out, witnesses, quorum, declared)


def _check_release(index: int, e: dict[str, Any], run: _Run, charge: Any, bad: Any) -> None:
    """A ``release`` entry is its run's one release and states exactly what the run's
    ``run-started`` and ``spend`` entries give."""
    if run.status == "finished":
        raise bad(index, f"run {run.run_id} is released a second time (its release is entry {run.released_at}): a run "
                  "is released once; a declared re-release is a run of its own", "second-release")
    if run.status != "running":
        raise bad(index, f"run {run.run_id} is released after it {run.status} without a resume")
    started = run.started
    for name in ("dataset", "privacy_defn"):
        if e[name] != started[name]:
            raise bad(index, f"run {run.run_id}'s release states {name} {e[name]!r}; its run-started (entry "
                      f"{run.started_at}) {started[name]!r}")
    if e["planned"] != started["planned"]:
        raise bad(index, f"run {run.run_id}'s release states another plan than its run-started (entry "
                  f"{run.started_at}): {_plan_difference(e['planned'], started['planned'])}")
    listed = {s["key"]: s for s in e["spends"]} if isinstance(e["spends"], list) else {}
    for key, n in [(k, run.spends[k]) for k in run.planned]:
        got = listed.get(key, {}).get("times")
        if got != n:
            raise bad(index, f"run {run.run_id}'s release states {got} spend(s) of {key}; the log holds {n}")
    problem = _release_problem(e, run.planned)
    if problem:
        raise bad(index, f"run {run.run_id}: {problem}")
    if parse_exact(e["spent"]) != charge(run, "finished", own_unit=True):
        raise bad(index, f"run {run.run_id}'s release states it spent {e['spent']}; its spends in the log add up to "
                  f"{format_exact(charge(run, 'finished', own_unit=True))}")
    if not isinstance(e.get("manifest_sha256"), str) or not HEX64.fullmatch(e["manifest_sha256"]):
        raise bad(index, f"run {run.run_id}'s release names no manifest digest: nothing pins its files")
