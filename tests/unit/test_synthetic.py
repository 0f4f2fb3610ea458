"""Tests of the synthetic-data generator: every consistency rule of spec §1, formats, marginals.

The rules are checked here with plain pandas, independently of the generator's own code, on a
US sample, a Puerto Rico sample, a sample over all production states and a few tiny samples.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phsafe import synthetic
from phsafe.synthetic import SyntheticData, generate, write

US_STATES = ["01", "06", "36", "48", "11"]
# The 50 states and DC: the state_filter of the production US run.
PRODUCTION_STATES = [f"{c:02d}" for c in range(1, 57) if c not in {3, 7, 14, 43, 52}]

PERSONS_COLUMNS = ["RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"]
UNITS_COLUMNS = ["RTYPE", "MAFID", "FINAL_POP", "NPF", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2",
                 "CPLT"]
GEO_COLUMNS = ["RTYPE", "MAFID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "TABBLKGRPCE",
               "REGIONCE", "DIVISIONCE", "PLACEFP", "AIANNHCE"]

RACE = r"0[1-9]|[1-5][0-9]|6[0-3]"
CODE_PATTERNS = {
    "persons": {"RTYPE": r"[35]", "CENRACE": RACE, "RELSHIP": r"2[0-9]|3[0-8]"},
    "units": {"RTYPE": r"[24]", "HHRACE": "00|" + RACE, "TEN": r"[0-4]", "HHT": r"[0-7]",
              "HHT2": r"0[0-9]|1[0-2]", "CPLT": r"[0-5]"},
    "geo": {"RTYPE": r"[24]", "TABBLKST": r"\d{2}", "TABBLKCOU": r"\d{3}",
            "TABTRACTCE": r"\d{6}", "TABBLK": r"\d{4}", "TABBLKGRPCE": r"\d",
            "REGIONCE": r"[12349]", "DIVISIONCE": r"\d", "PLACEFP": r"\d{5}",
            "AIANNHCE": r"\d{4}"},
}
INTEGER_RANGES = {
    "persons": {"MAFID": (100_000_001, 900_000_000), "QAGE": (0, 115), "CENHISP": (1, 2)},
    "units": {"MAFID": (100_000_001, 900_000_000), "FINAL_POP": (0, 100_000), "NPF": (0, 97),
              "HHSPAN": (0, 2)},
    "geo": {"MAFID": (100_000_001, 900_000_000)},
}
REGION_DIVISION = {"01": ("3", "6"), "06": ("4", "9"), "11": ("3", "5"), "36": ("1", "2"),
                   "48": ("3", "7"), "72": ("9", "0"), "09": ("1", "1"), "17": ("2", "3"),
                   "19": ("2", "4"), "04": ("4", "8")}


@pytest.fixture(scope="module")
def us() -> SyntheticData:
    return generate(30_000, US_STATES, seed=11)


@pytest.fixture(scope="module")
def pr() -> SyntheticData:
    return generate(5_000, ["72"], seed=12)


@pytest.fixture(scope="module")
def nation() -> SyntheticData:
    return generate(40_000, PRODUCTION_STATES, seed=13)


def _household_summary(data: SyntheticData) -> pd.DataFrame:
    """Occupied housing units joined with facts computed from their persons."""
    p = data.persons
    rel = p["RELSHIP"].astype(int)
    age = p["QAGE"].astype(int)
    facts = pd.DataFrame({
        "MAFID": p["MAFID"],
        "n": 1,
        "householders": rel == 20,
        "sp21": rel == 21, "sp23": rel == 23, "pa22": rel == 22, "pa24": rel == 24,
        "relatives": rel.isin([21, 23, *range(25, 34)]),
        "own_u18": rel.isin([25, 26, 27]) & (age < 18),
    }).groupby("MAFID").sum()
    hh_person = p[rel == 20].set_index("MAFID")[["QAGE", "CENHISP", "CENRACE"]]
    units = data.units[(data.units["RTYPE"] == "2") & (data.units["HHT"] != "0")]
    out = units.join(facts, on="MAFID", how="left").join(hh_person, on="MAFID", how="left")
    return out


def assert_consistent(data: SyntheticData, states: list[str]) -> None:
    """Every consistency rule of spec §1 and of the validation suites."""
    persons, units, geo = data.persons, data.units, data.geo

    # Columns, order, formats.
    assert list(persons.columns) == PERSONS_COLUMNS
    assert list(units.columns) == UNITS_COLUMNS
    assert list(geo.columns) == GEO_COLUMNS
    for name, frame in (("persons", persons), ("units", units), ("geo", geo)):
        for col, pattern in CODE_PATTERNS[name].items():
            assert pd.api.types.is_string_dtype(frame[col]), (name, col)
            assert frame[col].str.fullmatch(pattern).all(), (name, col)
        for col, (lo, hi) in INTEGER_RANGES[name].items():
            assert pd.api.types.is_integer_dtype(frame[col]), (name, col)
            if len(frame):
                assert frame[col].min() >= lo and frame[col].max() <= hi, (name, col)

    # Keys.
    assert units["MAFID"].is_unique and geo["MAFID"].is_unique
    assert set(units["MAFID"]) == set(geo["MAFID"])
    assert persons["MAFID"].isin(units["MAFID"]).all()
    merged = units[["MAFID", "RTYPE"]].merge(geo[["MAFID", "RTYPE"]], on="MAFID")
    assert (merged["RTYPE_x"] == merged["RTYPE_y"]).all()

    # Person and unit record types agree.
    joined = persons.merge(units, on="MAFID", suffixes=("", "_u"))
    rel = joined["RELSHIP"].astype(int)
    hu = joined["RTYPE"] == "3"
    assert (joined.loc[hu, "RTYPE_u"] == "2").all()
    assert (joined.loc[hu, "HHT"] != "0").all()
    assert rel[hu].between(20, 36).all()
    gq = joined["RTYPE"] == "5"
    assert (joined.loc[gq, "RTYPE_u"] == "4").all()
    assert rel[gq].isin([37, 38]).all()
    assert (joined[gq].groupby("MAFID")["RELSHIP"].nunique() == 1).all()

    # GQ facilities.
    gq_units = units[units["RTYPE"] == "4"]
    for col, value in (("HHT", "0"), ("HHT2", "00"), ("CPLT", "0"), ("TEN", "0"),
                       ("HHRACE", "00")):
        assert (gq_units[col] == value).all(), col
    assert (gq_units["HHSPAN"] == 0).all() and (gq_units["NPF"] == 0).all()
    counts = persons.groupby("MAFID").size()
    assert (gq_units["MAFID"].map(counts) == gq_units["FINAL_POP"]).all()

    # Vacant housing units.
    vacant = units[(units["RTYPE"] == "2") & (units["HHT"] == "0")]
    assert not vacant["MAFID"].isin(persons["MAFID"]).any()
    for col, value in (("HHT2", "00"), ("CPLT", "0"), ("TEN", "0"), ("HHRACE", "00")):
        assert (vacant[col] == value).all(), col
    assert ((vacant["FINAL_POP"] == 0) & (vacant["NPF"] == 0) & (vacant["HHSPAN"] == 0)).all()

    # Households.
    hh = _household_summary(data)
    assert (hh["householders"] == 1).all()
    assert (hh["n"] == hh["FINAL_POP"]).all()
    assert (hh["HHSPAN"] == hh["CENHISP"]).all() and (hh["HHRACE"] == hh["CENRACE"]).all()
    assert hh["TEN"].isin(["1", "2", "3", "4"]).all()
    spouses = hh["sp21"] + hh["sp23"]
    partners = hh["pa22"] + hh["pa24"]
    assert (spouses + partners <= 1).all()
    assert ((hh["HHT"] == "1") == (spouses == 1)).all()
    married, cohab, single = spouses == 1, partners == 1, spouses + partners == 0
    child_hht2 = hh["HHT2"].isin(["01", "03", "06", "10"])
    assert (child_hht2 == (hh["own_u18"] > 0)).all()
    assert (hh.loc[married, "HHT2"].isin(["01", "02"])).all()
    assert (hh.loc[married, "CPLT"] == np.where(hh.loc[married, "sp21"] == 1, "1", "2")).all()
    assert (hh.loc[cohab, "HHT2"].isin(["03", "04"])).all()
    assert (hh.loc[cohab, "CPLT"] == np.where(hh.loc[cohab, "pa22"] == 1, "3", "4")).all()
    assert (hh.loc[single, "CPLT"] == "5").all()
    assert hh.loc[single, "HHT2"].isin([f"{c:02d}" for c in range(5, 13)]).all()
    # HHT from relatives / living alone; sex of HHT and HHT2 agree for householders alone.
    others = ~married
    has_rel = hh["relatives"] > 0
    alone = hh["n"] == 1
    assert hh.loc[others & has_rel, "HHT"].isin(["2", "3"]).all()
    assert hh.loc[others & ~has_rel & alone, "HHT"].isin(["4", "6"]).all()
    assert hh.loc[others & ~has_rel & ~alone, "HHT"].isin(["5", "7"]).all()
    hht2 = hh.loc[single, "HHT2"].astype(int)
    female = hh.loc[single, "HHT"].isin(["3", "6", "7"])
    assert (female == (hht2 <= 8)).all()
    kind = (hht2 - 5) % 4  # 0 alone, 1 own children < 18, 2 relatives, 3 only nonrelatives
    s = hh[single]
    assert ((kind == 0) == (s["n"] == 1)).all()
    assert ((kind == 1) == (s["own_u18"] > 0)).all()
    assert ((kind == 2) == ((s["own_u18"] == 0) & (s["relatives"] > 0))).all()
    assert ((kind == 3) == ((s["n"] > 1) & (s["relatives"] == 0))).all()
    family = hh["HHT"].isin(["1", "2", "3"])
    assert (hh.loc[family, "NPF"] == hh.loc[family, "relatives"] + 1).all()
    assert (hh.loc[family, "NPF"] >= 2).all()
    assert (hh.loc[~family, "NPF"] == 0).all()

    # Ages by relationship.
    p = persons[persons["RTYPE"] == "3"].join(
        persons[persons["RELSHIP"] == "20"].set_index("MAFID")["QAGE"].rename("HH_AGE"),
        on="MAFID")
    rel, age, hh_age = p["RELSHIP"].astype(int), p["QAGE"], p["HH_AGE"]
    assert (age[rel.isin([20, 21, 22, 23, 24, 32])] >= 15).all()
    parents = rel.isin([29, 31])
    assert (age[parents] >= 30).all() and (age[parents] > hh_age[parents]).all()
    assert (age[rel == 30] < hh_age[rel == 30]).all()
    children = rel.isin([25, 26, 27])
    assert (age[children] <= hh_age[children] - 12).all()

    # Geography.
    assert geo["TABBLKST"].isin(states).all()
    assert (geo["TABBLKGRPCE"] == geo["TABBLK"].str[0]).all()
    for state, (region, division) in REGION_DIVISION.items():
        g = geo[geo["TABBLKST"] == state]
        assert (g["REGIONCE"] == region).all() and (g["DIVISIONCE"] == division).all(), state
    tract = ["TABBLKST", "TABBLKCOU", "TABTRACTCE"]
    assert (geo.groupby(tract)["PLACEFP"].nunique() == 1).all()
    assert (geo.groupby(tract)["AIANNHCE"].nunique() == 1).all()


@pytest.mark.parametrize("sample", ["us", "pr", "nation"])
def test_samples_are_consistent(sample: str, request: pytest.FixtureRequest) -> None:
    data = request.getfixturevalue(sample)
    states = {"us": US_STATES, "pr": ["72"], "nation": PRODUCTION_STATES}[sample]
    assert_consistent(data, states)


@pytest.mark.parametrize("n", [1, 2, 7, 50, 333])
def test_tiny_samples_are_consistent(n: int) -> None:
    data = generate(n, ["06", "72"], seed=n)
    assert len(data.persons) == n
    assert_consistent(data, ["06", "72"])


def test_exact_person_count_and_presence_of_every_unit_kind(us: SyntheticData) -> None:
    assert len(us.persons) == 30_000
    units = us.units
    households = units[(units["RTYPE"] == "2") & (units["HHT"] != "0")]
    assert (households["FINAL_POP"] > 10).sum() >= 5
    assert households["FINAL_POP"].max() <= 20
    gq = units[units["RTYPE"] == "4"]
    assert len(gq) >= 3 and gq["FINAL_POP"].max() >= 50
    assert set(us.persons["RELSHIP"]) >= {f"{c}" for c in range(20, 39)}
    vacant = (units["RTYPE"] == "2") & (units["HHT"] == "0")
    assert 0.08 <= vacant.sum() / (units["RTYPE"] == "2").sum() <= 0.12
    assert set(units["HHT"]) == {str(c) for c in range(8)}
    assert set(units["HHT2"]) == {f"{c:02d}" for c in range(13)}
    assert set(units["CPLT"]) == {str(c) for c in range(6)}


def test_household_size_distribution(nation: SyntheticData) -> None:
    units = nation.units
    sizes = units.loc[(units["RTYPE"] == "2") & (units["HHT"] != "0"), "FINAL_POP"]
    share = sizes.clip(upper=7).value_counts(normalize=True)
    expected = {1: 0.28, 2: 0.34, 3: 0.15, 4: 0.13, 5: 0.06, 6: 0.025, 7: 0.015}
    for size, target in expected.items():
        assert abs(share.get(size, 0.0) - target) <= max(0.02, target / 3), size
    assert (sizes > 10).mean() >= 0.001


def test_national_marginals(nation: SyntheticData) -> None:
    p = nation.persons
    assert 0.02 <= (p["RTYPE"] == "5").mean() <= 0.03
    assert 0.19 <= (p["QAGE"] < 18).mean() <= 0.25
    assert 0.15 <= (p["CENHISP"] == 2).mean() <= 0.23
    race = p["CENRACE"].astype(int)
    assert 0.06 <= (race >= 7).mean() <= 0.14
    assert 0.50 <= (race == 1).mean() <= 0.70
    assert set(range(1, 7)) <= set(race)
    # Units spread over the states roughly by population: California is the largest.
    counts = nation.geo["TABBLKST"].value_counts()
    assert counts.index[0] == "06"
    assert set(counts.index) == set(PRODUCTION_STATES)


def test_puerto_rico(pr: SyntheticData) -> None:
    assert (pr.geo["TABBLKST"] == "72").all()
    assert (pr.geo["REGIONCE"] == "9").all() and (pr.geo["DIVISIONCE"] == "0").all()
    assert (pr.persons["CENHISP"] == 2).mean() > 0.95


def test_persons_are_shuffled(us: SyntheticData) -> None:
    mafid = us.persons["MAFID"].to_numpy()
    assert (mafid[1:] == mafid[:-1]).mean() < 0.02
    assert not us.persons["MAFID"].is_monotonic_increasing
    first = us.persons.groupby("MAFID")["RELSHIP"].first()
    assert 0.2 < (first == "20").mean() < 0.8


def test_seed_determinism() -> None:
    a = generate(2_000, US_STATES, seed=5)
    b = generate(2_000, US_STATES, seed=5)
    c = generate(2_000, US_STATES, seed=6)
    for name in ("persons", "units", "geo"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert not a.persons.equals(c.persons)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        generate(0, ["06"])
    with pytest.raises(ValueError):
        generate(10, [])
    with pytest.raises(ValueError):
        generate(10, ["6"])
    with pytest.raises(ValueError):
        generate(10, ["06", "06"])
    with pytest.raises(TypeError):
        generate(10, "06")
    with pytest.raises(ValueError):
        write(generate(10, ["06"], seed=1), Path("unused"), fmt="json")  # type: ignore[arg-type]


def _as_strings(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({c: frame[c].astype(int).astype(str) if pd.api.types.is_integer_dtype(
        frame[c]) else frame[c].astype(str) for c in frame.columns}).astype(object)


def test_write_csv_round_trip(pr: SyntheticData, tmp_path: Path) -> None:
    write(pr, tmp_path, fmt="csv")
    for name, columns in (("persons", PERSONS_COLUMNS), ("units", UNITS_COLUMNS),
                          ("geo", GEO_COLUMNS)):
        path = tmp_path / f"{name}.csv"
        lines = path.read_text().splitlines()
        assert lines[0] == ",".join(columns)
        assert '"' not in "".join(lines[:50])
        back = pd.read_csv(path, dtype=str, keep_default_na=False).astype(object)
        pd.testing.assert_frame_equal(back, _as_strings(getattr(pr, name)))


def test_write_parquet_round_trip(pr: SyntheticData, tmp_path: Path) -> None:
    write(pr, tmp_path, fmt="parquet")
    for name in ("persons", "units", "geo"):
        path = tmp_path / f"{name}.parquet"
        schema = pq.read_schema(path)
        for col in CODE_PATTERNS[name]:
            assert str(schema.field(col).type) == "string", (name, col)
        for col in INTEGER_RANGES[name]:
            assert pa.types.is_integer(schema.field(col).type), (name, col)
        back = pd.read_parquet(path)
        assert list(back.columns) == list(getattr(pr, name).columns)
        pd.testing.assert_frame_equal(_as_strings(back), _as_strings(getattr(pr, name)))


def test_command_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from phsafe.cli import main

    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["synth", "--persons", "300", "--states", "01,06", "--out", str(out),
                                       "--format", "parquet", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["geo.parquet", "persons.parquet",
                                                     "synth.json", "units.parquet"]
    assert len(pd.read_parquet(out / "persons.parquet")) == 300


@pytest.mark.parametrize("column, before, after", [
    ("HHT2", "01", "02"),   # own child under 18 in a married couple "without children"
    ("CPLT", "1", "3"),     # married couple with an unmarried-partner CPLT
    ("HHT", "6", "4"),      # female householder alone recorded as male
])
def test_checker_catches_inconsistency(us: SyntheticData, column: str, before: str,
                                       after: str) -> None:
    units = us.units.copy()
    row = units.index[units[column] == before][0]
    units.loc[row, column] = after
    with pytest.raises(AssertionError):
        assert_consistent(SyntheticData(us.persons, units, us.geo), US_STATES)


# --------------------------------------------------------------------------------------------
# synthesize: data of any size, chunk by chunk, in three formats
# --------------------------------------------------------------------------------------------

from phsafe.cli.synth import parse_count, synth  # noqa: E402
from phsafe.synthetic import US_STATES, plan_chunks, resolve_states, synthesize  # noqa: E402

TAU = 10  # the production tau of the person tables PH1_num, PH2, PH4, PH7


def _read_dataset(directory: Path) -> SyntheticData:
    """A written dataset (any format) back as string/integer frames like ``generate``'s."""
    frames = {}
    for stem in ("persons", "units", "geo"):
        if (directory / f"{stem}.csv").exists():
            dtypes = {c: str for c in CODE_PATTERNS[stem]} | {c: np.int64 for c in INTEGER_RANGES[stem]}
            frames[stem] = pd.read_csv(directory / f"{stem}.csv", dtype=dtypes, keep_default_na=False)
        else:
            path = directory / (stem if (directory / stem).is_dir() else f"{stem}.parquet")
            table = pq.ParquetDataset(path, partitioning=None).read() if path.is_dir() else pq.read_table(path)
            frame = table.to_pandas()
            frames[stem] = frame.astype({c: str for c in CODE_PATTERNS[stem]})
        frames[stem] = frames[stem].astype({c: "string" for c in CODE_PATTERNS[stem]})
    return SyntheticData(**frames)


@pytest.fixture(scope="module")
def big_us(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SyntheticData]:
    """US data written in small chunks (California spans several), partitioned by state."""
    out = tmp_path_factory.mktemp("synth") / "us"
    synthesize(out, 60_000, "us", fmt="parquet-partitioned", seed=9, chunk_persons=3_000)
    return out, _read_dataset(out)


def test_synthesize_is_consistent_across_chunks(big_us: tuple[Path, SyntheticData]) -> None:
    _, data = big_us
    assert len(data.persons) == 60_000
    assert_consistent(data, list(US_STATES))  # MAFIDs unique; tracts agree across chunks


def test_synthesize_structure(big_us: tuple[Path, SyntheticData]) -> None:
    out, data = big_us
    geo, units, persons = data.geo, data.units, data.persons
    # Every state present, in proportion to the 2020 populations.
    per_state = geo.merge(persons, on="MAFID").groupby("TABBLKST").size()
    assert set(per_state.index) == set(US_STATES)
    pops = {s: synthetic._STATES[s][2] for s in US_STATES}
    expected = pd.Series(pops) / sum(pops.values()) * len(persons)
    assert ((per_state - expected[per_state.index]).abs() <= 1).all()
    # Household sizes with a tail above tau.
    households = units[(units["RTYPE"] == "2") & (units["HHT"] != "0")]
    assert (households["FINAL_POP"] > TAU).sum() >= 20
    # Vacant units and group quarters in the expected shares.
    vacant = (units["RTYPE"] == "2") & (units["HHT"] == "0")
    assert 0.08 <= vacant.sum() / (units["RTYPE"] == "2").sum() <= 0.12
    assert 0.02 <= (persons["RTYPE"] == "5").mean() <= 0.03
    assert set(persons.loc[persons["RTYPE"] == "5", "RELSHIP"]) == {"37", "38"}
    # Tenure: owners and renters both common.
    assert 0.5 <= households["TEN"].isin(["1", "2"]).mean() <= 0.8
    # Race and ethnicity vary by state: Hispanic share much higher in California than in Maine.
    by_state = geo[["MAFID", "TABBLKST"]].merge(persons, on="MAFID")
    hisp = by_state.groupby("TABBLKST")["CENHISP"].apply(lambda c: (c == 2).mean())
    assert hisp["06"] > 0.3 > 0.06 > hisp["23"]
    asian = by_state.groupby("TABBLKST")["CENRACE"].apply(lambda c: (c == "04").mean())
    assert asian["15"] > 0.2 > asian["06"] > asian["54"]
    # The manifest records how to reproduce the data.
    manifest = json.loads((out / "synth.json").read_text())
    assert manifest["seed"] == 9 and manifest["persons"] == 60_000 and manifest["format"] == "parquet-partitioned"


def test_all_states_writes_puerto_rico_as_its_own_dataset(tmp_path: Path) -> None:
    result = synthesize(tmp_path, 40_000, "all", fmt="csv", seed=1)
    assert set(result.datasets) == {tmp_path / "us", tmp_path / "pr"}
    us, pr = _read_dataset(tmp_path / "us"), _read_dataset(tmp_path / "pr")
    assert set(us.geo["TABBLKST"]) == set(US_STATES)
    assert set(pr.geo["TABBLKST"]) == {"72"}
    assert len(us.persons) + len(pr.persons) == 40_000
    assert abs(len(pr.persons) - 40_000 * 3286 / (3286 + sum(synthetic._STATES[s][2] for s in US_STATES))) <= 1
    assert not set(us.units["MAFID"]) & set(pr.units["MAFID"])  # MAFIDs unique nationally
    assert_consistent(pr, ["72"])
    assert (pr.persons["CENHISP"] == 2).mean() > 0.95


def test_formats_hold_the_same_records(tmp_path: Path) -> None:
    frames = {}
    for fmt in ("csv", "parquet", "parquet-partitioned"):
        synthesize(tmp_path / fmt, 5_000, "01,06,11", fmt=fmt, seed=3, chunk_persons=1_500)
        frames[fmt] = _read_dataset(tmp_path / fmt)
    for stem in ("persons", "units", "geo"):
        ref = getattr(frames["csv"], stem)
        key = list(ref.columns)
        ref = ref.sort_values(key).reset_index(drop=True)
        for fmt in ("parquet", "parquet-partitioned"):
            other = getattr(frames[fmt], stem).sort_values(key).reset_index(drop=True)
            pd.testing.assert_frame_equal(_as_strings(other), _as_strings(ref), obj=f"{fmt} {stem}")


def test_synthesize_is_deterministic_and_chunks_are_independent(tmp_path: Path) -> None:
    synthesize(tmp_path / "a", 8_000, "01,06", seed=5, chunk_persons=2_000)
    synthesize(tmp_path / "b", 8_000, "01,06", seed=5, chunk_persons=2_000)
    synthesize(tmp_path / "c", 8_000, "01,06", seed=6, chunk_persons=2_000)
    for stem in ("persons", "units", "geo"):
        a = (tmp_path / "a" / f"{stem}.csv").read_bytes()
        assert a == (tmp_path / "b" / f"{stem}.csv").read_bytes()
        assert a != (tmp_path / "c" / f"{stem}.csv").read_bytes()
    plan = plan_chunks(8_000, {"": ["01", "06"]}, seed=5, chunk_persons=2_000).chunks
    assert [c.state for c in plan] == ["01", "06", "06", "06", "06"]
    assert sum(c.n_persons for c in plan) == 8_000
    assert all(a.mafid_hi <= b.mafid_lo for a, b in zip(plan, plan[1:]))  # disjoint MAFID ranges
    assert len({c.seed.spawn_key for c in plan}) == len(plan)  # independent seed streams


def test_synthesize_refuses_to_mix_datasets(tmp_path: Path) -> None:
    synthesize(tmp_path, 500, "01", fmt="csv", seed=1)
    with pytest.raises(FileExistsError):
        synthesize(tmp_path, 500, "01", fmt="parquet", seed=1)
    synthesize(tmp_path, 500, "01", fmt="parquet", seed=1, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["geo.parquet", "persons.parquet", "synth.json",
                                                          "units.parquet"]


@pytest.mark.parametrize("spec, expected", [
    ("us", {"": list(US_STATES)}), ("PR", {"": ["72"]}),
    ("all", {"us": list(US_STATES), "pr": ["72"]}), ("06, 01", {"": ["06", "01"]}),
])
def test_resolve_states(spec: str, expected: dict[str, list[str]]) -> None:
    assert resolve_states(spec) == expected


@pytest.mark.parametrize("spec", ["06,72", "6", "06,06", "99", ""])
def test_resolve_states_rejects(spec: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        resolve_states(spec)


def test_parse_count() -> None:
    assert parse_count("1000") == 1000
    assert parse_count("1_000_000") == 1_000_000
    assert parse_count("10M") == 10_000_000
    assert parse_count("331.4M") == 331_400_000
    assert parse_count("1e6") == 1_000_000
    assert parse_count("2k") == 2_000
    for bad in ("0", "-5", "1.5", "ten", "1.2345k"):
        with pytest.raises(Exception):
            parse_count(bad)


def test_synth_command(tmp_path: Path) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(synth, ["--persons", "2k", "--out", str(tmp_path / "d"), "--states", "pr",
                                        "--format", "parquet-partitioned", "--seed", "4", "--quiet"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "d" / "persons" / "TABBLKST=72" / "part-0.parquet").exists()
    again = CliRunner().invoke(synth, ["--persons", "2k", "--out", str(tmp_path / "d"), "--states", "pr"])
    assert again.exit_code == 1 and "--overwrite" in again.output
    bad = CliRunner().invoke(synth, ["--persons", "10", "--out", str(tmp_path / "e"), "--states", "01,72"])
    assert bad.exit_code == 2


def test_synth_is_mounted_on_the_phsafe_command() -> None:
    from phsafe.cli import main as cli_main

    assert "synth" in cli_main.commands


@pytest.mark.parametrize("fmt", ["csv", "parquet-partitioned"])
def test_generated_data_passes_validation(tmp_path: Path, fmt: str) -> None:
    from phsafe.intake import validate_inputs

    from tests.conftest import PR_CONFIG, US_CONFIG

    synthesize(tmp_path, 30_000, "all", fmt=fmt, seed=21)  # type: ignore[arg-type]
    for name, config in (("us", US_CONFIG), ("pr", PR_CONFIG)):
        report = validate_inputs(config, tmp_path / name)
        assert report.ok, report.to_text()
