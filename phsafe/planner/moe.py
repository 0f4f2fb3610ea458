"""Margins of error and budgets of one population-group level, in exact arithmetic (pure).

For every measured table and population-group level the planner relates three numbers: the
sensitivity Delta (from :func:`phsafe.accounting.sensitivity`), the budget (zCDP rho or pure-DP
epsilon) and the 90% margin of error (MOE) of the noise added to each released cell.

How the MOE is defined
----------------------
*zCDP (discrete Gaussian, sigma^2 = Delta^2 / (2 rho))*: MOE = 1.645 sigma, the convention of the
PHSafe paper's Table 10, of spec §6 and of :attr:`phsafe.accounting.PlannedMeasurement.moe90`.
Solving for rho gives ``rho = 1.645^2 Delta^2 / (2 MOE^2)``, exactly (1.645 = 329/200, so rho
is a rational number). Table 10 is this rho rounded half-up to 6 decimals. The planner also
reports the *exact discrete* 90% half-width of the discrete Gaussian (below), for information.

*Pure DP (two-sided geometric, P(k) proportional to exp(-epsilon |k| / Delta))*: the noise is
integer-valued, so "half the width of the 90% interval" (paper, Definition 10) is made precise as

    MOE = the smallest integer m >= 0 with P(|X| <= m) >= 0.9,

computed exactly from the closed form of the geometric tail (:func:`geometric_halfwidth`); the
budget for a target MOE T is the smallest epsilon whose MOE is at most floor(T)
(:func:`epsilon_for_halfwidth`). :mod:`phsafe.accounting` reports ``1.645 * sd`` for pure-DP
measurements instead (``moe90``); the planner shows that figure alongside so the two reconcile.

Budgets written to ``config.json`` are rounded *up* (never down) to ``digits`` significant
digits, so every MOE target is met; the exact rho is kept in the report.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

from phsafe.sensitivity import squared

Z90 = Fraction(329, 200)
"""1.645, the two-sided 90% normal quantile as used by Table 10 and spec §6 (exact)."""

DEFAULT_DIGITS = 6

_MAX_TERMS = 5_000_000


# --------------------------------------------------------------------------------------------
# Exact arithmetic helpers
# --------------------------------------------------------------------------------------------


def _decimal_exponent(x: Fraction) -> int:
    """floor(log10 x) for x > 0, exactly."""
    e = len(str(x.numerator)) - len(str(x.denominator))
    while Fraction(10) ** e > x:
        e -= 1
    while Fraction(10) ** (e + 1) <= x:
        e += 1
    return e


def round_up(x: Fraction, digits: int) -> Decimal:
    """The smallest decimal with at most ``digits`` significant digits that is >= ``x``.

    Args:
        x: A non-negative rational.
        digits: Significant digits (>= 1).
    """
    if digits < 1:
        raise ValueError("digits must be at least 1")
    if x < 0:
        raise ValueError("cannot round a negative budget")
    if x == 0:
        return Decimal(0)
    exp = _decimal_exponent(x) - digits + 1
    scaled = x / Fraction(10) ** exp
    n = -((-scaled.numerator) // scaled.denominator)  # ceil
    return Decimal(n).scaleb(exp)


def _as_fraction(x: Fraction | Decimal | int) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(x)


def decimal_text(x: Decimal) -> str:
    """Plain decimal notation (no exponent), e.g. ``0.0000216483``."""
    text = format(x, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def fraction_text(x: Fraction, significant: int = 10) -> str:
    """A rational as decimal text with ``significant`` digits (exact if it terminates sooner)."""
    if x == 0:
        return "0"
    with localcontext() as ctx:
        ctx.prec = significant
        d = Decimal(x.numerator) / Decimal(x.denominator)
    return decimal_text(d)


# --------------------------------------------------------------------------------------------
# zCDP: discrete Gaussian
# --------------------------------------------------------------------------------------------


def _delta_squared(delta: int | str) -> int:
    """Delta^2 of an L2 sensitivity: an integer, or ``"sqrt(N)"`` (:mod:`phsafe.sensitivity`)."""
    return squared(delta) if isinstance(delta, str) else delta * delta


def rho_for_moe(moe: Fraction | Decimal | int, delta: int | str) -> Fraction:
    """rho = 1.645^2 Delta^2 / (2 MOE^2), exactly (``delta`` may be ``"sqrt(N)"``: Delta^2 = N).

    Derivation: the discrete Gaussian of Algorithm 5 has sigma^2 = Delta^2 / (2 rho) and the
    Table 10 convention is MOE = 1.645 sigma; squaring, MOE^2 = 1.645^2 Delta^2 / (2 rho).
    """
    moe = _as_fraction(moe)
    if moe <= 0:
        raise ValueError("an MOE target must be positive")
    return Z90**2 * _delta_squared(delta) / (2 * moe**2)


def gaussian_sigma2(rho: Fraction | Decimal, delta: int | str) -> Fraction:
    """sigma^2 = Delta^2 / (2 rho), exactly."""
    return Fraction(_delta_squared(delta)) / (2 * _as_fraction(rho))


def gaussian_moe(rho: Fraction | Decimal, delta: int | str) -> float:
    """MOE = 1.645 sigma of the discrete Gaussian with budget ``rho`` and sensitivity ``delta``."""
    return 1.645 * math.sqrt(float(gaussian_sigma2(rho, delta)))


def gaussian_moe_met(rho: Fraction | Decimal, delta: int | str, target: Fraction | Decimal | int) -> bool:
    """Exactly: is 1.645 sigma <= target, i.e. 1.645^2 Delta^2 / (2 rho) <= target^2?"""
    return Z90**2 * gaussian_sigma2(rho, delta) <= _as_fraction(target) ** 2


def discrete_gaussian_halfwidth(sigma2: Fraction | float) -> int | None:
    """The smallest integer m with P(|X| <= m) >= 0.9 for X ~ N_Z(sigma^2) (paper, eq. 5).

    The normalising constant and the partial sums are computed by summing the pmf in float64
    over |x| <= 15 sigma + 2 (the neglected tail is below e^-112 of the mass); the decision
    ``>= 0.9`` is therefore exact unless P(|X| <= m) lies within about 1e-12 of 0.9. Returns
    ``None`` when sigma is too large to sum (more than 5 million terms).
    """
    s2 = float(sigma2)
    if s2 <= 0:
        return 0
    k = int(math.ceil(15.0 * math.sqrt(s2))) + 2
    if k > _MAX_TERMS:
        return None
    import numpy as np

    y = np.arange(k + 1, dtype=np.float64)
    w = np.exp(-(y * y) / (2.0 * s2))
    z = w[0] + 2.0 * w[1:].sum()
    cover = (w[0] + 2.0 * np.concatenate(([0.0], np.cumsum(w[1:])))) / z
    return int(np.argmax(cover >= 0.9))


# --------------------------------------------------------------------------------------------
# Pure DP: two-sided geometric
# --------------------------------------------------------------------------------------------


def _geometric_covers(t: Fraction, m: int) -> bool:
    """Exactly: P(|X| <= m) >= 0.9 for P(X = k) proportional to q^|k|, q = e^-t, rational t > 0.

    Closed form: P(X = k) = (1-q)/(1+q) q^|k|, so P(X >= m+1) = q^(m+1)/(1+q) and

        P(|X| <= m) >= 9/10  <=>  2 q^(m+1) / (1+q) <= 1/10  <=>  20 q^(m+1) <= 1 + q
                             <=>  D := ln(1 + e^-t) - ln 20 + (m+1) t >= 0.

    D is evaluated with :mod:`decimal` at precision P: every operation is correctly rounded, so
    the accumulated error is below 10^(3-P) (10 + (m+2) t), and the sign of D is decided once
    |D| exceeds that bound; otherwise P is doubled. D = 0 is impossible: it would make
    q = e^-t, transcendental for rational t != 0 (Lindemann-Weierstrass), a root of the integer
    polynomial 20 X^(m+1) - X - 1. So the loop ends.
    """
    if t <= 0:
        raise ValueError("epsilon must be positive")
    prec = 40
    while prec <= 20_000:
        with localcontext() as ctx:
            ctx.prec = prec
            td = Decimal(t.numerator) / Decimal(t.denominator)
            d = (1 + (-td).exp()).ln() - Decimal(20).ln() + (m + 1) * td
            bound = Decimal(10) ** (3 - prec) * (10 + (m + 2) * td)
        if abs(d) > bound:
            return d > 0
        prec *= 2
    raise ArithmeticError("could not decide the geometric tail inequality")  # pragma: no cover


def geometric_halfwidth(epsilon: Fraction | Decimal, delta: int) -> int:
    """Exact 90% MOE of the two-sided geometric with scale Delta/epsilon (see :func:`_geometric_covers`).

    A float estimate m+1 = ceil((ln 20 - ln(1+q)) / t) is corrected by exact decisions, so the
    result is the smallest integer m with P(|X| <= m) >= 0.9.
    """
    eps = _as_fraction(epsilon)
    if eps <= 0:
        raise ValueError("epsilon must be positive")
    t = eps / delta
    tf = float(t)
    est = math.ceil((math.log(20.0) - math.log1p(math.exp(-tf))) / tf) - 1 if tf > 0 else 0
    m = max(0, min(est, 10**12))
    while m > 0 and _geometric_covers(t, m - 1):
        m -= 1
    while not _geometric_covers(t, m):
        m += 1
    return m


def geometric_sd_moe(epsilon: Fraction | Decimal, delta: int) -> float:
    """1.645 * sd of the two-sided geometric: what :mod:`phsafe.accounting` reports as ``moe90``."""
    from phsafe.accounting import geometric_variance

    return 1.645 * math.sqrt(geometric_variance(Fraction(delta) / _as_fraction(epsilon)))


def epsilon_for_halfwidth(m: int, delta: int, digits: int = DEFAULT_DIGITS) -> Decimal:
    """The smallest epsilon with ``digits`` significant digits whose exact 90% MOE is <= ``m``.

    With t = epsilon / Delta, D(t) = ln(1 + e^-t) - ln 20 + (m+1) t is strictly increasing
    (D'(t) = (m+1) - e^-t/(1+e^-t) > m >= 0), negative at t = 0 (ln 2 - ln 20) and positive at
    t = ln 20 / (m+1); so the MOE is <= m exactly for t >= t*, the unique root. t* is found in
    floating point, rounded up to ``digits`` significant digits, then moved by one unit of the
    last digit until the exact test of :func:`_geometric_covers` holds for it and fails for the
    next smaller candidate.
    """
    if m < 0:
        raise ValueError("the MOE must be non-negative")
    lo, hi = 0.0, math.log(20.0) / (m + 1)
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.log1p(math.exp(-mid)) - math.log(20.0) + (m + 1) * mid >= 0:
            hi = mid
        else:
            lo = mid
    eps = round_up(Fraction(hi) * delta, digits)

    def ok(e: Decimal) -> bool:
        return e > 0 and _geometric_covers(Fraction(e) / delta, m)

    def ulp(e: Decimal) -> Decimal:
        return Decimal(1).scaleb(_decimal_exponent(Fraction(e)) - digits + 1)

    while not ok(eps):
        eps = round_up(Fraction(eps + ulp(eps)), digits)
    while True:
        lower = eps - ulp(eps)
        if lower > 0 and _decimal_exponent(Fraction(lower)) < _decimal_exponent(Fraction(eps)):
            lower = eps - ulp(lower)  # crossing a power of ten: the finer step below it
        if lower <= 0 or not ok(lower):
            return eps
        eps = lower
