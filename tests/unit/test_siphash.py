"""SipHash-2-4 (the truncation's keyed hash) against the reference vector and an independent
scalar implementation written here from the SipHash paper (Aumasson and Bernstein, 2012)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from phsafe._siphash import siphash24_u64

MASK = (1 << 64) - 1
KEY = bytes(range(16))


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _sipround(v: list[int]) -> None:
    v[0] = (v[0] + v[1]) & MASK
    v[1] = _rotl(v[1], 13) ^ v[0]
    v[0] = _rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & MASK
    v[3] = _rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & MASK
    v[3] = _rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & MASK
    v[1] = _rotl(v[1], 17) ^ v[2]
    v[2] = _rotl(v[2], 32)


def siphash24_reference(key: bytes, message: bytes) -> int:
    """Scalar SipHash-2-4 of an arbitrary byte string (c=2 compression, d=4 finalization)."""
    assert len(key) == 16
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v = [
        k0 ^ int.from_bytes(b"somepseu", "big"),
        k1 ^ int.from_bytes(b"dorandom", "big"),
        k0 ^ int.from_bytes(b"lygenera", "big"),
        k1 ^ int.from_bytes(b"tedbytes", "big"),
    ]
    n = len(message)
    full = n - n % 8
    blocks = [int.from_bytes(message[i : i + 8], "little") for i in range(0, full, 8)]
    tail = message[full:] + bytes(7 - n % 8) + bytes([n & 0xFF])
    blocks.append(int.from_bytes(tail, "little"))
    for m in blocks:
        v[3] ^= m
        _sipround(v)
        _sipround(v)
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        _sipround(v)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_reference_implementation_matches_the_published_vectors() -> None:
    # Key 00..0f: the paper's Appendix A example (15-byte message 00..0e), the empty message,
    # and the 8-byte message 00..07 of the reference test-vector list.
    assert siphash24_reference(KEY, bytes(range(15))) == 0xA129CA6149BE45E5
    assert siphash24_reference(KEY, b"") == 0x726FDB47DD0E0E31
    assert siphash24_reference(KEY, bytes(range(8))) == 0x93F5F5799A932462


def test_reference_vector_8_bytes() -> None:
    word = int.from_bytes(bytes(range(8)), "little")  # message bytes 00..07
    out = siphash24_u64(KEY, np.array([word], dtype=np.uint64))
    assert out.dtype == np.uint64
    assert int(out[0]) == 0x93F5F5799A932462


def test_agrees_with_scalar_reference_on_random_inputs() -> None:
    rng = random.Random(20240521)
    for _ in range(40):
        key = bytes(rng.getrandbits(8) for _ in range(16))
        words = [rng.getrandbits(64) for _ in range(50)] + [0, 1, MASK, 1 << 63, (1 << 54) - 1]
        got = siphash24_u64(key, np.array(words, dtype=np.uint64))
        expected = [siphash24_reference(key, w.to_bytes(8, "little")) for w in words]
        assert [int(x) for x in got] == expected


def test_key_matters_and_messages_are_not_confused() -> None:
    words = np.arange(1000, dtype=np.uint64)
    a = siphash24_u64(KEY, words)
    b = siphash24_u64(bytes(16), words)
    assert len(set(a.tolist())) == 1000
    assert (a != b).all()


def test_shapes_and_dtypes() -> None:
    assert siphash24_u64(KEY, np.array([], dtype=np.uint64)).shape == (0,)
    grid = np.arange(12, dtype=np.uint64).reshape(3, 4)
    out = siphash24_u64(KEY, grid)
    assert out.shape == (3, 4)
    assert out.ravel().tolist() == siphash24_u64(KEY, grid.ravel()).tolist()
    # Inputs of another integer dtype are hashed as their uint64 value.
    assert siphash24_u64(KEY, np.array([5], dtype=np.int32))[0] == siphash24_u64(KEY, np.array([5], np.uint64))[0]


@pytest.mark.parametrize("key", [b"", bytes(8), bytes(15), bytes(17), bytes(32)])
def test_key_must_be_16_bytes(key: bytes) -> None:
    with pytest.raises(ValueError):
        siphash24_u64(key, np.array([1], dtype=np.uint64))


def test_no_overflow_warnings() -> None:
    with np.errstate(all="raise"):
        siphash24_u64(KEY, np.array([MASK, MASK - 1], dtype=np.uint64))
