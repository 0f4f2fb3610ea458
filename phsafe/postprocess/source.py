"""Reading a private output directory -- and nothing else.

Pure post-processing (paper, §6.5): everything in :mod:`phsafe.postprocess` is computed from the
*published* private tables alone -- the noisy ``COUNT``, the ``NOISE_DISTRIBUTION`` and the
``VARIANCE`` of each cell -- and the public facts of the release's ``manifest.json`` (the
truncation thresholds tau of the run's config, the state filter, the sensitivity bound its noise
was calibrated to), never from the input data, so it costs no privacy-loss budget. The
``VARIANCE`` of every measured cell must be the sigma^2 its manifest's budget and sensitivity
imply (Delta^2 / (2 rho), Delta exact: an integer or ``"sqrt(N)"``). :func:`read_private_outputs` opens only files under the output
directory it is given, and checks each table's digest against the manifest.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from phsafe.accounting import NoiseDistribution
from phsafe.outputs import CSV_SEPARATOR, MANIFEST, cell_column, private_columns
from phsafe.postprocess._base import PostprocessError
from phsafe.reader import file_digest
from phsafe.sensitivity import squared
from phsafe.tables import OUTPUT_TABLES


def _inside(path: Path, root: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise PostprocessError(f"{path} is outside the output directory")
    return resolved


def read_private_outputs(output_dir: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    """Read the private tables of ``output_dir``; open nothing outside it.

    The digest of every table read is checked against ``manifest.json`` when the manifest lists
    it. Tables are read from ``<TABLE>/<TABLE>.csv`` (spec §7).

    Returns:
        Table name -> frame, and facts about the source: run id, privacy definition, digests of
        the files read, and from the manifest the config's ``tau`` (table -> threshold),
        ``state_filter`` and ``sensitivity`` (the bound: ``"paper"`` or ``"exact"``; None
        without a manifest).

    Raises:
        PostprocessError: Not a directory, no private table, bad columns or values, or a digest
            that disagrees with the manifest.
    """
    root = Path(output_dir).resolve()
    if not root.is_dir():
        raise PostprocessError(f"output directory {output_dir} does not exist")
    manifest: dict = {}
    manifest_path = root / MANIFEST
    if manifest_path.is_file():
        try:
            manifest = json.loads(_inside(manifest_path, root).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise PostprocessError(f"{MANIFEST} is not valid JSON") from None
        if manifest.get("mode") == "non-private":
            raise PostprocessError(f"{output_dir} holds non-private tables; post-processing needs private outputs")
    listed = manifest.get("files", {}) if isinstance(manifest.get("files"), dict) else {}
    tables: dict[str, pd.DataFrame] = {}
    digests: dict[str, str] = {}
    for table in OUTPUT_TABLES:
        rel = f"{table}/{table}.csv"
        path = root / rel
        if not path.is_file():
            continue
        path = _inside(path, root)
        digest = file_digest(path)
        if rel in listed and listed[rel] != digest:
            raise PostprocessError(f"{rel}: SHA-256 differs from {MANIFEST}; the outputs were modified")
        digests[rel] = digest
        tables[table] = _read_private_csv(path, table)
    if not tables:
        raise PostprocessError(f"{output_dir} holds no private output table (<TABLE>/<TABLE>.csv)")
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    tau = config.get("tau") if isinstance(config.get("tau"), dict) else None
    if manifest:
        _check_variances(manifest, tables)
    return tables, {"run_id": manifest.get("run_id"), "privacy_defn": manifest.get("privacy_defn"),
                    "manifest": manifest_path.is_file(), "files": digests,
                    "tau": {str(k): int(v) for k, v in tau.items()} if tau else None,
                    "state_filter": list(config.get("state_filter", [])) or None,
                    # Releases written before the key existed were calibrated to the paper's bound.
                    "sensitivity": str(config.get("sensitivity", "paper")) if manifest else None}


_LEVEL_OF_CODE = {"*": "*", **{c: "A-G" for c in "ABCDEFG"}, "H": "H,I", "I": "H,I"}


def _check_variances(manifest: dict, tables: dict[str, pd.DataFrame]) -> None:
    """Every measured level's VARIANCE is what the manifest's budget and sensitivity imply."""
    if manifest.get("privacy_defn") != "zcdp" or not isinstance(manifest.get("measurements"), list):
        return
    for m in manifest["measurements"]:
        try:
            table, level, budget = m["table"], m["level"], Fraction(str(m["budget"]))
            if budget <= 0:
                raise ValueError
            sigma2 = float(Fraction(squared(m["sensitivity"])) / (2 * budget))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue  # an Infinity budget (no noise) or a malformed entry: the auditors' concern
        if m.get("variance") != sigma2:
            raise PostprocessError(f"{MANIFEST}: the variance of {table}/{level} is not the Delta^2 / (2 rho) of its "
                                   f"budget and sensitivity {m['sensitivity']!r}")
        frame = tables.get(table)
        if frame is None:
            continue
        rows = (frame["REGION_TYPE"].str.lower() + "_" + frame["ITERATION_CODE"].map(_LEVEL_OF_CODE)) == level
        if rows.any() and not (frame.loc[rows, "VARIANCE"] == sigma2).all():
            raise PostprocessError(f"{table}: VARIANCE of {level} is not the manifest's sigma^2 for sensitivity "
                                   f"{m['sensitivity']!r}")


def _read_private_csv(path: Path, table: str) -> pd.DataFrame:
    columns = private_columns(table)
    with open(path, "r", encoding="utf-8", newline="") as fh:
        frame = pd.read_csv(fh, sep=CSV_SEPARATOR, dtype=str, keep_default_na=False)
    if list(frame.columns) != columns:
        if "NOISE_DISTRIBUTION" not in frame.columns:
            raise PostprocessError(f"{table}: no NOISE_DISTRIBUTION/VARIANCE columns -- not a private output")
        raise PostprocessError(f"{table}: columns {list(frame.columns)} are not the private columns {columns}")
    try:
        frame[cell_column(table)] = frame[cell_column(table)].astype(np.int64)
        frame["COUNT"] = frame["COUNT"].astype(np.int64)
        frame["VARIANCE"] = frame["VARIANCE"].astype(np.float64)
    except (ValueError, OverflowError):
        raise PostprocessError(f"{table}: COUNT, VARIANCE or the cell column is not numeric") from None
    known = {d.value for d in NoiseDistribution}
    if not frame["NOISE_DISTRIBUTION"].isin(known).all():
        raise PostprocessError(f"{table}: NOISE_DISTRIBUTION must be one of {sorted(known)}")
    var = frame["VARIANCE"].to_numpy()
    if not (np.isfinite(var) & (var >= 0)).all():
        raise PostprocessError(f"{table}: VARIANCE must be finite and non-negative")
    if "ITERATION_CODE" not in frame.columns:
        frame.insert(2, "ITERATION_CODE", "*")
        frame.attrs["iteration_column"] = False
    return frame
