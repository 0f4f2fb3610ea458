"""``phsafe audit public``: what a person outside the enclave can check, with public files only.

Given a release folder, the log's verifier key (obtained out of band, not from the folder), and
optionally the published log and witness keys:

1. ``privacy-loss.tlog-proof`` verifies: its checkpoint is signed by the log key (and cosigned by
   k of the n witness keys given), and ``privacy-loss.entry`` is the entry at its index;
2. the entry is a ``release`` entry whose ``manifest_sha256`` is the SHA-256 of ``manifest.json``;
   the manifest names the same run and dataset; every file listed in it has its digest, and the
   folder holds nothing else (besides the manifest and the two log files);
3. every released cell's VARIANCE (and NOISE_DISTRIBUTION) is exactly what the logged plan
   implies -- budget, sensitivity and the noise it gives -- and every measured domain has the
   logged number of cells (:func:`phsafe.audit.verify.verify_tables`, without the noisy
   digests, which are confidential);

and with ``--log``:

4. the log's checkpoint verifies (same keys and quorum); its entries hash to it;
5. the checkpoint is consistent with the last one this person saw of the log, kept in a small
   local state file (:class:`phsafe.tlog.SeenCheckpoints`): a log that rewrote or forked its
   history since is caught; the release's own checkpoint must be consistent with the log's, and
   the release's entry must be in the log at its index;
6. the log's entries are read as the privacy-loss accounting they are: every spend belongs to a
   started run and its plan; every ``run-started``'s ``spent_before`` is the dataset's odometer
   recomputed from the log; every release's and failure's ``spent`` is the run's charge by the
   ledger's rule (a failed run: every spend; any other: every planned measurement at least
   once, plus re-spends); then, per dataset, the statement: releases, total spent, cap, left.

Any mismatch raises :class:`~phsafe.errors.VerificationFailure` (one line: what and why).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from phsafe.amounts import Amount, add_amounts, amount_exceeds, format_exact, is_infinite, parse_exact, times
from phsafe.config import PrivacyDefinition
from phsafe.errors import ForkError, LedgerRuleViolation, TlogError, VerificationFailure
from phsafe.ledger.policy import convert
from phsafe.publog.log import ENTRY_FILE, PROOF_FILE, RELEASE_LOG_FILES
from phsafe.publog.projection import MANIFEST
from phsafe.reader import file_digest
from phsafe.tlog import (
    CosignatureVerifier,
    ALG_ED25519,
    Ed25519Verifier,
    FileCheckpointStore,
    SeenCheckpoints,
    parse_tlog_proof,
    read_published_log,
    read_verifier_key,
    verify_consistency,
    verify_tlog_proof,
)


def default_state_file() -> Path:
    """Where ``audit public`` keeps the checkpoints it saw: ``$XDG_CONFIG_HOME/phsafe/...``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "phsafe" / "public-log-checkpoints.json"


@dataclass
class DatasetStatement:
    """One dataset's public privacy-loss statement, recomputed from the log."""

    dataset: str
    unit: str
    cap: Amount
    spent: Amount = Fraction(0)
    releases: list[str] = field(default_factory=list)
    open_runs: list[str] = field(default_factory=list)
    failed_runs: list[str] = field(default_factory=list)

    def line(self) -> str:
        cap = "no cap (non-confidential)" if is_infinite(self.cap) else f"cap {format_exact(self.cap)}"
        left = "" if is_infinite(self.cap) else \
            f", left {format_exact(self.cap - self.spent) if not is_infinite(self.spent) else '0'}"
        extra = ""
        if self.open_runs:
            extra += f"; {len(self.open_runs)} run(s) open (charged their plan): {', '.join(self.open_runs)}"
        if self.failed_runs:
            extra += f"; {len(self.failed_runs)} run(s) failed (charged every spend): {', '.join(self.failed_runs)}"
        return (f"dataset {self.dataset}: {len(self.releases)} release(s) ({', '.join(self.releases) or 'none'}), "
                f"spent {format_exact(self.spent)} of {cap} ({self.unit}){left}{extra}")


@dataclass
class _Run:
    dataset: str
    defn: PrivacyDefinition
    planned: dict[str, Any]
    budgets: dict[str, Amount]
    spends: Counter = field(default_factory=Counter)
    status: str = "running"


def _fail(where: str, reason: str) -> VerificationFailure:
    return VerificationFailure(where, reason)


def _log_key(path: Path) -> Ed25519Verifier:
    try:
        verifier = read_verifier_key(path)
    except TlogError as exc:
        raise _fail(str(path), f"is not a verifier key ({exc})") from None
    if verifier.alg != ALG_ED25519:
        raise _fail(str(path), "is a witness key, not a log key (give the log's key with --key)")
    return verifier


def _witness_keys(paths: Sequence[Path]) -> list[CosignatureVerifier]:
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
    from phsafe.ledger.rules import parse_planned

    try:
        return parse_planned(items, PrivacyDefinition(defn))
    except (LedgerRuleViolation, ValueError) as exc:
        raise _fail(where, f"its plan is not a valid plan ({exc})") from None


def audit_public(out: Path, key: Path, *, log: Path | None = None, witness_keys: Sequence[Path] = (),
                 quorum: int | None = None, state_file: Path | None = None) -> list[str]:
    """Run the checks of the module docstring; returns what was verified, one line each.

    Raises:
        VerificationFailure: The first check that fails, with what and why.
    """
    out = Path(out)
    verifier = _log_key(Path(key))
    witnesses = _witness_keys(witness_keys)
    k = len(witnesses) if quorum is None else quorum
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
        raise _fail(PROOF_FILE, str(exc)) from None
    cosigned = f", cosigned by {', '.join(proved.cosigners)}" if proved.cosigners else ""
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
        manifest_bytes = (out / MANIFEST).read_bytes()
        manifest = json.loads(manifest_bytes)
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
    spends = release.get("spends")
    if not isinstance(spends, list) or [s.get("key") for s in spends if isinstance(s, dict)] != list(planned) \
            or any(s["budget"] != planned[s["key"]].record["budget"] for s in spends):
        raise _fail(ENTRY_FILE, "its spends are not those of its plan")
    if any(s.get("times", 0) < 1 for s in spends):
        raise _fail(ENTRY_FILE, "a planned measurement of the release was never spent")
    from phsafe.audit.verify import verify_tables

    lines.extend(f"tables: {note.removeprefix('outputs: ')}"
                 for note in verify_tables(SimpleNamespace(planned=planned), out, files, noisy_digests=False))

    if log is None:
        lines.append("log: not checked (give --log LOG to check the whole log and the privacy-loss statement)")
        return lines

    # 4-5. the whole log, consistent with what was seen before and with the release's checkpoint
    try:
        published = read_published_log(Path(log), verifier, witnesses=witnesses, quorum=k)
    except TlogError as exc:
        raise _fail(str(log), str(exc)) from None
    size = published.checkpoint.checkpoint.size
    seen = SeenCheckpoints(FileCheckpointStore(Path(state_file) if state_file else default_state_file()), verifier,
                           witnesses=witnesses, quorum=k)
    before = seen.latest()
    try:
        seen.observe(published.checkpoint.message, published.consistency_proof)
    except ForkError as exc:
        raise _fail(str(log), str(exc)) from None
    except TlogError as exc:
        raise _fail(str(log), str(exc)) from None
    proof_size = proved.checkpoint.size
    if proof_size > size:
        raise _fail(str(log), f"signs {size} entries and the release was proved in a checkpoint of {proof_size}: "
                    "this copy of the log is older than the release (fetch it again)")
    try:
        verify_consistency(proof_size, proved.checkpoint.root_hash, size, published.checkpoint.checkpoint.root_hash,
                           published.consistency_proof(proof_size, size) if 0 < proof_size < size else [])
    except TlogError:
        raise _fail(str(log), f"does not extend the checkpoint of {proof_size} entries the release was proved in: "
                    "the log forked or rewrote its history") from None
    if published.entries[proof.index] != entry:
        raise _fail(str(log), f"the release of run {run_id} is not in the log")
    was = (f"consistent with the checkpoint of {before.checkpoint.size} entries seen before"
           if before is not None else "first seen (kept to check the next one)")
    log_cosigners = published.checkpoint.cosigners
    lines.append(f"log: {size} entries hash to its checkpoint, signed by the log key"
                 f"{', cosigned by ' + ', '.join(log_cosigners) if log_cosigners else ''}; "
                 f"{was}; the release's checkpoint is a prefix of it")

    # 6. the privacy-loss statement
    statements = statement(published.entries, str(log))
    lines.extend(s.line() for s in statements.values())
    return lines


def statement(entries: Sequence[bytes], where: str = "log") -> dict[str, DatasetStatement]:
    """Each dataset's privacy-loss statement, recomputed from the public entries (checked)."""
    unit: PrivacyDefinition | None = None
    policy_cap: Amount = Fraction(0)
    enforced = True
    caps: dict[str, Amount] = {}
    runs: dict[str, _Run] = {}

    def bad(index: int, reason: str) -> VerificationFailure:
        return _fail(f"{where}: entry {index}", reason)

    def charge(run: _Run) -> Amount:
        assert unit is not None
        total: Amount = Fraction(0)
        for key, budget in run.budgets.items():
            n = run.spends[key] if run.status == "failed" else max(1, run.spends[key])
            total = add_amounts(total, times(convert(budget, run.defn, unit), n))
        return total

    def odometer(dataset: str) -> Amount:
        total: Amount = Fraction(0)
        for run in runs.values():
            if run.dataset == dataset:
                total = add_amounts(total, charge(run))
        return total

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
                enforced = not e["non_confidential"]  # a throwaway ledger's caps are recorded, not enforced
                continue
            if kind == "cap-raised":
                caps[e["dataset"]] = parse_exact(e["lifetime_cap"])
            elif kind in ("dataset-version", "ledger-repaired"):
                pass
            elif kind == "run-started":
                if e["run_id"] in runs:
                    raise bad(index, f"run {e['run_id']} is started twice")
                planned = _planned(e["planned"], e["privacy_defn"], f"{where}: entry {index}")
                before = odometer(e["dataset"])
                if parse_exact(e["spent_before"]) != before:
                    raise bad(index, f"run {e['run_id']} states dataset {e['dataset']} had spent {e['spent_before']} "
                              f"before it; the log's spends add up to {format_exact(before)}")
                runs[e["run_id"]] = _Run(e["dataset"], PrivacyDefinition(e["privacy_defn"]), planned,
                                         {k: p.budget for k, p in planned.items()})
            else:
                run = runs.get(e["run_id"])
                if run is None:
                    raise bad(index, f"{kind} of run {e['run_id']}, which was never started in the log")
                if kind == "spend":
                    spend = run.planned.get(e["key"])
                    if spend is None or any(spend.record[f] != e[f] for f in ("budget", "sensitivity", "n_cells")):
                        raise bad(index, f"a spend of run {e['run_id']} that its plan does not hold ({e['key']})")
                    if run.status != "running":
                        raise bad(index, f"a spend of run {e['run_id']}, which had ended")
                    run.spends[e["key"]] += 1
                elif kind == "run-resumed":
                    if run.status == "finished":
                        raise bad(index, f"run {e['run_id']} is resumed after its release")
                    run.status = "running"
                elif kind == "run-failed":
                    run.status = "failed"
                    if parse_exact(e["spent"]) != charge(run):
                        raise bad(index, f"run {e['run_id']} failed stating it spent {e['spent']}; its spends in the "
                                  f"log add up to {format_exact(charge(run))}")
                elif kind == "release":
                    if [s["times"] for s in e["spends"]] != [run.spends[k] for k in run.planned]:
                        raise bad(index, f"the release of run {e['run_id']} lists other spends than the log holds")
                    run.status = "finished"
                    if parse_exact(e["spent"]) != charge(run):
                        raise bad(index, f"the release of run {e['run_id']} states it spent {e['spent']}; its spends "
                                  f"in the log add up to {format_exact(charge(run))}")
                else:
                    raise bad(index, f"has an unknown type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(index, f"is not a well-formed {kind} entry ({type(exc).__name__})") from None
    if unit is None:
        raise _fail(where, "is empty")
    unit_name = "rho" if unit is PrivacyDefinition.ZCDP else "epsilon"
    out: dict[str, DatasetStatement] = {}
    for run_id, run in runs.items():
        s = out.setdefault(run.dataset, DatasetStatement(run.dataset, unit_name, caps.get(run.dataset, policy_cap)))
        s.spent = add_amounts(s.spent, charge(run))
        {"finished": s.releases, "running": s.open_runs, "failed": s.failed_runs}[run.status].append(run_id)
    for s in out.values():
        if enforced and amount_exceeds(s.spent, s.cap):
            raise _fail(where, f"dataset {s.dataset} spent {format_exact(s.spent)}, above its cap "
                        f"{format_exact(s.cap)}")
    return out
