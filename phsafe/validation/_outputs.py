"""Output validation (spec §7): every private table against the run plan, before publication.

The expected content of each table comes from public information only -- the config and
:func:`phsafe.accounting.plan_run` -- never from the data: its folders (tables with a measured
level), header, full domain (:func:`phsafe.domain.measurement_domain` of every planned
measurement) and per-cell variance (``PlannedMeasurement.variance``; summed over source cells for
PH5_num and PH8_num).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from phsafe.accounting import RunPlan, plan_run
from phsafe.config import PHSafeConfig
from phsafe.domain import measurement_domain
from phsafe.outputs import CSV_SEPARATOR, cell_column, private_columns
from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES, TABLES
from phsafe.validation._report import Failure, ValidationReport, write_report
from phsafe.validation._run import SuiteRun

_KEY = ["REGION_TYPE", "REGION_ID", "ITERATION_CODE", "CELL"]
_ROW_NOUNS = {"output_rows": "row", "output_cells": "cell"}


def _expected_cells(config: PHSafeConfig, plan: RunPlan, table: str) -> pd.DataFrame:
    """The planned full domain of ``table`` with each cell's planned variance."""
    if table in TABLES:
        source, mapping = table, None
    else:
        derived = DERIVED_TABLES[table]
        source, mapping = derived.source, derived.cells
    spec = TABLES[source]
    parts = []
    for m in plan.for_table(source):
        if mapping is None:
            domain = measurement_domain(spec, m.level, config)
            frame = domain.frame()
            frame["EXPECTED_VARIANCE"] = m.variance
        else:
            domain = measurement_domain(spec, m.level, config, cells=tuple(n for n, _ in mapping))
            frame = domain.frame()
            # A derived cell is a sum of independent basis cells of one measurement: variances add.
            per_cell = {n: len(srcs) * m.variance for n, srcs in mapping}
            frame["EXPECTED_VARIANCE"] = frame["CELL"].map(per_cell).astype(float)
        parts.append(frame)
    if not parts:
        return pd.DataFrame(columns=[*_KEY, "EXPECTED_VARIANCE"])
    return pd.concat(parts, ignore_index=True)


def _read_table(path: Path) -> tuple[pa.Table | None, list[str] | None, str | None]:
    """The table as text columns, its header, or why it could not be read (no values quoted)."""
    if path.stat().st_size == 0:
        return None, None, "the file is not empty: it starts with a header row"
    try:
        with open(path, "rb") as fh:
            header = fh.readline().decode("utf-8").rstrip("\r\n").split(CSV_SEPARATOR)
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=[f"c{i}" for i in range(len(header))], skip_rows=1),
            parse_options=pacsv.ParseOptions(delimiter=CSV_SEPARATOR),
            convert_options=pacsv.ConvertOptions(
                column_types={f"c{i}": pa.string() for i in range(len(header))},
                null_values=[""], strings_can_be_null=True,
            ),
        )
    except (UnicodeDecodeError, pa.ArrowInvalid, OSError):
        return None, None, f"the file is well-formed '{CSV_SEPARATOR}'-separated UTF-8 text"
    return table.rename_columns(header), header, None


def _frames(table: str, data: pa.Table, header: list[str], expected: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``output_rows`` and ``output_cells`` frames of one table."""
    n = data.num_rows

    def text(name: str, default: str | None = None) -> pd.Series:
        if name in header:
            return data.column(name).to_pandas()
        return pd.Series([default] * n, dtype="str")

    cell_text = data.column(cell_column(table)) if cell_column(table) in header else pa.nulls(n, pa.string())
    cells = pc.if_else(pc.match_substring_regex(cell_text, r"^[0-9]{1,9}$"), cell_text,
                       pa.scalar(None, pa.string())).cast(pa.int64())
    variance = pd.to_numeric(text("VARIANCE"), errors="coerce")
    rows = pd.DataFrame(
        {
            "REGION_ID": text("REGION_ID"),
            "REGION_TYPE": text("REGION_TYPE"),
            # PH2 and PH6 have no iteration column: their only code is "*".
            "ITERATION_CODE": text("ITERATION_CODE", None if "ITERATION_CODE" in private_columns(table) else "*"),
            "CELL": cells.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get),
            "COUNT": text("COUNT"),
            "NOISE_DISTRIBUTION": text("NOISE_DISTRIBUTION"),
            "VARIANCE": variance.astype("float64"),
        }
    )
    keyed = rows[_KEY].astype({"CELL": "Int64"}).copy()
    keyed["VARIANCE"] = rows["VARIANCE"]
    grouped = keyed.groupby(_KEY, dropna=False, sort=False).agg(
        ROWS=("VARIANCE", "size"), VARIANCE_MIN=("VARIANCE", "min"), VARIANCE_MAX=("VARIANCE", "max")
    ).reset_index()
    exp = expected.astype({"CELL": "Int64"}).copy()
    for frame in (grouped, exp):
        for k in ("REGION_TYPE", "REGION_ID", "ITERATION_CODE"):
            frame[k] = frame[k].astype("str")
    joined = exp.merge(grouped, on=_KEY, how="outer", indicator=True)
    expected_var = joined["EXPECTED_VARIANCE"].to_numpy(dtype=float, na_value=np.nan)
    worst = np.fmax(np.abs(joined["VARIANCE_MIN"].to_numpy(dtype=float, na_value=np.nan) - expected_var),
                    np.abs(joined["VARIANCE_MAX"].to_numpy(dtype=float, na_value=np.nan) - expected_var))
    scale = np.where(expected_var > 0, expected_var, 1.0)
    cells_frame = pd.DataFrame(
        {
            "IN_OUTPUT": (joined["_merge"] != "left_only").to_numpy(),
            "IN_DOMAIN": (joined["_merge"] != "right_only").to_numpy(),
            "ROWS": joined["ROWS"].fillna(0).astype("int64").to_numpy(),
            "VARIANCE_ERROR": worst / scale,  # NaN (not checked) where a side is missing
        }
    )
    return rows, cells_frame


def validate_outputs(config: PHSafeConfig, output_dir: Path, *, report_dir: Path | None = None) -> ValidationReport:
    """Validate the private output tables in ``output_dir`` against the run plan of ``config``.

    Works on the staging directory before publication. Never raises on bad output: every
    problem is a :class:`Failure` of the returned report.

    Args:
        config: The run's validated configuration.
        output_dir: Folder holding ``<TABLE>/<TABLE>.csv``.
        report_dir: If given, the report and results are written to ``report_dir/outputs/``.
    """
    output_dir = Path(output_dir)
    plan = plan_run(config)
    report = ValidationReport(subject="outputs")
    parameters = {
        "region_types": [g.value for g in config.geography_levels()],
        "states": list(config.states),
        "noise_distribution": sorted({m.distribution.value for m in plan.measurements}),
    }
    run = SuiteRun("outputs", parameters, row_nouns=_ROW_NOUNS)
    frames: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
    for table in OUTPUT_TABLES:
        source = table if table in TABLES else DERIVED_TABLES[table].source
        name = f"{table}/{table}.csv"
        path = output_dir / table / f"{table}.csv"
        if not plan.for_table(source):
            if path.exists():
                report.failures.append(Failure(name, (), f"is not produced: every level of {source} has budget 0"))
            continue
        if not path.is_file():
            report.failures.append(Failure(name, (), "the table is present (it has a measured level)"))
            continue
        data, header, problem = _read_table(path)
        if problem is not None or data is None or header is None:
            report.failures.append(Failure(name, (), problem or "the file is readable"))
            continue
        header_run = SuiteRun("outputs", row_nouns=_ROW_NOUNS)
        header_run.check("output_header", pd.DataFrame(columns=header), parameters={"columns": private_columns(table)})
        run.tally.merge(header_run.tally)
        report.failures.extend(_named(header_run, table))
        frames[table] = _frames(table, data, header, _expected_cells(config, plan, table))

    # One run over the rows and cells of every table (Great Expectations' cost is per rule and
    # run, not per row); the tables of a failing rule are then found table by table.
    if frames:
        run.check("output_rows", pd.concat([rows for rows, _ in frames.values()], ignore_index=True))
        run.check("output_cells", pd.concat([cells for _, cells in frames.values()], ignore_index=True))
    failed = {f.rule_id for f in run.tally.failures({})} - {"outputs.header"}
    for table, (rows, cells) in frames.items():
        if not failed:
            break
        table_run = SuiteRun("outputs", parameters, row_nouns=_ROW_NOUNS)
        table_run.check("output_rows", rows, only=failed)
        table_run.check("output_cells", cells, only=failed)
        report.failures.extend(_named(table_run, table))
    report.notes.extend(run.tally.notes())
    if run.tally.any_evaluated():
        report.results.append(run.tally.result_json())
    if report_dir is not None:
        write_report(report, Path(report_dir))
    return report


def _named(run: SuiteRun, table: str) -> list[Failure]:
    """The run's failures, naming the table's file and its cell column."""
    out = []
    for failure in run.tally.failures({"output": f"{table}/{table}.csv"}):
        columns = tuple(cell_column(table) if c == "<TABLE>_DATA_CELL" else c for c in failure.columns)
        out.append(replace(failure, columns=columns))
    return out
