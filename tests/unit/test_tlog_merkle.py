"""RFC 6962 hashing and proofs: known answers, and every proof of every tree up to 70 entries
checked against an independent recursive implementation written here from the RFC's definitions
(MTH, PATH, PROOF/SUBPROOF), plus every single-hash tampering of those proofs refused."""

from __future__ import annotations

import hashlib
from functools import lru_cache

import pytest

from phsafe.tlog import merkle
from phsafe.errors import ProofError, StoreError
from phsafe.tlog.log import MemoryHashStore, TransparencyLog
from phsafe.tlog.merkle import (
    EMPTY_ROOT,
    leaf_hash,
    node_hash,
    stored_hash_count,
    stored_hash_index,
    tree_size_for_stored_count,
    verify_consistency,
    verify_inclusion,
)

# RFC 6962 reference leaves and tree heads, as published with the Certificate Transparency
# reference implementation's tests (data, not code): the root of the first n leaves, n = 0..8.
REFERENCE_LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")]
REFERENCE_ROOTS = [bytes.fromhex(h) for h in (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")]
REFERENCE_INCLUSION = {  # (index, size) -> proof
    (0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}
REFERENCE_CONSISTENCY = {  # (old size, new size) -> proof
    (2, 8): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}

MAX_SIZE = 70  # every tree of 1..70 entries: all shapes up to 2^6 and a few beyond


# ---- an independent implementation, straight from RFC 6962 §2.1 -----------------------------

def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(entries: tuple[bytes, ...]) -> bytes:
    if not entries:
        return _sha(b"")
    if len(entries) == 1:
        return _sha(b"\x00" + entries[0])
    k = _split(len(entries))
    return _sha(b"\x01" + mth(entries[:k]) + mth(entries[k:]))


def path(m: int, entries: tuple[bytes, ...]) -> list[bytes]:
    n = len(entries)
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return path(m, entries[:k]) + [mth(entries[k:])]
    return path(m - k, entries[k:]) + [mth(entries[:k])]


def subproof(m: int, entries: tuple[bytes, ...], whole: bool) -> list[bytes]:
    n = len(entries)
    if m == n:
        return [] if whole else [mth(entries)]
    k = _split(n)
    if m <= k:
        return subproof(m, entries[:k], whole) + [mth(entries[k:])]
    return subproof(m - k, entries[k:], False) + [mth(entries[:k])]


ENTRIES = tuple(f"entry {i}".encode() for i in range(MAX_SIZE))


@lru_cache(maxsize=None)
def brute_root(n: int) -> bytes:
    return mth(ENTRIES[:n])


@pytest.fixture(scope="module")
def log() -> TransparencyLog:
    log = TransparencyLog(MemoryHashStore())
    for entry in ENTRIES:  # one at a time: every intermediate store is exercised
        log.append([entry])
    return log


# ---- known answers --------------------------------------------------------------------------

def test_empty_tree_hash_is_sha256_of_the_empty_string() -> None:
    assert EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert TransparencyLog(MemoryHashStore()).root() == EMPTY_ROOT
    assert leaf_hash(b"") == _sha(b"\x00") == REFERENCE_ROOTS[1]
    assert node_hash(b"a" * 32, b"b" * 32) == _sha(b"\x01" + b"a" * 32 + b"b" * 32)


def test_reference_tree_heads_and_proofs() -> None:
    log = TransparencyLog.of_entries(REFERENCE_LEAVES)
    assert [log.root(n) for n in range(9)] == REFERENCE_ROOTS
    for (index, size), proof in REFERENCE_INCLUSION.items():
        assert [h.hex() for h in log.inclusion_proof(index, size)] == proof
        verify_inclusion(leaf_hash(REFERENCE_LEAVES[index]), index, size, [bytes.fromhex(h) for h in proof],
                         REFERENCE_ROOTS[size])
    for (old, new), proof in REFERENCE_CONSISTENCY.items():
        assert [h.hex() for h in log.consistency_proof(old, new)] == proof
        verify_consistency(old, REFERENCE_ROOTS[old], new, REFERENCE_ROOTS[new], [bytes.fromhex(h) for h in proof])


# ---- stored hashes ----------------------------------------------------------------------------

def test_stored_hash_numbering_matches_the_store(log: TransparencyLog) -> None:
    store = log.store
    assert store.stored_count() == stored_hash_count(MAX_SIZE)
    # Every stored hash is the MTH of the complete subtree its (level, index) names.
    for level in range(7):
        width = 1 << level
        for k in range(MAX_SIZE // width):
            (h,) = store.read_hashes([stored_hash_index(level, k)])
            assert h == mth(ENTRIES[k * width:(k + 1) * width]), (level, k)
    seen = sorted(stored_hash_index(level, k) for level in range(7) for k in range(MAX_SIZE >> level))
    assert seen == list(range(stored_hash_count(MAX_SIZE)))  # a bijection onto the store


def test_tree_size_from_stored_count_refuses_a_torn_store() -> None:
    for n in range(300):
        assert tree_size_for_stored_count(stored_hash_count(n)) == n
    with pytest.raises(StoreError, match="torn"):
        tree_size_for_stored_count(stored_hash_count(3) + 1)  # leaf 3 stored, its parents not
    log = TransparencyLog(MemoryHashStore([b"\x00" * 32] * 5))
    with pytest.raises(StoreError):
        _ = log.size


def test_batched_and_single_appends_agree() -> None:
    one_by_one = TransparencyLog(MemoryHashStore())
    for entry in ENTRIES[:37]:
        one_by_one.append([entry])
    batched = TransparencyLog(MemoryHashStore())
    assert batched.append(ENTRIES[:5]) == range(0, 5)
    assert batched.append(ENTRIES[5:37]) == range(5, 37)
    assert batched.append([]) == range(37, 37)
    assert batched.store.read_hashes(range(stored_hash_count(37))) == \
        one_by_one.store.read_hashes(range(stored_hash_count(37)))


# ---- every proof of every tree, against the brute force ----------------------------------

def test_every_root_matches_the_recursive_mth(log: TransparencyLog) -> None:
    for n in range(MAX_SIZE + 1):
        assert log.root(n) == brute_root(n), n


def _tamperings(proof: list[bytes]) -> list[list[bytes]]:
    """Each hash flipped, each hash dropped, one hash added, neighbours swapped."""
    out = []
    for i in range(len(proof)):
        flipped = list(proof)
        flipped[i] = bytes([proof[i][0] ^ 1]) + proof[i][1:]
        out.append(flipped)
        out.append(proof[:i] + proof[i + 1:])
        if i + 1 < len(proof) and proof[i] != proof[i + 1]:
            out.append(proof[:i] + [proof[i + 1], proof[i]] + proof[i + 2:])
    out.append(proof + [b"\x07" * 32])
    return out


def test_every_inclusion_proof(log: TransparencyLog) -> None:
    checked = 0
    for n in range(1, MAX_SIZE + 1):
        root = brute_root(n)
        for m in range(n):
            proof = log.inclusion_proof(m, n)
            assert proof == path(m, ENTRIES[:n]), (m, n)
            leaf = leaf_hash(ENTRIES[m])
            verify_inclusion(leaf, m, n, proof, root)
            for bad in _tamperings(proof):
                with pytest.raises(ProofError):
                    verify_inclusion(leaf, m, n, bad, root)
            with pytest.raises(ProofError):  # another entry at that index
                verify_inclusion(leaf_hash(ENTRIES[m] + b"!"), m, n, proof, root)
            for other in {m - 1, m + 1} & set(range(n)):  # the same proof, claimed for another index
                with pytest.raises(ProofError):
                    verify_inclusion(leaf, other, n, proof, root)
            if n < MAX_SIZE:
                with pytest.raises(ProofError):  # ... or for the next tree
                    verify_inclusion(leaf, m, n + 1, proof, brute_root(n + 1))
            checked += 1
    assert checked == MAX_SIZE * (MAX_SIZE + 1) // 2


def test_every_consistency_proof(log: TransparencyLog) -> None:
    checked = 0
    for n in range(0, MAX_SIZE + 1):
        new_root = brute_root(n)
        for m in range(0, n + 1):
            old_root = brute_root(m)
            proof = log.consistency_proof(m, n)
            assert proof == ([] if m in (0, n) else subproof(m, ENTRIES[:n], True)), (m, n)
            verify_consistency(m, old_root, n, new_root, proof)
            for bad in _tamperings(proof):
                with pytest.raises(ProofError):
                    verify_consistency(m, old_root, n, new_root, bad)
            if m < n:  # a fork: another old tree of that size ...
                forged_old = mth(ENTRIES[:m - 1] + (b"forged",)) if m else b"\x01" * 32
                with pytest.raises(ProofError):
                    verify_consistency(m, forged_old, n, new_root, proof)
            if 0 < m < n:  # ... or another new tree (every tree extends the empty one)
                with pytest.raises(ProofError):
                    verify_consistency(m, old_root, n, mth(ENTRIES[:n - 1] + (b"forged",)), proof)
            checked += 1
    assert checked == (MAX_SIZE + 1) * (MAX_SIZE + 2) // 2


def test_degenerate_and_out_of_range_proofs_are_refused(log: TransparencyLog) -> None:
    with pytest.raises(ProofError):
        log.inclusion_proof(5, 5)
    with pytest.raises(ProofError):
        log.consistency_proof(6, 5)
    with pytest.raises(ValueError):
        log.root(MAX_SIZE + 1)
    with pytest.raises(ProofError, match="different root"):
        verify_consistency(4, brute_root(4), 4, brute_root(5), [])
    with pytest.raises(ProofError, match="empty tree"):
        verify_consistency(0, brute_root(1), 8, brute_root(8), [])
    with pytest.raises(ProofError, match="empty"):
        verify_consistency(3, brute_root(3), 8, brute_root(8), [])
    with pytest.raises(ProofError):
        verify_consistency(8, brute_root(8), 3, brute_root(3), [])
    with pytest.raises(ProofError, match="32-byte"):
        verify_inclusion(leaf_hash(ENTRIES[0]), 0, 2, [b"short"], brute_root(2))
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(ENTRIES[0]), -1, 2, log.inclusion_proof(0, 2), brute_root(2))


def test_a_larger_log_sampled() -> None:
    """Trees past 2^10 entries: roots and proofs agree with a flat recomputation."""
    entries = [i.to_bytes(4, "big") for i in range(1500)]
    log = TransparencyLog.of_entries(entries)
    level = [leaf_hash(e) for e in entries]
    assert merkle.subtree_hash(0, 1024, log.store) == _perfect_root(level[:1024])
    assert log.root() == mth(tuple(entries))
    for m, n in [(0, 1500), (1023, 1500), (1024, 1500), (1499, 1500), (700, 1025)]:
        verify_inclusion(level[m], m, n, log.inclusion_proof(m, n), log.root(n))
    for m, n in [(1, 1500), (1024, 1500), (1025, 1499), (777, 1111)]:
        verify_consistency(m, log.root(m), n, log.root(n), log.consistency_proof(m, n))


def _perfect_root(hashes: list[bytes]) -> bytes:
    while len(hashes) > 1:
        hashes = [node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
    return hashes[0]
