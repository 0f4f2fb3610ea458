"""Read a published release (or a non-private tabulation) into labelled pandas frames.

    >>> import phsafe
    >>> tables = phsafe.read_release("OUT")               # doctest: +SKIP
    >>> ph3 = tables["PH3"]
    >>> ph3[(ph3.REGION_TYPE == "STATE") & (ph3.ITERATION_CODE == "*")]

How the codes are given (the choice, and why):

* the code columns keep their codes, so filters and joins written against the CSV files and the
  spec (``REGION_ID == "06"``, ``PH3_DATA_CELL == 4``) work unchanged. ``REGION_ID``,
  ``REGION_TYPE``, ``ITERATION_CODE`` and ``NOISE_DISTRIBUTION`` are *ordered categoricals*
  whose categories are the package's values in release order (the nation, then the states by
  FIPS code; ``*``, ``A`` ... ``I``), so ``sort_values`` and ``groupby`` follow the tables'
  order; the cell column is ``int64``, ``COUNT`` ``int64``, ``VARIANCE`` ``float64``;
* with ``labels=True`` (the default) each coded column except ``NOISE_DISTRIBUTION`` is
  followed by ``<COLUMN>_LABEL``, an ordered categorical of its labels (``REGION_ID_LABEL`` =
  "California", ``ITERATION_CODE_LABEL`` = "Asian alone", ``PH3_DATA_CELL_LABEL`` = "Own child:
  in married couple family"). ``NOISE_DISTRIBUTION``'s labels are explanations, read them from
  ``datapackage.json``.

Labels come from the release's own ``datapackage.json`` (:mod:`phsafe.datapackage`); a folder
written before data packages existed is labelled from the table definitions in code. Tables are
read from the Parquet copies (``OUT/parquet/<TABLE>.parquet``), or from the CSV files when a
folder has no Parquet. When the folder has a ``manifest.json``, the SHA-256 of every file read
is checked against it first (``verify=False`` skips this).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from phsafe.datapackage import (
    CSV_SEPARATOR,
    DATAPACKAGE,
    cell_column,
    is_private,
    package_descriptor,
    resource_name,
)
from phsafe.errors import ReleaseError
from phsafe.reader import file_digest
from phsafe.tables import OUTPUT_TABLES

MANIFEST = "manifest.json"
LABEL_SUFFIX = "_LABEL"
_UNLABELLED = ("NOISE_DISTRIBUTION",)


def _manifest_files(root: Path) -> dict[str, str] | None:
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ReleaseError(f"{path}: not valid JSON") from None
    files = manifest.get("files")
    return files if isinstance(files, dict) else {}


def _check(root: Path, rel: str, listed: Mapping[str, str] | None) -> Path:
    path = root / rel
    if listed is not None and rel in listed and listed[rel] != file_digest(path):
        raise ReleaseError(f"{root}: {rel} differs from its SHA-256 in {MANIFEST}; the release was modified")
    return path


def _read_raw(root: Path, table: str, listed: Mapping[str, str] | None) -> pd.DataFrame | None:
    parquet, csv = f"parquet/{table}.parquet", f"{table}/{table}.csv"
    if (root / parquet).is_file():
        return pd.read_parquet(_check(root, parquet, listed))
    if (root / csv).is_file():
        return pd.read_csv(_check(root, csv, listed), sep=CSV_SEPARATOR, dtype=str, keep_default_na=False)
    return None


def _fields(descriptor: Mapping[str, Any], table: str) -> list[dict[str, Any]]:
    for resource in descriptor.get("resources", []):
        if resource.get("name") in (resource_name(table, "parquet"), resource_name(table, "csv")):
            return list(resource["schema"]["fields"])
    raise ReleaseError(f"{DATAPACKAGE} does not describe {table}")


def _typed(frame: pd.DataFrame, fields: list[dict[str, Any]], table: str, labels: bool) -> pd.DataFrame:
    names = [f["name"] for f in fields]
    if list(frame.columns) != names:
        raise ReleaseError(f"{table}: columns {list(frame.columns)} differ from {DATAPACKAGE}'s {names}")
    out: dict[str, pd.Series] = {}
    for f in fields:
        name, column = f["name"], frame[f["name"]]
        try:
            if f["type"] == "integer":
                column = column.astype("int64")
            elif f["type"] == "number":
                column = column.astype("float64")
            else:
                column = column.astype(str)
        except (TypeError, ValueError):
            raise ReleaseError(f"{table}: column {name} is not of type {f['type']}") from None
        categories = f.get("categories")
        if categories and f["type"] == "string":
            values = [c["value"] for c in categories]
            if not column.isin(values).all():
                raise ReleaseError(f"{table}: column {name} holds a value its {DATAPACKAGE} does not list")
            column = column.astype(pd.CategoricalDtype(values, ordered=True))
        out[name] = column.reset_index(drop=True)
        if labels and categories and name not in _UNLABELLED:
            mapping = {c["value"]: c["label"] for c in categories}
            label_order = list(dict.fromkeys(c["label"] for c in categories))
            mapped = column.astype(object).map(mapping)
            if mapped.isna().any():
                raise ReleaseError(f"{table}: column {name} holds a value its {DATAPACKAGE} does not label")
            out[name + LABEL_SUFFIX] = mapped.astype(pd.CategoricalDtype(label_order, ordered=True)).reset_index(drop=True)
    return pd.DataFrame(out)


def read_tables(directory: str | Path, *, labels: bool = True, verify: bool = True) -> dict[str, pd.DataFrame]:
    """Read every output table of a PHSafe output folder, private or non-private, typed and labelled.

    Args:
        directory: An output folder (``OUT`` of ``phsafe private`` or ``phsafe non-private``).
        labels: Add a ``<COLUMN>_LABEL`` column after each coded column (see the module docstring).
        verify: Check the SHA-256 of every file read against ``manifest.json`` when there is one.

    Returns:
        Table name -> frame, in release order (PH1_num ... PH8_denom), for the tables present.

    Raises:
        ReleaseError: Not a folder, no table in it, a file that differs from its manifest
            digest, or columns and values that do not match the data package.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ReleaseError(f"{root} is not a folder")
    listed = _manifest_files(root) if verify else None
    raw = {t: f for t in OUTPUT_TABLES if (f := _read_raw(root, t, listed)) is not None}
    if not raw:
        raise ReleaseError(f"{root} holds no output table (parquet/<TABLE>.parquet or <TABLE>/<TABLE>.csv)")
    if (root / DATAPACKAGE).is_file():
        descriptor = json.loads(_check(root, DATAPACKAGE, listed).read_text(encoding="utf-8"))
    else:  # written before data packages: the same labels, from the table definitions in code
        descriptor = package_descriptor({t: _plain(f) for t, f in raw.items()})
    return {t: _typed(f, _fields(descriptor, t), t, labels) for t, f in raw.items()}


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame read from CSV as strings, with the integer columns the descriptor builder needs."""
    frame = frame.copy()
    for column in frame.columns:
        if column.endswith("_DATA_CELL"):
            frame[column] = frame[column].astype("int64")
    return frame


def read_release(out: str | Path, *, labels: bool = True, verify: bool = True) -> dict[str, pd.DataFrame]:
    """Read a published private release: table name -> typed, labelled frame.

    The same as :func:`read_tables`, for a private release only: each frame has the private
    columns (spec §7: ``REGION_ID``, ``REGION_TYPE``, ``ITERATION_CODE`` (not in PH2, PH6),
    ``<TABLE>_DATA_CELL``, ``COUNT``, ``NOISE_DISTRIBUTION``, ``VARIANCE``) and, with
    ``labels=True``, the label columns described in the module docstring.

    Raises:
        ReleaseError: See :func:`read_tables`; also when ``out`` holds non-private tables.
    """
    tables = read_tables(out, labels=labels, verify=verify)
    if not all(is_private(f) for f in tables.values()):
        raise ReleaseError(f"{out} holds non-private tables (no NOISE_DISTRIBUTION/VARIANCE); "
                           "read them with phsafe.release.read_tables")
    return tables


__all__ = ["ReleaseError", "cell_column", "read_release", "read_tables"]
