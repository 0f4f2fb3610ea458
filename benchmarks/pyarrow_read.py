"""The baseline: a bare *streaming* pyarrow read of a dataset's input files, nothing else.

    .venv/bin/python benchmarks/pyarrow_read.py DATA

Reads ``persons``, ``units`` and ``geo`` completely, one after the other, batch by batch, each
batch dropped once parsed -- the least any pipeline must do with the inputs, in memory bounded
by the batches in flight:

* CSV with ``pyarrow.csv.open_csv`` (64 MB blocks, multi-threaded, types inferred);
* Parquet (a file, or a folder of files such as ``persons/TABBLKST=06/part-0.parquet``) with
  ``pyarrow.dataset(...).to_batches()``.

It does not materialise whole tables (``read_csv`` of a 331M-person CSV would need ~36 GB).
``bench_end_to_end.py`` reports the pipeline's time as a multiple of this read.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.dataset as ds

CSV_BLOCK_BYTES = 64 << 20


def read_all(data: Path) -> int:
    """Stream the three inputs of ``data``; return the number of rows read."""
    rows = 0
    for stem in ("persons", "units", "geo"):
        if (data / f"{stem}.csv").is_file():
            batches = pacsv.open_csv(data / f"{stem}.csv", read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES))
        else:
            path = data / stem if (data / stem).is_dir() else data / f"{stem}.parquet"
            batches = ds.dataset(path, format="parquet", partitioning=None).to_batches()
        for batch in batches:
            rows += batch.num_rows
    return rows


if __name__ == "__main__":
    print(read_all(Path(sys.argv[1])))
