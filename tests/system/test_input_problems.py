"""Every input problem the reading can meet is one clear, value-free line -- never a crash.

Each case below breaks a valid dataset in one way, in CSV or Parquet. The counting without
validation (the strict reading) must raise an :class:`~phsafe.errors.InputError` naming the file,
the column and the rule; validation must report a failure and raise nothing. Neither may quote
the value the case injected -- in particular integers wider than 64 bits (a 29-digit MAFID, a
20-digit QAGE, a Parquet uint64 MAFID), whose conversion used to end in ``ArrowInvalid`` with
the value in its message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from phsafe import synthetic
from phsafe.config import load_config
from phsafe.intake import exact_counts
from phsafe.errors import InputError
from phsafe.tables import TABLES
from phsafe.intake import validate_inputs
from tests.conftest import US_CONFIG

STATES = ["01", "06"]
SPECS = [TABLES["PH1_num"], TABLES["PH2"]]


@pytest.fixture(scope="module")
def frames() -> dict[str, pd.DataFrame]:
    data = synthetic.generate(2000, STATES, seed=3)
    return {stem: getattr(data, stem).astype(str) for stem in ("persons", "units", "geo")}


@dataclass(frozen=True)
class Case:
    name: str
    fmt: str  # csv or parquet
    stem: str
    column: str  # the column the error names ("" for the file)
    rule: str  # a phrase of the input error
    secret: str | None  # the injected value, never to be shown
    edit: Callable[[pd.DataFrame], pd.DataFrame | pa.Table] | None = None
    raw: Callable[[bytes], bytes] | None = None


def _set(column: str, value: str, row: int = 3) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def edit(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.copy()
        frame.loc[frame.index[row], column] = value
        return frame
    return edit


def _typed(column: str, array: Callable[[pd.Series], pa.Array]) -> Callable[[pd.DataFrame], pa.Table]:
    def edit(frame: pd.DataFrame) -> pa.Table:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        return table.set_column(table.schema.get_field_index(column), column, array(frame[column]))
    return edit


def _uint64_mafid(values: pd.Series) -> pa.Array:
    out = values.astype(np.uint64).to_numpy().copy()
    out[3] = 2**64 - 3
    return pa.array(out, pa.uint64())


HUGE_MAFID = "1" * 29
CASES = [
    Case("mafid_29_digits", "csv", "persons", "MAFID", "between 100000001 and 900000000", HUGE_MAFID,
         _set("MAFID", HUGE_MAFID)),
    Case("qage_20_digits", "csv", "persons", "QAGE", "between 0 and 115", "9" * 20, _set("QAGE", "9" * 20)),
    Case("mafid_uint64", "parquet", "units", "MAFID", "between 100000001 and 900000000", str(2**64 - 3),
         _typed("MAFID", _uint64_mafid)),
    Case("negative_age_text", "csv", "persons", "QAGE", "whole number", "-7", _set("QAGE", "-7")),
    Case("negative_age_integer", "parquet", "persons", "QAGE", "between 0 and 115", "-7",
         _typed("QAGE", lambda s: pa.array(s.astype(int).where(s.index != 3, -7), pa.int64()))),
    Case("decimal_population", "csv", "units", "FINAL_POP", "whole number", "2.5", _set("FINAL_POP", "2.5")),
    Case("float_column", "parquet", "persons", "QAGE", "stored as an integer", None,
         _typed("QAGE", lambda s: pa.array(s.astype(float), pa.float64()))),
    Case("code_as_integer", "parquet", "persons", "CENRACE", "stored as a string code", None,
         _typed("CENRACE", lambda s: pa.array(s.astype(int), pa.int32()))),
    Case("boolean_code", "parquet", "geo", "TABBLKST", "stored as a string code", None,
         _typed("TABBLKST", lambda s: pa.array(s == "01", pa.bool_()))),
    Case("empty_value", "csv", "units", "TEN", "must not be empty", None, _set("TEN", "")),
    Case("code_too_short", "csv", "geo", "TABBLKST", "2-digit code", None, _set("TABBLKST", "6", row=0)),
    Case("unknown_code", "csv", "persons", "RELSHIP", "must be one of", "91", _set("RELSHIP", "91")),
    Case("not_utf8", "csv", "persons", "", "UTF-8", None,
         raw=lambda b: b.replace(b"\n", b"\n3,1\xff\xfe,1,1,01,34\n", 1)),
    Case("short_row", "csv", "units", "", "comma-separated fields", "123456789",
         raw=lambda b: b + b"2,123456789\n"),
    Case("empty_file", "csv", "geo", "", "empty", None, raw=lambda b: b""),
    Case("header_only_other_delimiter", "csv", "units", "", "comma-separated", None,
         raw=lambda b: b.replace(b",", b";")),
    Case("missing_column", "csv", "persons", "QAGE", "missing from the header", None,
         edit=lambda f: f.drop(columns=["QAGE"])),
    Case("data_row_as_header", "csv", "persons", "", "", "123456789",
         raw=lambda b: b"3,123456789,44,1,01,34\n" + b.split(b"\n", 1)[1]),
    Case("not_parquet", "parquet", "units", "", "readable Parquet", None, raw=lambda b: b"PAR1" + b"\x00" * 64),
]


def _write(frames: dict[str, pd.DataFrame], case: Case, directory: Path) -> Path:
    directory.mkdir(parents=True)
    for stem, frame in frames.items():
        data: pd.DataFrame | pa.Table = frame
        if stem == case.stem and case.edit is not None:
            data = case.edit(frame)
        if case.fmt == "csv":
            assert isinstance(data, pd.DataFrame)
            data.to_csv(directory / f"{stem}.csv", index=False, lineterminator="\n")
            path = directory / f"{stem}.csv"
        else:
            table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
            path = directory / f"{stem}.parquet"
            pq.write_table(table, path)
        if stem == case.stem and case.raw is not None:
            path.write_bytes(case.raw(path.read_bytes()))
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


def _quotes(text: str, secret: str | None) -> bool:
    return secret is not None and re.search(r"(?<![0-9.])" + re.escape(secret) + r"(?![0-9])", text) is not None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_counting_refuses_with_one_value_free_line(case: Case, frames: dict[str, pd.DataFrame],
                                                       tmp_path: Path) -> None:
    data = _write(frames, case, tmp_path / "data")
    with pytest.raises(InputError) as info:
        exact_counts(load_config(data / "config.json"), data, SPECS, key=bytes(16))
    message = str(info.value)
    assert "\n" not in message
    assert info.value.file.startswith(case.stem), message
    assert case.column in info.value.column, message
    assert case.rule.lower() in message.lower(), message
    assert not _quotes(message, case.secret), message
    assert info.value.__cause__ is None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validation_reports_it_and_raises_nothing(case: Case, frames: dict[str, pd.DataFrame],
                                                  tmp_path: Path) -> None:
    data = _write(frames, case, tmp_path / "data")
    report = validate_inputs(data / "config.json", data)
    assert not report.ok
    assert any(f.file.startswith(case.stem) for f in report.failures), report.to_text()
    # The results repeat each rule's public code lists: their counts are what could leak.
    counts = [r["result"] for suite in report.results for r in suite["results"]]
    text = report.to_text() + json.dumps(report.to_dict()) + json.dumps(counts)
    assert not _quotes(text, case.secret), report.to_text()
