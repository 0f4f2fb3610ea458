"""The confidential audit's checks of the public log: it is exactly the projection of the ledger.

Used by ``phsafe audit verify`` (which holds the ledger): the log the ledger's first entry (or
``LOG_BOUND``) binds must be there; its entries must be the projection (:mod:`.projection`) of
the verified ledger, byte for byte; its checkpoint must be signed by the bound log key and be a
tree head of those entries, and its cosignatures are checked against the bound witness keys; a
release folder's log files must be its run's ``release`` entry and a proof of it that verifies.

A log *behind* the ledger is the trace of a process stopped between its ledger append and its
log append (the ledger is written first); it is reported, not failed -- the next use of the
ledger (or ``phsafe ledger repair``) catches it up. Likewise a checkpoint cosigned by fewer than
the quorum (the last request to the witnesses failed: ``phsafe ledger cosign`` asks again).
Anything else is a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phsafe.errors import TlogError, VerificationFailure
from phsafe.ledger.state import LedgerState
from phsafe.publog.log import ENTRY_FILE, PROOF_FILE, log_key_path, log_path
from phsafe.publog.projection import project, release_entry_index
from phsafe.tlog.checkpoint import verify_checkpoint
from phsafe.tlog.keys import verifier_from_key
from phsafe.tlog.layout import CHECKPOINT_FILE, ENTRIES_FILE, VERIFIER_KEY_FILE, decode_entries
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.note import parse_note
from phsafe.tlog.proof import parse_tlog_proof, verify_tlog_proof


def _bound_keys(ledger: Path, state: LedgerState) -> tuple[Any, list[Any], int]:
    """The log's verifier key and the witnesses' keys and quorum: as bound, or -- for a ledger of
    format 2 -- the folder's own key and no witness."""
    folder = log_path(ledger)
    if state.public_log is not None:
        binding = state.public_log
        return (verifier_from_key(binding["vkey"]), [verifier_from_key(w) for w in binding["witnesses"]],
                binding["quorum"])
    try:
        return verifier_from_key((folder / VERIFIER_KEY_FILE).read_text(encoding="utf-8")), [], 0
    except (OSError, UnicodeDecodeError, TlogError) as exc:
        raise VerificationFailure(str(folder), f"cannot be read ({exc})") from None


def check_public_log(ledger: Path, state: LedgerState) -> list[str]:
    """Notes on the ledger's public log; VerificationFailure if it is not the projection."""
    folder = log_path(ledger)
    if state.public_log is None and not folder.exists() and not log_key_path(ledger).exists():
        return ["public log: none (the ledger was made before public logs; nothing of it can be checked "
                "outside the enclave)"]
    where = str(folder)
    if state.public_log is not None and not folder.is_dir():
        raise VerificationFailure(where, f"is missing: the ledger is bound to it (entry {state.public_log_seq}, "
                                         f"origin {state.public_log['origin']})")
    verifier, witnesses, quorum = _bound_keys(ledger, state)
    try:
        published_key = (folder / VERIFIER_KEY_FILE).read_text(encoding="utf-8").strip()
        checkpoint = (folder / CHECKPOINT_FILE).read_bytes()
        data = (folder / ENTRIES_FILE).read_bytes()
    except (OSError, UnicodeDecodeError) as exc:
        raise VerificationFailure(where, f"cannot be read ({exc})") from None
    if state.public_log is not None and published_key != state.public_log["vkey"]:
        raise VerificationFailure(f"{where}/{VERIFIER_KEY_FILE}", "is not the key of the log the ledger is bound to")
    try:
        verified = verify_checkpoint(checkpoint, verifier, witnesses=witnesses)
    except TlogError as exc:
        raise VerificationFailure(f"{where}/{CHECKPOINT_FILE}", f"does not verify with the log key ({exc})") from None
    expected = project(state.lines)
    whole, torn = decode_entries(data)
    for index, (got, want) in enumerate(zip(whole, expected)):
        if got != want:
            raise VerificationFailure(f"{where}/{ENTRIES_FILE}",
                                      f"entry {index} is not the projection of the ledger's public facts")
    if len(whole) > len(expected):
        raise VerificationFailure(f"{where}/{ENTRIES_FILE}", f"holds {len(whole)} entries; the ledger projects "
                                  f"{len(expected)}: it records what the ledger does not")
    size = verified.checkpoint.size
    if size > len(whole) or TransparencyLog.of_entries(whole[:size]).root() != verified.checkpoint.root_hash:
        raise VerificationFailure(f"{where}/{CHECKPOINT_FILE}", f"its tree of {size} entries is not the log's")
    others = sorted({s.name for s in parse_note(checkpoint)[1] if s.name != verifier.name
                     and s.name not in verified.cosigners})
    cosigned = (f", cosigned by {', '.join(verified.cosigners)} ({len(verified.cosigners)} of the {len(witnesses)} "
                f"bound witnesses, quorum {quorum})" if witnesses else ", with no witness (none bound)")
    notes = [f"public log: {len(whole)} entries, exactly the projection of the ledger's public facts; "
             f"checkpoint of {size} entries signed by {verifier.name}{cosigned}"
             + (f"; signature lines by keys not bound: {', '.join(others)}" if others else "")]
    if len(verified.cosigners) < quorum:
        notes.append(f"public log: its checkpoint is cosigned by {len(verified.cosigners)} of the {quorum} witnesses "
                     "the quorum needs (the last request to them failed): `phsafe ledger cosign LEDGER` asks again")
    if len(whole) < len(expected) or torn or size < len(whole):
        notes.append(f"public log: behind the ledger ({len(whole)} of {len(expected)} entries, checkpoint of {size}"
                     f"{', a torn last line' if torn else ''}): an append was interrupted; the ledger's next use "
                     "or `phsafe ledger repair` catches it up")
    return notes


def check_release_log_files(ledger: Path, state: LedgerState, outdir: Path, run_id: str) -> str:
    """A release folder's log entry and proof: its run's ``release`` entry, proved in the log.

    They are written after the release is recorded, so a run stopped in between has neither or
    (between the two renames) one of them: what is there must be right, and what is not is
    reported as not yet written (resuming or retrying the run writes it)."""
    folder = log_path(ledger)
    present = [name for name in (ENTRY_FILE, PROOF_FILE) if (outdir / name).is_file()]
    if not present:
        if folder.exists():
            return (f"public log: the release has no {ENTRY_FILE}/{PROOF_FILE} yet (stopped after recording it); "
                    "resuming or retrying the run writes them")
        return "public log: none"
    expected = project(state.lines)
    index = release_entry_index(expected, run_id)
    if index is None:
        raise VerificationFailure(present[0], f"is in a release folder of run {run_id}, which has no release entry "
                                  "in the public log")
    if ENTRY_FILE in present and (outdir / ENTRY_FILE).read_bytes() != expected[index]:
        raise VerificationFailure(ENTRY_FILE, f"is not the public log's release entry of run {run_id}")
    if PROOF_FILE not in present:
        return (f"public log: {ENTRY_FILE} is entry {index}, the projection of run {run_id}'s release; the release "
                f"has no {PROOF_FILE} yet (stopped while writing it): resuming or retrying the run writes it")
    entry = expected[index]
    verifier, witnesses, quorum = _bound_keys(ledger, state)
    try:
        proof = parse_tlog_proof((outdir / PROOF_FILE).read_bytes())
        verified = verify_tlog_proof(proof, entry, verifier, witnesses=witnesses, quorum=quorum)
    except (OSError, TlogError) as exc:
        raise VerificationFailure(PROOF_FILE, f"does not prove the entry in the public log ({exc})") from None
    size = verified.checkpoint.size
    if proof.index != index or size > len(expected) \
            or TransparencyLog.of_entries(expected[:size]).root() != verified.checkpoint.root_hash:
        raise VerificationFailure(PROOF_FILE, "proves the entry against a checkpoint that is not a tree head of the "
                                  "ledger's projection")
    if ENTRY_FILE not in present:
        return (f"public log: {PROOF_FILE} proves the release entry of run {run_id} (entry {index}) in the "
                f"checkpoint of {size} entries; the release has no {ENTRY_FILE} yet (stopped while writing it): "
                "resuming or retrying the run writes it")
    cosigned = f", cosigned by {', '.join(verified.cosigners)}" if verified.cosigners else ""
    return (f"public log: {ENTRY_FILE} is entry {index}, the projection of run {run_id}'s release; "
            f"{PROOF_FILE} proves it in the checkpoint of {verified.checkpoint.size} entries{cosigned}")
