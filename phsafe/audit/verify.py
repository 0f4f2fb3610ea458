"""``phsafe audit verify``: prove a ledger and its outputs consistent, or name what is not.

The ledger's own rules (encoding, hash chain, sequence, run state machine including resumed runs
and their re-spends, lifetime caps in exact arithmetic) are checked by
:func:`phsafe.ledger.read_ledger`, the same code that guards every append. On top of that this module checks

* checkpoints: a checkpoint (ledger size, head hash) must describe a prefix of the ledger, and
  its Ed25519 signature must verify -- against the auditor's trusted public key when one is given;
* outputs: the manifest's run is in the ledger with the same file digests (the manifest's own
  digest included), every file on disk has the logged digest, every released cell's VARIANCE is
  what the logged budget and sensitivity imply, the released counts of each measurement hash to
  the COMMITTED noisy digest, the manifest's checkpoint covers every spend of the run, and -- with
  the ledger's lineage key -- the manifest's lineage commitment is the one the ledger implies;
* publications: every release the ledger says it published is checked where it was published
  (when that folder is reachable from here), and runs that spent without publishing are named,
  with how to complete them without new noise.

Every failure raises :class:`VerificationFailure` whose message names the first failing entry or
file and the reason. What holds but needs the operator -- the ledger ends in an interrupted write,
a repair is not finished, a finished run left leftovers in its work folder, a recorded release
lacks its public log files, the public log is behind the ledger or its checkpoint lacks the
witness quorum -- is an *action* (:attr:`VerifyResult.actions`), each naming the command that
does it: ``phsafe audit verify`` then exits with status 3, never 0 (docs/ledger_and_audit.md,
"Exit statuses").
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from phsafe.amounts import format_exact
from phsafe.audit.tables import verify_tables
from phsafe.config import PrivacyDefinition
from phsafe.errors import LedgerError, VerificationFailure, cause_in_words
from phsafe.ledger import (
    LedgerState,
    RunStatus,
    checkpoint_message,
    key_id,
    key_path,
    lineage_commitment,
)
from phsafe.ledger.admin import read_repair_record, repair_status
from phsafe.ledger.store import read_ledger_prefix, repair_record_path
from phsafe.leftovers import leftovers_of
from phsafe.publog import RELEASE_LOG_FILES, log_path
from phsafe.publog.confidential import check_public_log, check_release_log_files
from phsafe.reader import file_digest

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

MANIFEST = "manifest.json"
CHECKPOINT_KEYS = frozenset({"ledger_size", "head_hash", "signature", "public_key"})


ACTION_NEEDED = 3
"""``phsafe audit verify``'s exit status when everything holds but the operator must act."""


@dataclass
class VerifyResult:
    """What was verified, for the command's success message, and what the operator must do.

    Attributes:
        state: The verified ledger (its complete entries).
        notes: What was verified, one line each.
        actions: What holds but needs the operator, one line each naming the command to run;
            empty when nothing does.
    """

    state: LedgerState
    notes: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """0 when nothing needs the operator, :data:`ACTION_NEEDED` (3) otherwise."""
        return ACTION_NEEDED if self.actions else 0


def verify(
    ledger: Path,
    *,
    checkpoints: Sequence[Path] = (),
    public_key: Path | None = None,
    outputs: Path | None = None,
    lineage_key: Path | None = None,
    work_dir: Path | None = None,
) -> VerifyResult:
    """Verify ``ledger`` and, optionally, checkpoint files and an output directory.

    Args:
        ledger: The ledger file.
        checkpoints: JSON files each holding a checkpoint, or a manifest with a ``checkpoint``.
        public_key: The operator's Ed25519 public key (PEM) the auditor trusts; every checkpoint
            must then be signed by it.
        outputs: An output directory (``manifest.json`` plus the released tables).
        lineage_key: The ledger's lineage key file (default: ``<ledger>.key`` if present).
        work_dir: Where the runs' work folders are, if not beside the ledger (``runs/``).

    Returns:
        What was verified; with :attr:`VerifyResult.actions`, what the operator must do.

    Raises:
        VerificationFailure: naming the first failing entry or file and why.
    """
    ledger_path = Path(ledger)
    try:
        state, torn = read_ledger_prefix(ledger_path)
        data = ledger_path.read_bytes() if torn or repair_record_path(ledger_path).exists() else b""
    except (LedgerError, OSError) as exc:
        if isinstance(exc, OSError):
            raise VerificationFailure("ledger", f"cannot be read ({cause_in_words(exc)})") from None
        where = f"entry {exc.seq}" + (f" ({exc.kind})" if exc.kind else "") if exc.seq is not None else "ledger"
        raise VerificationFailure(where, exc.reason) from None
    result = VerifyResult(state=state)
    result.notes.append(f"ledger: {state.size} entries, chain and rules hold, head {state.head_hash}")
    _repair_actions(ledger_path, state, torn, data, result)
    key = _lineage_key(Path(ledger), state, lineage_key)
    if state.policy is None:
        result.notes.append("format: written before ledgers had a policy (verified under its own rules); "
                            "migrate it before the next run (phsafe ledger migrate)")
    else:
        p = state.policy
        kind = "non-confidential (throwaway)" if p.non_confidential else "confidential"
        result.notes.append(f"policy: {kind} ledger {p.ledger_id}, every dataset's cap {format_exact(p.lifetime_cap)} "
                            f"({_unit(p.privacy_defn)}) set at entry {p.seq}; lineage key "
                            + ("checked" if key is not None else "not available here (lineage not checked)"))
        if p.ledger_cap is not None:
            result.notes.append(f"ledger-wide cap {format_exact(p.ledger_cap)} ({_unit(p.privacy_defn)}) over all "
                                "datasets together: every start, resume and re-spend was within it")
    unit = state.unit
    for account, runs in state.datasets().items():
        run_unit = unit or (PrivacyDefinition.ZCDP if any(r.privacy_defn is PrivacyDefinition.ZCDP for r in runs)
                            else PrivacyDefinition.PUREDP)
        ds = state.dataset_states.get(account)
        extra = ""
        if ds is not None:
            extra = (f", {len(ds.versions)} content version(s), cap {format_exact(ds.lifetime_cap)}"
                     + (f" after {len(ds.raises)} recorded raise(s)" if ds.raises else ""))
        label = f"dataset {account}" if not account.startswith("legacy:") else f"dataset {account[7:23]}"
        result.notes.append(
            f"{label}: {len(runs)} run(s), lifetime spend {format_exact(state.dataset_spent(account, run_unit))} "
            f"({_unit(run_unit)}){extra}; every start was within its cap"
        )
    for name, ds in sorted(state.dataset_states.items()):
        for version in ds.versions:
            if version.overlap is not None:
                result.notes.append(
                    f"entry {version.seq}: dataset {name}'s version overlaps dataset {version.overlap['dataset']}'s "
                    f"records ({version.overlap['share']}), declared: {version.overlap['reason']}")
    for repair in state.repairs:
        result.notes.append(f"entry {repair.seq}: an interrupted write of {repair.dropped_bytes} bytes was dropped "
                            f"(TAIL_REPAIRED, SHA-256 {repair.dropped_sha256[:16]}...)")
    for run in state.runs.values():
        if run.attempt > 1:
            respent = run.respent
            result.notes.append(
                f"run {run.run_id}: {run.attempt} attempts ({len(run.failures)} failed or crashed), "
                f"{len(respent)} measurement(s) spent more than once, charged "
                f"{format_exact(run.charge())} with every re-spend; each resume and re-spend was within its cap"
            )
        if run.re_release:
            earlier = [r.run_id for r in state.runs.values() if r.started_seq < run.started_seq
                       and r.dataset == run.dataset and r.fingerprint == run.fingerprint]
            result.notes.append(f"run {run.run_id}: a declared re-release of run(s) {', '.join(earlier)}'s records "
                                f"(reason recorded: {run.re_release})")
        if run.validated is False:
            result.notes.append(f"run {run.run_id}: its inputs were not validated by the full suites (--no-validate)")
    for run in state.unpublished():
        result.notes.append(
            f"run {run.run_id} spent {format_exact(run.charge())} and published nothing "
            f"({run.status.value}); complete it without new noise: phsafe private ... --resume {run.run_id}"
        )
    if any(r.non_confidential for r in state.runs.values()):
        result.notes.append("note: the ledger holds runs declared non-confidential (cap not enforced)")

    trusted = _load_public_key(public_key) if public_key is not None else None
    if trusted is not None and not checkpoints and outputs is None:
        raise VerificationFailure("--public-key", "needs --checkpoint or --outputs to check a signature against")
    for path in checkpoints:
        cp = _load_checkpoint_file(Path(path))
        result.notes.append(verify_checkpoint(state, cp, trusted, source=Path(path).name))
    checked: set[str] = set()
    if outputs is not None:
        notes, run_id = verify_outputs(state, Path(outputs), trusted, key, ledger=Path(ledger))
        result.notes.extend(notes)
        checked.add(run_id)
    for run in state.runs.values():
        if run.output_path is None or run.run_id in checked:
            continue
        place = Path(run.output_path)
        if not place.exists():
            result.notes.append(f"run {run.run_id}: published to {place}, not reachable from here "
                                "(check it with --outputs)")
            continue
        notes, _ = verify_outputs(state, place, trusted, key, expected_run=run.run_id, ledger=Path(ledger))
        result.notes.append(f"run {run.run_id}: its release at {place} matches the ledger")
    result.notes.extend(check_public_log(Path(ledger), state))  # last: entry-level failures name the entry first
    _run_actions(ledger_path, state, result, outputs, work_dir)
    result.actions.extend(_log_actions(ledger_path, state))
    return result


# --------------------------------------------------------------------------------------------
# What the operator must do
# --------------------------------------------------------------------------------------------


def _repair_actions(path: Path, state: LedgerState, torn: bytes, data: bytes, result: VerifyResult) -> None:
    """An interrupted write at the ledger's end, or a repair not finished (its record is there)."""
    status = repair_status(path, data, read_repair_record(path))
    if status.stage == "foreign":
        raise VerificationFailure(str(repair_record_path(path)), f"does not describe the ledger ({status.problem}): the "
                                  "ledger changed after its repair began; restore it from its backup")
    if status.pending:
        result.actions.append(status.action(path))
    elif torn:
        result.actions.append(
            f"the ledger ends in an incomplete entry: {len(torn)} bytes of an interrupted write after entry "
            f"{state.size - 1} (nothing was drawn for it; the {state.size} entries before it verify); every use of "
            f"the ledger is refused until `phsafe ledger repair {path}` drops them and records that it did")


def _run_actions(path: Path, state: LedgerState, result: VerifyResult, outputs: Path | None,
                 work_dir: Path | None) -> None:
    """A finished run's leftovers in its work folder; a recorded release without its log files."""
    has_log = state.public_log is not None or log_path(path).is_dir()
    for run in state.runs.values():
        if run.status is not RunStatus.FINISHED:
            continue
        clean = f"`phsafe ledger clean-finished {path} {run.run_id}" + (f" --work-dir {work_dir}`" if work_dir else "`")
        left = leftovers_of(path, run.run_id, run.output_path, work_dir)
        if left:
            result.actions.append(
                f"run {run.run_id} finished (entry {run.terminal_seq}) and its work folder {left.run_dir} still holds "
                f"{left.describe()} (it was stopped before removing them): remove them with {clean}")
        place = Path(run.output_path) if run.output_path else None
        if place is not None and outputs is not None and Path(outputs).absolute() == place.absolute():
            place = Path(outputs)
        if has_log and place is not None and place.is_dir():
            missing = [name for name in RELEASE_LOG_FILES if not (place / name).is_file()]
            if missing:
                result.actions.append(
                    f"run {run.run_id}'s release at {place} has no {' and no '.join(missing)} yet (it was stopped after "
                    f"its publication was recorded): outsiders cannot check it; write them with {clean}")


def _log_actions(path: Path, state: LedgerState) -> list[str]:
    """The public log behind the ledger, or its checkpoint cosigned by fewer than the quorum
    (the log has passed :func:`check_public_log`: it is the projection's prefix and its
    checkpoint verifies)."""
    from phsafe.publog import project
    from phsafe.tlog.checkpoint import parse_checkpoint, verify_checkpoint as verify_note
    from phsafe.tlog.keys import verifier_from_key
    from phsafe.tlog.layout import CHECKPOINT_FILE, ENTRIES_FILE, decode_entries
    from phsafe.tlog.note import parse_note

    folder = log_path(path)
    if state.public_log is None or not folder.is_dir():
        return []
    try:
        whole, torn = decode_entries((folder / ENTRIES_FILE).read_bytes())
        checkpoint = (folder / CHECKPOINT_FILE).read_bytes()
        size = parse_checkpoint(parse_note(checkpoint)[0]).size
        binding = state.public_log
        witnesses = [verifier_from_key(w) for w in binding["witnesses"]]
        cosigners = verify_note(checkpoint, verifier_from_key(binding["vkey"]), witnesses=witnesses).cosigners
    except Exception:  # noqa: BLE001 -- check_public_log has judged the log's files; nothing more to add
        return []
    actions = []
    expected = len(project(state.lines))
    if len(whole) < expected or torn or size < expected:
        actions.append(
            f"the public log {folder} is behind the ledger ({len(whole)} of its {expected} entries, checkpoint of "
            f"{size}): it was stopped between the two appends, and outsiders do not see the last entries until it is "
            f"caught up: run `phsafe ledger repair {path}` (any use of the ledger catches it up too)")
    if len(cosigners) < binding["quorum"]:
        actions.append(
            f"the public log's checkpoint is cosigned by {len(cosigners)} of the {binding['quorum']} witnesses its "
            f"quorum needs (the last request to them failed): outsiders refuse it; run `phsafe ledger cosign {path}`")
    return actions


def _unit(defn: PrivacyDefinition) -> str:
    return "rho" if defn is PrivacyDefinition.ZCDP else "epsilon"


def _lineage_key(ledger: Path, state: LedgerState, given: Path | None) -> bytes | None:
    """The lineage key, checked against the ledger's policy: the given file, else ``<ledger>.key``
    if it is there (None: lineage is not checked)."""
    if state.policy is None:
        if given is not None:
            raise VerificationFailure("--lineage-key", "the ledger has no policy, so no lineage key")
        return None
    path = Path(given) if given is not None else key_path(ledger)
    if given is None and not path.exists():
        return None
    try:
        key = bytes.fromhex(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        raise VerificationFailure(path.name, "is not a readable lineage key") from None
    if key_id(key) != state.policy.key_id:
        raise VerificationFailure(path.name, "is not this ledger's lineage key (its id differs from the policy's)")
    return key


# --------------------------------------------------------------------------------------------
# Checkpoints and signatures
# --------------------------------------------------------------------------------------------


def _load_public_key(path: Path) -> "Ed25519PublicKey":
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (ValueError, OSError) as exc:
        raise VerificationFailure("--public-key", f"cannot load an Ed25519 public key from {Path(path).name} ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise VerificationFailure("--public-key", "is not an Ed25519 public key")
    return key


def _raw(key: "Ed25519PublicKey") -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _load_checkpoint_file(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise VerificationFailure(path.name, f"is not a readable JSON file ({cause_in_words(exc)})") from None
    if isinstance(data, dict) and "checkpoint" in data and "ledger_size" not in data:
        data = data["checkpoint"]  # a manifest: use its checkpoint
    if not isinstance(data, dict):
        raise VerificationFailure(path.name, "holds no checkpoint object")
    return data


def verify_checkpoint(
    state: LedgerState, cp: Mapping[str, Any], trusted: "Ed25519PublicKey | None", *, source: str
) -> str:
    """Check that ``cp`` describes a prefix of the ledger and that its signature verifies.

    Args:
        state: The verified ledger.
        cp: The checkpoint object.
        trusted: The auditor's Ed25519 public key, or None to use the key the checkpoint embeds
            (which proves integrity only against whoever holds that key).
        source: Where the checkpoint came from, for messages.

    Returns:
        A one-line note of what was verified.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    where = f"checkpoint ({source})"
    if not isinstance(cp, Mapping) or set(cp) != CHECKPOINT_KEYS:
        raise VerificationFailure(where, f"must have exactly the fields {sorted(CHECKPOINT_KEYS)}")
    size, head = cp["ledger_size"], cp["head_hash"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise VerificationFailure(where, "ledger_size must be a positive integer")
    if not isinstance(head, str) or len(head) != 64:
        raise VerificationFailure(where, "head_hash must be a SHA-256 hex digest")
    if size > state.size:
        raise VerificationFailure(
            f"entry {state.size}",
            f"missing: the {where} records {size} entries but the ledger has only {state.size} "
            "(entries were removed or the ledger truncated)",
        )
    last = state.entries[size - 1]
    if last["hash"] != head:
        raise VerificationFailure(
            f"entry {size - 1} ({last['kind']})",
            f"its hash is not the head hash of the {where}: the ledger up to here was rewritten",
        )
    signature, embedded = cp["signature"], cp["public_key"]
    if signature is None:
        if trusted is not None:
            raise VerificationFailure(where, "is not signed, but a public key was given to verify it")
        if embedded is not None:
            raise VerificationFailure(where, "has a public key but no signature")
        return f"{where}: prefix of {size} entries holds (unsigned)"
    if not isinstance(signature, str) or not isinstance(embedded, str):
        raise VerificationFailure(where, "signature and public_key must be strings")
    try:
        sig = base64.b64decode(signature, validate=True)
        key = serialization.load_pem_public_key(embedded.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise VerificationFailure(where, f"signature or public key is malformed ({cause_in_words(exc)})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise VerificationFailure(where, "public_key is not an Ed25519 key")
    if trusted is not None and _raw(key) != _raw(trusted):
        raise VerificationFailure(where, "was signed by a key other than the trusted public key")
    try:
        (trusted or key).verify(sig, checkpoint_message(size, head))
    except InvalidSignature:
        raise VerificationFailure(where, "the Ed25519 signature does not verify") from None
    fingerprint = hashlib.sha256(_raw(key)).hexdigest()[:16]
    trust = "the trusted public key" if trusted is not None else "its embedded key (pass --public-key to trust a key)"
    return f"{where}: prefix of {size} entries holds, signature verified with {trust} {fingerprint}"


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------


def verify_outputs(
    state: LedgerState,
    outdir: Path,
    trusted: "Ed25519PublicKey | None" = None,
    key: bytes | None = None,
    *,
    expected_run: str | None = None,
    ledger: Path | None = None,
) -> tuple[list[str], str]:
    """Check a published output directory against the ledger (see the module docstring).

    Args:
        state: The verified ledger.
        outdir: The release folder.
        trusted: The auditor's public key, if any.
        key: The ledger's lineage key, if available: the manifest's lineage commitment is checked.
        expected_run: The run the folder must hold (when checking a recorded publication).
        ledger: The ledger's path: the release's public log files (written after the
            publication was recorded, so not among the logged files) are checked against its
            public log. Without it they are refused like any unlogged file.

    Returns:
        Notes of what was verified, and the run id of the release.
    """
    manifest_path = outdir / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise VerificationFailure(str(manifest_path), f"cannot be read as JSON ({cause_in_words(exc)})") from None
    if not isinstance(manifest, dict) or not {"run_id", "files", "checkpoint"} <= set(manifest):
        raise VerificationFailure(MANIFEST, "needs run_id, files and checkpoint")
    run_id, files = manifest["run_id"], manifest["files"]
    if not isinstance(files, dict):
        raise VerificationFailure(MANIFEST, "files must be an object")
    if expected_run is not None and run_id != expected_run:
        raise VerificationFailure(str(manifest_path), f"holds run {run_id!r}, but the ledger recorded run "
                                  f"{expected_run} as published here")
    run = state.runs.get(run_id) if isinstance(run_id, str) else None
    if run is None:
        raise VerificationFailure(MANIFEST, f"run {run_id!r} is not in the ledger")
    if run.outputs is None:
        raise VerificationFailure(MANIFEST, f"run {run_id} recorded no OUTPUTS_PUBLISHED entry: the ledger does "
                                  "not vouch for this release")
    published = f"entry {run.outputs_seq} (OUTPUTS_PUBLISHED)"
    if run.status is not RunStatus.FINISHED:
        raise VerificationFailure(MANIFEST, f"run {run_id} did not record RUN_FINISHED")
    logged = dict(run.outputs)
    manifest_logged = logged.pop(MANIFEST, None)
    if not run.legacy and manifest_logged is None:
        raise VerificationFailure(published, "does not record the manifest's digest")
    if set(files) != set(logged):
        diff = sorted(set(files) ^ set(logged))[0]
        raise VerificationFailure(published, f"lists other files than the manifest (e.g. {diff})")
    for rel in sorted(files):
        if files[rel] != logged[rel]:
            raise VerificationFailure(published, f"digest of {rel} differs from the manifest's")
    notes = [verify_checkpoint(state, manifest["checkpoint"], trusted, source=MANIFEST)]
    covered = manifest["checkpoint"]["ledger_size"]
    last_spend = max((seq for seqs in run.intents.values() for seq in seqs), default=run.started_seq)
    last_spend = max([last_spend, *run.committed_seq.values()])
    if run.legacy:
        if covered <= (run.terminal_seq or 0):
            raise VerificationFailure(MANIFEST, "its checkpoint does not cover the run's RUN_FINISHED entry")
    elif covered <= last_spend:
        raise VerificationFailure(MANIFEST, "its checkpoint does not cover every spend of the run")
    if key is not None and not run.legacy:
        lineage = manifest.get("lineage")
        want = lineage_commitment(key, run)
        if not isinstance(lineage, dict) or lineage.get("commitment") != want:
            raise VerificationFailure(MANIFEST, "its lineage commitment is not the one the ledger's lineage key gives "
                                      f"for run {run_id}: the release is not linked to the recorded inputs")
        notes.append(f"lineage: the manifest's commitment matches run {run_id}'s recorded dataset, fingerprint "
                     "and input digests under the ledger's lineage key")

    besides = {MANIFEST, *RELEASE_LOG_FILES} if ledger is not None else {MANIFEST}
    on_disk = {
        p.relative_to(outdir).as_posix()
        for p in outdir.rglob("*")
        if p.is_file() and p.relative_to(outdir).as_posix() not in besides
    }
    if manifest_logged is not None and file_digest(manifest_path) != manifest_logged:
        raise VerificationFailure(MANIFEST, f"SHA-256 differs from the digest logged in {published}")
    for rel in sorted(on_disk | set(files)):
        if rel not in files:
            raise VerificationFailure(rel, f"is in the output directory but not in the ledger's {published}")
        if rel not in on_disk:
            raise VerificationFailure(rel, f"is listed in {published} but missing")
        if file_digest(outdir / rel) != files[rel]:
            raise VerificationFailure(rel, f"SHA-256 differs from the digest logged in {published}")
    notes.append(f"outputs: {len(run.outputs)} file digests match {published} of run {run_id}")
    notes.extend(verify_tables(run.planned, outdir, files, committed=run.committed, committed_seq=run.committed_seq))
    if ledger is not None:
        notes.append(check_release_log_files(ledger, state, outdir, run_id))
    return notes, run_id
