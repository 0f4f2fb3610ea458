"""Every code a release can hold has a label in the table definitions (one source of truth)."""

from __future__ import annotations

import pytest

from phsafe.datapackage import NOISE_LABELS, REGION_NAMES
from phsafe.accounting import NoiseDistribution
from phsafe.iterations import ITERATION_LABELS, GeographyLevel, IterationLevel
from phsafe.schema import PUERTO_RICO, STATE_CODES
from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES, output_spec


@pytest.mark.parametrize("table", OUTPUT_TABLES)
def test_every_cell_has_one_distinct_label(table: str) -> None:
    spec = output_spec(table)
    labels = dict(spec.cell_labels)
    assert len(labels) == len(spec.cell_labels), "a cell is labelled twice"
    assert set(labels) == set(spec.nonprivate_cells)
    if table in DERIVED_TABLES:
        assert {n for n, _ in DERIVED_TABLES[table].cells} <= set(labels)
    assert len(set(labels.values())) == len(labels), "two cells share a label"
    assert spec.title and spec.universe and all(labels.values())


def test_nested_cells_name_their_parent() -> None:
    ph6 = output_spec("PH6")
    assert ph6.cell_label(13) == "Male householder, no spouse or partner present family: under 4 years"
    assert ph6.cell_label(17) == "Female householder, no spouse or partner present family"
    assert output_spec("PH2").cell_label(4) == "In married couple household: same-sex married couple"
    assert output_spec("PH7").cell_label(4) == "Renter occupied"


def test_iteration_regions_and_noise_are_labelled() -> None:
    codes = [c for level in IterationLevel for c in level.codes]
    assert list(ITERATION_LABELS) == codes
    assert set(REGION_NAMES) == {"1", PUERTO_RICO, *STATE_CODES}
    assert REGION_NAMES["1"] == "United States" and REGION_NAMES["06"] == "California"
    assert set(NOISE_LABELS) == {d.value for d in NoiseDistribution}
    assert [g.label for g in GeographyLevel] == ["Nation", "State"]
