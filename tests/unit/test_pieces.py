"""The one merge of the input pass's pieces (:func:`phsafe.intake.merge`), on pieces made here.

Whatever order pieces arrive in, their merge is the same: counts and content digests summed,
rows set aside added, reading problems in the pass's reading order, the first error in that order
raised, a count error keeping every count out; MAFIDs of units or geo stored under two states
found across the pieces of data stored by state.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from phsafe.counting import Counting, Counts, zero_counts
from phsafe.errors import InputError
from phsafe.fingerprint import ContentDigest
from phsafe.intake import Piece, merge
from phsafe.intake.parts import Layout
from phsafe.reader import ReadProblem
from phsafe.tables import TABLES

STATES = ("01", "06")
COUNTING = Counting(tuple(TABLES.values()), None, None)


def _counts(seed: int) -> Counts:
    rng = np.random.default_rng(seed)
    counts = zero_counts(COUNTING, STATES)
    for table in counts.values():
        for cube in table.by_level.values():
            cube += rng.integers(0, 5, cube.shape)
    lanes = tuple(int(x) for x in rng.integers(0, 1 << 62, len(ContentDigest().lanes)))
    return Counts(dict(counts), ContentDigest(persons=seed, units=2 * seed, lanes=lanes))


def _pieces() -> list[Piece]:
    return [
        Piece(f"range {i}", (2, i), counts=_counts(i + 1), set_aside={"persons": i, "units": 1, "geo": 0},
              problems={"persons": [ReadProblem("persons.csv", ("QAGE",), f"rule {i}", i + 1)]})
        for i in range(6)
    ]


def test_pieces_merge_alike_in_any_order() -> None:
    pieces = _pieces()
    reference = merge(pieces)
    assert reference.set_aside == {"persons": 15, "units": 6, "geo": 0}
    assert [p.rule for p in reference.problems["persons"].found] == [f"rule {i}" for i in range(6)]
    assert reference.counts is not None
    for seed in range(3):
        shuffled = list(pieces)
        random.Random(seed).shuffle(shuffled)
        again = merge(shuffled)
        assert again.problems["persons"].found == reference.problems["persons"].found
        assert again.set_aside == reference.set_aside
        assert again.counts is not None and again.counts.content == reference.counts.content
        for name, table in reference.counts.items():
            for level, cube in table.by_level.items():
                np.testing.assert_array_equal(again.counts[name].by_level[level], cube)
    total = sum(int(cube.sum()) for p in pieces for t in p.counts.values() for cube in t.by_level.values())
    assert sum(int(c.sum()) for t in reference.counts.values() for c in t.by_level.values()) == total


def test_the_first_error_in_the_pass_order_is_raised_whatever_arrives_first() -> None:
    pieces = _pieces()
    pieces[4].error = ("persons.csv", "RELSHIP", "a later problem", 1)
    pieces[1].error = ("persons.csv", "QAGE", "the first problem", 2)
    with pytest.raises(InputError, match="the first problem"):
        merge(list(reversed(pieces)))


def test_a_count_error_keeps_every_count_out() -> None:
    pieces = _pieces()
    pieces[3].count_error = ("all [4/6]", "", "holds values that break their column's rules", None)
    result = merge(pieces)
    assert result.count_error is not None and "break their column" in result.count_error.rule
    assert result.counts is None
    assert merge(list(reversed(pieces))).counts is None


def test_a_mafid_under_two_states_is_found_across_pieces() -> None:
    names = {"units": "units", "geo": "geo"}
    pieces = [Piece("01", (0, 0), layout={"units": [np.array([5, 7, 9], np.int32)], "geo": [np.array([5], np.int32)]}),
              Piece("06", (0, 1), layout={"units": [np.array([9, 11], np.int32)], "geo": [np.array([6], np.int32)]})]
    layout = Layout(names, strict=False)
    merge(pieces, layout=layout)
    assert layout.found() == {"units": 1}
    strict = Layout(names, strict=True)
    pieces[1].layout["geo"] = [np.array([5], np.int32)]
    with pytest.raises(InputError, match="more than one state partition"):
        merge(pieces, layout=strict)
