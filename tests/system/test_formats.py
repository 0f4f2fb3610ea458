"""CSV and Parquet inputs with the same columns give the same tables."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from phsafe.engine import run_nonprivate
from phsafe.schema import FILES
from phsafe.tables import OUTPUT_TABLES

from tests.conftest import END_TO_END


def _to_parquet(src: Path, dst: Path) -> None:
    dst.mkdir()
    for stem, columns in FILES.items():
        table = pacsv.read_csv(
            src / f"{stem}.csv",
            convert_options=pacsv.ConvertOptions(column_types={c.name: pa.string() for c in columns}),
        )
        # Integer columns as integers, code columns as strings: the types a site would write.
        for c in columns:
            if c.kind.value == "integer":
                i = table.schema.get_field_index(c.name)
                table = table.set_column(i, c.name, table.column(c.name).cast(pa.int64()))
        pq.write_table(table, dst / f"{stem}.parquet")


def test_parquet_inputs_match_csv_inputs(tmp_path: Path) -> None:
    _to_parquet(END_TO_END, tmp_path / "pq")
    (tmp_path / "pq" / "config.json").write_bytes((END_TO_END / "config.json").read_bytes())
    run_nonprivate(END_TO_END / "config.json", END_TO_END, tmp_path / "from_csv", non_confidential=True)
    run_nonprivate(END_TO_END / "config.json", tmp_path / "pq", tmp_path / "from_parquet", non_confidential=True)
    for table in OUTPUT_TABLES:
        a = (tmp_path / "from_csv" / table / f"{table}.csv").read_bytes()
        b = (tmp_path / "from_parquet" / table / f"{table}.csv").read_bytes()
        assert a == b, table
