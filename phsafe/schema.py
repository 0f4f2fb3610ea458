"""Input files, their columns and code lists (spec §1), as data.

The reader, the validation suites and the synthetic-data generator all take their facts from
here. Code columns are strings of a fixed width that keep their leading zeros; the engine stores
them compactly as the unsigned integer they spell (``"09"`` -> 9) once their exact string form
has been checked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class ColumnKind(enum.Enum):
    CODE = "code"  # fixed-width string of digits, leading zeros significant
    INTEGER = "integer"  # decimal integer


@dataclass(frozen=True)
class Column:
    """One input column.

    Attributes:
        name: Column name as in the header.
        kind: Code (fixed-width digit string) or integer.
        width: Exact string width of a code column.
        allowed: Allowed values (integers; for codes, the integer the code spells), or None.
        minimum: Smallest allowed value of a range-checked column.
        maximum: Largest allowed value of a range-checked column.
        dtype: Compact numpy dtype the engine keeps the column in, or None if the engine does
            not keep it.
    """

    name: str
    kind: ColumnKind
    width: int | None = None
    allowed: frozenset[int] | None = None
    minimum: int | None = None
    maximum: int | None = None
    dtype: type | None = None

    def allowed_strings(self) -> list[str] | None:
        """The allowed values as the strings that spell them in the files."""
        if self.allowed is None:
            return None
        if self.kind is ColumnKind.CODE:
            assert self.width is not None
            return sorted(f"{v:0{self.width}d}" for v in self.allowed)
        return sorted(str(v) for v in self.allowed)


def _code(name: str, width: int, allowed: range | set[int] | None, dtype: type | None = np.uint8) -> Column:
    return Column(name, ColumnKind.CODE, width=width,
                  allowed=frozenset(allowed) if allowed is not None else None, dtype=dtype)


def _int(name: str, lo: int, hi: int, dtype: type | None, allowed: set[int] | None = None) -> Column:
    return Column(name, ColumnKind.INTEGER, minimum=lo, maximum=hi,
                  allowed=frozenset(allowed) if allowed is not None else None, dtype=dtype)


MAFID_MIN, MAFID_MAX = 100_000_001, 900_000_000
_MAFID = _int("MAFID", MAFID_MIN, MAFID_MAX, np.int32)

PERSONS: tuple[Column, ...] = (
    _code("RTYPE", 1, {3, 5}),
    _MAFID,
    _int("QAGE", 0, 115, np.uint8),
    _int("CENHISP", 1, 2, np.uint8, {1, 2}),
    _code("CENRACE", 2, range(1, 64)),
    _code("RELSHIP", 2, range(20, 39)),
)
UNITS: tuple[Column, ...] = (
    _code("RTYPE", 1, {2, 4}),
    _MAFID,
    _int("FINAL_POP", 0, 100_000, np.uint32),
    _int("NPF", 0, 97, np.uint8, {0, *range(2, 98)}),
    _int("HHSPAN", 0, 2, np.uint8, {0, 1, 2}),
    _code("HHRACE", 2, range(0, 64)),
    _code("TEN", 1, range(0, 5)),
    _code("HHT", 1, range(0, 8)),
    _code("HHT2", 2, range(0, 13)),
    _code("CPLT", 1, range(0, 6)),
)
GEO: tuple[Column, ...] = (
    _code("RTYPE", 1, {2, 4}),
    _MAFID,
    _code("TABBLKST", 2, None),  # checked against the state filter instead
    _code("TABBLKCOU", 3, None, dtype=None),
    _code("TABTRACTCE", 6, None, dtype=None),
    _code("TABBLK", 4, None, dtype=None),
    _code("TABBLKGRPCE", 1, None, dtype=None),
    _code("REGIONCE", 1, {1, 2, 3, 4, 9}, dtype=None),
    _code("DIVISIONCE", 1, None, dtype=None),
    _code("PLACEFP", 5, None, dtype=None),
    _code("AIANNHCE", 4, None, dtype=None),
)

FILES: dict[str, tuple[Column, ...]] = {"persons": PERSONS, "units": UNITS, "geo": GEO}
"""Input file stem -> columns in their required order."""

# Code values used by table definitions and rules (spec §1).
RTYPE_PERSON_HU, RTYPE_PERSON_GQ = 3, 5
RTYPE_UNIT_HU, RTYPE_UNIT_GQ = 2, 4
RELSHIP_HOUSEHOLDER = 20
RELSHIP_OWN_CHILD = (25, 26, 27)
RELSHIP_GQ = (37, 38)
HHT_NOT_IN_UNIVERSE = 0
HHT_FAMILY = (1, 2, 3)

# Valid state FIPS codes for state_filter (spec §2): 01-56 except 03, 07, 14, 43, 52; 72 is PR.
PUERTO_RICO = "72"
STATE_CODES: frozenset[str] = frozenset(
    f"{c:02d}" for c in range(1, 57) if c not in {3, 7, 14, 43, 52}
)

STATE_NAMES: dict[str, str] = {
    "01": "Alabama", "02": "Alaska", "04": "Arizona", "05": "Arkansas", "06": "California",
    "08": "Colorado", "09": "Connecticut", "10": "Delaware", "11": "District of Columbia",
    "12": "Florida", "13": "Georgia", "15": "Hawaii", "16": "Idaho", "17": "Illinois",
    "18": "Indiana", "19": "Iowa", "20": "Kansas", "21": "Kentucky", "22": "Louisiana",
    "23": "Maine", "24": "Maryland", "25": "Massachusetts", "26": "Michigan", "27": "Minnesota",
    "28": "Mississippi", "29": "Missouri", "30": "Montana", "31": "Nebraska", "32": "Nevada",
    "33": "New Hampshire", "34": "New Jersey", "35": "New Mexico", "36": "New York",
    "37": "North Carolina", "38": "North Dakota", "39": "Ohio", "40": "Oklahoma", "41": "Oregon",
    "42": "Pennsylvania", "44": "Rhode Island", "45": "South Carolina", "46": "South Dakota",
    "47": "Tennessee", "48": "Texas", "49": "Utah", "50": "Vermont", "51": "Virginia",
    "53": "Washington", "54": "West Virginia", "55": "Wisconsin", "56": "Wyoming",
    PUERTO_RICO: "Puerto Rico",
}
"""State FIPS code -> name (public: ANSI/FIPS state codes), for labelled outputs."""
