"""How privacy-loss amounts read in what operators see (Prefect artifacts, run logs, results).

The library keeps amounts exact (:class:`fractions.Fraction`, whose text is ``1257281/1000000``);
people read decimals: :func:`phsafe.amounts.amount_text`, the one formatter of amounts for
people. Here it is applied to fields that may or may not hold an amount.
"""

from __future__ import annotations

from typing import Any

from phsafe.amounts import amount_text


def decimal_text(value: Any) -> str:
    """``Fraction(1257281, 1000000)`` or ``"1257281/1000000"`` -> ``"1.257281"``.

    ``Infinity`` stays ``Infinity``; ``1/3`` becomes ``"≈ 0.3333333333"``; anything that is not
    an amount is returned as its text.
    """
    if isinstance(value, bool):
        return str(value)
    try:
        return amount_text(value)
    except (ValueError, TypeError, ZeroDivisionError, ArithmeticError):
        return str(value)
