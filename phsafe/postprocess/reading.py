"""Reading the estimates back, labelled like a release (:func:`phsafe.read_estimates`).

The codes stay codes, as in :func:`phsafe.release.read_release`: ``GEOID``/``REGION_ID``,
``REGION_TYPE`` and ``ITERATION_CODE`` are ordered categoricals in release order (the nation,
then the states by FIPS code; ``*``, ``A`` ... ``I``), cells are integers, and with labels each
coded column is followed by ``<COLUMN>_LABEL``. The labels come from the table definitions in
code -- the same source as every release's ``datapackage.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from phsafe.datapackage import REGION_NAMES
from phsafe.domain import USA_REGION_ID
from phsafe.iterations import ITERATION_LABELS, GeographyLevel
from phsafe.outputs import CSV_SEPARATOR
from phsafe.postprocess.census import read_file
from phsafe.postprocess.command import POSTPROCESS_METADATA
from phsafe.postprocess.shells import COUNT_SHELLS, ESTIMATE_TABLES, RATIO_SHELLS
from phsafe.reader import file_digest
from phsafe.release import LABEL_SUFFIX, ReleaseError
from phsafe.schema import STATE_NAMES
from phsafe.tables import OUTPUT_TABLES, output_spec

REGION_ORDER = [USA_REGION_ID, *sorted(STATE_NAMES)]
REGION_TYPE_LABELS = {g.value: g.label for g in GeographyLevel}
_COUNT_INTEGERS = ("PRED", "PRED_LO", "PRED_HI")


def _cell_labels(table: str) -> dict[int, str]:
    """Cell labels of an estimate table (a ratio table's are its numerator's)."""
    source = RATIO_SHELLS[table].numerator if table in RATIO_SHELLS else table
    return dict(output_spec(source).cell_labels)


def _coded(frame: pd.DataFrame, column: str, order: list, labels: dict, with_labels: bool) -> None:
    """Make ``column`` an ordered categorical (codes in ``order``) and insert its label column."""
    values = frame[column]
    unknown = set(values.dropna()) - set(order)
    if unknown:
        raise ReleaseError(f"{column}: value(s) without a label: {sorted(map(str, unknown))}")
    present = [v for v in order if v in set(values)]
    frame[column] = values.astype(pd.CategoricalDtype(present, ordered=True))
    if with_labels:
        label_order = list(dict.fromkeys(labels[v] for v in present))
        position = frame.columns.get_loc(column) + 1
        frame.insert(position, column + LABEL_SUFFIX,
                     values.map(labels).astype(pd.CategoricalDtype(label_order, ordered=True)))


def _verified(root: Path, rel: str, listed: dict | None) -> Path:
    path = root / rel
    if listed is not None and rel in listed and listed[rel] != file_digest(path):
        raise ReleaseError(f"{root}: {rel} differs from its SHA-256 in {POSTPROCESS_METADATA}; the folder was modified")
    return path


def _label(frame: pd.DataFrame, table: str, region: str, cell: str, labels: bool) -> pd.DataFrame:
    frame = frame.copy()
    _coded(frame, region, REGION_ORDER, REGION_NAMES, labels)
    _coded(frame, "REGION_TYPE", list(REGION_TYPE_LABELS), REGION_TYPE_LABELS, labels)
    if "ITERATION_CODE" in frame:
        _coded(frame, "ITERATION_CODE", list(ITERATION_LABELS), ITERATION_LABELS, labels)
    frame[cell] = frame[cell].astype(np.int64)
    if labels:
        cell_labels = _cell_labels(table)
        frame.insert(frame.columns.get_loc(cell) + 1, cell + LABEL_SUFFIX,
                     frame[cell].map(cell_labels).astype(pd.CategoricalDtype(
                         [cell_labels[c] for c in sorted(cell_labels)], ordered=True)))
    return frame.reset_index(drop=True)


def read_estimates(root: Path, *, files: str = "census", labels: bool = True,
                   verify: bool = True) -> dict[str, pd.DataFrame]:
    """See :func:`phsafe.api.read_estimates`."""
    root = Path(root)
    meta_path = root / POSTPROCESS_METADATA
    if not meta_path.is_file():
        raise ReleaseError(f"{root} is not a post-processing folder (no {POSTPROCESS_METADATA})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ReleaseError(f"{meta_path}: not valid JSON") from None
    listed = meta.get("files") if verify else None
    out: dict[str, pd.DataFrame] = {}
    if files == "census":
        by_table: dict[str, list[pd.DataFrame]] = {}
        for rel in meta.get("estimate_files", []):
            table = rel.split("/", 1)[0]
            by_table.setdefault(table, []).append(read_file(_verified(root, rel, listed)))
        for table in ESTIMATE_TABLES:
            if table not in by_table:
                continue
            frame = pd.concat(by_table[table], ignore_index=True)
            if table in COUNT_SHELLS:
                for column in _COUNT_INTEGERS:
                    frame[column] = frame[column].round().astype("Int64")
            out[table] = _label(frame, table, "GEOID", "DATA_CELL", labels)
        return out
    if files != "ours":
        raise ValueError('files must be "census" or "ours"')
    for table in (*OUTPUT_TABLES, *RATIO_SHELLS):
        rel = f"{table}.parquet"
        if (root / rel).is_file():
            frame = pd.read_parquet(_verified(root, rel, listed))
        elif (root / f"{table}.csv").is_file():
            frame = pd.read_csv(_verified(root, f"{table}.csv", listed), sep=CSV_SEPARATOR,
                                dtype={"REGION_ID": str, "ITERATION_CODE": str}, keep_default_na=False,
                                na_values=[""])
        else:
            continue
        frame["REGION_ID"] = frame["REGION_ID"].astype(str)
        out[table] = _label(frame, table, "REGION_ID", f"{table.upper()}_DATA_CELL" if table not in RATIO_SHELLS
                            else f"{table}_DATA_CELL", labels)
    return out
