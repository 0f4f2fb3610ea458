"""The counting cut into partitions counted independently, in any order, and added up.

Without validation, the exact counts of an input can be cut into partitions that any process
counts on its own (:func:`count_partition`) and added up (:func:`phsafe.counting.combine_counts`):

* :func:`plan_partitions` -- small, picklable descriptions (file paths, a state, a MAFID range;
  never data);
* :func:`count_partition` -- reads only its partition's rows and returns their exact count cubes
  (states x iteration codes x cells: a few kilobytes) with the content digest of the records it
  tabulated (:mod:`phsafe.fingerprint`).

Partitions are states (the layout checks make sure a MAFID's records are in one state's folders),
or MAFID ranges of the domain (``max_persons``: each range reads the whole input and keeps its
range -- less memory per partition, more reading). A run reads each input once instead
(:func:`phsafe.intake.validated_counts`, or :func:`phsafe.intake.run_cluster_pass` on a cluster).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from phsafe.config import PHSafeConfig
from phsafe.counting import Counting, Counts
from phsafe.errors import InputError
from phsafe.intake.input_pass import InputPass
from phsafe.intake.parts import STEMS, PassPart, StageTimer, no_timer
from phsafe.reader import PARTITION_KEY, InputFile, MafidRange, locate_inputs
from phsafe.schema import MAFID_MAX, MAFID_MIN
from phsafe.tables import TableSpec

__all__ = ["CountingPartition", "count_partition", "plan_partitions"]

Inputs = tuple[InputFile, InputFile, InputFile]


def _three(files: Iterable[InputFile]) -> Inputs:
    persons, units, geo = files
    return persons, units, geo


@dataclass(frozen=True)
class CountingPartition:
    """One independently countable piece of the input: where its rows are, never the rows.

    Attributes:
        label: Public name for logs: ``"06"``, ``"06 [2/5]"``, ``"all"``, ``"all [1/4]"``.
        state: The state of a state partition (its ``TABBLKST=`` folder), or None.
        inputs: The persons, units and geo inputs, restricted to the partition's files.
        mafid_range: Only rows with ``lo <= MAFID < hi`` belong to the partition (None: all).
    """

    label: str
    state: str | None
    inputs: tuple[InputFile, InputFile, InputFile]
    mafid_range: MafidRange | None = None

    @property
    def files(self) -> dict[str, InputFile]:
        return dict(zip(STEMS, self.inputs))


def _ranges(lo: int, hi: int, k: int) -> list[MafidRange]:
    """``[lo, hi)`` cut into ``k`` consecutive ranges of (nearly) equal width."""
    bounds = np.unique(np.linspace(lo, hi, k + 1).round().astype(np.int64))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def _cut_points(mafids: np.ndarray, k: int) -> list[MafidRange]:
    """``k`` MAFID ranges holding about as many of ``mafids`` each, covering the whole domain."""
    if k <= 1 or len(mafids) == 0:
        return [(MAFID_MIN, MAFID_MAX + 1)]
    q = np.quantile(mafids, np.arange(1, k) / k, method="inverted_cdf").astype(np.int64) + 1
    bounds = np.unique(np.concatenate([[MAFID_MIN], q, [MAFID_MAX + 1]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def _split(base: CountingPartition, ranges: list[MafidRange]) -> list[CountingPartition]:
    if len(ranges) == 1:
        return [base]
    return [CountingPartition(f"{base.label} [{i}/{len(ranges)}]", base.state, base.inputs, r)
            for i, r in enumerate(ranges, start=1)]


def _geo_layout(geo: InputFile, by_state: dict[str | None, tuple[Path, ...]],
                slice_states: set[str]) -> dict[str, np.ndarray]:
    """Check the state layout of geo; return the geo MAFIDs of ``slice_states``.

    Every geo row must be in the folder of its own ``TABBLKST``, and no MAFID may have geo rows
    in two state folders (the unpartitioned reading drops a MAFID listed twice; two partitions
    could not see each other's rows). Reads only the MAFID and TABBLKST columns of every geo
    file, TABBLKST dictionary-encoded; the check keeps one bit per possible MAFID (100 MB).

    Raises:
        InputError: A geo row is stored under another state's folder, or a MAFID has geo rows
            in two state folders.
    """
    seen = np.zeros((MAFID_MAX >> 3) + 1, dtype=np.uint8)
    kept: dict[str, np.ndarray] = {}
    for state, paths in sorted(by_state.items(), key=lambda kv: str(kv[0])):
        assert state is not None
        chunks: list[np.ndarray] = []
        for path in paths:
            name = geo.file_name(path)
            try:
                pf = pq.ParquetFile(path, read_dictionary=["TABBLKST"])
                batches = pf.iter_batches(batch_size=4_000_000, columns=["MAFID", "TABBLKST"])
                for batch in batches:
                    st = batch.column(1)
                    codes = st.dictionary.to_pylist() if pa.types.is_dictionary(st.type) else None
                    if codes is not None:
                        # (bincount, not np.unique: numpy 2's hash-based unique is slow here)
                        used = np.flatnonzero(np.bincount(st.indices.fill_null(0).to_numpy(zero_copy_only=False),
                                                          minlength=len(codes)))
                        wrong = any(codes[i] != state for i in used.tolist()) or st.null_count
                    else:
                        wrong = not st.equals(pa.array([state] * len(st), st.type))
                    if wrong:
                        raise InputError(name, "TABBLKST", "every geo row is stored in the partition "
                                         "folder of its own state (TABBLKST=<its TABBLKST>)")
                    chunks.append(np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.int64))
            except InputError:
                raise
            except Exception:  # noqa: BLE001 -- unreadable or mistyped: the partition's reading says how
                continue
        m = np.concatenate(chunks) if chunks else np.empty(0, np.int64)
        m = m[(m >= MAFID_MIN) & (m <= MAFID_MAX)]  # out of range: the reader reports it
        byte, bit = m >> 3, (np.uint8(1) << (m & 7).astype(np.uint8))
        if (seen[byte] & bit).any():
            raise InputError(f"{geo.name}/{PARTITION_KEY}={state}", "MAFID",
                             "a MAFID has geo rows in more than one state partition")
        np.bitwise_or.at(seen, byte, bit)
        if state in slice_states:
            kept[state] = m.astype(np.int32)
    return kept


def plan_partitions(
    config: PHSafeConfig,
    data_dir: Path,
    *,
    max_persons: int | None = None,
    check_layout: bool = True,
) -> list[CountingPartition]:
    """Cut the counting of ``data_dir`` into independent partitions (see the module docstring).

    Cheap: reads file listings and Parquet metadata, and for data stored by state the MAFID and
    TABBLKST columns of geo (the layout check). The result is small and picklable, and never
    empty: with no rows to read there is one partition that counts zeros.

    Args:
        config: The run's config (its ``state_filter`` selects the state partitions).
        data_dir: Folder with the persons, units and geo inputs.
        max_persons: Cut partitions of more persons than this into MAFID ranges (None: whole
            states, or the whole input for data not stored by state).
        check_layout: Check the layout of data stored by state (recommended; skipping it is
            for callers that checked it already).

    Raises:
        InputError: An input is missing, ambiguous or malformed, or data stored by state is not
            stored by state.
    """
    files = locate_inputs(data_dir)
    inputs = _three(files[s] for s in STEMS)
    if not all(f.partitioned for f in inputs):
        whole = CountingPartition("all", None, inputs)
        n = files["persons"].estimated_rows()
        if max_persons is None or n <= max_persons:
            return [whole]
        return _split(whole, _ranges(MAFID_MIN, MAFID_MAX + 1, -(-n // max_persons)))

    by_stem = {f.stem: f.partitions() for f in inputs}
    released = set(config.states)
    present = sorted({k for parts in by_stem.values() for k in parts if k is not None and k in released})
    base = {state: CountingPartition(state, state, _three(
        f.subset(by_stem[f.stem].get(state, ())) for f in inputs)) for state in present}
    big: dict[str, int] = {}
    if max_persons is not None:
        for state, part in base.items():
            n = part.files["persons"].estimated_rows()
            if n > max_persons:
                big[state] = -(-n // max_persons)
    geo_mafids: dict[str, np.ndarray] = {}
    if check_layout:
        geo_mafids = _geo_layout(files["geo"], by_stem["geo"], set(big))
    out: list[CountingPartition] = []
    for state in present:
        if state in big:
            if state in geo_mafids:
                ranges = _cut_points(geo_mafids.pop(state), big[state])
            else:
                ranges = _ranges(MAFID_MIN, MAFID_MAX + 1, big[state])
            out.extend(_split(base[state], ranges))
        else:
            out.append(base[state])
    if not out:  # no released state holds data: one partition that reads nothing counts zeros
        out.append(CountingPartition("empty", None, _three(f.subset(()) for f in inputs)))
    return out




def count_partition(
    partition: CountingPartition,
    config: PHSafeConfig,
    specs: Sequence[TableSpec],
    *,
    key: bytes | None,
    stage: StageTimer = no_timer,
) -> Counts:
    """Exact count cubes of ``specs`` on one partition's rows, and their records' content digest.

    Memory is bounded by the partition: its compact columns (about 23 bytes a person with
    its units and geo rows) and the temporaries of 2M persons at a time.

    Args:
        partition: From :func:`plan_partitions`.
        config: The run's config (state filter and the truncation thresholds τ).
        specs: Tables to count.
        key: Truncation key; ``None`` counts without truncation (the non-private ground truth).
        stage: Stage timer for progress and logs.

    Returns:
        Table name -> exact counts over every released state (zeros outside the partition), with
        the content digest of the partition's tabulated records.

    Raises:
        InputError: An input is unreadable, has inconsistent codes, or is not stored by state
            as its layout says (nothing is spent).
    """
    part = PassPart(partition.label, partition.state, partition.files, partition.mafid_range)
    result = InputPass(partition.files, config.states, counting=Counting.of(config, specs, key),
                       parts=[part], stage=stage).run()
    assert result.counts is not None
    return result.counts
