"""Overlap between datasets: a keyed sketch of each content version's person records.

The lifetime cap is per dataset name, and the content fingerprint stops the *same* records from
being declared under a second name. Nearly the same records -- one person removed -- have another
fingerprint, so without more they would get a second full cap under a new name. Each declared
content version therefore keeps, in the confidential ledger only, a sketch of its records, and a
new version whose records overlap another dataset's beyond :data:`OVERLAP_LIMIT` is refused
unless the operator declares the relation (see ``phsafe.ledger.format``, "Overlap between
datasets").

The sketch (bottom-k, a consistent sample): the :data:`~phsafe.fingerprint.SAMPLE_SIZE` least
distinct person-record hashes (the fingerprint's first lane, computed in the pass that counts),
each then keyed -- HMAC-SHA256 under the ledger's lineage key, cut to 48 bits -- and stored as a
sorted list, with the number of person records. A record two datasets share has the same tag in
both sketches whenever its hash is below both sketches' largest; so the number of shared tags,
scaled by the larger dataset's size over ``k``, estimates the number of shared records, and
exactly so when both datasets have at most ``k`` person records. Without the key a tag reveals
nothing and admits no test of a guessed record; the sketch is never published.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from fractions import Fraction
from typing import Any, Mapping

from phsafe.fingerprint import SAMPLE_SIZE, ContentDigest

__all__ = ["OVERLAP_LIMIT", "SKETCH_DOMAIN", "keyed_sketch", "overlap_share", "sketch_problem", "percent"]

OVERLAP_LIMIT = Fraction(1, 100)
"""The share of a new version's person records that may also be another dataset's, undeclared."""
SKETCH_DOMAIN = b"phsafe-overlap-sketch-v1\x00"
TAG_HEX = 12
"""Hex digits of a tag (48 bits: chance collisions between sketches stay below one in a million)."""
_TAG = re.compile(r"^[0-9a-f]{%d}$" % TAG_HEX)


def keyed_sketch(content: ContentDigest, key: bytes) -> dict[str, Any]:
    """The sketch recorded with a content version: ``{"records", "size", "tags"}`` (see above)."""
    tags = sorted(hmac.new(key, SKETCH_DOMAIN + v.to_bytes(8, "big"), hashlib.sha256).hexdigest()[:TAG_HEX]
                  for v in content.sample)
    return {"records": content.persons, "size": SAMPLE_SIZE, "tags": tags}


def sketch_problem(sketch: Any) -> str | None:
    """What is wrong with a recorded sketch, or None."""
    if not isinstance(sketch, Mapping) or set(sketch) != {"records", "size", "tags"}:
        return "sketch must be an object with records, size and tags"
    records, size, tags = sketch["records"], sketch["size"], sketch["tags"]
    if not (isinstance(records, int) and not isinstance(records, bool) and records >= 0):
        return "sketch.records must be a non-negative integer"
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
        return "sketch.size must be a positive integer"
    if not isinstance(tags, list) or not all(isinstance(t, str) and _TAG.match(t) for t in tags):
        return f"sketch.tags must be a list of {TAG_HEX}-hex-digit tags"
    if tags != sorted(set(tags)) or len(tags) > min(size, records):
        return "sketch.tags must be sorted, distinct and at most min(size, records)"
    return None


def overlap_share(new: Mapping[str, Any], other: Mapping[str, Any]) -> Fraction:
    """The estimated share of ``new``'s person records that are also ``other``'s (exact when
    both hold at most ``size`` records); 0 for an empty ``new``."""
    if not new["records"]:
        return Fraction(0)
    shared = len(set(new["tags"]) & set(other["tags"]))
    size = min(new["size"], other["size"])
    larger = max(new["records"], other["records"])
    estimate = Fraction(shared) if larger <= size else Fraction(shared * larger, size)
    return min(Fraction(1), estimate / new["records"])


def percent(share: Fraction) -> str:
    """``share`` as a percentage with two decimals (``"99.90%"``)."""
    return f"{float(share) * 100:.2f}%"
