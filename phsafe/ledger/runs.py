"""The ledger as its callers use it: :class:`Ledger` (datasets, caps, runs) and :class:`RunRecorder`.

Every method takes the ledger's locks, catches up with the file, builds its entries and appends
them durably (:mod:`phsafe.ledger.store`) before it returns. The rules are checked once, by the
replay every append goes through (:mod:`phsafe.ledger.rules`); when one refuses an entry, the
violation it names is translated here into the operator's message -- what was refused and what
to do (:func:`explain`) -- instead of the rule being checked a second time.

Spending is vouched for: before and after every entry that spends or lets spend (``CAP_RAISED``,
``RUN_STARTED``, ``RUN_RESUMED``, ``INTENT``) the ledger's followers confirm it
(:meth:`~phsafe.ledger.store.LedgerFile.confirm`: its public log, cosigned by the witness quorum).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Mapping

from phsafe.accounting import PlannedMeasurement, RunPlan
from phsafe.amounts import Amount, add_amounts, format_exact
from phsafe.errors import AlreadyReleasedError, BudgetError, LedgerError
from phsafe.parameters import option
from phsafe.ledger.format import FAILURE_CODES, EntryKind, clean_text, operator_text, planned_item
from phsafe.ledger.rules import largest_overlap
from phsafe.overlap import OVERLAP_LIMIT, percent
from phsafe.ledger.keys import read_lineage_key, sign_checkpoint
from phsafe.ledger.policy import Policy, cap_amount, check_dataset_name, check_ledger_kind, unit_name
from phsafe.ledger.state import LedgerState, Orchestration, RunState, RunStatus
from phsafe.ledger.store import LedgerFile
from phsafe.noise import SpendReceipt

Item = tuple[EntryKind, "str | None", Mapping[str, Any]]


def explain(exc: LedgerError, state: LedgerState, *, run_id: str | None = None) -> Exception:
    """The operator's message for a rule's refusal of a new entry, or ``exc`` itself.

    The rules (:mod:`phsafe.ledger.rules`) state what an entry may not be; a refusal carries
    the rule's name and its facts (``exc.violation``). Here it becomes what the operator reads:
    what was refused, why, and the option that does what they may mean. Refusals of rules not
    listed stay the ledger's own message (an entry the front end built wrongly: a defect).
    """
    violation = exc.violation
    rule = getattr(violation, "rule", None)
    if violation is None or rule is None:
        return exc
    f: dict[str, Any] = violation.facts
    unit = unit_name(state.policy.privacy_defn) if state.policy is not None else "rho (zCDP)"
    if rule == "dataset-cap":
        need = add_amounts(f["spent"], f["planned"])
        return BudgetError(
            f"privacy-loss budget refused for dataset {f['dataset']!r}: already spent {format_exact(f['spent'])}, "
            f"this run plans {format_exact(f['planned'])}, lifetime cap {format_exact(f['cap'])} ({unit}); spent + "
            f"planned = {format_exact(need)} exceeds the cap. Spends are never refunded. To run anyway, raise the "
            f"cap to at least {format_exact(need)} with {option('lifetime_cap')} and say why with "
            f"{option('cap_reason')} (both are recorded in the ledger).")
    if rule == "ledger-cap":
        return BudgetError(
            f"privacy-loss budget refused by the ledger-wide cap {format_exact(f['cap'])} (set at ledger init, over "
            f"all datasets): all datasets would have spent {format_exact(f['total'])}. Spends are never refunded")
    if rule == "version-undeclared":
        known = state.dataset_states.get(f["dataset"])
        seen = (f"it has {len(known.versions)} declared version(s), and these records match none"
                if known and known.versions else "it has no declared version yet")
        return BudgetError(
            f"dataset {f['dataset']!r} has never been run on these records ({seen}). If they are a new version of "
            f"{f['dataset']!r}, say so and why with {option('new_version')} (recorded in the ledger); if they belong "
            "to another dataset, run them under its name")
    if rule == "version-owned":
        return BudgetError(
            f"these records are already declared as dataset {f['owner']!r} in this ledger: the same records cannot "
            f"be released under a second name ({f['dataset']!r}); run them as {f['owner']!r}")
    if rule == "overlap-undeclared":
        # The share itself stays in the confidential ledger: this message reaches the flow run's
        # state in the Prefect database, outside the enclave, and an estimate of how many records
        # two datasets share is a statistic of the confidential records.
        other = f["other"]
        return BudgetError(
            f"more than {percent(OVERLAP_LIMIT)} of these records are also in dataset {other!r}: if they are a new "
            f"version of {other!r}, run them as {other!r} ({option('dataset')} {other} {option('new_version')} "
            f"REASON: its cap applies); if they are another population, say why with {option('overlap_reason')} "
            "(recorded in the ledger)")
    if rule == "overlap-unneeded":
        return BudgetError(f"{option('overlap_reason')} is given, but these records overlap no other dataset's beyond "
                           f"{percent(OVERLAP_LIMIT)}: nothing to declare (remove it)")
    if rule == "release-claimed":
        other = state.runs[f["other"]]
        resuming = run_id in state.runs
        again = (f"resuming run {run_id} would release them a second time" if resuming
                 else "a content version is released once")
        if other.published:
            told = (f"these records were already released: run {other.run_id} published them to "
                    f"{other.output_path or 'its output folder'} (entry {other.outputs_seq})")
        else:
            told = (f"run {other.run_id} on these records is still open (started at entry {other.started_seq}; "
                    f"running, or crashed without ending): resume it ({option('resume_run_id')}) instead")
        return AlreadyReleasedError(
            f"{told}; {again}, whatever room the lifetime cap leaves. To release the same records again, declare it "
            f"and say why with {option('re_release')} (recorded in the ledger; the cap still applies)")
    if rule == "infinite-budget":
        return BudgetError("an Infinity (no-noise) budget is allowed only for non-production test runs on data "
                           f"declared non-confidential ({option('non_confidential')})")
    if rule == "cap-not-raised":
        return BudgetError(f"the lifetime cap {format_exact(f['cap'])} does not raise dataset {f['dataset']}'s cap "
                           f"{format_exact(f['current'])}: a cap is only ever raised")
    if rule == "cap-reason":
        return BudgetError(f"raising dataset {f['dataset']}'s lifetime cap to {format_exact(f['cap'])} needs a reason "
                           f"({option('cap_reason')}); it is recorded in the ledger")
    if rule == "already-spent":
        return BudgetError(f"{f['key']} was already spent in run {run_id} (entry {f['earlier']}); a measurement is "
                           "spent at most once per attempt")
    if rule == "run-ended":
        return BudgetError(f"run {run_id} has ended; refusing to spend")
    if rule == "after-publication":
        return BudgetError(f"run {run_id} already published its outputs; refusing to spend")
    if rule == "respend-cap":
        run = state.runs[run_id] if run_id else None
        previous = run.intents.get(f["key"], []) if run else []
        return BudgetError(
            f"privacy-loss budget refused: re-spending {f['key']} in run {run_id} (spent {len(previous)} time(s) "
            f"before{f', last at entry {previous[-1]}' if previous else ''}) would take dataset "
            f"{run.account if run else '?'!r} to spent {format_exact(f['after'])}, above its lifetime cap "
            f"{format_exact(f['cap'])}. Spends are never refunded. To spend it again, resume the run with the cap "
            f"raised to at least {format_exact(f['after'])} ({option('lifetime_cap')}) and the reason "
            f"({option('cap_reason')}); both are recorded.")
    if rule == "resume-cap":
        run = state.runs[run_id] if run_id else None
        return BudgetError(
            f"privacy-loss budget refused: resuming run {run_id} reserves its whole plan again, so dataset "
            f"{run.dataset if run else '?'!r} would have spent {format_exact(f['after'])} ({unit}), above the lifetime "
            f"cap {format_exact(f['cap'])}. Spends are never refunded. To resume anyway, raise the cap to at least "
            f"{format_exact(f['after'])} (plus the budget of every measurement that must be spent again) with "
            f"{option('lifetime_cap')} and say why with {option('cap_reason')} (both are recorded).")
    run = state.runs.get(run_id) if run_id else None
    if rule == "never-started":
        return LedgerError(f"cannot resume run {run_id}: it was never started in this ledger")
    if rule == "resume-finished" and run is not None:
        return LedgerError(f"cannot resume run {run_id}: it finished at entry {run.terminal_seq} and published to "
                           f"{run.output_path or 'its output folder'}; a finished run is never resumed")
    if rule == "resume-config":
        return LedgerError(
            f"cannot resume run {run_id}: the config differs from the one it started with (SHA-256 "
            f"{str(f['given'])[:16]}, recorded {str(f['recorded'])[:16]}); reused measurements would be inconsistent "
            "-- start a new run instead")
    if rule == "resume-dataset":
        return LedgerError(f"cannot resume run {run_id}: it was started as dataset {f['recorded']!r}, not {f['given']!r}")
    if rule == "resume-fingerprint":
        return LedgerError(f"cannot resume run {run_id}: the input records differ from the ones it started with "
                           "(another content version); start a new run instead")
    if rule == "resume-legacy":
        return LedgerError(f"cannot resume run {run_id}: it was started before the ledger was migrated")
    if rule == "ledger-kind":
        return exc  # check_ledger_kind, before any entry is built, says it in the operator's words
    if rule == "dataset-closed":
        return LedgerError(str(f["text"]))
    return exc


class Ledger(LedgerFile):
    """An append-only privacy-loss ledger file (see :mod:`phsafe.ledger.format` for the rules).

    Open one with :meth:`open` (an existing ledger; with its public log: :func:`phsafe.publog.open_ledger`)
    or make one with :func:`phsafe.publog.create_ledger`.
    """

    def lineage_key(self) -> bytes:
        """The ledger's lineage key (see :func:`read_lineage_key`).

        Raises:
            LedgerError: The ledger has no policy yet (first format), or the key file is bad.
        """
        policy = self._state.policy
        if policy is None:
            raise LedgerError(f"the ledger {self.path} is of the first format: migrate it (phsafe ledger migrate)")
        return read_lineage_key(self.path, policy)

    def _append(self, state: LedgerState, items: list[Item], *, run_id: str | None = None) -> list[dict[str, Any]]:
        """Append ``items``; a rule's refusal comes back as the operator's message (:func:`explain`)."""
        try:
            return self.append_entries(items)
        except LedgerError as exc:
            raise explain(exc, self._state, run_id=run_id) from None

    # -- datasets -----------------------------------------------------------------------------

    @staticmethod
    def _cap_raise_item(dataset: str, cap: Amount, reason: str | None, what: str = "the reason") -> Item:
        return (EntryKind.CAP_RAISED, None,
                {"dataset": dataset, "lifetime_cap": format_exact(cap), "reason": operator_text(reason, what)})

    def raise_cap(self, dataset: str, lifetime_cap: Amount, reason: str) -> dict[str, Any]:
        """Record ``CAP_RAISED``: ``dataset``'s lifetime cap becomes ``lifetime_cap``.

        Raises:
            BudgetError: The cap is not above the current one, or there is no reason; the
                ledger's witnesses refuse it (a copied or rolled-back ledger).
            LedgerError: The ledger has no policy (first format) or is broken.
        """
        cap = cap_amount(lifetime_cap)
        check_dataset_name(dataset)
        with self.locked() as state:
            self._needs_policy(state)
            known = state.dataset_states.get(dataset)
            if not (known and known.versions) and not any(r.dataset == dataset for r in state.runs.values()):
                names = sorted({n for n, d in state.dataset_states.items() if d.versions}
                               | {r.dataset for r in state.runs.values() if r.dataset})
                listed = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "") if names else "none yet"
                raise LedgerError(
                    f"the ledger {self.path} knows no dataset {dataset!r} (its datasets: {listed}): check the name; "
                    f"a new dataset's cap is raised by its first run ({option('lifetime_cap')} with "
                    f"{option('cap_reason')})"
                )
            self.confirm()  # a copied or rolled-back ledger changes no cap
            entry = self._append(state, [self._cap_raise_item(dataset, cap, reason, "--reason")])[0]
            self.confirm(fresh=False)
            return entry

    def retire_dataset(self, dataset: str, reason: str, *, successor: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Record ``DATASET_RETIRED``: this ledger accounts ``dataset`` no more, for good, and
        (``successor``: ``origin`` and ``key_id``) names the log that accounts it from now on.
        Witnessed like a cap raise: the quorum cosigns the log before and after the entry, so
        the public ``dataset-retired`` entry is in a checkpoint the witnesses cosigned.

        Raises:
            LedgerError: The ledger does not account the dataset, retired it already, a run of
                it is open, or no reason is given; the witnesses refuse the ledger.
        """
        check_dataset_name(dataset)
        body: dict[str, Any] = {"dataset": dataset, "reason": operator_text(reason, "--reason")}
        if not body["reason"]:
            raise LedgerError("give the reason for retiring the dataset (--reason TEXT); it is published")
        if successor is not None:
            body["successor"] = {"origin": str(successor["origin"]), "key_id": str(successor["key_id"])}
        with self.locked() as state:
            self._needs_policy(state)
            self.confirm()  # a copied or rolled-back ledger retires nothing
            entry = self._append(state, [(EntryKind.DATASET_RETIRED, None, body)])[0]
            self.confirm(fresh=False)
            return entry

    def _needs_policy(self, state: LedgerState) -> Policy:
        if state.policy is None:
            raise LedgerError(
                f"the ledger {self.path} was written before ledgers had a policy; it still verifies, "
                "but takes no new run until it is migrated: `phsafe ledger migrate LEDGER "
                "--lifetime-cap RHO --reason TEXT --dataset NAME`"
            )
        return state.policy

    # -- runs -------------------------------------------------------------------------------

    def start_run(
        self,
        *,
        run_id: str,
        plan: RunPlan,
        dataset: str,
        fingerprint: str,
        config_digest: str,
        input_digests: dict[str, str],
        code_version: str,
        truncation_key_hex: str,
        non_confidential: bool = False,
        validated: bool = True,
        new_version: str | None = None,
        cap_raise: tuple[Amount, str | None] | None = None,
        re_release: str | None = None,
        orchestration: Orchestration | None = None,
        sketch: Mapping[str, Any] | None = None,
        overlap_reason: str | None = None,
    ) -> "RunRecorder":
        """Check the dataset, its version and its lifetime cap, and record RUN_STARTED, atomically.

        Under the lock, in one write: ``CAP_RAISED`` (if ``cap_raise``), ``DATASET_VERSION`` (if
        the fingerprint is new and ``new_version`` says why), ``RUN_STARTED`` -- confirmed by the
        ledger's followers (its witnessed public log) before and after.

        Args:
            run_id: Unique id of the run.
            plan: Every measurement of the run.
            dataset: The declared dataset name.
            fingerprint: The keyed commitment of the records' content (see
                :mod:`phsafe.fingerprint`), under this ledger's lineage key.
            config_digest: SHA-256 of the config file.
            input_digests: Input file name -> SHA-256 of its bytes (confidential lineage).
            code_version: Version of the code that runs.
            truncation_key_hex: Key of the truncation ordering, hex.
            non_confidential: The data is synthetic or public (must match the ledger's policy).
            validated: The full input suites ran and passed before this run (recorded).
            new_version: The operator's reason, if these records are a new version of ``dataset``.
            cap_raise: ``(cap, reason)``: raise the dataset's cap first (recorded).
            re_release: The operator's reason for releasing records that another run released
                or is releasing (recorded). Ignored, and not recorded, when no other run claims
                them.
            orchestration: The flow run that runs this attempt (recorded).
            sketch: The keyed sketch of the records (:func:`phsafe.overlap.keyed_sketch`),
                recorded with a new version of a confidential ledger's dataset.
            overlap_reason: Why records that overlap another dataset's beyond the limit are a
                version of this dataset (recorded with the overlap; refused where none).

        Raises:
            AlreadyReleasedError: Another run released these records, or is releasing them, and
                no ``re_release`` reason was given -- whatever room the cap leaves.
            BudgetError: The run would exceed the dataset's cap, the records are a version never
                declared (without ``new_version``) or declared under another name, Infinity
                budgets on confidential data, or a bad cap raise; the witnesses refuse the
                ledger (:class:`~phsafe.errors.ForkRefused`).
            LedgerError: The ledger is broken, of the first format, or of the other kind
                (confidential vs non-confidential).
        """
        check_dataset_name(dataset)
        body = {
            "dataset": dataset,
            "fingerprint": fingerprint,
            "input_digests": {str(k): str(v).lower() for k, v in input_digests.items()},
            "config_digest": config_digest,
            "code_version": code_version,
            "truncation_key": truncation_key_hex.lower(),
            "privacy_defn": plan.privacy_defn.value,
            "planned": [planned_item(m) for m in plan.measurements],
            "planned_total": format_exact(plan.total),
            "non_confidential": bool(non_confidential),
            "validated": bool(validated),
        }
        with self.locked() as state:
            policy = self._needs_policy(state)
            check_ledger_kind(policy, non_confidential)
            items: list[Item] = []
            cap = state.dataset_cap(dataset)
            if cap_raise is not None:
                cap = cap_amount(cap_raise[0])
                items.append(self._cap_raise_item(dataset, cap, cap_raise[1], option("cap_reason")))
            if state.fingerprints.get(fingerprint) is None and operator_text(new_version, option("new_version")):
                version: dict[str, Any] = {"dataset": dataset, "fingerprint": fingerprint,
                                           "reason": operator_text(new_version, option("new_version"))}
                if sketch is not None and not non_confidential:
                    version["sketch"] = dict(sketch)
                    relation = self._overlap_field(state, dataset, sketch, overlap_reason)
                    if relation is not None:
                        version["overlap"] = relation
                items.append((EntryKind.DATASET_VERSION, None, version))
            declared = self._re_release_field(state, policy, dataset, fingerprint, re_release, besides=run_id)
            if declared:
                body["re_release"] = declared
            if orchestration is not None:
                body["orchestration"] = orchestration.record()
            # What the rules require RUN_STARTED to state; they check the cap against it.
            body.update(lifetime_cap=format_exact(cap),
                        spent_before=format_exact(state.dataset_spent(dataset, policy.privacy_defn)))
            items.append((EntryKind.RUN_STARTED, run_id, body))
            self.confirm()  # a fork or a stale copy is refused here, before anything is recorded
            self._append(state, items, run_id=run_id)
            self.confirm(fresh=False)  # ... and the run's start is witnessed before its first INTENT
        return RunRecorder(self, run_id, plan)

    @staticmethod
    def _overlap_field(state: LedgerState, dataset: str, sketch: Mapping[str, Any],
                       reason: str | None) -> dict[str, str] | None:
        """The ``overlap`` a new version records when the operator declared one (the rules refuse
        a missing or a needless declaration: :func:`explain` says what to do)."""
        reason = operator_text(reason, option("overlap_reason"))
        if not reason:
            return None
        found = largest_overlap(state, dataset, sketch)
        if found is None:
            return {"dataset": dataset, "share": percent(0), "reason": reason}  # refused: overlap-unneeded
        other, share = found
        return {"dataset": other, "share": percent(share), "reason": reason}

    @staticmethod
    def _re_release_field(state: LedgerState, policy: Policy, dataset: str, fingerprint: str,
                          reason: str | None, *, besides: str) -> str | None:
        """The ``re_release`` to record: the operator's reason when another run claims these
        records (without one, the rules refuse: :func:`explain`), else nothing."""
        if not state.release_claims(dataset, fingerprint, besides=besides):
            return None  # the one release of these records: nothing to declare
        return operator_text(reason, option("re_release")) or None

    def run(self, run_id: str, *, lagging: bool = False) -> RunState | None:
        """A snapshot of what the ledger says about ``run_id`` now, or None if it was never started.

        The ledger is caught up with the file first (other processes may have appended); the
        snapshot is a copy, safe to read while other threads keep recording. ``lagging``: read
        even when the public log cannot be written (to record a failure).
        """
        with self.locked(lagging=lagging) as state:
            run = state.runs.get(run_id)
            return None if run is None else copy.deepcopy(run)

    def resume_run(
        self,
        run_id: str,
        *,
        config_digest: str,
        dataset: str,
        fingerprint: str,
        code_version: str,
        reason: str,
        cap_raise: tuple[Amount, str | None] | None = None,
        plan: RunPlan | None = None,
        re_release: str | None = None,
        orchestration: Orchestration | None = None,
    ) -> "RunRecorder":
        """Record RUN_RESUMED for a failed or crashed run and return its recorder, atomically.

        The run is running again, as attempt ``n + 1``. Its plan is the one recorded at start:
        the returned recorder spends from it, and :attr:`RunState.reusable` (see :meth:`run`)
        says which measurements may be released from their stored vectors instead of spent again.
        Everything else is spent again through the recorder and charged again.

        Args:
            run_id: The run to resume.
            config_digest: SHA-256 of the config file; must be the run's.
            dataset, fingerprint: Must be the run's (the same records).
            code_version: Version of the code that resumes (may differ from the start's; recorded).
            reason: Why the run is resumed (non-empty; recorded, one line of at most 500
                characters).
            cap_raise: ``(cap, reason)``: raise the dataset's cap first (recorded, same write).
            plan: The plan the caller computed from the config, if any. It is only checked: it
                must record exactly as the run's recorded plan (same measurements, budgets,
                sensitivities, cells and variances, same order), so that code that would now plan
                differently cannot reuse the old measurements. The recorder always uses the
                recorded plan.
            re_release: Why the run releases records that another run released or is releasing
                (recorded; see :meth:`start_run`).
            orchestration: The flow run that runs this attempt (recorded).

        Raises:
            AlreadyReleasedError: Another run released these records, or is releasing them, and
                neither this resume nor the run's start declared a re-release.
            LedgerError: The run is unknown, finished or of the first format, the config, the
                dataset, the records or ``plan`` differ from the run's, ``reason`` is empty, or
                the ledger is broken. Nothing is appended.
            BudgetError: A bad cap raise, or the dataset's odometer with the run reserved again
                would exceed its cap; the witnesses refuse the ledger. Nothing is appended.
        """
        reason = operator_text(reason, option("resume_reason"))
        if not reason:
            raise LedgerError(f"give the reason for resuming run {run_id} ({option('resume_reason')}); it is recorded")
        with self.locked() as state:
            policy = self._needs_policy(state)
            run = state.runs.get(run_id)
            if run is not None and plan is not None and run.status is not RunStatus.FINISHED \
                    and config_digest == run.config_digest and fingerprint == run.fingerprint:
                self._check_same_plan(run, plan)
            items: list[Item] = []
            if cap_raise is not None and run is not None:
                items.append(self._cap_raise_item(run.dataset or "", cap_amount(cap_raise[0]), cap_raise[1],
                                                  option("cap_reason")))
            resumed_body: dict[str, Any] = {
                "config_digest": config_digest, "dataset": dataset, "fingerprint": fingerprint,
                "code_version": code_version, "reason": reason,
            }
            declared = self._re_release_field(state, policy, dataset, fingerprint, re_release, besides=run_id)
            if declared and (run is None or declared != run.re_release):
                resumed_body["re_release"] = declared
            if orchestration is not None:
                resumed_body["orchestration"] = orchestration.record()
            items.append((EntryKind.RUN_RESUMED, run_id, resumed_body))
            self.confirm()  # a fork or a stale copy is refused here, before anything is recorded
            self._append(state, items, run_id=run_id)
            self.confirm(fresh=False)  # ... and the resume is witnessed before its first INTENT
            resumed = state.runs[run_id]
            attempt = resumed.attempt
            recorded = RunPlan(resumed.privacy_defn, tuple(s.measurement for s in resumed.planned.values()))
        return RunRecorder(self, run_id, recorded, attempt=attempt)

    @staticmethod
    def _check_same_plan(run: RunState, plan: RunPlan) -> None:
        """Raise LedgerError unless ``plan`` records exactly as ``run``'s recorded plan."""
        if plan.privacy_defn is not run.privacy_defn:
            raise LedgerError(
                f"cannot resume run {run.run_id}: it was planned in {run.privacy_defn.value}, not "
                f"{plan.privacy_defn.value}"
            )
        given = [planned_item(m) for m in plan.measurements]
        recorded = [s.record for s in run.planned.values()]
        if given != recorded:
            keys = [g["key"] for g in given]
            if keys != [r["key"] for r in recorded]:
                detail = "other measurements or another order"
            else:
                g, r = next((g, r) for g, r in zip(given, recorded) if g != r)
                fields = ", ".join(sorted(k for k in g if g[k] != r[k]))
                detail = f"{g['key']} differs in {fields}"
            raise LedgerError(
                f"cannot resume run {run.run_id}: the plan computed now differs from the recorded "
                f"one ({detail}); reused measurements would be inconsistent"
            )

    def checkpoint(self, signing_key: Any = None) -> dict[str, Any]:
        """Size and head hash of the ledger now, signed with an Ed25519 key if given.

        Args:
            signing_key: An ``Ed25519PrivateKey`` (see :func:`~phsafe.ledger.keys.load_signing_key`),
                a path to its PEM file, or None for an unsigned checkpoint.

        Returns:
            ``{"ledger_size", "head_hash", "signature", "public_key"}``; the signature is
            base64 over :func:`~phsafe.ledger.format.checkpoint_message`, the public key PEM text
            (both None unsigned).
        """
        with self.locked() as state:
            size, head = state.size, state.head_hash
        return sign_checkpoint(size, head, signing_key)


class RunRecorder:
    """Records one attempt of one run's spends; satisfies :class:`phsafe.noise.SpendRecorder`.

    Obtained from :meth:`Ledger.start_run` (attempt 1) or :meth:`Ledger.resume_run`; every method
    appends durably before returning. Safe to share between threads: it holds no mutable state,
    and every method reads and appends under the ledger's thread mutex and file lock.

    A recorder belongs to its attempt: once the run is resumed (by anyone, in any process) the
    recorders of earlier attempts are refused, so a process thought dead cannot spend, commit,
    publish, finish or fail on behalf of the attempt that replaced it.
    """

    def __init__(self, ledger: Ledger, run_id: str, plan: RunPlan, *, attempt: int = 1,
                 before_spend: Callable[[], None] | None = None) -> None:
        """``before_spend`` is called under the ledger's lock right before an INTENT is appended;
        raising refuses the spend (a stop request: no INTENT follows it)."""
        self._ledger = ledger
        self.run_id = run_id
        self.attempt = attempt
        self._plan = {m.key: m for m in plan.measurements}
        self._before_spend = before_spend

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    def _run(self, state: LedgerState) -> RunState:
        return state.runs[self.run_id]

    def _current(self, state: LedgerState) -> RunState:
        """The run, if this recorder's attempt is still its current attempt."""
        run = self._run(state)
        if run.attempt != self.attempt:
            raise BudgetError(
                f"run {self.run_id} was resumed (attempt {run.attempt}, entry {run.attempt_seq}) after this "
                f"recorder's attempt {self.attempt}; refusing to record for a replaced attempt"
            )
        return run

    def record_intent(self, measurement: PlannedMeasurement) -> SpendReceipt:
        """Durably record that ``measurement``'s budget is being spent (before its noise).

        The ledger's followers confirm the ledger before the INTENT (it is still the history its
        witnesses cosigned) and after it (the spend itself is witnessed before its noise exists).

        Raises:
            BudgetError: The measurement is not in the run's plan or differs from it, was already
                spent in this attempt, the run has ended or was resumed since, or the spend is a
                re-spend that would take the dataset's odometer above its lifetime cap; the
                witnesses refuse the ledger or cannot be reached. Nothing is appended then --
                but when the confirmation after the INTENT fails, the INTENT stays (charged, no
                noise drawn; a resume spends it again).
        """
        key = measurement.key
        if self._plan.get(key) != measurement:
            raise BudgetError(f"{key} is not a measurement of run {self.run_id}'s plan; refusing to spend")
        with self._ledger.locked() as state:
            run = self._current(state)
            self._ledger.confirm()  # still the history the witnesses cosigned
            if self._before_spend is not None:
                self._before_spend()  # a stop request is acted on here, under the lock, before any INTENT
            rec = run.planned[key].record
            entry = self._ledger._append(state, [(
                EntryKind.INTENT, self.run_id,
                {"key": key, "budget": rec["budget"], "sensitivity": rec["sensitivity"], "n_cells": rec["n_cells"]},
            )], run_id=self.run_id)[0]
            self._ledger.confirm(fresh=False)  # the spend is witnessed before its noise is drawn
        return SpendReceipt(measurement_key=key, sequence=entry["seq"], entry_hash=entry["hash"])

    def record_committed(self, receipt: SpendReceipt, *, noisy_digest: str) -> None:
        """Record that the noise of ``receipt``'s spend was drawn; ``noisy_digest`` hashes it.

        Raises:
            BudgetError: The run was resumed since this recorder's attempt.
            LedgerError: The receipt is not the key's latest INTENT of this attempt, the key is
                already committed, or the digest is malformed.
        """
        with self._ledger.locked() as state:
            self._current(state)
            self._ledger.append_entries([(
                EntryKind.COMMITTED, self.run_id,
                {"key": receipt.measurement_key, "intent_seq": receipt.sequence,
                 "intent_hash": receipt.entry_hash, "noisy_digest": noisy_digest},
            )])

    def record_published(self, file_digests: Mapping[str, str], output: Path) -> None:
        """Record that the release is in place: ``OUTPUTS_PUBLISHED`` and ``RUN_FINISHED``, in one write.

        Called only after the release folder was renamed into place, so the ledger never says a
        release exists that does not.

        Args:
            file_digests: Relative path -> SHA-256 of every released file.
            output: Where the release was published (absolute path).
        """
        files = {str(k): str(v).lower() for k, v in file_digests.items()}
        with self._ledger.locked() as state:
            run = self._current(state)
            spent = run.charge()
            self._ledger.append_entries([
                (EntryKind.OUTPUTS_PUBLISHED, self.run_id, {"files": files, "output": str(Path(output).absolute())}),
                (EntryKind.RUN_FINISHED, self.run_id, {"spent": format_exact(spent)}),
            ])

    def fail(self, reason: str, code: str = "internal-error") -> None:
        """Record that the run failed; a no-op if it already ended or was resumed since.

        Args:
            reason: The operator's message (confidential: it may name enclave paths); cut to
                one line of 500 characters.
            code: Its public kind, one of :data:`~phsafe.ledger.format.FAILURE_CODES` (the public
                log gets the code and the attempt's stage, never ``reason``).
        """
        if code not in FAILURE_CODES:
            raise ValueError(f"{code!r} is not a failure code")
        # Recorded even when the public log cannot be written (its folder read-only, its disk full):
        # the log lags, and records it once it can be written, before any later spend.
        with self._ledger.locked(lagging=True) as state:
            run = self._run(state)
            if run.status is not RunStatus.RUNNING or run.attempt != self.attempt or run.outputs_in_attempt():
                # Ended, published, or a later attempt owns the run now: failing it would be a lie.
                return
            body: dict[str, Any] = {"spent": format_exact(run.intended_total()),
                                    "reason": clean_text(reason) or "unspecified failure"}
            if state.format >= 3:
                body.update(code=code, stage=run.failure_stage())
            self._ledger.append_entries([(EntryKind.RUN_FAILED, self.run_id, body)], lagging=True)

    def checkpoint(self, signing_key: Any = None) -> dict[str, Any]:
        """See :meth:`Ledger.checkpoint`."""
        return self._ledger.checkpoint(signing_key)
