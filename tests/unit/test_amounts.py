"""Exact privacy-loss amounts (:mod:`phsafe.amounts`): canonical text, exact arithmetic."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phsafe.amounts import INFINITE, add_amounts, amount_exceeds, format_exact, parse_exact, times


@given(st.fractions(min_value=0, max_value=10**6))
def test_exact_amounts_round_trip(value: Fraction) -> None:
    text = format_exact(value)
    assert parse_exact(text) == value
    assert format_exact(parse_exact(text)) == text


def test_exact_amounts_are_canonical() -> None:
    assert format_exact(Fraction(11, 500000)) == "0.000022"
    assert format_exact(Fraction(1, 3)) == "1/3"
    assert format_exact(Decimal("Infinity")) == "Infinity"
    assert format_exact(Fraction(5)) == "5"
    for bad in ("0.10", "00.1", "2/4", "1e-3", "-1", " 1", "0.", "inf", 1):
        with pytest.raises(ValueError):
            parse_exact(bad)


def test_infinity_absorbs_and_never_exceeds_itself() -> None:
    assert add_amounts(Fraction(1, 3), INFINITE) == INFINITE
    assert add_amounts(Fraction(1, 3), Fraction(1, 6)) == Fraction(1, 2)
    assert amount_exceeds(INFINITE, Fraction(10**9)) and not amount_exceeds(INFINITE, INFINITE)
    assert not amount_exceeds(Fraction(10**9), INFINITE)
    assert amount_exceeds(Fraction(1, 2) + Fraction(1, 10**12), Fraction(1, 2))
    assert times(INFINITE, 0) == 0 and times(INFINITE, 2) == INFINITE and times(Fraction(1, 4), 3) == Fraction(3, 4)
