"""Preprocessing: both MAFID-to-state look-ups agree, and state partitions cover every record."""

from __future__ import annotations

import numpy as np

from phsafe.preprocess import NOT_TABULATED, StateLookup
from phsafe.schema import MAFID_MAX, MAFID_MIN


def test_direct_table_and_binary_search_agree() -> None:
    rng = np.random.default_rng(7)
    geo = rng.choice(np.arange(MAFID_MIN, MAFID_MIN + 5_000_000, dtype=np.int32), 50_000, replace=False)
    geo = np.concatenate([geo, np.array([MAFID_MIN, MAFID_MAX], dtype=np.int32)])
    states = rng.integers(0, 51, len(geo)).astype(np.uint8)
    # Half of the queries hit a geo MAFID, half miss; the range ends are included.
    queries = np.concatenate([
        rng.choice(geo, 30_000),
        rng.integers(MAFID_MIN, MAFID_MAX + 1, 30_000).astype(np.int32),
        np.array([MAFID_MIN, MAFID_MAX], dtype=np.int32),
    ])
    direct = StateLookup(geo, states, direct=True)(queries)
    search = StateLookup(geo, states, direct=False)(queries)
    np.testing.assert_array_equal(direct, search)
    expected = dict(zip(geo.tolist(), states.tolist()))
    np.testing.assert_array_equal(
        search, np.array([expected.get(q, NOT_TABULATED) for q in queries.tolist()], dtype=np.uint8)
    )


def test_no_geo_rows_means_nothing_is_tabulated() -> None:
    queries = np.array([MAFID_MIN, 123_456_789], dtype=np.int32)
    for direct in (True, False):
        out = StateLookup(np.empty(0, np.int32), np.empty(0, np.uint8), direct=direct)(queries)
        assert (out == NOT_TABULATED).all()


def test_mafid_range_partitions_give_the_same_counts(tmp_path) -> None:
    import secrets

    from phsafe.config import load_config
    from phsafe.preprocess import partitions, prepare
    from phsafe.reader import read_inputs
    from phsafe.synthetic import generate, write
    from phsafe.tables import TABLES
    from phsafe.tabulate import tabulate

    from tests.conftest import US_CONFIG

    config = load_config(US_CONFIG)
    write(generate(6_000, ["01", "06", "36"], seed=3), tmp_path)
    data = prepare(read_inputs(tmp_path), config.states)
    parts = list(partitions(data, max_persons=500))
    assert len(parts) >= 8
    # Every tabulated record is in exactly one partition.
    assert sum(len(p.units["MAFID"]) for p in parts) == int((data.unit_state != NOT_TABULATED).sum())
    all_mafids = np.concatenate([np.unique(p.units["MAFID"]) for p in parts])
    assert len(all_mafids) == len(np.unique(all_mafids))

    key = secrets.token_bytes(16)
    specs = list(TABLES.values())
    whole = tabulate(specs, data, taus=dict(config.tau), key=key)
    split = tabulate(specs, data, taus=dict(config.tau), key=key, max_persons_per_partition=500)
    for name in TABLES:
        for level, cube in whole[name].by_level.items():
            np.testing.assert_array_equal(split[name].by_level[level], cube, err_msg=f"{name} {level}")
        assert sum(int(c.sum()) for c in whole[name].by_level.values()) > 0, name


def test_direct_table_over_a_clustered_range_and_the_missing_marker() -> None:
    from phsafe.preprocess import NO_GEO, use_direct_table

    rng = np.random.default_rng(3)
    lo = 400_000_000
    geo = np.unique(rng.integers(lo, lo + 2_000_000, 30_000)).astype(np.int32)
    states = rng.integers(0, 5, len(geo)).astype(np.uint8)
    states[::7] = NOT_TABULATED  # e.g. GQ geo rows: present but not tabulated
    queries = np.concatenate([rng.choice(geo, 20_000), rng.integers(MAFID_MIN, MAFID_MAX + 1, 20_000),
                              np.array([MAFID_MIN, MAFID_MAX, geo.min() - 1, geo.max() + 1])]).astype(np.int32)
    direct = StateLookup(geo, states, direct=True, missing=NO_GEO)
    assert len(direct.table) <= 2_000_001  # the geo MAFIDs' span, not the whole MAFID range
    search = StateLookup(geo, states, direct=False, missing=NO_GEO)
    np.testing.assert_array_equal(direct(queries), search(queries))
    expected = dict(zip(geo.tolist(), states.tolist()))
    np.testing.assert_array_equal(direct(queries), [expected.get(q, NO_GEO) for q in queries.tolist()])
    assert use_direct_table(geo, lookups=100_000)  # 2M bytes of table for 100k look-ups
    assert not use_direct_table(np.array([MAFID_MIN, MAFID_MAX], np.int32), lookups=1_000)
    assert use_direct_table(np.array([MAFID_MIN, MAFID_MAX], np.int32), lookups=3_000_000)


def _tables(persons_mafid: list[int], units_mafid: list[int], geo_mafid: list[int]):
    from phsafe.reader import InputTables

    def cols(m: list[int], **extra: int) -> dict[str, np.ndarray]:
        out = {"MAFID": np.array(m, dtype=np.int32)}
        out.update({k: np.full(len(m), v, dtype=np.uint8) for k, v in extra.items()})
        return out

    return InputTables(persons=cols(persons_mafid, RTYPE=3), units=cols(units_mafid, RTYPE=2),
                       geo=cols(geo_mafid, RTYPE=2, TABBLKST=6))


def test_require_geo_rejects_records_without_a_geo_row() -> None:
    import pytest

    from phsafe.errors import InputError
    from phsafe.preprocess import prepare

    ok = _tables([MAFID_MIN + 1, MAFID_MIN + 1], [MAFID_MIN + 1, MAFID_MIN + 2], [MAFID_MIN + 1, MAFID_MIN + 2])
    data = prepare(ok, ("06",), require_geo="06")
    assert (data.person_state == 0).all() and (data.unit_state == 0).all()
    orphan = _tables([MAFID_MIN + 1, MAFID_MIN + 9], [MAFID_MIN + 1], [MAFID_MIN + 1])
    with pytest.raises(InputError, match="no geo row in the same partition") as info:
        prepare(orphan, ("06",), require_geo="06")
    assert info.value.rows == 1 and info.value.file == "persons (06)"
    # Without the requirement a record with no geo row is simply not tabulated (spec §4).
    data = prepare(orphan, ("06",))
    assert data.person_state.tolist() == [0, NOT_TABULATED]


def test_duplicated_geo_mafids_are_never_tabulated_sorted_or_not() -> None:
    from phsafe.preprocess import _duplicated

    for values in ([1, 2, 3, 4], [1, 2, 2, 3], [3, 1, 2, 1], [5]):
        a = np.array(values, dtype=np.int32)
        expected = [values.count(v) > 1 for v in values]
        assert _duplicated(a).tolist() == expected, values


def test_encoding_fast_and_slow_paths_agree() -> None:
    """Codes and integers are checked on their raw bytes, or per dictionary value; a bad value
    is reported with the same rule and row count as the regular-expression path."""
    import pyarrow as pa
    import pytest

    from phsafe.errors import InputError
    from phsafe.reader import _encode
    from phsafe.schema import FILES

    race = next(c for c in FILES["persons"] if c.name == "CENRACE")
    age = next(c for c in FILES["persons"] if c.name == "QAGE")
    good = ["01", "63", "07", "01"]
    for arr in (pa.array(good), pa.array(good, pa.large_string()), pa.array(good).dictionary_encode(),
                pa.array(["xx"] + good).slice(1)):
        assert _encode("persons.csv", race, arr).tolist() == [1, 63, 7, 1]
    assert _encode("persons.csv", age, pa.array(["0", "115", "7"])).tolist() == [0, 115, 7]
    cases = [
        (race, ["01", "1", "1", "001"], "2-digit code", 3),
        (race, ["01", "64", "00", "64"], "must be one of", 3),
        (race, ["01", "0٣", "01", "01"], "2-digit code", 1),  # a non-ASCII digit
        (age, ["5", "116", "x", "1"], "whole number", 1),
        (age, ["5", "116", "200", "1"], "between 0 and 115", 2),
    ]
    for column, values, rule, rows in cases:
        for arr in (pa.array(values), pa.array(values).dictionary_encode()):
            with pytest.raises(InputError, match=rule) as info:
                _encode("persons.csv", column, arr)
            assert info.value.rows == rows, (values, arr.type)
    # An unused malformed dictionary entry is no row's value: nothing to report.
    unused = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["01", "x"]))
    assert _encode("persons.csv", race, unused).tolist() == [1, 1]


def test_race_outside_the_domain_in_a_universe_is_an_input_error(tmp_path) -> None:
    import pytest

    from phsafe.errors import InputError
    from phsafe.preprocess import partitions, prepare
    from phsafe.reader import InputTables
    from phsafe.tables import TABLES
    from phsafe.tabulate import tabulate

    m = MAFID_MIN + 5
    persons = {"RTYPE": np.array([3], np.uint8), "MAFID": np.array([m], np.int32), "QAGE": np.array([40], np.uint8),
               "CENHISP": np.array([1], np.uint8), "CENRACE": np.array([1], np.uint8),
               "RELSHIP": np.array([20], np.uint8)}
    units = {"RTYPE": np.array([2], np.uint8), "MAFID": np.array([m], np.int32), "FINAL_POP": np.array([1], np.uint32),
             "NPF": np.array([0], np.uint8), "HHSPAN": np.array([1], np.uint8), "HHRACE": np.array([0], np.uint8),
             "TEN": np.array([1], np.uint8), "HHT": np.array([4], np.uint8), "HHT2": np.array([9], np.uint8),
             "CPLT": np.array([5], np.uint8)}
    geo = {"RTYPE": np.array([2], np.uint8), "MAFID": np.array([m], np.int32), "TABBLKST": np.array([6], np.uint8)}
    data = prepare(InputTables(persons, units, geo), ("06",))
    with pytest.raises(InputError, match="race code outside 01..63") as info:
        tabulate([TABLES["PH1_denom"]], data, taus=None, key=None)
    assert info.value.rows == 1 and info.value.column == "HHRACE,HHSPAN"
    units["HHRACE"][:] = 1
    units["HHSPAN"][:] = 0
    with pytest.raises(InputError, match=r"ethnicity outside \{1, 2\}"):
        tabulate([TABLES["PH1_denom"]], prepare(InputTables(persons, units, geo), ("06",)), taus=None, key=None)
    units["HHSPAN"][:] = 1
    counts = tabulate([TABLES["PH1_denom"], TABLES["PH2"]], prepare(InputTables(persons, units, geo), ("06",)),
                      taus=None, key=None)
    assert sum(int(c.sum()) for c in counts["PH1_denom"].by_level.values()) == 3  # *, A and I
    assert len(list(partitions(data))) == 1
