"""The privacy-loss ledger: an append-only, hash-chained, durable record of every spend.

The ledger is confidential: it stays inside the enclave with the data. What the public sees of it
is a signed checkpoint (size and head hash), in each release's manifest a keyed lineage
commitment, and the public privacy-loss log beside it -- the projection of its public facts,
kept in step under its lock. This package never imports the log: the log (:mod:`phsafe.publog`)
registers itself as the ledger's follower (:class:`~phsafe.ledger.store.AppendFollower`), and the
ledger's first entry binds it, so a ledger bound to its log appends nothing without it. Its
format and rules are specified in :mod:`phsafe.ledger.format`'s docstring.

The rules, the file and the log read apart: a check per entry kind over a state built in memory,
the file handling around it, and followers known by a protocol.

=====================  ===================================================================
:mod:`.format`         the specification; canonical JSON, hashing, entry kinds, line parsing
:mod:`.state`          plain records (runs, attempts, datasets) and read-only queries
:mod:`.policy`         the policy record; caps, what a plan charges, unit conversion
:mod:`.rules`          one check per entry kind, through the table ``RULES``
:mod:`.first_format`   the rules of ledgers written before policies, where they differ
:mod:`.replay`         the one apply, used on open, on append and by the audit
:mod:`.store`          the file opened once and followed, the lock, followers, durable appends
:mod:`.keys`           the lineage key, keyed commitments, checkpoint signing
:mod:`.admin`          ``phsafe ledger init``, ``repair`` and ``migrate`` (the ledger's part)
:mod:`.runs`           :class:`Ledger` (datasets, caps, runs), :class:`RunRecorder`, and the
                       operator's messages for the rules' refusals
=====================  ===================================================================

Exact amounts are :mod:`phsafe.amounts`'s; the ledger's errors are :mod:`phsafe.errors`'s. The
names below are the package's public surface.
"""

from __future__ import annotations

from phsafe.amounts import Amount, add_amounts, amount_exceeds, format_exact, parse_exact
from phsafe.errors import LedgerError, TornTailError
from phsafe.ledger.admin import Repair, bind_public_log, init_ledger, migrate_ledger, repair_ledger
from phsafe.ledger.format import (
    FAILURE_CODES,
    FAILURE_STAGES,
    FORMAT,
    GENESIS_HASH,
    LEDGER_KINDS,
    EntryKind,
    canonical_json,
    checkpoint_message,
    dataset_id,
    entry_hash,
)
from phsafe.ledger.keys import (
    key_id,
    key_path,
    lineage_commitment,
    load_signing_key,
    read_lineage_key,
    sign_checkpoint,
)
from phsafe.ledger.policy import Policy, check_ledger_kind, plan_charge
from phsafe.ledger.replay import replay
from phsafe.ledger.runs import Ledger, RunRecorder
from phsafe.ledger.state import (
    DatasetState,
    LedgerState,
    Orchestration,
    PlannedSpend,
    RunAttempt,
    RunState,
    RunStatus,
)
from phsafe.ledger.store import (
    AppendFollower,
    FollowerSource,
    FollowerUnwritable,
    check_ledger_file,
    lock_path,
    read_ledger,
    repair_record_path,
)

__all__ = [
    # the ledger and its runs
    "Ledger", "RunRecorder", "Orchestration", "init_ledger", "repair_ledger", "migrate_ledger", "bind_public_log",
    "Repair", "read_ledger", "replay", "check_ledger_file", "check_ledger_kind", "plan_charge",
    # what follows the ledger (its public log) knows it by
    "AppendFollower", "FollowerSource", "FollowerUnwritable",
    # what a ledger says
    "LedgerState", "RunState", "RunAttempt", "RunStatus", "PlannedSpend", "DatasetState", "Policy",
    # the format
    "EntryKind", "LEDGER_KINDS", "FORMAT", "FAILURE_CODES", "FAILURE_STAGES", "GENESIS_HASH", "canonical_json", "entry_hash", "checkpoint_message",
    "dataset_id",
    # keys and files
    "key_id", "key_path", "lock_path", "repair_record_path", "read_lineage_key", "lineage_commitment", "load_signing_key",
    "sign_checkpoint",
    # exact amounts (phsafe.amounts) and errors (phsafe.errors), as the ledger's callers know them
    "Amount", "format_exact", "parse_exact", "add_amounts", "amount_exceeds", "LedgerError", "TornTailError",
]
