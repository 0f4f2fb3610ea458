"""Evidence of equivocation: two checkpoints signed by one log's key that no append-only log can both sign (pure).

A log *equivocates* when its key signs two histories: two checkpoints of one origin such that
neither tree is a prefix of the other. Evidence of it must convince anyone holding only the
log's verifier key, offline, without trusting whoever found it (a witness, a monitor, an
outsider): so it holds the two signed checkpoints and, when their sizes differ, what ties the
larger one to a prefix other than the smaller one. Two forms, both checked by
:func:`verify_evidence`:

- **same size**: two checkpoints of size n with different root hashes. Nothing else is needed.
- **not a prefix**: checkpoints of sizes m < n, and a consistency proof from m to n that leads
  to the larger checkpoint's root from a prefix root X (the root of the larger tree's first m
  entries), with X different from the smaller checkpoint's root. Since the proof reproduces the
  signed root of size n, X is that tree's true prefix (a SHA-256 collision aside), whoever
  computed the proof: the key signed a tree of m entries that is not the first m entries of the
  tree of n it also signed.

A refused request whose proof does not lead to the larger root proves nothing (anyone can send
a wrong proof with a genuine checkpoint); neither does a smaller checkpoint that is a prefix of
a larger one (a rollback: an older view, not a second history). Those are not evidence.

Format (``phsafe-equivocation/1``): canonical JSON, UTF-8, sorted keys, one newline at the end::

    {"format": "phsafe-equivocation/1",
     "origin": "<the log's origin>",
     "smaller": "<signed checkpoint note, verbatim (with any cosignatures)>",
     "larger": "<signed checkpoint note of a size >= the smaller's, verbatim>",
     "prefix_root": "<base64>",              (sizes differ: X)
     "consistency_proof": ["<base64>", ...], (sizes differ: the proof from m to n)
     "found_by": "<free text>"}              (optional; who found it -- not authenticated)

:func:`format_evidence` and :func:`parse_evidence` are the encoder/decoder pair; the makers
(:func:`same_size_evidence`, :func:`evidence_from_tree`, :func:`evidence_from_proof`) return
None when what they are given proves nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from phsafe.errors import MalformedError, ProofError
from phsafe.tlog.checkpoint import VerifiedCheckpoint, parse_checkpoint, verify_checkpoint
from phsafe.tlog.framing import MAX_PROOF_HASHES
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.merkle import HASH_SIZE, roots_from_consistency_proof, verify_consistency
from phsafe.tlog.note import Verifier, parse_note

EVIDENCE_FORMAT = "phsafe-equivocation/1"
EVIDENCE_SUFFIX = ".equivocation.json"
MAX_EVIDENCE_BYTES = 1 << 16


@dataclass(frozen=True)
class Evidence:
    """Two signed checkpoints of one log and, when their sizes differ, what ties the larger to
    another prefix (see the module docstring)."""

    origin: str
    smaller: bytes
    larger: bytes
    prefix_root: bytes | None = None
    consistency_proof: tuple[bytes, ...] = ()
    found_by: str = ""

    def name(self) -> str:
        """A file name for it, the same for the same two checkpoints (whoever found them)."""
        digest = hashlib.sha256(_checkpoint_text(self.smaller) + b"\0" + _checkpoint_text(self.larger)).hexdigest()
        origin = hashlib.sha256(self.origin.encode("utf-8")).hexdigest()[:12]
        return f"{origin}-{digest[:20]}{EVIDENCE_SUFFIX}"


def _checkpoint_text(note: bytes) -> bytes:
    return parse_note(note)[0].encode("utf-8")


def format_evidence(evidence: Evidence) -> bytes:
    """The evidence file's bytes."""
    document: dict[str, object] = {"format": EVIDENCE_FORMAT, "origin": evidence.origin,
                                   "smaller": evidence.smaller.decode("utf-8"),
                                   "larger": evidence.larger.decode("utf-8")}
    if evidence.prefix_root is not None:
        document["prefix_root"] = base64.b64encode(evidence.prefix_root).decode("ascii")
        document["consistency_proof"] = [base64.b64encode(h).decode("ascii") for h in evidence.consistency_proof]
    if evidence.found_by:
        document["found_by"] = evidence.found_by
    return (json.dumps(document, sort_keys=True, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def _hash(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedError("equivocation evidence", f"{what} is not base64 text")
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        raise MalformedError("equivocation evidence", f"{what} is not base64") from None
    if len(raw) != HASH_SIZE:
        raise MalformedError("equivocation evidence", f"{what} is not a {HASH_SIZE}-byte hash")
    return raw


def parse_evidence(data: bytes) -> Evidence:
    """The evidence a file holds; MalformedError on anything but the format."""
    what = "equivocation evidence"
    if len(data) > MAX_EVIDENCE_BYTES:
        raise MalformedError(what, f"it is over {MAX_EVIDENCE_BYTES} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise MalformedError(what, "it is not UTF-8 JSON") from None
    if not isinstance(document, dict) or document.get("format") != EVIDENCE_FORMAT:
        raise MalformedError(what, f"it is not a {EVIDENCE_FORMAT} document")
    allowed = {"format", "origin", "smaller", "larger", "prefix_root", "consistency_proof", "found_by"}
    if set(document) - allowed:
        raise MalformedError(what, f"unknown fields {', '.join(sorted(set(document) - allowed))}")
    for name in ("origin", "smaller", "larger"):
        if not isinstance(document.get(name), str) or not document[name]:
            raise MalformedError(what, f"{name} is missing or not text")
    if ("prefix_root" in document) != ("consistency_proof" in document):
        raise MalformedError(what, "a prefix root comes with its consistency proof, and only with it")
    prefix, proof = None, ()
    if "prefix_root" in document:
        items = document["consistency_proof"]
        if not isinstance(items, list) or len(items) > MAX_PROOF_HASHES:
            raise MalformedError(what, f"the consistency proof is not a list of at most {MAX_PROOF_HASHES} hashes")
        prefix = _hash(document["prefix_root"], "the prefix root")
        proof = tuple(_hash(h, f"consistency proof hash {i}") for i, h in enumerate(items))
    found_by = document.get("found_by", "")
    if not isinstance(found_by, str):
        raise MalformedError(what, "found_by is not text")
    return Evidence(document["origin"], document["smaller"].encode("utf-8"), document["larger"].encode("utf-8"),
                    prefix, proof, found_by)


@dataclass(frozen=True)
class VerifiedEvidence:
    """Evidence that verified: the two checkpoints, and what it proves in one sentence."""

    evidence: Evidence
    smaller: VerifiedCheckpoint
    larger: VerifiedCheckpoint

    def statement(self) -> str:
        a, b = self.smaller.checkpoint, self.larger.checkpoint
        ra, rb = (base64.b64encode(c.root_hash).decode("ascii") for c in (a, b))
        if a.size == b.size:
            return (f"the log key of {a.origin} signed two histories: two trees of {a.size} entries with different "
                    f"root hashes ({ra} and {rb})")
        assert self.evidence.prefix_root is not None
        x = base64.b64encode(self.evidence.prefix_root).decode("ascii")
        return (f"the log key of {a.origin} signed two histories: a tree of {a.size} entries (root {ra}) and a tree "
                f"of {b.size} entries whose first {a.size} have another root ({x}, by a consistency proof to its "
                f"root {rb})")


def verify_evidence(evidence: Evidence, log_verifier: Verifier) -> VerifiedEvidence:
    """Check that ``evidence`` proves the log of ``log_verifier`` signed two histories.

    Raises:
        SignatureError: A checkpoint is not signed by the log key, or is another log's.
        MalformedError: Not checkpoints; the smaller is larger than the larger.
        ProofError: The two checkpoints do not conflict as the evidence says (nothing is proved).
    """
    smaller = verify_checkpoint(evidence.smaller, log_verifier, origin=evidence.origin)
    larger = verify_checkpoint(evidence.larger, log_verifier, origin=evidence.origin)
    a, b = smaller.checkpoint, larger.checkpoint
    if a.size > b.size:
        raise MalformedError("equivocation evidence", "its smaller checkpoint is the larger one")
    if a.size == b.size:
        if evidence.prefix_root is not None:
            raise MalformedError("equivocation evidence", "two checkpoints of one size need no consistency proof")
        if a.root_hash == b.root_hash:
            raise ProofError("the two checkpoints are of one tree: nothing conflicts")
        return VerifiedEvidence(evidence, smaller, larger)
    if evidence.prefix_root is None:
        raise ProofError(f"checkpoints of {a.size} and {b.size} entries alone prove nothing: a consistency proof to "
                         "the larger one, from another prefix root than the smaller one's, is needed")
    if evidence.prefix_root == a.root_hash:
        raise ProofError(f"the larger tree's first {a.size} entries are the smaller tree: it extends it (no conflict)")
    try:
        verify_consistency(a.size, evidence.prefix_root, b.size, b.root_hash, evidence.consistency_proof)
    except ProofError as exc:
        raise ProofError(f"the consistency proof does not tie the larger checkpoint to the prefix root given ({exc})") \
            from None
    return VerifiedEvidence(evidence, smaller, larger)


# --------------------------------------------------------------------------------------------
# Making evidence (None: what is given proves nothing)
# --------------------------------------------------------------------------------------------


def _origin_size_root(note: bytes) -> tuple[str, int, bytes]:
    checkpoint = parse_checkpoint(parse_note(note)[0])
    return checkpoint.origin, checkpoint.size, checkpoint.root_hash


def same_size_evidence(first: bytes, second: bytes, *, found_by: str = "") -> Evidence | None:
    """Two signed checkpoints of one size with different roots (ordered by their bytes)."""
    (oa, sa, ra), (ob, sb, rb) = _origin_size_root(first), _origin_size_root(second)
    if oa != ob or sa != sb or ra == rb:
        return None
    one, two = sorted((bytes(first), bytes(second)), key=_checkpoint_text)
    return Evidence(oa, one, two, found_by=found_by)


def evidence_from_tree(smaller: bytes, larger: bytes, tree: TransparencyLog, *, found_by: str = "") -> Evidence | None:
    """``smaller`` and ``larger`` (signed checkpoints of one log, any order) with ``tree``
    holding the larger checkpoint's entries (e.g. a monitor's copy): evidence if the smaller is
    not the larger's prefix."""
    (oa, sa, ra), (ob, sb, rb) = _origin_size_root(smaller), _origin_size_root(larger)
    if sa > sb:
        (oa, sa, ra), (ob, sb, rb), smaller, larger = (ob, sb, rb), (oa, sa, ra), larger, smaller
    if sa == sb:
        return same_size_evidence(smaller, larger, found_by=found_by)
    if oa != ob or sa == 0 or tree.size < sb or tree.root(sb) != rb:
        return None
    prefix = tree.root(sa)
    if prefix == ra:
        return None
    return Evidence(oa, bytes(smaller), bytes(larger), prefix, tuple(tree.consistency_proof(sa, sb)), found_by)


def evidence_from_proof(smaller: bytes, larger: bytes, proof: Sequence[bytes], *, found_by: str = "") -> Evidence | None:
    """A witness's case: it cosigned ``smaller`` and is asked to cosign ``larger`` with a
    consistency ``proof`` that does not verify. Evidence if the proof leads to the larger
    root from another prefix root (it must then hold that root: the smaller size is not a power
    of two); None if it leads nowhere (a wrong proof proves nothing)."""
    (oa, sa, ra), (ob, sb, rb) = _origin_size_root(smaller), _origin_size_root(larger)
    if oa != ob or not 0 < sa < sb or sa & (sa - 1) == 0:
        return None
    try:
        prefix, root = roots_from_consistency_proof(sa, sb, proof)
    except ProofError:
        return None
    if root != rb or prefix == ra:
        return None
    return Evidence(oa, bytes(smaller), bytes(larger), prefix, tuple(proof), found_by)


def conflicting(evidence: Evidence) -> tuple[int, int]:
    """The sizes of the two checkpoints (for messages)."""
    return _origin_size_root(evidence.smaller)[1], _origin_size_root(evidence.larger)[1]

