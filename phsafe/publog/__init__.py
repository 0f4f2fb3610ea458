"""The public, verifiable privacy-loss log (issue 21): what each release spent, checkable by anyone.

Built on :mod:`phsafe.tlog` (RFC 6962 Merkle log, C2SP signed notes, checkpoints, witnesses,
tlog-proof files). Beside each ledger, a public log holds the exact projection of the ledger's
public facts (:mod:`.projection`), appended under the ledger's lock in step with it
(:mod:`.log`); witnesses (:mod:`.witness`) cosign its checkpoints and refuse forks; outsiders
check a release, the whole log and every dataset's privacy-loss statement with public files
only (:mod:`.audit`, ``phsafe audit public``); the confidential ``audit verify`` checks that the
log is exactly the projection of the ledger.

==========================  ===============================================================
:mod:`.projection`          ledger entries -> public entries (what is public, and why)
:mod:`.log`                 the log beside a ledger: files, keys, keeping in step, proofs
:mod:`.witness`             witness folders and a ledger's witness policy
:mod:`.audit`               ``phsafe audit public``: the outsider's checks and statement
==========================  ===============================================================
"""

from __future__ import annotations

from phsafe.publog.log import (
    ENTRY_FILE,
    PROOF_FILE,
    RELEASE_LOG_FILES,
    PublicLog,
    create_public_log,
    log_key_path,
    log_path,
    write_release_files,
)
from phsafe.publog.projection import PUBLIC_FORMAT, Projector, project
from phsafe.publog.witness import WitnessFolder, init_witness, read_witness_policy, witnesses_path

__all__ = [
    "ENTRY_FILE", "PROOF_FILE", "RELEASE_LOG_FILES", "PublicLog", "create_public_log", "log_key_path", "log_path",
    "write_release_files", "PUBLIC_FORMAT", "Projector", "project", "WitnessFolder", "init_witness",
    "read_witness_policy", "witnesses_path",
]
