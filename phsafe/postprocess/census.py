"""The Census Bureau's estimate files: names, columns, row order and number format.

``MODEL_BASED_ESTIMATES.md`` §5 gives the production's 24 files, which we write with the same
names, columns, column order, row order and formatting, from our estimates
(:mod:`phsafe.postprocess.counts`, :mod:`phsafe.postprocess.ratios`), so that a reader of the
Census Bureau's files reads ours unchanged:

* ``PH<k>/estimates/PH<k>_<pr><level>_trunc_normal.csv`` -- ``<level>`` ``nation`` (REGION_TYPE
  USA) or ``state``, ``<pr>`` ``PR_`` for a Puerto Rico release. The names keep
  ``trunc_normal`` although the estimates come from the exact discrete likelihood: the name is
  what readers look for.
* R's ``write.table`` format: ``|``-separated, a header, header names and text values in double
  quotes, numbers unquoted with at most 15 significant digits and no trailing zeros, in
  scientific notation when that is shorter (a PRED of 100000 is ``1e+05``), missing values
  ``NA``, infinities ``Inf``/``-Inf``, 0/0 ``NaN`` (:func:`r_number`).
* Rows: count tables -- the built marginal rows first, in the table's group order, each group
  sorted by (REGION_ID, ITERATION_CODE), then the released rows in file order; PH1 and PH5 --
  the numerator rows in file order, then the built cell-1 rows; PH8 -- the denominator rows in
  file order, then the built cell-1 rows.

One departure, on purpose: the production parses REGION_ID as a number and pads it back to two
digits, so the nation's ``1`` becomes ``01``, the same GEOID as Alabama (the two are told apart
only by REGION_TYPE and the file name). We write the nation's GEOID as ``1``, the release's
REGION_ID; every state's GEOID is its two-digit FIPS code, as in the production.

Columns of our estimates in these files: ``PRED`` is the posterior mean rounded to an integer
(half to even, as R's ``round``), ``PRED_LO``/``PRED_HI`` the 90% equal-tailed interval (5% left
out on each side, as the production's); ``RATIO_PRED`` the posterior mean of the ratio,
``PRED_NUM``/``PRED_DENOM`` the posterior means of numerator and denominator,
``RATIO_PRED_LO``/``RATIO_PRED_HI`` the equal-tailed 90% interval of the ratio.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Mapping

import numpy as np
import pandas as pd

from phsafe.outputs import cell_column
from phsafe.postprocess._base import GROUP_KEYS
from phsafe.postprocess.shells import COUNT_SHELLS, ESTIMATE_TABLES, RATIO_SHELLS, marginal_cells

COUNT_FILE_COLUMNS = ("GEOID", "REGION_TYPE", "ITERATION_CODE", "DATA_CELL", "COUNT_NOISY", "VARIANCE", "MOE_NOISY",
                      "PRED", "PRED_LO", "PRED_HI")
SHARED_RATIO_FILE_COLUMNS = (
    "GEOID", "REGION_TYPE", "ITERATION_CODE", "DATA_CELL", "COUNT_NOISY_NUM", "VARIANCE_NUM", "MOE_NOISY_NUM",
    "COUNT_NOISY_DENOM", "VARIANCE_DENOM", "MOE_NOISY_DENOM", "RATIO_NOISY", "RATIO_PRED", "PRED_NUM", "PRED_DENOM",
    "RATIO_PRED_LO", "RATIO_PRED_HI",
)
OWN_RATIO_FILE_COLUMNS = (
    "GEOID", "REGION_TYPE", "ITERATION_CODE", "DATA_CELL", "COUNT_NOISY_DENOM", "VARIANCE_DENOM", "MOE_NOISY_DENOM",
    "COUNT_NOISY_NUM", "VARIANCE_NUM", "MOE_NOISY_NUM", "RATIO_NOISY", "RATIO_PRED", "RATIO_PRED_LO", "RATIO_PRED_HI",
)
FILE_COLUMNS: dict[str, tuple[str, ...]] = {
    **{t: COUNT_FILE_COLUMNS for t in COUNT_SHELLS},
    "PH1": SHARED_RATIO_FILE_COLUMNS, "PH5": SHARED_RATIO_FILE_COLUMNS, "PH8": OWN_RATIO_FILE_COLUMNS,
}
"""The columns of each table's files, in order (spec §5)."""
TEXT_COLUMNS = ("GEOID", "REGION_TYPE", "ITERATION_CODE")
INTEGER_COLUMNS = ("DATA_CELL", "PRED", "PRED_LO", "PRED_HI")
MOE_Z = NormalDist().inv_cdf(0.95)  # R's qnorm(0.95) = 1.644853626951472
LEVEL_NAMES = {"USA": "nation", "STATE": "state"}
PUERTO_RICO = "72"
SEPARATOR = "|"


def file_name(table: str, region_type: str, puerto_rico: bool) -> str:
    """``PH<k>/estimates/PH<k>_<pr><level>_trunc_normal.csv`` (spec §5)."""
    level = LEVEL_NAMES.get(region_type, region_type.lower())
    return f"{table}/estimates/{table}_{'PR_' if puerto_rico else ''}{level}_trunc_normal.csv"


def is_puerto_rico(frames: Mapping[str, pd.DataFrame]) -> bool:
    """A Puerto Rico release holds REGION_ID 72 only (spec §4: a separate run, no nation)."""
    regions = {str(r) for f in frames.values() for r in f["REGION_ID"].unique()}
    return regions == {PUERTO_RICO}


def _geoid(region_id: pd.Series) -> pd.Series:
    return region_id.astype(str)  # the release's REGION_ID: "1" (nation, our departure) or 2-digit FIPS


def _region_sort_key(frame: pd.DataFrame) -> list[str]:
    frame["_REGION_NUMBER"] = frame["REGION_ID"].astype(str).astype(int)  # R sorts the parsed number
    return ["_REGION_NUMBER", "ITERATION_CODE"]


def count_file_frame(table: str, estimates: pd.DataFrame) -> pd.DataFrame:
    """The Census layout of a count table (all levels) from :func:`~phsafe.postprocess.counts.count_estimates`."""
    cell = cell_column(table)
    built = estimates[estimates["MARGINAL"]].copy()
    parts = []
    for number, _ in marginal_cells(table):
        group = built[built[cell] == number].copy()
        parts.append(group.sort_values(_region_sort_key(group), kind="stable"))
    released = estimates[~estimates["MARGINAL"]].sort_values("SOURCE_ROW", kind="stable")
    rows = pd.concat([*parts, released], ignore_index=True)
    return pd.DataFrame({
        "GEOID": _geoid(rows["REGION_ID"]),
        "REGION_TYPE": rows["REGION_TYPE"].astype(str),
        "ITERATION_CODE": rows["ITERATION_CODE"].astype(str),
        "DATA_CELL": rows[cell].astype(np.int64),
        "COUNT_NOISY": rows["COUNT"].astype(np.float64),
        "VARIANCE": rows["VARIANCE"].astype(np.float64),
        "MOE_NOISY": MOE_Z * np.sqrt(rows["VARIANCE"].astype(np.float64)),
        "PRED": np.rint(rows["ESTIMATE"].astype(np.float64)),
        "PRED_LO": rows["CI90_ET_LOWER"].astype(np.float64),
        "PRED_HI": rows["CI90_ET_UPPER"].astype(np.float64),
    })


def ratio_file_frame(name: str, averages: pd.DataFrame, numerator: pd.DataFrame, denominator: pd.DataFrame) -> pd.DataFrame:
    """The Census layout of a ratio table (all levels) from :func:`~phsafe.postprocess.ratios.ratio_table`.

    Row order: PH1/PH5 -- the numerator file's rows (cells 2, 3) in its order, then the built
    cell-1 rows in the order of their groups (first appearance for PH1, sorted for PH5, as the
    production loops); PH8 -- the denominator file's rows, then the built cell-1 rows.
    """
    shell = RATIO_SHELLS[name]
    own_cell = f"{name}_DATA_CELL"
    file_order = denominator if not shell.shared_denominator else numerator
    order_cell = cell_column(shell.denominator if not shell.shared_denominator else shell.numerator)
    key = pd.DataFrame({k: file_order[k].astype(str) for k in GROUP_KEYS})
    key[own_cell] = file_order[order_cell].astype(np.int64).to_numpy()
    key["_ORDER"] = np.arange(len(key))
    avg = averages.copy()
    for k in GROUP_KEYS:
        avg[k] = avg[k].astype(str)
    parts_rows = avg[avg[own_cell] != 1].merge(key, on=[*GROUP_KEYS, own_cell], how="left")
    parts_rows = parts_rows.sort_values("_ORDER", kind="stable")
    totals = avg[avg[own_cell] == 1].copy()
    if name == "PH5":
        totals = totals.sort_values(_region_sort_key(totals), kind="stable")
    rows = pd.concat([parts_rows, totals], ignore_index=True)
    num, den = rows["COUNT_NOISY_NUM"].astype(np.float64), rows["COUNT_NOISY_DENOM"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio_noisy = num / den
    frame = pd.DataFrame({
        "GEOID": _geoid(rows["REGION_ID"]),
        "REGION_TYPE": rows["REGION_TYPE"].astype(str),
        "ITERATION_CODE": rows["ITERATION_CODE"].astype(str),
        "DATA_CELL": rows[own_cell].astype(np.int64),
        "COUNT_NOISY_NUM": num, "VARIANCE_NUM": rows["VARIANCE_NUM"].astype(np.float64),
        "MOE_NOISY_NUM": MOE_Z * np.sqrt(rows["VARIANCE_NUM"].astype(np.float64)),
        "COUNT_NOISY_DENOM": den, "VARIANCE_DENOM": rows["VARIANCE_DENOM"].astype(np.float64),
        "MOE_NOISY_DENOM": MOE_Z * np.sqrt(rows["VARIANCE_DENOM"].astype(np.float64)),
        "RATIO_NOISY": ratio_noisy,
        "RATIO_PRED": rows["ESTIMATE"].astype(np.float64),
        "PRED_NUM": rows["NUMERATOR_ESTIMATE"].astype(np.float64),
        "PRED_DENOM": rows["DENOMINATOR_ESTIMATE"].astype(np.float64),
        "RATIO_PRED_LO": rows["CI90_LOWER"].astype(np.float64),
        "RATIO_PRED_HI": rows["CI90_UPPER"].astype(np.float64),
    })
    return frame[list(FILE_COLUMNS[name])]


# --------------------------------------------------------------------------------------------
# R's write.table
# --------------------------------------------------------------------------------------------


def r_number(x: float) -> str:
    """A number as R's ``write.table`` writes it (15 significant digits, the shorter of fixed and
    scientific notation, fixed on a tie)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "NA"
    x = float(x)
    if math.isinf(x):
        return "Inf" if x > 0 else "-Inf"
    if x == 0:
        return "0"
    mantissa, exponent = f"{abs(x):.14e}".split("e")
    digits = mantissa.replace(".", "").rstrip("0") or "0"
    nsig = len(digits)
    kpower = int(exponent)
    neg = 1 if x < 0 else 0
    rgt = max(0, nsig - kpower - 1)
    left = kpower + 1 if kpower >= 0 else 1
    fixed_width = neg + left + (rgt + 1 if rgt > 0 else 0)
    sci_width = neg + (nsig + 1 if nsig > 1 else 1) + (4 if abs(kpower) < 100 else 5)
    if fixed_width <= sci_width:
        return f"{x:.{rgt}f}"
    return f"{x:.{nsig - 1}e}"


def r_table(frame: pd.DataFrame, text_columns: tuple[str, ...] = TEXT_COLUMNS) -> str:
    """The text R's ``write.table(frame, sep = "|", row.names = FALSE)`` writes."""
    lines = [SEPARATOR.join(f'"{c}"' for c in frame.columns)]
    columns = []
    for c in frame.columns:
        values = frame[c].tolist()
        if c in text_columns:
            columns.append(["NA" if v is None else f'"{v}"' for v in values])
        else:
            columns.append([r_number(v) for v in values])
    lines.extend(SEPARATOR.join(row) for row in zip(*columns))
    return "\n".join(lines) + "\n"


def write_files(frames: Mapping[str, pd.DataFrame], directory: Path, puerto_rico: bool) -> dict[str, pd.DataFrame]:
    """Write each table's frame as one file per level (REGION_TYPE, in order of appearance).

    Returns:
        Relative path -> the rows written.
    """
    written: dict[str, pd.DataFrame] = {}
    for table in ESTIMATE_TABLES:
        frame = frames.get(table)
        if frame is None:
            continue
        for region_type in frame["REGION_TYPE"].drop_duplicates():
            rows = frame[frame["REGION_TYPE"] == region_type].reset_index(drop=True)
            rel = file_name(table, region_type, puerto_rico)
            path = directory / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(r_table(rows), encoding="utf-8")
            written[rel] = rows
    return written


def read_file(path: Path) -> pd.DataFrame:
    """One estimate file back (ours or the Census Bureau's): codes as text, numbers as floats
    (``NA`` missing, ``Inf``/``NaN`` as such), ``DATA_CELL`` and count ``PRED*`` as integers when
    they are whole."""
    frame = pd.read_csv(path, sep=SEPARATOR, quotechar='"', dtype={c: str for c in TEXT_COLUMNS},
                        keep_default_na=False, na_values=["NA"])
    for column in frame.columns:
        if column in TEXT_COLUMNS:
            continue
        values = pd.to_numeric(frame[column].replace({"Inf": "inf", "-Inf": "-inf"}), errors="coerce")
        frame[column] = values.astype(np.float64)
    return frame
