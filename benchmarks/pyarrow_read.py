"""The baseline: a bare pyarrow read of a dataset's input files, nothing else.

    .venv/bin/python benchmarks/pyarrow_read.py DATA

Reads ``persons``, ``units`` and ``geo`` completely -- CSV with ``pyarrow.csv.read_csv`` (default
options: multi-threaded, types inferred), Parquet (a file or a folder of files) with
``pyarrow.dataset`` -- one after the other, dropping each table once read. This is the least
any pipeline must do with the inputs; ``bench_end_to_end.py`` reports our total as a multiple
of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.dataset as ds


def read_all(data: Path) -> int:
    """Read the three inputs of ``data``; return the number of rows read."""
    rows = 0
    for stem in ("persons", "units", "geo"):
        if (data / f"{stem}.csv").is_file():
            table = pacsv.read_csv(data / f"{stem}.csv")
        else:
            path = data / stem if (data / stem).is_dir() else data / f"{stem}.parquet"
            table = ds.dataset(path, format="parquet", partitioning=None).to_table()
        rows += table.num_rows
        del table
    return rows


if __name__ == "__main__":
    print(read_all(Path(sys.argv[1])))
