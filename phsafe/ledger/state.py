"""What a ledger says: plain records built by the replay, and read-only queries over them.

Nothing here checks a rule or touches a file: :mod:`phsafe.ledger.rules` decides whether an
entry may be added, :mod:`phsafe.ledger.replay` adds it to a :class:`LedgerState`, and
:mod:`phsafe.ledger.store` reads and writes the file. The queries (what a run charges, a
dataset's odometer and cap, which runs claim a content version) are the ones the rules, the
front ends and the audit share, so that they all count alike.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping

from phsafe.accounting import PlannedMeasurement
from phsafe.amounts import Amount, add_amounts, times
from phsafe.config import PrivacyDefinition
from phsafe.ledger.format import GENESIS_HASH
from phsafe.ledger.policy import Policy, convert


class RunStatus(str, enum.Enum):
    """Where a run (its current attempt) stands."""

    RUNNING = "running"  # no terminal entry: still running, or crashed
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(frozen=True)
class PlannedSpend:
    """One planned measurement as the ledger recorded it.

    Attributes:
        measurement: The measurement rebuilt from the recorded fields.
        budget: Its exact budget (Fraction, or Infinity).
        record: The recorded fields, as written.
    """

    measurement: PlannedMeasurement
    budget: Amount
    record: Mapping[str, Any]

    @property
    def key(self) -> str:
        return self.measurement.key


@dataclass
class RunAttempt:
    """One attempt of a run: from its RUN_STARTED or RUN_RESUMED entry to how it ended.

    Attributes:
        number: 1 for the attempt RUN_STARTED opened, then 2, 3, ... per RUN_RESUMED.
        seq: The RUN_STARTED or RUN_RESUMED entry that opened it.
        time: That entry's time.
        code_version: The code version that ran it.
        lifetime_cap: The run's lifetime cap during this attempt.
        cap_reason: The cap reason recorded with that cap (None if none was given).
        resume_reason: Why the run was resumed (None for the first attempt).
        end: FINISHED or FAILED when it recorded that terminal entry; RUNNING when it has none
            (still running, or -- if a later attempt exists -- crashed).
        end_seq: The terminal entry, when there is one.
        end_time: Its time.
        end_reason: The RUN_FAILED reason, when it failed.
        end_code: Its public kind of failure (format 3), when it failed.
        end_stage: Its public stage (format 3), when it failed.
        orchestration: The orchestrator's identity of the attempt (its Prefect flow run and the
            parent flow run), when an orchestrator ran it.
        re_release: The operator's reason for releasing a content version again, when the entry
            that opened the attempt declared one.
    """

    number: int
    seq: int
    time: str
    code_version: str
    lifetime_cap: Amount
    cap_reason: str | None
    resume_reason: str | None = None
    orchestration: "Orchestration | None" = None
    re_release: str | None = None
    end: RunStatus = RunStatus.RUNNING
    end_seq: int | None = None
    end_time: str | None = None
    end_reason: str | None = None
    end_code: str | None = None
    end_stage: str | None = None


@dataclass
class RunState:
    """Everything the ledger says about one run.

    The RUN_STARTED fields stay as recorded at start, except ``lifetime_cap`` and ``cap_reason``,
    which are the cap the run was last checked against (at start or resume; for a run of the
    first ledger format, its own cap); every attempt's own values are in ``attempts``.
    ``status``, ``terminal_seq``, ``terminal_time`` and ``failure_reason`` describe the current
    attempt (a resume sets them back to running).

    ``dataset`` is the declared dataset name and ``fingerprint`` the keyed commitment of its
    content; a run of the first ledger format has neither, only ``legacy_dataset_id`` (the
    SHA-256 over its input file digests), and gets the name its id is mapped to at migration.
    ``validated`` says whether the full input suites ran before it spent (None: first format).
    """

    run_id: str
    started_seq: int
    started_time: str
    dataset: str | None
    fingerprint: str | None
    privacy_defn: PrivacyDefinition
    input_digests: dict[str, str]
    config_digest: str
    code_version: str
    truncation_key: str
    planned: dict[str, PlannedSpend]
    planned_total: Amount
    lifetime_cap: Amount
    cap_reason: str | None
    non_confidential: bool
    spent_before: Amount
    validated: bool | None = None
    legacy_dataset_id: str | None = None
    intents: dict[str, list[int]] = field(default_factory=dict)  # key -> every INTENT seq, in order
    intent_hashes: dict[str, str] = field(default_factory=dict)  # key -> hash of its latest INTENT
    committed: dict[str, str] = field(default_factory=dict)  # key -> noisy digest of its latest COMMITTED
    committed_seq: dict[str, int] = field(default_factory=dict)  # key -> seq of its latest COMMITTED
    committed_intent: dict[str, int] = field(default_factory=dict)  # key -> INTENT seq that COMMITTED names
    outputs: dict[str, str] | None = None
    outputs_seq: int | None = None
    output_path: str | None = None
    status: RunStatus = RunStatus.RUNNING
    terminal_seq: int | None = None
    terminal_time: str | None = None
    failure_reason: str | None = None
    attempts: list[RunAttempt] = field(default_factory=list)

    @property
    def re_release(self) -> str | None:
        """The reason recorded for releasing the run's content version again (at start or at a
        resume), or None: the run is its version's one release."""
        return next((a.re_release for a in reversed(self.attempts) if a.re_release), None)

    @property
    def claims_release(self) -> bool:
        """Whether the run claims its content version: published, or running (or crashed)."""
        return self.published or self.status is RunStatus.RUNNING

    @property
    def legacy(self) -> bool:
        """A run of the first ledger format (no declared dataset)."""
        return self.legacy_dataset_id is not None

    @property
    def account(self) -> str:
        """What the run's charges count against: its dataset name, or for a run of the first
        format not yet mapped to a name, its old dataset id."""
        return self.dataset if self.dataset is not None else f"legacy:{self.legacy_dataset_id}"

    @property
    def published(self) -> bool:
        """Whether the run recorded OUTPUTS_PUBLISHED (in any attempt)."""
        return self.outputs is not None

    @property
    def attempt(self) -> int:
        """The current attempt's number: 1 + the number of RUN_RESUMED entries of the run."""
        return len(self.attempts)

    @property
    def attempt_seq(self) -> int:
        """The entry (RUN_STARTED or the latest RUN_RESUMED) that opened the current attempt."""
        return self.attempts[-1].seq if self.attempts else self.started_seq

    @property
    def failures(self) -> list[RunAttempt]:
        """The attempts that ended without finishing, in order.

        Those that recorded RUN_FAILED (the current one too, once it has), and the crashed ones:
        attempts with no terminal entry that a later RUN_RESUMED replaced.
        """
        last = len(self.attempts) - 1
        return [
            a for i, a in enumerate(self.attempts)
            if a.end is RunStatus.FAILED or (a.end is RunStatus.RUNNING and i < last)
        ]

    def failure_stage(self) -> str:
        """Where the current attempt stands, as a RUN_FAILED of format 3 names it publicly:
        ``measure`` while a planned measurement is not committed, ``release`` once all are."""
        reusable = self.reusable
        return "release" if all(key in reusable for key in self.planned) else "measure"

    @property
    def reusable(self) -> dict[str, str]:
        """Key -> noisy digest, for the keys whose latest INTENT is COMMITTED.

        A resumed attempt may release such a key's stored vector, if it hashes to this digest,
        instead of spending the key again.
        """
        return {
            key: digest
            for key, digest in self.committed.items()
            if self.committed_intent[key] == self.intents[key][-1]
        }

    @property
    def respent(self) -> dict[str, int]:
        """Key -> number of INTENTs, for the keys spent more than once."""
        return {key: len(seqs) for key, seqs in self.intents.items() if len(seqs) > 1}

    def spent_in_attempt(self, key: str) -> int | None:
        """The key's INTENT in the current attempt, if it has one."""
        seqs = self.intents.get(key)
        if seqs and seqs[-1] > self.attempt_seq:
            return seqs[-1]
        return None

    def outputs_in_attempt(self) -> bool:
        """Whether the current attempt already recorded OUTPUTS_PUBLISHED."""
        return self.outputs_seq is not None and self.outputs_seq > self.attempt_seq

    def multiplicity(self, key: str, status: RunStatus | None = None) -> int:
        """How many times ``key``'s budget is charged (see the module docstring)."""
        n = len(self.intents.get(key, ()))
        if (status or self.status) is RunStatus.FAILED:
            return n
        return max(1, n) if key in self.planned else 0

    def key_charge(self, key: str, unit: PrivacyDefinition | None = None) -> Amount:
        """What ``key`` charges against the dataset, in ``unit`` (default: the run's own)."""
        return times(convert(self.planned[key].budget, self.privacy_defn, unit or self.privacy_defn),
                      self.multiplicity(key))

    def charge(self, unit: PrivacyDefinition | None = None, *, status: RunStatus | None = None) -> Amount:
        """What this run counts against its dataset, in ``unit`` (default: its own).

        Args:
            unit: The privacy definition to count in.
            status: Charge as if the run had this status (default: its own); the resume check
                charges a failed run as running again.
        """
        unit = unit or self.privacy_defn
        total: Amount = Fraction(0)
        for key in self.planned:
            n = self.multiplicity(key, status)
            if n:
                total = add_amounts(total, times(convert(self.planned[key].budget, self.privacy_defn, unit), n))
        return total

    def intended_total(self) -> Amount:
        """The budgets of every INTENT entry of the run, re-spends included."""
        total: Amount = Fraction(0)
        for key, seqs in self.intents.items():
            total = add_amounts(total, times(self.planned[key].budget, len(seqs)))
        return total


@dataclass(frozen=True)
class Orchestration:
    """Who ran an attempt: an orchestrator's flow run (and its parent, for a subflow).

    Public identifiers of the orchestrator's own database, recorded so that a retried flow run
    finds the ledger runs it started and resumes them instead of starting new ones.
    """

    flow_run_id: str
    parent_flow_run_id: str | None = None
    system: str = "prefect"

    def record(self) -> dict[str, str]:
        body = {"system": self.system, "flow_run_id": self.flow_run_id.lower()}
        if self.parent_flow_run_id:
            body["parent_flow_run_id"] = self.parent_flow_run_id.lower()
        return body

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Orchestration":
        return cls(record["flow_run_id"], record.get("parent_flow_run_id"), record["system"])

    def started(self, attempt: RunAttempt) -> bool:
        """Whether ``attempt`` was run by this flow run, or by a sibling under the same parent
        (a retried parent flow run starts its subflows anew, with new flow run ids)."""
        other = attempt.orchestration
        if other is None or other.system != self.system:
            return False
        if other.flow_run_id == self.flow_run_id:
            return True
        return self.parent_flow_run_id is not None and other.parent_flow_run_id == self.parent_flow_run_id


@dataclass
class CapChange:
    """One ``CAP_RAISED`` entry."""

    seq: int
    time: str
    lifetime_cap: Amount
    reason: str


@dataclass
class DatasetVersion:
    """One ``DATASET_VERSION`` entry: a content version declared under a dataset name."""

    seq: int
    time: str
    fingerprint: str
    reason: str
    sketch: dict[str, Any] | None = None
    """The keyed sketch of its person records (:mod:`phsafe.overlap`), when recorded."""
    overlap: dict[str, Any] | None = None
    """The declared relation to another dataset whose records it overlaps, when there is one."""


@dataclass
class DatasetState:
    """A declared dataset: its cap (the policy's, or the latest raise) and its content versions."""

    name: str
    lifetime_cap: Amount
    raises: list[CapChange] = field(default_factory=list)
    versions: list[DatasetVersion] = field(default_factory=list)

    @property
    def cap_reason(self) -> str | None:
        """The reason of the raise that set the current cap (None: the policy's cap)."""
        return self.raises[-1].reason if self.raises else None


@dataclass
class TailRepair:
    """One ``TAIL_REPAIRED`` entry: bytes of an interrupted write that were dropped."""

    seq: int
    time: str
    dropped_bytes: int
    dropped_sha256: str
    reason: str


class LedgerState:
    """The verified content of a ledger, built entry by entry by :func:`phsafe.ledger.replay.apply`.

    The replay checks each line against every rule (encoding, chain, sequence, the policy and the
    run state machine including the lifetime caps) and only then updates the state, so a state is
    always the state of a valid prefix. Here: the records, and queries over them.
    """

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.lines: list[bytes] = []
        self.runs: dict[str, RunState] = {}
        self.head_hash: str = GENESIS_HASH
        self.policy: Policy | None = None
        self.dataset_states: dict[str, DatasetState] = {}
        self.fingerprints: dict[str, str] = {}  # fingerprint -> the dataset it is declared under
        self.repairs: list[TailRepair] = []
        self.legacy_names: dict[str, str] = {}  # first-format dataset id -> name (at migration)
        self.public_log: dict[str, Any] | None = None
        """The public log the ledger is bound to (LEDGER_INIT of format 3, or LOG_BOUND): origin,
        verifier key, witness keys and quorum; None when it is bound to none."""
        self.public_log_seq: int | None = None
        self.declared_datasets: tuple[str, ...] | None = None
        """The datasets the policy declares it accounts (LEDGER_INIT's ``datasets``); None for a
        ledger made before declarations, which accounts any dataset."""
        self.retired: dict[str, int] = {}  # dataset -> its DATASET_RETIRED entry
        self._format = 1

    @property
    def size(self) -> int:
        return len(self.entries)

    @property
    def format(self) -> int:
        """1 for a ledger of the first format (no policy yet); 2 for one whose policy binds no
        public log (LEDGER_INIT of format 2, or LEDGER_MIGRATED of format 2); else :data:`FORMAT`."""
        return self._format

    @format.setter
    def format(self, value: int) -> None:
        self._format = value

    @property
    def awaits_log_binding(self) -> bool:
        """A ledger that began with LEDGER_INIT of format 2: it has a public log, not yet bound to
        it (``phsafe ledger migrate`` appends LOG_BOUND); it takes no new run until then."""
        return self.format == 2 and self.policy is not None and self.policy.seq == 0

    @property
    def unit(self) -> PrivacyDefinition | None:
        """The privacy definition every cap and charge is counted in (None: first format)."""
        return None if self.policy is None else self.policy.privacy_defn

    def dataset_spent(self, account: str, unit: PrivacyDefinition) -> Amount:
        """The odometer: the sum of every run's charge against ``account``, in ``unit``.

        ``account`` is a dataset name, or ``legacy:<id>`` for runs of the first format that no
        migration has named (see :attr:`RunState.account`).
        """
        total: Amount = Fraction(0)
        for run in self.runs.values():
            if run.account == account:
                total = add_amounts(total, run.charge(unit))
        return total

    def cap_of(self, run: RunState) -> Amount:
        """The cap ``run``'s spends are checked against: its dataset's (its own, first format)."""
        if run.dataset is not None and self.policy is not None:
            return self.dataset_cap(run.dataset)
        return run.lifetime_cap

    def dataset_cap(self, name: str) -> Amount:
        """A dataset's lifetime cap: the policy's, or its latest ``CAP_RAISED``."""
        assert self.policy is not None
        ds = self.dataset_states.get(name)
        return ds.lifetime_cap if ds is not None else self.policy.lifetime_cap

    def dataset_refusal(self, name: str) -> str | None:
        """Why this ledger takes no entry that lets ``name`` spend (a cap raise, a version, a
        run's start or resume): it is not among the datasets its policy declares, or it was
        retired; None when it accounts ``name``."""
        if name in self.retired:
            return (f"dataset {name!r} was retired from this ledger (entry {self.retired[name]}): its accounting "
                    "ended here for good, and nothing more is spent on it in this ledger")
        declared = self.declared_datasets
        if declared is not None and name not in declared:
            return (f"dataset {name!r} is not one of the datasets this ledger declares it accounts "
                    f"({', '.join(declared)}); a ledger's datasets are fixed when it is made -- a new dataset "
                    "gets a ledger of its own (phsafe ledger init --dataset NAME)")
        return None

    def unit_of(self, run: RunState) -> PrivacyDefinition:
        """The unit ``run``'s charges are counted in: the ledger's (the run's own, first format)."""
        return self.unit or run.privacy_defn

    def resume_odometer(self, run: RunState) -> Amount:
        """The dataset's odometer with ``run`` running again (reserving its whole plan again).

        This is what the cap of a RUN_RESUMED must cover. It is never below the odometer now.
        """
        unit = self.unit_of(run)
        total: Amount = run.charge(unit, status=RunStatus.RUNNING)
        for other in self.runs.values():
            if other.account == run.account and other is not run:
                total = add_amounts(total, other.charge(unit))
        return total

    def respend_odometer(self, run: RunState, key: str) -> Amount | None:
        """The odometer after a new INTENT of ``key``, or None if that INTENT adds nothing.

        Only a re-spend (a key that already has an INTENT, in a running run) adds to the charge:
        a first INTENT was reserved at start or resume.
        """
        if not run.intents.get(key):
            return None
        unit = self.unit_of(run)
        return add_amounts(self.dataset_spent(run.account, unit),
                           convert(run.planned[key].budget, run.privacy_defn, unit))

    def datasets(self) -> dict[str, list[RunState]]:
        """Account (dataset name, or ``legacy:<id>``) -> its runs, in ledger order."""
        out: dict[str, list[RunState]] = {}
        for run in self.runs.values():
            out.setdefault(run.account, []).append(run)
        return out

    def release_claims(self, dataset: str, fingerprint: str, *, besides: str | None = None) -> list[RunState]:
        """The runs (other than ``besides``) that claim the content version ``(dataset,
        fingerprint)``: published, or running or crashed -- see "One release per content version"."""
        return [r for r in self.runs.values()
                if r.run_id != besides and r.dataset == dataset and r.fingerprint == fingerprint
                and r.fingerprint is not None and r.claims_release]

    def runs_of(self, orchestration: "Orchestration", dataset: str) -> list[RunState]:
        """The runs of ``dataset`` that ``orchestration`` (or the flow run it retries) started or
        resumed, most recent first."""
        found = [r for r in self.runs.values()
                 if r.dataset == dataset and any(orchestration.started(a) for a in r.attempts)]
        return sorted(found, key=lambda r: r.attempt_seq, reverse=True)

    def unpublished(self) -> list[RunState]:
        """Runs that charge their dataset and published nothing: to be resumed.

        Those that recorded an INTENT, and those still running or crashed (they reserve their
        whole plan even before their first INTENT). A failed run with no INTENT charges nothing.
        """
        return [r for r in self.runs.values()
                if not r.published and (r.intents or r.status is RunStatus.RUNNING)]
