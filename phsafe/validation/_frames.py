"""The frames Great Expectations evaluates, built from classes where they are evaluated.

A frame is sent to the evaluation as its columns' *classes* (compact integers, see
:class:`phsafe.reader.ClassBook`) and turned into the values validation sees only there -- in the
second process, when there is one: the integers travel in half the bytes of the values, and the
work is done on the core that is less busy.

Per-file frames keep every code column as the exact text of the file, so ``"1"`` is not ``"01"``;
integer columns are the number their digits spell, as float64 (exact for these ranges; Great
Expectations' range rule is vectorised only for numpy columns), NaN where the value is empty or
not a whole number written in digits. Derived (cross-file) frames hold small integers, NaN where a
value broke a per-file rule (so it is reported once, by that rule), and booleans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

CODE, INTEGER, DERIVED, FLAG = "code", "integer", "derived", "flag"


@dataclass(frozen=True)
class FrameColumn:
    """One column of a frame, as classes.

    Attributes:
        name: Column name.
        classes: One integer per row; the class is ``classes + offset``.
        offset: See ``classes``.
        kind: ``code`` or ``integer`` (a file's column; ``book`` names its classes), ``derived``
            (class ``v + 1`` is the value ``v``, class 0 is null) or ``flag`` (class 1 is False,
            2 is True).
        book: The column's :class:`~phsafe.reader.ClassBook` (file columns).
    """

    name: str
    classes: np.ndarray
    offset: int
    kind: str
    book: Any = None

    def series(self) -> Any:
        classes = self.classes.astype(np.int64)
        if self.offset:
            classes += self.offset
        if self.kind == CODE:
            return _code_texts(self.book, classes)
        if self.kind == INTEGER:
            return _integer_values(self.book, classes)
        if self.kind == FLAG:
            return classes == 2
        values = classes.astype(np.float64) - 1.0
        values[classes == 0] = np.nan
        return values


def frame(columns: Sequence[FrameColumn] | Any) -> pd.DataFrame:
    """The pandas frame of ``columns`` (a frame given as such is returned as it is)."""
    if isinstance(columns, pd.DataFrame):
        return columns
    return pd.DataFrame({c.name: c.series() for c in columns})


def _code_texts(book: Any, classes: np.ndarray) -> pd.Series:
    """The text of each class of a code column (None for empty)."""
    width = book.column.width
    if (classes < book.null_class).all():
        text = pc.utf8_lpad(pa.array(classes).cast(pa.string()), width=width, padding="0")
        return text.to_pandas()
    return pa.array([book.value(int(c)) for c in classes], pa.string()).to_pandas()


def _integer_values(book: Any, classes: np.ndarray) -> np.ndarray:
    """The number of each class of an integer column (NaN for null)."""
    out = classes.astype(np.float64) - 1.0
    out[classes == 0] = np.nan
    extra = classes >= book.first_extra
    if extra.any():
        out[extra] = [float(book.value(int(c))) for c in classes[extra]]
    return out
