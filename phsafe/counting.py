"""Counting: the tables' exact count cubes of joined records, and their sum over pieces.

The input pass (:mod:`phsafe.intake`) reads, checks, filters and joins the inputs one partition
(or MAFID range) at a time; for each it calls :func:`count_join`, which tags the records with
their state, takes their content digest (:mod:`phsafe.fingerprint`) and counts every table
(:func:`phsafe.tabulate.tabulate`: truncation, unit uniqueness and cells). Nothing here reads a
file, draws noise or touches the ledger; the results are exact and confidential, so they never
leave the process except as sums handed to :mod:`phsafe.noise`.

Why pieces add up to the counts of the whole: every rule of the count is decided per MAFID -- a
MAFID's state (its geo row), whether its unit is unique in a table's universe, and which of its
persons truncation keeps (a keyed hash of each record, :mod:`phsafe.truncation`) -- so any split
that keeps each MAFID's records together gives the same exact counts, and :func:`combine_counts`
adds them up (exact integers, and digests summed modulo 2^64: the order does not matter).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from phsafe.config import PHSafeConfig
from phsafe.fingerprint import ContentDigest, content_digest
from phsafe.invariants import check_structure
from phsafe.preprocess import NOT_TABULATED, Join, prepared
from phsafe.reader import Columns
from phsafe.tables import TableSpec
from phsafe.tabulate import TableCounts, tabulate

__all__ = ["Counting", "Counts", "combine_counts", "count_join", "zero_counts"]

TABULATE_PERSONS = 1_000_000
"""Persons of a partition (or MAFID range) tabulated at once (:func:`phsafe.tabulate.tabulate`'s
MAFID ranges): the counting's temporaries are a few tens of bytes a person, so smaller ranges keep
the pass's peak lower at no cost in time (a range of a million persons is large enough for numpy)."""


class Counts(Mapping[str, TableCounts]):
    """Exact count cubes by table name, with the content digest of the records counted.

    A mapping table name -> :class:`~phsafe.tabulate.TableCounts`; ``content`` identifies the
    tabulated records (see :mod:`phsafe.fingerprint`). Both are confidential.
    """

    __slots__ = ("_tables", "content", "input_digests")

    def __init__(self, tables: Mapping[str, TableCounts], content: ContentDigest) -> None:
        self._tables = dict(tables)
        self.content = content
        self.input_digests: dict[str, str] | None = None
        """The SHA-256 of each input (:func:`phsafe.reader.input_digests`' form), computed on the
        very bytes the counts were read from -- when the pass read every input whole (CSV files);
        None otherwise (the caller hashes the files)."""

    def __getitem__(self, table: str) -> TableCounts:
        return self._tables[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def __repr__(self) -> str:
        return f"Counts(tables={sorted(self._tables)})"


@dataclass(frozen=True)
class Counting:
    """What to count in a pass: the tables, the truncation thresholds (None: no truncation) and
    the truncation key."""

    specs: tuple[TableSpec, ...]
    taus: dict[str, int] | None
    key: bytes | None

    @classmethod
    def of(cls, config: PHSafeConfig, specs: Sequence[TableSpec], key: bytes | None) -> "Counting":
        return cls(tuple(specs), dict(config.tau) if key is not None else None, key)

    @property
    def stage(self) -> str:
        """The stage's name in logs and progress."""
        return "truncate, join and count" if self.key is not None else "join and count"


def count_join(counting: Counting, join: Join, units: Columns, persons: Columns, states: tuple[str, ...], *,
               require_geo: str | None = None, structure_names: Mapping[str, str] | None = None) -> Counts:
    """The exact counts of one joined partition's records, with their content digest.

    Args:
        counting: What to count.
        join: The partition's MAFID join (:mod:`phsafe.preprocess`).
        units, persons: The partition's kept, valid compact columns.
        states: The released states (sorted).
        require_geo: The partition's name when every record must have its geo row in it (data
            stored by state).
        structure_names: Check first the structure the counting needs (inputs that were not
            validated), naming each file (stem -> name) in the error.

    Raises:
        InputError: A record breaks a structure the counting needs, has no geo row where one is
            required, or falls in no cell of a table.
    """
    data = prepared(join, units, persons, states, require_geo=require_geo)
    if structure_names is not None:
        check_structure(join, units, persons, structure_names)
    content = content_digest(data.persons, data.person_state, data.units, data.unit_state, states,
                             not_tabulated=int(NOT_TABULATED))
    tables = tabulate(list(counting.specs), data, taus=counting.taus, key=counting.key,
                      max_persons_per_partition=TABULATE_PERSONS)
    return Counts(tables, content)


def zero_counts(counting: Counting, states: Sequence[str]) -> Counts:
    """Counts of no record (every released state, every cell zero)."""
    n = len(states)
    return Counts({s.name: TableCounts(s, {lv: np.zeros((n, len(lv.codes), len(s.basis)), np.int64)
                                           for lv in s.iteration_levels}) for s in counting.specs},
                  ContentDigest())


def combine_counts(results: Iterable[Mapping[str, TableCounts]]) -> Counts:
    """The sum of pieces' count cubes and content digests (exact integer sums: any order gives
    the same).

    Raises:
        ValueError: No results, or results of different tables or shapes.
    """
    total: dict[str, TableCounts] | None = None
    content = ContentDigest()
    for result in results:
        if isinstance(result, Counts):
            content = content + result.content
        if total is None:
            total = {name: TableCounts(c.spec, {lvl: a.copy() for lvl, a in c.by_level.items()})
                     for name, c in result.items()}
            continue
        if set(result) != set(total):
            raise ValueError("partition results count different tables")
        for name, counts in result.items():
            mine = total[name]
            if set(counts.by_level) != set(mine.by_level) or any(
                    counts.by_level[lvl].shape != mine.by_level[lvl].shape for lvl in mine.by_level):
                raise ValueError(f"partition results of {name} have different shapes")
            mine.add(counts)
    if total is None:
        raise ValueError("no partition results to combine")
    return Counts(total, content)
