"""Ledgers for tests: made the only way ledgers are made (``init_ledger``), with helpers to start
runs on them through the real API; and ledgers of the first format, written by hand
(:class:`FirstFormatLedger`), to check that they still verify and migrate.

Fingerprints here are stand-ins (any 64 hex digits): the ledger treats them as opaque keyed
commitments. Tests of the fingerprint itself are in ``tests/unit/test_fingerprint.py``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from phsafe.accounting import PlannedMeasurement, RunPlan
from phsafe.config import INFINITE, PrivacyDefinition
from phsafe.ledger import Ledger, RunRecorder, canonical_json, dataset_id, entry_hash, format_exact
from phsafe.publog import create_ledger
from phsafe.noise import vector_digest

FP_A = "a1" * 32
FP_B = "b2" * 32
DIGESTS_A = {"persons.csv": "1" * 64, "units.csv": "2" * 64, "geo.csv": "3" * 64}
DIGESTS_B = {"persons.csv": "4" * 64, "units.csv": "5" * 64, "geo.csv": "6" * 64}
KEY_HEX = "ab" * 32


def new_ledger(directory: Path, *, cap: Fraction | int | str = 2, non_confidential: bool = False,
               privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP, name: str = "ledger.jsonl",
               **kw: Any) -> Ledger:
    """A fresh ledger in ``directory`` (cap ``"inf"``: Infinity, non-confidential only), bound to
    its public log as every ledger is (``kw``: witnesses, witness_quorum, transport, ...)."""
    amount = INFINITE if cap == "inf" else Fraction(cap)
    return create_ledger(Path(directory) / name, lifetime_cap=amount, reason="test policy",
                         privacy_defn=privacy_defn, non_confidential=non_confidential, code_version="test", **kw)


AGAIN = "another release of the same records, for the test"
AUTO = object()


def start(ledger: Ledger, plan: RunPlan, run_id: str, *, dataset: str = "test-data", fingerprint: str = FP_A,
          digests: dict[str, str] = DIGESTS_A, new_version: str | None = "first version",
          re_release: Any = AUTO, **kw: Any) -> RunRecorder:
    """Start ``run_id``; declares the fingerprint as a new version when it is not known yet, and
    -- unless ``re_release`` is given -- declares a re-release when another run released (or is
    releasing) the same records, so that tests of the caps meet the caps. The one-release rule
    has tests of its own that pass ``re_release`` themselves."""
    known = ledger.state.fingerprints.get(fingerprint) is not None
    if re_release is AUTO:
        ledger.verify()  # caught up with the file: the claims are those on disk
        re_release = AGAIN if ledger.state.release_claims(dataset, fingerprint) else None
    return ledger.start_run(
        run_id=run_id, plan=plan, dataset=dataset, fingerprint=fingerprint, config_digest="c" * 64,
        input_digests=digests, code_version="test", truncation_key_hex=KEY_HEX,
        new_version=None if known else new_version, re_release=re_release, **kw,
    )


# --------------------------------------------------------------------------------------------
# Ledgers of the first format (before LEDGER_INIT), written by hand
# --------------------------------------------------------------------------------------------


def utc_now() -> str:
    """A ledger timestamp: UTC, microseconds, ``Z``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def planned_items(plan: RunPlan) -> list[dict[str, Any]]:
    """The ``planned`` field of a RUN_STARTED entry, built from the format's definition."""
    items = []
    for m in plan.measurements:
        budget = Fraction(m.budget)
        if plan.privacy_defn is PrivacyDefinition.ZCDP:
            noise = format_exact(Fraction(m.sensitivity**2) / (2 * budget))  # sigma^2 = Delta^2 / (2 rho)
        else:
            noise = format_exact(Fraction(m.sensitivity) / budget)  # scale = Delta / epsilon
        items.append({
            "key": m.key, "table": m.table, "level": m.level.config_key, "budget": format_exact(budget),
            "sensitivity": m.sensitivity, "tau": m.tau, "n_cells": m.n_cells,
            "distribution": m.distribution.value, "noise_parameter": noise, "variance": repr(m.variance),
        })
    return items


class FirstFormatLedger:
    """Writes a ledger of the first format entry by entry, as the code before policies did.

    Its entries have the fields of ``phsafe.ledger.format.FIRST_FORMAT_BODY_FIELDS`` where they differ: RUN_STARTED has
    ``dataset_id`` (SHA-256 over the input file digests), its own ``lifetime_cap`` and
    ``cap_reason``; OUTPUTS_PUBLISHED has no ``output``; a run may finish without publishing.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: list[dict[str, Any]] = []
        self.path.write_bytes(b"")

    def append(self, kind: str, run_id: str | None, **body: Any) -> dict[str, Any]:
        entry = craft(self.path, kind, run_id, body)
        self.entries.append(entry)
        return entry

    def start(self, run_id: str, plan: RunPlan, digests: dict[str, str], *, spent_before: Fraction = Fraction(0),
              lifetime_cap: Fraction | None = None, cap_reason: str | None = None,
              non_confidential: bool = False) -> dict[str, Any]:
        total = sum((Fraction(m.budget) for m in plan.measurements), Fraction(0))
        return self.append(
            "RUN_STARTED", run_id, dataset_id=dataset_id(digests), input_digests=dict(digests),
            config_digest="c" * 64, code_version="v0", truncation_key=KEY_HEX,
            privacy_defn=plan.privacy_defn.value, planned=planned_items(plan), planned_total=format_exact(total),
            lifetime_cap=format_exact(total if lifetime_cap is None else lifetime_cap), cap_reason=cap_reason,
            non_confidential=non_confidential, spent_before=format_exact(spent_before),
        )

    def intent(self, run_id: str, m: PlannedMeasurement) -> dict[str, Any]:
        return self.append("INTENT", run_id, key=m.key, budget=format_exact(Fraction(m.budget)),
                           sensitivity=m.sensitivity, n_cells=m.n_cells)

    def spend(self, run_id: str, m: PlannedMeasurement, noisy: np.ndarray) -> None:
        """INTENT and COMMITTED of ``m``, committing ``noisy`` (its digest)."""
        intent = self.intent(run_id, m)
        self.append("COMMITTED", run_id, key=m.key, intent_seq=intent["seq"], intent_hash=intent["hash"],
                    noisy_digest=vector_digest(np.asarray(noisy, dtype=np.int64)))

    def publish(self, run_id: str, files: dict[str, str]) -> dict[str, Any]:
        return self.append("OUTPUTS_PUBLISHED", run_id, files=dict(files))

    def finish(self, run_id: str, spent: Fraction) -> dict[str, Any]:
        return self.append("RUN_FINISHED", run_id, spent=format_exact(spent))

    def fail(self, run_id: str, spent: Fraction, reason: str) -> dict[str, Any]:
        return self.append("RUN_FAILED", run_id, spent=format_exact(spent), reason=reason)


def craft(path: Path, kind: str, run_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
    """Append a hand-made entry to the ledger file, with a correct hash chain and no API check.

    What only the replay rules (``read_ledger``, ``phsafe audit verify``) can then reject.
    """
    raw = Path(path).read_bytes().split(b"\n")[:-1]
    last = json.loads(raw[-1]) if raw else None
    entry: dict[str, Any] = {
        "seq": 0 if last is None else last["seq"] + 1, "prev": "0" * 64 if last is None else last["hash"],
        "kind": kind, "time": utc_now(), "run_id": run_id, **body,
    }
    entry["hash"] = entry_hash(entry)
    with open(path, "ab") as f:
        f.write(canonical_json(entry) + b"\n")
    return entry


def rewind_public_log(ledger_path: Path) -> None:
    """Empty the ledger's public log, as if no entry had reached it (its key stays).

    For tests that tear the ledger's last write by hand: a real torn write never reached the
    log (the log is written after the ledger's fsync), so the log must not hold it either. The
    ledger's next use projects every complete entry again.
    """
    from phsafe.publog import log_path
    from phsafe.tlog.files import FileHashStore

    folder = log_path(ledger_path)
    for name in ("entries", "hashes", "checkpoint"):
        (folder / name).unlink(missing_ok=True)
    (folder / "entries").write_bytes(b"")
    FileHashStore.create(folder / "hashes").close()
