"""The baseline: a bare *typed, streaming* pyarrow read of a dataset's input files, nothing else.

    .venv/bin/python benchmarks/pyarrow_read.py DATA            # the baseline of every benchmark
    .venv/bin/python benchmarks/pyarrow_read.py DATA --infer    # the older baseline (types inferred)

Reads ``persons``, ``units`` and ``geo`` completely, one after the other, batch by batch, each
batch dropped once parsed -- the least work any pipeline must do with the inputs, in memory
bounded by the batches in flight:

* CSV with ``pyarrow.csv.open_csv`` (64 MB blocks, multi-threaded) with every column's type
  *given*, as the pass reads them: the integer columns of the schema (MAFID, QAGE, FINAL_POP,
  ...) as ``int64``, every code column (RTYPE, CENRACE, TABBLKST, ...) as ``string``, so that
  leading zeros are kept -- no type inference;
* Parquet (a file, or a folder of files such as ``persons/TABBLKST=06/part-0.parquet``) with
  ``pyarrow.dataset(...).to_batches()``: already typed.

Types inferred (``--infer``, the baseline before issue 36) cost about twice the CPU of the typed
parse on the same files: pyarrow tries each column as integers, then as text, block by block.
It does not materialise whole tables (``read_csv`` of a 331M-person CSV would need ~36 GB).
``bench_end_to_end.py`` reports the pipeline's time as a multiple of this read, measured in the
same run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds

from phsafe.schema import FILES, ColumnKind

CSV_BLOCK_BYTES = 64 << 20


def csv_types(stem: str) -> dict[str, pa.DataType]:
    """The type of every column of a file of the schema: integers as int64, codes as strings."""
    return {c.name: pa.int64() if c.kind is ColumnKind.INTEGER else pa.string() for c in FILES[stem]}


def read_all(data: Path, *, infer: bool = False) -> int:
    """Stream the three inputs of ``data``; return the number of rows read."""
    rows = 0
    for stem in ("persons", "units", "geo"):
        if (data / f"{stem}.csv").is_file():
            convert = pacsv.ConvertOptions() if infer else pacsv.ConvertOptions(column_types=csv_types(stem))
            batches = pacsv.open_csv(data / f"{stem}.csv", read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                                     convert_options=convert)
        else:
            path = data / stem if (data / stem).is_dir() else data / f"{stem}.parquet"
            batches = ds.dataset(path, format="parquet", partitioning=None).to_batches()
        for batch in batches:
            rows += batch.num_rows
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--infer", action="store_true", help="CSV types inferred (the baseline before issue 36)")
    args = parser.parse_args()
    print(read_all(args.data, infer=args.infer))
