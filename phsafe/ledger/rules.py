"""The ledger's rules: one check per entry kind, chosen through an explicit table.

A check takes the :class:`~phsafe.ledger.state.LedgerState` of every entry before it and one
parsed entry (:func:`phsafe.ledger.format.parse_line`). It raises
:class:`~phsafe.errors.LedgerRuleViolation` naming the rule the entry breaks, or returns the
*commit*: the update that adds the entry to the state, applied only once every check passed
(:func:`phsafe.ledger.replay.apply`). Checks read the state and never change it, and they touch no
file: they can be tested on entries built in memory.

:data:`RULES` maps each kind to its check for a ledger with a policy (``LEDGER_INIT``, or
``LEDGER_MIGRATED`` after the first format); the few rules of a ledger of the first format that
differ are in :mod:`phsafe.ledger.first_format`. The rules themselves are stated in
:mod:`phsafe.ledger.format`'s docstring.
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import lru_cache
from fractions import Fraction
from typing import Any, Callable, Mapping

from phsafe.accounting import PlannedMeasurement
from phsafe.amounts import (
    DECIMAL_TEXT,
    INFINITE,
    Amount,
    add_amounts,
    amount_exceeds,
    format_exact,
    is_infinite,
    parse_exact,
)
from phsafe.config import PrivacyDefinition
from phsafe.errors import LedgerRuleViolation
from phsafe.iterations import PopulationGroupLevel
from phsafe.overlap import OVERLAP_LIMIT, overlap_share, percent, sketch_problem
from phsafe.ledger.format import (
    FAILURE_CODES,
    FAILURE_STAGES,
    FORMAT,
    FORMATS,
    LOG_BINDING_FIELDS,
    NAME,
    ORCHESTRATION_FIELDS,
    PLANNED_FIELDS,
    PLANNED_OPTIONAL_FIELDS,
    UUID,
    EntryKind,
    is_hex64,
    is_int,
    is_safe_relpath,
    is_text,
    planned_item,
)
from phsafe.ledger.policy import Policy
from phsafe.ledger.state import (
    CapChange,
    DatasetState,
    DatasetVersion,
    LedgerState,
    Orchestration,
    PlannedSpend,
    RunAttempt,
    RunState,
    RunStatus,
    TailRepair,
)
from phsafe.sensitivity import SensitivityBound, declared
from phsafe.tables import TABLE_LEVELS, TABLES, TableKind

Commit = Callable[[], None]
"""Adds a checked entry to the state."""
Check = Callable[[LedgerState, Mapping[str, Any]], Commit]
"""The rules of one entry kind: raise :class:`~phsafe.errors.LedgerRuleViolation`, or return the commit."""

LEVELS: dict[str, dict[str, PopulationGroupLevel]] = {
    t: {lv.config_key: lv for lv in levels} for t, levels in TABLE_LEVELS.items()
}


# --------------------------------------------------------------------------------------------
# The ledger's own entries
# --------------------------------------------------------------------------------------------


def policy_fields(e: Mapping[str, Any]) -> tuple[PrivacyDefinition, Amount, str, bool]:
    """The policy fields of LEDGER_INIT or LEDGER_MIGRATED, checked: unit, cap, reason, kind."""
    defn = privacy_defn_field(e)
    cap = amount_field(e, "lifetime_cap")
    if is_infinite(cap) and not e["non_confidential"]:
        raise LedgerRuleViolation("an Infinity lifetime cap is allowed only in a non-confidential ledger")
    reason = e["reason"]
    if not is_text(reason) or not reason.strip():
        raise LedgerRuleViolation("reason must be a non-empty short string")
    if e["format"] not in FORMATS:
        raise LedgerRuleViolation(f"format must be {FORMAT} (or {FORMATS[0]}, written before public logs were bound)")
    if not isinstance(e["ledger_id"], str) or not re.fullmatch(r"[0-9a-f]{32}", e["ledger_id"]):
        raise LedgerRuleViolation("ledger_id must be 32 lowercase hex digits")
    if not isinstance(e["key_id"], str) or not re.fullmatch(r"[0-9a-f]{32}", e["key_id"]):
        raise LedgerRuleViolation("key_id must be 32 lowercase hex digits")
    if not is_text(e["code_version"]):
        raise LedgerRuleViolation("code_version must be a short string")
    return defn, cap, reason, e["non_confidential"]


def set_policy(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """Check the policy fields; the commit makes them the ledger's policy (and, for LEDGER_INIT of
    format 3, binds its public log)."""
    defn, cap, reason, non_conf = policy_fields(e)
    ledger_cap = amount_field(e, "ledger_cap") if "ledger_cap" in e else None
    if ledger_cap is not None and (is_infinite(ledger_cap) or ledger_cap <= 0 or non_conf):
        raise LedgerRuleViolation("ledger_cap must be a positive finite amount, in a confidential ledger only")
    binding = None
    if e["kind"] == EntryKind.LEDGER_INIT.value and e["format"] == FORMAT:
        if "public_log" not in e:
            raise LedgerRuleViolation(f"a ledger of format {FORMAT} is bound to its public log from LEDGER_INIT "
                                      "(public_log is missing)")
        binding = log_binding_field(e["public_log"])
    elif "public_log" in e:
        raise LedgerRuleViolation(f"public_log is bound by LEDGER_INIT of format {FORMAT} only")

    def commit() -> None:
        state.policy = Policy(e["ledger_id"], defn, cap, reason, non_conf, e["key_id"], e["seq"], ledger_cap,
                              e["format"])
        state.format = e["format"]
        if binding is not None:
            state.public_log, state.public_log_seq = binding, e["seq"]

    return commit


def log_binding_field(value: Any) -> dict[str, Any]:
    """``public_log``, checked: the log's origin and verifier key (type 0x01, the origin its
    name), every witness's verifier key (type 0x04, distinct keys) and the quorum."""
    from phsafe.errors import TlogError
    from phsafe.tlog.keys import format_verifier_key, verifier_from_key
    from phsafe.tlog.note import ALG_COSIGNATURE_V1, ALG_ED25519

    if not isinstance(value, dict) or set(value) != LOG_BINDING_FIELDS:
        raise LedgerRuleViolation("public_log must hold exactly origin, vkey, witnesses and quorum")
    vkey, witnesses, quorum = value["vkey"], value["witnesses"], value["quorum"]

    def key(text: Any, what: str, alg: int) -> Any:
        try:
            verifier = verifier_from_key(text) if isinstance(text, str) else None
        except TlogError:
            verifier = None
        if verifier is None or verifier.alg != alg or format_verifier_key(verifier) != text:
            raise LedgerRuleViolation(f"{what} is not a {'log' if alg == ALG_ED25519 else 'witness'}'s verifier key")
        return verifier

    log = key(vkey, "public_log.vkey", ALG_ED25519)
    if value["origin"] != log.name:
        raise LedgerRuleViolation("public_log.origin is not the name of the log's key")
    if not isinstance(witnesses, list):
        raise LedgerRuleViolation("public_log.witnesses must be a list of verifier keys")
    publics = [key(w, f"public_log.witnesses[{i}]", ALG_COSIGNATURE_V1).public_key for i, w in enumerate(witnesses)]
    if len(set(publics)) != len(publics) or log.public_key in publics:
        raise LedgerRuleViolation("public_log.witnesses must be distinct keys, none the log's own")
    if not is_int(quorum) or not (1 if witnesses else 0) <= quorum <= len(witnesses):
        raise LedgerRuleViolation("public_log.quorum must be 1 to the number of witnesses (0 without witnesses)")
    return dict(value)


def check_log_bound(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """LOG_BOUND: binds the public log that a ledger of format 2, begun with LEDGER_INIT, has had
    since its init; from then on the ledger is of format 3."""
    policy = needs_policy(state)
    if state.public_log is not None:
        raise LedgerRuleViolation(f"the ledger is bound to its public log already (entry {state.public_log_seq})")
    if policy.seq != 0:
        raise LedgerRuleViolation("a ledger migrated from the first format has no public log to bind")
    binding = log_binding_field(e["public_log"])
    reason = e["reason"]
    if not is_text(reason) or not reason.strip():
        raise LedgerRuleViolation("reason must be a non-empty short string")

    def commit() -> None:
        state.public_log, state.public_log_seq = binding, e["seq"]
        state.format = FORMAT

    return commit


def check_ledger_init(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """LEDGER_INIT: entry 0 only; it fixes the policy (and the datasets it accounts, if it declares them)."""
    if e["seq"] != 0:
        raise LedgerRuleViolation("LEDGER_INIT can only be the first entry")
    commit_policy = set_policy(state, e)
    declared = declared_datasets_field(e["datasets"]) if "datasets" in e else None

    def commit() -> None:
        commit_policy()
        state.declared_datasets = declared

    return commit


def declared_datasets_field(value: Any) -> tuple[str, ...]:
    """LEDGER_INIT's ``datasets``: one or more dataset names, sorted and distinct (one encoding)."""
    if not isinstance(value, list) or not value or not all(isinstance(n, str) and NAME.fullmatch(n) for n in value):
        raise LedgerRuleViolation("datasets must be a non-empty list of dataset names")
    if value != sorted(set(value)):
        raise LedgerRuleViolation("datasets must be sorted and distinct")
    return tuple(value)


def dataset_open(state: LedgerState, name: str) -> None:
    """The ledger accounts ``name``: declared by its policy (if it declares its datasets), not retired."""
    refusal = state.dataset_refusal(name)
    if refusal is not None:
        raise LedgerRuleViolation(refusal, rule="dataset-closed", dataset=name, text=refusal)


def check_dataset_retired(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """DATASET_RETIRED: a dataset the ledger accounts, with no open run, retired once, with a
    reason and optionally the successor log (origin and key ID)."""
    from phsafe.errors import TlogError
    from phsafe.ledger.format import SUCCESSOR_FIELDS
    from phsafe.tlog.note import check_key_name

    needs_policy(state)
    name = e["dataset"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise LedgerRuleViolation("dataset is not a valid dataset name")
    if name in state.retired:
        raise LedgerRuleViolation(f"dataset {name!r} was retired already (entry {state.retired[name]})",
                                  rule="dataset-closed", dataset=name,
                                  text=f"dataset {name!r} was retired from this ledger already (entry {state.retired[name]})")
    known = state.dataset_states.get(name)
    accounted = (name in state.declared_datasets if state.declared_datasets is not None
                 else bool(known and known.versions) or any(r.dataset == name for r in state.runs.values()))
    if not accounted:
        text = f"this ledger does not account dataset {name!r}: there is nothing of it to retire"
        raise LedgerRuleViolation(text, rule="dataset-closed", dataset=name, text=text)
    open_runs = sorted(r.run_id for r in state.runs.values() if r.dataset == name and r.status is RunStatus.RUNNING)
    if open_runs:
        text = (f"run {open_runs[0]} of dataset {name!r} is open (running, or crashed without ending): it can still "
                "spend -- resume it to its end (or let it fail) before the dataset is retired")
        raise LedgerRuleViolation(text, rule="dataset-closed", dataset=name, text=text)
    reason = e["reason"]
    if not is_text(reason) or not reason.strip():
        raise LedgerRuleViolation("a retirement needs a reason (a non-empty short string)")
    successor = e.get("successor")
    if successor is not None:
        if not isinstance(successor, dict) or set(successor) != SUCCESSOR_FIELDS:
            raise LedgerRuleViolation("successor must hold exactly origin and key_id")
        try:
            check_key_name(successor["origin"] if isinstance(successor["origin"], str) else "")
        except TlogError:
            raise LedgerRuleViolation("successor.origin is not a log's name") from None
        if not isinstance(successor["key_id"], str) or not re.fullmatch(r"[0-9a-f]{8}", successor["key_id"]):
            raise LedgerRuleViolation("successor.key_id must be 8 lowercase hex digits")
        if state.public_log is not None and successor["origin"] == state.public_log["origin"]:
            raise LedgerRuleViolation("successor names this ledger's own log")

    def commit() -> None:
        state.retired[name] = e["seq"]

    return commit


def check_ledger_migrated(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """LEDGER_MIGRATED: once, on a ledger of the first format with runs; it fixes the policy and
    names every old dataset id, all of whose runs are of the policy's kind."""
    if state.policy is not None:
        raise LedgerRuleViolation("the ledger already has a policy (LEDGER_INIT or LEDGER_MIGRATED)")
    if not state.runs:
        raise LedgerRuleViolation("only a ledger of the first format with runs is migrated; a new one is initialised")
    names = e["datasets"]
    if not isinstance(names, dict):
        raise LedgerRuleViolation("datasets must map old dataset ids to names")
    legacy_ids = {r.legacy_dataset_id for r in state.runs.values()}
    if set(names) != legacy_ids:
        missing = sorted(legacy_ids - set(names))
        raise LedgerRuleViolation(f"datasets must name every old dataset id exactly (missing {missing[:1]})"
                                  if missing else "datasets names an id no run of the ledger has")
    for old, name in names.items():
        if not is_hex64(old) or not isinstance(name, str) or not NAME.fullmatch(name):
            raise LedgerRuleViolation("datasets must map SHA-256 hex ids to dataset names")
    commit_policy = set_policy(state, e)
    non_conf = e["non_confidential"]
    if any(r.non_confidential != non_conf for r in state.runs.values()):
        raise LedgerRuleViolation("a ledger's runs must all be confidential, or all non-confidential, as its policy says")

    def commit() -> None:
        commit_policy()
        state.legacy_names = dict(names)
        for run in state.runs.values():
            run.dataset = names[run.legacy_dataset_id]

    return commit


def needs_policy(state: LedgerState) -> Policy:
    """The ledger's policy; a ledger of the first format takes no entry that needs one."""
    if state.policy is None:
        raise LedgerRuleViolation("a ledger of the first format takes no new entry: migrate it first "
                                  "(phsafe ledger migrate)")
    return state.policy


def check_cap_raised(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """CAP_RAISED: a dataset's cap only ever goes up, with a reason; Infinity only when non-confidential."""
    policy = needs_policy(state)
    name = e["dataset"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise LedgerRuleViolation("dataset is not a valid dataset name")
    dataset_open(state, name)
    cap = amount_field(e, "lifetime_cap")
    if is_infinite(cap) and not policy.non_confidential:
        raise LedgerRuleViolation("an Infinity lifetime cap is allowed only in a non-confidential ledger")
    current = state.dataset_cap(name)
    if not amount_exceeds(cap, current):
        raise LedgerRuleViolation(f"lifetime_cap {e['lifetime_cap']} does not raise {name}'s cap "
                                  f"{format_exact(current)}: a cap is only ever raised",
                                  rule="cap-not-raised", dataset=name, cap=cap, current=current)
    reason = e["reason"]
    if not is_text(reason) or not reason.strip():
        raise LedgerRuleViolation("a cap raise needs a reason (a non-empty short string)", rule="cap-reason",
                                  dataset=name, cap=cap)

    def commit() -> None:
        ds = state.dataset_states.setdefault(name, DatasetState(name, policy.lifetime_cap))
        ds.lifetime_cap = cap
        ds.raises.append(CapChange(e["seq"], e["time"], cap, reason))

    return commit


def check_dataset_version(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """DATASET_VERSION: a content version is declared once, under one dataset name, with a reason."""
    policy = needs_policy(state)
    name, fp = dataset_and_fingerprint(e)
    dataset_open(state, name)
    owner = state.fingerprints.get(fp)
    if owner is not None:
        raise LedgerRuleViolation(f"this content version is already declared under dataset {owner!r}"
                                  + ("" if owner != name else " (declared twice)"),
                                  rule="version-owned", owner=owner, dataset=name)
    reason = e["reason"]
    if not is_text(reason) or not reason.strip():
        raise LedgerRuleViolation("a dataset version needs a reason (a non-empty short string)")
    sketch, overlap = e.get("sketch"), e.get("overlap")
    check_overlap(state, name, sketch, overlap, non_confidential=policy.non_confidential)

    def commit() -> None:
        ds = state.dataset_states.setdefault(name, DatasetState(name, policy.lifetime_cap))
        ds.versions.append(DatasetVersion(e["seq"], e["time"], fp, reason, sketch, overlap))
        state.fingerprints[fp] = name

    return commit


def ledger_total_after(state: LedgerState, dataset: str, dataset_after: Amount) -> Amount:
    """All datasets' spends together once ``dataset``'s odometer is ``dataset_after``."""
    unit = needs_policy(state).privacy_defn
    others: Amount = Fraction(0)
    for run in state.runs.values():
        if run.account != dataset:
            others = add_amounts(others, run.charge(unit))
    return add_amounts(others, dataset_after)


def check_ledger_cap(state: LedgerState, dataset: str, dataset_after: Amount, what: str) -> None:
    """The ledger-wide cap, if ``ledger init`` set one, admits ``dataset``'s odometer at ``dataset_after``."""
    policy = needs_policy(state)
    if policy.ledger_cap is None or policy.non_confidential:
        return
    total = ledger_total_after(state, dataset, dataset_after)
    if amount_exceeds(total, policy.ledger_cap):
        raise LedgerRuleViolation(f"{what} exceeds the ledger-wide cap: all datasets' spends would be "
                                  f"{format_exact(total)} > ledger cap {format_exact(policy.ledger_cap)}",
                                  rule="ledger-cap", total=total, cap=policy.ledger_cap)


def check_overlap(state: LedgerState, name: str, sketch: Any, overlap: Any, *, non_confidential: bool) -> None:
    """A new version's sketch, and ``overlap`` exactly when its records overlap another dataset's
    beyond the limit (see "Overlap between datasets")."""
    if sketch is None:
        if overlap is not None:
            raise LedgerRuleViolation("overlap is declared without a sketch of the records")
        return
    if non_confidential:
        raise LedgerRuleViolation("a non-confidential ledger records no sketch")
    problem = sketch_problem(sketch)
    if problem:
        raise LedgerRuleViolation(problem)
    found = largest_overlap(state, name, sketch)
    if found is None:
        if overlap is not None:
            raise LedgerRuleViolation("overlap is declared, but these records overlap no other dataset's beyond "
                                      f"{percent(OVERLAP_LIMIT)}", rule="overlap-unneeded")
        return
    other, share = found
    if overlap is None:
        raise LedgerRuleViolation(f"about {percent(share)} of these records are also in dataset {other!r}: a version "
                                  "whose records overlap another dataset's must declare overlap",
                                  rule="overlap-undeclared", other=other)
    if not isinstance(overlap, Mapping) or set(overlap) != {"dataset", "share", "reason"}:
        raise LedgerRuleViolation("overlap must be an object with dataset, share and reason")
    if overlap["dataset"] != other or overlap["share"] != percent(share):
        raise LedgerRuleViolation(f"overlap names dataset {overlap['dataset']!r} at {overlap['share']!r}; the sketches "
                                  f"give {other!r} at {percent(share)!r}")
    if not is_text(overlap["reason"]) or not overlap["reason"].strip():
        raise LedgerRuleViolation("overlap needs a reason (a non-empty short string)")


def largest_overlap(state: LedgerState, name: str, sketch: Mapping[str, Any]) -> tuple[str, Fraction] | None:
    """The other dataset whose declared versions share the largest part of ``sketch``'s records,
    and that share -- when it exceeds the limit; else None."""
    best: tuple[str, Fraction] | None = None
    for other, ds in sorted(state.dataset_states.items()):
        if other == name:
            continue
        for version in ds.versions:
            if version.sketch is None:
                continue
            share = overlap_share(sketch, version.sketch)
            if share > OVERLAP_LIMIT and (best is None or share > best[1]):
                best = (other, share)
    return best


def check_tail_repaired(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """TAIL_REPAIRED: the length and SHA-256 of the dropped bytes, and why."""
    if not is_int(e["dropped_bytes"]) or e["dropped_bytes"] < 1:
        raise LedgerRuleViolation("dropped_bytes must be a positive integer")
    if not is_hex64(e["dropped_sha256"]):
        raise LedgerRuleViolation("dropped_sha256 is not a SHA-256 hex digest")
    if not is_text(e["reason"]):
        raise LedgerRuleViolation("reason must be a short string")

    def commit() -> None:
        state.repairs.append(TailRepair(e["seq"], e["time"], e["dropped_bytes"], e["dropped_sha256"], e["reason"]))

    return commit


# --------------------------------------------------------------------------------------------
# The runs
# --------------------------------------------------------------------------------------------


def running(state: LedgerState, entry: Mapping[str, Any]) -> RunState:
    """The entry's run, which must be running (and not a first-format run of a migrated ledger)."""
    run = state.runs.get(entry["run_id"])
    if run is None:
        raise LedgerRuleViolation(f"run {entry['run_id']!r} was never started", rule="never-started")
    if run.status is not RunStatus.RUNNING:
        raise LedgerRuleViolation(f"run {entry['run_id']!r} already ended at entry {run.terminal_seq}",
                                  rule="run-ended", run_id=run.run_id)
    if run.legacy and state.policy is not None:
        raise LedgerRuleViolation(f"run {entry['run_id']!r} is of the first ledger format; the ledger was migrated since")
    return run


def started_fields(state: LedgerState,
                   e: Mapping[str, Any]) -> tuple[PrivacyDefinition, dict[str, PlannedSpend], Amount]:
    """The checks RUN_STARTED of both formats share: ids, digests, key, plan."""
    run_id = e["run_id"]
    if run_id in state.runs:
        raise LedgerRuleViolation(f"run id {run_id!r} was already started at entry {state.runs[run_id].started_seq}")
    digests = e["input_digests"]
    if not isinstance(digests, dict) or not digests:
        raise LedgerRuleViolation("input_digests must be a non-empty object")
    for name, digest in digests.items():
        if not NAME.fullmatch(name) or not is_hex64(digest):
            raise LedgerRuleViolation("input_digests must map file names to SHA-256 hex digests")
    if not is_hex64(e["config_digest"]):
        raise LedgerRuleViolation("config_digest is not a SHA-256 hex digest")
    if not is_text(e["code_version"]):
        raise LedgerRuleViolation("code_version must be a short string")
    if not isinstance(e["truncation_key"], str) or not re.fullmatch(r"(?:[0-9a-f]{2}){8,128}", e["truncation_key"]):
        raise LedgerRuleViolation("truncation_key must be 8 to 128 bytes of lowercase hex")
    defn = privacy_defn_field(e)
    planned = parse_planned(e["planned"], defn)
    total: Amount = Fraction(0)
    for spend in planned.values():
        total = add_amounts(total, spend.budget)
    if amount_field(e, "planned_total") != total:
        raise LedgerRuleViolation(f"planned_total {e['planned_total']} is not the sum of the planned budgets ({format_exact(total)})")
    if is_infinite(total) and not e["non_confidential"]:
        raise LedgerRuleViolation("an Infinity budget is allowed only in a non-confidential run", rule="infinite-budget")
    return defn, planned, total


def new_run(e: Mapping[str, Any], defn: PrivacyDefinition, planned: dict[str, PlannedSpend],
            total: Amount, *, dataset: str | None, fingerprint: str | None, legacy_id: str | None,
            cap: Amount, cap_reason: str | None, spent_before: Amount, validated: bool | None) -> RunState:
    """The state of a run its (checked) RUN_STARTED opens."""
    return RunState(
        run_id=e["run_id"], started_seq=e["seq"], started_time=e["time"], dataset=dataset,
        fingerprint=fingerprint, privacy_defn=defn, input_digests=dict(e["input_digests"]),
        config_digest=e["config_digest"], code_version=e["code_version"],
        truncation_key=e["truncation_key"], planned=planned, planned_total=total,
        lifetime_cap=cap, cap_reason=cap_reason, non_confidential=e["non_confidential"],
        spent_before=spent_before, validated=validated, legacy_dataset_id=legacy_id,
        attempts=[RunAttempt(number=1, seq=e["seq"], time=e["time"], code_version=e["code_version"],
                             lifetime_cap=cap, cap_reason=cap_reason,
                             orchestration=orchestration_field(e), re_release=e.get("re_release"))],
    )


def check_run_started(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_STARTED: a declared content version of its dataset, of the ledger's kind, recording the
    dataset's cap and odometer; one release per content version; the plan fits under the cap."""
    policy = needs_policy(state)
    defn, planned, total = started_fields(state, e)
    name, fp = dataset_and_fingerprint(e)
    dataset_open(state, name)
    owner = state.fingerprints.get(fp)
    if owner is None:
        raise LedgerRuleViolation(f"this content version was never declared under dataset {name!r} (DATASET_VERSION)",
                                  rule="version-undeclared", dataset=name)
    if owner != name:
        raise LedgerRuleViolation(f"this content version is declared under dataset {owner!r}, not {name!r}",
                                  rule="version-owned", owner=owner, dataset=name)
    if e["non_confidential"] != policy.non_confidential:
        raise LedgerRuleViolation("a confidential ledger takes only confidential runs, a non-confidential ledger only "
                                  "non-confidential ones", rule="ledger-kind")
    if not isinstance(e["validated"], bool):
        raise LedgerRuleViolation("validated must be true or false")
    cap = state.dataset_cap(name)
    if amount_field(e, "lifetime_cap") != cap:
        raise LedgerRuleViolation(f"lifetime_cap {e['lifetime_cap']} is not dataset {name}'s cap {format_exact(cap)}")
    odometer = state.dataset_spent(name, policy.privacy_defn)
    if amount_field(e, "spent_before") != odometer:
        raise LedgerRuleViolation(f"spent_before {e['spent_before']} differs from the ledger's spends on dataset "
                                  f"{name} ({format_exact(odometer)})")
    check_release_claims(state, e, name, fp, run_id=e["run_id"], declared=e.get("re_release"))
    raised = state.dataset_states.get(name)
    run = new_run(e, defn, planned, total, dataset=name, fingerprint=fp, legacy_id=None, cap=cap,
                  cap_reason=raised.cap_reason if raised else None, spent_before=odometer,
                  validated=e["validated"])
    reserved = run.charge(policy.privacy_defn)
    if not policy.non_confidential and amount_exceeds(add_amounts(odometer, reserved), cap):
        raise LedgerRuleViolation(f"run exceeds dataset {name}'s lifetime cap: spent {format_exact(odometer)} + "
                                  f"planned {format_exact(reserved)} > cap {format_exact(cap)}",
                                  rule="dataset-cap", dataset=name, spent=odometer, planned=reserved, cap=cap)
    check_ledger_cap(state, name, add_amounts(odometer, reserved), "run")

    def commit() -> None:
        state.runs[run.run_id] = run

    return commit


def check_release_claims(state: LedgerState, e: Mapping[str, Any], dataset: str, fingerprint: str, *, run_id: str,
                          declared: str | None) -> None:
    """One release per content version: ``re_release`` exactly when another run claims it."""
    if "re_release" in e and (not is_text(e["re_release"]) or not e["re_release"].strip()):
        raise LedgerRuleViolation("re_release must be a non-empty short string")
    orchestration_field(e)  # checks the field's form
    claims = state.release_claims(dataset, fingerprint, besides=run_id)
    if claims and not declared and not needs_policy(state).non_confidential:
        other = claims[0]
        what = "published" if other.published else "open (running, or crashed)"
        raise LedgerRuleViolation(f"run {other.run_id!r} (entry {other.started_seq}) already claims this content version "
                                  f"({what}): a further release of the same records must declare re_release",
                                  rule="release-claimed", other=other.run_id)
    if "re_release" in e and not claims:
        raise LedgerRuleViolation("re_release is declared, but no other run released or is releasing this content version",
                                  rule="re-release-unneeded")


def check_intent(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """INTENT: a planned key, as planned, once per attempt, not after publication; a re-spend fits
    under the cap."""
    run = running(state, e)
    key = e["key"]
    if not isinstance(key, str) or key not in run.planned:
        raise LedgerRuleViolation(f"measurement {key!r} is not in the run's plan", rule="not-planned", key=key)
    earlier = run.spent_in_attempt(key)
    if earlier is not None:
        raise LedgerRuleViolation(
            f"measurement {key!r} was already spent at entry {earlier} in this attempt "
            "(a key is spent again only after a RUN_RESUMED)", rule="already-spent", key=key, earlier=earlier
        )
    if run.outputs_in_attempt():
        raise LedgerRuleViolation(f"no spend may follow the attempt's OUTPUTS_PUBLISHED (entry {run.outputs_seq})",
                                  rule="after-publication")
    rec = run.planned[key].record
    for name in ("budget", "sensitivity", "n_cells"):
        if e[name] != rec[name] or type(e[name]) is not type(rec[name]):
            raise LedgerRuleViolation(f"{name} {e[name]!r} differs from the plan ({rec[name]!r})")
    after = state.respend_odometer(run, key)
    cap = state.cap_of(run)
    if after is not None and not run.non_confidential and amount_exceeds(after, cap):
        raise LedgerRuleViolation(
            f"re-spending {key} exceeds the lifetime cap: the dataset's odometer would be "
            f"{format_exact(after)} > cap {format_exact(cap)}", rule="respend-cap", key=key, after=after, cap=cap
        )
    if after is not None:
        check_ledger_cap(state, run.dataset or "", after, f"re-spending {key}")

    def commit() -> None:
        run.intents.setdefault(key, []).append(e["seq"])
        run.intent_hashes[key] = e["hash"]

    return commit


def check_committed(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """COMMITTED: names its key's latest INTENT, of this attempt, committed once."""
    run = running(state, e)
    key = e["key"]
    if not isinstance(key, str) or key not in run.intents:
        raise LedgerRuleViolation(f"no INTENT of measurement {key!r} precedes this commit")
    latest = run.intents[key][-1]
    if run.committed_intent.get(key) == latest:
        raise LedgerRuleViolation(f"measurement {key!r} was already committed at entry {run.committed_seq[key]}")
    if e["intent_seq"] != latest or not is_int(e["intent_seq"]):
        raise LedgerRuleViolation(f"intent_seq does not point at the latest INTENT of {key!r} (entry {latest})")
    if e["intent_hash"] != run.intent_hashes[key]:
        raise LedgerRuleViolation("intent_hash is not the hash of the INTENT entry")
    if latest < run.attempt_seq:
        # The noise of an earlier attempt's INTENT cannot be vouched for now: spend again.
        raise LedgerRuleViolation(
            f"the INTENT of {key!r} (entry {latest}) belongs to an earlier attempt; "
            f"the run was resumed at entry {run.attempt_seq}"
        )
    if not is_hex64(e["noisy_digest"]):
        raise LedgerRuleViolation("noisy_digest is not a SHA-256 hex digest")

    def commit() -> None:
        run.committed[key] = e["noisy_digest"]
        run.committed_seq[key] = e["seq"]
        run.committed_intent[key] = latest

    return commit


def check_outputs_published(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """OUTPUTS_PUBLISHED, naming where the release went (see :func:`outputs_published`)."""
    return outputs_published(state, e, output_required=True)


def outputs_published(state: LedgerState, e: Mapping[str, Any], *, output_required: bool) -> Commit:
    """OUTPUTS_PUBLISHED: once per attempt, after every measurement is committed; with
    ``output_required``, it names the absolute path the release went to (not the first format)."""
    run = running(state, e)
    if run.outputs_in_attempt():
        raise LedgerRuleViolation(f"outputs were already published at entry {run.outputs_seq}")
    reusable = run.reusable
    missing = [k for k in run.planned if k not in reusable]
    if missing:
        raise LedgerRuleViolation(f"outputs published before every measurement was committed (missing {missing[0]})")
    files = e["files"]
    if not isinstance(files, dict) or not files:
        raise LedgerRuleViolation("files must be a non-empty object")
    for rel, digest in files.items():
        if not is_safe_relpath(rel) or not is_hex64(digest):
            raise LedgerRuleViolation("files must map relative paths to SHA-256 hex digests")
    output = e.get("output")
    if output_required and not (isinstance(output, str) and output.startswith("/")
                                and 0 < len(output) <= 4096 and output.isprintable()):
        raise LedgerRuleViolation("output must be the absolute path the release was published to")

    def commit() -> None:
        run.outputs = dict(files)
        run.outputs_seq = e["seq"]
        run.output_path = output

    return commit


def check_run_finished(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_FINISHED, after the attempt published (see :func:`run_finished`)."""
    return run_finished(state, e, publication_required=True)


def run_finished(state: LedgerState, e: Mapping[str, Any], *, publication_required: bool) -> Commit:
    """RUN_FINISHED: every measurement committed, ``spent`` the run's charge; with
    ``publication_required``, only after the attempt's OUTPUTS_PUBLISHED (not the first format)."""
    run = running(state, e)
    reusable = run.reusable
    missing = [k for k in run.planned if k not in reusable]
    if missing:
        raise LedgerRuleViolation(f"run finished without committing {missing[0]}")
    if publication_required and not run.outputs_in_attempt():
        raise LedgerRuleViolation("run finished without OUTPUTS_PUBLISHED in this attempt: a run finishes by publishing")
    charge = run.charge()
    if amount_field(e, "spent") != charge:
        raise LedgerRuleViolation(
            f"spent {e['spent']} differs from the run's charge {format_exact(charge)} "
            "(its planned total plus any re-spends)"
        )

    def commit() -> None:
        run.status = RunStatus.FINISHED
        run.terminal_seq = e["seq"]
        run.terminal_time = e["time"]
        run.attempts[-1].end = RunStatus.FINISHED
        run.attempts[-1].end_seq = e["seq"]
        run.attempts[-1].end_time = e["time"]

    return commit


def check_run_failed(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_FAILED, not after the attempt published (see :func:`run_failed`)."""
    return run_failed(state, e, after_publication=False)


def run_failed(state: LedgerState, e: Mapping[str, Any], *, after_publication: bool) -> Commit:
    """RUN_FAILED: ``spent`` is the sum of the run's INTENTs; unless ``after_publication`` (the
    first format), an attempt that recorded OUTPUTS_PUBLISHED finishes and cannot fail."""
    run = running(state, e)
    if not after_publication and run.outputs_in_attempt():
        raise LedgerRuleViolation(f"the attempt recorded OUTPUTS_PUBLISHED at entry {run.outputs_seq}: it finishes, it cannot fail")
    if not is_text(e["reason"]):
        raise LedgerRuleViolation("reason must be a short string")
    if amount_field(e, "spent") != run.intended_total():
        raise LedgerRuleViolation(f"spent {e['spent']} differs from the sum of the run's INTENTs")
    if "code" in e:
        if e["code"] not in FAILURE_CODES:
            raise LedgerRuleViolation(f"code {e['code']!r} is not one of the failure codes")
        if e["stage"] not in FAILURE_STAGES or e["stage"] != run.failure_stage():
            raise LedgerRuleViolation(f"stage {e['stage']!r} is not where the attempt stands ({run.failure_stage()})")

    def commit() -> None:
        run.status = RunStatus.FAILED
        run.terminal_seq = e["seq"]
        run.terminal_time = e["time"]
        run.failure_reason = e["reason"]
        run.attempts[-1].end = RunStatus.FAILED
        run.attempts[-1].end_seq = e["seq"]
        run.attempts[-1].end_time = e["time"]
        run.attempts[-1].end_reason = e["reason"]
        run.attempts[-1].end_code = e.get("code")
        run.attempts[-1].end_stage = e.get("stage")

    return commit


def resumable(state: LedgerState, e: Mapping[str, Any]) -> RunState:
    """The RUN_RESUMED entry's run: started, not finished, with the same config; a reason given."""
    run = state.runs.get(e["run_id"])
    if run is None:
        raise LedgerRuleViolation(f"run {e['run_id']!r} was never started", rule="never-started")
    if run.status is RunStatus.FINISHED:
        raise LedgerRuleViolation(
            f"run {e['run_id']!r} finished at entry {run.terminal_seq}; a finished run cannot be resumed",
            rule="resume-finished"
        )
    if not is_hex64(e["config_digest"]):
        raise LedgerRuleViolation("config_digest is not a SHA-256 hex digest")
    if e["config_digest"] != run.config_digest:
        raise LedgerRuleViolation(
            f"config_digest differs from the run's RUN_STARTED (entry {run.started_seq}): another config",
            rule="resume-config", given=e["config_digest"], recorded=run.config_digest
        )
    if not is_text(e["code_version"]):
        raise LedgerRuleViolation("code_version must be a short string")
    reason = e["reason"]
    if not is_text(reason) or not reason.strip():
        raise LedgerRuleViolation("reason must be a non-empty short string")
    return run


def resume_commit(e: Mapping[str, Any], run: RunState, cap: Amount, cap_reason: str | None) -> Commit:
    """The commit of a RUN_RESUMED: the run is running again, in a new attempt."""
    def commit() -> None:
        # A crashed attempt keeps end RUNNING (it has no terminal entry); the next one starts.
        run.status = RunStatus.RUNNING
        run.terminal_seq = None
        run.terminal_time = None
        run.failure_reason = None
        run.lifetime_cap = cap
        run.cap_reason = cap_reason
        run.attempts.append(
            RunAttempt(
                number=len(run.attempts) + 1,
                seq=e["seq"],
                time=e["time"],
                code_version=e["code_version"],
                lifetime_cap=cap,
                cap_reason=cap_reason,
                resume_reason=e["reason"],
                orchestration=orchestration_field(e),
                re_release=e.get("re_release"),
            )
        )

    return commit


def check_run_resumed(state: LedgerState, e: Mapping[str, Any]) -> Commit:
    """RUN_RESUMED: a failed or crashed run of the same dataset and records, one release per content
    version, and the run's whole plan reserved again fits under the cap."""
    needs_policy(state)
    run = resumable(state, e)
    if run.legacy:
        raise LedgerRuleViolation(f"run {e['run_id']!r} is of the first ledger format; it cannot be resumed after migration",
                                  rule="resume-legacy")
    if e["dataset"] != run.dataset:
        raise LedgerRuleViolation(f"dataset differs from the run's RUN_STARTED (entry {run.started_seq})",
                                  rule="resume-dataset", given=e["dataset"], recorded=run.dataset)
    if e["fingerprint"] != run.fingerprint:
        raise LedgerRuleViolation(f"fingerprint differs from the run's RUN_STARTED (entry {run.started_seq}): other records",
                                  rule="resume-fingerprint")
    dataset_open(state, run.dataset or "")
    check_release_claims(state, e, run.dataset or "", run.fingerprint or "", run_id=run.run_id,
                               declared=e.get("re_release") or run.re_release)
    cap = state.cap_of(run)
    after = state.resume_odometer(run)
    if not run.non_confidential and amount_exceeds(after, cap):
        raise LedgerRuleViolation(
            f"resumed run exceeds the lifetime cap: the dataset's odometer with the run reserved "
            f"again is {format_exact(after)} > cap {format_exact(cap)}", rule="resume-cap", after=after, cap=cap
        )
    check_ledger_cap(state, run.dataset or "", after, "resumed run")
    raised = state.dataset_states.get(run.dataset or "")
    return resume_commit(e, run, cap, raised.cap_reason if raised else None)


# --------------------------------------------------------------------------------------------
# Field checks shared by several kinds
# --------------------------------------------------------------------------------------------


def parse_planned(items: Any, defn: PrivacyDefinition) -> dict[str, PlannedSpend]:
    """RUN_STARTED's ``planned`` list, checked item by item against the tables' definitions (sensitivity
    2*tau+2 or 2, or with ``sensitivity_bound`` "exact" the proven one of :mod:`phsafe.sensitivity`;
    cells that fit the domain, noise and variance consistent with the budget). One run, one bound.

    A run's plan is checked again each time its ledger is read -- every open, append and
    verification replays it -- so an item's checks, a pure function of the item, are remembered
    once passed (:func:`_item_measurement`, :func:`_item_consistent`); a refusal is never
    remembered: it is raised again, in the same order as ever."""
    if not isinstance(items, list):
        raise LedgerRuleViolation("planned must be a list")
    out: dict[str, PlannedSpend] = {}
    bounds: set[SensitivityBound] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not PLANNED_FIELDS <= set(item) <= PLANNED_FIELDS | PLANNED_OPTIONAL_FIELDS:
            raise LedgerRuleViolation(f"planned[{i}] has the wrong fields")
        try:
            bound = SensitivityBound(item.get("sensitivity_bound", SensitivityBound.PAPER.value))
        except ValueError:
            raise LedgerRuleViolation(f"planned[{i}].sensitivity_bound is not \"exact\"") from None
        if "sensitivity_bound" in item and bound is SensitivityBound.PAPER:
            raise LedgerRuleViolation(f"planned[{i}].sensitivity_bound is written only for \"exact\"")
        bounds.add(bound)
        if len(bounds) > 1:
            raise LedgerRuleViolation(f"planned[{i}]: one run calibrates every measurement to one bound")
        # Each value with its type: a JSON true is not the 1 of a valid item.
        fields = tuple((name, type(value), value) for name, value in sorted(item.items()))
        try:
            hash(fields)
        except TypeError:  # a list or an object where a scalar belongs: checked (and refused) unremembered
            measurement, consistent = _item_measurement.__wrapped__, _item_consistent.__wrapped__
        else:
            measurement, consistent = _item_measurement, _item_consistent
        m, budget = measurement(i, fields, defn, bound)
        if m.key in out:
            raise LedgerRuleViolation(f"planned[{i}] repeats {m.key}")
        consistent(i, fields, m)
        out[m.key] = PlannedSpend(measurement=m, budget=budget, record=item)
    return out


@lru_cache(maxsize=4096)
def _item_measurement(i: int, fields: tuple[tuple[str, type, Any], ...], defn: PrivacyDefinition,
                      bound: SensitivityBound) -> tuple[PlannedMeasurement, Amount]:
    """The measurement ``planned[i]`` (given as its (name, type, value) fields) records, and its
    exact budget, once its table, level, budget, tau, sensitivity, cells and key are checked."""
    item = {name: value for name, _, value in fields}
    table, level_key = item["table"], item["level"]
    if table not in TABLES or not isinstance(level_key, str) or level_key not in LEVELS[table]:
        raise LedgerRuleViolation(f"planned[{i}] names no measured table and level")
    level = LEVELS[table][level_key]
    try:
        budget = parse_exact(item["budget"])
        if not is_infinite(budget) and not DECIMAL_TEXT.fullmatch(item["budget"]):
            raise ValueError("budgets are decimals")
    except ValueError:
        raise LedgerRuleViolation(f"planned[{i}].budget is not a canonical decimal or Infinity") from None
    if budget == 0:
        raise LedgerRuleViolation(f"planned[{i}].budget is 0 (a level with budget 0 is not measured)")
    spec = TABLES[table]
    tau, sens, n_cells = item["tau"], item["sensitivity"], item["n_cells"]
    if spec.kind is TableKind.PERSON:
        if not is_int(tau) or tau < 1:
            raise LedgerRuleViolation(f"planned[{i}]: a person table needs tau >= 1")
    elif tau is not None:
        raise LedgerRuleViolation(f"planned[{i}]: a unit table has no tau")
    want = declared(table, level, tau, bound, l2=defn is PrivacyDefinition.ZCDP)
    if sens != want or type(sens) is not type(want):
        what = "2*tau+2 or 2" if bound is SensitivityBound.PAPER else f"the proven {want!r}"
        raise LedgerRuleViolation(f"planned[{i}]: sensitivity {sens!r} is not {what} ({bound.value} bound)")
    if not is_int(n_cells) or n_cells < 1 or n_cells % len(spec.basis_numbers) or n_cells % len(level.iteration.codes):
        raise LedgerRuleViolation(f"planned[{i}].n_cells does not fit the table's domain")
    m = PlannedMeasurement(
        table=table,
        level=level,
        privacy_defn=defn,
        budget=INFINITE if is_infinite(budget) else Decimal(item["budget"]),
        sensitivity=sens,
        tau=tau,
        n_cells=n_cells,
        bound=bound,
    )
    if item["key"] != m.key:
        raise LedgerRuleViolation(f"planned[{i}].key is not TABLE/level")
    return m, budget


@lru_cache(maxsize=4096)
def _item_consistent(i: int, fields: tuple[tuple[str, type, Any], ...], m: PlannedMeasurement) -> None:
    """``planned[i]`` is exactly how the ledger records ``m`` (noise parameter and variance
    consistent with its budget and sensitivity)."""
    item = {name: value for name, _, value in fields}
    want = planned_item(m)
    if item != want:
        bad = sorted(k for k, v in want.items() if item.get(k) != v)
        raise LedgerRuleViolation(f"planned[{i}] ({m.key}): {', '.join(bad)} inconsistent with its budget and sensitivity")


def orchestration_field(e: Mapping[str, Any]) -> Orchestration | None:
    """The entry's ``orchestration`` field, checked, or None when it has none."""
    record = e.get("orchestration")
    if record is None:
        return None
    if not isinstance(record, dict) or not {"system", "flow_run_id"} <= set(record) <= ORCHESTRATION_FIELDS:
        raise LedgerRuleViolation("orchestration must hold system, flow_run_id and optionally parent_flow_run_id")
    if record["system"] != "prefect":
        raise LedgerRuleViolation("orchestration.system must be \"prefect\"")
    for name in ("flow_run_id", "parent_flow_run_id"):
        if name in record and not (isinstance(record[name], str) and UUID.fullmatch(record[name])):
            raise LedgerRuleViolation(f"orchestration.{name} must be a lowercase UUID")
    return Orchestration.from_record(record)


def privacy_defn_field(e: Mapping[str, Any]) -> PrivacyDefinition:
    """The entry's ``privacy_defn``, once its ``non_confidential`` is checked to be a boolean."""
    try:
        defn = PrivacyDefinition(e["privacy_defn"])
    except ValueError:
        raise LedgerRuleViolation("privacy_defn must be 'zcdp' or 'puredp'") from None
    if not isinstance(e["non_confidential"], bool):
        raise LedgerRuleViolation("non_confidential must be true or false")
    return defn


def amount_field(e: Mapping[str, Any], name: str) -> Amount:
    """The entry's field ``name`` as an exact amount (it must be canonical text)."""
    try:
        return parse_exact(e[name])
    except ValueError:
        raise LedgerRuleViolation(f"{name} is not a canonical exact amount") from None


def dataset_and_fingerprint(e: Mapping[str, Any]) -> tuple[str, str]:
    """An entry's dataset name and content fingerprint, checked for form."""
    name, fp = e["dataset"], e["fingerprint"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise LedgerRuleViolation("dataset is not a valid dataset name")
    if not is_hex64(fp):
        raise LedgerRuleViolation("fingerprint is not a SHA-256 hex digest")
    return name, fp


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------

RULES: dict[EntryKind, Check] = {
    EntryKind.LEDGER_INIT: check_ledger_init,
    EntryKind.LEDGER_MIGRATED: check_ledger_migrated,
    EntryKind.CAP_RAISED: check_cap_raised,
    EntryKind.DATASET_VERSION: check_dataset_version,
    EntryKind.TAIL_REPAIRED: check_tail_repaired,
    EntryKind.RUN_STARTED: check_run_started,
    EntryKind.INTENT: check_intent,
    EntryKind.COMMITTED: check_committed,
    EntryKind.OUTPUTS_PUBLISHED: check_outputs_published,
    EntryKind.RUN_FINISHED: check_run_finished,
    EntryKind.RUN_FAILED: check_run_failed,
    EntryKind.RUN_RESUMED: check_run_resumed,
    EntryKind.LOG_BOUND: check_log_bound,
    EntryKind.DATASET_RETIRED: check_dataset_retired,
}
"""The check of each entry kind, in a ledger with a policy."""
