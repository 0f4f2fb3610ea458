"""A transparency log: RFC 6962 Merkle trees, C2SP signed notes, checkpoints, witnesses, proofs.

The public privacy-loss log (issue 21) is built on this package: an append-only list of public
entries whose every state is summed up by a signed *checkpoint* (tree size and root hash), so
that anyone holding a checkpoint can check, with short proofs, that an entry is in the log
(inclusion) and that a later log still contains the earlier one unchanged (consistency).
Witnesses cosign checkpoints only after checking consistency with the last one they cosigned,
which prevents a log from showing two histories.

Shaped after Go's ``golang.org/x/mod/sumdb/tlog`` and ``sumdb/note``: the log logic works over
small interfaces (:class:`HashStore`, :class:`CheckpointStore`, :class:`Signer`,
:class:`Verifier`) and does no I/O; formats are encoder/decoder pairs; file I/O lives in
:mod:`.files`, :mod:`.publication` and :mod:`.fetch` only. Every refusal is a :class:`TlogError` (a
:class:`~phsafe.errors.PHSafeError`; the log's error classes are defined with the project's others in
:mod:`phsafe.errors` and exported here).

Modules and formats (each module's docstring states its format precisely):

- :mod:`.merkle` -- RFC 6962 hashing (leaf SHA-256(0x00||e), node SHA-256(0x01||l||r), empty
  tree SHA-256("")), the stored-hash numbering, tree heads, RFC 9162 inclusion and consistency
  proofs and their verification.
- :mod:`.log` -- :class:`TransparencyLog` over a :class:`HashStore`; :class:`MemoryHashStore`.
- :mod:`.note` -- C2SP signed notes; Ed25519 note signatures (type 0x01).
- :mod:`.keys` -- verifier keys ``<name>+<key ID hex>+<base64(type||key)>`` and signer keys
  ``PRIVATE+KEY+<name>+<key ID hex>+<base64(type||seed)>``.
- :mod:`.checkpoint` -- C2SP tlog-checkpoint; verification with a k-of-n witness quorum.
- :mod:`.cosignature` -- C2SP tlog-cosignature, Ed25519 ``cosignature/v1`` (type 0x04).
- :mod:`.state` -- the compare-and-swap :class:`CheckpointStore` of witnesses and clients.
- :mod:`.witness` -- :class:`Witness` (C2SP tlog-witness ``add-checkpoint`` rules, and the HTTP
  exchange written down without an HTTP library) and the log's side of it,
  :func:`request_cosignature`.
- :mod:`.witness_server` -- I/O: a witness as an HTTP service (Starlette on uvicorn), its state
  folder held by one process.
- :mod:`.client` -- :class:`SeenCheckpoints`: rollback and fork detection against the largest
  checkpoint seen.
- :mod:`.evidence` -- evidence of equivocation (``phsafe-equivocation/1``): two checkpoints signed
  by one log's key that no append-only log can both sign, verified with the log's key alone.
- :mod:`.policy` -- witness policies: K of N witnesses, accepted only when any two quorums share
  a witness (K > N/2); an outsider's quorum never below the log's.
- :mod:`.registration` -- a log's registration with its witnesses (``phsafe-log-registration/1``):
  its policy entry, naming the datasets it accounts, proven as its entry 0, and the retirements
  that let it claim a dataset another log held; what a witness keeps of them (which log holds
  each dataset).
- :mod:`.proof` -- C2SP tlog-proof files (``c2sp.org/tlog-proof@v1``).
- :mod:`.framing` -- the framing the proof file and the ``add-checkpoint`` request share (pure).
- :mod:`.layout` -- the published log's static files, and their verification (pure).
- :mod:`.files` -- I/O: the hash file, the checkpoint-state JSON files (a witness's, a
  client's), key files; every write through :mod:`phsafe.durable`.
- :mod:`.publication` -- I/O: :class:`LogDirectory` (writer, recovery) and the reader.
- :mod:`.fetch` -- I/O for outsiders: a published log's files and a witness's evidence, from a
  folder or with plain HTTP GETs.

Decisions:

- Signer keys are the one-line ``PRIVATE+KEY+...`` form (Go's note format; for witnesses with
  type byte 0x04), not PEM: it names the key and its signature type beside the secret, and the
  key ID is re-derived and checked on load. Key files are created 0600 and refused if others
  may read them.
- Publication is a simple documented layout (``checkpoint``, ``entries`` -- one entry per
  line -- and ``log.vkey``), not C2SP tlog-tiles: these logs hold at most thousands of entries,
  every reader of the log needs all of them, and one release is checked from its own
  ``.tlog-proof`` without the log. See :mod:`.layout` for the argument.
- A log's origin line is its key's name (the checkpoint spec's recommendation); verification
  checks it.
"""

from __future__ import annotations

from phsafe.tlog.checkpoint import (
    Checkpoint,
    VerifiedCheckpoint,
    format_checkpoint,
    parse_checkpoint,
    sign_checkpoint,
    verify_checkpoint,
)
from phsafe.tlog.client import ConsistencyProver, Observation, SeenCheckpoints
from phsafe.tlog.evidence import (
    Evidence,
    VerifiedEvidence,
    evidence_from_proof,
    evidence_from_tree,
    format_evidence,
    parse_evidence,
    same_size_evidence,
    verify_evidence,
)
from phsafe.tlog.policy import WitnessPolicy, check_quorum, smallest_quorum
from phsafe.tlog.cosignature import CosignatureSigner, CosignatureVerifier, cosignature_timestamp, cosigned_message
from phsafe.errors import (
    EquivocationError,
    ForkError,
    MalformedError,
    QuorumPolicyError,
    RollbackError,
    ProofError,
    SignatureError,
    StaleStateError,
    StoreError,
    TlogError,
    WitnessRefusal,
    WitnessUnreachable,
)
from phsafe.tlog.files import (
    FileCheckpointStore,
    FileClaimStore,
    FileHashStore,
    FileSeenLogs,
    read_signer_key,
    read_verifier_key,
    write_signer_key,
    write_verifier_key,
)
from phsafe.tlog.keys import format_signer_key, format_verifier_key, generate_keys, signer_from_key, verifier_from_key
from phsafe.tlog.layout import PublishedLog, verify_published_log
from phsafe.tlog.log import HashStore, MemoryHashStore, TransparencyLog
from phsafe.tlog.merkle import (
    EMPTY_ROOT,
    leaf_hash,
    node_hash,
    root_from_inclusion_proof,
    verify_consistency,
    verify_inclusion,
)
from phsafe.tlog.note import (
    ALG_COSIGNATURE_V1,
    ALG_ED25519,
    Ed25519Signer,
    Ed25519Verifier,
    Note,
    NoteSignature,
    Signer,
    Verifier,
    open_note,
    parse_note,
    sign_note,
)
from phsafe.tlog.proof import TlogProof, format_tlog_proof, make_tlog_proof, parse_tlog_proof, verify_tlog_proof
from phsafe.tlog.publication import LogDirectory, read_published_log
from phsafe.tlog.registration import (
    ClaimState,
    ClaimStore,
    Registration,
    Retirement,
    format_registration,
    make_registration,
    parse_registration,
    verify_registration,
)
from phsafe.tlog.state import CheckpointStore, MemoryCheckpointStore, MemorySeenLogs, SeenLog, SeenLogStore
from phsafe.tlog.witness import (
    AddCheckpointRequest,
    CosigningWitness,
    Witness,
    HttpAnswer,
    answer_add_checkpoint,
    format_add_checkpoint_request,
    parse_add_checkpoint_request,
    read_add_checkpoint_answer,
    request_cosignature,
    with_cosignatures,
)

__all__ = [
    # Merkle trees and the log
    "EMPTY_ROOT", "HashStore", "MemoryHashStore", "TransparencyLog", "leaf_hash", "node_hash",
    "root_from_inclusion_proof", "verify_consistency", "verify_inclusion",
    # signed notes and keys
    "ALG_COSIGNATURE_V1", "ALG_ED25519", "Ed25519Signer", "Ed25519Verifier", "Note", "NoteSignature",
    "Signer", "Verifier", "open_note", "parse_note", "sign_note",
    "format_signer_key", "format_verifier_key", "generate_keys", "signer_from_key", "verifier_from_key",
    # checkpoints and cosignatures
    "Checkpoint", "VerifiedCheckpoint", "format_checkpoint", "parse_checkpoint", "sign_checkpoint",
    "verify_checkpoint", "CosignatureSigner", "CosignatureVerifier", "cosignature_timestamp", "cosigned_message",
    # witnesses and clients
    "CheckpointStore", "MemoryCheckpointStore", "AddCheckpointRequest", "CosigningWitness", "Witness",
    "format_add_checkpoint_request", "parse_add_checkpoint_request", "request_cosignature", "with_cosignatures",
    "HttpAnswer", "answer_add_checkpoint", "read_add_checkpoint_answer",
    "ConsistencyProver", "SeenCheckpoints", "Observation", "SeenLog", "SeenLogStore", "MemorySeenLogs",
    # evidence of equivocation, witness policies
    "Evidence", "VerifiedEvidence", "format_evidence", "parse_evidence", "verify_evidence", "same_size_evidence",
    "evidence_from_tree", "evidence_from_proof", "WitnessPolicy", "check_quorum", "smallest_quorum",
    # registrations: which log holds each dataset at a witness
    "Registration", "Retirement", "format_registration", "parse_registration", "make_registration",
    "verify_registration", "ClaimState", "ClaimStore", "FileClaimStore",
    # proof files
    "TlogProof", "format_tlog_proof", "make_tlog_proof", "parse_tlog_proof", "verify_tlog_proof",
    # publication and files
    "PublishedLog", "verify_published_log", "LogDirectory", "read_published_log",
    "FileCheckpointStore", "FileHashStore", "FileSeenLogs", "read_signer_key", "read_verifier_key", "write_signer_key",
    "write_verifier_key",
    # errors
    "TlogError", "MalformedError", "SignatureError", "ProofError", "ForkError", "RollbackError", "WitnessRefusal",
    "WitnessUnreachable", "StoreError", "StaleStateError", "EquivocationError", "QuorumPolicyError",
]
