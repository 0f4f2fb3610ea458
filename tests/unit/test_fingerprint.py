"""The content fingerprint (phsafe.fingerprint): one dataset identity whatever the storage.

The same records as CSV, Parquet and Parquet stored by state, shuffled, with CRLF line endings,
quoted fields, a trailing blank line or zero-padded integers give one digest; one changed
tabulated record gives another. Records the run sets aside (other states) do not count.
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
from phsafe.config import load_config
from phsafe.intake import count_partition, exact_counts, plan_partitions
from phsafe.fingerprint import ContentDigest
from phsafe.tables import TABLES
from tests.conftest import US_CONFIG

STATES = ["01", "06", "11"]
SPECS = [TABLES["PH1_num"], TABLES["PH1_denom"]]
KEY = bytes(range(16))
LINEAGE_KEY = bytes(range(32))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fp")
    synthetic.synthesize(root / "csv", 3000, STATES, fmt="csv", seed=11)
    synthetic.synthesize(root / "parquet", 3000, STATES, fmt="parquet", seed=11)
    synthetic.synthesize(root / "partitioned", 3000, STATES, fmt="parquet-partitioned", seed=11)
    return root


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory):
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(raw))
    return load_config(path)


def commitment(config, data: Path) -> str:
    return exact_counts(config, data, SPECS, key=KEY).content.commit(LINEAGE_KEY)


def rewrite_csv(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    dst.mkdir(parents=True)
    for stem in ("persons", "units", "geo"):
        text = (src / f"{stem}.csv").read_text()
        (dst / f"{stem}.csv").write_text(edit(stem, text))
    return dst


def test_same_records_in_every_storage_give_one_fingerprint(base: Path, config, tmp_path: Path) -> None:
    reference = commitment(config, base / "csv")
    assert commitment(config, base / "parquet") == reference
    assert commitment(config, base / "partitioned") == reference

    def shuffle(stem: str, text: str) -> str:
        header, *rows = text.splitlines()
        order = np.random.default_rng(5).permutation(len(rows))
        return "\n".join([header, *[rows[i] for i in order]]) + "\n"

    def crlf_and_blank(stem: str, text: str) -> str:
        return text.replace("\n", "\r\n") + "\r\n"

    def quoted(stem: str, text: str) -> str:
        return "\n".join(",".join(f'"{f}"' for f in line.split(",")) for line in text.splitlines()) + "\n"

    for edit in (shuffle, crlf_and_blank, quoted):
        assert commitment(config, rewrite_csv(base / "csv", tmp_path / edit.__name__, edit)) == reference, edit.__name__


def test_integer_widths_do_not_matter(base: Path, config, tmp_path: Path) -> None:
    # QAGE written zero-padded ("007") is the same age; Parquet int64 instead of int32 too.
    def padded(stem: str, text: str) -> str:
        if stem != "persons":
            return text
        header, *rows = text.splitlines()
        col = header.split(",").index("QAGE")
        out = [header]
        for row in rows:
            fields = row.split(",")
            fields[col] = fields[col].zfill(3)
            out.append(",".join(fields))
        return "\n".join(out) + "\n"

    reference = commitment(config, base / "csv")
    assert commitment(config, rewrite_csv(base / "csv", tmp_path / "padded", padded)) == reference
    wide = tmp_path / "wide"
    wide.mkdir()
    for stem in ("persons", "units", "geo"):
        table = pq.read_table(base / "parquet" / f"{stem}.parquet")
        fields = [pa.field(f.name, pa.int64()) if pa.types.is_integer(f.type) else f for f in table.schema]
        pq.write_table(table.cast(pa.schema(fields)), wide / f"{stem}.parquet")
    assert commitment(config, wide) == reference


def test_one_changed_record_gives_another_fingerprint(base: Path, config, tmp_path: Path) -> None:
    reference = commitment(config, base / "csv")
    persons = pd.read_csv(base / "csv" / "persons.csv", dtype=str)
    geo = pd.read_csv(base / "csv" / "geo.csv", dtype=str)
    # a person of a released state, housing-unit geo: tabulated
    tabulated = persons["MAFID"].isin(geo.loc[geo["RTYPE"] == "2", "MAFID"]) & (persons["RTYPE"] == "3")
    row = persons.index[tabulated][0]
    for column, value in (("QAGE", lambda v: str((int(v) + 1) % 100)),
                          ("CENRACE", lambda v: "02" if v != "02" else "01")):
        changed = persons.copy()
        changed.loc[row, column] = value(changed.loc[row, column])
        out = tmp_path / column
        out.mkdir()
        changed.to_csv(out / "persons.csv", index=False)
        for stem in ("units", "geo"):
            (out / f"{stem}.csv").write_bytes((base / "csv" / f"{stem}.csv").read_bytes())
        assert commitment(config, out) != reference, column
    # a duplicated record is another multiset, too
    out = tmp_path / "duplicate"
    out.mkdir()
    pd.concat([persons, persons.iloc[[row]]]).to_csv(out / "persons.csv", index=False)
    for stem in ("units", "geo"):
        (out / f"{stem}.csv").write_bytes((base / "csv" / f"{stem}.csv").read_bytes())
    assert commitment(config, out) != reference


def test_records_outside_the_state_filter_do_not_count(base: Path, config, tmp_path: Path) -> None:
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = ["01", "06"]
    path = tmp_path / "two.json"
    path.write_text(json.dumps(raw))
    two = load_config(path)
    # The partitioned reading does not even open state 11's folder; the CSV reading drops it.
    assert commitment(two, base / "csv") == commitment(two, base / "partitioned")
    assert commitment(two, base / "csv") != commitment(config, base / "csv")


def test_partitions_add_up_and_the_digest_is_keyed_and_never_shown(base: Path, config) -> None:
    whole = exact_counts(config, base / "csv", SPECS, key=KEY).content
    parts = plan_partitions(config, base / "partitioned", max_persons=400)
    assert len(parts) > 3
    total = ContentDigest()
    for p in parts:
        total = total + count_partition(p, config, SPECS, key=KEY).content
    assert total == whole
    assert whole.persons > 0 and whole.units > 0
    assert whole.commit(LINEAGE_KEY) != whole.commit(bytes(32))
    assert "confidential" in repr(whole) and str(whole.lanes[0]) not in repr(whole)
