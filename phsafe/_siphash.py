"""SipHash-2-4 of 64-bit words, vectorized over numpy arrays.

SipHash is a keyed pseudorandom function (Aumasson and Bernstein, 2012). Truncation uses it to
order the records of a household by a keyed hash of their content: the order depends only on the
record and a fresh per-run key, never on file position or on an attribute.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_U64 = np.uint64
_C0, _C1, _C2, _C3 = (
    _U64(0x736F6D6570736575),
    _U64(0x646F72616E646F6D),
    _U64(0x6C7967656E657261),
    _U64(0x7465646279746573),
)


def _rotl(x: npt.NDArray[np.uint64], b: int) -> npt.NDArray[np.uint64]:
    return (x << _U64(b)) | (x >> _U64(64 - b))


def _round(v0, v1, v2, v3):  # type: ignore[no-untyped-def]
    v0 = v0 + v1
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = v2 + v3
    v3 = _rotl(v3, 16) ^ v2
    v0 = v0 + v3
    v3 = _rotl(v3, 21) ^ v0
    v2 = v2 + v1
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24_u64(key: bytes, words: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SipHash-2-4 of each 64-bit word, hashed as its 8 little-endian bytes.

    Args:
        key: 16-byte key.
        words: Messages, one uint64 each.

    Returns:
        The 64-bit SipHash-2-4 of each message.
    """
    if len(key) != 16:
        raise ValueError("SipHash needs a 16-byte key")
    k0 = _U64(int.from_bytes(key[:8], "little"))
    k1 = _U64(int.from_bytes(key[8:], "little"))
    m = np.asarray(words, dtype=np.uint64)
    with np.errstate(over="ignore"):
        v0 = np.full(m.shape, k0 ^ _C0, dtype=np.uint64)
        v1 = np.full(m.shape, k1 ^ _C1, dtype=np.uint64)
        v2 = np.full(m.shape, k0 ^ _C2, dtype=np.uint64)
        v3 = np.full(m.shape, k1 ^ _C3, dtype=np.uint64) ^ m
        for _ in range(2):
            v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 = v0 ^ m
        last = _U64(8 << 56)  # message length 8 in the top byte, no tail bytes
        v3 = v3 ^ last
        for _ in range(2):
            v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 = v0 ^ last
        v2 = v2 ^ _U64(0xFF)
        for _ in range(4):
            v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        return v0 ^ v1 ^ v2 ^ v3
