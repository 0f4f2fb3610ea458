"""Witness cosigning (tlog-witness rules and its HTTP answers), a client's rollback and fork
detection, and tlog-proof files."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from phsafe.tlog.checkpoint import Checkpoint, sign_checkpoint, verify_checkpoint
from phsafe.tlog.client import SeenCheckpoints
from phsafe.errors import (
    ForkError, MalformedError, ProofError, RollbackError, SignatureError, StaleStateError, StoreError, WitnessRefusal,
)
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.note import open_note, parse_note
from phsafe.tlog.proof import TlogProof, format_tlog_proof, make_tlog_proof, parse_tlog_proof, verify_tlog_proof
from phsafe.tlog.merkle import leaf_hash
from phsafe.tlog.state import MemoryCheckpointStore, MemorySeenLogs
from phsafe.tlog.witness import (
    SIZE_CONTENT_TYPE,
    AddCheckpointRequest,
    Witness,
    answer_add_checkpoint,
    read_add_checkpoint_answer,
    format_add_checkpoint_request,
    parse_add_checkpoint_request,
    request_cosignature,
    with_cosignatures,
)
from phsafe.tlog.evidence import format_evidence, parse_evidence, verify_evidence
from tests._tlog import NOW, ORIGIN, entries, log_signer, log_verifier, signed_checkpoint, witness_signer, witness_verifier


def _witness(store: MemoryCheckpointStore | None = None, number: int = 1) -> Witness:
    return Witness(witness_signer(number), [log_verifier()], store or MemoryCheckpointStore())


def _request(log: TransparencyLog, old: int, new: int | None = None, **kw: Any) -> AddCheckpointRequest:
    new = log.size if new is None else new
    return AddCheckpointRequest(old, tuple(log.consistency_proof(old, new)), signed_checkpoint(log, new, **kw))


def _status(call) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(WitnessRefusal) as caught:
        call()
    return caught.value.status


# ---- the witness ---------------------------------------------------------------------------

def test_witness_cosigns_a_log_that_grows_and_remembers_it() -> None:
    log = TransparencyLog.of_entries(entries(3))
    witness = _witness()
    line = witness.add_checkpoint(_request(log, 0))
    cosigned = with_cosignatures(signed_checkpoint(log), line)
    verified = verify_checkpoint(cosigned, log_verifier(), witnesses=[witness_verifier(1)], quorum=1)
    assert verified.cosigners == ("witness1.example",)
    latest = witness.latest(ORIGIN)
    assert latest is not None and latest.checkpoint.size == 3 and latest.note.signed_by(log_verifier())
    log.append(entries(13, "b")[3:])
    for old, new in ((3, 5), (5, 13), (13, 13)):  # extends; the same size and root again is fine
        cosigned = witness.cosign(signed_checkpoint(log, new), old, log.consistency_proof(old, new))
        verify_checkpoint(cosigned, log_verifier(), witnesses=[witness_verifier(1)], quorum=1)
    assert witness.latest(ORIGIN).checkpoint.size == 13  # type: ignore[union-attr]
    assert witness.latest("unknown.example") is None


def test_witness_refuses_what_does_not_extend_what_it_cosigned() -> None:
    log = TransparencyLog.of_entries(entries(8))
    witness = _witness()
    witness.add_checkpoint(_request(log, 0, 6))
    fork = TransparencyLog.of_entries(entries(5) + entries(8, "forked")[5:])  # same first 5, then differs
    # Forked: the same size with another root (the spec's 409, naming the size it cosigned).
    refusal = pytest.raises(WitnessRefusal, witness.add_checkpoint, AddCheckpointRequest(6, (), signed_checkpoint(fork, 6)))
    assert refusal.value.status == 409 and refusal.value.latest_size == 6
    # Forked: a larger tree that does not contain the cosigned one (its own proof from 6 to 8).
    assert _status(lambda: witness.add_checkpoint(_request(fork, 6, 8))) == 422
    # Smaller than the last cosigned: never back.
    assert _status(lambda: witness.add_checkpoint(AddCheckpointRequest(6, (), signed_checkpoint(log, 4)))) == 400
    refusal = pytest.raises(WitnessRefusal, witness.add_checkpoint, _request(log, 4, 4))
    assert refusal.value.status == 409 and refusal.value.latest_size == 6
    # A bad consistency proof for an honest extension.
    good = _request(log, 6, 8)
    bad = AddCheckpointRequest(6, (good.consistency_proof[0][::-1],) + good.consistency_proof[1:], good.checkpoint)
    assert _status(lambda: witness.add_checkpoint(bad)) == 422
    assert _status(lambda: witness.add_checkpoint(AddCheckpointRequest(6, (), good.checkpoint))) == 422
    # The old size must be the one the witness cosigned last (first contact: 0).
    assert _status(lambda: witness.add_checkpoint(_request(log, 0, 8))) == 409
    assert witness.latest(ORIGIN).checkpoint.size == 6  # type: ignore[union-attr]
    # Old size 0 with a proof, for a witness that has seen nothing.
    fresh = _witness()
    assert _status(lambda: fresh.add_checkpoint(
        AddCheckpointRequest(0, (b"\x00" * 32,), signed_checkpoint(log)))) == 422
    # ... and the honest extension still passes.
    witness.add_checkpoint(good)
    assert witness.latest(ORIGIN).checkpoint.size == 8  # type: ignore[union-attr]


def test_witness_refuses_unknown_logs_other_keys_and_junk() -> None:
    log = TransparencyLog.of_entries(entries(4))
    witness = _witness()
    assert _status(lambda: witness.add_checkpoint(_request(log, 0, signer=log_signer(label="rogue")))) == 403
    other = sign_checkpoint(Checkpoint("other.example/log", 4, log.root()), [log_signer("other.example/log")])
    assert _status(lambda: witness.add_checkpoint(AddCheckpointRequest(0, (), other))) == 404
    assert _status(lambda: witness.add_checkpoint(AddCheckpointRequest(0, (), b"junk\n"))) == 400
    zero = sign_checkpoint(Checkpoint(ORIGIN, 0, b"\x01" * 32), [log_signer()])
    assert _status(lambda: witness.add_checkpoint(AddCheckpointRequest(0, (), zero))) == 422
    assert witness.latest(ORIGIN) is None  # nothing was cosigned


def test_witness_loses_a_race_without_rolling_back() -> None:
    log = TransparencyLog.of_entries(entries(4))

    class Racing(MemoryCheckpointStore):
        def replace(self, origin: str, expected: bytes | None, new: bytes) -> None:
            super().replace(origin, expected, signed_checkpoint(log, 4))  # someone else got there first
            raise StaleStateError("raced")

    refusal = pytest.raises(WitnessRefusal, _witness(Racing()).add_checkpoint, _request(log, 0, 2))
    assert refusal.value.status == 409 and refusal.value.latest_size == 4


def test_witness_refuses_a_tampered_state_and_a_log_key_changed_under_its_name() -> None:
    log = TransparencyLog.of_entries(entries(4))
    # A stored checkpoint whose log signature fails (the state was edited): the witness stops.
    note = bytearray(signed_checkpoint(log))
    note[-10] = ord("A") if note[-10] != ord("A") else ord("B")
    store = MemoryCheckpointStore()
    store.replace(ORIGIN, None, bytes(note))
    with pytest.raises(StoreError, match="does not verify"):
        _witness(store).add_checkpoint(_request(log, 4))
    assert answer_add_checkpoint(_witness(store), format_add_checkpoint_request(_request(log, 4))).status == 500
    # It cosigned the log under one key; the log's key file now holds another key of that name
    # (rewritten in place): refused, a new key is a new log.
    store = MemoryCheckpointStore()
    store.replace(ORIGIN, None, signed_checkpoint(log, signer=log_signer(label="rogue")))
    refusal = pytest.raises(WitnessRefusal, _witness(store).add_checkpoint, _request(log, 4)).value
    assert refusal.status == 403 and "under another key" in str(refusal) and "a new key is a new log" in str(refusal)


def test_add_checkpoint_request_round_trip_and_junk() -> None:
    log = TransparencyLog.of_entries(entries(11))
    request = _request(log, 5)
    body = format_add_checkpoint_request(request)
    assert body.startswith(b"old 5\n") and parse_add_checkpoint_request(body) == request
    assert parse_add_checkpoint_request(format_add_checkpoint_request(_request(log, 0))).consistency_proof == ()
    h = base64.b64encode(b"\x00" * 32)
    for junk in (b"old 05\n\n" + request.checkpoint, b"new 5\n\n" + request.checkpoint, b"old 5\n" + h + b"\n",
                 b"old 5\n" + h[:-2] + b"\n\n" + request.checkpoint, b"old 5\n" + (h + b"\n") * 64 + b"\n" + request.checkpoint,
                 b"old 9223372036854775808\n\n" + request.checkpoint, "old 5\n\u00e9\n\n".encode() + request.checkpoint,
                 b"old 5\n" + base64.b64encode(b"\x00" * 31) + b"\n\n" + request.checkpoint):
        with pytest.raises(MalformedError):
            parse_add_checkpoint_request(junk)


def test_a_copied_or_rolled_back_log_cannot_get_a_cosignature() -> None:
    """The fork the witness exists for: a copy of the log taken at size 6, while the original
    goes on and is cosigned at 10, can be cosigned neither behind nor past the original."""
    original = TransparencyLog.of_entries(entries(6))
    witness = _witness()
    assert request_cosignature(witness, original, signed_checkpoint(original)).count(b"\xe2\x80\x94") == 2
    copy = TransparencyLog.of_entries(entries(6))
    original.append(entries(10)[6:])
    request_cosignature(witness, original, signed_checkpoint(original), old_size=6)
    copy.append([b'{"run":"on the copy"}'])  # the copy starts a run: size 7
    with pytest.raises(WitnessRefusal, match="stale copy or was rolled back") as behind:
        request_cosignature(witness, copy, signed_checkpoint(copy), old_size=6)
    assert behind.value.status == 409 and behind.value.latest_size == 10
    copy.append(entries(12, "copy")[7:])  # ... and grows past the original: size 12
    with pytest.raises(WitnessRefusal, match="does not extend") as forked:
        request_cosignature(witness, copy, signed_checkpoint(copy))
    assert forked.value.status == 422
    original.append(entries(12, "original")[10:])  # the original goes on, from a stale hint too
    cosigned = request_cosignature(witness, original, signed_checkpoint(original), old_size=0)
    assert verify_checkpoint(cosigned, log_verifier(), witnesses=[witness_verifier(1)], quorum=1).checkpoint.size == 12


# ---- the exchange over HTTP (the spec's statuses, content types and bodies) ----------------

def test_the_http_answers_are_the_specs() -> None:
    log = TransparencyLog.of_entries(entries(6))
    witness = _witness()
    from phsafe.tlog.witness import format_add_checkpoint_request as body

    ok = answer_add_checkpoint(witness, body(_request(log, 0, 4)))
    assert ok.status == 200 and ok.body.startswith("— witness1.example ".encode()) and ok.body.endswith(b"\n")
    assert read_add_checkpoint_answer(ok.status, ok.content_type, ok.body) == ok.body
    stale = answer_add_checkpoint(witness, body(_request(log, 0, 6)))  # it cosigned 4: a stale old size
    assert (stale.status, stale.content_type, stale.body) == (409, SIZE_CONTENT_TYPE, b"4\n")
    with pytest.raises(WitnessRefusal) as refused:
        read_add_checkpoint_answer(stale.status, stale.content_type + "; charset=utf-8", stale.body)
    assert refused.value.status == 409 and refused.value.latest_size == 4
    good = _request(log, 4, 6)
    bad = AddCheckpointRequest(4, (good.consistency_proof[0][::-1],) + good.consistency_proof[1:], good.checkpoint)
    assert answer_add_checkpoint(witness, body(bad)).status == 422
    assert answer_add_checkpoint(witness, b"old 4\n").status == 400
    assert answer_add_checkpoint(witness, b"x" * (1 << 17)).status == 413
    assert answer_add_checkpoint(witness, body(good)).status == 200
    # A 409 without the size, or a 200 without signature lines, is not the protocol's.
    for status, kind, answer in ((409, "text/plain", b"4\n"), (409, SIZE_CONTENT_TYPE, b"four\n"), (200, "text/plain", b"ok")):
        with pytest.raises(WitnessRefusal) as refused:
            read_add_checkpoint_answer(status, kind, answer)
        assert refused.value.status == 502


def test_a_refused_request_signed_by_the_log_is_kept_with_the_evidence_it_gives() -> None:
    kept: list[tuple[str, bytes, Any]] = []
    log = TransparencyLog.of_entries(entries(6))
    store = MemoryCheckpointStore()
    witness = Witness(witness_signer(1), [log_verifier()], store, evidence=lambda *args: kept.append(args))
    witness.add_checkpoint(_request(log, 0, 6))
    cosigned = store.load(ORIGIN)
    fork = TransparencyLog.of_entries(entries(3) + entries(9, "forked")[3:])
    wrong_proof = AddCheckpointRequest(6, tuple(log.consistency_proof(2, 6)) + (b"x" * 32,), signed_checkpoint(fork, 9))
    for request in (AddCheckpointRequest(6, (), signed_checkpoint(fork, 6)), _request(fork, 6, 8), wrong_proof):
        with pytest.raises(WitnessRefusal):
            witness.add_checkpoint(request)
    assert [origin for origin, _, _ in kept] == [ORIGIN] * 3
    assert parse_add_checkpoint_request(kept[1][1]).checkpoint == signed_checkpoint(fork, 8)
    # The same size with another root, and a larger tree whose own proof ties it to another
    # prefix: both prove two histories, with the log's key alone. A proof that leads nowhere
    # proves nothing (anyone can send one): the request is kept, no evidence.
    same, not_prefix, nothing = (evidence for _, _, evidence in kept)
    assert nothing is None
    for evidence, sizes in ((same, (6, 6)), (not_prefix, (6, 8))):
        checked = verify_evidence(parse_evidence(format_evidence(evidence)), log_verifier())
        assert (checked.smaller.checkpoint.size, checked.larger.checkpoint.size) == sizes
        assert "signed two histories" in checked.statement()
        assert cosigned in (evidence.smaller, evidence.larger)  # with the witness's own cosignature
        assert evidence.found_by == "witness witness1.example"


# ---- the client's seen checkpoints ----------------------------------------------------------

def _leaves(log_entries: list[bytes]) -> bytes:
    return b"".join(leaf_hash(e) for e in log_entries)


def test_seen_checkpoints_keep_the_largest_and_refuse_rollbacks_and_forks() -> None:
    all_entries = entries(20)
    log = TransparencyLog.of_entries(all_entries)
    seen = SeenCheckpoints(MemorySeenLogs(), log_verifier())
    assert seen.latest() is None
    asked: list[tuple[int, int]] = []

    def prove(old: int, new: int) -> list[bytes]:
        asked.append((old, new))
        return log.consistency_proof(old, new)

    assert seen.observe(signed_checkpoint(log, 7), prove, _leaves(all_entries[:7])).previous is None
    assert seen.observe(signed_checkpoint(log, 15), prove, _leaves(all_entries[:15])).previous.checkpoint.size == 7
    seen.observe(signed_checkpoint(log, 15), prove)  # the same again
    assert seen.latest().checkpoint.size == 15  # type: ignore[union-attr]
    assert asked == [(7, 15)]
    # An older view of the same log: a rollback, with both sizes and roots; the kept one stays.
    with pytest.raises(RollbackError, match="rollback: the checkpoint of size 10 .* of size 15 .* a prefix") as caught:
        seen.observe(signed_checkpoint(log, 10), prove)
    assert caught.value.first == signed_checkpoint(log, 15) and caught.value.second == signed_checkpoint(log, 10)
    fork = TransparencyLog.of_entries(entries(12) + entries(20, "forked")[12:])
    with pytest.raises(ForkError, match="fork: two checkpoints of .* of size 15 have different root hashes") as caught:
        seen.observe(signed_checkpoint(fork, 15), fork.consistency_proof)
    assert not isinstance(caught.value, RollbackError)
    with pytest.raises(ForkError, match="does not extend"):
        seen.observe(signed_checkpoint(fork, 18), fork.consistency_proof)
    with pytest.raises(ForkError, match="fork: .* size 13 .* not a prefix") as caught:  # smaller, and not a prefix
        seen.observe(signed_checkpoint(fork, 13), fork.consistency_proof)
    assert not isinstance(caught.value, RollbackError)
    assert seen.latest().checkpoint.size == 15  # type: ignore[union-attr]
    with pytest.raises(SignatureError):
        seen.observe(signed_checkpoint(log, 20, signer=log_signer(label="rogue")), prove)


def test_seen_checkpoints_without_leaf_hashes_refuse_a_smaller_checkpoint_all_the_same() -> None:
    log = TransparencyLog.of_entries(entries(9))
    seen = SeenCheckpoints(MemorySeenLogs(), log_verifier())
    seen.observe(signed_checkpoint(log, 9), log.consistency_proof)  # (a state kept before leaf hashes were)
    with pytest.raises(RollbackError, match="rollback or fork"):
        seen.observe(signed_checkpoint(log, 4), log.consistency_proof)


def test_seen_checkpoints_can_require_witnesses() -> None:
    log = TransparencyLog.of_entries(entries(3))
    seen = SeenCheckpoints(MemorySeenLogs(), log_verifier(), witnesses=[witness_verifier(1)], quorum=1)
    with pytest.raises(SignatureError, match="1 of 1 witness"):
        seen.observe(signed_checkpoint(log), log.consistency_proof)
    cosigned = _witness().cosign(signed_checkpoint(log), 0, [])
    assert seen.observe(cosigned, log.consistency_proof).checkpoint.cosigners == ("witness1.example",)


# ---- tlog-proof files -----------------------------------------------------------------------

def test_proof_file_round_trip_and_verification() -> None:
    log = TransparencyLog.of_entries(entries(13))
    checkpoint = _witness().cosign(signed_checkpoint(log), 0, [])
    for index in (0, 6, 12):
        proof = make_tlog_proof(log, index, checkpoint)
        data = format_tlog_proof(proof)
        lines = data.decode().split("\n")
        assert lines[0] == "c2sp.org/tlog-proof@v1" and lines[1] == f"index {index}"
        assert len(lines[2:2 + len(proof.inclusion_proof)]) == len(proof.inclusion_proof)
        assert data.endswith(checkpoint)
        assert parse_tlog_proof(data) == proof
        verified = verify_tlog_proof(data, entries(13)[index], log_verifier(),
                                     witnesses=[witness_verifier(1)], quorum=1)
        assert verified.checkpoint.size == 13 and verified.cosigners == ("witness1.example",)
    with_extra = TlogProof(3, tuple(log.inclusion_proof(3)), checkpoint, extra=b"manifest")
    data = format_tlog_proof(with_extra)
    assert data.split(b"\n")[1] == b"extra " + base64.b64encode(b"manifest")
    assert parse_tlog_proof(data) == with_extra


def test_proof_file_tampering_is_refused() -> None:
    log = TransparencyLog.of_entries(entries(13))
    entry = entries(13)[6]
    proof = make_tlog_proof(log, 6, signed_checkpoint(log))
    with pytest.raises(ProofError, match="not entry 6"):  # a changed entry
        verify_tlog_proof(proof, entry.replace(b"6", b"7"), log_verifier())
    for index in (5, 7, 12, 13):  # a wrong index
        with pytest.raises(ProofError):
            verify_tlog_proof(TlogProof(index, proof.inclusion_proof, proof.checkpoint), entry, log_verifier())
    # The same tree signed by another key.
    rogue = TlogProof(6, proof.inclusion_proof, signed_checkpoint(log, signer=log_signer(label="rogue")))
    with pytest.raises(SignatureError):
        verify_tlog_proof(rogue, entry, log_verifier())
    # A checkpoint of a log where the entry is elsewhere, validly signed: the proof fails.
    other = TransparencyLog.of_entries([b"x"] + entries(13))
    moved = TlogProof(6, proof.inclusion_proof, signed_checkpoint(other))
    with pytest.raises(ProofError):
        verify_tlog_proof(moved, entry, log_verifier())
    # A hash changed, dropped or added.
    hashes = list(proof.inclusion_proof)
    for bad in ([hashes[0][::-1]] + hashes[1:], hashes[1:], hashes + [hashes[0]]):
        with pytest.raises(ProofError):
            verify_tlog_proof(TlogProof(6, tuple(bad), proof.checkpoint), entry, log_verifier())
    with pytest.raises(SignatureError, match="1 of 1 witness"):
        verify_tlog_proof(proof, entry, log_verifier(), witnesses=[witness_verifier(1)], quorum=1)
    with pytest.raises(ProofError, match="not a tree head of this log"):
        make_tlog_proof(log, 1, signed_checkpoint(other))


@pytest.mark.parametrize("mutate", [
    lambda d: d.replace(b"c2sp.org/tlog-proof@v1", b"c2sp.org/tlog-proof@v2"),
    lambda d: d.replace(b"index 6", b"index 06"),
    lambda d: d.replace(b"index 6", b"index -6"),
    lambda d: d.replace(b"index 6", b"index 9223372036854775808"),  # 2^63
    lambda d: d.replace(b"index 6\n", "index 6\n\u00e9\n".encode()),  # a header line not ASCII
    lambda d: d.replace(b"index 6\n", b""),
    lambda d: d.replace(b"index 6\n", b"index 6\nextra AAAA\n"),  # extra after index
    lambda d: d.replace(b"index 6\n", b"extra \nindex 6\n"),
    lambda d: d.replace(b"=\n", b"\n", 1),
    lambda d: d.split(b"\n\n")[0],
    lambda d: d.split(b"\n\n")[0] + b"\n\nnot a note\n",
])
def test_malformed_proof_files_are_refused(mutate) -> None:  # type: ignore[no-untyped-def]
    log = TransparencyLog.of_entries(entries(13))
    data = format_tlog_proof(make_tlog_proof(log, 6, signed_checkpoint(log)))
    with pytest.raises(MalformedError):
        parse_tlog_proof(mutate(data))


def test_a_witness_cosignature_merges_into_a_note_verifiable_by_either_party() -> None:
    log = TransparencyLog.of_entries(entries(2))
    cosigned = _witness().cosign(signed_checkpoint(log), 0, [])
    text, signatures = parse_note(cosigned)
    assert [s.name for s in signatures] == [ORIGIN, "witness1.example"]
    assert open_note(cosigned, [witness_verifier(1)]).unverified[0].name == ORIGIN
    assert int.from_bytes(signatures[1].signature[:8], "big") == NOW
