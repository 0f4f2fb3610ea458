"""A corpus of bad inputs, each made by one small mutation of a valid dataset.

Every case names the failure a report must contain (file, columns, a phrase of the rule) and the
raw values it injected, which must never appear in a report. The valid base dataset is the demo
data (``demo/data/us``) when it exists, else a small ``phsafe.synthetic`` dataset.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"
STEMS = ("persons", "units", "geo")


@dataclass
class Dataset:
    """A dataset as text frames (every value a string) plus its config, and raw file edits."""

    frames: dict[str, pd.DataFrame]
    config: dict
    edits: list[Callable[[Path], None]] = field(default_factory=list)

    @property
    def persons(self) -> pd.DataFrame:
        return self.frames["persons"]

    @property
    def units(self) -> pd.DataFrame:
        return self.frames["units"]

    @property
    def geo(self) -> pd.DataFrame:
        return self.frames["geo"]

    def copy(self) -> "Dataset":
        return Dataset({k: v.copy() for k, v in self.frames.items()}, copy.deepcopy(self.config), list(self.edits))

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        for stem, frame in self.frames.items():
            frame.to_csv(directory / f"{stem}.csv", index=False, lineterminator="\n")
        (directory / "config.json").write_text(json.dumps(self.config, indent=1), encoding="utf-8")
        for edit in self.edits:
            edit(directory)
        return directory

    def mafids(self) -> set[str]:
        return {m for f in self.frames.values() if "MAFID" in f for m in f["MAFID"]}


def base_dataset() -> Dataset:
    """The valid dataset every case starts from."""
    if (DEMO_US / "persons.csv").exists():
        frames = {s: pd.read_csv(DEMO_US / f"{s}.csv", dtype=str, keep_default_na=False) for s in STEMS}
        config = json.loads((DEMO_US / "config.json").read_text(encoding="utf-8"))
        return Dataset(frames, config)
    from phsafe import synthetic

    states = ["01", "06", "11", "36", "48"]
    data = synthetic.generate(20_000, states, seed=20)
    frames = {s: getattr(data, s).astype(str) for s in STEMS}
    config = json.loads((REPO.parent / "shared" / "fixtures" / "production_config_us.json").read_text())
    config["state_filter"] = states
    return Dataset(frames, config)


@dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
        name: Test id.
        file: The file a failure must name.
        columns: Columns that failure must list (all of them; may list more).
        rule: A phrase of that failure's rule (case-insensitive).
        mutate: Turns the valid dataset into this bad one (in place).
        secrets: Injected raw values that must not appear in any report.
        cli: Also exercised through ``phsafe private --validate``.
    """

    name: str
    file: str
    columns: tuple[str, ...]
    rule: str
    mutate: Callable[[Dataset], None]
    secrets: tuple[str, ...] = ()
    cli: bool = False


# ------------------------------------------------------------------------------ row pickers
def _households(ds: Dataset) -> pd.DataFrame:
    u = ds.units
    return u[(u.RTYPE == "2") & (u.HHT != "0")]


def _vacant(ds: Dataset) -> pd.Series:
    u = ds.units
    return u[(u.RTYPE == "2") & (u.HHT == "0")].iloc[0]


def _gq_unit(ds: Dataset) -> pd.Series:
    return ds.units[ds.units.RTYPE == "4"].iloc[0]


def _person(ds: Dataset, relship: str, **where: str) -> int:
    p = ds.persons
    mask = p.RELSHIP == relship
    for col, value in where.items():
        mask &= p[col] == value
    return int(p.index[mask][0])


def _set(frame: pd.DataFrame, index: int, column: str, value: str) -> None:
    frame.loc[index, column] = value


def _own_child_household(ds: Dataset, hht2: str) -> str:
    """MAFID of a household of type ``hht2`` that has an own child under 18."""
    p = ds.persons
    kids = p[p.RELSHIP.isin(["25", "26", "27"]) & (p.QAGE.astype(int) < 18)]
    u = ds.units
    return str(u[(u.HHT2 == hht2) & u.MAFID.isin(kids.MAFID)].MAFID.iloc[0])


def _unit_index(ds: Dataset, mafid: str) -> int:
    return int(ds.units.index[ds.units.MAFID == mafid][0])


def _person_without_dependants(ds: Dataset) -> int:
    """A roommate (RELSHIP 34): moving or changing one breaks no other rule by itself."""
    return _person(ds, "34")


# ------------------------------------------------------------------------------ mutations
def _drop_column(stem: str, column: str) -> Callable[[Dataset], None]:
    def mutate(ds: Dataset) -> None:
        ds.frames[stem] = ds.frames[stem].drop(columns=[column])
    return mutate


def _add_column(ds: Dataset) -> None:
    ds.frames["units"]["EXTRA_COL"] = "1"


def _swap_columns(ds: Dataset) -> None:
    cols = list(ds.persons.columns)
    i, j = cols.index("CENRACE"), cols.index("RELSHIP")
    cols[i], cols[j] = cols[j], cols[i]
    ds.frames["persons"] = ds.persons[cols]


def _bad_tenure_code(ds: Dataset) -> None:
    _set(ds.units, int(_households(ds).index[0]), "TEN", "7")


def _lose_leading_zero(ds: Dataset) -> None:
    p = ds.persons
    _set(p, int(p.index[p.CENRACE == "01"][0]), "CENRACE", "1")


def _age_out_of_range(ds: Dataset) -> None:
    _set(ds.persons, _person_without_dependants(ds), "QAGE", "117")


def _duplicate_unit(ds: Dataset) -> None:
    v = _vacant(ds)
    ds.frames["units"] = pd.concat([ds.units, v.to_frame().T], ignore_index=True)


def _duplicate_geo(ds: Dataset) -> None:
    g = ds.geo
    ds.frames["geo"] = pd.concat([g, g.iloc[[5]]], ignore_index=True)


ORPHAN_MAFID = "899999999"


def _orphan_person(ds: Dataset) -> None:
    _set(ds.persons, _person_without_dependants(ds), "MAFID", ORPHAN_MAFID)


def _unit_without_geo(ds: Dataset) -> None:
    mafid = _households(ds).MAFID.iloc[3]
    ds.frames["geo"] = ds.geo[ds.geo.MAFID != mafid].reset_index(drop=True)


def _geo_without_unit(ds: Dataset) -> None:
    mafid = _vacant(ds).MAFID
    ds.frames["units"] = ds.units[ds.units.MAFID != mafid].reset_index(drop=True)


def _two_householders(ds: Dataset) -> None:
    _set(ds.persons, _person(ds, "21"), "RELSHIP", "20")


def _no_householder(ds: Dataset) -> None:
    p = ds.persons
    single = _households(ds)
    single = single[single.FINAL_POP == "1"]
    i = int(p.index[(p.MAFID == single.MAFID.iloc[0]) & (p.RELSHIP == "20")][0])
    _set(p, i, "RELSHIP", "34")


def _own_child_in_childless_type(ds: Dataset) -> None:
    _set(ds.units, _unit_index(ds, _own_child_household(ds, "01")), "HHT2", "02")


def _married_with_partner_cplt(ds: Dataset) -> None:
    u = ds.units
    _set(u, int(u.index[u.HHT2 == "02"][0]), "CPLT", "3")


def _cohabiting_with_married_cplt(ds: Dataset) -> None:
    u = ds.units
    _set(u, int(u.index[u.HHT2 == "04"][0]), "CPLT", "1")


def _gq_person_in_housing_unit(ds: Dataset) -> None:
    p = ds.persons
    i = int(p.index[p.RTYPE == "5"][0])
    _set(p, i, "MAFID", _households(ds).MAFID.iloc[0])


def _hu_person_in_gq(ds: Dataset) -> None:
    _set(ds.persons, _person_without_dependants(ds), "MAFID", _gq_unit(ds).MAFID)


def _gq_code_in_housing_unit(ds: Dataset) -> None:
    _set(ds.persons, _person_without_dependants(ds), "RELSHIP", "37")


def _geo_rtype_disagrees(ds: Dataset) -> None:
    mafid = _households(ds).MAFID.iloc[2]
    g = ds.geo
    _set(g, int(g.index[g.MAFID == mafid][0]), "RTYPE", "4")


def _person_in_vacant_unit(ds: Dataset) -> None:
    _set(ds.persons, _person_without_dependants(ds), "MAFID", _vacant(ds).MAFID)


def _householder_too_young(ds: Dataset) -> None:
    _set(ds.persons, _person(ds, "20"), "QAGE", "13")


def _parent_too_young(ds: Dataset) -> None:
    i = _person_without_dependants(ds)
    _set(ds.persons, i, "RELSHIP", "29")
    _set(ds.persons, i, "QAGE", "21")


def _occupied_without_tenure(ds: Dataset) -> None:
    _set(ds.units, int(_households(ds).index[1]), "TEN", "0")


def _gq_with_household_type(ds: Dataset) -> None:
    u = ds.units
    _set(u, int(u.index[u.RTYPE == "4"][0]), "HHT", "1")


def _empty_value(ds: Dataset) -> None:
    _set(ds.persons, _person_without_dependants(ds), "QAGE", "")


def _decimal_integer(ds: Dataset) -> None:
    _set(ds.units, int(_households(ds).index[4]), "FINAL_POP", "2.0")


def _raw(stem: str, transform: Callable[[bytes], bytes]) -> Callable[[Dataset], None]:
    def mutate(ds: Dataset) -> None:
        def edit(directory: Path) -> None:
            path = directory / f"{stem}.csv"
            path.write_bytes(transform(path.read_bytes()))
        ds.edits.append(edit)
    return mutate


def _append_long_row(data: bytes) -> bytes:
    return data + b"3,123456789,44,1,01,34,9\n"


def _semicolons(data: bytes) -> bytes:
    return data.replace(b",", b";")


def _invalid_utf8(data: bytes) -> bytes:
    lines = data.split(b"\n")
    fields = lines[10].split(b",")
    fields[4] = b"\xff\xfe"  # CENRACE
    lines[10] = b",".join(fields)
    return b"\n".join(lines)


def _delete(stem: str) -> Callable[[Dataset], None]:
    def mutate(ds: Dataset) -> None:
        ds.edits.append(lambda d: (d / f"{stem}.csv").unlink())
    return mutate


def _also_parquet(ds: Dataset) -> None:
    frame = ds.persons

    def edit(directory: Path) -> None:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), directory / "persons.parquet")
    ds.edits.append(edit)


def _parquet_code_as_integer(ds: Dataset) -> None:
    frame = ds.persons.copy()

    def edit(directory: Path) -> None:
        (directory / "persons.csv").unlink()
        table = pa.Table.from_pandas(frame, preserve_index=False)
        table = table.set_column(table.schema.get_field_index("CENRACE"), "CENRACE",
                                 pa.array(frame.CENRACE.astype(int), pa.int32()))
        pq.write_table(table, directory / "persons.parquet")
    ds.edits.append(edit)


def _config(change: Callable[[dict], None]) -> Callable[[Dataset], None]:
    def mutate(ds: Dataset) -> None:
        change(ds.config)
    return mutate


def _rename_level(c: dict) -> None:
    levels = c["privacy_budget"]["PH1_num"]
    levels["usa_all"] = levels.pop("usa_*")


def _typo_defn(c: dict) -> None:
    c["privacy_defn"] = "zCDP"


def _negative(c: dict) -> None:
    c["privacy_budget"]["PH2"]["state_*"] = -0.01


def _tau_zero(c: dict) -> None:
    c["tau"]["PH3"] = 0


def _mixed_pr(c: dict) -> None:
    c["state_filter"] = [*c["state_filter"], "72"]


def _cef(c: dict) -> None:
    c["reader"] = "cef"


def _budget_as_text(c: dict) -> None:
    c["privacy_budget"]["PH4"]["usa_*"] = "0.1"


def _missing_tau(c: dict) -> None:
    del c["tau"]["PH6"]


def _state_twice(c: dict) -> None:
    c["state_filter"] = [*c["state_filter"], c["state_filter"][0]]


P, U, G, C = "persons.csv", "units.csv", "geo.csv", "config.json"

CASES: tuple[Case, ...] = (
    # ---- headers
    Case("missing_column", P, ("QAGE",), "header row is exactly", _drop_column("persons", "QAGE"), cli=True),
    Case("extra_column", U, (), "unexpected EXTRA_COL", _add_column),
    Case("wrong_order", P, (), "out of order", _swap_columns),
    # ---- values
    Case("bad_code", U, ("TEN",), "one of the codes", _bad_tenure_code),
    Case("leading_zero_lost", P, ("CENRACE",), "2-digit code (leading zeros kept)", _lose_leading_zero),
    Case("age_out_of_range", P, ("QAGE",), "between 0 and 115", _age_out_of_range, secrets=("117",)),
    Case("empty_value", P, ("QAGE",), "whole number", _empty_value),
    Case("decimal_integer", U, ("FINAL_POP",), "whole number", _decimal_integer, secrets=("2.0",)),
    # ---- keys and files
    Case("duplicate_mafid_units", U, ("MAFID",), "unique in units", _duplicate_unit),
    Case("duplicate_mafid_geo", G, ("MAFID",), "unique in geo", _duplicate_geo),
    Case("orphan_person", P, ("MAFID",), "every person's MAFID", _orphan_person, secrets=(ORPHAN_MAFID,), cli=True),
    Case("unit_without_geo", U, ("MAFID",), "every unit's MAFID is in geo", _unit_without_geo),
    Case("geo_without_unit", G, ("MAFID",), "every geo MAFID is in units", _geo_without_unit),
    # ---- records that disagree
    Case("two_householders", U, ("persons.RELSHIP",), "exactly one householder", _two_householders),
    Case("no_householder", U, ("persons.RELSHIP",), "exactly one householder", _no_householder),
    Case("own_child_in_childless_type", P, ("units.HHT2",), "own child under 18", _own_child_in_childless_type,
         cli=True),
    Case("married_with_partner_cplt", U, ("HHT2", "CPLT"), "married-couple household", _married_with_partner_cplt),
    Case("cohabiting_with_married_cplt", U, ("HHT2", "CPLT"), "cohabiting-couple household",
         _cohabiting_with_married_cplt),
    Case("gq_person_in_housing_unit", P, ("RTYPE", "units.RTYPE"), "group-quarters facility",
         _gq_person_in_housing_unit),
    Case("hu_person_in_gq", P, ("RTYPE", "units.RTYPE"), "lives in a housing unit (units RTYPE 2)", _hu_person_in_gq),
    Case("gq_code_in_housing_unit", P, ("RTYPE", "RELSHIP"), "not a GQ code", _gq_code_in_housing_unit),
    Case("geo_rtype_disagrees", U, ("RTYPE", "geo.RTYPE"), "housing unit in geo too", _geo_rtype_disagrees),
    Case("person_in_vacant_unit", P, ("RTYPE", "units.HHT"), "occupied unit", _person_in_vacant_unit),
    Case("householder_too_young", P, ("RELSHIP", "QAGE"), "householder (RELSHIP 20) is aged 15 to 115",
         _householder_too_young),
    Case("parent_too_young", P, ("RELSHIP", "QAGE"), "parent or parent-in-law", _parent_too_young),
    Case("occupied_without_tenure", U, ("HHT", "TEN"), "tenure", _occupied_without_tenure),
    Case("gq_with_household_type", U, ("RTYPE", "HHT"), "group-quarters facility (RTYPE 4) has no household type",
         _gq_with_household_type),
    # ---- file structure
    Case("malformed_csv_row", P, (), "comma-separated fields", _raw("persons", _append_long_row),
         secrets=("123456789",), cli=True),
    Case("empty_file", G, (), "not empty", _raw("geo", lambda b: b"")),
    Case("wrong_delimiter", U, (), "comma-separated", _raw("units", _semicolons)),
    Case("non_utf8_bytes", P, ("CENRACE",), "UTF-8", _raw("persons", _invalid_utf8)),
    Case("missing_file", U, (), "units.csv or units.parquet", _delete("units")),
    Case("csv_and_parquet", P, (), "exactly one of persons.csv and persons.parquet", _also_parquet),
    Case("parquet_code_as_integer", "persons.parquet", ("CENRACE",), "stored as text", _parquet_code_as_integer),
    # ---- config
    Case("config_unknown_level", C, ("privacy_budget.PH1_num.usa_all",), "not a level", _config(_rename_level)),
    Case("config_privacy_defn_typo", C, ("privacy_defn",), "zcdp", _config(_typo_defn), cli=True),
    Case("negative_budget", C, ("privacy_budget.PH2.state_*",), "non-negative", _config(_negative)),
    Case("tau_zero", C, ("tau.PH3",), "at least 1", _config(_tau_zero)),
    Case("mixed_pr_and_states", C, ("state_filter",), "Puerto Rico", _config(_mixed_pr)),
    Case("cef_reader", C, ("reader",), "cef", _config(_cef)),
    Case("budget_as_text", C, ("privacy_budget.PH4.usa_*",), "number", _config(_budget_as_text)),
    Case("missing_tau", C, ("tau.PH6",), "required", _config(_missing_tau)),
    Case("state_listed_twice", C, ("state_filter",), "twice", _config(_state_twice)),
)


def build(case: Case, base: Dataset, directory: Path) -> Dataset:
    """Write ``case``'s bad dataset into ``directory``; return the mutated dataset."""
    ds = base.copy()
    case.mutate(ds)
    ds.write(directory)
    return ds
