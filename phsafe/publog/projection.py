"""The public privacy-loss log's entries: the exact projection of the ledger's public facts.

Each ledger entry projects to zero or one public entry, by a pure function of the ledger's
entries in order (:class:`Projector`), so that anyone holding the ledger -- the confidential
``audit verify`` -- can recompute the public log byte for byte. A public entry is the canonical
JSON (sorted keys, no whitespace, UTF-8, exact numbers as strings) of one object whose ``type``
says what it records; every entry carries the ``time`` of the ledger entry it projects.

=====================  ===================  ===================================================
ledger entry           public ``type``      fields besides ``type`` and ``time``
=====================  ===================  ===================================================
LEDGER_INIT            ``policy``           ``format`` (this log's, :data:`PUBLIC_FORMAT`),
                                            ``ledger_id``, ``privacy_defn`` (the unit of every
                                            cap and charge), ``lifetime_cap`` (every dataset's),
                                            ``non_confidential``, ``reason``, ``code_version``,
                                            ``ledger_cap`` (all datasets together; when set),
                                            ``witnesses`` (their verifier keys) and ``quorum``
                                            (a ledger bound to its log from LEDGER_INIT),
                                            ``datasets`` (the datasets it accounts; when
                                            declared)
LOG_BOUND              ``log-bound``        ``witnesses``, ``quorum``, ``reason`` (a ledger
                                            made before logs were bound, bound since)
DATASET_VERSION        ``dataset-version``  ``dataset``, ``version`` (1, 2, ... per dataset),
                                            ``reason``, ``overlap`` (when declared: the other
                                            ``dataset`` and the ``reason``, never the share)
CAP_RAISED             ``cap-raised``       ``dataset``, ``lifetime_cap``, ``reason``
TAIL_REPAIRED          ``ledger-repaired``  ``reason``
DATASET_RETIRED        ``dataset-retired``  ``dataset``, ``reason``, ``successor`` (when named:
                                            the ``origin`` and ``key_id`` of the log that
                                            accounts the dataset from now on)
RUN_STARTED            ``run-started``      ``run_id``, ``dataset``, ``privacy_defn``,
                                            ``planned`` (every table x level: key, table,
                                            level, budget, sensitivity, tau, n_cells,
                                            distribution, noise_parameter, variance),
                                            ``planned_total``, ``lifetime_cap`` and
                                            ``spent_before`` (the dataset's, at the start),
                                            ``non_confidential``, ``validated``,
                                            ``code_version``, ``re_release`` (when declared)
INTENT                 ``spend``            ``run_id``, ``key``, ``budget``, ``sensitivity``,
                                            ``n_cells``
RUN_RESUMED            ``run-resumed``      ``run_id``, ``dataset``, ``attempt``,
                                            ``code_version``, ``reason``, ``re_release``
                                            (when declared)
RUN_FAILED             ``run-failed``       ``run_id``, ``spent``, ``code`` (the kind of
                                            failure, from a fixed list:
                                            :data:`phsafe.ledger.format.FAILURE_CODES`) and
                                            ``stage`` (``measure`` or ``release``); the
                                            operator's message stays in the ledger. (A ledger
                                            entry of format 2 projected ``reason`` instead:
                                            those entries stay as they were published.)
OUTPUTS_PUBLISHED +    ``release``          ``run_id``, ``dataset``, ``privacy_defn``,
RUN_FINISHED                                ``manifest_sha256`` (SHA-256 of the release's
                                            ``manifest.json``), ``planned`` (as in
                                            ``run-started``), ``spends`` (per planned key: its
                                            ``budget`` and ``times``, the number of its spends
                                            over all attempts), ``spent`` (the run's charge)
COMMITTED              --                   (a noise draw's bookkeeping: no spend)
=====================  ===================  ===================================================

``OUTPUTS_PUBLISHED`` and ``RUN_FINISHED`` are always written together (one write), and make one
``release`` entry, projected at ``RUN_FINISHED``: so the one entry a release folder carries
names its manifest and lists every spend of its run.

What is left out, and why: input file and config digests, content fingerprints and the
truncation key (facts about the confidential records: a plain digest can be tested against
guessed records), the lineage key's id (keyed by the lineage key), the noisy vectors' digests,
where a release was written inside the enclave, orchestration ids, the hash chain's hashes (over
all of the above), and the length and digest of a dropped torn write. The dataset's content
versions are counted, never identified. The state filter is not in the ledger; it is in the
release's manifest, which the ``release`` entry pins by digest.

No operator text that can name an enclave path or a figure of the data: the reasons the
operator gives on purpose (a policy's, a version's, a cap raise's, a resume's, a re-release's)
are published as the operator's public statements, and the one message the code writes -- why a
run failed, which may name the enclave's folders -- is replaced by a code from a fixed list and
the run's public stage.

Only ledgers that begin with ``LEDGER_INIT`` are projected (ledgers of the first format, with
datasets identified by input digests, have no public log).

The release manifest's ledger checkpoint (decided with issue 29). Each release's
``manifest.json`` carries a checkpoint of the *confidential* ledger: its size and head hash,
signed with the operator's Ed25519 key. It stays, for two reasons, and the public log does not
repeat it. (1) It is what the confidential audit checks a release against (``audit verify
--public-key``): a signature by a key the log's operator need not hold, over the exact ledger
history at publication, so a ledger rewritten after a release is caught by the ledger's own
auditors even if the log key and the log were rewritten together. (2) It reveals nothing that
can be tested against guesses: the head hash chains over entry 0's lineage key id (an HMAC
under 32 random bytes never published) and every run's random truncation key, so nobody without
the ledger can recompute it for guessed records -- it is a hiding commitment, like the keyed
lineage commitment beside it -- and the size counts entries whose kinds the public log already
shows (its spends, plus one COMMITTED per spend whose noise was drawn). The public log leaves
out every chain hash so that it stays a pure function of public facts: an outsider recomputes
the statement from it without anything of the ledger.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from phsafe.errors import LedgerError
from phsafe.ledger.format import EntryKind, canonical_json

PUBLIC_FORMAT = "phsafe-privacy-loss-log/1"
MANIFEST = "manifest.json"


@dataclass
class _Run:
    dataset: str
    privacy_defn: str
    planned: list[dict[str, Any]]
    spends: Counter = field(default_factory=Counter)
    attempt: int = 1
    files: dict[str, str] | None = None


class Projector:
    """Projects ledger entries, fed in order, to public entries (see the module docstring).

    ``entries`` holds every public entry so far; ``fed`` counts the ledger entries fed.
    """

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.fed = 0
        self._runs: dict[str, _Run] = {}
        self._versions: Counter = Counter()

    def feed_line(self, line: bytes) -> bytes | None:
        """Project one ledger line (already verified by the ledger's replay)."""
        return self.feed(json.loads(line))

    def feed(self, entry: dict[str, Any]) -> bytes | None:
        """Project one verified ledger entry; returns its public entry, if it has one."""
        public = self._project(entry)
        self.fed += 1
        if public is None:
            return None
        data = canonical_json(public)
        self.entries.append(data)
        return data

    def _project(self, e: dict[str, Any]) -> dict[str, Any] | None:
        kind = EntryKind(e["kind"])
        base = {"time": e["time"]}
        if self.fed == 0 and kind is not EntryKind.LEDGER_INIT:
            raise LedgerError("the ledger was written before ledgers had a policy (it does not begin with "
                              "LEDGER_INIT): it has no public privacy-loss log")
        if kind is EntryKind.LEDGER_INIT:
            policy = {**base, "type": "policy", "format": PUBLIC_FORMAT, "ledger_id": e["ledger_id"],
                      "privacy_defn": e["privacy_defn"], "lifetime_cap": e["lifetime_cap"],
                      "non_confidential": e["non_confidential"], "reason": e["reason"],
                      "code_version": e["code_version"]}
            if "ledger_cap" in e:  # the cap on all datasets together, when the policy has one
                policy["ledger_cap"] = e["ledger_cap"]
            if "public_log" in e:  # the witnesses the ledger is bound to
                policy["witnesses"] = list(e["public_log"]["witnesses"])
                policy["quorum"] = e["public_log"]["quorum"]
            if "datasets" in e:  # what the log's witnesses read from its registration
                policy["datasets"] = list(e["datasets"])
            return policy
        if kind is EntryKind.LOG_BOUND:
            return {**base, "type": "log-bound", "witnesses": list(e["public_log"]["witnesses"]),
                    "quorum": e["public_log"]["quorum"], "reason": e["reason"]}
        if kind is EntryKind.LEDGER_MIGRATED:  # never after LEDGER_INIT (the ledger's rules)
            raise LedgerError("a migrated ledger has no public privacy-loss log")
        if kind is EntryKind.DATASET_VERSION:
            self._versions[e["dataset"]] += 1
            version = {**base, "type": "dataset-version", "dataset": e["dataset"],
                       "version": self._versions[e["dataset"]], "reason": e["reason"]}
            if "overlap" in e:
                # The declared relation is public; its measured share is not (a statistic of the
                # confidential records, as the keyed sketches it comes from).
                version["overlap"] = {"dataset": e["overlap"]["dataset"], "reason": e["overlap"]["reason"]}
            return version
        if kind is EntryKind.CAP_RAISED:
            return {**base, "type": "cap-raised", "dataset": e["dataset"], "lifetime_cap": e["lifetime_cap"],
                    "reason": e["reason"]}
        if kind is EntryKind.TAIL_REPAIRED:
            return {**base, "type": "ledger-repaired", "reason": e["reason"]}
        if kind is EntryKind.DATASET_RETIRED:
            retired = {**base, "type": "dataset-retired", "dataset": e["dataset"], "reason": e["reason"]}
            if "successor" in e:
                retired["successor"] = dict(e["successor"])
            return retired
        run_id = e["run_id"]
        if kind is EntryKind.RUN_STARTED:
            self._runs[run_id] = _Run(e["dataset"], e["privacy_defn"], list(e["planned"]))
            out = {**base, "type": "run-started", "run_id": run_id, "dataset": e["dataset"],
                   "privacy_defn": e["privacy_defn"], "planned": e["planned"], "planned_total": e["planned_total"],
                   "lifetime_cap": e["lifetime_cap"], "spent_before": e["spent_before"],
                   "non_confidential": e["non_confidential"], "validated": e["validated"],
                   "code_version": e["code_version"]}
            if "re_release" in e:
                out["re_release"] = e["re_release"]
            return out
        run = self._runs[run_id]
        if kind is EntryKind.INTENT:
            run.spends[e["key"]] += 1
            return {**base, "type": "spend", "run_id": run_id, "key": e["key"], "budget": e["budget"],
                    "sensitivity": e["sensitivity"], "n_cells": e["n_cells"]}
        if kind is EntryKind.COMMITTED:
            return None
        if kind is EntryKind.RUN_RESUMED:
            run.attempt += 1
            out = {**base, "type": "run-resumed", "run_id": run_id, "dataset": e["dataset"], "attempt": run.attempt,
                   "code_version": e["code_version"], "reason": e["reason"]}
            if "re_release" in e:
                out["re_release"] = e["re_release"]
            return out
        if kind is EntryKind.RUN_FAILED:
            if "code" in e:
                return {**base, "type": "run-failed", "run_id": run_id, "spent": e["spent"], "code": e["code"],
                        "stage": e["stage"]}
            # Format 2: published with the reason before codes existed; the log keeps its bytes.
            return {**base, "type": "run-failed", "run_id": run_id, "spent": e["spent"], "reason": e["reason"]}
        if kind is EntryKind.OUTPUTS_PUBLISHED:
            run.files = dict(e["files"])
            return None
        if kind is EntryKind.RUN_FINISHED:
            # A ledger may record a publication without a manifest digest; the entry then says
            # null, and `audit public` refuses such a release (nothing pins its files).
            files = run.files or {}
            return {**base, "type": "release", "run_id": run_id, "dataset": run.dataset,
                    "privacy_defn": run.privacy_defn, "manifest_sha256": files.get(MANIFEST),
                    "planned": run.planned,
                    "spends": [{"key": p["key"], "budget": p["budget"], "times": run.spends[p["key"]]}
                               for p in run.planned],
                    "spent": e["spent"]}
        raise AssertionError(f"unprojected kind {kind}")  # every kind is handled above


def project(lines: Iterable[bytes]) -> list[bytes]:
    """The public entries of a whole ledger, given its lines (verified) in order."""
    projector = Projector()
    for line in lines:
        projector.feed_line(line)
    return projector.entries


def release_entry_index(entries: list[bytes], run_id: str) -> int | None:
    """The index of ``run_id``'s ``release`` entry among public ``entries``, or None."""
    for index in range(len(entries) - 1, -1, -1):
        entry = json.loads(entries[index])
        if entry.get("type") == "release" and entry.get("run_id") == run_id:
            return index
    return None
