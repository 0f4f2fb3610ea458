"""``phsafe plan --sensitivity exact``: the paper's Table 10 targets met with the exact sensitivities.

The rho each level needs is 1.645^2 Delta^2 / (2 MOE^2) rounded up to 6 digits, Delta^2 the
exact squared L2 sensitivity (``docs/sensitivity.md``), written out here by hand; the total sits
next to the paper's 1.2572882258 (tau 10, and 6 for PH3 and PH6) and 2.2669210958 (tau 10 for
every table, "2.27"). Every target is met, the written config says ``"sensitivity": "exact"``
and plans the same budgets, and the report compares the two bounds.
"""

from __future__ import annotations

import csv
import json
from decimal import ROUND_CEILING, Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner

from phsafe import planner
from phsafe.accounting import plan_run
from phsafe.cli import main
from phsafe.config import load_config
from phsafe.sensitivity import SensitivityBound

from tests.conftest import REPO

TARGETS_CSV = REPO / "docs" / "table10_moe_targets.csv"
TAU_PAPER = ["10", "PH3=6,PH6=6"]
Z90 = Fraction(329, 200)
UNIT_TABLES = ("PH1_denom", "PH5_denom", "PH8_denom")


def _exact_delta_squared(table: str, iteration: str, tau: int) -> int:
    """By hand from the proof: the five cases."""
    if table in UNIT_TABLES:
        return 1 if iteration == "*" and table != "PH8_denom" else 2
    if table == "PH1_num" and iteration == "*":
        return 2
    if table == "PH4" and iteration == "*":
        return max(tau * tau, 2)
    return 2 * tau * tau


def _expected_total(taus: dict[str, int], squared_delta) -> Fraction:  # type: ignore[no-untyped-def]
    total = Fraction(0)
    with TARGETS_CSV.open() as fh:
        rows = [r for r in csv.DictReader(line for line in fh if not line.startswith("#"))]
    for row in rows:
        table, iteration, moe = row["table"], row["iteration"].replace("H-I", "H,I"), Fraction(row["moe"])
        rho = Z90**2 * squared_delta(table, iteration, taus.get(table, 0)) / (2 * moe**2)
        # rounded up to 6 significant digits, as the planner writes the config
        exponent = Decimal(rho.numerator / rho.denominator).adjusted() - 5
        quantum = Decimal(1).scaleb(exponent)
        rounded = (Decimal(rho.numerator) / Decimal(rho.denominator)).quantize(quantum, rounding=ROUND_CEILING)
        while Fraction(rounded) < rho:
            rounded += quantum
        total += Fraction(rounded)
    return total


TAUS = {"PH1_num": 10, "PH2": 10, "PH3": 6, "PH4": 10, "PH6": 6, "PH7": 10}


@pytest.mark.parametrize(("tau", "taus", "paper_total"), [
    (TAU_PAPER, TAUS, Fraction("1.2572882258")),
    (["10"], {t: 10 for t in TAUS}, Fraction("2.2669210958")),
])
def test_table10_under_the_exact_sensitivities(tau: list[str], taus: dict[str, int], paper_total: Fraction) -> None:
    exact = planner.plan(TARGETS_CSV, tau=tau, sensitivity="exact")
    assert exact.bound is SensitivityBound.EXACT
    assert exact.total("rho") == _expected_total(taus, _exact_delta_squared)
    assert exact.paper is not None and exact.paper.total("rho") == paper_total
    assert paper_total == _expected_total(taus, lambda t, i, tau: (2 * tau + 2) ** 2 if t not in UNIT_TABLES else 4)
    # Every target met, with the exact sensitivity.
    for lp in exact.levels:
        assert planner.gaussian_moe_met(lp.rho, lp.l2_sensitivity, lp.moe_target), lp.key
        assert lp.gaussian_moe <= lp.moe_target
    # Bounded: 4 x the exact rho; 2 x the paper's.
    assert exact.bounded_factor("rho") == 4 and exact.paper.bounded_factor("rho") == 2
    ratio = float(paper_total / exact.total("rho"))
    assert 2.4 < ratio < 2.7


def test_the_written_config_says_exact_and_plans_the_same_budgets(tmp_path: Path) -> None:
    plan = planner.plan(TARGETS_CSV, tau=TAU_PAPER, sensitivity="exact", out=tmp_path / "plan")
    config = load_config(tmp_path / "plan" / "config.json")
    assert config.sensitivity is SensitivityBound.EXACT
    run = plan_run(config)
    assert run.total == plan.total("rho")
    by_key = {lp.key: lp for lp in plan.levels}
    for m in run.measurements:
        assert m.sensitivity == by_key[m.key].sensitivity
        assert m.moe90 <= float(by_key[m.key].moe_target) + 1e-9
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert doc["sensitivity"] == "exact"
    assert doc["totals"]["rho"]["bounded"] == planner.amount_text(4 * plan.total("rho"), 16)
    assert doc["paper_bound"]["totals"]["rho"]["paper"] == "1.2572882258"
    report = (tmp_path / "plan" / "plan_report.md").read_text()
    assert "The same targets with the paper's bound" in report and "sqrt(200)" in report


def test_the_command_line_plans_and_compares(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", "--targets", str(TARGETS_CSV), "--tau", "10", "--tau",
                                       "PH3=6,PH6=6", "--sensitivity", "exact", "--out", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    assert "exact sensitivities" in result.output
    assert "with the paper's sensitivities the same targets take rho 1.2572882258" in result.output
    refused = CliRunner().invoke(main, ["plan", "--from-config", str(tmp_path / "x" / "config.json"),
                                        "--sensitivity", "exact", "--out", str(tmp_path / "y")])
    assert refused.exit_code != 0 and "--sensitivity applies to --targets only" in refused.output
    from_config = planner.plan(config=tmp_path / "x" / "config.json")
    assert from_config.bound is SensitivityBound.EXACT
    assert from_config.total("rho") == planner.plan(TARGETS_CSV, tau=TAU_PAPER, sensitivity="exact").total("rho")
