"""Readers for the three production input files, CSV or Parquet (spec §1).

Files are streamed in record batches (:class:`SourceReader`) and checked column by column
(:func:`encode`) into compact numpy columns (``uint8`` codes, ``int32`` MAFIDs), so memory is
bounded by the compact form of the data, not by its text. Every code column is read as text, and
its exact form is checked -- a code keeps its leading zeros (``"01"`` is not ``"1"``) -- on the raw
bytes before it is stored as the integer it spells; an integer column is a whole number written
in digits (or a Parquet integer), whatever its width (a 29-digit MAFID is a number outside the
MAFID range, not an overflow). The same reading serves the counting, which stops at the first
problem (an :class:`~phsafe.errors.InputError`), and validation, which reports every problem and
sees each value as a *class* (:class:`ClassBook`), so that its rules are evaluated once per
distinct value.

Each input is one file (``persons.csv`` or ``persons.parquet``) or a folder of Parquet files
(``persons/`` or ``persons.parquet/``), optionally partitioned by state in the Hive layout::

    DATA/persons/TABBLKST=06/part-0.parquet
    DATA/units/TABBLKST=06/part-0.parquet
    DATA/geo/TABBLKST=06/part-0.parquet

Every Parquet file holds exactly the columns of spec §1 (geo keeps its ``TABBLKST`` column); the
folder name only says where a record is stored. A record belongs in the folder of its unit's
state (its geo row's ``TABBLKST``): :mod:`phsafe.intake` then counts one state at a time.
Files and folders whose names start with ``.`` or ``_`` (``_SUCCESS``, ``.crc``) are ignored.

Errors name the file, the column and the rule, and never carry a value from the file: the
messages of pyarrow's parser, which quote offending rows, are replaced by our own.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import os
import queue
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from phsafe.errors import InputError
from phsafe.schema import FILES, Column, ColumnKind

T = TypeVar("T")
_CSV_BYTES_PER_PERSON = 23  # "3,123456789,44,1,01,20\n"
PARTITION_KEY = "TABBLKST"
"""The one Hive partition key a folder of Parquet files may use: ``TABBLKST=<2-digit state>``."""
_KEY_VALUE = re.compile(r"[0-9]{2}")


@dataclass(frozen=True)
class InputFile:
    """One located input: a file, or a folder of Parquet files.

    Attributes:
        stem: ``persons``, ``units`` or ``geo``.
        path: The file, or the folder.
        format: ``csv`` or ``parquet``.
        directory: The input is a folder of Parquet files.
        parts: A folder's Parquet files, sorted by their path relative to the folder (for a
            partition of the data, the subset it reads; possibly none).
    """

    stem: str
    path: Path
    format: str  # csv or parquet
    directory: bool = False
    parts: tuple[Path, ...] = ()

    @property
    def name(self) -> str:
        """The name that identifies the input in messages and digests (``persons.csv``,
        ``persons``)."""
        return self.path.name

    @property
    def files(self) -> tuple[Path, ...]:
        """The files to read, in order."""
        return self.parts if self.directory else (self.path,)

    def file_name(self, file: Path) -> str:
        """How ``file`` is named in messages: ``persons.csv``, ``persons/TABBLKST=06/part-0.parquet``."""
        if not self.directory:
            return self.name
        return f"{self.name}/{file.relative_to(self.path).as_posix()}"

    def partition_of(self, file: Path) -> str | None:
        """The state of ``file``'s ``TABBLKST=`` folder, or None outside a partition."""
        if not self.directory:
            return None
        return _partition_key(self.file_name(file), file.relative_to(self.path).parts[:-1])

    def partitions(self) -> dict[str | None, tuple[Path, ...]]:
        """Files grouped by state partition (key None: files outside any partition)."""
        out: dict[str | None, list[Path]] = {}
        for f in self.files:
            out.setdefault(self.partition_of(f), []).append(f)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def partitioned(self) -> bool:
        """A folder whose every file lies in a ``TABBLKST=`` partition."""
        return self.directory and bool(self.parts) and None not in self.partitions()

    def estimated_rows(self) -> int:
        """Rows of the input: exact for Parquet (its files' metadata; an unreadable file counts
        none, and is reported when it is read), estimated for CSV from its size and the length
        of its lines at a few evenly spaced places (:func:`csv_line_bytes`)."""
        if self.format == "csv":
            if not self.files:
                return 0
            try:
                size = self.path.stat().st_size
            except OSError:
                return 0
            return size // csv_line_bytes(self.path)
        total = 0
        for path in self.files:
            try:
                total += pq.ParquetFile(path).metadata.num_rows
            except Exception:  # noqa: BLE001 -- pyarrow's message may quote file content
                pass
        return total

    def subset(self, files: tuple[Path, ...]) -> "InputFile":
        """The same input restricted to ``files`` (a partition of a folder)."""
        assert self.directory, "only a folder input has parts"
        return InputFile(self.stem, self.path, self.format, True, tuple(files))


_LINE_SAMPLES = 8
_LINE_SAMPLE_BYTES = 1 << 16


@functools.lru_cache(maxsize=64)
def _line_bytes(path: str, size: int, mtime_ns: int) -> int:
    if size == 0:
        return _CSV_BYTES_PER_PERSON
    lines = 0
    read = 0
    with open(path, "rb") as fh:
        for i in range(_LINE_SAMPLES):
            fh.seek(size * i // _LINE_SAMPLES)
            data = fh.read(_LINE_SAMPLE_BYTES)
            first = data.find(b"\n")
            last = data.rfind(b"\n")
            if first < 0 or last <= first:
                continue
            lines += data.count(b"\n", first + 1, last + 1)
            read += last - first
    return max(1, read // lines) if lines else max(1, min(size, _CSV_BYTES_PER_PERSON))


def csv_line_bytes(path: Path) -> int:
    """The average length of a CSV file's lines (bytes), from a few evenly spaced samples: the
    file's rows are about its size over this. Unreadable: a persons row's (23 bytes)."""
    try:
        st = os.stat(path)
        return _line_bytes(str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return _CSV_BYTES_PER_PERSON


def _partition_key(name: str, folders: tuple[str, ...]) -> str | None:
    keyed = [d for d in folders if "=" in d]
    if not keyed:
        return None
    key, _, value = keyed[0].partition("=")
    if len(keyed) > 1 or folders[0] != keyed[0] or key != PARTITION_KEY:
        raise InputError(name, "", f"is in a partition folder other than {PARTITION_KEY}=<state> "
                                   "directly under the input folder")
    if not _KEY_VALUE.fullmatch(value):
        raise InputError(name, "", f"partition folders are named {PARTITION_KEY}=<2-digit state code>")
    return value


def _ignored(part: str) -> bool:
    return part.startswith((".", "_"))


def list_parquet_files(folder: Path) -> tuple[Path, ...]:
    """The Parquet files of a folder input, sorted by relative path.

    Raises:
        InputError: The folder holds no Parquet file, a file that is not Parquet, or a
            partition folder that is not ``TABBLKST=<2 digits>``; or mixes files inside and
            outside partitions.
    """
    files: list[tuple[str, Path]] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _ignored(d))
        for n in names:
            if _ignored(n):
                continue
            path = Path(root) / n
            rel = path.relative_to(folder).as_posix()
            if not n.endswith(".parquet"):
                raise InputError(f"{folder.name}/{rel}", "", "a folder input holds only Parquet files (*.parquet)")
            files.append((rel, path))
    if not files:
        raise InputError(folder.name, "", "the folder holds no Parquet file (*.parquet)")
    files.sort()
    located = InputFile("", folder, "parquet", True, tuple(p for _, p in files))
    keys = set(located.partitions())  # raises on a bad partition folder
    if None in keys and len(keys) > 1:
        raise InputError(folder.name, "", f"mixes files inside and outside {PARTITION_KEY}= partition folders")
    return located.parts


def find_input(data_dir: Path, stem: str) -> tuple[InputFile | None, str | None]:
    """Locate one input in ``data_dir``: (the input, None) or (None, what is wrong).

    Candidates: ``<stem>.csv`` (a file), ``<stem>.parquet`` (a file or a folder of Parquet
    files), ``<stem>/`` (a folder of Parquet files). Exactly one must exist.

    Raises:
        InputError: A folder candidate is not a valid folder input (see :func:`list_parquet_files`).
    """
    candidates: list[InputFile] = []
    csv, parquet, folder = data_dir / f"{stem}.csv", data_dir / f"{stem}.parquet", data_dir / stem
    if csv.is_file():
        candidates.append(InputFile(stem, csv, "csv"))
    if parquet.is_file():
        candidates.append(InputFile(stem, parquet, "parquet"))
    for d in (parquet, folder):
        if d.is_dir():
            candidates.append(InputFile(stem, d, "parquet", True))
    if not candidates:
        return None, "missing"
    if len(candidates) > 1:
        found = ", ".join(c.name + ("/" if c.directory else "") for c in candidates)
        return None, f"ambiguous: {found}"
    found_one = candidates[0]
    if found_one.directory:
        return InputFile(stem, found_one.path, "parquet", True, list_parquet_files(found_one.path)), None
    return found_one, None


def locate_inputs(data_dir: str | Path) -> dict[str, InputFile]:
    """Find ``persons``, ``units`` and ``geo`` in ``data_dir`` (see :func:`find_input`).

    Raises:
        InputError: An input is missing, present in more than one form (ambiguous), or a folder
            input is malformed.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError(str(data_dir), "", "data directory does not exist")
    found: dict[str, InputFile] = {}
    for stem in FILES:
        f, problem = find_input(data_dir, stem)
        if problem == "missing":
            raise InputError(f"{stem}.csv", "", f"is missing from the data directory {data_dir} "
                             f"(expected {stem}.csv, {stem}.parquet or a {stem}/ folder of Parquet files)")
        if problem is not None:
            raise InputError(f"{stem}.csv", "", f"both {stem}.csv and {stem}.parquet exist; keep one "
                             f"({problem.removeprefix('ambiguous: ')})")
        assert f is not None
        found[stem] = f
    return found


def _digest(path: Path, name: str) -> str:
    try:
        return file_digest(path)
    except OSError:
        raise InputError(name, "", "could not be read") from None


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


DIRECTORY_DIGEST_DOMAIN = b"phsafe directory digest v1\n"


def directory_digest(folder: Path, files: dict[str, str]) -> str:
    """SHA-256 identifying a folder input from its files' digests.

    The message is ``DIRECTORY_DIGEST_DOMAIN`` followed, for each file in the order of its
    path relative to the folder (``/``-separated, sorted by code point), by
    ``<relative path> NUL <hex SHA-256 of its bytes> LF`` in UTF-8. It changes when a file is
    added, removed, renamed (e.g. moved to another state's partition) or modified, and does not
    depend on the folder's own name or location, on file times, or on the ignored ``.``/``_``
    files.

    Args:
        folder: The folder (for the relative paths).
        files: Absolute file path (as a string) -> its :func:`file_digest`.
    """
    h = hashlib.sha256(DIRECTORY_DIGEST_DOMAIN)
    for rel, digest in sorted((Path(p).relative_to(folder).as_posix(), d) for p, d in files.items()):
        h.update(f"{rel}\0{digest}\n".encode("utf-8"))
    return h.hexdigest()


def input_digests(files: dict[str, InputFile]) -> dict[str, str]:
    """Input name -> SHA-256; the digests identify the dataset in the audit ledger.

    A single file's digest is the SHA-256 of its bytes; a folder's is :func:`directory_digest`.
    Files are hashed on a few threads (hashing releases the GIL), largest first.
    """
    names = {str(p): f.file_name(p) for f in files.values() for p in f.files}
    try:
        paths = sorted(names, key=lambda p: -os.path.getsize(p))
        with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
            digests = dict(zip(paths, pool.map(lambda p: _digest(Path(p), names[p]), paths)))
    except OSError:
        unreadable = next(n for p, n in names.items() if not os.access(p, os.R_OK)) if names else ""
        raise InputError(unreadable or "input", "", "could not be read") from None
    out = digests_of(files, digests)
    assert out is not None
    return out


def digests_of(files: Mapping[str, InputFile], known: Mapping[str, str]) -> dict[str, str] | None:
    """:func:`input_digests` from the digests of the inputs' files already computed (absolute path
    -> :func:`file_digest`), e.g. as the input pass read them; None when one is not known."""
    if any(str(p) not in known for f in files.values() for p in f.files):
        return None
    out: dict[str, str] = {}
    for f in files.values():
        if f.directory:
            out[f.name] = directory_digest(f.path, {str(p): known[str(p)] for p in f.files})
        else:
            out[f.name] = known[str(f.path)]
    return out


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
    """Read and encode the three inputs of ``data_dir`` (every file of a folder input).

    Raises:
        InputError: A file is missing or malformed, a header is wrong, or a value breaks its
            column's format or domain.
    """
    files = locate_inputs(data_dir)
    tables = {stem: read_table(f) for stem, f in files.items()}
    return InputTables(tables["persons"], tables["units"], tables["geo"], files)




MafidRange = tuple[int, int]
"""MAFIDs ``lo <= m < hi``."""


# --------------------------------------------------------------------------------------------
# What reading finds wrong: one value-free line per problem
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadProblem:
    """A problem found while reading an input: the file, the columns, the rule, a row count.

    ``rule`` says what a valid file satisfies (as validation reports put it); never a value.
    """

    file: str
    columns: tuple[str, ...]
    rule: str
    rows: int | None = None


class Problems:
    """Where reading reports what it finds wrong.

    Args:
        strict: Raise an :class:`~phsafe.errors.InputError` at the first problem (the counting
            without validation); otherwise collect every problem (validation reports them all).
    """

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.found: list[ReadProblem] = []

    def add(self, file: str, rule: str, error: str, columns: Sequence[str] = (), rows: int | None = None) -> None:
        """Report a problem: ``rule`` as validation states it, ``error`` as an input error says it."""
        if self.strict:
            raise InputError(file, ",".join(columns), error, rows=rows)
        self.found.append(ReadProblem(file, tuple(columns), rule, rows))


def check_header(name: str, names: Sequence[str], columns: tuple[Column, ...]) -> None:
    """Raise an :class:`~phsafe.errors.InputError` unless ``names`` are exactly the schema's."""
    expected = [c.name for c in columns]
    names = list(names)
    if names == expected:
        return
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    if missing:
        raise InputError(name, ",".join(missing), "required column is missing from the header")
    if extra:
        shown = [n for n in extra if _IDENTIFIER.match(n)]
        hidden = len(extra) - len(shown)
        listed = ",".join(shown) + (f"{',' if shown else ''}{hidden} other column{'s' if hidden != 1 else ''}"
                                    if hidden else "")
        raise InputError(name, listed, "is not a column of this file")
    raise InputError(name, "", f"columns must be in the order {','.join(expected)} (each named once)")


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


# --------------------------------------------------------------------------------------------
# Raw reading: record batches of the schema's columns, with the structural checks
# --------------------------------------------------------------------------------------------
CSV_BLOCK_BYTES = 16 << 20
"""CSV text per batch (about 700,000 persons rows): bounds memory; larger blocks cost memory,
not speed."""
PARQUET_BATCH_ROWS = 2_000_000
_HEADER_MAX_BYTES = 1 << 16
_OTHER_DELIMITERS = (";", "|", "\t")


@dataclass
class FileBatch:
    """One record batch of one file: the schema columns it has, under their schema names.

    CSV columns arrive as ``binary`` (the exact bytes of each field; an empty field is null);
    Parquet columns as stored (code columns dictionary-encoded when stored as text).
    """

    name: str
    path: Path
    batch: pa.RecordBatch
    nbytes: int = 0
    """Bytes of the file this batch accounts for (read since the previous batch): progress only."""


class SourceReader:
    """Streams one input (a file, or a folder's files) as :class:`FileBatch` es.

    Structural problems -- an empty or unreadable file, a header that is not comma-separated
    or names a column twice, a row with the wrong number of fields, a Parquet column of the
    wrong type -- go to ``problems`` (which raises in strict mode); a file that cannot be read at
    all is skipped and ``complete`` becomes False. Rows that break a structural rule are left
    out (they are counted in the problem; their fields cannot be trusted).

    Args:
        source: The input.
        problems: Where problems are reported.
        columns: Schema columns to read (default: every schema column).
        reads: Called with each file's path when its data is read (tests count reads).
    """

    def __init__(self, source: InputFile, problems: Problems, *, columns: Sequence[str] | None = None,
                 reads: Callable[[Path], None] | None = None, block: tuple[int, int] | None = None) -> None:
        self.source = source
        self.problems = problems
        self.schema = FILES[source.stem]
        self.wanted = tuple(c.name for c in self.schema if columns is None or c.name in columns)
        self.header: list[str] | None = None
        self.complete = True
        self._reads = reads
        self.block = block
        """Read only a block of a single file: ``(start, stop)`` bytes of a CSV file -- the rows
        that *begin* in that range, so that consecutive blocks read every row once -- or row
        groups of a Parquet file (see :func:`csv_blocks`)."""
        self.digests: dict[str, str] = {}
        """SHA-256 (hex) of each CSV file read whole, of the very bytes that were read (path ->
        digest; see :func:`file_digest`)."""

    def batches(self) -> Iterator[FileBatch]:
        for path in self.source.files:
            if self._reads is not None:
                self._reads(path)
            name = self.source.file_name(path)
            parts = self._parquet(path, name) if self.source.format == "parquet" else self._csv(path, name)
            for batch, nbytes in parts:
                yield FileBatch(name, path, batch, nbytes)

    def _fail(self, name: str, rule: str, error: str, columns: Sequence[str] = (), rows: int | None = None,
              *, incomplete: bool = True) -> None:
        if incomplete:
            self.complete = False
        self.problems.add(name, rule, error, columns, rows)

    # ---------------------------------------------------------------------------- CSV
    def _csv_header(self, path: Path, name: str) -> list[str] | None:
        try:
            with open(path, "rb") as fh:
                first = fh.readline(_HEADER_MAX_BYTES)
        except OSError:
            self._fail(name, "the file can be read", "could not be read")
            return None
        if first.startswith(b"\xef\xbb\xbf"):
            first = first[3:]
        if not first.strip():
            self._fail(name, "the file is not empty: it starts with a header row naming its columns",
                       "is empty (a header row is required)")
            return None
        try:
            line = first.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            self._fail(name, "the header row is UTF-8 text", "header row is not valid UTF-8")
            return None
        try:
            # The csv module reads the header as pyarrow reads the rows: quoted fields allowed.
            names = next(csv.reader(io.StringIO(line)), [])
        except csv.Error:
            self._fail(name, "the header row is a well-formed comma-separated line",
                       "header row is not a well-formed comma-separated line")
            return None
        if len(names) <= 1:
            for d in _OTHER_DELIMITERS:
                if d in line:
                    shown = "tab" if d == "\t" else f"'{d}'"
                    self._fail(name, f"the file is comma-separated (its header row has no comma but {shown}s)",
                               f"is not comma-separated (its header row has no comma but {shown}s)")
                    return None
        return names

    def _header_ok(self, name: str, header: list[str]) -> bool:
        """The one check of a file's column names, CSV or Parquet: each named once; and in a
        strict read, exactly the schema's (:func:`check_header` raises)."""
        if len(set(header)) != len(header):
            self._fail(name, "every column is named once", "names a column more than once")
            return False
        if self.problems.strict:
            check_header(name, header, self.schema)
        return True

    def _csv(self, path: Path, name: str) -> Iterator[tuple[pa.RecordBatch, int]]:
        names = self._csv_header(path, name)
        if names is None:
            return
        self.header = names
        if not self._header_ok(name, names):
            return
        # Columns are read under neutral names: a header name is never handed to pyarrow's
        # messages, and columns outside the schema are skipped without being parsed.
        neutral = [f"c{i}" for i in range(len(names))]
        wanted = {f"c{names.index(n)}": n for n in self.wanted if n in names}
        if not wanted:  # no column of the schema: nothing to read beyond the header
            self.complete = False
            return
        bad_rows = [0]

        def on_invalid(row: pacsv.InvalidRow) -> str:  # never look at row.text: it is data
            bad_rows[0] += 1
            return "skip"

        hashing: _HashingReader | None = None
        try:
            # Opened here so that its position tells how far the reading is (progress), and -- a
            # whole file -- so that the SHA-256 of its bytes is computed as they are read.
            if self.block is None:
                hashing = _HashingReader(path)
                source, skip = pa.PythonFile(hashing, mode="r"), 1
            else:
                source, skip = _csv_block(path, *self.block), 0
        except (pa.ArrowException, OSError):
            self._fail(name, "the file can be read", "could not be read")
            return
        position = 0
        try:
            reader = pacsv.open_csv(
                source,
                read_options=pacsv.ReadOptions(column_names=neutral, skip_rows=skip, block_size=CSV_BLOCK_BYTES,
                                               use_threads=True),
                parse_options=pacsv.ParseOptions(delimiter=",", invalid_row_handler=on_invalid),
                convert_options=pacsv.ConvertOptions(
                    include_columns=list(wanted),
                    column_types={k: pa.binary() for k in wanted},
                    null_values=[""],
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=True,
                ),
            )
            for batch in reader:
                now = source.tell()
                yield pa.RecordBatch.from_arrays(batch.columns, names=[wanted[n] for n in batch.schema.names]), \
                    now - position
                position = now
        except (pa.ArrowException, OSError):
            # pyarrow's message quotes the offending row: the rule is stated without it.
            self._fail(name, "the file is well-formed CSV (reading stopped at a row that could not be parsed)",
                       "is not a well-formed comma-separated file (reading stopped at a row that could not "
                       "be parsed)")
            return
        finally:
            source.close()
            if hashing is not None:
                hashing.close()
        if hashing is not None and hashing.digest is not None:
            self.digests[str(path)] = hashing.digest
        if bad_rows[0]:
            self._fail(name, f"every row has the header's {len(names)} comma-separated fields",
                       f"every row must have the header's {len(names)} comma-separated fields", rows=bad_rows[0])

    # ---------------------------------------------------------------------------- Parquet
    def _parquet(self, path: Path, name: str) -> Iterator[tuple[pa.RecordBatch, int]]:
        where = "" if not self.source.directory else f" ({name} is not)"
        try:
            schema = pq.read_schema(path)
        except Exception:  # noqa: BLE001 -- pyarrow's message may quote file content
            self._fail(name if not self.source.directory else self.source.name,
                       "the file is a readable Parquet file" if not self.source.directory
                       else f"every file is a readable Parquet file{where}",
                       "is not a readable Parquet file")
            return
        header = list(schema.names)
        if self.header is not None and self.source.directory and header != self.header:
            self._fail(self.source.name, f"every Parquet file of the folder has the same columns ({name} differs)",
                       f"every Parquet file of the folder has the same columns ({name} differs)")
            return
        if self.header is None:
            self.header = header
        if not self._header_ok(name, header):
            return
        present = [c for c in self.schema if c.name in header and c.name in self.wanted]
        if not present:
            self.complete = False
            return
        text_codes = []
        for c in present:
            t = schema.field(c.name).type
            t = t.value_type if pa.types.is_dictionary(t) else t
            text = pa.types.is_string(t) or pa.types.is_large_string(t)
            if c.kind is ColumnKind.CODE and not text:
                self._fail(self.source.name, "is stored as text (a Parquet string column), so leading zeros are kept",
                           "must be stored as a string code", (c.name,), incomplete=False)
            elif c.kind is ColumnKind.INTEGER and not (text or pa.types.is_integer(t)):
                self._fail(self.source.name, "is stored as an integer or text column",
                           "must be stored as an integer", (c.name,), incomplete=False)
            if c.kind is ColumnKind.CODE and text:
                text_codes.append(c.name)
        try:
            pf = pq.ParquetFile(path, read_dictionary=text_codes)
            size, rows, done = path.stat().st_size, max(1, pf.metadata.num_rows), 0
            groups = None if self.block is None else list(range(*self.block))
            if groups is not None:
                rows = max(1, sum(pf.metadata.row_group(g).num_rows for g in groups))
                size = sum(pf.metadata.row_group(g).total_byte_size for g in groups)
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[c.name for c in present],
                                         row_groups=groups):
                # Bytes in proportion to the rows (progress): the file's share read so far.
                now = size * min(rows, done + batch.num_rows) // rows
                yield batch, now - size * done // rows
                done += batch.num_rows
        except Exception:  # noqa: BLE001 -- pyarrow's message may quote file content
            self._fail(self.source.name, "the file is a readable Parquet file (reading stopped at a corrupt page)",
                       "is not a readable Parquet file (reading stopped at a corrupt page)")


class _HashingReader(io.RawIOBase):
    """A file read from start to end, its SHA-256 computed on the bytes as they are read (hashing
    releases the GIL): ``digest`` once every byte is read, else None."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 -- closed by close()
        self._size = os.fstat(self._file.fileno()).st_size
        self._hash = hashlib.sha256()
        self._position = 0
        self.digest: str | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer) -> int:  # noqa: ANN001 -- a writable buffer
        n = self._file.readinto(buffer)
        if n:
            self._hash.update(memoryview(buffer)[:n])
            self._position += n
        elif self.digest is None and self._position == self._size:
            self.digest = self._hash.hexdigest()
        return n

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        if data:
            self._hash.update(data)
            self._position += len(data)
        elif self.digest is None and self._position == self._size:
            self.digest = self._hash.hexdigest()
        return data

    def close(self) -> None:
        if self.digest is None and self._position == self._size and not self._file.closed:
            if not self._file.read(1):  # every byte was read: the file ends here
                self.digest = self._hash.hexdigest()
        self._file.close()
        super().close()


def _csv_block(path: Path, start: int, stop: int) -> pa.BufferReader:
    """The bytes of the rows of a CSV file that begin in ``[start, stop)`` (the header row is
    never one of them), memory-mapped: a row begins at the byte after a line break."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header_end = len(fh.readline())

        def row_start(at: int) -> int:  # the first row beginning at or after ``at``
            if at <= header_end:
                return header_end
            if at >= size:
                return size
            fh.seek(at - 1)
            return at - 1 + len(fh.readline())

        begin, end = row_start(start), row_start(stop)
    if end <= begin:
        return pa.BufferReader(b"")
    return pa.BufferReader(pa.memory_map(str(path)).read_at(end - begin, begin))


def csv_blocks(path: Path, block_bytes: int) -> list[tuple[int, int]]:
    """Consecutive byte ranges of about ``block_bytes`` covering a CSV file: read as
    :class:`SourceReader` blocks, they read each row exactly once."""
    size = path.stat().st_size
    n = max(1, -(-size // max(1, block_bytes)))
    bounds = [size * i // n for i in range(n + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def parquet_blocks(path: Path, block_rows: int) -> list[tuple[int, int]]:
    """Consecutive ranges of a Parquet file's row groups of about ``block_rows`` rows each."""
    meta = pq.ParquetFile(path).metadata
    out, first, rows = [], 0, 0
    for g in range(meta.num_row_groups):
        rows += meta.row_group(g).num_rows
        if rows >= block_rows:
            out.append((first, g + 1))
            first, rows = g + 1, 0
    if first < meta.num_row_groups or not out:
        out.append((first, meta.num_row_groups))
    return out


def prefetched(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """``items``, produced ``depth`` ahead on a background thread.

    Reading releases the GIL (pyarrow parses and decompresses in C++), so the next batch or
    partition is read while this thread works on the current one. An exception raised while
    producing is raised here, at the item it stopped at.
    """
    out: queue.Queue[tuple[bool, T | BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        out.put((True, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            out.put((False, None))
        except BaseException as exc:  # noqa: BLE001 -- handed to the consumer
            out.put((False, exc))

    thread = threading.Thread(target=produce, name="phsafe-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            more, item = out.get()
            if isinstance(item, BaseException):
                raise item
            if not more:
                return
            yield cast(T, item)
    finally:
        stop.set()
        close = getattr(items, "close", None)
        thread.join(timeout=5)
        if close is not None and not thread.is_alive():
            close()


# --------------------------------------------------------------------------------------------
# Encoding: each column's values checked against its format and domain, as compact integers
# --------------------------------------------------------------------------------------------
OK, NULL, MALFORMED, OUT_OF_RANGE, NOT_IN_SET, NOT_UTF8 = 0, 1, 2, 3, 4, 5
"""What is wrong with a row's value of one column (see :class:`Encoded`), in the order an input
error reports them."""

INT_NULL_CLASS = 0
INT_EXACT_MAX = 1 << 53
"""Integers up to this are their own class (``value + 1``); others are classes of a
:class:`ClassBook` (negative integers, and integers of more digits than this)."""


@dataclass
class Encoded:
    """One column of one batch, checked.

    Attributes:
        column: The schema column.
        values: The integer each row spells (compact dtype); meaningless where ``kind`` is not OK.
        kind: Per row: ``OK``, ``NULL`` (empty), ``MALFORMED`` (not the column's format: not a
            code of its width, not a whole number), ``OUT_OF_RANGE`` or ``NOT_IN_SET`` (well
            formed, outside the domain) or ``NOT_UTF8``; None when every row is OK.
        classes: Per row, the class of the value as validation sees it (see :class:`ClassBook`);
            None when it follows from ``values`` (every row well formed).
    """

    column: Column
    values: np.ndarray
    kind: np.ndarray | None = None
    classes: np.ndarray | None = None

    @property
    def all_ok(self) -> bool:
        return self.kind is None

    def take(self, rows: np.ndarray) -> "Encoded":
        """The rows ``rows`` (a mask or indices) of this column."""
        return Encoded(self.column, self.values[rows], None if self.kind is None else self.kind[rows],
                       None if self.classes is None else self.classes[rows])

    def problems(self, rows: np.ndarray | None = None) -> dict[int, int]:
        """Rows of each failing kind (among ``rows``, a mask, if given)."""
        if self.kind is None:
            return {}
        kind = self.kind if rows is None else self.kind[rows]
        counts = np.bincount(kind, minlength=NOT_UTF8 + 1)
        return {k: int(counts[k]) for k in (NOT_UTF8, NULL, MALFORMED, OUT_OF_RANGE, NOT_IN_SET) if counts[k]}

    def class_view(self) -> tuple[np.ndarray, int]:
        """The classes as ``(array, offset)`` -- class = array + offset -- without a copy when
        they follow from the values."""
        if self.classes is not None:
            return self.classes, 0
        return self.values, 0 if self.column.kind is ColumnKind.CODE else 1

    def class_of_rows(self) -> np.ndarray:
        """The class of each row (int64)."""
        if self.classes is not None:
            return self.classes
        if self.column.kind is ColumnKind.CODE:
            return self.values.astype(np.int64)
        return self.values.astype(np.int64) + 1

    def compact(self) -> np.ndarray:
        """The values as int32 with ``INVALID`` (-1) where a row is not OK."""
        out = self.values.astype(np.int32)
        if self.kind is not None:
            out[self.kind != OK] = INVALID
        return out


INVALID = -1


class ClassBook:
    """The classes of one column's values, as validation sees them, over a whole input.

    A code column's value is its exact text; an integer column's value is the number its digits
    spell (null when it is not a whole number written in digits). Rows with the same value have
    the same class, so rules are evaluated once per distinct combination of classes:

    * a code of width ``w`` written with exactly ``w`` ASCII digits is the class of the integer
      it spells (0 .. 10**w - 1: the text and the integer determine each other); an empty value
      is ``10**w``; any other text is a class from ``10**w + 1`` on, numbered in this book;
    * an integer column's value ``v`` in ``0 .. 2**53`` is class ``v + 1``; null is class 0;
      other numbers (negative, or too large to be exact in float64) are classes numbered in
      this book from ``2**53 + 2`` on.
    """

    def __init__(self, column: Column) -> None:
        self.column = column
        self.code = column.kind is ColumnKind.CODE
        width = column.width or 0
        self.null_class = 10**width if self.code else INT_NULL_CLASS
        self.first_extra = self.null_class + 1 if self.code else INT_EXACT_MAX + 2
        self._extra: dict[object, int] = {}
        self._values: list[object] = []

    def extra(self, values: Sequence[object]) -> np.ndarray:
        """The classes of values outside the regular classes (strings or floats)."""
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            cls = self._extra.get(v)
            if cls is None:
                cls = self._extra[v] = self.first_extra + len(self._values)
                self._values.append(v)
            out[i] = cls
        return out

    def value(self, cls: int) -> object:
        """What validation sees for class ``cls``: text (or None) for a code, a float (NaN for null)
        for an integer."""
        if self.code:
            if cls < self.null_class:
                return f"{cls:0{self.column.width}d}"
            if cls == self.null_class:
                return None
            return self._values[cls - self.first_extra]
        if cls == INT_NULL_CLASS:
            return float("nan")
        if cls < self.first_extra:
            return float(cls - 1)
        return self._values[cls - self.first_extra]

    def values(self, classes: np.ndarray) -> list[object]:
        return [self.value(int(c)) for c in classes]


def _compact_dtype(c: Column) -> np.dtype:
    if c.dtype is not None:
        return np.dtype(c.dtype)
    width = c.width or 18
    return np.dtype(np.uint8 if width <= 2 else np.uint16 if width <= 4 else np.uint32 if width <= 9 else np.int64)


@functools.cache
def _outside_set(c: Column, size: int) -> np.ndarray:
    """Lookup table over ``0 .. size - 1``: True where the value is not in ``c.allowed``."""
    assert c.allowed is not None
    table = np.ones(size, dtype=bool)
    table[[v for v in c.allowed if v < size]] = False
    return table


def _domain_kind(c: Column, values: np.ndarray) -> np.ndarray | None:
    """Per row of well-formed ``values``: ``OK``, ``OUT_OF_RANGE`` or ``NOT_IN_SET``; None if
    every row is inside ``c``'s domain (the usual case: decided by a minimum, a maximum or one
    lookup per row, without temporaries)."""
    if not len(values):
        return None
    kind = None
    lo, hi = int(values.min()), int(values.max())
    if c.minimum is not None and (lo < c.minimum or hi > c.maximum):
        kind = np.where((values < c.minimum) | (values > c.maximum), OUT_OF_RANGE, OK).astype(np.uint8)
    if c.allowed is not None:
        first, last = min(c.allowed), max(c.allowed)
        if len(c.allowed) == last - first + 1:  # a range of codes: the extremes decide
            if lo >= first and hi <= last:
                return kind
            missing = (values < first) | (values > last)
        elif values.dtype.itemsize <= 2 and values.dtype.kind == "u":
            missing = _outside_set(c, 1 << (8 * values.dtype.itemsize))[values]
        else:
            table = _outside_set(c, last + 2)  # the last entry stands for everything above
            missing = table[np.clip(values, 0, last + 1).astype(np.intp)] | (values < 0)
        if missing.any():
            if kind is None:
                kind = np.zeros(len(values), np.uint8)
            kind[(kind == OK) & missing] = NOT_IN_SET
    return kind


def encode(c: Column, arr: pa.Array, book: ClassBook | None = None) -> Encoded:
    """Check one column of a batch against its format and domain, as compact integers.

    Args:
        c: The schema column.
        arr: Its values: text (``binary`` from CSV, ``string`` or dictionary-encoded text from
            Parquet) or integers (Parquet).
        book: Where validation's classes of irregular values are numbered (None: no classes
            are computed -- the counting without validation).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_dictionary(t):
        return _encode_dictionary(c, arr, book)
    if pa.types.is_integer(t):
        if c.kind is ColumnKind.INTEGER:
            return _encode_integers(c, arr, book)
        arr = arr.cast(pa.string())  # a code stored as a number (reported): its digits as text
        t = arr.type
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        fast = _fast_digits(arr, c)
        if fast is None:
            return _encode_text_slowly(c, arr, book)
        values = fast
        kind = _domain_kind(c, values)
        if kind is None:
            return Encoded(c, values.astype(_compact_dtype(c)))
        classes = None
        if book is not None:
            classes = values.astype(np.int64) + (0 if c.kind is ColumnKind.CODE else 1)
        return Encoded(c, np.where(kind == OK, values, 0).astype(_compact_dtype(c)), kind, classes)
    # An unusable type (reported when the file was opened): every value is missing.
    n = len(arr)
    return Encoded(c, np.zeros(n, _compact_dtype(c)), np.full(n, NULL, np.uint8),
                   None if book is None else np.full(n, book.null_class, np.int64))


def _encode_dictionary(c: Column, arr: pa.DictionaryArray, book: ClassBook | None) -> Encoded:
    """Each distinct value is checked once, then expanded through the indices."""
    inner = encode(c, arr.dictionary, book)
    indices = arr.indices
    if indices.null_count:
        # A null index is a missing value: an extra dictionary slot that says so.
        idx = indices.fill_null(len(arr.dictionary)).to_numpy(zero_copy_only=False)
        values = np.concatenate([inner.values, np.zeros(1, inner.values.dtype)])
        kind = np.concatenate([inner.kind if inner.kind is not None else np.zeros(len(arr.dictionary), np.uint8),
                               np.array([NULL], np.uint8)])
        classes = None
        if book is not None:
            classes = np.concatenate([inner.class_of_rows(), np.array([book.null_class], np.int64)])
        return Encoded(c, np.take(values, idx), np.take(kind, idx), None if classes is None else np.take(classes, idx))
    # np.take, not values[idx]: numpy's fancy indexing is 2-3x slower with int32 indices.
    idx = indices.to_numpy(zero_copy_only=False)
    if inner.kind is None:
        return Encoded(c, np.take(inner.values, idx))
    kind = np.take(inner.kind, idx)
    if not kind.any():  # only unused dictionary entries are irregular: no row is
        return Encoded(c, np.take(inner.values, idx))
    return Encoded(c, np.take(inner.values, idx), kind, None if book is None else np.take(inner.class_of_rows(), idx))


def _encode_integers(c: Column, arr: pa.Array, book: ClassBook | None) -> Encoded:
    n = len(arr)
    kind = None
    if arr.null_count:
        kind = np.where(arr.is_null().to_numpy(zero_copy_only=False), NULL, OK).astype(np.uint8)
        arr = arr.fill_null(0)
    raw = arr.to_numpy(zero_copy_only=False)
    signed = np.issubdtype(raw.dtype, np.signedinteger)
    assert c.minimum is not None and c.maximum is not None
    if kind is None and len(raw) and int(raw.min()) >= c.minimum and int(raw.max()) <= c.maximum:
        domain = _domain_kind(c, raw)  # within the range: only a code list can still refuse
        if domain is None:
            return Encoded(c, raw.astype(_compact_dtype(c)))
    # Compared in the column's own type: a uint64 beyond int64 never wraps into the range.
    in_range = (raw >= max(c.minimum, 0)) & (raw <= c.maximum)
    values = np.where(in_range, raw, 0)
    domain = _domain_kind(c, values)
    if domain is not None or not in_range.all():
        kind = np.zeros(n, np.uint8) if kind is None else kind
        kind[(kind == OK) & ~in_range] = OUT_OF_RANGE
        if domain is not None:
            kind[kind == OK] = domain[kind == OK]
    values = values.astype(_compact_dtype(c))
    if kind is not None and not kind.any():
        kind = None
    if kind is None:
        return Encoded(c, values)
    classes = None
    if book is not None:
        classes = np.empty(n, np.int64)
        exact = (raw >= 0) & (raw <= INT_EXACT_MAX) if signed else raw <= INT_EXACT_MAX
        classes[exact] = raw[exact].astype(np.int64) + 1
        other = ~exact
        if other.any():
            classes[other] = book.extra([float(v) for v in raw[other].tolist()])
        classes[kind == NULL] = INT_NULL_CLASS
    return Encoded(c, values, kind, classes)


def _buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """Offsets (int64, relative) and bytes of a text array, or None if it has nulls."""
    if arr.null_count:
        return None
    _, offsets_buf, data_buf = arr.buffers()
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data[offsets[0]: offsets[-1]] if len(offsets) else data[:0]


_DIGIT = np.uint8(48)


def _fixed_width_digits(data: np.ndarray, n: int, width: int) -> np.ndarray | None:
    """The integers ``n`` fields of exactly ``width`` ASCII digits spell, else None."""
    digits = data - _DIGIT  # wraps: anything but '0'..'9' becomes > 9
    if digits.max(initial=0) > 9:
        return None
    if width == 1:
        return digits
    dtype = np.uint8 if width <= 2 else np.uint16 if width <= 4 else np.uint32 if width <= 9 else np.uint64
    d = digits.reshape(n, width)
    out = d[:, 0].astype(dtype)
    ten = dtype(10)
    for j in range(1, width):
        out *= ten
        out += d[:, j]
    return out


def _fast_digits(arr: pa.Array, c: Column) -> np.ndarray | None:
    """The integers the values spell when every value is well formed -- checked on the raw
    bytes, much faster than a regular expression -- else None (then the slow path finds and
    counts the rows of each problem)."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, _compact_dtype(c))
    parts = _buffers(arr)
    if parts is None:
        return None
    offsets, data = parts
    total = int(offsets[-1] - offsets[0])
    values: np.ndarray | None
    if c.kind is ColumnKind.CODE:
        assert c.width is not None
        if total != n * c.width or (c.width > 1 and (np.diff(offsets) != c.width).any()):
            return None
        values = _fixed_width_digits(data, n, c.width)
    else:
        lengths = np.diff(offsets)
        shortest, longest = int(lengths.min()), int(lengths.max())
        if shortest < 1 or longest > 18:
            return None
        if shortest == longest and longest <= 9:
            values = _fixed_width_digits(data, n, longest)
        else:
            if (data - _DIGIT).max(initial=0) > 9:
                return None
            text = arr if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) else arr.view(
                pa.large_string() if pa.types.is_large_binary(arr.type) else pa.string())
            values = pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False)
    return values


def _encode_text_slowly(c: Column, arr: pa.Array, book: ClassBook | None) -> Encoded:
    """Text with an empty, malformed or non-UTF-8 value: each row's kind, one pass per rule."""
    n = len(arr)
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        arr, utf8 = _as_text(arr)
    else:
        utf8 = None
    kind = np.zeros(n, np.uint8)
    is_null = arr.is_null().to_numpy(zero_copy_only=False)
    kind[is_null] = NULL
    if utf8 is not None:
        kind[~utf8] = NOT_UTF8
    pattern = f"^[0-9]{{{c.width}}}$" if c.kind is ColumnKind.CODE else "^[0-9]+$"
    well = pc.fill_null(pc.match_substring_regex(arr, pattern), False).to_numpy(zero_copy_only=False) & (kind == OK)
    values = np.zeros(n, np.int64)
    floats = None
    if well.any():
        digits = pc.filter(arr, pa.array(well))
        if c.kind is ColumnKind.CODE:
            values[well] = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
        else:
            lengths = pc.utf8_length(digits).to_numpy(zero_copy_only=False)
            short = lengths <= 18
            parsed = np.zeros(len(digits), np.int64)
            if short.any():
                parsed[short] = pc.cast(pc.filter(digits, pa.array(short)), pa.int64()).to_numpy(zero_copy_only=False)
            values[well] = parsed
            floats = np.full(n, np.nan)
            if (~short).any():  # more digits than int64 holds: a number far outside any range
                huge = np.flatnonzero(well)[~short]
                floats[huge] = pc.cast(pc.filter(digits, pa.array(~short)), pa.float64()).to_numpy(
                    zero_copy_only=False)
                values[huge] = -1
    kind[(kind == OK) & ~well] = MALFORMED
    huge = np.isfinite(floats) if floats is not None else None
    domain = _domain_kind(c, values)
    if domain is not None:
        kind[kind == OK] = domain[kind == OK]
    if huge is not None and huge.any():
        kind[huge & (kind == OK)] = OUT_OF_RANGE
    compact = np.where(kind == OK, values, 0).astype(_compact_dtype(c))
    classes = None
    if book is not None:
        classes = np.empty(n, np.int64)
        if c.kind is ColumnKind.CODE:
            classes[well] = values[well]
            classes[is_null] = book.null_class
            other = ~well & ~is_null & (kind != NOT_UTF8)
            if other.any():
                classes[other] = book.extra(pc.filter(arr, pa.array(other)).to_pylist())
        else:
            exact = well & (values >= 0) & (values <= INT_EXACT_MAX)
            classes[exact] = values[exact] + 1
            classes[~well] = INT_NULL_CLASS  # not a whole number written in digits: null
            other = well & ~exact
            if other.any():
                assert floats is not None
                classes[other] = book.extra(floats[other].tolist())
        classes[kind == NOT_UTF8] = book.null_class  # such rows are left out of validation
    return Encoded(c, compact, kind, classes)


def _as_text(arr: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """A binary array as text; the rows holding invalid UTF-8 (a mask of valid rows) if any,
    those rows as null."""
    try:
        return arr.cast(pa.large_string() if pa.types.is_large_binary(arr.type) else pa.string()), None
    except pa.ArrowInvalid:
        pass
    valid = np.array([_is_utf8(v) for v in arr.to_pylist()], dtype=bool)  # rare: the file is rejected
    masked = pc.if_else(pa.array(valid), arr, pa.scalar(None, arr.type))
    return masked.cast(pa.large_string() if pa.types.is_large_binary(arr.type) else pa.string()), valid


def _is_utf8(value: bytes | None) -> bool:
    if value is None:
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def value_error(c: Column, kind: int) -> str:
    """How an input error states the rule a value of kind ``kind`` breaks."""
    if kind == NULL:
        return "must not be empty"
    if kind == NOT_UTF8:
        return "contains bytes that are not valid UTF-8"
    if kind == MALFORMED:
        if c.kind is ColumnKind.CODE:
            return f"must be a {c.width}-digit code (leading zeros kept)"
        return "must be a non-negative whole number"
    if kind == OUT_OF_RANGE:
        return f"must be between {c.minimum} and {c.maximum}"
    shown = c.allowed_strings() or []
    listing = ", ".join(shown) if len(shown) <= 12 else f"{shown[0]} ... {shown[-1]}"
    return f"must be one of {listing}"


def raise_value_problems(name: str, encoded: Encoded, rows: np.ndarray | None = None) -> None:
    """Raise the input error of the first problem of ``encoded`` (among ``rows``), if any."""
    for kind, count in encoded.problems(rows).items():
        raise InputError(name, encoded.column.name, value_error(encoded.column, kind), rows=count)


# --------------------------------------------------------------------------------------------
# Strict reading of one input into compact columns (the counting without validation)
# --------------------------------------------------------------------------------------------
def read_table(f: InputFile, *, mafid_range: MafidRange | None = None,
               keep: Callable[[np.ndarray], np.ndarray] | None = None) -> Columns:
    """Read one input into compact columns (the columns the engine keeps), batch by batch.

    Args:
        f: The input (every file of it: a file, or a folder's ``parts``).
        mafid_range: Keep only the rows whose MAFID lies in this range. Every row's MAFID is
            checked; the other columns of rows outside the range are neither checked nor kept,
            so a reading of the whole MAFID range in pieces checks every row exactly once.
        keep: Given each batch's MAFIDs, the rows to keep (e.g. the state filter); the other
            columns of the other rows are neither checked nor kept.

    Raises:
        InputError: A file is malformed, a header is wrong, or a value breaks its column's
            format or domain.
    """
    columns = FILES[f.stem]
    kept = [c for c in columns if c.dtype is not None]
    mafid = next(c for c in kept if c.name == "MAFID")
    reader = SourceReader(f, Problems(strict=True), columns=[c.name for c in kept])
    parts: dict[str, list[np.ndarray]] = {c.name: [] for c in kept}
    # A strict reader checks every file's header against the schema before its first batch.
    for item in reader.batches():
        batch = item.batch
        m = encode(mafid, batch.column(batch.schema.get_field_index("MAFID")))
        raise_value_problems(item.name, m)
        rows = None
        if mafid_range is not None:
            rows = (m.values >= mafid_range[0]) & (m.values < mafid_range[1])
        if keep is not None:
            k = keep(m.values)
            rows = k if rows is None else rows & k
        if rows is not None and rows.all():
            rows = None
        for c in kept:
            e = m if c is mafid else encode(c, batch.column(batch.schema.get_field_index(c.name)))
            raise_value_problems(item.name, e, rows)
            parts[c.name].append(e.values if rows is None else e.values[rows])
    out: Columns = {}
    for c in kept:  # one column at a time, releasing its batches: peak is data + one column
        chunks = parts.pop(c.name)
        out[c.name] = np.concatenate(chunks) if chunks else np.empty(0, dtype=c.dtype)
        del chunks
    return out
