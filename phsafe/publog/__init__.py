"""The public, verifiable privacy-loss log (issues 21 and 29): what each release spent, checkable by anyone.

Built on :mod:`phsafe.tlog` (RFC 6962 Merkle log, C2SP signed notes, checkpoints, witnesses,
tlog-proof files). Beside each ledger, a public log holds the exact projection of the ledger's
public facts (:mod:`.projection`), appended under the ledger's lock in step with it
(:mod:`.log`: the ledger's follower, which registers itself -- the ledger never imports this
package); witnesses, other parties reached over HTTP (:mod:`.witnesses`), cosign its checkpoints
before every spend and refuse forks. The ledger's first entry binds the log, so a ledger cannot
spend without it (:mod:`.ledgers`). Outsiders check a release, the whole log and every dataset's
privacy-loss statement with public files only (:mod:`phsafe.audit.public`, ``phsafe audit
public``); the confidential ``audit verify`` checks that the log is exactly the projection of
the ledger (:mod:`.confidential`).

==========================  ===============================================================
:mod:`.projection`          ledger entries -> public entries (what is public, and why)
:mod:`.log`                 the log beside a ledger: files, binding, keeping in step, proofs
:mod:`.witnesses`           a ledger's witnesses: their keys and URLs, asked over HTTP
:mod:`.ledgers`             a ledger with its log: create, open, repair, bind, cosign
:mod:`.confidential`        ``audit verify``'s check that the log is the ledger's projection
:mod:`.claims`              one log per dataset: registrations, retirements
==========================  ===============================================================
"""

from __future__ import annotations

from phsafe.publog.claims import make_log_registration, retire_dataset
from phsafe.publog.ledgers import (
    PUBLIC_LOG,
    PublicLogSource,
    bind_public_log,
    cosign_public_log,
    create_ledger,
    open_ledger,
    public_log_of,
    repair_ledger,
    write_release_log_files,
)
from phsafe.publog.log import (
    ENTRY_FILE,
    PROOF_FILE,
    RELEASE_LOG_FILES,
    PublicLog,
    log_key_path,
    log_path,
)
from phsafe.publog.projection import PUBLIC_FORMAT, Projector, project
from phsafe.publog.witnesses import WitnessList, init_witness, read_witness_list, witnesses_path

__all__ = [
    # a ledger with its log
    "create_ledger", "open_ledger", "repair_ledger", "bind_public_log", "cosign_public_log", "write_release_log_files",
    "PUBLIC_LOG", "PublicLogSource", "public_log_of",
    # one log per dataset: a log's registration with its witnesses, a dataset's retirement
    "make_log_registration", "retire_dataset",
    # the log and its files
    "PublicLog", "ENTRY_FILE", "PROOF_FILE", "RELEASE_LOG_FILES", "log_key_path", "log_path",
    "PUBLIC_FORMAT", "Projector", "project",
    # witnesses
    "WitnessList", "init_witness", "read_witness_list", "witnesses_path",
]
