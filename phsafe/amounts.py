"""Exact privacy-loss amounts: budgets, charges and caps, never floats.

An amount is a :class:`~fractions.Fraction` (``rho`` or ``epsilon``), or ``Decimal('Infinity')``
(:data:`INFINITE`: the budget of a noiseless measurement, allowed on non-confidential data only).
Amounts are written as canonical text -- ``"0.002619"`` when the value has a finite decimal
expansion, else ``"1/3"``, or ``"Infinity"`` -- so that the ledger, the manifests and the planner
agree digit for digit on every amount they record.
"""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

INFINITE = Decimal("Infinity")
"""The budget of a noiseless measurement (non-confidential data only)."""

Amount = Fraction | Decimal
"""An exact privacy-loss amount: a Fraction, or ``Decimal('Infinity')``."""

DECIMAL_TEXT = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]*[1-9])?")
"""The canonical text of an amount with a finite decimal expansion."""
_RATIO = re.compile(r"([1-9][0-9]*)/([1-9][0-9]*)")


def format_exact(value: Amount) -> str:
    """Exact, canonical text of an amount: ``"0.002619"``, ``"1/3"`` or ``"Infinity"``."""
    if isinstance(value, Decimal):
        if value.is_infinite() and value > 0:
            return "Infinity"
        if not value.is_finite():
            raise ValueError(f"{value} is not a privacy-loss amount")
        value = Fraction(value)
    if value < 0:
        raise ValueError("privacy-loss amounts are non-negative")
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = max(twos, fives)
    scaled = value * 10**digits
    assert scaled.denominator == 1
    text = str(scaled.numerator).rjust(digits + 1, "0")
    if digits:
        text = f"{text[:-digits]}.{text[-digits:]}".rstrip("0").rstrip(".")
    return text


def amount_text(value: Amount | float | int | str, significant: int = 10) -> str:
    """An amount for people -- screens, logs, reports: ``1.257281``, ``0.000022``, ``Infinity``.

    The one formatter of amounts for people. Terminating decimals are exact; others (1/3) get
    ``significant`` digits after a leading ``≈``, in plain notation (never an exponent). The
    exact text stays in the ledger and the manifests (:func:`format_exact`).
    """
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("infinity", "inf"):
            return "Infinity"
        value = Fraction(text)
    if isinstance(value, float):
        if value == float("inf"):
            return "Infinity"
        value = Fraction(Decimal(repr(value)))
    if isinstance(value, Decimal):
        if value.is_infinite():
            return "Infinity"
        value = Fraction(value)
    value = Fraction(value)
    if value < 0:
        return "-" + amount_text(-value, significant)
    exact = format_exact(value)
    if "/" not in exact:  # a terminating decimal: exact
        return exact
    with localcontext() as ctx:
        ctx.prec = significant
        return "≈ " + _plain(Decimal(value.numerator) / Decimal(value.denominator))


def _plain(d: Decimal) -> str:
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def parse_exact(text: Any) -> Amount:
    """Inverse of :func:`format_exact`; accepts only the canonical form.

    Raises:
        ValueError: ``text`` is not a canonical exact amount.
    """
    if not isinstance(text, str):
        raise ValueError("an exact amount must be a string")
    if text == "Infinity":
        return INFINITE
    if DECIMAL_TEXT.fullmatch(text):
        return Fraction(Decimal(text))
    m = _RATIO.fullmatch(text)
    if m:
        value = Fraction(int(m.group(1)), int(m.group(2)))
        if format_exact(value) == text:
            return value
    raise ValueError(f"{text!r} is not a canonical exact amount")


def is_infinite(a: Amount) -> bool:
    """Whether ``a`` is :data:`INFINITE`."""
    return isinstance(a, Decimal) and a.is_infinite()


def add_amounts(a: Amount, b: Amount) -> Amount:
    """``a + b`` (Infinity plus anything is Infinity)."""
    if is_infinite(a) or is_infinite(b):
        return INFINITE
    return Fraction(a) + Fraction(b)


def times(amount: Amount, n: int) -> Amount:
    """``n`` times an amount (Infinity times 0 is 0: nothing was charged)."""
    if n == 0:
        return Fraction(0)
    return INFINITE if is_infinite(amount) else Fraction(amount) * n


def amount_exceeds(total: Amount, cap: Amount) -> bool:
    """Whether ``total > cap`` (Infinity > anything finite; Infinity does not exceed Infinity)."""
    if is_infinite(cap):
        return False
    return is_infinite(total) or Fraction(total) > Fraction(cap)
