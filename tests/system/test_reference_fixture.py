"""The production release's reference fixture: non-private outputs equal cell for cell."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from phsafe.engine import run_nonprivate
from phsafe.outputs import nonprivate_columns
from phsafe.tables import OUTPUT_TABLES

from tests.conftest import END_TO_END


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)


def _as_cells(frame: pd.DataFrame) -> dict[tuple[str, ...], int]:
    """Cell key -> count, leaving out zeros (a missing row means 0)."""
    keys = [c for c in frame.columns if c != "COUNT"]
    return {tuple(r[k] for k in keys): int(r["COUNT"]) for _, r in frame.iterrows() if int(r["COUNT"]) != 0}


@pytest.fixture(scope="module")
def nonprivate_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("e2e") / "out"
    run_nonprivate(END_TO_END / "config.json", END_TO_END, out, non_confidential=True)
    return out


@pytest.mark.parametrize("table", OUTPUT_TABLES)
def test_nonprivate_matches_production_release(nonprivate_output: Path, table: str) -> None:
    expected = _read(END_TO_END / "expected_outputs" / f"{table}.csv")
    actual = _read(nonprivate_output / table / f"{table}.csv")
    assert list(actual.columns) == list(expected.columns) == nonprivate_columns(table)
    assert _as_cells(actual) == _as_cells(expected)


def test_gq_record_in_housing_unit_file_is_not_tabulated(nonprivate_output: Path) -> None:
    # MAFID 100000014 is a housing unit in units.csv but a GQ facility in geo.csv: its
    # householder must not be counted; only MAFID 100000012's one person is.
    ph1 = _read(nonprivate_output / "PH1_num" / "PH1_num.csv")
    total = ph1[(ph1.REGION_TYPE == "USA") & (ph1.ITERATION_CODE == "*") & (ph1.PH1_NUM_DATA_CELL == "1")]
    assert total.COUNT.tolist() == ["1"]


def test_only_filtered_state_and_nation_are_released(nonprivate_output: Path) -> None:
    for table in OUTPUT_TABLES:
        frame = _read(nonprivate_output / table / f"{table}.csv")
        assert set(zip(frame.REGION_TYPE, frame.REGION_ID)) == {("USA", "1"), ("STATE", "06")}
