"""The memory plan of the input pass and its spill files: sizes, plans, bucket bounds, the
writer's order and failures, the set-aside MAFIDs of a streamed partition."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from phsafe import memory, sizes
from phsafe.errors import PHSafeError
from phsafe.preprocess import AsideMafids, Joiner, geo_side
from phsafe.reader import NULL, OK, Encoded
from phsafe.schema import FILES, MAFID_MAX, MAFID_MIN
from phsafe.intake.spill import SPILLED_COLUMNS, BucketPlan, SpillArea, SpillWriter, equal_width, plan_buckets, read_bucket

GIB = 1 << 30


@pytest.mark.parametrize("text, size", [
    ("8G", 8 * GIB), ("8GiB", 8 * GIB), ("8gb", 8 * GIB), ("512M", 512 << 20), ("12.5G", int(12.5 * GIB)),
    ("1T", 1 << 40), ("4096", 4096), (" 2 k ", 2048),
])
def test_parse_size(text: str, size: int) -> None:
    assert sizes.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1G", "0", "8Q", "eight", "1e9"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        sizes.parse_size(text)


def test_default_limit_is_half_the_machine_and_said_in_the_help() -> None:
    assert memory.default_memory_limit() == memory.machine_memory() // 2
    assert sizes.format_size(memory.default_memory_limit()) in memory.memory_limit_help()


def test_plan_keeps_what_fits_in_memory_and_cuts_the_rest() -> None:
    small = {"persons": 10_000_000, "units": 4_300_000, "geo": 4_300_000}
    plan = memory.plan_part(small, 12 * GIB, validate=True, by_state=False)
    assert plan is not None and not plan.spilled and plan.peak_bytes <= 12 * GIB
    nation = {"persons": 331_000_000, "units": 143_000_000, "geo": 143_000_000}
    plan = memory.plan_part(nation, 12 * GIB, validate=True, by_state=False)
    assert plan is not None and plan.spilled
    assert plan.buckets >= 331_000_000 / memory.MAX_BUCKET_PERSONS  # buckets no larger than a big state
    assert plan.peak_bytes <= 12 * GIB and plan.spill_bytes > 0
    tight = memory.plan_part(nation, 2 * GIB, validate=True, by_state=False)
    assert tight is not None and tight.buckets > plan.buckets and tight.peak_bytes <= 2 * GIB
    assert memory.plan_part(nation, 1 * GIB, validate=True, by_state=False) is None
    need = memory.needed_limit(nation, validate=True, by_state=False)
    assert memory.plan_part(nation, need, validate=True, by_state=False) is not None
    assert memory.plan_part(nation, need - (64 << 20), validate=True, by_state=False) is None


def test_refusal_is_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PHSafeError) as refused:
        memory.check_memory(None, int(2.34 * GIB), tmp_path)
    text = str(refused.value)
    assert "\n" not in text and "--memory-limit 2.4G" in text and "at least 2.3 GiB" in text
    plan = memory.MemoryPlan(8 * GIB, {"all": memory.PartPlan(4, 4 * GIB, 1 << 60)})
    with pytest.raises(PHSafeError, match="free space, choose another work folder"):
        memory.check_memory(plan, 0, tmp_path / "not" / "yet")
    if Path("/dev/shm").is_dir():
        small = memory.MemoryPlan(8 * GIB, {"all": memory.PartPlan(4, 4 * GIB, 1)})
        with pytest.raises(PHSafeError, match="tmpfs"):
            memory.check_memory(small, 0, Path("/dev/shm") / "spill")


# --------------------------------------------------------------------------------------------
# Buckets
# --------------------------------------------------------------------------------------------


def test_buckets_cover_the_domain_in_order() -> None:
    plan = BucketPlan((200_000_000, 500_000_000))
    m = np.array([MAFID_MIN, 199_999_999, 200_000_000, 499_999_999, 500_000_000, MAFID_MAX, 0], np.int32)
    assert plan.bucket_of(m).tolist() == [0, 0, 1, 1, 2, 2, 0]  # an invalid MAFID (0) joins nothing: first
    assert [plan.range_of(b) for b in range(3)] == [(MAFID_MIN, 200_000_000), (200_000_000, 500_000_000),
                                                   (500_000_000, MAFID_MAX + 1)]
    assert equal_width(4).buckets == 4


def test_bucket_bounds_follow_the_records_not_the_domain(tmp_path: Path) -> None:
    # MAFIDs packed in a corner of the domain: ranges of equal width would put them in one bucket.
    rng = np.random.default_rng(3)
    mafids = np.concatenate([rng.integers(MAFID_MIN, MAFID_MIN + 2_000_000, 45_000),
                             rng.integers(MAFID_MIN, MAFID_MAX + 1, 5_000)])
    rng.shuffle(mafids)
    lines = ["RTYPE,MAFID,QAGE,CENHISP,CENRACE,RELSHIP"] + [f"3,{m},30,1,01,20" for m in mafids]
    (tmp_path / "persons.csv").write_text("\n".join(lines) + "\n")
    persons = locate_inputs_one(tmp_path)
    plan = plan_buckets({"persons": persons}, 5, memory.BYTES_PER_ROW)
    shares = np.bincount(plan.bucket_of(mafids), minlength=plan.buckets) / len(mafids)
    assert plan.buckets == 5 and shares.min() > 0.15 and shares.max() < 0.25, shares  # about a fifth each
    assert np.bincount(equal_width(5).bucket_of(mafids))[0] / len(mafids) > 0.9


def locate_inputs_one(folder: Path):  # noqa: ANN201
    from phsafe.reader import find_input

    found, problem = find_input(folder, "persons")
    assert problem is None and found is not None
    return found


# --------------------------------------------------------------------------------------------
# The writer and the reader
# --------------------------------------------------------------------------------------------


def _encoded(stem: str, mafid: np.ndarray, bad_rows: np.ndarray | None = None) -> dict[str, Encoded]:
    out = {}
    for c in SPILLED_COLUMNS[stem]:
        values = mafid.astype(c.dtype) if c.name == "MAFID" else (np.arange(len(mafid)) % 7).astype(c.dtype)
        kind = None
        if bad_rows is not None and c.name == "QAGE":
            kind = np.zeros(len(mafid), np.uint8)
            kind[bad_rows] = NULL
            values = np.where(kind == OK, values, 0).astype(c.dtype)
        out[c.name] = Encoded(c, values, kind)
    return out


def test_rows_keep_their_order_and_their_invalid_values(tmp_path: Path) -> None:
    plan = BucketPlan((300_000_000, 600_000_000))
    rng = np.random.default_rng(1)
    writer = SpillWriter(tmp_path, "persons", plan, depth=2)
    sent = []
    for _ in range(20):
        m = rng.integers(MAFID_MIN, MAFID_MAX + 1, 5_000).astype(np.int32)
        bad = rng.random(5_000) < 0.01
        writer.add(_encoded("persons", m, np.flatnonzero(bad)), 5_000)
        sent.append((m, bad))
    writer.close()
    m_all = np.concatenate([m for m, _ in sent])
    bad_all = np.concatenate([b for _, b in sent])
    buckets = plan.bucket_of(m_all)
    assert writer.rows.tolist() == np.bincount(buckets, minlength=3).tolist()
    for b in range(3):
        got = list(read_bucket(tmp_path, "persons", b))
        mafid = np.concatenate([e["MAFID"].values for e, _ in got])
        np.testing.assert_array_equal(mafid, m_all[buckets == b])  # file order kept
        qage = np.concatenate([e["QAGE"].kind if e["QAGE"].kind is not None else np.zeros(n, np.uint8)
                               for e, n in got])
        np.testing.assert_array_equal(qage != OK, bad_all[buckets == b])
        assert all(e["CENRACE"].kind is None for e, _ in got)


def test_a_column_the_file_lacks_is_spilled_invalid(tmp_path: Path) -> None:
    writer = SpillWriter(tmp_path, "geo", BucketPlan(()))
    encoded = _encoded("geo", np.arange(MAFID_MIN, MAFID_MIN + 10, dtype=np.int32))
    del encoded["RTYPE"]
    writer.add(encoded, 10)
    writer.close()
    (got, n), = list(read_bucket(tmp_path, "geo", 0))
    assert n == 10 and (got["RTYPE"].kind != OK).all() and got["MAFID"].kind is None


def test_a_write_failure_is_one_line_naming_the_work_folder(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes anywhere: fill the folder's place with a file instead
        (tmp_path / "persons").write_text("not a folder")
    else:
        tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    writer = SpillWriter(tmp_path, "persons", BucketPlan(()))
    with pytest.raises(PHSafeError) as failed:
        for _ in range(50):
            writer.add(_encoded("persons", np.arange(MAFID_MIN, MAFID_MIN + 1000, dtype=np.int32)), 1000)
        writer.close()
    assert "\n" not in str(failed.value) and "spill files" in str(failed.value) and "--work-dir" in str(failed.value)
    writer.abort()


def test_the_spill_area_is_private_emptied_first_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "run" / "spill"
    root.mkdir(parents=True)
    (root / "part-0001").mkdir()
    (root / "part-0001" / "left-by-a-killed-attempt.arrow").write_bytes(b"x")
    with SpillArea(root) as area:
        assert not root.exists()  # emptied before anything else
        folder = area.part_folder()
        assert folder.parent == root and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert not root.exists()
    with SpillArea(None) as area:
        temporary = area.part_folder().parent
        assert temporary.name.startswith("phsafe-spill-") and stat.S_IMODE(temporary.stat().st_mode) == 0o700
    assert not temporary.exists()


# --------------------------------------------------------------------------------------------
# The state filter of a streamed partition
# --------------------------------------------------------------------------------------------


def test_aside_mafids_agree_with_the_join() -> None:
    """Streamed units and persons are set aside exactly as the join of the whole partition sets
    them aside -- a MAFID listed twice in geo, in and outside the filter, included."""
    rng = np.random.default_rng(7)
    n = 3_000
    geo_m = rng.choice(np.arange(MAFID_MIN, MAFID_MIN + 20_000), n, replace=False).astype(np.int32)
    geo_m[-50:] = geo_m[:50]  # listed twice: ...
    state = rng.choice(np.array([1, 2, 6], np.uint8), n)
    state[-50:-25] = 2  # ... some in and some outside the filter
    state[:25] = 6
    rtype = np.full(n, 2, np.uint8)
    states = ("01", "06")
    side = geo_side(geo_m, None, rtype, None, state, None, states)
    aside = AsideMafids()
    kept = np.isin(state, [1, 6])
    aside.add_aside(geo_m[~kept])
    aside.add_kept(geo_m[kept])
    lookups = np.concatenate([geo_m, rng.integers(MAFID_MIN, MAFID_MIN + 30_000, 5_000).astype(np.int32)])
    ok = rng.random(len(lookups)) > 0.02
    joiner = Joiner(side)
    expected = joiner.units(lookups, ok)
    got = aside.units(lookups, ok)
    assert expected is not None and got is not None
    np.testing.assert_array_equal(got, expected)
    assert aside.set_aside["units"] == joiner.set_aside["units"] > 0
    assert AsideMafids().units(lookups, ok) is None  # nothing set aside: every row kept


def test_spilled_columns_are_the_pass_columns() -> None:
    for stem, columns in SPILLED_COLUMNS.items():
        assert {c.name for c in columns} <= {c.name for c in FILES[stem]}
        assert "MAFID" in {c.name for c in columns}
    assert pa.types.is_unsigned_integer(pa.from_numpy_dtype(np.dtype(SPILLED_COLUMNS["persons"][0].dtype)))


def test_the_default_plan_aims_at_its_target_and_refuses_only_by_the_limit() -> None:
    assert memory.plan_target(5 * GIB) == 5 * GIB  # a limit given is what the pass aims at
    assert memory.plan_target(None) == min(memory.default_memory_limit(), memory.DEFAULT_TARGET_BYTES)
    target = memory.DEFAULT_TARGET_BYTES
    nation = {"persons": 331_000_000, "units": 143_000_000, "geo": 143_000_000}
    wide = memory.plan_part(nation, 12 * GIB, validate=True, by_state=False, parallel=2)
    aimed = memory.plan_part(nation, 12 * GIB, validate=True, by_state=False, parallel=2, target=target)
    assert wide is not None and aimed is not None
    assert aimed.parallel == 2 and aimed.buckets > wide.buckets and aimed.peak_bytes <= target < wide.peak_bytes
    # A partition that fits in the limit stays in memory, above the target: spilling costs more.
    middle = {"persons": 30_000_000, "units": 13_000_000, "geo": 13_000_000}
    held = memory.plan_part(middle, 12 * GIB, validate=True, by_state=False, parallel=2, target=target)
    assert held is not None and not held.spilled and held.peak_bytes > target
    # A target below what any plan needs falls back to the limit; refusals follow the limit only.
    need = memory.needed_limit(nation, validate=True, by_state=False)
    assert memory.plan_part(nation, need, validate=True, by_state=False, target=GIB) is not None
    assert memory.plan_part(nation, need - (64 << 20), validate=True, by_state=False, target=need) is None


def test_states_counted_at_once_fit_the_target_and_a_larger_state_goes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "worker_processes", lambda: 2)
    california = {"persons": 39_540_000, "units": 17_000_000, "geo": 17_070_000}
    states = [california] + [{"persons": p, "units": p // 2, "geo": p // 2} for p in (29_000_000, 5_000_000, 600_000)]
    budget = memory.parallel_budget(states, 12 * GIB, validate=True, target=memory.DEFAULT_TARGET_BYTES)
    assert budget == memory.DEFAULT_TARGET_BYTES - memory.BY_STATE_FIXED_BYTES
    # California as measured at full US (about 3.0 GiB beside its process's own): counted alone.
    assert 2.8 * GIB <= memory.state_bytes(california) <= 3.2 * GIB
    assert memory.state_bytes(california) > budget
    assert memory.state_bytes(states[2]) + memory.state_bytes(states[3]) <= budget  # small states pair up
    fixed = memory.fixed_bytes(validate=True, by_state=True) + 2 * memory.WORKER_BYTES
    assert memory.parallel_budget(states, 12 * GIB, validate=True) == 12 * GIB - memory.BY_STATE_FIXED_BYTES
    assert memory.parallel_budget(states, fixed + memory.part_bytes(california) - 1, validate=True) is None


def test_the_bucket_table_gives_what_a_binary_search_of_the_cuts_gives() -> None:
    rng = np.random.default_rng(7)
    for n_cuts in (1, 2, 43, 58, 400):
        cuts = tuple(sorted({int(x) for x in rng.integers(MAFID_MIN, MAFID_MAX, n_cuts)}))
        plan = BucketPlan(cuts)
        edges = np.array([0, MAFID_MIN, MAFID_MIN + 1, MAFID_MAX - 1, MAFID_MAX], np.int64)
        near = np.concatenate([np.array(cuts) + d for d in (-1024, -1, 0, 1, 1023)])
        mafids = np.concatenate([edges, near, rng.integers(MAFID_MIN, MAFID_MAX + 1, 200_000)]).astype(np.int32)
        expected = np.searchsorted(np.asarray(cuts, np.int64), mafids.astype(np.int64), side="right")
        assert plan.bucket_of(mafids).tolist() == expected.tolist()
