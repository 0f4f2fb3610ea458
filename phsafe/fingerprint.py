"""The content fingerprint of a dataset: which records the tables are computed from, not which bytes.

The audit ledger's lifetime cap is per declared dataset, and a dataset's content versions are
told apart by this fingerprint. It must not change when the same records are stored another
way -- CSV, Parquet or Parquet stored by state; another row order; CRLF line endings; quoting;
trailing blank lines; integers written with other widths -- and it must change when a record the
tables are computed from changes.

What is fingerprinted: every *tabulated* record -- each person and each unit whose MAFID has a
geo row of a released state (after the state filter and the geography rules, spec §4) -- with
every field the tabulation reads (persons: RTYPE, MAFID, QAGE, CENHISP, CENRACE, RELSHIP; units:
RTYPE, MAFID, FINAL_POP, NPF, HHSPAN, HHRACE, TEN, HHT, HHT2, CPLT) and its state. Records the
run sets aside (other states, group-quarters geo rows) and geo columns no table reads cannot
change a release, so they do not change the identity either: the same tabulated records are the
same dataset for privacy accounting, whatever else is in the files.

How: each record is packed into 64-bit words (the parsed, normalised values: a code is the
integer it spells), mixed by two independent 64-bit mixing functions, and the mixed values are
*added* modulo 2^64 -- one sum per mixing function (a "lane"). Sums are order-independent and
count duplicate records, so the fingerprint is a function of the multiset of records; partitions
(states, MAFID ranges) are fingerprinted separately and added. The digest never leaves the run's
process as such: :meth:`ContentDigest.commit` turns it into an HMAC-SHA256 under the ledger's
lineage key, and only that commitment is recorded (in the confidential ledger). Without the key
nobody can test a guessed dataset against it.

The mixers are public and not collision-resistant against an adversary who crafts records; they
need not be: the operator gains nothing from making different records look alike (their spends
would count together), and cannot make the same records look different.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phsafe.reader import Columns

_U64 = np.uint64
_MASK = (1 << 64) - 1
_CHUNK = 1 << 20  # records mixed at a time: temporaries stay in the CPU caches
COMMIT_DOMAIN = b"phsafe-content-fingerprint-v1\x00"
SAMPLE_SIZE = 512
"""Person-record hashes kept for the overlap sketch (:mod:`phsafe.overlap`)."""

# Lane constants: each lane mixes ``word XOR lane`` (and chains further words the same way).
_LANES = (_U64(0x9E3779B97F4A7C15), _U64(0xD1B54A32D192ED03))
# Record-kind tags, so that a person and a unit can never pack to the same message.
_PERSON_TAG = _U64(0x5045_5253_4F4E_0001)  # "PERSON"
_UNIT_TAG = _U64(0x554E_4954_0000_0002)  # "UNIT"

PERSON_FIELDS: tuple[tuple[str, int], ...] = (
    ("MAFID", 30), ("QAGE", 7), ("CENHISP", 2), ("CENRACE", 6), ("RELSHIP", 6), ("RTYPE", 3),
)
"""Person fields and their bit widths, packed into one word after the 7-bit state code."""
UNIT_FIELDS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("MAFID", 30), ("FINAL_POP", 17), ("NPF", 7), ("HHSPAN", 2), ("HHRACE", 6)),
    (("TEN", 3), ("HHT", 3), ("HHT2", 4), ("CPLT", 3), ("RTYPE", 3)),
)
"""Unit fields in two words; the second word also carries the 7-bit state code."""


def _mix(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """A bijective 64-bit mixing function with full avalanche (the splitmix64 finalizer), in place."""
    z ^= z >> _U64(30)
    z *= _U64(0xBF58476D1CE4E5B9)
    z ^= z >> _U64(27)
    z *= _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    return z


def _pack(columns: Columns, rows: slice | npt.NDArray[np.integer], fields: tuple[tuple[str, int], ...],
          state: npt.NDArray[np.integer] | None) -> npt.NDArray[np.uint64]:
    word = np.zeros(len(columns["MAFID"][rows]), dtype=np.uint64) if state is None \
        else np.asarray(state, dtype=np.uint64).copy()
    field = np.empty_like(word)
    for name, bits in fields:
        word <<= _U64(bits)
        values = columns[name][rows] if isinstance(rows, slice) else np.take(columns[name], rows)
        np.copyto(field, values, casting="unsafe")  # the value's bits, as astype(np.uint64) gives them
        word |= field
    return word


def _lane_sums(tag: np.uint64, words: list[npt.NDArray[np.uint64]], *, smallest: int = 0,
               least: set[int] | None = None) -> list[int]:
    """For each lane: the sum modulo 2^64 of mix(... mix(mix(tag ^ lane) ^ w0) ... ^ wk). With
    ``smallest``: the ``smallest`` least distinct record hashes of the first lane are added to
    ``least`` (which keeps its ``smallest`` least)."""
    sums = []
    with np.errstate(over="ignore"):
        for i, lane in enumerate(_LANES):
            h = np.full(len(words[0]), _mix(np.array([tag ^ lane], dtype=np.uint64))[0], dtype=np.uint64)
            for w in words:
                h ^= w
                _mix(h)
            sums.append(int(h.sum(dtype=np.uint64)))
            if i == 0 and smallest and least is not None:
                kept = sorted(least | set(_least(_below(h, least, smallest), smallest).tolist()))[:smallest]
                least.clear()
                least.update(kept)
    return sums


def _below(values: npt.NDArray[np.uint64], least: set[int], k: int) -> npt.NDArray[np.uint64]:
    """``values``, or only those that can still enter ``least``'s ``k`` least -- the ones below its
    largest once it holds ``k`` -- when that changes nothing :func:`_least` then gives (at most
    4k of them: :func:`_least` keeps them all)."""
    if len(least) < k or len(values) <= 4 * k:
        return values
    below = values[values < _U64(max(least))]
    return below if len(below) <= 4 * k else values


def _least(values: npt.NDArray[np.uint64], k: int) -> npt.NDArray[np.uint64]:
    """The ``k`` least distinct ``values``, sorted."""
    if len(values) > 4 * k:
        values = np.partition(values, 4 * k)[: 4 * k]  # k distinct among them unless duplicates abound
    return np.unique(values)[:k]


@dataclass(frozen=True)
class ContentDigest:
    """The order-independent digest of a set of tabulated records (confidential: never logged,
    stored or published as such; see :meth:`commit`).

    Attributes:
        persons: Number of tabulated person records.
        units: Number of tabulated unit records.
        lanes: One sum modulo 2^64 per mixing function.
        sample: The :data:`SAMPLE_SIZE` least distinct person-record hashes (first lane), a
            consistent sample of the person records: two datasets' samples hold the same hash
            for a record they share, below either's largest. Only ever leaves the process keyed
            (:mod:`phsafe.overlap`).
    """

    persons: int = 0
    units: int = 0
    lanes: tuple[int, ...] = (0,) * len(_LANES)
    sample: tuple[int, ...] = ()

    def __add__(self, other: "ContentDigest") -> "ContentDigest":
        merged = tuple(sorted(set(self.sample) | set(other.sample))[:SAMPLE_SIZE])
        return ContentDigest(
            self.persons + other.persons, self.units + other.units,
            tuple((a + b) & _MASK for a, b in zip(self.lanes, other.lanes)), merged,
        )

    def __repr__(self) -> str:  # the lanes are a plain function of the data: never shown
        return "ContentDigest(<confidential>)"

    def commit(self, key: bytes) -> str:
        """The keyed commitment recorded in the ledger: HMAC-SHA256 under the lineage key, hex."""
        if len(key) < 16:
            raise ValueError("the lineage key must be at least 16 bytes")
        message = COMMIT_DOMAIN + b"".join(
            v.to_bytes(8, "big") for v in (self.persons, self.units, *self.lanes)
        )
        return hmac.new(key, message, hashlib.sha256).hexdigest()


def content_digest(
    persons: Columns,
    person_state: npt.NDArray[np.uint8],
    units: Columns,
    unit_state: npt.NDArray[np.uint8],
    states: tuple[str, ...],
    *,
    not_tabulated: int,
) -> ContentDigest:
    """The digest of the tabulated records of one partition.

    Args:
        persons, units: Columns of the partition's records (the reader's compact form).
        person_state, unit_state: Index of each record's state into ``states``, or
            ``not_tabulated``.
        states: The released states (codes) the indices point into.
        not_tabulated: The index of records the run sets aside.
    """
    codes = np.zeros(256, dtype=np.uint64)
    codes[: len(states)] = [int(s) for s in states]
    lanes = [0] * len(_LANES)
    sample: set[int] = set()
    n_persons = n_units = 0
    for tag, cols, state, fields in ((_PERSON_TAG, persons, person_state, (PERSON_FIELDS,)),
                                     (_UNIT_TAG, units, unit_state, UNIT_FIELDS)):
        rows = np.flatnonzero(state != not_tabulated)
        every = len(rows) == len(state)  # every record tabulated (one state's, the whole US's)
        for start in range(0, len(rows), _CHUNK):
            # Every record: a slice of the columns, not a gather (the same values).
            chunk = slice(start, min(start + _CHUNK, len(rows))) if every else rows[start : start + _CHUNK]
            code = codes[state[chunk]]
            words = [_pack(cols, chunk, f, code if i == len(fields) - 1 else None) for i, f in enumerate(fields)]
            sums = _lane_sums(tag, words, smallest=SAMPLE_SIZE if tag is _PERSON_TAG else 0, least=sample)
            lanes = [(a + b) & _MASK for a, b in zip(lanes, sums)]
        if tag is _PERSON_TAG:
            n_persons = len(rows)
        else:
            n_units = len(rows)
    return ContentDigest(n_persons, n_units, tuple(lanes), tuple(sorted(sample)))
