"""The framing the proof file (c2sp.org/tlog-proof) and the witness's ``add-checkpoint`` request
(c2sp.org/tlog-witness) share: ASCII header lines, an empty line, then a signed checkpoint
verbatim; among the header lines, a list of Merkle hashes, one base64 line each, and decimal
numbers without leading zeros. Parsing only, no I/O; every deviation is a
:class:`~phsafe.errors.MalformedError` naming the body.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from phsafe.errors import MalformedError
from phsafe.tlog.merkle import HASH_SIZE, MAX_TREE_SIZE
from phsafe.tlog.note import decode_base64

MAX_PROOF_HASHES = 63
"""At most 63 hashes in an inclusion or consistency proof: a tree has fewer than 2^63 entries."""

DECIMAL = re.compile(r"0|[1-9][0-9]*")


def split_body(data: bytes, what: str) -> tuple[list[str], bytes]:
    """The header lines and the checkpoint of a body: header, an empty line, checkpoint."""
    head, separator, checkpoint = bytes(data).partition(b"\n\n")
    if not separator or not checkpoint:
        raise MalformedError(what, "no empty line followed by a checkpoint")
    try:
        return head.decode("ascii").split("\n"), checkpoint
    except UnicodeDecodeError:
        raise MalformedError(what, "its header is not ASCII") from None


def parse_tree_size(text: str, what: str, name: str) -> int:
    """A size or index of a tree: decimal, no leading zeros, below 2^63."""
    if not DECIMAL.fullmatch(text) or int(text) > MAX_TREE_SIZE:
        raise MalformedError(what, f"the {name} is not a decimal number below 2^63 without leading zeros")
    return int(text)


def parse_hash_lines(lines: Sequence[str], what: str, name: str) -> tuple[bytes, ...]:
    """A proof's hashes, one standard base64 line each, at most :data:`MAX_PROOF_HASHES`."""
    if len(lines) > MAX_PROOF_HASHES:
        raise MalformedError(what, f"more than {MAX_PROOF_HASHES} {name} lines")
    hashes = []
    for line in lines:
        h = decode_base64(line, f"{what}: {name} line")
        if len(h) != HASH_SIZE:
            raise MalformedError(what, f"a {name} line is not a 32-byte hash")
        hashes.append(h)
    return tuple(hashes)
