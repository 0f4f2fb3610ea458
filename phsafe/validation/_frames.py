"""Frames the suites are evaluated on: typed batches of the files, and derived cross-file frames.

Per-file frames keep every code column as the exact text of the file, so ``"1"`` is not ``"01"``;
integer columns are parsed strictly from their digits (anything else becomes null, which the
suite's not-null rule reports).

Cross-file rules are evaluated on *derived* frames built from compact columns (a MAFID as
``int32``, a code as the small integer it spells, ``-1`` where the value broke a per-file rule):

* ``persons_in_units`` -- each person next to the unit with its MAFID, built batch by batch
  against a sorted index of units (a binary search per person, no hash join in memory);
* ``households`` -- each household with its number of householders, counted over all batches;
* ``units_geo`` -- each MAFID of units or geo with its number of rows in each and both RTYPEs.

A value that broke a per-file rule is null in the derived frames (and a household holding a person
with such a RELSHIP has an unknown number of householders), so it is reported once, by the
per-file rule, and not again by every cross-file rule it touches. A row that could not be read
at all makes the cross-file rules of its file unchecked (the report says so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from phsafe.schema import (
    FILES,
    MAFID_MAX,
    MAFID_MIN,
    RELSHIP_HOUSEHOLDER,
    RTYPE_UNIT_HU,
    Column,
    ColumnKind,
)
from phsafe.validation._read import STATE_COLUMN

INVALID = -1
_DIGITS = r"^[0-9]{1,18}$"

# Compact columns kept per file for the cross-file rules.
COMPACT_COLUMNS: dict[str, tuple[str, ...]] = {
    "persons": ("MAFID", "RTYPE", "RELSHIP", "QAGE"),
    "units": ("MAFID", "RTYPE", "HHT", "HHT2"),
    "geo": ("MAFID", "RTYPE"),
}


def _column(stem: str, name: str) -> Column:
    return next(c for c in FILES[stem] if c.name == name)


def parse_integers(arr: pa.Array) -> pa.Array:
    """int64 values of an integer column; null where the text is not a plain whole number."""
    if pa.types.is_integer(arr.type):
        return arr.cast(pa.int64())
    digits = pc.match_substring_regex(arr, _DIGITS)
    return pc.if_else(digits, arr, pa.scalar(None, pa.string())).cast(pa.int64())


def file_frame(batch: pa.RecordBatch, stem: str, header: list[str], *, whole_header: bool = False) -> pd.DataFrame:
    """The per-file suite's frame of one batch: schema columns in header order, typed.

    Args:
        whole_header: Keep every column of the header, in order, so the header rule can be
            evaluated on the frame too: a column the schema does not know is all null (its
            values are never read).
    """
    kinds = {c.name: c.kind for c in FILES[stem]}
    data: dict[str, pd.Series] = {}
    for name in header:
        if name not in kinds:
            if whole_header:
                data[name] = pd.Series(np.full(batch.num_rows, np.nan))
            continue
        arr = batch.column(batch.schema.get_field_index(name))
        if kinds[name] is ColumnKind.CODE:
            data[name] = arr.to_pandas()
        else:
            # float64 with NaN for null: exact for these ranges, and GX's range rule is
            # vectorised only for numpy int/float columns (nullable Int64 takes a Python loop).
            data[name] = parse_integers(arr).to_pandas().astype("float64")
    return pd.DataFrame(data)


def header_frame(header: list[str]) -> pd.DataFrame:
    """A zero-row frame with the file's header: what the header rule is evaluated on."""
    return pd.DataFrame({name: pd.Series([], dtype="str") for name in header}, columns=header)


def compact(batch: pa.RecordBatch, stem: str) -> dict[str, npt.NDArray[np.int32]]:
    """The compact columns of one batch (``INVALID`` where a value broke its per-file rule),
    and ``STATE`` -- the state of the row's folder -- for input stored by state."""
    out: dict[str, npt.NDArray[np.int32]] = {}
    if STATE_COLUMN in batch.schema.names:
        out["STATE"] = batch.column(batch.schema.get_field_index(STATE_COLUMN)).to_numpy().astype(np.int32)
    for name in COMPACT_COLUMNS[stem]:
        c = _column(stem, name)
        arr = batch.column(batch.schema.get_field_index(name))
        if c.kind is ColumnKind.CODE:
            assert c.allowed is not None and c.width is not None
            ints = sorted(c.allowed)
            codes = pa.array([f"{v:0{c.width}d}" for v in ints])
            idx = pc.index_in(arr, value_set=codes).fill_null(INVALID).to_numpy(zero_copy_only=False)
            lookup = np.array(ints + [INVALID], dtype=np.int32)  # index -1 -> INVALID
            out[name] = lookup[idx]
        else:
            values = parse_integers(arr).fill_null(INVALID).to_numpy(zero_copy_only=False)
            lo, hi = (MAFID_MIN, MAFID_MAX) if name == "MAFID" else (c.minimum, c.maximum)
            ok = (values >= lo) & (values <= hi)
            out[name] = np.where(ok, values, INVALID).astype(np.int32)
    return out


def _nullable(values: npt.NDArray[np.integer]) -> npt.NDArray[np.float64]:
    """Compact values with INVALID as NaN (see file_frame on why float64)."""
    values = np.asarray(values)
    return np.where(values == INVALID, np.nan, values).astype(np.float64)


@dataclass
class CompactColumns:
    """Compact columns of one file, gathered batch by batch."""

    parts: dict[str, list[npt.NDArray[np.int32]]] = field(default_factory=dict)

    def add(self, columns: dict[str, npt.NDArray[np.int32]]) -> None:
        for k, v in columns.items():
            self.parts.setdefault(k, []).append(v)

    def get(self, name: str) -> npt.NDArray[np.int32]:
        parts = self.parts.get(name, [])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)


_BOOLEAN_COLUMNS = frozenset({"IN_UNITS"})


def _as_frame(columns: dict[str, npt.NDArray[np.integer]]) -> pd.DataFrame:
    return pd.DataFrame({
        name: values.astype(bool) if name in _BOOLEAN_COLUMNS else _nullable(values)
        for name, values in columns.items()
    })


def sorted_distinct(values: npt.NDArray[np.integer]) -> npt.NDArray[np.integer]:
    """The distinct values of ``values``, sorted.

    ``np.unique`` without ``return_*`` takes a hash-based path in numpy 2.x that is some 50
    times slower than sorting on arrays of millions of MAFIDs (0.7 s against 0.01 s for half a
    million, measured with numpy 2.4); a sort and a comparison of neighbours is all it takes.
    """
    s = np.sort(values)
    if s.size == 0:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


_SMALL_MAX = 254
"""Largest value :func:`small_int_frames` packs (8 bits a column, ``INVALID`` included)."""


def clipped_count(counts: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Row counts capped at 254, so they pack as small integers.

    Every rule on a count compares it with 0 or 1 (``UNITS_ROWS``, ``GEO_ROWS``,
    ``HOUSEHOLDERS``), so a count of 300 and one of 254 get the same verdict.
    """
    return np.minimum(np.asarray(counts, dtype=np.int64), _SMALL_MAX)


def small_int_frames(
    columns: dict[str, npt.NDArray[np.integer]],
) -> tuple[pd.DataFrame, Callable[[], pd.DataFrame]]:
    """The distinct rows of compact columns as a frame, and a builder of the frame of every row.

    Every value is a small integer (``INVALID`` .. 254), so a row packs into one int64 key, 8
    bits a column, and ``np.unique`` of the keys finds the distinct rows far faster than a
    dataframe would.
    """
    names = list(columns)
    assert len(names) <= 8
    key = np.zeros(len(columns[names[0]]) if names else 0, dtype=np.int64)
    for name in names:
        values = np.asarray(columns[name], dtype=np.int64)
        assert values.size == 0 or (values.min() >= INVALID and values.max() <= _SMALL_MAX), name
        key = (key << 8) | (values + 1)
    unique = sorted_distinct(key)
    distinct: dict[str, npt.NDArray[np.int64]] = {}
    for shift, name in zip(range(8 * (len(names) - 1), -1, -8), names, strict=True):
        distinct[name] = ((unique >> shift) & 0xFF) - 1
    return _as_frame(distinct), lambda: _as_frame(columns)


_STATE_SHIFT = 30  # MAFIDs are below 2**30


def join_keys(columns: "CompactColumns | dict[str, npt.NDArray[np.int32]]") -> npt.NDArray[np.int64]:
    """Each row's MAFID, made unique per state for input stored by state (``INVALID`` stays).

    Records of different states' folders never join: the counting reads each state's folders
    on their own, so a person whose unit is stored under another state has no unit there.
    """
    get = columns.get if isinstance(columns, CompactColumns) else columns.__getitem__
    mafid = np.asarray(get("MAFID"), dtype=np.int64)
    has_state = "STATE" in (columns.parts if isinstance(columns, CompactColumns) else columns)
    if not has_state:
        return mafid
    state = np.asarray(get("STATE"), dtype=np.int64)
    return np.where(mafid == INVALID, INVALID, (state << _STATE_SHIFT) | mafid)


class UnitIndex:
    """Units sorted by join key (MAFID, within its state for input stored by state; see
    :func:`join_keys`) for binary-search joins; the first row of a repeated key wins."""

    def __init__(self, units: CompactColumns) -> None:
        mafid = join_keys(units)
        self.rtype = units.get("RTYPE")
        self.hht = units.get("HHT")
        self.hht2 = units.get("HHT2")
        valid = np.flatnonzero(mafid != INVALID)
        order = valid[np.argsort(mafid[valid], kind="stable")]
        self.sorted_mafid = mafid[order]
        self.row_of_sorted = order
        first = np.ones(len(order), dtype=bool)
        first[1:] = self.sorted_mafid[1:] != self.sorted_mafid[:-1]
        self.first_rows = order[first]  # one row per distinct MAFID
        self.householders = np.zeros(len(mafid), dtype=np.int64)
        # Persons whose RELSHIP broke a per-file rule, per unit: their households' householder
        # counts are unknown (null), not a second failure of the same value.
        self.unknown_relship = np.zeros(len(mafid), dtype=np.int64)

    def lookup(self, mafid: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Row of units holding each join key (its first row), or -1 (see :func:`join_keys`)."""
        if len(self.sorted_mafid) == 0:
            return np.full(len(mafid), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.sorted_mafid, mafid), len(self.sorted_mafid) - 1)
        found = (self.sorted_mafid[pos] == mafid) & (mafid != INVALID)
        return np.where(found, self.row_of_sorted[pos], -1).astype(np.int64)

    def persons_in_units(self, persons: dict[str, npt.NDArray[np.int32]]) -> dict[str, npt.NDArray[np.int32]]:
        """The ``persons_in_units`` columns of one slice of persons; counts its householders.

        Returns compact columns (``INVALID`` for null); see :func:`small_int_frames`.
        """
        keep = persons["MAFID"] != INVALID  # a bad MAFID is reported by persons.MAFID rules
        row = self.lookup(join_keys(persons)[keep])
        relship = persons["RELSHIP"][keep]
        found = row >= 0
        n_units = len(self.householders)
        self.householders += np.bincount(row[found & (relship == RELSHIP_HOUSEHOLDER)], minlength=n_units)
        self.unknown_relship += np.bincount(row[found & (relship == INVALID)], minlength=n_units)

        def unit(values: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
            if not len(values):
                return np.full(len(row), INVALID, dtype=np.int32)
            return np.where(found, values[np.maximum(row, 0)], INVALID).astype(np.int32)

        return {
            "IN_UNITS": found.astype(np.int32),
            "RTYPE": persons["RTYPE"][keep].astype(np.int32),
            "RELSHIP": relship.astype(np.int32),
            "QAGE": persons["QAGE"][keep].astype(np.int32),
            "UNIT_RTYPE": unit(self.rtype),
            "UNIT_HHT": unit(self.hht),
            "UNIT_HHT2": unit(self.hht2),
        }

    def households(self) -> tuple[pd.DataFrame, Callable[[], pd.DataFrame]]:
        """The ``households`` frame: one row per household (first row of its MAFID), as
        distinct rows and a builder of every row (see :func:`small_int_frames`)."""
        rows = self.first_rows
        is_household = (self.rtype[rows] == RTYPE_UNIT_HU) & (self.hht[rows] > 0)
        rows = rows[is_household]
        counts = np.where(self.unknown_relship[rows] > 0, INVALID, clipped_count(self.householders[rows]))
        return small_int_frames({"HOUSEHOLDERS": counts})


def units_geo(units: CompactColumns, geo: CompactColumns) -> tuple[pd.DataFrame, Callable[[], pd.DataFrame]]:
    """The ``units_geo`` frame: one row per distinct valid MAFID of units or geo, as distinct
    rows and a builder of every row (see :func:`small_int_frames`)."""

    def counted(cols: CompactColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mafid = join_keys(cols)
        valid = np.flatnonzero(mafid != INVALID)
        ids, first, counts = np.unique(mafid[valid], return_index=True, return_counts=True)
        return ids, cols.get("RTYPE")[valid[first]], counts

    u_ids, u_rtype, u_counts = counted(units)
    g_ids, g_rtype, g_counts = counted(geo)
    ids = sorted_distinct(np.concatenate([u_ids, g_ids]))

    def spread(keys: np.ndarray, values: np.ndarray, missing: int) -> np.ndarray:
        out = np.full(len(ids), missing, dtype=np.int64)
        out[np.searchsorted(ids, keys)] = values
        return out

    return small_int_frames(
        {
            "UNITS_ROWS": spread(u_ids, clipped_count(u_counts), 0),
            "GEO_ROWS": spread(g_ids, clipped_count(g_counts), 0),
            "UNIT_RTYPE": spread(u_ids, u_rtype, INVALID),
            "GEO_RTYPE": spread(g_ids, g_rtype, INVALID),
        }
    )
