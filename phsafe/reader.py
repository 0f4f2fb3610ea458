"""Readers for the three production input files, CSV or Parquet (spec §1).

Files are streamed in record batches and converted batch by batch into compact numpy columns
(``uint8`` codes, ``int32`` MAFIDs), so memory is bounded by the compact form of the data, not by
its text. Every code column is read as a string, and its exact form is checked -- a code keeps its
leading zeros (``"01"`` is not ``"1"``) -- before it is stored as the integer it spells.

Errors name the file, the column and the rule, and never carry a value from the file: the
messages of pyarrow's parser, which quote offending rows, are replaced by our own.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from phsafe.errors import InputError
from phsafe.schema import FILES, Column, ColumnKind

_BLOCK_SIZE = 8 << 20  # bytes of CSV text per batch: larger blocks cost memory, not speed
_PARQUET_BATCH_ROWS = 4_000_000


@dataclass(frozen=True)
class InputFile:
    """One located input file."""

    stem: str  # persons, units or geo
    path: Path
    format: str  # csv or parquet

    @property
    def name(self) -> str:
        return self.path.name


def locate_inputs(data_dir: str | Path) -> dict[str, InputFile]:
    """Find ``persons``, ``units`` and ``geo`` as ``.csv`` or ``.parquet`` in ``data_dir``.

    Raises:
        InputError: A file is missing, or present in both formats (ambiguous).
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError(str(data_dir), "", "data directory does not exist")
    found: dict[str, InputFile] = {}
    for stem in FILES:
        candidates = [
            InputFile(stem, data_dir / f"{stem}.{ext}", ext)
            for ext in ("csv", "parquet")
            if (data_dir / f"{stem}.{ext}").exists()
        ]
        if not candidates:
            raise InputError(f"{stem}.csv", "", f"is missing from the data directory {data_dir}")
        if len(candidates) > 1:
            raise InputError(f"{stem}.csv", "", f"both {stem}.csv and {stem}.parquet exist; keep one")
        found[stem] = candidates[0]
    return found


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def input_digests(files: dict[str, InputFile]) -> dict[str, str]:
    """File name -> SHA-256; the digests identify the dataset in the audit ledger."""
    return {f.name: file_digest(f.path) for f in files.values()}


Columns = dict[str, npt.NDArray[np.generic]]


@dataclass
class InputTables:
    """The three inputs as compact numpy columns (only the columns the engine uses)."""

    persons: Columns
    units: Columns
    geo: Columns
    files: dict[str, InputFile] = field(default_factory=dict)

    @property
    def n_persons(self) -> int:
        return len(self.persons["MAFID"])


def read_inputs(data_dir: str | Path) -> InputTables:
    """Read and encode the three input files of ``data_dir``.

    Raises:
        InputError: A file is missing or malformed, a header is wrong, or a value breaks its
            column's format or domain.
    """
    files = locate_inputs(data_dir)
    tables = {stem: read_table(f) for stem, f in files.items()}
    return InputTables(tables["persons"], tables["units"], tables["geo"], files)


def read_table(f: InputFile) -> Columns:
    """Read one input file into compact columns, batch by batch."""
    columns = FILES[f.stem]
    kept = [c for c in columns if c.dtype is not None]
    parts: dict[str, list[np.ndarray]] = {c.name: [] for c in kept}
    for batch in _batches(f, columns):
        for c in kept:
            parts[c.name].append(_encode(f, c, batch.column(batch.schema.get_field_index(c.name))))
    out: Columns = {}
    for c in kept:  # one column at a time, releasing its batches: peak is data + one column
        chunks = parts.pop(c.name)
        out[c.name] = np.concatenate(chunks) if chunks else np.empty(0, dtype=c.dtype)
        del chunks
    return out


def _check_header(f: InputFile, names: list[str], columns: tuple[Column, ...]) -> None:
    expected = [c.name for c in columns]
    if names == expected:
        return
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    if missing:
        raise InputError(f.name, ",".join(missing), "required column is missing from the header")
    if extra:
        raise InputError(f.name, ",".join(extra), "is not a column of this file")
    raise InputError(f.name, ",".join(names), f"columns must be in the order {','.join(expected)}")


_EXPECTED_COLUMNS = re.compile(r"Expected (\d+) columns, got (\d+)")


def _csv_error(f: InputFile, exc: Exception) -> InputError:
    """Rewrap a pyarrow CSV error without the row text pyarrow quotes."""
    msg = str(exc)
    m = _EXPECTED_COLUMNS.search(msg)
    if m:
        return InputError(f.name, "", f"a row has {m.group(2)} fields where the header has {m.group(1)}")
    if "UTF8" in msg or "utf-8" in msg.lower() or "utf8" in msg.lower():
        return InputError(f.name, "", "contains bytes that are not valid UTF-8")
    if "Empty CSV file" in msg or "empty" in msg.lower():
        return InputError(f.name, "", "is empty (a header row is required)")
    return InputError(f.name, "", "is not a well-formed comma-separated file")


def _batches(f: InputFile, columns: tuple[Column, ...]) -> Iterator[pa.RecordBatch]:
    if f.format == "parquet":
        try:
            pf = pq.ParquetFile(f.path)
        except Exception:
            raise InputError(f.name, "", "is not a readable Parquet file") from None
        _check_header(f, pf.schema_arrow.names, columns)
        yield from pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS)
        return
    if f.path.stat().st_size == 0:
        raise InputError(f.name, "", "is empty (a header row is required)")
    with open(f.path, "rb") as fh:
        first = fh.readline()
    try:
        header = first.decode("utf-8").rstrip("\r\n").split(",")
    except UnicodeDecodeError:
        raise InputError(f.name, "", "header row is not valid UTF-8") from None
    _check_header(f, header, columns)
    try:
        reader = pacsv.open_csv(
            f.path,
            read_options=pacsv.ReadOptions(block_size=_BLOCK_SIZE, use_threads=True),
            parse_options=pacsv.ParseOptions(delimiter=","),
            convert_options=pacsv.ConvertOptions(
                column_types={c.name: pa.string() for c in columns},
                strings_can_be_null=False,
                check_utf8=True,
            ),
        )
        for batch in reader:
            yield batch
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise _csv_error(f, exc) from None


def _n_true(mask: pa.Array) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _encode(f: InputFile, c: Column, arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Check one column batch against its format and domain; return compact integers."""
    if arr.null_count:
        raise InputError(f.name, c.name, "must not be empty", rows=arr.null_count)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        if c.kind is ColumnKind.CODE:
            pattern, rule = f"^[0-9]{{{c.width}}}$", f"must be a {c.width}-digit code (leading zeros kept)"
        else:
            pattern, rule = r"^[0-9]+$", "must be a non-negative whole number"
        bad = _n_true(pc.invert(pc.match_substring_regex(arr, pattern)))
        if bad:
            raise InputError(f.name, c.name, rule, rows=bad)
        values = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
    elif pa.types.is_integer(arr.type) and c.kind is ColumnKind.INTEGER:
        values = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
    else:
        kind = "a string code" if c.kind is ColumnKind.CODE else "an integer"
        raise InputError(f.name, c.name, f"must be stored as {kind}")
    _check_domain(f, c, values)
    return values.astype(c.dtype)


def _check_domain(f: InputFile, c: Column, values: np.ndarray) -> None:
    if c.minimum is not None:
        bad = int(np.count_nonzero((values < c.minimum) | (values > c.maximum)))
        if bad:
            raise InputError(f.name, c.name, f"must be between {c.minimum} and {c.maximum}", rows=bad)
    if c.allowed is not None:
        allowed = np.zeros(max(c.allowed) + 2, dtype=bool)
        allowed[list(c.allowed)] = True
        inside = values.clip(0, len(allowed) - 1)
        bad = int(np.count_nonzero(~allowed[inside] | (values >= len(allowed) - 1)))
        if bad:
            shown = c.allowed_strings() or []
            listing = ", ".join(shown) if len(shown) <= 12 else f"{shown[0]} ... {shown[-1]}"
            raise InputError(f.name, c.name, f"must be one of {listing}", rows=bad)
