"""How privacy-loss amounts read in what operators see (Prefect artifacts, run logs, results).

The library keeps amounts exact (:class:`fractions.Fraction`, whose text is ``1257281/1000000``);
people read decimals. Budgets come from decimal configs, so their decimal is exact; a budget that
is not a terminating decimal (``1/3``) shows its exact fraction beside a rounded decimal.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any


def _terminating_decimal(value: Fraction) -> str | None:
    den = value.denominator
    for prime in (2, 5):
        while den % prime == 0:
            den //= prime
    if den != 1:
        return None
    with localcontext() as ctx:
        ctx.prec = 200  # exact: the quotient terminates well within this many digits
        quotient = Decimal(value.numerator) / Decimal(value.denominator)
    return format(quotient.normalize(), "f")


def decimal_text(value: Any) -> str:
    """``Fraction(1257281, 1000000)`` or ``"1257281/1000000"`` -> ``"1.257281"``.

    ``Infinity`` stays ``Infinity``; ``1/3`` becomes ``"0.333333… (1/3)"``; anything that is not
    an amount is returned as its text.
    """
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("infinity", "inf"):
            return "Infinity"
        try:
            value = Fraction(text)
        except (ValueError, ZeroDivisionError):
            return value
    elif isinstance(value, Decimal):
        if value.is_infinite():
            return "Infinity" if value > 0 else str(value)
        value = Fraction(value)
    elif isinstance(value, float):
        if value == float("inf"):
            return "Infinity"
        value = Fraction(Decimal(repr(value)))
    elif isinstance(value, int):
        value = Fraction(value)
    if not isinstance(value, Fraction):
        return str(value)
    exact = _terminating_decimal(value)
    if exact is not None:
        return exact
    return f"{float(value):.6g}… ({value.numerator}/{value.denominator})"
