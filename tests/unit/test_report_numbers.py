"""Numbers in reports are readable and honest: tiny probabilities, coverage intervals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from phsafe.accuracy import coverage_interval, interval_bars
from phsafe.risk import probability_text


@pytest.mark.parametrize("x, log10, text", [
    (0.0, -38563.5, "< 1e-300"),
    (0.0, None, "0"),
    (1e-320, None, "< 1e-300"),
    (3.2e-45, -44.49, "3.200e-45"),
    (0.588860, None, "0.588860"),
])
def test_probabilities_are_readable(x: float, log10: float | None, text: str) -> None:
    assert probability_text(x, log10) == text


def test_wilson_interval_stays_inside_0_1_and_is_not_empty_at_the_edges() -> None:
    low, high = coverage_interval(10, 10)
    assert 0.6 < low < 1.0 and high == pytest.approx(1.0)
    low, high = coverage_interval(0, 5)
    assert low == pytest.approx(0.0) and 0 < high < 0.6
    low, high = coverage_interval(90, 100)  # Wilson 95%: 0.8256 to 0.9448
    assert low == pytest.approx(0.8256, abs=1e-4) and high == pytest.approx(0.9448, abs=1e-4)
    assert all(math.isnan(v) for v in coverage_interval(0, 0))


def test_coverage_error_bars_never_run_past_1() -> None:
    """Few trials, full coverage: +-2 SE would be 0 wide at 1.0 or past 1 near it; Wilson is not."""
    frame = pd.DataFrame({"MOE_COVERAGE": [1.0, 0.95]})
    frame["MOE_COVERAGE_LOW"], frame["MOE_COVERAGE_HIGH"] = zip(coverage_interval(4, 4), coverage_interval(19, 20))
    below, above = interval_bars(frame, "MOE_COVERAGE")
    assert ((frame["MOE_COVERAGE"] + above) <= 1.0 + 1e-12).all()
    assert ((frame["MOE_COVERAGE"] - below) >= 0.0).all() and below[0] > 0.3
