"""Ledgers for tests: made the only way ledgers are made (``init_ledger``), with helpers to start
runs on them through the real API.

Fingerprints here are stand-ins (any 64 hex digits): the ledger treats them as opaque keyed
commitments. Tests of the fingerprint itself are in ``tests/unit/test_fingerprint.py``.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

from phsafe.accounting import RunPlan
from phsafe.config import INFINITE, PrivacyDefinition
from phsafe.ledger import Ledger, RunRecorder, init_ledger

FP_A = "a1" * 32
FP_B = "b2" * 32
DIGESTS_A = {"persons.csv": "1" * 64, "units.csv": "2" * 64, "geo.csv": "3" * 64}
DIGESTS_B = {"persons.csv": "4" * 64, "units.csv": "5" * 64, "geo.csv": "6" * 64}
KEY_HEX = "ab" * 32


def new_ledger(directory: Path, *, cap: Fraction | int | str = 2, non_confidential: bool = False,
               privacy_defn: PrivacyDefinition = PrivacyDefinition.ZCDP, name: str = "ledger.jsonl") -> Ledger:
    """A fresh ledger in ``directory`` (cap ``"inf"``: Infinity, non-confidential only)."""
    amount = INFINITE if cap == "inf" else Fraction(cap)
    return init_ledger(Path(directory) / name, lifetime_cap=amount, reason="test policy",
                       privacy_defn=privacy_defn, non_confidential=non_confidential, code_version="test")


def start(ledger: Ledger, plan: RunPlan, run_id: str, *, dataset: str = "test-data", fingerprint: str = FP_A,
          digests: dict[str, str] = DIGESTS_A, new_version: str | None = "first version", **kw: Any) -> RunRecorder:
    """Start ``run_id``; declares the fingerprint as a new version when it is not known yet."""
    known = ledger.state.fingerprints.get(fingerprint) is not None
    return ledger.start_run(
        run_id=run_id, plan=plan, dataset=dataset, fingerprint=fingerprint, config_digest="c" * 64,
        input_digests=digests, code_version="test", truncation_key_hex=KEY_HEX,
        new_version=None if known else new_version, **kw,
    )
