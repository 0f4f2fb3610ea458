"""Exact count vectors over the full public domain (spec §5, §6).

For each table, every joined record is mapped to its basis cell and to its iteration code at
each iteration level, then counted per state. The result covers every released state, every
iteration code and every basis cell, zeros included; the nation is the sum of the states.

Cell mapping: a table's cells are conjunctions of conditions on small-domain columns, so they are
evaluated once on the grid of all value combinations of the columns involved, giving a lookup
table; each record then costs one gather. A grid point matching two cells is a definition bug;
an in-universe record matching no cell is an input error (inconsistent codes), reported with the
columns involved and a row count -- never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from phsafe.errors import InputError
from phsafe.iterations import NOT_IN_LEVEL, IterationLevel, iteration_index
from phsafe.logs import get_logger
from phsafe.preprocess import MAX_PERSONS_PER_PARTITION, Partition, PreparedData, partitions
from phsafe.reader import Columns
from phsafe.schema import FILES
from phsafe.tables import Cell, Condition, IterationSource, Source, TableKind, TableSpec
from phsafe.truncation import TRUNCATION_KEY_BYTES, Joined, truncate as _truncate, unique_units

log = get_logger("phsafe.tabulate")

_SOURCE_FILE = {Source.PERSON: "persons", Source.UNIT: "units"}


def _column_max(source: Source, column: str) -> int:
    for c in FILES[_SOURCE_FILE[source]]:
        if c.name == column:
            if c.maximum is not None:
                return c.maximum
            assert c.allowed is not None
            return max(c.allowed)
    raise KeyError(f"{source.value}.{column}")


@dataclass(frozen=True)
class CellLookup:
    """A lookup table from the values of a few columns to a basis cell index (-1: none)."""

    columns: tuple[tuple[Source, str], ...]
    strides: tuple[int, ...]
    table: npt.NDArray[np.int16]

    def cell_index(self, person: Columns | None, unit: Columns, person_rows, unit_rows) -> npt.NDArray[np.int16]:
        def column(source: Source, name: str) -> np.ndarray:
            if source is Source.PERSON:
                assert person is not None, "a person column of a table without persons"
                return person[name][person_rows]
            return unit[name][unit_rows]

        if not self.columns:
            return np.zeros(len(unit_rows), dtype=np.int16)
        return self.cell_index_of(column)

    def cell_index_of(self, column: "Callable[[Source, str], np.ndarray]") -> npt.NDArray[np.int16]:
        """The cell of each record, given each column's values of the records."""
        flat: np.ndarray | None = None
        for (source, name), stride in zip(self.columns, self.strides):
            values = column(source, name)
            if flat is None:
                flat = values.astype(np.int32)
                if stride != 1:
                    flat *= stride
            elif stride == 1:
                flat += values
            else:
                flat += values.astype(np.int32) * stride
        if flat is None:
            return np.zeros(len(column(Source.UNIT, "MAFID")), dtype=np.int16)
        return np.take(self.table, flat)


@lru_cache(maxsize=None)
def cell_lookup(basis: tuple[Cell, ...]) -> CellLookup:
    """Evaluate ``basis`` on the grid of its columns' values."""
    columns = tuple(dict.fromkeys((c.source, c.column) for cell in basis for c in cell.conditions))
    sizes = [_column_max(s, col) + 1 for s, col in columns]
    strides = [int(np.prod(sizes[i + 1 :], dtype=np.int64)) for i in range(len(sizes))]
    grid = np.indices(sizes).reshape(len(sizes), -1) if sizes else np.zeros((0, 1), dtype=np.int64)
    table = np.full(grid.shape[1], -1, dtype=np.int16)
    for index, cell in enumerate(basis):
        match = np.ones(grid.shape[1], dtype=bool)
        for cond in cell.conditions:
            axis = columns.index((cond.source, cond.column))
            match &= np.isin(grid[axis], list(cond.values))
        if (table[match] != -1).any():
            raise AssertionError(f"basis cells overlap at cell {cell.number}")
        table[match] = index
    return CellLookup(columns, tuple(strides), table)


def _iteration_columns(spec: TableSpec) -> tuple[Source, str, str] | None:
    if spec.iteration_source is IterationSource.PERSON:
        return (Source.PERSON, "CENRACE", "CENHISP")
    if spec.iteration_source is IterationSource.HOUSEHOLDER:
        return (Source.UNIT, "HHRACE", "HHSPAN")
    return None


@dataclass
class TableCounts:
    """Exact counts of one table: iteration level -> array (states, codes, basis cells)."""

    spec: TableSpec
    by_level: dict[IterationLevel, npt.NDArray[np.int64]] = field(default_factory=dict)

    def add(self, other: "TableCounts") -> None:
        for level, counts in other.by_level.items():
            if level in self.by_level:
                self.by_level[level] += counts
            else:
                self.by_level[level] = counts.copy()


_RACE_VALUES, _ETH_VALUES = 64, 3  # race codes 0..63, ethnicity 0..2 (0: not in universe)


@lru_cache(maxsize=None)
def _iteration_matrix(level: IterationLevel) -> npt.NDArray[np.int64]:
    """One-hot matrix (race x ethnicity grid, level codes): the iteration code of each valid
    (race, ethnicity) pair, evaluated once with :func:`iteration_index`; invalid pairs (race 0
    or ethnicity 0) map to no code (they are rejected before the matrix is used)."""
    race, eth = np.meshgrid(np.arange(1, _RACE_VALUES), np.arange(1, _ETH_VALUES), indexing="ij")
    codes = iteration_index(level, race.ravel(), eth.ravel())
    flat = (race.ravel() * _ETH_VALUES + eth.ravel())
    matrix = np.zeros((_RACE_VALUES * _ETH_VALUES, len(level.codes)), dtype=np.int64)
    inside = codes != NOT_IN_LEVEL
    matrix[flat[inside], codes[inside]] = 1
    return matrix


def count_records(
    spec: TableSpec,
    part: Partition,
    joined: Joined,
    n_states: int,
    *,
    weights: npt.NDArray[np.integer] | None = None,
    shared: "_Shared | None" = None,
) -> TableCounts:
    """Count joined records by state x iteration code x basis cell, for each iteration level.

    One pass over the records: they are counted by (cell, state, race, ethnicity) into a small
    cube (a few hundred thousand bins), and each iteration level's counts are sums over that
    cube's race and ethnicity axes (:func:`_iteration_matrix`) -- exact integer sums, the same
    as mapping every record to its code at every level. A record's (state, race, ethnicity)
    part and its column values are gathered once per join (``shared``) for all the tables
    counted from that join.
    """
    shared = shared or _Shared(part)
    lookup = cell_lookup(spec.basis)
    cells = lookup.cell_index_of(lambda source, column: shared.gather(joined, source, column))
    unmatched = int(np.count_nonzero(cells < 0))
    if unmatched:
        cols = [c for _, c in lookup.columns]
        files = sorted({_SOURCE_FILE[s] + ".csv" for s, _ in lookup.columns})
        raise InputError(
            " and ".join(files),
            ",".join(cols),
            f"records in the {spec.name} universe must fall in one {spec.name} cell; "
            "these codes are inconsistent with each other",
            rows=unmatched,
        )
    n_cells = len(spec.basis)
    race_cols = _iteration_columns(spec)
    by_race = race_cols is not None and any(lv is not IterationLevel.TOTAL for lv in spec.iteration_levels)
    base = shared.base(joined, race_cols if by_race else None)
    w = None if weights is None else weights.astype(np.float64)
    out = TableCounts(spec)
    if not by_race:
        cube = _by_cell(cells, base, n_cells, n_states, w).reshape(n_cells, n_states).T
        for level in spec.iteration_levels:
            out.by_level[level] = np.ascontiguousarray(cube[:, None, :])
        return out
    assert race_cols is not None
    # Two exact ways to the same counts: few records in many bins (the exhaustive sensitivity
    # check's thousands of one-household "states") are counted straight into each level's
    # (state, code, cell) bins; many records through the (cell, state, race, ethnicity) cube.
    levels = [lv for lv in spec.iteration_levels if lv is not IterationLevel.TOTAL]
    cube_bins = n_cells * n_states * _RACE_VALUES * _ETH_VALUES
    if 4 * len(cells) * (len(levels) + 1) < cube_bins:
        _count_per_level(out, spec, race_cols, cells, base, n_states, w)
    else:
        _count_through_cube(out, spec, race_cols, cells, base, n_states, w)
    return out


def _binned(flat: npt.NDArray[np.integer], weights: npt.NDArray[np.float64] | None, bins: int) -> npt.NDArray[np.int64]:
    """Records counted into ``bins`` bins by their flat index; weighted counts are sums of whole
    numbers, rounded back to exact integers."""
    binned = np.bincount(flat, weights=weights, minlength=bins)
    return (np.rint(binned) if weights is not None else binned).astype(np.int64)


def _by_cell(cells: npt.NDArray[np.int16], base: npt.NDArray[np.int32], n_cells: int, width: int,
             weights: npt.NDArray[np.float64] | None) -> npt.NDArray[np.int64]:
    """Records counted by (cell, base): ``width`` bins of ``base`` for each of ``n_cells`` cells,
    cells outermost."""
    flat = cells.astype(np.int32)
    flat *= width
    flat += base
    return _binned(flat, weights, n_cells * width)


def _invalid_race(spec: TableSpec, race_cols: tuple[Source, str, str], bad_rows: int, race_zero: bool) -> InputError:
    source, race_col, eth_col = race_cols
    why = "race code outside 01..63" if race_zero else "ethnicity outside {1, 2}"
    return InputError(
        _SOURCE_FILE[source] + ".csv", f"{race_col},{eth_col}",
        f"records in the {spec.name} universe need a race code 01..63 and an "
        f"ethnicity 1 or 2 ({why})",
        rows=bad_rows,
    )


@lru_cache(maxsize=None)
def _iteration_code_of(level: IterationLevel) -> npt.NDArray[np.int64]:
    """Each race x ethnicity bin's code index at ``level`` (-1: none) -- the rows of
    :func:`_iteration_matrix` as indices."""
    matrix = _iteration_matrix(level)
    if (matrix.sum(axis=1) > 1).any():  # one code per bin, or one index cannot say it
        raise ValueError(f"iteration level {level}: a race x ethnicity bin has more than one code")
    return np.where(matrix.any(axis=1), matrix.argmax(axis=1), -1).astype(np.int64)


def _count_per_level(out: TableCounts, spec: TableSpec, race_cols: tuple[Source, str, str],
                     cells: npt.NDArray[np.int16], base: npt.NDArray[np.int32], n_states: int,
                     w: npt.NDArray[np.float64] | None) -> None:
    """Each level's counts straight from the records: one bincount per level."""
    n_cells = len(spec.basis)
    state, race_eth = np.divmod(base.astype(np.int64), _RACE_VALUES * _ETH_VALUES)
    race_zero = race_eth < _ETH_VALUES  # race code 00
    invalid = race_zero | (race_eth % _ETH_VALUES == 0)  # or ethnicity 0
    bad_rows = int(np.count_nonzero(invalid)) if w is None else int(np.rint(w[invalid].sum()))
    if bad_rows:
        raise _invalid_race(spec, race_cols, bad_rows, bool(race_zero.any() if w is None else w[race_zero].sum()))
    cell = cells.astype(np.int64)
    for level in spec.iteration_levels:
        n_codes = len(level.codes)
        if level is IterationLevel.TOTAL:
            flat, weight = state * n_cells + cell, w
        else:
            code = np.take(_iteration_code_of(level), race_eth)
            inside = code >= 0
            flat = (np.compress(inside, state) * n_codes + np.compress(inside, code)) * n_cells + np.compress(inside, cell)
            weight = None if w is None else np.compress(inside, w)
        counts = _binned(flat, weight, n_states * n_codes * n_cells)
        out.by_level[level] = counts.reshape(n_states, n_codes, n_cells)


def _count_through_cube(out: TableCounts, spec: TableSpec, race_cols: tuple[Source, str, str],
                        cells: npt.NDArray[np.int16], base: npt.NDArray[np.int32], n_states: int,
                        w: npt.NDArray[np.float64] | None) -> None:
    """One bincount into the (cell, state, race, ethnicity) cube, then each level's sums over it."""
    n_cells = len(spec.basis)
    cube = _by_cell(cells, base, n_cells, n_states * _RACE_VALUES * _ETH_VALUES, w)
    # (cell, state, race, ethnicity) -> (state, cell, race, ethnicity)
    cube = cube.reshape(n_cells, n_states, _RACE_VALUES, _ETH_VALUES).transpose(1, 0, 2, 3)
    grid = np.ascontiguousarray(cube).reshape(n_states * n_cells, _RACE_VALUES, _ETH_VALUES)
    invalid = grid.copy()
    invalid[:, 1:, 1:] = 0  # what is left: records with race code 00 or ethnicity 0
    bad_rows = int(invalid.sum())
    if bad_rows:
        raise _invalid_race(spec, race_cols, bad_rows, bool(int(grid[:, 0, :].sum())))
    grid = grid.reshape(n_states * n_cells, _RACE_VALUES * _ETH_VALUES)
    for level in spec.iteration_levels:
        if level is IterationLevel.TOTAL:
            counts = grid.sum(axis=1).reshape(n_states, 1, n_cells)
        else:
            counts = (grid @ _iteration_matrix(level)).reshape(n_states, n_cells, -1).transpose(0, 2, 1)
        out.by_level[level] = np.ascontiguousarray(counts)


class _Shared:
    # Gathers are np.take and np.compress, not fancy indexing: the same arrays, 2-10x faster in
    # numpy 2 for these index types (int32 rows, boolean masks).
    """Work the tables of one partition share: each universe's mask (one gather through a lookup
    table per condition), each unit universe's unique units, and each truncated join -- PH1_num,
    PH2 and PH7 have the same universes and, with the production thresholds, the same τ: their
    join is computed once."""

    def __init__(self, part: Partition) -> None:
        self.part = part
        self._masks: dict[tuple[Source, tuple[Condition, ...]], npt.NDArray[np.bool_]] = {}
        self._units: dict[tuple[Condition, ...], npt.NDArray[np.int64]] = {}
        self._joins: dict[tuple[tuple[Condition, ...], tuple[Condition, ...], int | None], Joined] = {}
        self._unit_joins: dict[tuple[Condition, ...], Joined] = {}
        self._person_units: dict[tuple[Condition, ...], tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]] = {}
        self._gathered: dict[tuple[int, Source, str], np.ndarray] = {}
        self._base: dict[tuple[int, tuple[Source, str, str] | None], npt.NDArray[np.int32]] = {}

    def mask(self, conditions: tuple[Condition, ...], source: Source) -> npt.NDArray[np.bool_]:
        """Rows of ``source`` meeting every condition of the universe on it (spec §5, step 1)."""
        key = (source, tuple(c for c in conditions if c.source is source))
        if key not in self._masks:
            cols = self.part.persons if source is Source.PERSON else self.part.units
            mask = np.ones(len(cols["MAFID"]), dtype=bool)
            for cond in key[1]:
                column = cols[cond.column]
                size = max(max(cond.values), int(column.max()) if len(column) else 0) + 1
                inside = np.zeros(size, dtype=bool)
                inside[list(cond.values)] = True
                mask &= np.take(inside, column)
            self._masks[key] = mask
        return self._masks[key]

    def gather(self, joined: Joined, source: Source, column: str) -> np.ndarray:
        """A column's values of the joined records (gathered once per join and column)."""
        key = (id(joined), source, column)
        if key not in self._gathered:
            if source is Source.PERSON:
                assert joined.person_rows is not None
                self._gathered[key] = np.take(self.part.persons[column], joined.person_rows)
            else:
                self._gathered[key] = np.take(self.part.units[column], joined.unit_rows)
        return self._gathered[key]

    def base(self, joined: Joined, race_cols: tuple[Source, str, str] | None) -> npt.NDArray[np.int32]:
        """Each joined record's (state, race, ethnicity) bin -- or its state -- computed once per
        join and iteration source."""
        key = (id(joined), race_cols)
        if key not in self._base:
            state = np.take(self.part.unit_state, joined.unit_rows).astype(np.int32)
            if race_cols is not None:
                source, race_col, eth_col = race_cols
                race, eth = self.gather(joined, source, race_col), self.gather(joined, source, eth_col)
                if len(race) and (int(race.max()) >= _RACE_VALUES or int(eth.max()) >= _ETH_VALUES):
                    raise AssertionError("race or ethnicity beyond its column's domain")  # the reader checks
                state *= _RACE_VALUES
                state += race
                state *= _ETH_VALUES
                state += eth
            self._base[key] = state
        return self._base[key]

    def row_of_group(self, unit_universe: tuple[Condition, ...]) -> npt.NDArray[np.int64]:
        """Each MAFID group's single in-universe unit row, or -1 (see :func:`~phsafe.truncation.unique_units`)."""
        if unit_universe not in self._units:
            part = self.part
            self._units[unit_universe] = unique_units(
                part.unit_group, self.mask(unit_universe, Source.UNIT), part.n_groups)
        return self._units[unit_universe]

    def units(self, unit_universe: tuple[Condition, ...]) -> Joined:
        """The unique in-universe units of a unit table."""
        if unit_universe not in self._unit_joins:
            row_of_group = self.row_of_group(unit_universe)
            self._unit_joins[unit_universe] = Joined(person_rows=None,
                                                     unit_rows=np.compress(row_of_group >= 0, row_of_group))
        return self._unit_joins[unit_universe]

    def persons(self, spec: TableSpec, tau: int | None, key: bytes | None) -> Joined:
        """The truncated join of ``spec``'s universes (spec §5: persons of the universe joined to
        their MAFID's unique in-universe unit, kept by :func:`~phsafe.truncation.truncate`)."""
        cache_key = (spec.person_universe, spec.unit_universe, tau)
        if cache_key not in self._joins:
            part = self.part
            unit_of, has_unit = self.person_units(spec.unit_universe)
            rows = np.flatnonzero(self.mask(spec.person_universe, Source.PERSON) & has_unit)
            units = np.take(unit_of, rows)
            if tau is not None:
                assert key is not None and len(key) == TRUNCATION_KEY_BYTES
                keep = _truncate(units, part.persons, rows, tau, key)
                rows, units = np.compress(keep, rows), np.compress(keep, units)
            self._joins[cache_key] = Joined(person_rows=rows, unit_rows=units)
        return self._joins[cache_key]

    def person_units(self, unit_universe: tuple[Condition, ...]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Each person's unique in-universe unit row (-1: none), and where there is one -- the
        join's gather, done once for the tables of a unit universe."""
        if unit_universe not in self._person_units:
            unit_of = np.take(self.row_of_group(unit_universe), self.part.person_group)
            self._person_units[unit_universe] = (unit_of, unit_of >= 0)
        return self._person_units[unit_universe]


def tabulate_partition(
    spec: TableSpec,
    part: Partition,
    n_states: int,
    *,
    tau: int | None,
    key: bytes | None,
    shared: _Shared | None = None,
) -> TableCounts:
    """Exact counts of ``spec`` on one partition (truncated with ``tau`` unless None)."""
    shared = shared or _Shared(part)
    if spec.kind is TableKind.PERSON:
        joined = shared.persons(spec, tau, key)
        weights = None
    else:
        joined = shared.units(spec.unit_universe)
        weights = np.take(part.units[spec.weight], joined.unit_rows) if spec.weight else None
    return count_records(spec, part, joined, n_states, weights=weights, shared=shared)


def tabulate(
    specs: list[TableSpec],
    data: PreparedData,
    *,
    taus: dict[str, int] | None,
    key: bytes | None,
    max_persons_per_partition: int = MAX_PERSONS_PER_PARTITION,
) -> dict[str, TableCounts]:
    """Exact counts of every table in ``specs``, summed over MAFID-range partitions.

    Args:
        specs: Tables to count.
        data: Prepared records.
        taus: Truncation threshold per table (``tau`` key), or None for no truncation.
        key: Truncation key (required when ``taus`` is given).
        max_persons_per_partition: Bound on the persons handled at once.

    Raises:
        InputError: A record in a table's universe falls in no cell.
    """
    n_states = len(data.states)
    totals: dict[str, TableCounts] = {s.name: TableCounts(s) for s in specs}
    for number, part in enumerate(partitions(data, max_persons_per_partition), start=1):
        log.debug("tabulating partition", partition=number)
        shared = _Shared(part)
        for spec in specs:
            tau = taus[spec.tau_key] if (taus is not None and spec.tau_key) else None
            counts = tabulate_partition(spec, part, n_states, tau=tau, key=key, shared=shared)
            totals[spec.name].add(counts)
        del shared
    for spec in specs:  # a run with no records still has the full (zero) domain
        for level in spec.iteration_levels:
            totals[spec.name].by_level.setdefault(
                level, np.zeros((n_states, len(level.codes), len(spec.basis)), dtype=np.int64)
            )
    return totals
