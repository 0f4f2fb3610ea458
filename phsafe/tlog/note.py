"""C2SP signed notes (c2sp.org/signed-note): text signed by one or more keys; Ed25519 keys.

Format. A signed note is UTF-8 with no control characters other than newline (U+000A)::

    <text: one or more lines, each ending in "\\n"; it may contain empty lines>
    <an empty line>
    — <key name> <base64(key ID || signature)>        (one or more signature lines)

Each signature line is the em dash U+2014, a space, the key name, a space, the standard base64
(RFC 4648 §4, with padding, canonical) of the 4-byte big-endian key ID followed by the
signature, and a newline. The text is everything before the *last* empty line, including its
final newline; it is what every signature signs, byte for byte. Key names are non-empty and
contain no Unicode space and no ``+``.

Key IDs. ``key ID = SHA-256(key name || 0x0A || signature type || public key)[:4]``, the type
being one byte: 0x01 for Ed25519 note signatures (RFC 8032 over the text, 64 bytes), 0x04 for
timestamped Ed25519 checkpoint cosignatures (:mod:`.cosignature`).

Verification (:func:`open_note`). A signature line whose (key name, key ID) is not one of the
given verifiers' is kept as *unverified* and otherwise ignored, as the spec requires. A
signature whose name and ID match a given key must verify, or the whole note is refused (the
spec's SHOULD, taken as MUST: a note carrying a forged signature of a key we trust is evidence of
tampering, not something to work around). A note with no valid signature by a given key is
refused. At most :data:`MAX_SIGNATURES` signature lines are read (the spec requires at least 16).

Verifier keys (``<name>+<key ID hex>+<base64(type || public key)>``) and signer keys are
encoded and decoded by :mod:`.keys`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from phsafe.errors import MalformedError, SignatureError

SIGNATURE_LINE_START = "\u2014 "
"""Every signature line starts with the em dash U+2014 and a space."""

ALG_ED25519 = 0x01
"""Signature type byte of Ed25519 note signatures."""

ALG_COSIGNATURE_V1 = 0x04
"""Signature type byte of timestamped Ed25519 checkpoint cosignatures (c2sp.org/tlog-cosignature)."""

MAX_SIGNATURES = 100
"""Most signature lines a note may carry (the spec's floor is 16): bounds a verifier's work."""


class Signer(Protocol):
    """Signs note texts with one key."""

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> int: ...

    def sign(self, text: bytes) -> bytes:
        """The signature of the note text (without the key ID)."""
        ...


class Verifier(Protocol):
    """Verifies one key's signatures over note texts."""

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> int: ...

    @property
    def public_key(self) -> bytes:
        """The public key material (32 bytes for Ed25519), to tell keys apart."""
        ...

    def verify(self, text: bytes, signature: bytes) -> bool:
        """Whether ``signature`` (without the key ID) is this key's over the note text."""
        ...


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: key name, key ID and the signature bytes that follow the ID."""

    name: str
    key_id: int
    signature: bytes

    def line(self) -> str:
        """The signature line, ending in a newline."""
        blob = self.key_id.to_bytes(4, "big") + self.signature
        return f"{SIGNATURE_LINE_START}{self.name} {base64.b64encode(blob).decode('ascii')}\n"


@dataclass(frozen=True)
class Note:
    """An opened note: its text, the signatures verified, and those by keys not given."""

    text: str
    signatures: tuple[NoteSignature, ...]
    unverified: tuple[NoteSignature, ...] = ()

    def signed_by(self, verifier: Verifier) -> bool:
        """Whether a verified signature of ``verifier``'s key is on the note."""
        return any(s.name == verifier.name and s.key_id == verifier.key_id for s in self.signatures)

    def to_bytes(self) -> bytes:
        """The note with all its signatures, verified ones first."""
        return format_note(self.text, self.signatures + self.unverified)


def key_id(name: str, alg: int, public_key: bytes) -> int:
    """SHA-256(name || 0x0A || alg || public key)[:4] as a big-endian integer."""
    check_key_name(name)
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


def check_key_name(name: str) -> None:
    """Refuse a key name that is empty, has a Unicode space, a ``+`` or a control character."""
    if not isinstance(name, str) or not name:
        raise MalformedError("key name", "it is empty")
    for ch in name:
        if ch.isspace() or ch == "+" or ord(ch) < 0x20:
            raise MalformedError("key name", f"{name!r} contains a space, a '+' or a control character")


def _check_characters(text: str, what: str) -> None:
    for ch in text:
        if ord(ch) < 0x20 and ch != "\n":
            raise MalformedError(what, f"it contains the control character U+{ord(ch):04X}")


def check_note_text(text: str) -> None:
    """Refuse a note text that is empty, lacks its final newline or has a control character."""
    if not text or not text.endswith("\n"):
        raise MalformedError("note text", "it must be one or more lines, each ending in a newline")
    _check_characters(text, "note text")


def decode_base64(value: str, what: str) -> bytes:
    """Strict standard base64: the alphabet, padding and canonical form of RFC 4648 §4."""
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise MalformedError(what, "it is not standard base64") from None
    if base64.b64encode(raw).decode("ascii") != value:
        raise MalformedError(what, "it is not canonical base64")
    return raw


def format_note(text: str, signatures: Iterable[NoteSignature]) -> bytes:
    """The signed note: text, an empty line, then one line per signature."""
    check_note_text(text)
    lines = [s.line() for s in signatures]
    if not lines:
        raise MalformedError("signed note", "it has no signature")
    return (text + "\n" + "".join(lines)).encode("utf-8")


def parse_signature_lines(block: str) -> tuple[NoteSignature, ...]:
    """Signature lines (each ending in a newline), as a note or a witness's answer carries them."""
    if not block.endswith("\n"):
        raise MalformedError("signed note", "its signature lines must end in a newline")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise MalformedError("signed note", f"it has more than {MAX_SIGNATURES} signature lines")
    signatures = []
    for number, line in enumerate(lines, 1):
        if not line.startswith(SIGNATURE_LINE_START):
            raise MalformedError("signed note", f"signature line {number} does not start with an em dash and a space")
        parts = line[len(SIGNATURE_LINE_START):].split(" ")
        if len(parts) != 2:
            raise MalformedError("signed note", f"signature line {number} is not '— <key name> <base64>'")
        name, blob = parts
        check_key_name(name)
        raw = decode_base64(blob, f"signature line {number}")
        if len(raw) < 5:
            raise MalformedError("signed note", f"signature line {number} holds no signature after its key ID")
        signatures.append(NoteSignature(name, int.from_bytes(raw[:4], "big"), raw[4:]))
    return tuple(signatures)


def parse_note(message: bytes) -> tuple[str, tuple[NoteSignature, ...]]:
    """Split a signed note into its text and its (unverified) signatures; checks only the format."""
    try:
        decoded = bytes(message).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedError("signed note", "it is not UTF-8") from None
    _check_characters(decoded, "signed note")
    separator = decoded.rfind("\n\n")
    if separator < 0:
        raise MalformedError("signed note", "it has no empty line before its signatures")
    text, block = decoded[:separator + 1], decoded[separator + 2:]
    check_note_text(text)
    if not block:
        raise MalformedError("signed note", "it has no signature line")
    return text, parse_signature_lines(block)


def sign_note(text: str, signers: Sequence[Signer], *, keep: Sequence[NoteSignature] = ()) -> bytes:
    """Sign ``text`` with each signer; signatures in ``keep`` (e.g. the log's) come first."""
    check_note_text(text)
    new = []
    for signer in signers:
        check_key_name(signer.name)
        new.append(NoteSignature(signer.name, signer.key_id, signer.sign(text.encode("utf-8"))))
    return format_note(text, [*keep, *new])


def open_note(message: bytes, verifiers: Iterable[Verifier]) -> Note:
    """Verify a signed note against the given keys (see the module docstring for the rules)."""
    known: dict[tuple[str, int], Verifier] = {}
    for verifier in verifiers:
        slot = (verifier.name, verifier.key_id)
        if slot in known and known[slot].public_key != verifier.public_key:
            raise MalformedError("verifier keys", f"two keys named {verifier.name} share the key ID {verifier.key_id:08x}")
        known[slot] = verifier
    text, signatures = parse_note(message)
    body = text.encode("utf-8")
    verified: list[NoteSignature] = []
    unverified: list[NoteSignature] = []
    for signature in signatures:
        key = known.get((signature.name, signature.key_id))
        if key is None:
            unverified.append(signature)
        elif key.verify(body, signature.signature):
            verified.append(signature)
        else:
            raise SignatureError(f"the signature by {signature.name} (key {signature.key_id:08x}) "
                                 "does not verify over the note's text")
    if not verified:
        others = ", ".join(sorted({f"{s.name} ({s.key_id:08x})" for s in unverified}))
        trusted = ", ".join(sorted(f"{name} ({kid:08x})" for name, kid in known)) or "none given"
        raise SignatureError(f"the note is not signed by a trusted key (trusted: {trusted}; signed by: {others})")
    return Note(text, tuple(verified), tuple(unverified))


# --------------------------------------------------------------------------------------------
# Ed25519 keys: the note signatures (type 0x01) here, cosignatures (type 0x04) in .cosignature
# --------------------------------------------------------------------------------------------


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    """The 32-byte RFC 8032 encoding of an Ed25519 public key."""
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


class Ed25519NoteKey:
    """What every Ed25519 note key is: a name, a signature type, a 32-byte public key and the
    key ID they give. The signature types differ only in the message signed and the bytes
    around the signature (:meth:`Ed25519Verifier.signed_message`); the rest is here once."""

    alg: int = ALG_ED25519

    def __init__(self, name: str, public_key: bytes) -> None:
        if len(public_key) != 32:
            raise MalformedError("Ed25519 public key", "it is not 32 bytes")
        self.key_id = key_id(name, self.alg, public_key)  # checks the name
        self.name = name
        self.public_key = bytes(public_key)

    def __repr__(self) -> str:  # never the private key
        return f"{type(self).__name__}({self.name!r}, key {self.key_id:08x})"


class Ed25519Signer(Ed25519NoteKey):
    """Signs notes with an Ed25519 key under ``name`` (signature type 0x01)."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        super().__init__(name, raw_public_key(private_key.public_key()))
        self._private_key = private_key

    def sign(self, text: bytes) -> bytes:
        return self._private_key.sign(text)


class Ed25519Verifier(Ed25519NoteKey):
    """Verifies Ed25519 note signatures (type 0x01) of the key ``public_key`` named ``name``."""

    signature_size = 64

    def __init__(self, name: str, public_key: bytes) -> None:
        super().__init__(name, public_key)
        self._key = Ed25519PublicKey.from_public_bytes(self.public_key)

    def signed_message(self, text: bytes, signature: bytes) -> tuple[bytes, bytes] | None:
        """(the message the Ed25519 signature covers, that signature), or None when the
        signature bytes cannot be one of this type's. Here: the note text itself."""
        return text, signature

    def verify(self, text: bytes, signature: bytes) -> bool:
        if len(signature) != self.signature_size:
            return False
        signed = self.signed_message(text, signature)
        if signed is None:
            return False
        message, ed25519_signature = signed
        try:
            self._key.verify(ed25519_signature, message)
        except InvalidSignature:
            return False
        return True
