"""Evidence of equivocation (phsafe.tlog.evidence): two checkpoints signed by one log's key that no
append-only log can both sign, checked offline with the log's key alone; and the quorum rule of
witness policies (phsafe.tlog.policy)."""

from __future__ import annotations

import base64
import json

import pytest

from phsafe.errors import EquivocationError, ForkError, MalformedError, ProofError, QuorumPolicyError, SignatureError
from phsafe.tlog.client import SeenCheckpoints
from phsafe.tlog.evidence import (
    Evidence,
    evidence_from_proof,
    evidence_from_tree,
    format_evidence,
    parse_evidence,
    same_size_evidence,
    verify_evidence,
)
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.merkle import leaf_hash
from phsafe.tlog.policy import WitnessPolicy, check_quorum, smallest_quorum
from phsafe.tlog.state import MemorySeenLogs
from tests._tlog import entries, log_signer, log_verifier, signed_checkpoint, witness_verifier

LOG = TransparencyLog.of_entries(entries(20))
FORK = TransparencyLog.of_entries(entries(5) + entries(20, "forked")[5:])


def _checked(evidence: Evidence | None) -> str:
    assert evidence is not None
    return verify_evidence(parse_evidence(format_evidence(evidence)), log_verifier()).statement()


@pytest.mark.parametrize("smaller,larger", [(9, 9), (9, 14), (8, 14), (6, 20), (16, 17), (19, 20)])
def test_evidence_from_a_tree_verifies_with_the_log_key_alone(smaller: int, larger: int) -> None:
    """The larger tree's holder (a monitor with its entries) proves the smaller checkpoint is not
    its prefix, whatever the sizes (a power of two too: the prefix root is carried)."""
    a, b = signed_checkpoint(LOG, smaller), signed_checkpoint(FORK, larger)
    statement = _checked(evidence_from_tree(a, b, FORK))
    assert "signed two histories" in statement and f"{smaller} entries" in statement
    assert _checked(evidence_from_tree(b, a, FORK)) == statement  # either order
    assert evidence_from_tree(signed_checkpoint(FORK, smaller), b, FORK) is None  # a prefix: no conflict


def test_same_size_evidence_and_what_proves_nothing() -> None:
    a, b = signed_checkpoint(LOG, 12), signed_checkpoint(FORK, 12)
    assert "two trees of 12 entries" in _checked(same_size_evidence(a, b))
    assert same_size_evidence(a, a) is None and same_size_evidence(a, signed_checkpoint(FORK, 13)) is None
    # A witness's case: the refused request's own proof must lead to the larger root.
    proof = FORK.consistency_proof(12, 17)
    assert "a tree of 12 entries" in _checked(evidence_from_proof(a, signed_checkpoint(FORK, 17), proof))
    assert evidence_from_proof(a, signed_checkpoint(FORK, 17), proof[:-1] + [b"\0" * 32]) is None
    assert evidence_from_proof(signed_checkpoint(LOG, 8), signed_checkpoint(FORK, 17),
                               FORK.consistency_proof(8, 17)) is None  # 8 = 2^3: the proof leaves its root out


def test_evidence_that_is_changed_or_proves_nothing_is_refused() -> None:
    a, b = signed_checkpoint(LOG, 9), signed_checkpoint(FORK, 14)
    good = evidence_from_tree(a, b, FORK)
    assert good is not None
    document = json.loads(format_evidence(good))
    cases = {
        "another log's key": ({}, SignatureError, log_verifier(label="other")),
        "a prefix root that is the smaller's": ({"prefix_root": base64.b64encode(LOG.root(9)).decode()}, ProofError,
                                                 None),
        "a proof that does not lead to the larger root": ({"consistency_proof": document["consistency_proof"][:-1]},
                                                           ProofError, None),
        "no proof for two sizes": ({"prefix_root": None, "consistency_proof": None}, ProofError, None),
        "one checkpoint twice": ({"larger": document["smaller"]}, MalformedError, None),
        "one checkpoint twice, no proof": ({"larger": document["smaller"], "prefix_root": None,
                                            "consistency_proof": None}, ProofError, None),
        "a checkpoint re-signed by another key": ({"larger": signed_checkpoint(FORK, 14, signer=log_signer(
            label="other")).decode()}, SignatureError, None),
    }
    for case, (change, error, key) in cases.items():
        changed = {k: v for k, v in {**document, **change}.items() if v is not None}
        with pytest.raises(error):
            verify_evidence(parse_evidence(json.dumps(changed).encode()), key or log_verifier())
    for junk in (b"", b"{}", b'{"format": "phsafe-equivocation/1"}', b"x" * 70000,
                 json.dumps({**document, "extra": 1}).encode()):
        with pytest.raises(MalformedError):
            parse_evidence(junk)


def test_a_client_seeing_a_fork_holds_evidence_of_it() -> None:
    """From its own saved state (with leaf hashes): the same size, a larger tree not extending,
    a smaller tree not a prefix -- each an EquivocationError whose evidence verifies; a rollback
    (a prefix) is no equivocation."""
    def leaves(log: TransparencyLog, size: int) -> bytes:
        return b"".join(leaf_hash(e) for e in (entries(20) if log is LOG else entries(5) + entries(20, "forked")[5:])[:size])

    for size, expected in ((12, "different root hashes"), (16, "does not extend"), (9, "not a prefix")):
        seen = SeenCheckpoints(MemorySeenLogs(), log_verifier())
        seen.observe(signed_checkpoint(LOG, 12), LOG.consistency_proof, leaves(LOG, 12))
        with pytest.raises(EquivocationError, match=expected) as caught:
            seen.observe(signed_checkpoint(FORK, size), FORK.consistency_proof, leaves(FORK, size))
        assert "signed two histories" in _checked(caught.value.evidence)
    seen = SeenCheckpoints(MemorySeenLogs(), log_verifier())
    seen.observe(signed_checkpoint(LOG, 12), LOG.consistency_proof, leaves(LOG, 12))
    with pytest.raises(ForkError) as caught:
        seen.observe(signed_checkpoint(LOG, 7), LOG.consistency_proof)
    assert not isinstance(caught.value, EquivocationError)


# ---- the quorum rule -------------------------------------------------------------------------


@pytest.mark.parametrize("quorum,count", [(1, 1), (2, 2), (2, 3), (3, 4), (3, 5), (0, 0)])
def test_quorums_that_intersect_are_accepted(quorum: int, count: int) -> None:
    check_quorum(quorum, count)
    assert smallest_quorum(count) <= max(quorum, smallest_quorum(count))


@pytest.mark.parametrize("quorum,count,rule", [
    (1, 2, "a witness quorum of 1 of 2 is refused: any two quorums must share a witness (a quorum K > N/2 of the N "
           "witnesses), here at least 2 of 2"),
    (2, 4, "here at least 3 of 4"), (1, 3, "at least 2 of 3"), (2, 5, "at least 3 of 5"),
    (0, 2, "cannot be met"), (3, 2, "cannot be met"), (1, 0, "needs witnesses"),
])
def test_quorums_that_need_not_intersect_are_refused_naming_the_rule(quorum: int, count: int, rule: str) -> None:
    with pytest.raises(QuorumPolicyError) as caught:
        check_quorum(quorum, count)
    assert rule in str(caught.value) and "\n" not in str(caught.value)


def test_an_outsider_may_ask_for_more_never_fewer() -> None:
    keys = [witness_verifier(n) for n in (1, 2, 3)]
    policy = WitnessPolicy.of(keys, 2)
    assert policy.at_least(None) == 2 and policy.at_least(3) == 3
    for asked in (0, 1):
        with pytest.raises(QuorumPolicyError, match="below the log's policy .2 of 3.: an outsider may ask for more"):
            policy.at_least(asked)
    with pytest.raises(QuorumPolicyError, match="cannot be met"):
        policy.at_least(4)
    with pytest.raises(QuorumPolicyError, match="given twice"):
        WitnessPolicy.of([keys[0], keys[0]], 2)
    # A log bound before the rule with 1 of 2 is checked at the smallest intersecting quorum.
    old = WitnessPolicy(tuple(keys[:2]), 1)
    assert old.at_least(None) == 2
    with pytest.raises(QuorumPolicyError, match="raised to 2 by the rule"):
        old.at_least(1)
