"""Preprocessing: the MAFID key look-ups agree, the state filter comes first, and MAFID-range
partitions cover every record; encoding checks values exactly."""

from __future__ import annotations

import numpy as np
import pytest

from phsafe.preprocess import NOT_TABULATED, KeyIndex, geo_side
from phsafe.schema import MAFID_MAX, MAFID_MIN


def test_direct_table_binary_search_and_hash_agree() -> None:
    rng = np.random.default_rng(7)
    keys = np.unique(rng.choice(np.arange(MAFID_MIN, MAFID_MIN + 5_000_000, dtype=np.int32), 50_000,
                                replace=False))
    keys = np.unique(np.concatenate([keys, np.array([MAFID_MIN, MAFID_MAX], dtype=np.int32)]))
    # Half of the queries hit a key, half miss; the range ends are included.
    queries = np.concatenate([
        rng.choice(keys, 30_000),
        rng.integers(MAFID_MIN, MAFID_MAX + 1, 30_000).astype(np.int32),
        np.array([MAFID_MIN, MAFID_MAX, MAFID_MIN - 1, MAFID_MAX + 1], dtype=np.int32),
    ])
    expected = {k: i for i, k in enumerate(keys.tolist())}
    want = np.array([expected.get(q, -1) for q in queries.tolist()])
    few = KeyIndex(keys)  # a span far larger than the look-ups, and too few look-ups for a bitmap
    assert few._table is None
    np.testing.assert_array_equal(few.lookup(queries), want)
    assert few._bits is None  # a binary search answered them
    ordered = np.sort(queries)  # sorted look-ups: a binary search
    np.testing.assert_array_equal(few.lookup(ordered), [expected.get(q, -1) for q in ordered.tolist()])
    # Enough unsorted look-ups to pay for a rank bitmap of the span: the same answers from it.
    hashed = KeyIndex(keys)
    many = np.tile(queries, -(-hashed.bitmap_words() // (len(queries) * len(keys).bit_length())) + 1)
    found = hashed.lookup(many)
    assert hashed._bits is not None
    np.testing.assert_array_equal(found, np.tile(want, len(many) // len(queries)))
    np.testing.assert_array_equal(hashed.lookup(queries), want)  # and once it is built
    clustered = keys[keys < MAFID_MIN + 5_000_000]
    direct = KeyIndex(clustered, expected_lookups=1_000_000)
    assert direct._table is not None and len(direct._table) <= 5_000_001  # the keys' span only
    position = {k: i for i, k in enumerate(clustered.tolist())}
    want = np.array([position.get(q, -1) for q in queries.tolist()])
    np.testing.assert_array_equal(direct.lookup(queries), want)
    np.testing.assert_array_equal(KeyIndex(clustered).lookup(queries), want)


def test_no_keys_means_nothing_is_found() -> None:
    queries = np.array([MAFID_MIN, 123_456_789], dtype=np.int32)
    assert (KeyIndex(np.empty(0, np.int32)).lookup(queries) == -1).all()


def test_state_filter_first_and_ambiguous_geo_rows() -> None:
    """A geo row outside the filter is set aside (and its MAFID's records with it); a MAFID
    listed twice in geo -- even once outside the filter -- is never tabulated; a GQ geo row is
    not tabulated; an invalid TABBLKST cannot be placed outside the filter: kept."""
    m = MAFID_MIN
    mafid = np.array([m + 1, m + 2, m + 3, m + 3, m + 4, m + 5, m + 6], dtype=np.int32)
    rtype = np.array([2, 2, 2, 2, 4, 2, 2], dtype=np.uint8)
    state = np.array([6, 48, 6, 48, 6, 6, 0], dtype=np.uint8)
    state_ok = np.array([True] * 6 + [False])
    side = geo_side(mafid, None, rtype, None, state, state_ok, ("06",))
    assert side.set_aside == 2
    assert side.index.keys.tolist() == [m + 1, m + 2, m + 3, m + 4, m + 5, m + 6]
    assert side.rows.tolist() == [1, 1, 2, 1, 1, 1] and side.kept.tolist() == [1, 0, 1, 1, 1, 1]
    assert side.aside.tolist() == [False, True, False, False, False, False]
    assert side.state.tolist() == [0, NOT_TABULATED, NOT_TABULATED, NOT_TABULATED, 0, NOT_TABULATED]
    everything = geo_side(mafid, None, rtype, None, state, state_ok, None)  # no usable filter
    assert everything.set_aside == 0 and not everything.aside.any() and (everything.state == NOT_TABULATED).all()


def test_mafid_range_partitions_give_the_same_counts(tmp_path) -> None:
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

    key = np.random.default_rng(4).bytes(16)  # a truncation key, seeded: the property holds for every key
    specs = list(TABLES.values())
    whole = tabulate(specs, data, taus=dict(config.tau), key=key)
    split = tabulate(specs, data, taus=dict(config.tau), key=key, max_persons_per_partition=500)
    for name in TABLES:
        for level, cube in whole[name].by_level.items():
            np.testing.assert_array_equal(split[name].by_level[level], cube, err_msg=f"{name} {level}")
        assert sum(int(c.sum()) for c in whole[name].by_level.values()) > 0, name


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


def test_encoding_fast_and_slow_paths_agree() -> None:
    """Codes and integers are checked on their raw bytes, or per dictionary value; a bad value
    is reported with the same rule and row count as the regular-expression path, and never
    quoted; integers wider than 64 bits are out of range, not an overflow."""
    import pyarrow as pa
    import pytest

    from phsafe.errors import InputError
    from phsafe.reader import ClassBook, encode, raise_value_problems
    from phsafe.schema import FILES

    race = next(c for c in FILES["persons"] if c.name == "CENRACE")
    age = next(c for c in FILES["persons"] if c.name == "QAGE")
    mafid = next(c for c in FILES["persons"] if c.name == "MAFID")
    good = ["01", "63", "07", "01"]
    for arr in (pa.array(good), pa.array(good, pa.large_string()), pa.array(good).dictionary_encode(),
                pa.array(["xx"] + good).slice(1), pa.array([g.encode() for g in good], pa.binary())):
        encoded = encode(race, arr)
        assert encoded.all_ok and encoded.values.tolist() == [1, 63, 7, 1]
    assert encode(age, pa.array(["0", "115", "7", "007"])).values.tolist() == [0, 115, 7, 7]
    cases = [
        (race, ["01", "1", "1", "001"], "2-digit code", 3),
        (race, ["01", "64", "00", "64"], "must be one of", 3),
        (race, ["01", "0٣", "01", "01"], "2-digit code", 1),  # a non-ASCII digit
        (race, ["01", None, "01", "01"], "must not be empty", 1),
        (age, ["5", "116", "x", "1"], "whole number", 1),
        (age, ["5", "116", "200", "1"], "between 0 and 115", 2),
        (age, ["5", "1" * 20, "200", "1"], "between 0 and 115", 2),  # wider than 64 bits
        (mafid, ["1" * 29, "123456789"], "between 100000001 and 900000000", 1),
    ]
    for column, values, rule, rows in cases:
        for arr in (pa.array(values), pa.array(values).dictionary_encode(),
                    pa.array([None if v is None else v.encode() for v in values], pa.binary())):
            with pytest.raises(InputError, match=rule) as info:
                raise_value_problems("persons.csv", encode(column, arr, ClassBook(column)))
            assert info.value.rows == rows, (values, arr.type)
            assert "1111" not in str(info.value) and "200" not in str(info.value).replace("between", "")
    for arr in (pa.array([2**64 - 1, 123456789], pa.uint64()), pa.array([-5, 123456789], pa.int64())):
        with pytest.raises(InputError, match="between 100000001 and 900000000") as info:
            raise_value_problems("persons.parquet", encode(mafid, arr))
        assert info.value.rows == 1 and "18446744073709551615" not in str(info.value)
    # An unused malformed dictionary entry is no row's value: nothing to report.
    unused = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["01", "x"]))
    assert encode(race, unused).values.tolist() == [1, 1]


@pytest.mark.parametrize("through_cube", [False, True], ids=["per-level", "cube"])
def test_race_outside_the_domain_in_a_universe_is_an_input_error(through_cube: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found whichever way the records are counted (few records: straight into each level's
    bins; many: through the race x ethnicity cube)."""
    from phsafe import tabulate as tabulate_module
    from phsafe.errors import InputError
    from phsafe.preprocess import partitions, prepare
    from phsafe.reader import InputTables
    from phsafe.tables import TABLES
    from phsafe.tabulate import tabulate

    if through_cube:
        monkeypatch.setattr(tabulate_module, "_count_per_level", tabulate_module._count_through_cube)

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
