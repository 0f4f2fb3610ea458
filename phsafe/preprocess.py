"""Preprocessing: the state filter, the MAFID join of persons, units and geo, and geography (spec §4).

Every rule of the count is decided per MAFID, so a partition's records are joined once, on their
MAFIDs, and everything downstream -- the validation's cross-file frames, the tabulation, the
content fingerprint -- reads that join:

* :class:`GeoSide` -- what geo says about each MAFID: how many geo rows carry it (all of them,
  and those the state filter keeps), its first row, and its *state* for the tables: the state
  of its geo row when there is exactly one, it is a housing unit's (RTYPE 2: GQ facilities'
  geo rows are dropped, so GQ records never reach a table) and its TABBLKST is in
  ``state_filter``; otherwise ``NOT_TABULATED``. A MAFID listed twice in geo is ambiguous: its
  state is not known, and it is not tabulated.
* The state filter comes first (spec §1, §4): a geo row outside ``state_filter`` is set aside, and
  so are the units and persons of a MAFID whose every geo row is set aside (:meth:`GeoSide.aside`).
  Records with no geo row are kept (validation reports them; the tables never count them).
* :class:`Join` -- the keys of the partition (geo's MAFIDs, then those only units have), each
  kept unit's and person's key, and per key the number of unit rows and the first one. Units
  keep every row of their MAFID -- duplicates included: whether a MAFID is unique is decided
  per table *after* its universe filter (Algorithm 3, steps 1-2), see :mod:`phsafe.truncation`.

Keys are found with a direct-address table over the keys' MAFID span when it is small against
the look-ups (a state's MAFIDs, usually clustered), a binary search when the look-ups are sorted
(extracts sorted by MAFID), and otherwise a *rank bitmap*: one bit per MAFID of the span and the
number of keys before each 64-bit word, so a key's position is that count plus the bits set below
it in its word (12 bytes per 64 MAFIDs of span: 150 MB for the whole domain, whatever the number
of keys; about five times faster than a hash table on the persons of a national file, whose
MAFIDs come in no order).

Truncation and unit uniqueness are decided per MAFID and counts add up, so any MAFID-disjoint
split gives the same exact counts: :func:`partitions` cuts the tabulated records into MAFID
ranges of a few million persons, which keeps each table's temporaries in the CPU caches. Count
vectors are kept per state; the nation's vector is the sum of the exact state vectors before
any noise.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phsafe.errors import InputError
from phsafe.reader import Columns, InputTables
from phsafe.schema import MAFID_MAX, MAFID_MIN, RTYPE_UNIT_HU

NOT_TABULATED = np.uint8(255)
"""State index of a record the tables do not count."""

DIRECT_SLOTS_PER_LOOKUP = 16
"""A direct-address key table is used when its MAFID span holds at most this many slots per key
and look-up (4 bytes a slot)."""
DIRECT_MAX_SLOTS = 1 << 30
"""Never more than this many slots (4 GiB) in a direct-address key table: the MAFID domain's
800M fit, which for a national file of a hundred million units and more takes less memory than a
hash table of its keys (16 bytes or more a key)."""

BITMAP_WORDS_PER_LOOKUP = 64
"""Unsorted look-ups use a rank bitmap (a 64-bit word per 64 MAFIDs of the keys' span) unless it
has more than this many words per key and look-up: then a binary search."""


def _is_sorted(values: npt.NDArray[np.integer]) -> bool:
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


def sorted_distinct(values: npt.NDArray[np.integer]) -> npt.NDArray[np.integer]:
    """The distinct values, sorted.

    ``np.unique`` without ``return_*`` takes a hash-based path in numpy 2.x that is far slower
    than sorting on arrays of millions of MAFIDs; a sort (skipped when the values are already
    sorted, as extracts sorted by MAFID are) and a comparison of neighbours is all it takes.
    """
    s = values if _is_sorted(values) else np.sort(values)
    if s.size == 0:
        return s.copy()
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


class KeyIndex:
    """Sorted distinct MAFIDs, and the position of any MAFID among them (-1: absent).

    Args:
        keys: Sorted, distinct MAFIDs.
        expected_lookups: How many look-ups will follow (chooses a direct-address table).
    """

    def __init__(self, keys: npt.NDArray[np.integer], expected_lookups: int = 0) -> None:
        self.keys = np.asarray(keys, dtype=np.int32)
        self._table: npt.NDArray[np.int32] | None = None
        self._bits: npt.NDArray[np.uint64] | None = None
        self._rank: npt.NDArray[np.int32] | None = None
        self._lo = int(self.keys[0]) if len(self.keys) else 0
        self._span = int(self.keys[-1]) - self._lo + 1 if len(self.keys) else 0
        if self._span and self._span <= min(DIRECT_MAX_SLOTS,
                                            DIRECT_SLOTS_PER_LOOKUP * (len(self.keys) + expected_lookups)):
            table = np.full(self._span + 1, -1, dtype=np.int32)  # the last slot: off the span
            table[self.keys.astype(np.int64) - self._lo] = np.arange(len(self.keys), dtype=np.int32)
            self._table = table

    def __len__(self) -> int:
        return len(self.keys)

    def release(self) -> None:
        """Drop the look-up structures (the keys stay)."""
        self._table = None
        self._bits = None
        self._rank = None

    def lookup(self, mafid: npt.NDArray[np.integer]) -> npt.NDArray[np.int32]:
        """Position of each MAFID among the keys, or -1."""
        n = len(mafid)
        if len(self.keys) == 0 or n == 0:
            return np.full(n, -1, dtype=np.int32)
        if self._table is not None:
            offset = mafid.astype(np.int64)
            offset -= self._lo
            np.clip(offset, -1, self._span, out=offset)
            return self._table[offset]
        # Sorted look-ups, or a rank bitmap far larger than the work (a few MAFIDs spread over
        # the domain: its build, zeros and a running count of 12M words, costs more than a binary
        # search of every look-up): a binary search.
        sparse = self._bits is None and self._span >> 6 > BITMAP_WORDS_PER_LOOKUP * (len(self.keys) + n)
        if sparse or _is_sorted(mafid):
            pos = np.searchsorted(self.keys, mafid).astype(np.int32)
            np.minimum(pos, len(self.keys) - 1, out=pos)
            pos[self.keys[pos] != mafid] = -1
            return pos
        if self._bits is None:
            self._build_rank_bitmap()
        assert self._bits is not None and self._rank is not None
        offset = mafid.astype(np.int64)
        offset -= self._lo
        inside = (offset >= 0) & (offset < self._span)
        offset[~inside] = 0
        word_of = offset >> 6
        bit = (offset & 63).astype(np.uint64)
        del offset
        word = self._bits[word_of]
        hit = ((word >> bit) & np.uint64(1)).astype(bool)
        hit &= inside
        word &= (np.uint64(1) << bit) - np.uint64(1)  # the bits below this MAFID's
        pos = self._rank[word_of]
        pos += np.bitwise_count(word).astype(np.int32)
        pos[~hit] = -1
        return pos

    def _build_rank_bitmap(self) -> None:
        offset = self.keys.astype(np.int64) - self._lo  # sorted and distinct
        word_of = offset >> 6
        bit = np.left_shift(np.uint64(1), (offset & 63).astype(np.uint64))
        bits = np.zeros((self._span + 63) >> 6, dtype=np.uint64)
        starts = np.flatnonzero(np.concatenate([[True], word_of[1:] != word_of[:-1]]))
        bits[word_of[starts]] = np.bitwise_or.reduceat(bit, starts)
        rank = np.zeros(len(bits), dtype=np.int32)
        np.cumsum(np.bitwise_count(bits[:-1]), dtype=np.int32, out=rank[1:])
        self._bits, self._rank = bits, rank


@dataclass
class GeoSide:
    """What the geo rows of a partition say about each of their MAFIDs (see the module docstring).

    Attributes:
        index: The distinct MAFIDs of geo rows with a valid MAFID.
        rows: Geo rows per MAFID.
        kept: Geo rows per MAFID that the state filter keeps.
        first: Row (in file order) of each MAFID's first geo row.
        state: State index of each MAFID for the tables, or ``NOT_TABULATED``.
        set_aside: Geo rows the state filter set aside (any MAFID, valid or not).
    """

    index: KeyIndex
    rows: npt.NDArray[np.int32]
    kept: npt.NDArray[np.int32]
    first: npt.NDArray[np.int64]
    state: npt.NDArray[np.uint8]
    set_aside: int

    def __post_init__(self) -> None:
        self.aside = (self.rows > 0) & (self.kept == 0)
        """MAFIDs whose every geo row is set aside: their units and persons are set aside too."""
        self.any_aside = bool(self.aside.any())


def state_indices(states: Sequence[str]) -> npt.NDArray[np.uint8]:
    """State code (0..99) -> index into ``states``, or ``NOT_TABULATED``."""
    if len(states) >= NOT_TABULATED:
        raise ValueError("too many states")
    table = np.full(256, NOT_TABULATED, dtype=np.uint8)
    for i, code in enumerate(states):
        table[int(code)] = i
    return table


def geo_side(mafid: npt.NDArray[np.integer], mafid_ok: npt.NDArray[np.bool_] | None,
             rtype: npt.NDArray[np.integer], rtype_ok: npt.NDArray[np.bool_] | None,
             state: npt.NDArray[np.integer], state_ok: npt.NDArray[np.bool_] | None,
             states: Sequence[str] | None, *, expected_lookups: int = 0) -> GeoSide:
    """Summarise geo per MAFID.

    Args:
        mafid, rtype, state: Geo's MAFID, RTYPE and TABBLKST (compact; meaningless where the
            matching ``*_ok`` mask is False).
        mafid_ok, rtype_ok, state_ok: Rows whose value is valid (None: every row).
        states: The released states (sorted), or None: no state filter (validation of a config
            without a usable ``state_filter``) -- every row is kept, none is tabulated.
        expected_lookups: Units and persons to be looked up (chooses the look-up method).
    """
    n = len(mafid)
    index_of_state = state_indices(states or ())
    code = np.where(state_ok, state, 0) if state_ok is not None else state
    geo_state = index_of_state[code.astype(np.intp)] if n else np.empty(0, np.uint8)
    if states is None:
        kept_row = np.ones(n, dtype=bool)
    else:
        # A TABBLKST that is not a valid code cannot be placed outside the filter: kept (and reported).
        kept_row = geo_state != NOT_TABULATED
        if state_ok is not None:
            kept_row |= ~state_ok
    set_aside = int(n - np.count_nonzero(kept_row))
    rows = np.flatnonzero(mafid_ok) if mafid_ok is not None else np.arange(n)
    m = mafid[rows]
    if _is_sorted(m):  # extracts sorted by MAFID: keys, counts and first rows from the runs
        sorted_rows = rows
        sorted_m = m
    else:
        order = np.argsort(m, kind="stable")
        sorted_rows = rows[order]
        sorted_m = m[order]
    new = np.empty(len(sorted_m), dtype=bool)
    new[:1] = True
    np.not_equal(sorted_m[1:], sorted_m[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    keys = sorted_m[starts]
    index = KeyIndex(keys, expected_lookups)
    counts = np.diff(np.append(starts, len(sorted_m))).astype(np.int32)
    kept_sorted = kept_row[sorted_rows]
    kept = (np.add.reduceat(kept_sorted.view(np.int8), starts, dtype=np.int32) if len(starts)
            else np.zeros(0, np.int32))
    # The first row of each key in file order: a stable sort keeps equal MAFIDs in file order.
    first = sorted_rows[starts].astype(np.int64)
    single = counts == 1
    hu = rtype[first] == RTYPE_UNIT_HU
    if rtype_ok is not None:
        hu &= rtype_ok[first]
    key_state = np.where(single & hu, geo_state[first], NOT_TABULATED).astype(np.uint8)
    if states is None:
        key_state[:] = NOT_TABULATED
    return GeoSide(index, counts, kept, first, key_state, set_aside)


class MafidBits:
    """One bit per possible MAFID (100 MB): a set of MAFIDs of any size in constant memory."""

    def __init__(self) -> None:
        self.bits = np.zeros(((MAFID_MAX - MAFID_MIN) >> 3) + 1, dtype=np.uint8)

    def add(self, mafids: npt.NDArray[np.integer]) -> int:
        """Add valid MAFIDs; return how many of them were in the set already."""
        if not len(mafids):
            return 0
        offset = mafids.astype(np.int64) - MAFID_MIN
        if not _is_sorted(offset):
            offset.sort()
        byte = offset >> 3
        bit = np.left_shift(np.uint8(1), (offset & 7).astype(np.uint8))
        again = int(np.count_nonzero(self.bits[byte] & bit))
        # Bits of one byte are or-ed together first: sorted offsets make them neighbours.
        starts = np.flatnonzero(np.concatenate([[True], byte[1:] != byte[:-1]]))
        self.bits[byte[starts]] |= np.bitwise_or.reduceat(bit, starts)
        return again

    def contains(self, mafids: npt.NDArray[np.integer]) -> npt.NDArray[np.bool_]:
        """Whether each valid MAFID is in the set."""
        offset = mafids.astype(np.int64) - MAFID_MIN
        return ((self.bits[offset >> 3] >> (offset & 7).astype(np.uint8)) & 1).astype(bool)


class AsideMafids:
    """The MAFIDs whose every geo row the state filter sets aside, over a partition that is
    streamed rather than held (see :mod:`phsafe.intake.spill`): their units and persons are set aside
    as they are read, exactly as :class:`Joiner` sets them aside from a partition's :class:`GeoSide`.

    Geo's set-aside rows are added as they stream (:meth:`add_aside`); once geo is read, the
    MAFIDs that also have a kept geo row (a MAFID listed twice in geo, in and outside the filter)
    are taken out (:meth:`add_kept`). Memory: one bit per possible MAFID, only when a row is set
    aside at all.
    """

    def __init__(self) -> None:
        self._aside: MafidBits | None = None
        self._kept: MafidBits | None = None
        self.set_aside = {"units": 0, "persons": 0}

    @property
    def any(self) -> bool:
        return self._aside is not None

    def add_aside(self, mafids: npt.NDArray[np.integer]) -> None:
        """Valid MAFIDs of geo rows the state filter sets aside."""
        if len(mafids):
            if self._aside is None:
                self._aside = MafidBits()
            self._aside.add(mafids)

    def add_kept(self, mafids: npt.NDArray[np.integer]) -> None:
        """Valid MAFIDs of geo rows the state filter keeps (after every set-aside row is added)."""
        if self._aside is None or not len(mafids):
            return
        both = mafids[self._aside.contains(mafids)]
        if len(both):
            if self._kept is None:
                self._kept = MafidBits()
            self._kept.add(both)

    def _filter(self, stem: str, mafid: npt.NDArray[np.integer], ok: npt.NDArray[np.bool_] | None
                ) -> npt.NDArray[np.bool_] | None:
        if self._aside is None or not len(mafid):
            return None
        valid = ok if ok is not None else np.ones(len(mafid), dtype=bool)
        aside = np.zeros(len(mafid), dtype=bool)
        aside[valid] = self._aside.contains(mafid[valid])
        if self._kept is not None and aside.any():
            hit = np.flatnonzero(aside)
            aside[hit[self._kept.contains(mafid[hit])]] = False
        n = int(np.count_nonzero(aside))
        if not n:
            return None
        self.set_aside[stem] += n
        return ~aside

    def units(self, mafid: npt.NDArray[np.integer], ok: npt.NDArray[np.bool_] | None
              ) -> npt.NDArray[np.bool_] | None:
        """The rows of a batch of units that are kept (None: every row)."""
        return self._filter("units", mafid, ok)

    def persons(self, mafid: npt.NDArray[np.integer], ok: npt.NDArray[np.bool_] | None
                ) -> tuple[npt.NDArray[np.bool_] | None, None]:
        """The rows of a batch of persons that are kept (None: every row); no keys (they are
        found when the bucket is joined)."""
        return self._filter("persons", mafid, ok), None


@dataclass
class Join:
    """The MAFID join of one partition's kept records (see the module docstring).

    Keys ``0 .. len(geo.index) - 1`` are geo's MAFIDs; the others are MAFIDs only units have.

    Attributes:
        geo: What geo says about each of its MAFIDs.
        extra: Sorted MAFIDs of kept units that geo does not have.
        unit_key: Key of each kept unit row (-1: its MAFID is not valid).
        person_key: Key of each kept person (-1: MAFID not valid, or neither in geo nor units).
        unit_rows: Kept unit rows per key.
        unit_first: First kept unit row of each key (-1: none).
    """

    geo: GeoSide
    extra: KeyIndex
    unit_key: npt.NDArray[np.int32]
    person_key: npt.NDArray[np.int32]
    unit_rows: npt.NDArray[np.int32]
    unit_first: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        self.n_keys = len(self.geo.index) + len(self.extra)
        self.mafid = np.concatenate([self.geo.index.keys, self.extra.keys])
        """The MAFID of each key."""
        self.state = np.concatenate([self.geo.state, np.full(len(self.extra), NOT_TABULATED, np.uint8)])
        """State index of each key (keys only units have are never tabulated)."""


class Joiner:
    """Builds a partition's :class:`Join` while its units, then its persons, stream in.

    Units and persons batches are looked up as they are read, so that the rows the state filter
    sets aside are dropped before anything else is done with them. Call :meth:`units` for every
    batch of units, then :meth:`persons` for every batch of persons, then :meth:`finish`.
    """

    def __init__(self, geo: GeoSide) -> None:
        self.geo = geo
        self._unit_keys: list[npt.NDArray[np.int32]] = []
        # Valid unit MAFIDs geo does not have: (batch number, rows, MAFIDs); keyed once all are in.
        self._orphans: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int32]]] = []
        self._extra: KeyIndex | None = None
        self.set_aside = {"units": 0, "persons": 0}

    def units(self, mafid: npt.NDArray[np.integer], ok: npt.NDArray[np.bool_] | None
              ) -> npt.NDArray[np.bool_] | None:
        """Look up a batch of units; return the rows kept (None: every row)."""
        keep, key = self._filter("units", mafid, ok)
        m = mafid if keep is None else mafid[keep]
        valid = ok if keep is None or ok is None else ok[keep]
        orphan = key < 0 if valid is None else (key < 0) & valid
        if orphan.any():
            rows = np.flatnonzero(orphan)
            self._orphans.append((len(self._unit_keys), rows, m[rows].astype(np.int32)))
        self._unit_keys.append(key)
        return keep

    def persons(self, mafid: npt.NDArray[np.integer], ok: npt.NDArray[np.bool_] | None
                ) -> tuple[npt.NDArray[np.bool_] | None, npt.NDArray[np.int32]]:
        """Look up a batch of persons (after every unit): (rows kept -- None for all --, the key
        of each kept row, -1 for none)."""
        extra = self._extra_index()
        keep, key = self._filter("persons", mafid, ok)
        missing = np.flatnonzero(key < 0)
        if len(missing) and len(extra):
            m = mafid if keep is None else mafid[keep]
            found = extra.lookup(m[missing])
            if ok is not None:
                found[~(ok if keep is None else ok[keep])[missing]] = -1
            hit = found >= 0
            key[missing[hit]] = found[hit] + len(self.geo.index)
        return keep, key

    def _filter(self, stem: str, mafid: npt.NDArray[np.integer], ok: npt.NDArray[np.bool_] | None
                ) -> tuple[npt.NDArray[np.bool_] | None, npt.NDArray[np.int32]]:
        key = self.geo.index.lookup(mafid)
        if ok is not None:
            key[~ok] = -1
        aside_keys = self.geo.aside
        if self.geo.any_aside:
            found = np.flatnonzero(key >= 0)
            aside = np.zeros(len(key), dtype=bool)
            aside[found] = aside_keys[key[found]]
            n = int(np.count_nonzero(aside))
            if n:
                self.set_aside[stem] += n
                keep = ~aside
                return keep, key[keep]
        return None, key

    def _extra_index(self) -> KeyIndex:
        if self._extra is None:
            mafids = [m for _, _, m in self._orphans]
            self._extra = KeyIndex(sorted_distinct(np.concatenate(mafids)) if mafids else np.empty(0, np.int32))
            for batch, rows, m in self._orphans:
                self._unit_keys[batch][rows] = self._extra.lookup(m) + len(self.geo.index)
            self._orphans.clear()
        return self._extra

    def finish(self, person_keys: Sequence[npt.NDArray[np.int32]]) -> Join:
        """The join, given the key of every kept person (from :meth:`persons`, in order)."""
        extra = self._extra_index()
        unit_key = np.concatenate(self._unit_keys) if self._unit_keys else np.empty(0, np.int32)
        self._unit_keys.clear()
        person_key = np.concatenate(list(person_keys)) if len(person_keys) else np.empty(0, np.int32)
        self.geo.index.release()
        extra.release()
        return _join(self.geo, extra, unit_key, person_key)


def _join(geo: GeoSide, extra: KeyIndex, unit_key: npt.NDArray[np.int32],
          person_key: npt.NDArray[np.int32]) -> Join:
    n_keys = len(geo.index) + len(extra)
    valid = unit_key >= 0
    rows = np.flatnonzero(valid)
    keys = unit_key[rows]
    unit_rows = np.bincount(keys, minlength=n_keys).astype(np.int32)
    unit_first = np.full(n_keys, -1, dtype=np.int64)
    unit_first[keys[::-1]] = rows[::-1]
    return Join(geo, extra, unit_key, person_key, unit_rows, unit_first)


def join_all(geo: Columns, units: Columns, persons: Columns, states: Sequence[str]) -> tuple[Join, Columns, Columns]:
    """The join of whole, valid compact columns (see :class:`Joiner`): (join, kept units, kept
    persons)."""
    side = geo_side(geo["MAFID"], None, geo["RTYPE"], None, geo["TABBLKST"], None, states,
                    expected_lookups=len(units["MAFID"]) + len(persons["MAFID"]))
    joiner = Joiner(side)
    keep_u = joiner.units(units["MAFID"], None)
    kept_units = units if keep_u is None else {k: v[keep_u] for k, v in units.items()}
    keep_p, person_key = joiner.persons(persons["MAFID"], None)
    kept_persons = persons if keep_p is None else {k: v[keep_p] for k, v in persons.items()}
    return joiner.finish([person_key]), kept_units, kept_persons


@dataclass
class PreparedData:
    """The records a partition's tables are counted from, each with its state and MAFID key.

    Attributes:
        states: Released state codes (sorted); state indices point into it.
        units: Kept unit columns, file order.
        unit_state: State index of each unit, or ``NOT_TABULATED``.
        persons: Kept person columns, file order.
        person_state: State index of each person's MAFID, or ``NOT_TABULATED``.
        unit_key: MAFID key of each unit (-1: none).
        person_key: MAFID key of each person (-1: none).
        n_keys: Number of keys.
    """

    states: tuple[str, ...]
    units: Columns
    unit_state: npt.NDArray[np.uint8]
    persons: Columns
    person_state: npt.NDArray[np.uint8]
    unit_key: npt.NDArray[np.int32]
    person_key: npt.NDArray[np.int32]
    n_keys: int


def prepared(join: Join, units: Columns, persons: Columns, states: tuple[str, ...], *,
             require_geo: str | None = None) -> PreparedData:
    """Tag each kept record with its state for the tables.

    Args:
        require_geo: If given (the name of the data partition, for messages), every person and
            unit must have a geo row in the partition -- as they do when the data is stored by
            state and each record is in its state's partition. Without it a record with no geo
            row is simply not tabulated (spec §4).

    Raises:
        InputError: ``require_geo`` is given and a person or unit has no geo row.
    """
    key_state = np.concatenate([join.state, [NOT_TABULATED]])  # key -1 reads the last entry
    unit_state = key_state[join.unit_key]
    person_state = key_state[join.person_key]
    if require_geo is not None:
        has_geo = np.concatenate([join.geo.rows > 0, np.zeros(len(join.extra) + 1, dtype=bool)])
        for stem, key in (("units", join.unit_key), ("persons", join.person_key)):
            n = int(np.count_nonzero(~has_geo[key]))
            if n:
                raise InputError(
                    f"{stem} ({require_geo})", "MAFID",
                    "every record is stored in the partition of its unit's state: this MAFID has no "
                    "geo row in the same partition", rows=n)
    return PreparedData(states, units, unit_state, persons, person_state, join.unit_key, join.person_key,
                        join.n_keys)


def prepare(inputs: InputTables, states: tuple[str, ...], *, require_geo: str | None = None) -> PreparedData:
    """Apply the state filter and the geography rules to whole compact columns (see :func:`prepared`)."""
    join, units, persons = join_all(inputs.geo, inputs.units, inputs.persons, states)
    return prepared(join, units, persons, states, require_geo=require_geo)


@dataclass
class Partition:
    """The tabulated records of one MAFID range, grouped by MAFID.

    Attributes:
        units: Unit columns.
        unit_state: State index (into the run's states) of each unit row.
        unit_group: MAFID group of each unit row (rows sharing a MAFID share a group).
        persons: Person columns of the tabulated persons.
        person_group: MAFID group of each person.
        n_groups: Number of MAFID groups.
    """

    units: Columns
    unit_state: npt.NDArray[np.uint8]
    unit_group: npt.NDArray[np.int64]
    persons: Columns
    person_group: npt.NDArray[np.int64]
    n_groups: int


def _take(cols: Columns, index: npt.NDArray[np.integer] | slice) -> Columns:
    return {k: v[index] for k, v in cols.items()}


MAX_PERSONS_PER_PARTITION = 2_000_000
"""Persons tabulated at once: small enough that a range's MAFID groups stay in the CPU caches."""


def partitions(data: PreparedData, max_persons: int = MAX_PERSONS_PER_PARTITION) -> Iterator[Partition]:
    """Yield the tabulated records by ranges of MAFID keys, about ``max_persons`` persons at a time.

    Records join on their key, so a range of keys holds whole MAFIDs. Each record's range is
    found once (a division of its key); each range then takes its rows with one pass over those
    bytes, so the cost grows with the records, not records x ranges.
    """
    n_persons = int(np.count_nonzero(data.person_state != NOT_TABULATED))
    n_ranges = max(1, -(-n_persons // max_persons))
    if n_ranges == 1:
        yield _partition(data, np.flatnonzero(data.unit_state != NOT_TABULATED),
                         np.flatnonzero(data.person_state != NOT_TABULATED), 0, data.n_keys)
        return
    width = max(1, -(-data.n_keys // n_ranges))
    # Each record's range (n_ranges: not tabulated), then the records grouped by range with one
    # stable sort of those small numbers -- a radix sort, linear in the records.
    unit_order, unit_bounds = _by_range(data.unit_key, data.unit_state, width, n_ranges)
    person_order, person_bounds = _by_range(data.person_key, data.person_state, width, n_ranges)
    for r in range(n_ranges):
        u = unit_order[unit_bounds[r]:unit_bounds[r + 1]]
        p = person_order[person_bounds[r]:person_bounds[r + 1]]
        lo = r * width
        yield _partition(data, u, p, lo, min(data.n_keys, lo + width))


def _by_range(key: npt.NDArray[np.int32], state: npt.NDArray[np.uint8], width: int, n_ranges: int
              ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Rows ordered by key range (tabulated rows only; int32), and each range's bounds."""
    dtype = np.uint8 if n_ranges < 255 else np.uint16 if n_ranges < 65535 else np.uint32
    ranges = (key // width).astype(dtype)
    ranges[state == NOT_TABULATED] = n_ranges
    order = np.argsort(ranges, kind="stable").astype(np.int32)
    bounds = np.searchsorted(ranges[order], np.arange(n_ranges + 1))
    return order, bounds


def _partition(data: PreparedData, unit_rows: npt.NDArray[np.int64], person_rows: npt.NDArray[np.int64],
               lo: int, hi: int) -> Partition:
    return Partition(
        units=_take(data.units, unit_rows),
        unit_state=data.unit_state[unit_rows],
        unit_group=data.unit_key[unit_rows].astype(np.int64) - lo,
        persons=_take(data.persons, person_rows),
        person_group=data.person_key[person_rows].astype(np.int64) - lo,
        n_groups=max(0, hi - lo),
    )
