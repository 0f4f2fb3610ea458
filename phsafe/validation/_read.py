"""Streaming the raw input files as text, with the structural checks no suite can express.

A suite needs a frame; these checks decide whether a frame can be built at all: the file exists
(CSV or Parquet, not both), is not empty, is comma-separated with a header row, every row has
the header's number of fields, and every value is UTF-8 text. Each problem becomes a
:class:`~phsafe.validation._report.Failure` naming the file, the column when known, and the
rule -- never a value: pyarrow's messages quote the offending row, so they are replaced by ours.

Rows that break a structural rule are counted and left out of the batches (they are already
reported, and their fields cannot be trusted).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from phsafe.errors import InputError
from phsafe.reader import InputFile as SourceFile  # one located input, as the engine sees it
from phsafe.reader import find_input
from phsafe.schema import FILES, Column, ColumnKind
from phsafe.validation._report import Failure

CSV_BLOCK_BYTES = 32 << 20
"""CSV text per batch (about 1.4 million persons rows): bounds memory and amortises GX's
per-batch overhead."""
PARQUET_BATCH_ROWS = 4_000_000
"""Rows per batch of Parquet input: the suites see a batch's distinct rows (or values), whose
number grows far slower than the batch, so large batches mean fewer runs of the suites' fixed
costs (persons: 3.2 s instead of 5.1 s of Great Expectations per 10M persons)."""
STATE_COLUMN = "__state_folder__"
"""Column added to the batches of input stored by state: the state of the row's folder (int8).
Not a column of any file: no suite sees it."""
_HEADER_MAX_BYTES = 1 << 16
_OTHER_DELIMITERS = (";", "|", "\t")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def locate(data_dir: Path) -> tuple[dict[str, SourceFile], list[Failure]]:
    """Find each of persons, units, geo as ``.csv``, ``.parquet`` or a folder of Parquet files
    in ``data_dir`` (see :func:`phsafe.reader.find_input`)."""
    found: dict[str, SourceFile] = {}
    failures: list[Failure] = []
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return {}, [Failure(str(data_dir), (), "the data directory exists")]
    for stem in FILES:
        try:
            source, problem = find_input(data_dir, stem)
        except InputError as exc:  # a malformed folder input: names a file and a rule, no value
            failures.append(Failure(exc.file, (), exc.rule))
            continue
        if problem == "missing":
            failures.append(Failure(f"{stem}.csv", (), f"the data directory holds {stem}.csv or {stem}.parquet "
                                    f"(a file, or a folder of Parquet files: {stem}.parquet/ or {stem}/)"))
        elif problem is not None:
            failures.append(Failure(
                f"{stem}.csv", (), f"exactly one of {stem}.csv and {stem}.parquet is present (or a {stem}/ "
                f"folder of Parquet files); found {problem.removeprefix('ambiguous: ')}"))
        else:
            assert source is not None
            found[stem] = source
    return found, failures


def describe_header(names: list[str], expected: list[str]) -> str:
    """What is wrong with a header, naming only expected columns and identifier-like extras.

    A header row that is really a data row (a file without a header) must not be echoed:
    confidential values are all digits, so only names that look like identifiers are shown.
    """
    parts = []
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    if missing:
        parts.append("missing " + ", ".join(missing))
    if extra:
        shown = [n for n in extra if _IDENTIFIER.match(n)]
        hidden = len(extra) - len(shown)
        text = ", ".join(shown)
        if hidden:
            text += (", " if text else "") + f"{hidden} other column{'s' if hidden != 1 else ''}"
        parts.append("unexpected " + text)
    if not missing and not extra and names != expected:
        parts.append("columns out of order" if len(set(names)) == len(names) else "a column repeated")
    return "; ".join(parts)


@dataclass
class FileReader:
    """Streams one input file as record batches of its schema's columns.

    Code columns arrive as ``string``; integer columns as ``string`` (CSV, Parquet text) or an
    integer type (Parquet). Structural problems are collected in ``failures``; ``complete`` is
    False when rows could not all be read (then cross-file rules are not checked).
    """

    source: SourceFile
    failures: list[Failure] = field(default_factory=list)
    header: list[str] | None = None
    complete: bool = True

    @property
    def columns(self) -> tuple[Column, ...]:
        return FILES[self.source.stem]

    @property
    def present(self) -> list[Column]:
        """Schema columns the header has (in schema order)."""
        names = set(self.header or ())
        return [c for c in self.columns if c.name in names]

    def _fail(self, rule: str, columns: tuple[str, ...] = (), rows: int | None = None) -> None:
        self.failures.append(Failure(self.source.name, columns, rule, rows))

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self.source.format == "parquet":
            yield from self._parquet()
        else:
            yield from self._csv()

    # ---------------------------------------------------------------------------- CSV
    def _read_header(self) -> list[str] | None:
        path = self.source.path
        with open(path, "rb") as fh:
            first = fh.readline(_HEADER_MAX_BYTES)
        if first.startswith(b"\xef\xbb\xbf"):
            first = first[3:]
        if not first.strip():
            self._fail("the file is not empty: it starts with a header row naming its columns")
            return None
        try:
            line = first.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            self._fail("the header row is UTF-8 text")
            return None
        names = next(csv.reader(io.StringIO(line)), [])
        if len(names) <= 1:
            for d in _OTHER_DELIMITERS:
                if d in line:
                    shown = "tab" if d == "\t" else f"'{d}'"
                    self._fail(f"the file is comma-separated (its header row has no comma but {shown}s)")
                    return None
        return names

    def _csv(self) -> Iterator[pa.RecordBatch]:
        names = self._read_header()
        if names is None:
            self.complete = False
            return
        self.header = names
        if len(set(names)) != len(names):
            self._fail("every column of the header row is named once")
            self.complete = False
            return
        # Columns are read under neutral names: a header name is never handed to pyarrow's
        # messages, and extra columns are skipped without being parsed.
        neutral = [f"c{i}" for i in range(len(names))]
        wanted = {f"c{names.index(c.name)}": c.name for c in self.present}
        if not wanted:  # no column of the schema: nothing to check beyond the header
            self.complete = False
            return
        bad_rows: list[int] = [0]

        def on_invalid(row: pacsv.InvalidRow) -> str:  # never look at row.text: it is data
            bad_rows[0] += 1
            return "skip"

        try:
            reader = pacsv.open_csv(
                self.source.path,
                read_options=pacsv.ReadOptions(
                    column_names=neutral, skip_rows=1, block_size=CSV_BLOCK_BYTES, use_threads=True
                ),
                parse_options=pacsv.ParseOptions(delimiter=",", invalid_row_handler=on_invalid),
                convert_options=pacsv.ConvertOptions(
                    include_columns=list(wanted),
                    column_types={k: pa.binary() for k in wanted},
                    null_values=[""],
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=True,
                ),
            )
            utf8_bad: dict[str, int] = {}
            for batch in reader:
                yield self._decode(batch, wanted, utf8_bad)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError):
            # The message quotes the offending row; the rule is stated without it.
            self._fail("the file is well-formed CSV (reading stopped at a row that could not be parsed)")
            self.complete = False
            return
        finally:
            if bad_rows[0]:
                self._fail(
                    f"every row has the header's {len(names)} comma-separated fields", (), bad_rows[0]
                )
                self.complete = False  # skipped rows would show up again as cross-file orphans
        for name, n in utf8_bad.items():
            self._fail("the values are UTF-8 text", (name,), n)
            self.complete = False

    def _decode(self, batch: pa.RecordBatch, wanted: dict[str, str], utf8_bad: dict[str, int]) -> pa.RecordBatch:
        """Binary columns -> UTF-8 strings; rows holding invalid UTF-8 are counted and dropped."""
        arrays: list[pa.Array] = []
        keep: pa.Array | None = None
        for key, name in wanted.items():
            col = batch.column(batch.schema.get_field_index(key))
            try:
                arrays.append(col.cast(pa.string()))
            except pa.ArrowInvalid:
                # Rare (the file is rejected anyway): find the rows in Python, count them.
                valid = pa.array([_is_utf8(v) for v in col.to_pylist()], pa.bool_())
                utf8_bad[name] = utf8_bad.get(name, 0) + len(valid) - int(pc.sum(valid).as_py() or 0)
                keep = valid if keep is None else pc.and_(keep, valid)
                arrays.append(col)  # still binary: cast after the invalid rows are dropped
        if keep is not None:
            arrays = [pc.filter(a, keep) for a in arrays]
            arrays = [a if pa.types.is_string(a.type) else a.cast(pa.string()) for a in arrays]
        return pa.RecordBatch.from_arrays(arrays, names=list(wanted.values()))

    # ---------------------------------------------------------------------------- Parquet
    def _parquet(self) -> Iterator[pa.RecordBatch]:
        """Every Parquet file of the input (one file, or a folder's files in path order); the
        files of a folder must all have the same columns."""
        if not self.source.directory:
            yield from self._parquet_file(self.source.path)
            return
        # A folder holds many small files (one per state): their batches are merged into batches
        # of about PARQUET_BATCH_ROWS rows, since the suites cost a fixed overhead per batch.
        # Rows of a folder stored by state carry their folder's state (STATE_COLUMN): the
        # cross-file rules join records of the same state only, as the counting does.
        by_state = self.source.partitioned
        pending: list[pa.RecordBatch] = []
        rows = 0
        for path in self.source.files:
            state = int(self.source.partition_of(path) or 0) if by_state else None
            for batch in self._parquet_file(path):
                batch = _uniform(batch)
                if state is not None:
                    batch = batch.append_column(STATE_COLUMN, pa.array(np.full(batch.num_rows, state, np.int8)))
                pending.append(batch)
                rows += batch.num_rows
                if rows >= PARQUET_BATCH_ROWS:
                    yield _merge(pending)
                    pending, rows = [], 0
        if pending:
            yield _merge(pending)

    def _parquet_file(self, path: Path) -> Iterator[pa.RecordBatch]:
        try:
            pf = pq.ParquetFile(path)
            schema = pf.schema_arrow
        except Exception:  # noqa: BLE001 -- pyarrow's message may quote file content
            self._fail("the file is a readable Parquet file" if not self.source.directory
                       else f"every file is a readable Parquet file ({self._where(path)} is not)")
            self.complete = False
            return
        if self.header is not None:  # a later file of a folder
            if list(schema.names) != self.header:
                self._fail(f"every Parquet file of the folder has the same columns ({self._where(path)} differs)")
                self.complete = False
                return
        else:
            self.header = list(schema.names)
            if len(set(self.header)) != len(self.header):
                self._fail("every column is named once")
                self.complete = False
                return
        present = self.present
        if not present:
            self.complete = False
            return
        for c in present:
            t = schema.field(c.name).type
            if pa.types.is_dictionary(t):
                t = t.value_type
            text = pa.types.is_string(t) or pa.types.is_large_string(t)
            if c.kind is ColumnKind.CODE and not text:
                self._fail("is stored as text (a Parquet string column), so leading zeros are kept", (c.name,))
            elif c.kind is ColumnKind.INTEGER and not (text or pa.types.is_integer(t)):
                self._fail("is stored as an integer or text column", (c.name,))
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[c.name for c in present]):
                arrays = [_parquet_column(batch.column(batch.schema.get_field_index(c.name)), c) for c in present]
                yield pa.RecordBatch.from_arrays(arrays, names=[c.name for c in present])
        except Exception:  # noqa: BLE001
            self._fail("the file is a readable Parquet file (reading stopped at a corrupt page)")
            self.complete = False

    def _where(self, path: Path) -> str:
        """A folder's file as ``persons/TABBLKST=06/part-0.parquet`` (public: paths and states)."""
        return self.source.file_name(path)


def _uniform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Integer columns as int64, so that batches of different files can be merged."""
    arrays = [a.cast(pa.int64()) if pa.types.is_integer(a.type) and a.type != pa.int64() else a
              for a in batch.columns]
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _merge(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record batch holding ``batches`` (same columns) in order."""
    table = pa.Table.from_batches(batches)
    if len(batches) == 1 or table.num_rows == 0:
        return batches[0]
    return table.combine_chunks().to_batches()[0]


def _parquet_column(col: pa.Array, c: Column) -> pa.Array:
    """A Parquet column as the reader's types: text, or integers for an integer column."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_string(col.type) or (c.kind is ColumnKind.INTEGER and pa.types.is_integer(col.type)):
        return col
    if c.kind is ColumnKind.CODE or pa.types.is_large_string(col.type):
        # A code stored as a number has lost its leading zeros (reported): its digits are still
        # checked, as text, so "1" fails the code's format rule.
        try:
            return col.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return pa.nulls(len(col), pa.string())  # an unusable type (reported): every value is missing


def _is_utf8(value: bytes | None) -> bool:
    if value is None:
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
