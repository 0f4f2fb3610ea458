"""Spill files: a partition too large for memory, routed by MAFID range to the work folder.

When a partition of the input pass does not fit in its memory budget (:mod:`phsafe.memory`),
:class:`phsafe.intake.InputPass` streams its files once -- each batch parsed, checked,
validated and reduced to compact columns as usual -- and, instead of keeping the rows, hands
them to a :class:`SpillWriter`, which routes each row to the *bucket* of its MAFID
(:class:`BucketPlan`) and writes the buckets as Arrow IPC files with pyarrow's dataset writer
(``pyarrow.dataset.write_dataset``, partitioned by bucket, rows in the order they were read). The
pass then reads the buckets back one at a time (:func:`read_bucket`) and joins, validates and
counts each: every rule of the count and of the cross-file validation is decided per MAFID, and a
MAFID's records are all in one bucket, so the buckets give exactly what the whole partition gives.

Bucket bounds are quantiles of a sample of the MAFIDs (:func:`plan_buckets`: a few hundred
kilobytes read from evenly spaced places of each file, weighted by what each file's rows cost in
memory), so buckets hold about as many records each whatever the MAFIDs' distribution. A row whose
MAFID is not valid goes to the first bucket: it joins nothing.

Spill files hold confidential records (compact columns: codes as the integers they spell, a null
where a value broke its column's rule). They live only in a folder of the run's confidential work
folder (:class:`SpillArea`), made private to the user (mode 0700), and are removed when the pass
ends -- whether it succeeds or fails -- and, should a process be killed, when the run is resumed
(the area is emptied before a pass starts).
"""

from __future__ import annotations

import io
import os
import queue
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from phsafe.errors import PHSafeError
from phsafe.parameters import option
from phsafe.reader import NULL, OK, Encoded, InputFile, encode
from phsafe.schema import FILES, MAFID_MAX, MAFID_MIN, Column

SPILLED_COLUMNS: dict[str, tuple[Column, ...]] = {
    stem: tuple(c for c in columns if c.dtype is not None) for stem, columns in FILES.items()
}
"""The columns a spill file holds: those the pass keeps (engine and cross-file columns)."""
_BUCKET = "bucket"
_FILE_NAME = re.compile(r"^block-(\d+)-(\d+)\.arrow$")
SAMPLE_WINDOWS = 48
"""Places of a file a bucket plan samples (evenly spaced)."""
SAMPLE_WINDOW_BYTES = 1 << 18


# --------------------------------------------------------------------------------------------
# Buckets
# --------------------------------------------------------------------------------------------
_BLOCK_BITS = 10
_SPLIT = np.uint16(0xFFFF)  # more buckets than MAX_BUCKETS (4,096) never exist
_TABLES: dict[tuple[int, ...], np.ndarray] = {}


@dataclass(frozen=True)
class BucketPlan:
    """MAFID ranges: bucket ``b`` holds ``cuts[b-1] <= MAFID < cuts[b]`` (open at both ends).

    Attributes:
        cuts: Increasing MAFIDs, one fewer than the buckets.
    """

    cuts: tuple[int, ...]

    @property
    def buckets(self) -> int:
        return len(self.cuts) + 1

    def bucket_of(self, mafid: np.ndarray) -> np.ndarray:
        """The bucket of each MAFID (``uint16``): what a binary search of the cuts gives, found
        by a table over MAFID blocks of 1,024 (:meth:`_table`) -- a binary search only for the
        MAFIDs of the few blocks a cut splits. Every row of a national file passes here."""
        if not self.cuts:
            return np.zeros(len(mafid), np.uint16)
        table = self._table()
        block = mafid.astype(np.int64) - MAFID_MIN
        np.clip(block, 0, None, out=block)
        block >>= _BLOCK_BITS
        np.minimum(block, len(table) - 1, out=block)
        out = np.take(table, block)
        split = np.flatnonzero(out == _SPLIT)
        if len(split):
            out[split] = self._search(np.take(mafid, split))
        return out

    def _search(self, mafid: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.cuts, dtype=np.int64), mafid.astype(np.int64),
                               side="right").astype(np.uint16)

    def _table(self) -> np.ndarray:
        """The bucket of each block of 1,024 MAFIDs from ``MAFID_MIN`` (``_SPLIT``: a cut lies
        inside the block); MAFIDs below ``MAFID_MIN`` read block 0, above ``MAFID_MAX`` the last."""
        table = _TABLES.get(self.cuts)
        if table is None:
            starts = MAFID_MIN + (np.arange(((MAFID_MAX - MAFID_MIN) >> _BLOCK_BITS) + 1, dtype=np.int64)
                                  << _BLOCK_BITS)
            table = self._search(starts)
            last = self._search(starts + (1 << _BLOCK_BITS) - 1)
            table[table != last] = _SPLIT
            first_below = self._search(np.array([np.iinfo(np.int32).min], np.int64))[0]
            if table[0] != first_below:  # MAFIDs below MAFID_MIN (invalid ones read as 0) are in block 0
                table[0] = _SPLIT
            top = self._search(np.array([np.iinfo(np.int64).max], np.int64))[0]
            if table[-1] != top:
                table[-1] = _SPLIT
            while len(_TABLES) >= 4:  # a process runs a few plans at most: keep the latest
                del _TABLES[next(iter(_TABLES))]
            _TABLES[self.cuts] = table
        return table

    def range_of(self, bucket: int) -> tuple[int, int]:
        """``[lo, hi)`` of a bucket's valid MAFIDs."""
        lo = MAFID_MIN if bucket == 0 else self.cuts[bucket - 1]
        hi = MAFID_MAX + 1 if bucket == len(self.cuts) else self.cuts[bucket]
        return lo, hi


def equal_width(buckets: int) -> BucketPlan:
    """``buckets`` ranges of equal width over the MAFID domain."""
    bounds = np.linspace(MAFID_MIN, MAFID_MAX + 1, buckets + 1).round().astype(np.int64)[1:-1]
    return BucketPlan(tuple(int(b) for b in np.unique(bounds)))


def plan_buckets(files: Mapping[str, InputFile], buckets: int, weights: Mapping[str, float]) -> BucketPlan:
    """About ``buckets`` MAFID ranges that share the partition's cost evenly.

    Each file is sampled (:func:`sample_mafids`); a sampled MAFID weighs the file's rows per
    sample times ``weights[stem]`` (what a row costs). Falls back to ranges of equal width when
    nothing could be sampled.
    """
    if buckets <= 1:
        return BucketPlan(())
    values, w = [], []
    for stem, f in files.items():
        if not f.files:
            continue
        sample = sample_mafids(f)
        if not len(sample):
            continue
        values.append(sample)
        w.append(np.full(len(sample), f.estimated_rows() * weights.get(stem, 1.0) / len(sample)))
    if not values:
        return equal_width(buckets)
    v = np.concatenate(values)
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(np.concatenate(w)[order])
    targets = cum[-1] * np.arange(1, buckets) / buckets
    cuts = np.unique(v[np.minimum(np.searchsorted(cum, targets), len(v) - 1)])
    cuts = cuts[(cuts > MAFID_MIN) & (cuts <= MAFID_MAX)]
    return BucketPlan(tuple(int(c) for c in cuts))


def sample_mafids(f: InputFile, windows: int = SAMPLE_WINDOWS) -> np.ndarray:
    """Valid MAFIDs from evenly spaced places of an input (a sample for :func:`plan_buckets`).

    CSV: ``windows`` windows of :data:`SAMPLE_WINDOW_BYTES`, each parsed from its first line
    break on; Parquet: the MAFID column of evenly spaced row groups. What cannot be read is
    skipped (the pass reports it); values never leave this function but as the bucket cuts.
    """
    out: list[np.ndarray] = []
    mafid = next(c for c in FILES[f.stem] if c.name == "MAFID")
    paths = f.files
    per_file = max(1, windows // max(1, len(paths)))
    for path in paths[:: max(1, len(paths) // windows)] if len(paths) > windows else paths:
        try:
            arrays = _sample_csv(path, per_file) if f.format == "csv" else _sample_parquet(path, per_file)
        except Exception:  # noqa: BLE001 -- a sample is best effort; pyarrow's message may quote data
            continue
        for arr in arrays:
            e = encode(mafid, arr)
            out.append((e.values if e.kind is None else e.values[e.kind == OK]).astype(np.int64))
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _sample_csv(path: Path, windows: int) -> list[pa.Array]:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header = fh.readline(1 << 16).decode("utf-8-sig", errors="replace").rstrip("\r\n").split(",")
        if "MAFID" not in header:
            return []
        column = f"c{header.index('MAFID')}"
        out = []
        width = max(1 << 12, min(SAMPLE_WINDOW_BYTES, size // windows))  # windows never overlap
        starts = sorted({int(size * i / windows) for i in range(windows)})
        for start in starts:
            fh.seek(start)
            data = fh.read(width)
            first, last = data.find(b"\n"), data.rfind(b"\n")
            if first < 0 or last <= first:
                continue
            table = pacsv.read_csv(
                io.BytesIO(data[first + 1: last + 1]),
                read_options=pacsv.ReadOptions(column_names=[f"c{i}" for i in range(len(header))], use_threads=False),
                parse_options=pacsv.ParseOptions(invalid_row_handler=lambda row: "skip"),
                convert_options=pacsv.ConvertOptions(include_columns=[column], column_types={column: pa.binary()},
                                                     null_values=[""], strings_can_be_null=True),
            )
            out.append(table.column(0).combine_chunks())
    return out


def _sample_parquet(path: Path, windows: int) -> list[pa.Array]:
    pf = pq.ParquetFile(path)
    groups = pf.metadata.num_row_groups
    if "MAFID" not in pf.schema_arrow.names or not groups:
        return []
    picked = sorted({int(groups * (i + 0.5) / windows) for i in range(min(windows, groups))})
    out = []
    for g in picked:
        column = pf.read_row_group(g, columns=["MAFID"]).column(0).combine_chunks()
        step = max(1, len(column) // 4096)
        out.append(column.take(pa.array(np.arange(0, len(column), step))))
    return out


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------
def spill_schema(stem: str) -> pa.Schema:
    return pa.schema([pa.field(_BUCKET, pa.uint16())] +
                     [pa.field(c.name, pa.from_numpy_dtype(np.dtype(c.dtype))) for c in SPILLED_COLUMNS[stem]])


class SpillWriter:
    """Routes one file's checked batches to their buckets, written in the background.

    pyarrow's dataset writer runs on a thread of its own and takes the batches from a short
    queue (``depth`` batches: the producer waits when the disk is slower than the reading), so
    memory stays bounded whatever the file's size. Rows keep their order within a bucket.

    Args:
        folder: The spill folder of the partition (``<area>/<partition>``).
        stem: ``persons``, ``units`` or ``geo``.
        plan: The buckets.
        block: A number put in the files' names (files of a bucket are read back in the order
            of their block numbers: the pieces of a file read in parallel).
    """

    def __init__(self, folder: Path, stem: str, plan: BucketPlan, *, block: int = 0, depth: int = 4) -> None:
        self.folder = Path(folder) / stem
        self.stem = stem
        self.plan = plan
        self.columns = SPILLED_COLUMNS[stem]
        self.schema = spill_schema(stem)
        self.rows = np.zeros(plan.buckets, np.int64)
        """Rows written to each bucket (confidential: sizes the reading, never shown)."""
        self._queue: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=depth)
        self._failed: BaseException | None = None
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, args=(block,), name="phsafe-spill", daemon=True)
        self._thread.start()

    def _batches(self) -> Iterator[pa.RecordBatch]:
        # Runs on a thread of pyarrow's: it must end once the writer has failed or is closed,
        # even if no batch comes (a thread of the writer left waiting here would keep the
        # process from exiting).
        while not self._stop.is_set():
            try:
                batch = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if batch is None:
                return
            yield batch

    def _write(self, block: int) -> None:
        try:
            ds.write_dataset(
                self._batches(), self.folder, schema=self.schema, format="ipc",
                partitioning=ds.partitioning(pa.schema([pa.field(_BUCKET, pa.uint16())]), flavor="hive"),
                basename_template=f"block-{block:06d}-{{i}}.arrow", preserve_order=True,
                max_partitions=max(1024, self.plan.buckets), max_open_files=max(1024, self.plan.buckets + 1),
                existing_data_behavior="overwrite_or_ignore",
            )
        except BaseException as exc:  # noqa: BLE001 -- reported by add() or close()
            self._failed = exc
            self._stop.set()
            while True:  # let a producer waiting on a full queue go on (and find the failure)
                try:
                    if self._queue.get(timeout=0.5) is None:
                        return
                except queue.Empty:
                    if self._closed:
                        return

    def add(self, encoded: Mapping[str, Encoded], rows: int) -> None:
        """Write the rows of one checked batch (a column it lacks is written as invalid)."""
        self._raise_failure()
        mafid = encoded.get("MAFID")
        if mafid is None:
            bucket = np.zeros(rows, np.uint16)
        else:
            values = mafid.values if mafid.kind is None else np.where(mafid.kind == OK, mafid.values, 0)
            bucket = self.plan.bucket_of(values)
        arrays = [pa.array(bucket)]
        for c, field in zip(self.columns, list(self.schema)[1:]):
            e = encoded.get(c.name)
            if e is None:
                arrays.append(pa.nulls(rows, field.type))
            else:
                arrays.append(pa.array(e.values.astype(field.type.to_pandas_dtype(), copy=False),
                                       mask=None if e.kind is None else e.kind != OK))
        self.rows += np.bincount(bucket, minlength=self.plan.buckets)
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        while True:
            try:
                self._queue.put(batch, timeout=0.5)
                return
            except queue.Full:
                self._raise_failure()

    def close(self) -> None:
        """Wait until every batch is on disk.

        Raises:
            PHSafeError: The spill files could not be written (e.g. the disk is full).
        """
        self._finish()
        self._raise_failure()

    def abort(self) -> None:
        """Stop writing (the pass failed); the files are removed with the spill area."""
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join()
        self._stop.set()

    def _raise_failure(self) -> None:
        if self._failed is not None:
            reason = getattr(self._failed, "strerror", None) or "the write failed"
            raise PHSafeError(f"could not write the spill files in the work folder {self.folder.parent}: {reason} "
                              f"(free space, choose another work folder with {option('work_dir')}, or raise "
                              f"{option('memory_limit')})") from None


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------
def bucket_files(folder: Path, stem: str, bucket: int) -> list[Path]:
    """A bucket's files of one input, in the order their rows were read."""
    d = Path(folder) / stem / f"{_BUCKET}={bucket}"
    if not d.is_dir():
        return []
    named = [(m, p) for p in d.iterdir() if (m := _FILE_NAME.match(p.name))]
    return [p for _, p in sorted(named, key=lambda mp: (int(mp[0].group(1)), int(mp[0].group(2))))]


def read_bucket(folder: Path, stem: str, bucket: int, columns: Sequence[str] | None = None
                ) -> Iterator[tuple[dict[str, Encoded], int]]:
    """The rows of one bucket of one input, batch by batch, as checked columns (a value that broke
    its column's rule reads as not OK, as it was when written), with each batch's rows."""
    wanted = [c for c in SPILLED_COLUMNS[stem] if columns is None or c.name in columns]
    for path in bucket_files(folder, stem, bucket):
        with pa.OSFile(str(path)) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                yield {c.name: decode(c, batch.column(batch.schema.get_field_index(c.name))) for c in wanted}, \
                    batch.num_rows


def decode(c: Column, arr: pa.Array) -> Encoded:
    """A spilled column as an :class:`~phsafe.reader.Encoded` column."""
    if arr.null_count == 0:
        return Encoded(c, arr.to_numpy(zero_copy_only=False))
    values = arr.fill_null(0).to_numpy(zero_copy_only=False)
    kind = np.where(arr.is_null().to_numpy(zero_copy_only=False), NULL, OK).astype(np.uint8)
    return Encoded(c, values, kind)


# --------------------------------------------------------------------------------------------
# Where spill files live
# --------------------------------------------------------------------------------------------
SPILL_FOLDER = "spill"
"""The spill area's name inside a run's work folder."""


class SpillArea:
    """The folder of a pass's spill files, made on first use and removed at :meth:`close`.

    Args:
        root: The folder to use (a run's ``<work folder>/spill``): emptied first -- it can only
            hold what a killed earlier attempt of the same run left -- and removed at the end. None:
            a new private folder in the system's temporary folder (commands without a work folder).
    """

    def __init__(self, root: Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self._path: Path | None = None
        self._parts = 0
        if self.root is not None and (self.root.exists() or self.root.is_symlink()):
            _remove(self.root)  # a killed earlier attempt's spill files

    @property
    def path(self) -> Path:
        if self._path is None:
            try:
                if self.root is None:
                    self._path = Path(tempfile.mkdtemp(prefix="phsafe-spill-"))
                else:
                    self.root.parent.mkdir(parents=True, exist_ok=True)
                    self.root.mkdir(mode=0o700)
                    self._path = self.root
                os.chmod(self._path, 0o700)
            except OSError as exc:
                raise PHSafeError(f"cannot create the spill folder {self.root or tempfile.gettempdir()}: "
                                  f"{exc.strerror or 'failed'} (choose another work folder with "
                                  f"{option('work_dir')})") from None
        return self._path

    def part_folder(self) -> Path:
        """A new folder for one partition's spill."""
        self._parts += 1
        folder = self.path / f"part-{self._parts:04d}"
        folder.mkdir(mode=0o700)
        return folder

    def close(self) -> None:
        """Remove every spill file (idempotent)."""
        if self._path is not None:
            _remove(self._path)
            self._path = None

    def __enter__(self) -> "SpillArea":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove_partition(folder: Path) -> None:
    """Remove one partition's spill as soon as it is counted."""
    _remove(Path(folder))
