"""Signed notes, note keys, checkpoints and cosignatures: the C2SP formats byte for byte, the
published examples, round trips, and every refusal (another key, a changed body, malformed text,
too few witnesses)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from phsafe.errors import PHSafeError
from phsafe.tlog.checkpoint import Checkpoint, format_checkpoint, parse_checkpoint, sign_checkpoint, verify_checkpoint
from phsafe.tlog.cosignature import CosignatureSigner, CosignatureVerifier, cosignature_timestamp, cosigned_message
from phsafe.errors import MalformedError, ProofError, SignatureError
from phsafe.tlog.keys import format_signer_key, format_verifier_key, generate_keys, signer_from_key, verifier_from_key
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.merkle import EMPTY_ROOT
from phsafe.tlog.note import (
    ALG_COSIGNATURE_V1,
    MAX_SIGNATURES,
    Ed25519Verifier,
    NoteSignature,
    key_id,
    open_note,
    parse_note,
    sign_note,
)
from tests._tlog import NOW, ORIGIN, entries, log_signer, log_verifier, private_key, witness_signer, witness_verifier

# c2sp.org/signed-note, "Verifier keys / Example": this key verifies this note.
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = ("This is an example message.\n\n— example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONnc"
             "AlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n").encode()
# The example of Go's golang.org/x/mod/sumdb/note documentation: a signer key in the
# PRIVATE+KEY+ form, its verifier key, and the note it signs (Ed25519 is deterministic).
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_NOTE = (GO_TEXT + "\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotp"
           "RZb6KE6RyyBwJnAM=\n").encode()


# ---- signed notes ---------------------------------------------------------------------------

def test_the_spec_example_note_verifies_and_a_changed_one_does_not() -> None:
    verifier = verifier_from_key(SPEC_VKEY)
    assert (verifier.name, verifier.key_id) == ("example.com/foo", 0x530D903A)
    note = open_note(SPEC_NOTE, [verifier])
    assert note.text == "This is an example message.\n"
    assert [s.name for s in note.signatures] == ["example.com/foo"] and note.unverified == ()
    assert note.to_bytes() == SPEC_NOTE
    with pytest.raises(SignatureError, match="does not verify"):
        open_note(SPEC_NOTE.replace(b"example message", b"example massage"), [verifier])


def test_the_go_signer_key_signs_the_published_note_byte_for_byte() -> None:
    signer = signer_from_key(GO_SKEY)
    assert format_verifier_key(signer) == GO_VKEY
    assert sign_note(GO_TEXT, [signer]) == GO_NOTE
    assert open_note(GO_NOTE, [verifier_from_key(GO_VKEY)]).text == GO_TEXT
    assert format_signer_key("PeterNeumann", signer._private_key) == GO_SKEY  # noqa: SLF001
    assert GO_SKEY not in repr(signer) and "AYEKFALV" not in repr(signer)


def test_key_id_is_the_spec_hash() -> None:
    verifier = verifier_from_key(SPEC_VKEY)
    raw = base64.b64decode(SPEC_VKEY.split("+", 2)[2])
    assert raw[0] == 0x01
    expected = hashlib.sha256(b"example.com/foo\n\x01" + raw[1:]).digest()[:4]
    assert verifier.key_id.to_bytes(4, "big") == expected
    # The same key as a cosigner has another ID: the type byte is hashed in.
    assert key_id("example.com/foo", ALG_COSIGNATURE_V1, raw[1:]) != verifier.key_id


def test_round_trip_with_several_signers_and_blank_lines_in_the_text() -> None:
    a, b = log_signer("a.example/log", "a"), log_signer("b.example/log", "b")
    text = "first line\n\nafter a blank line\n"
    message = sign_note(text, [a, b])
    assert message.decode().count("\u2014 ") == 2
    both = open_note(message, [log_verifier("a.example/log", "a"), log_verifier("b.example/log", "b")])
    assert both.text == text and [s.name for s in both.signatures] == ["a.example/log", "b.example/log"]
    only_a = open_note(message, [log_verifier("a.example/log", "a")])
    assert [s.name for s in only_a.signatures] == ["a.example/log"]
    assert [s.name for s in only_a.unverified] == ["b.example/log"]  # unknown keys are ignored
    assert parse_note(message) == (text, both.signatures)


def test_a_signature_by_another_key_is_refused() -> None:
    message = sign_note("hello\n", [log_signer(label="someone else")])
    with pytest.raises(SignatureError, match="not signed by a trusted key"):
        open_note(message, [log_verifier()])


def test_a_forged_signature_under_a_trusted_name_and_id_is_refused() -> None:
    trusted = log_verifier()
    forged = NoteSignature(trusted.name, trusted.key_id, log_signer(label="impostor").sign(b"hello\n"))
    message = b"hello\n\n" + forged.line().encode()
    with pytest.raises(SignatureError, match="does not verify"):
        open_note(message, [trusted])
    # ... even when another trusted key signed validly too
    good = sign_note("hello\n", [log_signer("b.example", "b")], keep=[forged])
    with pytest.raises(SignatureError):
        open_note(good, [trusted, log_verifier("b.example", "b")])


def test_a_changed_body_is_refused() -> None:
    message = sign_note("size 10\n", [log_signer()])
    for changed in (message.replace(b"10", b"11"), b"extra line\n" + message, message.replace(b"size", b"Size")):
        with pytest.raises(SignatureError):
            open_note(changed, [log_verifier()])


@pytest.mark.parametrize("message, rule", [
    (b"no signatures\n", "no empty line"),
    (b"text\n\n", "no signature"),
    (b"text\n\n- name AAAAAAAA\n", "em dash"),
    (b"text\n\n\xe2\x80\x94 name AAAAAAAA", "end in a newline"),
    (b"text\n\n\xe2\x80\x94 name  AAAAAAAA\n", "not"),
    (b"text\n\n\xe2\x80\x94 na+me AAAAAAAA\n", "key name"),
    (b"text\n\n\xe2\x80\x94 name AAAAA\n", "base64"),
    (b"text\n\n\xe2\x80\x94 name AAAAAB==\n", "canonical"),
    (b"text\n\n\xe2\x80\x94 name AAAAAA==\n", "no signature after its key ID"),
    (b"te\txt\n\n\xe2\x80\x94 name AAAAAAAA\n", "control character"),
    (b"te\rxt\n\n\xe2\x80\x94 name AAAAAAAA\n", "control character"),
    (b"\xff\n\n\xe2\x80\x94 name AAAAAAAA\n", "UTF-8"),
    (b"text\n\n\xe2\x80\x94 name AAAAAAAA\nnot a signature\n", "em dash"),
])
def test_malformed_notes_are_refused(message: bytes, rule: str) -> None:
    with pytest.raises(MalformedError, match=rule):
        open_note(message, [log_verifier()])


def test_signature_count_is_bounded() -> None:
    signer = log_signer()
    many = [NoteSignature(f"k{i}.example", i, b"\x00" * 64) for i in range(MAX_SIGNATURES)]
    ok = sign_note("hello\n", [signer], keep=many[:15])  # at least 16 signatures are accepted
    assert len(open_note(ok, [log_verifier()]).unverified) == 15
    with pytest.raises(MalformedError, match="more than"):
        open_note(sign_note("hello\n", [signer], keep=many), [log_verifier()])


def test_verifier_and_signer_keys() -> None:
    skey, vkey = generate_keys("census.example/log")
    while vkey.split("+")[1].isdigit():  # the upper-case case below needs a hex letter in the key ID
        skey, vkey = generate_keys("census.example/log")
    assert skey.startswith("PRIVATE+KEY+census.example/log+") and vkey.startswith("census.example/log+")
    signer, verifier = signer_from_key(skey), verifier_from_key(vkey + "\n")
    assert open_note(sign_note("x\n", [signer]), [verifier]).text == "x\n"
    wskey, wvkey = generate_keys("witness.example", ALG_COSIGNATURE_V1)
    assert isinstance(signer_from_key(wskey), CosignatureSigner)
    assert isinstance(verifier_from_key(wvkey), CosignatureVerifier)
    name, kid, blob = vkey.split("+", 2)
    bad = [f"{name}+{int(kid, 16) ^ 1:08x}+{blob}",  # wrong key ID
           f"{name}+{kid.upper()}+{blob}",  # not lowercase hex
           f"{name}+{kid}+" + base64.b64encode(b"\x02" + base64.b64decode(blob)[1:]).decode(),  # unknown type
           f"{name}+{kid}+" + base64.b64encode(base64.b64decode(blob)[:-1]).decode(),  # short key
           f"{name}+{kid}", "", f"na me+{kid}+{blob}"]
    for text in bad:
        with pytest.raises(MalformedError):
            verifier_from_key(text)
    for text in ("census.example/log+00000000+AAAA", skey.replace("PRIVATE+KEY+", "PRIVATE+"),
                 skey[:-4] + ("AAA=" if not skey.endswith("AAA=") else "BBB=")):
        with pytest.raises(MalformedError) as caught:
            signer_from_key(text)
        # Never echoes the secret: the base64 after PRIVATE+KEY+<name>+<key id>+ (base64 may
        # itself hold "+", so it is found by position, not by the last "+").
        secret = skey.split("+", 4)[4]
        assert secret and secret not in str(caught.value) and secret[:12] not in str(caught.value)


# ---- checkpoints -------------------------------------------------------------------------------

def test_checkpoint_round_trip_and_spec_example() -> None:
    spec_text = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    parsed = parse_checkpoint(spec_text)
    assert (parsed.origin, parsed.size, len(parsed.root_hash), parsed.extensions) == \
        ("example.com/behind-the-sofa", 20852163, 32, ())
    assert format_checkpoint(parsed) == spec_text
    with_ext = Checkpoint(ORIGIN, 5, b"\x01" * 32, ("ext one", "ext two"))
    assert parse_checkpoint(with_ext.text()) == with_ext
    assert parse_checkpoint(Checkpoint(ORIGIN, 0, EMPTY_ROOT).text()).size == 0


ROOT = base64.b64encode(b"\x02" * 32).decode()


@pytest.mark.parametrize("text", [
    f"{ORIGIN}\n5\n{ROOT}",  # no final newline
    f"{ORIGIN}\n5\n",  # no root line
    f"\n5\n{ROOT}\n",  # empty origin
    f"{ORIGIN}\n05\n{ROOT}\n", f"{ORIGIN}\n+5\n{ROOT}\n", f"{ORIGIN}\n-5\n{ROOT}\n",
    f"{ORIGIN}\n 5\n{ROOT}\n", f"{ORIGIN}\n5.0\n{ROOT}\n", f"{ORIGIN}\n\n{ROOT}\n",
    f"{ORIGIN}\n{1 << 63}\n{ROOT}\n",  # beyond 63 bits
    f"{ORIGIN}\n5\n{ROOT[:-1]}\n",  # bad base64
    f"{ORIGIN}\n5\n{base64.b64encode(b'x' * 31).decode()}\n",  # 31-byte root
    f"{ORIGIN}\n5\n{ROOT}\n\nextension\n",  # empty extension line
    f"{ORIGIN}\n5\n{ROOT}\nbad\textension\n",
])
def test_malformed_checkpoints_are_refused(text: str) -> None:
    with pytest.raises(MalformedError):
        parse_checkpoint(text)


def test_verify_checkpoint() -> None:
    log = TransparencyLog.of_entries(entries(9))
    checkpoint = Checkpoint(ORIGIN, 9, log.root())
    message = sign_checkpoint(checkpoint, [log_signer()])
    verified = verify_checkpoint(message, log_verifier())
    assert verified.checkpoint == checkpoint and verified.cosigners == ()
    with pytest.raises(SignatureError, match="not signed by a trusted key"):  # another log key
        verify_checkpoint(sign_checkpoint(checkpoint, [log_signer(label="rogue")]), log_verifier())
    other_origin = sign_checkpoint(Checkpoint("other.example/log", 9, log.root()),
                                   [log_signer("other.example/log", "log")])
    with pytest.raises(SignatureError, match="for the log"):
        verify_checkpoint(other_origin, log_verifier("other.example/log", "log"), origin=ORIGIN)
    with pytest.raises(ProofError, match="empty tree"):
        verify_checkpoint(sign_checkpoint(Checkpoint(ORIGIN, 0, b"\x00" * 32), [log_signer()]), log_verifier())
    with pytest.raises(MalformedError):  # a signed note that is not a checkpoint
        verify_checkpoint(sign_note("hello\n", [log_signer()]), log_verifier())
    # A note cosigned by a witness but not signed by the log is not the log's checkpoint.
    only_witness = sign_note(checkpoint.text(), [witness_signer(1)])
    with pytest.raises(SignatureError, match="not signed by the log key"):
        verify_checkpoint(only_witness, log_verifier(), witnesses=[witness_verifier(1)])


# ---- cosignatures and k of n ----------------------------------------------------------------

def test_cosignature_bytes_follow_the_spec() -> None:
    text = Checkpoint(ORIGIN, 3, b"\x05" * 32).text()
    signer = witness_signer(1)
    message = sign_note(text, [log_signer(), signer])
    note = open_note(message, [witness_verifier(1)])
    (cosignature,) = note.signatures
    assert cosignature.key_id == int.from_bytes(
        hashlib.sha256(b"witness1.example\n\x04" + signer.public_key).digest()[:4], "big")
    assert len(cosignature.signature) == 72 and cosignature_timestamp(cosignature) == NOW
    # Checked independently of the package: Ed25519 over the spec's three-part message.
    signed = f"cosignature/v1\ntime {NOW}\n".encode() + text.encode()
    assert cosigned_message(text.encode(), NOW) == signed
    Ed25519PublicKey.from_public_bytes(signer.public_key).verify(cosignature.signature[8:], signed)
    # A cosignature is not an Ed25519 note signature of the same key: the type byte gives it
    # another key ID, so a type-0x01 verifier of that key sees only signatures it does not know.
    with pytest.raises(SignatureError, match="not signed by a trusted key"):
        open_note(message, [Ed25519Verifier("witness1.example", signer.public_key)])


def test_cosignature_refusals() -> None:
    text = Checkpoint(ORIGIN, 3, b"\x05" * 32).text().encode()
    verifier = witness_verifier(1)
    good = witness_signer(1).sign(text)
    assert verifier.verify(text, good)
    assert not verifier.verify(text.replace(b"\n3\n", b"\n4\n"), good)  # another checkpoint
    later = (NOW + 1).to_bytes(8, "big") + good[8:]
    assert not verifier.verify(text, later)  # the timestamp is signed
    assert not verifier.verify(text, (1 << 63).to_bytes(8, "big") + good[8:])
    assert not verifier.verify(text, good[:-1])
    assert not witness_verifier(2).verify(text, good)
    with pytest.raises(MalformedError, match="checkpoints only"):
        witness_signer(1).sign(b"not a checkpoint\n")
    with pytest.raises(ValueError, match="POSIX time"):
        CosignatureSigner("w.example", private_key("w"), lambda: 0).sign(text)


def test_k_of_n_witness_cosignatures() -> None:
    log = TransparencyLog.of_entries(entries(4))
    text = Checkpoint(ORIGIN, 4, log.root()).text()
    witnesses = [witness_verifier(i) for i in (1, 2, 3)]
    two = sign_note(text, [log_signer(), witness_signer(1), witness_signer(3),
                           CosignatureSigner("unknown.example", private_key("x"), lambda: NOW)])
    verified = verify_checkpoint(two, log_verifier(), witnesses=witnesses, quorum=2)
    assert verified.cosigners == ("witness1.example", "witness3.example")
    assert verify_checkpoint(two, log_verifier(), witnesses=witnesses, quorum=0).cosigners == verified.cosigners
    with pytest.raises(SignatureError, match="3 of 3 witness cosignatures are required and 2 verified"):
        verify_checkpoint(two, log_verifier(), witnesses=witnesses, quorum=3)
    # The same witness twice (two timestamps) counts once.
    twice = sign_note(text, [log_signer(), witness_signer(1), witness_signer(1, clock=NOW + 5)])
    with pytest.raises(SignatureError, match="1 verified"):
        verify_checkpoint(twice, log_verifier(), witnesses=witnesses, quorum=2)
    # One key listed under two names would count twice: refused as a policy.
    alias = CosignatureVerifier("alias.example", witness_signer(1).public_key)
    with pytest.raises(MalformedError, match="share a public key"):
        verify_checkpoint(two, log_verifier(), witnesses=[witnesses[0], alias], quorum=2)
    with pytest.raises(MalformedError, match="cannot be met"):
        verify_checkpoint(two, log_verifier(), witnesses=witnesses, quorum=4)
    with pytest.raises(MalformedError, match="its own"):
        verify_checkpoint(two, log_verifier(), witnesses=[log_verifier()], quorum=1)
    # A bad cosignature by a trusted witness refuses the note (evidence of tampering).
    forged = NoteSignature("witness2.example", witnesses[1].key_id, witness_signer(1).sign(text.encode()))
    tampered = sign_note(text, [log_signer()], keep=[forged])
    with pytest.raises(SignatureError, match="witness2.example"):
        verify_checkpoint(tampered, log_verifier(), witnesses=witnesses, quorum=1)


def test_errors_are_phsafe_errors() -> None:
    for error in (MalformedError("x", "y"), SignatureError("z"), ProofError("p")):
        assert isinstance(error, PHSafeError)
