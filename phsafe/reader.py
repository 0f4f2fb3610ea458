"""Readers for the three production input files, CSV or Parquet (spec §1).

Files are streamed in record batches and converted batch by batch into compact numpy columns
(``uint8`` codes, ``int32`` MAFIDs), so memory is bounded by the compact form of the data, not by
its text. Every code column is read as a string, and its exact form is checked -- a code keeps its
leading zeros (``"01"`` is not ``"1"``) -- before it is stored as the integer it spells.

Each input is one file (``persons.csv`` or ``persons.parquet``) or a folder of Parquet files
(``persons/`` or ``persons.parquet/``), optionally partitioned by state in the Hive layout::

    DATA/persons/TABBLKST=06/part-0.parquet
    DATA/units/TABBLKST=06/part-0.parquet
    DATA/geo/TABBLKST=06/part-0.parquet

Every Parquet file holds exactly the columns of spec §1 (geo keeps its ``TABBLKST`` column); the
folder name only says where a record is stored. A record belongs in the folder of its unit's
state (its geo row's ``TABBLKST``): :mod:`phsafe.counting` then counts one state at a time.
Files and folders whose names start with ``.`` or ``_`` (``_SUCCESS``, ``.crc``) are ignored.

Errors name the file, the column and the rule, and never carry a value from the file: the
messages of pyarrow's parser, which quote offending rows, are replaced by our own.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

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
        none, and is reported when it is read), estimated from the size for CSV (a persons row
        is about 23 bytes)."""
        if self.format == "csv":
            return self.path.stat().st_size // _CSV_BYTES_PER_PERSON
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
    paths = sorted({str(p) for f in files.values() for p in f.files},
                   key=lambda p: -os.path.getsize(p))
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        digests = dict(zip(paths, pool.map(lambda p: file_digest(Path(p)), paths)))
    out: dict[str, str] = {}
    for f in files.values():
        if f.directory:
            out[f.name] = directory_digest(f.path, {str(p): digests[str(p)] for p in f.files})
        else:
            out[f.name] = digests[str(f.path)]
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


def read_table(f: InputFile, *, mafid_range: MafidRange | None = None) -> Columns:
    """Read one input into compact columns, batch by batch.

    Args:
        f: The input (every file of it: a file, or a folder's ``parts``).
        mafid_range: Keep only the rows whose MAFID lies in this range. Every row's MAFID is
            checked; the other columns of rows outside the range are neither checked nor kept,
            so a reading of the whole MAFID range in pieces checks every row exactly once.

    Raises:
        InputError: A file is malformed, a header is wrong, or a value breaks its column's
            format or domain.
    """
    columns = FILES[f.stem]
    kept = [c for c in columns if c.dtype is not None]
    mafid = next(c for c in kept if c.name == "MAFID")
    parts: dict[str, list[np.ndarray]] = {c.name: [] for c in kept}
    for name, batch in _batches(f, columns, [c.name for c in kept]):
        if mafid_range is not None:
            m = _encode(name, mafid, batch.column(batch.schema.get_field_index("MAFID")))
            inside = (m >= mafid_range[0]) & (m < mafid_range[1])
            if not inside.all():
                batch = batch.filter(pa.array(inside))
            parts["MAFID"].append(m[inside])
        for c in kept:
            if mafid_range is None or c is not mafid:
                parts[c.name].append(_encode(name, c, batch.column(batch.schema.get_field_index(c.name))))
    out: Columns = {}
    for c in kept:  # one column at a time, releasing its batches: peak is data + one column
        chunks = parts.pop(c.name)
        out[c.name] = np.concatenate(chunks) if chunks else np.empty(0, dtype=c.dtype)
        del chunks
    return out


def _check_header(name: str, names: list[str], columns: tuple[Column, ...]) -> None:
    expected = [c.name for c in columns]
    if names == expected:
        return
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    if missing:
        raise InputError(name, ",".join(missing), "required column is missing from the header")
    if extra:
        raise InputError(name, ",".join(extra), "is not a column of this file")
    raise InputError(name, ",".join(names), f"columns must be in the order {','.join(expected)}")


_EXPECTED_COLUMNS = re.compile(r"Expected (\d+) columns, got (\d+)")


def _csv_error(name: str, exc: Exception) -> InputError:
    """Rewrap a pyarrow CSV error without the row text pyarrow quotes."""
    msg = str(exc)
    m = _EXPECTED_COLUMNS.search(msg)
    if m:
        return InputError(name, "", f"a row has {m.group(2)} fields where the header has {m.group(1)}")
    if "UTF8" in msg or "utf-8" in msg.lower() or "utf8" in msg.lower():
        return InputError(name, "", "contains bytes that are not valid UTF-8")
    if "Empty CSV file" in msg or "empty" in msg.lower():
        return InputError(name, "", "is empty (a header row is required)")
    return InputError(name, "", "is not a well-formed comma-separated file")


def _batches(f: InputFile, columns: tuple[Column, ...], wanted: list[str]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """(file name for messages, batch) for every file of ``f``.

    Parquet batches hold only the ``wanted`` columns, code columns dictionary-encoded (a few
    distinct codes per column: their format and domain are checked once per distinct value).
    CSV batches hold every column, as strings.
    """
    for path in f.files:
        name = f.file_name(path)
        if f.format == "parquet":
            yield from ((name, b) for b in _parquet_batches(name, path, columns, wanted))
        else:
            yield from ((name, b) for b in _csv_batches(name, path, columns))


def _parquet_batches(name: str, path: Path, columns: tuple[Column, ...], wanted: list[str]) -> Iterator[pa.RecordBatch]:
    codes = [c.name for c in columns if c.kind is ColumnKind.CODE and c.name in wanted]
    try:
        pf = pq.ParquetFile(path, read_dictionary=codes)
        names = pf.schema_arrow.names
    except Exception:  # noqa: BLE001 -- pyarrow's message may quote file content
        raise InputError(name, "", "is not a readable Parquet file") from None
    _check_header(name, names, columns)
    try:
        yield from pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=wanted)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError):
        raise InputError(name, "", "is not a readable Parquet file (reading stopped at a corrupt page)") from None


def _csv_batches(name: str, path: Path, columns: tuple[Column, ...]) -> Iterator[pa.RecordBatch]:
    if path.stat().st_size == 0:
        raise InputError(name, "", "is empty (a header row is required)")
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        # The csv module reads the header as pyarrow reads the rows: quotes are allowed.
        header = next(csv.reader([first.decode("utf-8").rstrip("\r\n")]), [])
    except UnicodeDecodeError:
        raise InputError(name, "", "header row is not valid UTF-8") from None
    except csv.Error:
        raise InputError(name, "", "header row is not a well-formed comma-separated line") from None
    _check_header(name, header, columns)
    try:
        reader = pacsv.open_csv(
            path,
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
        raise _csv_error(name, exc) from None


def _encode(name: str, c: Column, arr: pa.Array) -> np.ndarray:
    """Check one column batch against its format and domain; return compact integers.

    A dictionary-encoded column is checked and converted on its distinct values, then expanded
    through its indices; failing rows are still counted per row.
    """
    if arr.null_count:
        raise InputError(name, c.name, "must not be empty", rows=arr.null_count)
    if pa.types.is_dictionary(arr.type):
        indices = arr.indices.to_numpy(zero_copy_only=False)
        rows = np.bincount(indices, minlength=len(arr.dictionary))
        return _encode_values(name, c, arr.dictionary, rows)[indices]
    return _encode_values(name, c, arr, None)


def _encode_values(name: str, c: Column, arr: pa.Array, rows: np.ndarray | None) -> np.ndarray:
    """Encode ``arr``; ``rows[i]`` is how many rows value ``i`` stands for (None: one each)."""

    def count(bad: np.ndarray) -> int:
        return int(bad.sum()) if rows is None else int(rows[bad].sum())

    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        values = _ascii_digits(arr, c.width if c.kind is ColumnKind.CODE else None)
        if values is not None:  # every value well formed: only the domain is left to check
            _check_domain(name, c, values, count)
            return values.astype(c.dtype)
        if c.kind is ColumnKind.CODE:
            pattern, rule = f"^[0-9]{{{c.width}}}$", f"must be a {c.width}-digit code (leading zeros kept)"
        else:
            pattern, rule = r"^[0-9]+$", "must be a non-negative whole number"
        ok = pc.match_substring_regex(arr, pattern)
        if not pc.all(ok).as_py():
            bad = count(~ok.to_numpy(zero_copy_only=False))
            if bad:
                raise InputError(name, c.name, rule, rows=bad)
            # only unused dictionary entries are malformed: map them to a value the domain
            # check accepts (no row points at them)
            arr = pc.if_else(ok, arr, pa.scalar("0" * (c.width or 1), arr.type))
        values = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
    elif pa.types.is_integer(arr.type) and c.kind is ColumnKind.INTEGER:
        values = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
    else:
        kind = "a string code" if c.kind is ColumnKind.CODE else "an integer"
        raise InputError(name, c.name, f"must be stored as {kind}")
    _check_domain(name, c, values, count)
    return values.astype(c.dtype)


_POWERS = 10 ** np.arange(18, dtype=np.int64)[::-1]


def _ascii_digits(arr: pa.Array, width: int | None) -> np.ndarray | None:
    """The integers a string array spells if every value is 1-18 ASCII digits (exactly
    ``width`` of them if given), else None.

    Works on the array's raw offsets and bytes: much faster than a regular expression, and a
    fixed-width code is converted without parsing. The slow path, which counts the failing
    rows, runs only when this returns None.
    """
    n = len(arr)
    if n == 0 or arr.null_count:
        return None
    _, offsets_buf, data_buf = arr.buffers()
    wide = pa.types.is_large_string(arr.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32)[arr.offset : arr.offset + n + 1]
    if data_buf is None:
        return None
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]]
    if width is not None:
        if offsets[-1] - offsets[0] != n * width or (np.diff(offsets) != width).any():
            return None
    else:
        lengths = np.diff(offsets)
        if lengths.min() < 1 or lengths.max() > 18:
            return None
    digits = data - np.uint8(48)  # wraps: anything but '0'..'9' becomes > 9
    if digits.max(initial=0) > 9:
        return None
    if width is None:
        return pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
    if width == 1:
        return digits.astype(np.int64)
    return digits.reshape(n, width).astype(np.int64) @ _POWERS[-width:]


def _check_domain(name: str, c: Column, values: np.ndarray,
                  count: Callable[[np.ndarray], int]) -> None:
    if c.minimum is not None:
        bad = count((values < c.minimum) | (values > c.maximum))
        if bad:
            raise InputError(name, c.name, f"must be between {c.minimum} and {c.maximum}", rows=bad)
    if c.allowed is not None:
        allowed = np.zeros(max(c.allowed) + 2, dtype=bool)
        allowed[list(c.allowed)] = True
        inside = values.clip(0, len(allowed) - 1)
        bad = count(~allowed[inside] | (values >= len(allowed) - 1))
        if bad:
            shown = c.allowed_strings() or []
            listing = ", ".join(shown) if len(shown) <= 12 else f"{shown[0]} ... {shown[-1]}"
            raise InputError(name, c.name, f"must be one of {listing}", rows=bad)
