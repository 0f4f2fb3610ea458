"""Noise calibrated to the exact sensitivities: exact sigma^2, and OpenDP's privacy map kept honest.

An exact L2 sensitivity such as 10 sqrt 2 is irrational: the plan carries its square (an
integer), sigma^2 = Delta^2 / (2 rho) is an exact rational, and OpenDP's map is taken at the
smallest float not below sqrt(N) -- so the loss it checks against the budget can only be
over-stated. Every measurement of the production config with ``"sensitivity": "exact"`` passes
the check; a declared sensitivity below the calibrated one is caught.
"""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction

import pytest

from phsafe.accounting import plan_run
from phsafe.config import parse_config
from phsafe.errors import PrivacyMapMismatchError
from phsafe.noise import check_privacy_map, sensitivity_at_least

from tests.conftest import PR_CONFIG, US_CONFIG


def _plan(path, defn: str = "zcdp"):  # type: ignore[no-untyped-def]
    raw = json.loads(path.read_text())
    raw["sensitivity"], raw["privacy_defn"] = "exact", defn
    return plan_run(parse_config(raw))


@pytest.mark.parametrize("n", [2, 3, 8, 18, 72, 128, 200, 10**12 + 1])
def test_the_map_input_is_sqrt_n_rounded_up(n: int) -> None:
    d = sensitivity_at_least(n)
    assert Fraction(d) ** 2 >= n > Fraction(math.nextafter(d, 0.0)) ** 2


@pytest.mark.parametrize("path", [US_CONFIG, PR_CONFIG])
def test_every_exact_measurement_passes_the_privacy_map_check(path) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(path)
    for m in plan.measurements:
        assert m.gaussian_sigma_squared == Fraction(m.sensitivity_squared) / (2 * m.budget_fraction)
        assert m.variance == float(m.gaussian_sigma_squared)
        scale = check_privacy_map(m)
        # The loss at the true Delta, exactly, with the float scale OpenDP was given: never above
        # the budget, and within the map check's tolerance of it.
        spent = Fraction(m.sensitivity_squared) / (2 * Fraction(scale) ** 2)
        assert spent <= m.budget_fraction
        assert float(m.budget_fraction - spent) <= 1e-9 * float(m.budget_fraction)


def test_pure_dp_exact_sensitivities_are_integers_and_pass() -> None:
    plan = _plan(US_CONFIG, "puredp")
    for m in plan.measurements:
        assert isinstance(m.sensitivity, int)
        check_privacy_map(m)


def test_a_sensitivity_below_the_calibrated_one_is_caught() -> None:
    m = next(m for m in _plan(US_CONFIG).measurements if m.sensitivity == "sqrt(200)")
    # The budget's sigma^2 is planned for sqrt(200); declaring sqrt(8) with a sigma^2 for sqrt(200)
    # would be a plan that lies: build one whose sigma^2 is the smaller one's and map the larger.
    smaller = dataclasses.replace(m, sensitivity="sqrt(8)")
    assert smaller.gaussian_sigma_squared < m.gaussian_sigma_squared
    check_privacy_map(smaller)  # consistent with itself

    class Lying(type(m)):  # the sigma^2 of sqrt(8), the map taken at sqrt(200)
        @property
        def gaussian_sigma_squared(self) -> Fraction:  # type: ignore[override]
            return smaller.gaussian_sigma_squared

    lying = Lying(**{f.name: getattr(m, f.name) for f in dataclasses.fields(m)})
    with pytest.raises(PrivacyMapMismatchError):
        check_privacy_map(lying)
