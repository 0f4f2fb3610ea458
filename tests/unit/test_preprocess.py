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
