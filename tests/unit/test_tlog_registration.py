"""A log's registration with a witness, and the witness's map of which log holds each dataset (issue 35).

* the registration format is an encoder/decoder pair; anything else is refused, named;
* a registration verifies with the log's key alone: its policy is the entry 0 of a checkpoint
  the key signed (another entry, another key, a broken proof are refused);
* a witness with a claim store cosigns a log only once it accepted its registration; it refuses
  a second log whose policy names a dataset another log holds there -- unless the registration
  carries that log's retirement of it, proven in the history of that log this witness cosigned,
  and naming this log (or no log) as the successor; a new log that declares no dataset is
  refused, one it cosigned before declarations is witnessed with no claim;
* the registration's checkpoint is the first one it cosigns of a new log, so the log's entry 0
  stays the policy it registered;
* its claims survive a kill at every write step: restarted, it holds the claim or reads the
  registration again, and never lets a second log take a dataset it held.

Everything in memory or in a temporary folder, with the real :class:`phsafe.tlog.Witness`; the
witness service over HTTP with real ledgers is in tests/system/test_dataset_claims.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phsafe import durable
from phsafe.errors import MalformedError, ProofError, SignatureError, WitnessRefusal
from phsafe.tlog import FileCheckpointStore, MemoryCheckpointStore, TransparencyLog, Witness, make_tlog_proof
from phsafe.tlog.files import FileClaimStore
from phsafe.tlog.registration import (
    ClaimStore,
    Registration,
    format_registration,
    make_registration,
    parse_registration,
    policy_datasets,
    retired_dataset,
    verify_registration,
)
from tests._tlog import log_signer, log_verifier, signed_checkpoint, witness_signer

A, B = "census.example/log-a", "census.example/log-b"


def policy(*datasets: str) -> bytes:
    body = {"type": "policy", "format": "phsafe-privacy-loss-log/1"}
    if datasets:
        body["datasets"] = sorted(datasets)
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def retired(dataset: str, successor: str | None = None) -> bytes:
    body: dict = {"type": "dataset-retired", "dataset": dataset, "reason": "moved"}
    if successor is not None:
        body["successor"] = {"origin": successor, "key_id": f"{log_verifier(successor, successor).key_id:08x}"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def checkpoint(origin: str, entries: list[bytes], size: int | None = None) -> bytes:
    return signed_checkpoint(TransparencyLog.of_entries(entries), size, signer=log_signer(origin, origin), origin=origin)


def registration(origin: str, entries: list[bytes], size: int = 1,
                 predecessors: tuple[tuple[bytes, list[bytes]], ...] = ()) -> bytes:
    return format_registration(make_registration(checkpoint(origin, entries, size), entries[:size], predecessors))


def new_witness(store=None, claims=None) -> Witness:  # noqa: ANN001
    return Witness(witness_signer(1), [log_verifier(A, A), log_verifier(B, B)], store or MemoryCheckpointStore(),
                   claims=claims if claims is not None else ClaimStore())


def cosign(witness: Witness, origin: str, entries: list[bytes], old: int) -> bytes:
    log = TransparencyLog.of_entries(entries)
    return witness.cosign(checkpoint(origin, entries), old, log.consistency_proof(old, log.size))


# --------------------------------------------------------------------------------------------
# The format
# --------------------------------------------------------------------------------------------


def test_the_format_is_an_encoder_decoder_pair() -> None:
    a = [policy("d"), retired("d", B)]
    data = registration(B, [policy("d")], predecessors=((checkpoint(A, a), a),))
    parsed = parse_registration(data)
    assert format_registration(parsed) == data and data.endswith(b"}\n")
    assert parsed.origin == B and parsed.policy == policy("d") and parsed.proof.index == 0
    (retirement,) = parsed.retirements
    assert retirement.origin == A and retirement.entry == a[1] and retirement.proof.index == 1
    assert policy_datasets(parsed.policy) == ("d",) and policy_datasets(policy()) is None
    assert retired_dataset(retirement.entry).successor_origin == B
    plain = registration(A, [policy("d", "e")])
    assert "retirements" not in json.loads(plain) and parse_registration(plain).retirements == ()


def _doc(**change: object) -> bytes:
    document = json.loads(registration(A, [policy("d")]))
    document.update(change)
    return json.dumps({k: v for k, v in document.items() if v is not None}).encode()


@pytest.mark.parametrize(("data", "rule"), [
    (b"", "not UTF-8 JSON"),
    (b"\xff", "not UTF-8 JSON"),
    (b"[]", "not a phsafe-log-registration/1 document"),
    (_doc(format="phsafe-log-registration/2"), "not a phsafe-log-registration/1 document"),
    (_doc(extra=1), "unknown fields extra"),
    (_doc(origin=None), "origin is missing"),
    (_doc(policy=""), "policy is missing"),
    (_doc(proof="c2sp.org/tlog-proof@v1\nindex 0\n"), "proof is not a tlog-proof"),
    (_doc(proof=json.loads(_doc())["proof"].replace("index 0", "index 1")), "not of the log's entry 0"),
    (_doc(retirements=[]), "retirements is not a non-empty list"),
    (_doc(retirements=[{"origin": A}]), "does not hold exactly origin, entry and proof"),
    (b"{" + b" " * (1 << 20) + b"}", "over 1048576 bytes"),
])
def test_junk_is_refused_naming_the_rule(data: bytes, rule: str) -> None:
    with pytest.raises(MalformedError) as refused:
        parse_registration(data)
    assert rule in str(refused.value)


def test_a_registration_verifies_with_the_logs_key_alone() -> None:
    data = parse_registration(registration(A, [policy("d"), b'{"type":"spend"}'], size=2))
    assert verify_registration(data, log_verifier(A, A)).datasets == ("d",)
    with pytest.raises(SignatureError):  # another key of another log
        verify_registration(data, log_verifier(B, B))
    with pytest.raises(SignatureError):  # another key under the same name
        verify_registration(data, log_verifier(A, "rogue"))
    swapped = Registration(A, policy("e"), data.proof)  # another policy than the checkpoint's entry 0
    with pytest.raises(ProofError):
        verify_registration(swapped, log_verifier(A, A))
    spends = [b'{"type":"spend"}'] * 2
    with pytest.raises(MalformedError, match="not its policy"):  # not made ...
        registration(A, spends)
    not_policy = Registration(A, spends[0], make_tlog_proof(TransparencyLog.of_entries(spends), 0, checkpoint(A, spends)))
    with pytest.raises(MalformedError, match="not its policy"):  # ... nor accepted
        verify_registration(not_policy, log_verifier(A, A))
    for bad in (b'{"datasets":["b","a"],"type":"policy"}', b'{"datasets":[],"type":"policy"}',
                b'{"datasets":["a","a"],"type":"policy"}', b'{"datasets":["no space"],"type":"policy"}'):
        with pytest.raises(MalformedError, match="sorted list of distinct dataset names"):
            policy_datasets(bad)


# --------------------------------------------------------------------------------------------
# The witness's claims
# --------------------------------------------------------------------------------------------


def test_a_second_log_for_a_dataset_gets_no_cosignature_until_the_first_retires_it() -> None:
    witness = new_witness()
    a = [policy("d")]
    with pytest.raises(WitnessRefusal) as unregistered:  # no registration yet: nothing cosigned
        witness.cosign(checkpoint(A, a), 0, [])
    assert unregistered.value.status == 403 and "no registration of the log" in str(unregistered.value)
    assert "holds the dataset(s) d here" in witness.register(registration(A, a))
    assert witness.claims().claims == {"d": A}
    cosign(witness, A, a + [b'{"type":"spend"}'], 1)  # the registration's checkpoint came first

    b = [policy("d")]
    with pytest.raises(WitnessRefusal) as second:
        witness.register(registration(B, b))
    line = str(second.value)
    print(f"a second log for a held dataset: {second.value.status}: {line}")
    assert second.value.status == 403 and f"which this witness holds under another log, {A}" in line
    assert "phsafe ledger retire-dataset" in line and len(line) < 480  # one line a 409-style reader keeps whole
    with pytest.raises(WitnessRefusal) as asked:  # its checkpoints: refused with the same line
        witness.cosign(checkpoint(B, b), 0, [])
    assert str(asked.value) == line
    assert witness.claims().claims == {"d": A} and B not in witness.claims().logs

    # A retires d, in favour of B; the witness cosigns A with the retirement in it
    a = a + [b'{"type":"spend"}', retired("d", B)]
    cosigned = cosign(witness, A, a, 2)
    accepted = witness.register(registration(B, b, predecessors=((cosigned, a),)))
    assert f"holds the dataset(s) d (taken over from {A}) here" in accepted
    assert f"holds no dataset here; it retired d (held by {B} since it retired it)" in witness.register(
        registration(A, a[:1]))
    state = witness.claims()
    assert state.claims == {"d": B} and state.retired == {"d": (A,)}
    cosign(witness, B, b + [b'{"type":"spend"}'], 1)


def test_a_retirement_must_be_in_the_history_the_witness_cosigned_and_name_this_log() -> None:
    witness = new_witness()
    a = [policy("d"), b'{"type":"spend"}']
    witness.register(registration(A, a[:1]))
    cosign(witness, A, a, 1)
    b = [policy("d")]
    # appended and signed by A's key, never shown to this witness
    later = a + [retired("d", B)]
    with pytest.raises(WitnessRefusal, match="this witness did not cosign"):
        witness.register(registration(B, b, predecessors=((checkpoint(A, later), later),)))
    # a fork of A (another entry 1) that retires d: A's key signed it; the witness never cosigned it
    fork = [policy("d"), b'{"type":"other"}', retired("d", B)]
    with pytest.raises(WitnessRefusal, match="this witness did not cosign"):
        witness.register(registration(B, b, predecessors=((checkpoint(A, fork), fork),)))
    # retired in favour of another log
    other = a + [retired("d", "census.example/log-c")]
    cosigned = cosign(witness, A, other, 2)
    with pytest.raises(WitnessRefusal, match="in favour of the log census.example/log-c"):
        witness.register(registration(B, b, predecessors=((cosigned, other),)))
    assert witness.claims().claims == {"d": A}


def test_a_log_that_declares_no_dataset() -> None:
    witness = new_witness()
    with pytest.raises(WitnessRefusal, match="declares no dataset: this witness witnesses a new log only once"):
        witness.register(registration(A, [policy()]))
    # one this witness cosigned before logs declared datasets (its state holds it): no claim
    store = MemoryCheckpointStore()
    old = Witness(witness_signer(1), [log_verifier(A, A)], store)  # the witness before registrations
    legacy = [policy(), b'{"type":"spend"}']
    cosigned = cosign(old, A, legacy, 0)
    upgraded = new_witness(store)
    with pytest.raises(WitnessRefusal, match="no registration of the log"):
        upgraded.cosign(checkpoint(A, legacy), 2, [])
    assert "declares no dataset" in upgraded.register(format_registration(make_registration(cosigned, legacy)))
    assert upgraded.claims().claims == {} and upgraded.claims().logs[A].datasets is None
    more = legacy + [b'{"type":"spend"}']
    cosign(upgraded, A, more, 2)


def test_a_registration_is_bound_to_the_history_the_witness_cosigns() -> None:
    witness = new_witness()
    a = [policy("d"), b'{"type":"spend"}']
    witness.register(registration(A, a, size=2))
    known = pytest.raises(WitnessRefusal)
    with known as stale:  # the registration's checkpoint is the first it cosigned: a request from 0 is stale
        witness.cosign(checkpoint(A, a), 0, [])
    assert (stale.value.status, stale.value.latest_size) == (409, 2)
    other = [policy("e"), b'{"type":"spend"}', b'{"type":"spend"}']  # another entry 0, from A's key
    with pytest.raises(WitnessRefusal) as fork:
        cosign(witness, A, other, 2)
    assert fork.value.status == 422
    # a log whose witness state moved on registers with a checkpoint it cosigned, or its latest
    store = MemoryCheckpointStore()
    old = Witness(witness_signer(1), [log_verifier(A, A)], store)
    grown = [policy("d"), b'{"type":"spend"}', b'{"type":"spend"}']
    first = cosign(old, A, grown[:2], 0)
    cosign(old, A, grown, 2)
    upgraded = new_witness(store)
    with pytest.raises(WitnessRefusal, match="that this witness did not cosign, and it has cosigned 3 entries"):
        upgraded.register(registration(A, grown, size=2))  # signed by A, never cosigned here
    assert "holds the dataset(s) d" in upgraded.register(format_registration(make_registration(first, grown[:2])))


def test_a_registration_of_a_log_it_does_not_witness_or_that_does_not_verify() -> None:
    witness = new_witness()
    c = "census.example/log-c"
    with pytest.raises(WitnessRefusal) as unknown:
        witness.register(registration(c, [policy("d")]))
    assert unknown.value.status == 404
    with pytest.raises(WitnessRefusal) as junk:
        witness.register(b"not json")
    assert junk.value.status == 400
    document = json.loads(registration(A, [policy("d")]))
    document["policy"] = policy("e").decode()
    with pytest.raises(WitnessRefusal, match="does not verify with its key"):
        witness.register(json.dumps(document).encode())
    with pytest.raises(WitnessRefusal, match="does not verify with its key"):
        witness.cosign(checkpoint(A, [policy("d")]), 0, [])  # the refusal is said to the log's requests


class Killed(BaseException):
    """The process dies here: nothing after this step runs."""


@pytest.mark.parametrize("kill_at", range(1, 9))
def test_the_claims_survive_a_kill_at_every_write_step(tmp_path: Path, kill_at: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering writes the log's first cosigned checkpoint, then the claims (each: write,
    fsync, rename, fsync the folder). Killed after any step, the witness restarted from its files
    reads the registration again and ends holding the claim -- never a claim without the
    checkpoint that fixes the log's entry 0 -- and still refuses a second log for the dataset."""
    checkpoints, claims = tmp_path / "checkpoints.json", tmp_path / "claims.json"
    a, b = [policy("d")], [policy("d")]
    steps = [0]
    real_os = durable.os

    class Steps:
        def __getattr__(self, name: str):  # noqa: ANN204
            value = getattr(real_os, name)
            if name not in ("write", "fsync", "replace"):
                return value

            def step(*args, **kw):  # noqa: ANN002, ANN003, ANN202
                result = value(*args, **kw)
                steps[0] += 1
                if steps[0] == kill_at:
                    raise Killed
                return result

            return step

    monkeypatch.setattr(durable, "os", Steps())
    try:
        new_witness(FileCheckpointStore(checkpoints), FileClaimStore(claims)).register(registration(A, a))
        finished = True
    except Killed:
        finished = False
    monkeypatch.setattr(durable, "os", real_os)
    assert finished == (kill_at > 8)
    on_disk = FileClaimStore(claims).load()
    if on_disk.claims:  # the claim is never durable before the checkpoint that binds entry 0
        assert FileCheckpointStore(checkpoints).load(A) is not None
    restarted = new_witness(FileCheckpointStore(checkpoints), FileClaimStore(claims))
    assert "holds the dataset(s) d" in restarted.register(registration(A, a))  # read again from its file
    assert restarted.claims().claims == {"d": A}
    with pytest.raises(WitnessRefusal, match="holds under another log"):
        restarted.register(registration(B, b))
    cosign(restarted, A, a + [b'{"type":"spend"}'], 1)
    print(f"killed after write step {kill_at}: claims on disk {on_disk.claims}, restarted holds d for A")
