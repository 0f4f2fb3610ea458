"""Released tables against a logged plan: the check both audits share.

``phsafe audit verify`` (the confidential audit, :mod:`phsafe.audit.verify`) and ``phsafe audit
public`` (the outsider's, :mod:`phsafe.audit.public`) read a release's tables the same way: every
released cell's VARIANCE and NOISE_DISTRIBUTION is exactly what the logged budget and
sensitivity imply (a derived table's cells: the sum of their parts), every measured domain has
the logged number of cells, no row lies outside a measured level, and the Parquet copies hold
what the CSV files hold. The confidential audit also checks each measurement's released counts
against the noisy digest the ledger committed (``committed``); the outsider has no digests.

The plan is read as data (each planned measurement's ``PlannedMeasurement``), so a field the
plan gains is checked wherever the measurement uses it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from phsafe.datapackage import SensitivityStatementError, check_sensitivity_statement
from phsafe.domain import USA_REGION_ID, Domain
from phsafe.errors import VerificationFailure, cause_in_words
from phsafe.iterations import GeographyLevel, IterationLevel, PopulationGroupLevel
from phsafe.noise import vector_digest
from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES, TABLES, output_spec


@dataclass(frozen=True)
class _Cell:
    count: int
    variance: float
    distribution: str


_Released = dict[tuple[str, str, str, int], _Cell]
"""(REGION_TYPE, REGION_ID, ITERATION_CODE, CELL) -> the released cell."""


def _expected_tables(planned: Mapping[str, Any]) -> list[str]:
    measured = {spend.measurement.table for spend in planned.values()}
    derived = {t for t, d in DERIVED_TABLES.items() if d.source in measured}
    return [t for t in OUTPUT_TABLES if t in measured or t in derived]


def _levels_of(planned: Mapping[str, Any], table: str) -> list[PopulationGroupLevel]:
    source = DERIVED_TABLES[table].source if table in DERIVED_TABLES else table
    return [s.measurement.level for s in planned.values() if s.measurement.table == source]


def verify_tables(planned: Mapping[str, Any], outdir: Path, files: Mapping[str, str], *,
                  committed: Mapping[str, str] | None = None, committed_seq: Mapping[str, int] | None = None) -> list[str]:
    """Every released cell against the plan (VARIANCE, NOISE_DISTRIBUTION, domains, the derived
    tables' sums) and, given ``committed`` (key -> noisy digest, the confidential audit's), each
    measurement's released counts against its digest.

    Args:
        planned: Key -> the planned spend (``.measurement``), as the ledger or the public log
            records it.
        outdir: The release folder.
        files: The release's files (relative path -> digest), as its manifest lists them.
        committed: The noisy digests the ledger committed (None: not checked).
        committed_seq: Where each was committed (for messages).
    """
    expected = _expected_tables(planned)
    present = {rel.split("/")[0] for rel in files if rel.endswith(".csv")}
    for table in expected:
        if f"{table}/{table}.csv" not in files:
            raise VerificationFailure(f"{table}/{table}.csv", "missing: the run measured this table")
    for name in sorted(present - set(expected)):
        raise VerificationFailure(name, "is released but the run measured no level of it")
    released: dict[str, _Released] = {}
    for table in expected:
        released[table] = _read_table(outdir, table)
        _no_stray_rows(released[table], _levels_of(planned, table), f"{table}/{table}.csv")

    checked = 0
    seen: dict[str, set[tuple[str, str, str, int]]] = {table: set() for table in released}
    for spend in planned.values():
        m = spend.measurement
        rel = f"{m.table}/{m.table}.csv"
        cells = released[m.table]
        domain = _domain_of(cells, m.level, TABLES[m.table].basis_numbers, rel, m.key)
        if domain.size != m.n_cells:
            raise VerificationFailure(
                rel, f"rows of {m.key} cover {domain.size} cells, the ledger planned {m.n_cells}"
            )
        counts = []
        for rt, rid, code, cell in _cells_in_order(domain):
            got = _get(cells, (rt, rid, code, cell), rel, m.key)
            seen[m.table].add((rt, rid, code, cell))
            _check_noise_columns(got, m.variance, m.distribution.value, rel, (rid, code, cell), m.key)
            counts.append(got.count)
        if committed is not None and vector_digest(np.asarray(counts, dtype=np.int64)) != committed.get(m.key):
            raise VerificationFailure(
                rel,
                f"released counts of {m.key} do not hash to the noisy digest logged in entry "
                f"{(committed_seq or {}).get(m.key)} (COMMITTED)",
            )
        checked += 1

    for name, derived in DERIVED_TABLES.items():
        if name not in released:
            continue
        rel = f"{name}/{name}.csv"
        source = released[derived.source]
        out_numbers = tuple(n for n, _ in derived.cells)
        parts_of = dict(derived.cells)
        for spend in planned.values():
            m = spend.measurement
            if m.table != derived.source:
                continue
            key = f"{name}/{m.level.config_key}"
            domain = _domain_of(released[name], m.level, out_numbers, rel, key)
            if domain.size * len(TABLES[m.table].basis_numbers) != m.n_cells * len(out_numbers):
                raise VerificationFailure(rel, f"rows of {key} do not cover the regions of {m.key}")
            for rt, rid, code, cell in _cells_in_order(domain):
                got = _get(released[name], (rt, rid, code, cell), rel, key)
                seen[name].add((rt, rid, code, cell))
                parts = parts_of[cell]
                # Post-processing: counts are sums of source cells, and so are the variances.
                _check_noise_columns(got, len(parts) * m.variance, m.distribution.value, rel, (rid, code, cell), key)
                want = sum(_get(source, (rt, rid, code, p), rel, m.key).count for p in parts)
                if got.count != want:
                    raise VerificationFailure(
                        rel, f"COUNT of {rid}/{code}/cell {cell} is not the sum of {derived.source} cells {list(parts)}"
                    )
            checked += 1
    for table, cells in released.items():
        for rt, rid, code, cell in sorted(set(cells) - seen[table]):
            raise VerificationFailure(
                f"{table}/{table}.csv", f"row {rid}/{code}/cell {cell} is not a cell of any measured domain"
            )
    for table in expected:  # the Parquet copies must hold what the (checked) CSV files hold
        parquet = f"parquet/{table}.parquet"
        if parquet in files:
            _check_parquet(outdir / parquet, parquet, released[table])
    what = "the logged variances and noisy digests" if committed is not None else "the VARIANCE the logged spends imply"
    try:  # the release says which sensitivity bound it used: the plan's
        bound = check_sensitivity_statement(outdir, files, [s.measurement for s in planned.values()])
    except SensitivityStatementError as exc:
        raise VerificationFailure(exc.file, exc.reason) from None
    return [f"outputs: {checked} measured and derived table levels match {what}", f"outputs: {bound}"]


def _read_table(outdir: Path, table: str) -> _Released:
    rel = f"{table}/{table}.csv"
    spec = output_spec(table)
    cell_col = f"{table.upper()}_DATA_CELL"
    header = ["REGION_ID", "REGION_TYPE"] + (["ITERATION_CODE"] if spec.has_iteration_column else [])
    header += [cell_col, "COUNT", "NOISE_DISTRIBUTION", "VARIANCE"]
    out: _Released = {}
    try:
        with open(outdir / rel, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter="|")
            if next(reader, None) != header:
                raise VerificationFailure(rel, f"header is not {'|'.join(header)}")
            for lineno, row in enumerate(reader, start=2):
                if len(row) != len(header):
                    raise VerificationFailure(rel, f"line {lineno} has {len(row)} fields, expected {len(header)}")
                rec = dict(zip(header, row))
                try:
                    cell = int(rec[cell_col])
                    count = int(rec["COUNT"])
                    variance = float(rec["VARIANCE"])
                except ValueError:
                    raise VerificationFailure(rel, f"line {lineno}: cell, COUNT or VARIANCE is not a number") from None
                rtype, rid = rec["REGION_TYPE"], rec["REGION_ID"]
                if rtype not in (GeographyLevel.USA.value, GeographyLevel.STATE.value):
                    raise VerificationFailure(rel, f"line {lineno}: unknown REGION_TYPE")
                if (rtype == GeographyLevel.USA.value) != (rid == USA_REGION_ID):
                    raise VerificationFailure(rel, f"line {lineno}: REGION_ID does not fit REGION_TYPE")
                key = (rtype, rid, rec.get("ITERATION_CODE", "*"), cell)
                if key in out:
                    raise VerificationFailure(rel, f"line {lineno} repeats a cell")
                out[key] = _Cell(count, variance, rec["NOISE_DISTRIBUTION"])
    except UnicodeDecodeError:
        raise VerificationFailure(rel, "is not UTF-8 text") from None
    except csv.Error as exc:
        raise VerificationFailure(rel, f"is not a valid |-separated file ({exc})") from None
    return out


def _level_of_code(code: str) -> IterationLevel | None:
    for it in IterationLevel:
        if code in it.codes:
            return it
    return None


def _domain_of(cells: _Released, level: PopulationGroupLevel, numbers: tuple[int, ...], rel: str, key: str) -> Domain:
    """The domain of ``level`` over the regions released for it, in vector order.

    The regions come from the file; the caller checks the domain's size against the ledger's
    planned cell count, so a dropped or added region cannot go unnoticed.
    """
    region_ids = tuple(
        sorted(
            {
                rid
                for (rt, rid, code, _cell) in cells
                if rt == level.geography.value and _level_of_code(code) is level.iteration
            }
        )
    )
    if not region_ids:
        raise VerificationFailure(rel, f"has no rows of {key}")
    return Domain(level.geography, region_ids, level.iteration.codes, numbers)


def _cells_in_order(domain: Domain):
    """(REGION_TYPE, REGION_ID, ITERATION_CODE, CELL) in the vector order of phsafe.domain
    (:meth:`~phsafe.domain.Domain.frame`: region, then iteration code, then cell)."""
    rt = str(domain.geography.value)
    codes = [str(code) for code in domain.iteration_codes]
    cells = [int(cell) for cell in domain.cells]
    for rid in domain.region_ids:
        rid = str(rid)
        for code in codes:
            for cell in cells:
                yield rt, rid, code, cell


def _get(cells: _Released, key: tuple[str, str, str, int], rel: str, what: str) -> _Cell:
    got = cells.get(key)
    if got is None:
        raise VerificationFailure(rel, f"row {key[1]}/{key[2]}/cell {key[3]} of {what} is missing")
    return got


def _check_noise_columns(got: _Cell, variance: float, dist: str, rel: str, where: tuple, key: str) -> None:
    rid, code, cell = where
    if not _close(got.variance, variance):
        raise VerificationFailure(
            rel,
            f"VARIANCE {got.variance!r} of {rid}/{code}/cell {cell} is not {variance!r}, which the "
            f"budget and sensitivity logged for {key} imply",
        )
    if got.distribution != dist:
        raise VerificationFailure(rel, f"NOISE_DISTRIBUTION of {rid}/{code}/cell {cell} is not {dist}")


def _no_stray_rows(cells: _Released, levels: list[PopulationGroupLevel], rel: str) -> None:
    """Every released row belongs to a measured level (else it was released without a spend)."""
    for rt, rid, code, cell in cells:
        it = _level_of_code(code)
        if it is None or PopulationGroupLevel(GeographyLevel(rt), it) not in levels:
            raise VerificationFailure(rel, f"row {rid}/{code}/cell {cell} belongs to no measured level")


def _close(got: float, want: float) -> bool:
    # Exact: the engine writes the float's shortest round-trip text, so parsing it back gives
    # the very float PlannedMeasurement.variance computes (sums of two for derived cells).
    return got == want


def _check_parquet(path: Path, rel: str, csv_cells: _Released) -> None:
    """The Parquet copy holds the same cells and counts as the CSV."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 -- any reader failure means an unreadable release
        raise VerificationFailure(rel, f"cannot be read as Parquet ({cause_in_words(exc)})") from None
    names = table.column_names
    cell_cols = [c for c in names if str(c).endswith("_DATA_CELL")]
    if len(cell_cols) != 1 or not {"REGION_ID", "COUNT"} <= set(names):
        raise VerificationFailure(rel, "columns differ from the CSV layout")
    regions = table.column("REGION_ID").to_pylist()
    codes = table.column("ITERATION_CODE").to_pylist() if "ITERATION_CODE" in names else ["*"] * table.num_rows
    try:
        got = {
            (str(r), str(c), int(n)): int(k)
            for r, c, n, k in zip(regions, codes, table.column(cell_cols[0]).to_pylist(),
                                  table.column("COUNT").to_pylist())
        }
    except (TypeError, ValueError):  # a missing or non-integer cell number or count
        raise VerificationFailure(rel, "cells or counts differ from the CSV file") from None
    want = {(rid, code, cell): v.count for (_rt, rid, code, cell), v in csv_cells.items()}
    if got != want:
        raise VerificationFailure(rel, "cells or counts differ from the CSV file")
