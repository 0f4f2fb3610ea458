"""The rules of a ledger of the first format, where they differ from :mod:`phsafe.ledger.rules`.

Ledgers written before policies existed start with their first ``RUN_STARTED`` (no
``LEDGER_INIT``), identify a dataset by the SHA-256 of its input files (``dataset_id``) and give
each run a cap of its own; their ``OUTPUTS_PUBLISHED`` has no ``output`` path; a run could finish
without publishing, and an attempt that published could still fail. They still verify under those
rules until ``LEDGER_MIGRATED`` gives them a policy (see "Migration" in
:mod:`phsafe.ledger.format`); from then on :data:`phsafe.ledger.rules.RULES` applies, and a run of
the first format takes no further entry.
"""

from __future__ import annotations

from typing import Any, Mapping

from phsafe.amounts import add_amounts, amount_exceeds, format_exact, is_infinite
from phsafe.errors import LedgerRuleViolation
from phsafe.ledger.format import EntryKind, dataset_id, is_hex64, is_text
from phsafe.ledger.rules import (
    RULES,
    Check,
    Commit,
    amount_field,
    new_run,
    outputs_published,
    resumable,
    resume_commit,
    run_failed,
    run_finished,
    started_fields,
)
from phsafe.ledger.state import LedgerState


def check_run_started(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_STARTED of the first format: dataset id from file digests, a cap per run."""
    defn, planned, total = started_fields(state, e)
    non_conf = e["non_confidential"]
    if e["dataset_id"] != dataset_id(e["input_digests"]):
        raise LedgerRuleViolation("dataset_id is not the digest of the input digests")
    cap = amount_field(e, "lifetime_cap")
    if is_infinite(cap) and not non_conf:
        raise LedgerRuleViolation("an Infinity lifetime cap is allowed only in a non-confidential run")
    reason = e["cap_reason"]
    if reason is not None and not is_text(reason):
        raise LedgerRuleViolation("cap_reason must be null or a short string")
    if amount_exceeds(cap, total) and not (reason and reason.strip()):
        raise LedgerRuleViolation("a lifetime cap above the planned total needs a recorded cap_reason")
    odometer = state.dataset_spent(f"legacy:{e['dataset_id']}", defn)
    if amount_field(e, "spent_before") != odometer:
        raise LedgerRuleViolation(
            f"spent_before {e['spent_before']} differs from the ledger's spends on this dataset "
            f"({format_exact(odometer)})"
        )
    if not non_conf and amount_exceeds(add_amounts(odometer, total), cap):
        raise LedgerRuleViolation(
            f"run exceeds the lifetime cap: spent {format_exact(odometer)} + planned "
            f"{format_exact(total)} > cap {format_exact(cap)}"
        )
    run = new_run(e, defn, planned, total, dataset=None, fingerprint=None, legacy_id=e["dataset_id"],
                  cap=cap, cap_reason=reason, spent_before=odometer, validated=None)

    def commit() -> None:
        state.runs[run.run_id] = run

    return commit


def check_run_resumed(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_RESUMED of the first format: it carries the run's cap (kept or raised)."""
    run = resumable(state, e)
    if not is_hex64(e["dataset_id"]):
        raise LedgerRuleViolation("dataset_id is not a SHA-256 hex digest")
    if e["dataset_id"] != run.legacy_dataset_id:
        raise LedgerRuleViolation(
            f"dataset_id differs from the run's RUN_STARTED (entry {run.started_seq}): other inputs"
        )
    cap = amount_field(e, "lifetime_cap")
    if is_infinite(cap) and not run.non_confidential:
        raise LedgerRuleViolation("an Infinity lifetime cap is allowed only in a non-confidential run")
    cap_reason = e["cap_reason"]
    if cap_reason is not None and not is_text(cap_reason):
        raise LedgerRuleViolation("cap_reason must be null or a short string")
    if amount_exceeds(run.lifetime_cap, cap):
        raise LedgerRuleViolation(
            f"lifetime_cap {e['lifetime_cap']} is below the run's cap {format_exact(run.lifetime_cap)}: "
            "a cap is kept or raised, never lowered"
        )
    if amount_exceeds(cap, run.lifetime_cap) and not (cap_reason and cap_reason.strip()):
        raise LedgerRuleViolation("a lifetime cap above the run's previous cap needs a recorded cap_reason")
    after = state.resume_odometer(run)
    if not run.non_confidential and amount_exceeds(after, cap):
        raise LedgerRuleViolation(
            f"resumed run exceeds the lifetime cap: the dataset's odometer with the run reserved "
            f"again is {format_exact(after)} > cap {format_exact(cap)}"
        )
    return resume_commit(e, run, cap, cap_reason)


def check_outputs_published(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """OUTPUTS_PUBLISHED of the first format: no ``output`` path."""
    return outputs_published(state, e, output_required=False)


def check_run_finished(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_FINISHED of the first format: a run could finish without publishing."""
    return run_finished(state, e, publication_required=False)


def check_run_failed(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_FAILED of the first format: an attempt that published could still fail."""
    return run_failed(state, e, after_publication=True)


FIRST_FORMAT_RULES: dict[EntryKind, Check] = {
    **RULES,
    EntryKind.RUN_STARTED: check_run_started,
    EntryKind.RUN_RESUMED: check_run_resumed,
    EntryKind.OUTPUTS_PUBLISHED: check_outputs_published,
    EntryKind.RUN_FINISHED: check_run_finished,
    EntryKind.RUN_FAILED: check_run_failed,
}
"""The check of each entry kind in a ledger without a policy (first format, before migration).
The kinds that need a policy (``CAP_RAISED``, ``DATASET_VERSION``) refuse through their own check."""
