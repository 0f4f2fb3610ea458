"""RFC 6962 / RFC 9162 Merkle tree hashing, tree heads and proofs, over stored hashes; no I/O.

Hashing (RFC 6962 §2.1), SHA-256 throughout::

    leaf hash   = SHA-256(0x00 || entry bytes)
    node hash   = SHA-256(0x01 || left hash || right hash)
    MTH({})     = SHA-256("")  = e3b0c442...b855      (the empty tree)
    MTH(D[n])   = node hash(MTH(D[0:k]), MTH(D[k:n]))  for n > 1, k the largest power of 2 < n

Stored hashes. A log of n entries keeps the hash of every *complete* subtree: at level L, the
k-th subtree covers entries [k * 2^L, (k+1) * 2^L) and its hash is MTH of those entries (level 0
holds the leaf hashes). They are stored in one append-only sequence, in the order they become
complete: appending entry i stores its leaf hash, then the level-1, level-2, ... hashes that
entry i completes (one per trailing 1 bit of i). Hence::

    stored_hash_count(n)      = 2n - popcount(n)
    stored_hash_index(L, k)   = 2m - popcount(m) + L,   m = (k+1) * 2^L - 1 (the subtree's last entry)

so a hash store is a flat array of 32-byte hashes that only ever grows, and any tree head or
proof is read from O(log n) stored hashes (a proof: O(log^2 n) at most) without rehashing
entries. The same numbering is used by Go's ``golang.org/x/mod/sumdb/tlog``; nothing else
depends on it, and the public formats (checkpoints, proofs) never show it.

Proofs (RFC 9162 §2.1.3 and §2.1.4; the same proofs as RFC 6962 §2.1.1 and §2.1.2):

- The inclusion proof of entry m in a tree of n entries is PATH(m, D[0:n]), the siblings on the
  way from the leaf to the root, the leaf's sibling first. It has no hashes when n == 1.
- The consistency proof from size m to size n (0 < m < n) is PROOF(m, D[0:n]) =
  SUBPROOF(m, D[0:n], true). Here it is also defined for m == n and m == 0: empty, as the C2SP
  witness protocol expects; its verification then compares the roots (m == n) or checks that the
  old root is the empty tree's (m == 0).

Verification follows RFC 9162 §2.1.3.2 and §2.1.4.2 step by step and raises
:class:`~phsafe.errors.ProofError` on any mismatch, including a hash that is not 32 bytes,
a proof with too many or too few hashes, or an index outside the tree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from phsafe.errors import ProofError, StoreError

HASH_SIZE = 32
"""Bytes in a SHA-256 hash."""

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""MTH of the empty tree: SHA-256 of the empty string (RFC 6962 §2.1)."""

MAX_TREE_SIZE = (1 << 63) - 1
"""Largest tree size accepted anywhere (checkpoints carry it as a signed 64-bit decimal)."""


class HashReader(Protocol):
    """Reads stored hashes by their index in the stored-hash sequence (see the module docstring)."""

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]:
        """The stored hashes at ``indexes``, in that order; raises StoreError if any is absent."""
        ...


def leaf_hash(entry: bytes) -> bytes:
    """SHA-256(0x00 || entry): the hash of one log entry."""
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an interior node."""
    return hashlib.sha256(b"\x01" + left + right).digest()


# --------------------------------------------------------------------------------------------
# Stored-hash numbering
# --------------------------------------------------------------------------------------------


def stored_hash_count(size: int) -> int:
    """How many hashes a log of ``size`` entries stores: 2 * size - popcount(size)."""
    if size < 0:
        raise ValueError("a tree size is non-negative")
    return 2 * size - size.bit_count()


def stored_hash_index(level: int, index: int) -> int:
    """Position of the hash of subtree ``index`` at ``level`` in the stored-hash sequence."""
    if level < 0 or index < 0:
        raise ValueError("levels and indexes are non-negative")
    last = ((index + 1) << level) - 1  # the subtree's last entry: storing it completes the subtree
    return stored_hash_count(last) + level


def largest_tree_in_stored_count(count: int) -> int:
    """The largest tree size whose stored hashes fit in ``count`` hashes."""
    if count < 0:
        raise ValueError("a count is non-negative")
    # stored_hash_count is strictly increasing (it grows by 1 + trailing ones of the old size).
    low, high = 0, count
    while low < high:
        mid = (low + high + 1) // 2
        if stored_hash_count(mid) <= count:
            low = mid
        else:
            high = mid - 1
    return low


def tree_size_for_stored_count(count: int) -> int:
    """The tree size whose stored-hash count is ``count``; StoreError if there is none.

    A store holding a count no tree has was cut in the middle of an append (a torn write).
    """
    size = largest_tree_in_stored_count(count)
    if stored_hash_count(size) != count:
        raise StoreError(f"a hash store of {count} hashes holds no whole tree (a torn append?): "
                         f"{stored_hash_count(size)} hashes make a tree of {size} entries")
    return size


def hashes_to_store(index: int, entry_hash: bytes, reader: HashReader) -> list[bytes]:
    """The hashes appending entry ``index`` (whose leaf hash is ``entry_hash``) adds to a store.

    The store must hold exactly the ``index`` entries before it. Returns the leaf hash followed
    by the hash of each subtree this entry completes, lowest level first.
    """
    _check_hash(entry_hash, "leaf hash")
    levels = (~index & (index + 1)).bit_length() - 1  # trailing 1 bits of index
    lefts = reader.read_hashes([stored_hash_index(level, (index >> level) - 1) for level in range(levels)])
    new = [entry_hash]
    current = entry_hash
    for left in lefts:
        current = node_hash(left, current)
        new.append(current)
    return new


# --------------------------------------------------------------------------------------------
# Tree heads and subtree hashes from stored hashes
# --------------------------------------------------------------------------------------------


def _largest_power_of_two_below(n: int) -> int:
    """The k of RFC 6962's split: the largest power of 2 strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def _complete_subtrees(start: int, end: int) -> list[tuple[int, int]]:
    """(level, index) of the complete subtrees that tile [start, end), left to right.

    Only for the ranges RFC 6962's recursion produces, whose start is a multiple of the largest
    power of 2 not above end - start; then the binary digits of the width are the subtrees.
    """
    pieces: list[tuple[int, int]] = []
    width = end - start
    for level in range(width.bit_length() - 1, -1, -1):
        if width >> level & 1:
            if start % (1 << level):
                raise ValueError(f"[{start}, {end}) is not a range of the Merkle tree's recursion")
            pieces.append((level, start >> level))
            start += 1 << level
    return pieces


def _hashes_of_ranges(ranges: Sequence[tuple[int, int]], reader: HashReader) -> list[bytes]:
    """MTH(D[start:end]) of each range, reading all stored hashes needed in one batch."""
    plans = [_complete_subtrees(start, end) for start, end in ranges]
    wanted = [stored_hash_index(level, index) for plan in plans for level, index in plan]
    found = reader.read_hashes(wanted)
    for h in found:
        _check_stored(h)
    results: list[bytes] = []
    position = 0
    for plan in plans:
        pieces = found[position:position + len(plan)]
        position += len(plan)
        # MTH splits off the largest complete subtree on the left, then recurses on the rest:
        # fold the pieces from the right.
        current = pieces[-1]
        for piece in reversed(pieces[:-1]):
            current = node_hash(piece, current)
        results.append(current)
    return results


def subtree_hash(start: int, end: int, reader: HashReader) -> bytes:
    """MTH(D[start:end]) for a range of the tree's recursion (e.g. [0, n), or a proof's range)."""
    if not 0 <= start < end:
        raise ValueError(f"[{start}, {end}) is not a non-empty range")
    return _hashes_of_ranges([(start, end)], reader)[0]


def tree_hash(size: int, reader: HashReader) -> bytes:
    """The tree head MTH(D[0:size]) of the log's first ``size`` entries, from stored hashes."""
    if size < 0:
        raise ValueError("a tree size is non-negative")
    if size == 0:
        return EMPTY_ROOT
    return subtree_hash(0, size, reader)


# --------------------------------------------------------------------------------------------
# Proof generation
# --------------------------------------------------------------------------------------------


def _inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The ranges whose MTH make PATH(index, D[0:size]), leaf side first."""
    ranges: list[tuple[int, int]] = []
    start, end = 0, size
    while end - start > 1:
        k = _largest_power_of_two_below(end - start)
        if index < start + k:
            ranges.append((start + k, end))  # PATH(m, D[0:k]) : MTH(D[k:n])
            end = start + k
        else:
            ranges.append((start, start + k))  # PATH(m - k, D[k:n]) : MTH(D[0:k])
            start += k
    ranges.reverse()  # collected root side first; the proof lists the leaf's sibling first
    return ranges


def _consistency_ranges(old_size: int, new_size: int) -> list[tuple[int, int]]:
    """The ranges whose MTH make SUBPROOF(old_size, D[0:new_size], true), in proof order."""
    ranges: list[tuple[int, int]] = []
    m, start, end, whole_old_tree = old_size, 0, new_size, True
    while True:
        n = end - start
        if m == n:
            if not whole_old_tree:  # SUBPROOF(m, D[m], false) = {MTH(D[m])}
                ranges.append((start, end))
            break
        k = _largest_power_of_two_below(n)
        if m <= k:
            ranges.append((start + k, end))  # SUBPROOF(m, D[0:k], b) : MTH(D[k:n])
            end = start + k
        else:
            ranges.append((start, start + k))  # SUBPROOF(m - k, D[k:n], false) : MTH(D[0:k])
            m -= k
            start += k
            whole_old_tree = False
    ranges.reverse()
    return ranges


def inclusion_proof(index: int, size: int, reader: HashReader) -> list[bytes]:
    """The RFC 9162 inclusion proof of entry ``index`` in the tree of the first ``size`` entries."""
    if not 0 <= index < size:
        raise ProofError(f"entry {index} is not in a tree of {size} entries")
    return _hashes_of_ranges(_inclusion_ranges(index, size), reader)


def consistency_proof(old_size: int, new_size: int, reader: HashReader) -> list[bytes]:
    """The RFC 9162 consistency proof from the tree of ``old_size`` entries to ``new_size``.

    Empty when old_size is 0 or equals new_size (nothing to prove beyond comparing roots).
    """
    if not 0 <= old_size <= new_size:
        raise ProofError(f"no consistency proof from a tree of {old_size} to one of {new_size} entries")
    if old_size in (0, new_size):
        return []
    return _hashes_of_ranges(_consistency_ranges(old_size, new_size), reader)


# --------------------------------------------------------------------------------------------
# Proof verification (no stored hashes needed)
# --------------------------------------------------------------------------------------------


def _check_hash(value: bytes, what: str) -> None:
    if not isinstance(value, (bytes, bytearray)) or len(value) != HASH_SIZE:
        raise ProofError(f"the {what} is not a {HASH_SIZE}-byte SHA-256 hash")


def _check_stored(value: bytes) -> None:
    if not isinstance(value, (bytes, bytearray)) or len(value) != HASH_SIZE:
        raise StoreError(f"a stored hash is not {HASH_SIZE} bytes")


def root_from_inclusion_proof(entry_hash: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` binds leaf ``entry_hash`` at ``index`` to (RFC 9162 §2.1.3.2).

    Raises ProofError if the proof has the wrong shape for (index, size).
    """
    _check_hash(entry_hash, "leaf hash")
    if not 0 <= index < size <= MAX_TREE_SIZE:
        raise ProofError(f"entry {index} is not in a tree of {size} entries")
    fn, sn = index, size - 1
    result = bytes(entry_hash)
    for position, sibling in enumerate(proof):
        _check_hash(sibling, f"inclusion proof's hash {position}")
        if sn == 0:
            raise ProofError(f"the inclusion proof of entry {index} in a tree of {size} entries "
                             f"has too many hashes ({len(proof)})")
        if fn & 1 or fn == sn:
            result = node_hash(sibling, result)
            # A right edge: climb past the levels where this node has no right sibling.
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            result = node_hash(result, sibling)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError(f"the inclusion proof of entry {index} in a tree of {size} entries "
                         f"has too few hashes ({len(proof)})")
    return result


def verify_inclusion(entry_hash: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """Check that leaf ``entry_hash`` is entry ``index`` of the tree of ``size`` entries with ``root``."""
    _check_hash(root, "root hash")
    if root_from_inclusion_proof(entry_hash, index, size, proof) != root:
        raise ProofError(f"the inclusion proof does not bind the entry to index {index} of the tree "
                         f"of {size} entries with that root hash")


def verify_consistency(old_size: int, old_root: bytes, new_size: int, new_root: bytes,
                       proof: Sequence[bytes]) -> None:
    """Check that the tree (new_size, new_root) extends the tree (old_size, old_root).

    RFC 9162 §2.1.4.2 for 0 < old_size < new_size; for old_size == new_size the proof must be
    empty and the roots equal; for old_size == 0 the proof must be empty and old_root the empty
    tree's.
    """
    _check_hash(old_root, "old root hash")
    _check_hash(new_root, "new root hash")
    if not 0 <= old_size <= new_size <= MAX_TREE_SIZE:
        raise ProofError(f"a tree of {new_size} entries cannot extend one of {old_size}")
    what = f"from a tree of {old_size} to one of {new_size} entries"
    if old_size == 0 or old_size == new_size:
        if proof:
            raise ProofError(f"the consistency proof {what} must be empty, and has {len(proof)} hashes")
        if old_size == 0 and old_root != EMPTY_ROOT:
            raise ProofError("a tree of 0 entries has the empty tree's root hash, SHA-256(\"\")")
        if old_size == new_size and old_root != new_root:
            raise ProofError(f"two trees of {old_size} entries with different root hashes")
        return
    fr, sr = roots_from_consistency_proof(old_size, new_size, proof, old_root)
    if fr != old_root:
        raise ProofError(f"the consistency proof {what} does not lead to the old root hash")
    if sr != new_root:
        raise ProofError(f"the consistency proof {what} does not lead to the new root hash")


def roots_from_consistency_proof(old_size: int, new_size: int, proof: Sequence[bytes],
                                 old_root: bytes | None = None) -> tuple[bytes, bytes]:
    """The two roots a consistency proof from ``old_size`` to ``new_size`` (0 < old < new)
    computes: that of the first ``old_size`` entries and that of the whole tree (RFC 9162
    §2.1.4.2's fr and sr).

    When ``old_size`` is a power of two the old tree is a complete subtree whose root the proof
    leaves out (the verifier holds it): ``old_root`` must be given then, and is returned as the
    first root. Otherwise the proof determines both roots: a proof that leads to a tree's true
    root pins the root of its first ``old_size`` entries (a hash collision aside), whatever the
    sender claims -- which is what makes a conflicting pair of checkpoints provable.

    Raises:
        ProofError: The proof has the wrong shape for the sizes, or ``old_root`` is needed and
            not given.
    """
    if not 0 < old_size < new_size <= MAX_TREE_SIZE:
        raise ProofError(f"no consistency proof from a tree of {old_size} to one of {new_size} entries has hashes")
    what = f"from a tree of {old_size} to one of {new_size} entries"
    if not proof:
        raise ProofError(f"the consistency proof {what} is empty")
    for position, h in enumerate(proof):
        _check_hash(h, f"consistency proof's hash {position}")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        # The old tree is a complete subtree of the new one: its root is the proof's first node.
        if old_root is None:
            raise ProofError(f"the consistency proof {what} leaves out the old root (a complete subtree)")
        _check_hash(old_root, "old root hash")
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError(f"the consistency proof {what} has too many hashes ({len(proof)})")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError(f"the consistency proof {what} has too few hashes ({len(proof)})")
    return fr, sr
