"""The eleven output tables (spec §7), written and published atomically.

Private tables hold one row per cell of the full domain of every measured level, with
``NOISE_DISTRIBUTION`` and ``VARIANCE``. Non-private (ground-truth) tables, for synthetic data
only, hold basis and aggregate cells over the full domain, without the noise columns.

Publication (:func:`publish_release`): the release is assembled in a folder of its own (for a
private run, in its confidential work folder), the manifest (SHA-256 of every file) is written
last, the whole is copied into a hidden sibling of the output folder and fsynced, and that
sibling is renamed into place -- a crash never leaves a half-written folder under the published
name, and a failure (no space, no permission) leaves nothing published and the assembled release
intact for another try.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from phsafe import durable
from phsafe.accounting import PlannedMeasurement, RunPlan
from phsafe.config import PHSafeConfig
from phsafe.datapackage import DATAPACKAGE, write_datapackage
from phsafe.domain import measurement_domain
from phsafe.errors import OutputExistsError, PHSafeError, os_reason
from phsafe.reader import file_digest
from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES, TABLES, TableSpec, output_spec
from phsafe.tabulate import TableCounts

CSV_SEPARATOR = "|"
MANIFEST = "manifest.json"


def cell_column(table: str) -> str:
    return f"{table.upper()}_DATA_CELL"


def private_columns(table: str) -> list[str]:
    """Columns of a private output table, in order (spec §7)."""
    cols = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", cell_column(table), "COUNT",
            "NOISE_DISTRIBUTION", "VARIANCE"]
    if not output_spec(table).has_iteration_column:
        cols.remove("ITERATION_CODE")
    return cols


def nonprivate_columns(table: str) -> list[str]:
    return private_columns(table)[:-2]


def _finish(frame: pd.DataFrame, table: str, columns: list[str]) -> pd.DataFrame:
    frame = frame.rename(columns={"CELL": cell_column(table)})
    return frame[columns].reset_index(drop=True)


def private_tables(
    config: PHSafeConfig, plan: RunPlan, noisy: Mapping[str, np.ndarray]
) -> dict[str, pd.DataFrame]:
    """Private output tables from the noisy vectors (keyed by measurement key)."""
    out: dict[str, pd.DataFrame] = {}
    for table in OUTPUT_TABLES:
        if table in TABLES:
            spec, source, mapping = TABLES[table], table, None
        else:
            derived = DERIVED_TABLES[table]
            spec, source, mapping = TABLES[derived.source], derived.source, derived.cells
        parts = []
        for m in plan.for_table(source):
            parts.append(_private_level(config, spec, m, noisy[m.key], mapping))
        if parts:
            out[table] = _finish(pd.concat(parts), table, private_columns(table))
    return out


def _private_level(
    config: PHSafeConfig,
    spec: TableSpec,
    m: PlannedMeasurement,
    values: np.ndarray,
    mapping: tuple[tuple[int, tuple[int, ...]], ...] | None,
) -> pd.DataFrame:
    domain = measurement_domain(spec, m.level, config)
    cube = np.asarray(values, dtype=np.int64).reshape(domain.shape)
    variance = np.full(domain.shape, m.variance)
    if mapping is not None:  # derived table: sum source cells (counts and variances alike)
        position = {n: i for i, n in enumerate(spec.basis_numbers)}
        cube = np.stack([cube[..., [position[s] for s in srcs]].sum(-1) for _, srcs in mapping], -1)
        variance = np.stack([variance[..., [position[s] for s in srcs]].sum(-1) for _, srcs in mapping], -1)
        domain = measurement_domain(spec, m.level, config, cells=tuple(n for n, _ in mapping))
    frame = domain.frame()
    frame["COUNT"] = cube.ravel()
    frame["NOISE_DISTRIBUTION"] = m.distribution.value
    frame["VARIANCE"] = variance.ravel()
    return frame


def nonprivate_tables(config: PHSafeConfig, counts: Mapping[str, TableCounts]) -> dict[str, pd.DataFrame]:
    """Ground-truth tables: basis and aggregate cells, every released level of each table that
    has a positive budget at that level."""
    out: dict[str, pd.DataFrame] = {}
    for table in OUTPUT_TABLES:
        spec = output_spec(table)
        budget_table = table if table in TABLES else DERIVED_TABLES[table].source
        parts = []
        for level in config.measured_levels(budget_table):
            state_cube = counts[table].by_level[level.iteration]
            cube = state_cube if level.geography.value == "STATE" else state_cube.sum(0, keepdims=True)
            cells = spec.nonprivate_cells
            position = {n: i for i, n in enumerate(spec.basis_numbers)}
            aggregates = dict(spec.aggregates)
            full = np.stack(
                [cube[..., [position[s] for s in aggregates.get(n, (n,))]].sum(-1) for n in cells], -1
            )
            domain = measurement_domain(spec, level, config, cells=cells)
            assert domain.shape == full.shape, (table, level)
            frame = domain.frame()
            frame["COUNT"] = full.ravel()
            parts.append(frame)
        if parts:
            out[table] = _finish(pd.concat(parts), table, nonprivate_columns(table))
    return out


def write_tables(frames: Mapping[str, pd.DataFrame], directory: Path, *, plan: RunPlan | None = None) -> dict[str, str]:
    """Write each table as ``<T>/<T>.csv`` (``|``-separated) and ``parquet/<T>.parquet``, and
    their labelled description ``datapackage.json`` (:mod:`phsafe.datapackage`; a private
    release's ``plan`` says which sensitivity bound its noise was calibrated to).

    Returns:
        Relative path -> SHA-256 of every file written.
    """
    digests: dict[str, str] = {}
    for table, frame in frames.items():
        csv_path = directory / table / f"{table}.csv"
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(csv_path, sep=CSV_SEPARATOR, index=False, lineterminator="\n")
        pq_path = directory / "parquet" / f"{table}.parquet"
        pq_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), pq_path)
        for p in (csv_path, pq_path):
            durable.fsync_file(p)
            digests[p.relative_to(directory).as_posix()] = file_digest(p)
    if frames:  # the labelled Frictionless descriptor of these tables (public, in the manifest)
        package = write_datapackage(directory, frames, plan=plan)
        durable.fsync_file(package)
        digests[package.relative_to(directory).as_posix()] = file_digest(package)
    return digests


@dataclass
class Publication:
    """An output folder being written: a hidden sibling, renamed into place on publish."""

    target: Path
    staging: Path

    @staticmethod
    def staging_path(target: Path, run_id: str) -> Path:
        """The hidden sibling of ``target`` where run ``run_id`` stages its outputs."""
        target = Path(target).absolute()
        return target.parent / f".{target.name}.partial-{run_id}"

    @classmethod
    def begin(cls, target: Path, run_id: str) -> "Publication":
        """Make the hidden sibling (a stale one of the same run, from a crash, is replaced)."""
        target = Path(target).absolute()
        if target.exists():
            raise OutputExistsError(f"output directory {target} already exists; choose a new one")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = cls.staging_path(target, run_id)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        return cls(target, staging)

    def publish(self) -> Path:
        """Atomically rename the staging directory to the target."""
        for sub in sorted(self.staging.rglob("*"), reverse=True):
            if sub.is_dir():
                durable.fsync_folder(sub)
        durable.fsync_folder(self.staging)
        if self.target.exists():
            raise OutputExistsError(f"output directory {self.target} appeared during the run")
        os.rename(self.staging, self.target)
        durable.fsync_folder(self.target.parent)
        return self.target

    def abandon(self) -> None:
        """Remove the staging directory after a failure (nothing was published)."""
        shutil.rmtree(self.staging, ignore_errors=True)


def _copy_tree(source: Path, destination: Path) -> None:
    """Copy every file of ``source`` into ``destination`` (which exists), fsyncing each."""
    for path in sorted(source.rglob("*")):
        target = destination / path.relative_to(source)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            durable.fsync_file(target)


def public_files(directory: Path) -> list[str]:
    """Every file of ``directory`` as a relative path, after checking that each is one the public
    zone may hold: an output table (``<TABLE>/<TABLE>.csv``, ``parquet/<TABLE>.parquet``), the
    data package and the manifest.

    Raises:
        PHSafeError: Anything else is there (a validation report, a noisy vector, a log, a key):
            it is not published.
    """
    allowed = {f"{t}/{t}.csv" for t in OUTPUT_TABLES} | {f"parquet/{t}.parquet" for t in OUTPUT_TABLES}
    allowed |= {DATAPACKAGE, MANIFEST}
    stray = release_strays(Path(directory), allowed)
    if stray:
        raise PHSafeError(f"the release folder holds {stray}, which is not a public file (tables, data package, "
                          "manifest): nothing was published")
    return sorted(p.relative_to(directory).as_posix() for p in Path(directory).rglob("*") if not p.is_dir())


def release_strays(directory: Path, allowed: set[str]) -> str | None:
    """The first entry of ``directory`` (relative path) that is not one of the ``allowed`` regular
    files: any other file, a symbolic link, a device or pipe, or a folder holding none of them.
    None when the folder holds exactly allowed files (in their folders)."""
    directory = Path(directory)
    for root, folders, files in os.walk(directory, followlinks=False):
        here = Path(root)
        for name in sorted(folders):
            if (here / name).is_symlink():
                return (here / name).relative_to(directory).as_posix()
        for name in sorted(files):
            path = here / name
            rel = path.relative_to(directory).as_posix()
            if rel not in allowed or path.is_symlink() or not path.is_file():
                return rel
        if here != directory and not any(a.startswith(here.relative_to(directory).as_posix() + "/") for a in allowed):
            return here.relative_to(directory).as_posix() + "/"
    return None


def publish_release(release: Path, target: Path, run_id: str, manifest: dict, *, move: bool = False) -> str:
    """Write ``manifest`` into the assembled ``release`` and publish it as ``target``.

    The release is copied into the hidden sibling ``.<target>.partial-<run_id>`` (or, with
    ``move``, ``release`` is that sibling already), everything is fsynced, and the sibling is
    renamed to ``target``. On failure nothing is published, the sibling is removed, and
    ``release`` is left as it was.

    Returns:
        The SHA-256 of the manifest file.

    Raises:
        OutputExistsError: ``target`` exists (a release is never overwritten).
        PHSafeError: The release holds a file that is not public (see :func:`public_files`), or
            could not be written there (no space, no permission), naming the cause.
    """
    target = Path(target).absolute()
    path = Path(release) / MANIFEST
    public_files(Path(release))  # the public zone holds the tables and what describes them, only
    # Written in place (the release folder is a staging copy): a temporary file left by a crash
    # here would be copied into the published folder on the next attempt.
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    durable.fsync_file(path)
    digest = file_digest(path)
    publication = Publication(target, Path(release)) if move else None
    try:
        if publication is None:
            publication = Publication.begin(target, run_id)
            _copy_tree(Path(release), publication.staging)
        publication.publish()
    except OutputExistsError:
        if publication is not None and not move:
            publication.abandon()
        raise
    except OSError as exc:
        if publication is not None and not move:
            publication.abandon()
        raise PHSafeError(f"cannot publish the release to {target}: {os_reason(exc)}; nothing was published") from None
    return digest
