"""``phsafe risk``: Kazan & Reiter's Bayesian disclosure risk, golden against the paper.

Golden values are Tables 3 and 4 and numbers quoted in the text of
``shared/reference/kazan_reiter_disclosure_risk.txt`` (rho_1 = 2.56 x 165/4099 x 3945/4097
= 0.0992264, the block-level rho of the 2020 DAS query they study), compared at printed
precision. The paper's Table 3 "Probability Mass" column is P[X* = x | X = k] (the count
*without* the target), although its caption says X = 1.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from phsafe import risk
from phsafe._plots import is_png
from phsafe.cli import main
from phsafe.iterations import GeographyLevel
from phsafe.risk import CellNoise, analyse_config, marginal, posterior, released_values

from tests.conftest import PR_CONFIG, US_CONFIG

RHO_1 = Fraction("0.0992264")
P = [Fraction(1, 2), Fraction(1, 5), Fraction(1, 10), Fraction(1, 50)]

# Table 3: x, probability mass, posterior for p = 1/2, 1/5, 1/10, 1/50, risk for the same p.
TABLE_3 = [
    (1, "0.161", ("0.525", "0.216", "0.109", "0.022"), ("1.05", "1.08", "1.09", "1.10")),
    (2, "0.119", ("0.574", "0.252", "0.130", "0.027"), ("1.15", "1.26", "1.30", "1.34")),
    (3, "0.073", ("0.622", "0.291", "0.154", "0.032"), ("1.24", "1.46", "1.54", "1.62")),
    (4, "0.036", ("0.667", "0.334", "0.182", "0.039"), ("1.33", "1.67", "1.82", "1.96")),
    (5, "0.015", ("0.710", "0.379", "0.213", "0.047"), ("1.42", "1.90", "2.13", "2.37")),
]
# Table 4: p, marginal posterior, marginal risk R.
TABLE_4 = [(Fraction(1, 2), "0.524", "1.05"), (Fraction(1, 5), "0.225", "1.13"),
           (Fraction(1, 10), "0.117", "1.17"), (Fraction(1, 50), "0.024", "1.21")]


def matches(value: float, printed: str) -> bool:
    """``value`` rounds to ``printed`` at its printed number of decimals."""
    decimals = len(printed.split(".")[1])
    return abs(value - float(printed)) <= 0.5 * 10**-decimals + 1e-12


@pytest.fixture(scope="module")
def census_noise() -> CellNoise:
    return CellNoise.discrete_gaussian(RHO_1)  # sensitivity 1: rho is the effective rho


def test_table3_golden(census_noise: CellNoise) -> None:
    rows = released_values(census_noise, P, values=[x for x, *_ in TABLE_3], known=0)
    for row, (x, mass, posts, risks) in zip(rows, TABLE_3):
        assert row.released == x
        assert matches(row.mass_out, mass), (x, row.mass_out)
        for got, printed in zip(row.posterior, posts):
            assert matches(got, printed), (x, got, printed)
        for got, printed in zip(row.risk, risks):
            assert matches(got, printed), (x, got, printed)


def test_table3_mass_column_is_given_the_count_without_the_target(census_noise: CellNoise) -> None:
    row = released_values(census_noise, P, values=[1])[0]
    assert matches(row.mass_out, "0.161") and not matches(row.mass_in, "0.161")
    assert matches(row.mass_in, "0.178")


def test_table4_golden(census_noise: CellNoise) -> None:
    for p, post, r in TABLE_4:
        m = marginal(census_noise, p)
        assert matches(m.posterior, post), (p, m.posterior)
        assert matches(m.risk, r), (p, m.risk)


def test_numbers_quoted_in_the_text(census_noise: CellNoise) -> None:
    # §4.3: without hierarchical information the posterior at X1* = 2 (p = 1/2) is 57.39%.
    assert matches(float(posterior(census_noise, Fraction(1, 2), 2)[0]), "0.5739")
    # §4.3.3: probability of a correct decision without hierarchical information, 58.89%.
    m = marginal(census_noise, Fraction(1, 2))
    assert matches(m.p_correct, "0.5889") and m.threshold == 1
    # §4.2.3: for p <= 1/5 "a fraction of a percent".
    assert all(marginal(census_noise, p).p_correct < 0.01 for p in P[1:])
    # §4.2.3: p = 1/5, rho = 0.5 and 0.6: decide "in" iff x >= 2; P ~ 0.30 then ~ 0.28.
    for rho, printed in (("0.5", "0.30"), ("0.6", "0.28")):
        m = marginal(CellNoise.discrete_gaussian(Fraction(rho)), Fraction(1, 5))
        assert m.threshold == 2 and matches(m.p_correct, printed)
    # §4.2.1: X* = 4 occurs 3.6% of the time and X* = 5 only 1.5%.
    rows = released_values(census_noise, P, values=[4, 5])
    assert matches(rows[0].mass_out, "0.036") and matches(rows[1].mass_out, "0.015")


def test_posterior_is_eq11_and_independent_of_k(census_noise: CellNoise) -> None:
    rho = float(RHO_1)
    for p in P:
        for x in range(-5, 9):
            a = float(p) * math.exp(-rho * (x - 1) ** 2)
            b = (1 - float(p)) * math.exp(-rho * x**2)
            assert posterior(census_noise, p, x)[0] == pytest.approx(a / (a + b), rel=1e-12)
            assert posterior(census_noise, p, x + 37, known=37)[0] == pytest.approx(a / (a + b), rel=1e-12)


def test_pmf_is_normalised_by_summation() -> None:
    # sigma^2 = 1/4: the discrete normaliser differs from sqrt(2 pi) sigma by ~1.4% (Poisson
    # summation: Z = sqrt(2 pi) sigma (1 + 2 e^(-2 pi^2 sigma^2) + ...)).
    noise = CellNoise.discrete_gaussian(Fraction(2))
    pmf = risk.noise_pmf(noise)
    z = math.fsum(math.exp(-2.0 * j * j) for j in range(-60, 61))
    assert pmf.probs.sum() == pytest.approx(1.0, abs=1e-15)
    assert risk.likelihood(noise, 0, 0) == pytest.approx(1 / z, rel=1e-14)
    assert risk.likelihood(noise, 1, 0) == pytest.approx(math.exp(-2.0) / z, rel=1e-14)
    assert 1 / z != pytest.approx(1 / math.sqrt(2 * math.pi * 0.25), rel=1e-3)


def test_effective_parameters() -> None:
    g = CellNoise.discrete_gaussian(Fraction("0.016371"), 22)
    assert g.sigma2 == Fraction(484) / (2 * Fraction("0.016371"))
    assert g.effective_rho == Fraction("0.016371") / 484
    assert CellNoise.geometric(Fraction("0.5"), 2).effective_epsilon == Fraction(1, 4)


def test_geometric_matches_eq12_and_brute_force() -> None:
    eps = Fraction(1, 2)
    noise = CellNoise.geometric(eps)
    e = float(eps)
    for p in P:
        for x in range(-4, 6):
            a = float(p) * math.exp(-e * abs(x - 1))
            b = (1 - float(p)) * math.exp(-e * abs(x))
            assert posterior(noise, p, x)[0] == pytest.approx(a / (a + b), rel=1e-12)
        # Marginal by brute force over a wide window.
        xs = np.arange(-400, 402)
        q = math.exp(-e)
        pmf_in = (1 - q) / (1 + q) * np.exp(-e * np.abs(xs - 1))
        m = marginal(noise, p)
        assert m.posterior == pytest.approx(float(np.sum(posterior(noise, p, xs) * pmf_in)), rel=1e-12)
    # p = 1/2: decide "in" iff x >= 1, P = P(eta >= 0) = 1/(1+q).
    m = marginal(noise, Fraction(1, 2))
    assert m.threshold == 1 and m.p_correct == pytest.approx(1 / (1 + math.exp(-0.5)), rel=1e-12)
    # p = 1/5 > e^-eps / (1 + e^-eps)? ln 4 > 1/2: the intruder never says "in".
    m = marginal(noise, Fraction(1, 5))
    assert m.threshold is None and m.p_correct == 0.0


def test_no_noise_means_certainty() -> None:
    m = marginal(CellNoise.noiseless(), Fraction(1, 10))
    assert m.risk == pytest.approx(10.0) and m.p_correct == 1.0


def test_tiny_correct_guess_probabilities_do_not_underflow() -> None:
    noise = CellNoise.discrete_gaussian(Fraction("0.002619"), 22)
    m = marginal(noise, Fraction(1, 5))
    assert m.p_correct == 0.0 and -40000 < m.log10_p_correct < -30000
    assert m.risk > 1.0


def test_production_config_every_measured_level() -> None:
    cr = analyse_config(US_CONFIG)
    assert len(cr.levels) == 46 and len(cr.by_noise) == 9
    for lr in cr.levels:
        nr = cr.by_noise[lr.noise]
        assert lr.noise.sigma2 == lr.measurement.gaussian_sigma_squared
        for m in nr.marginals:
            assert 1.0 < m.risk < 1.01  # rho_eff <= 0.0034: the paper's "approximately one"
    pr = analyse_config(PR_CONFIG)
    assert len(pr.levels) == 23
    assert all(lr.measurement.level.geography is GeographyLevel.STATE for lr in pr.levels)
    assert cr.combined is not None
    assert cr.combined.noise.effective_rho == sum(
        (lr.noise.effective_rho for lr in cr.levels if lr.measurement.sensitivity != 2), Fraction(0))


def test_cli_writes_json_markdown_html_png(tmp_path: Path) -> None:
    out = tmp_path / "risk"
    result = CliRunner().invoke(main, ["risk", str(PR_CONFIG), "--out", str(out), "--prior", "1/2", "--prior", "0.02"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "risk.json").read_text(),
                      parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert len(data["levels"]) == 23 and data["priors"] == ["1/2", "1/50"]
    level = data["levels"][0]
    assert {"table", "level", "budget", "sensitivity", "noise", "marginal", "released_values"} <= set(level)
    assert is_png(out / "risk_ratio.png")
    md = (out / "risk_report.md").read_text()
    assert "What this report measures" in md and "Limits of this analysis" in md
    assert (out / "risk_report.html").read_text().startswith("<!DOCTYPE html>")


def test_cli_rejects_bad_prior(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["risk", str(PR_CONFIG), "--out", str(tmp_path), "--prior", "2"])
    assert result.exit_code == 2


def test_docs_config_reproduces_tables_3_and_4_through_the_command(tmp_path: Path) -> None:
    """The README's claim: `phsafe risk docs/kazan_reiter_config.json --released 1,2,3,4,5`
    reproduces Kazan-Reiter's Tables 3 and 4 (PH1_denom usa_* at rho = 4 x 0.0992264, Delta 2:
    their rho as the effective rho). Other configs give other numbers."""
    config = Path(__file__).resolve().parents[2] / "docs" / "kazan_reiter_config.json"
    out = tmp_path / "kr"
    result = CliRunner().invoke(main, ["-q", "risk", str(config), "--out", str(out), "--released", "1,2,3,4,5"])
    assert result.exit_code == 0, result.output
    level = json.loads((out / "risk.json").read_text())["levels"]
    assert len(level) == 1 and Fraction(level[0]["noise"]["effective_rho_exact"]) == RHO_1
    for m, (_, posterior_text, risk_text) in zip(level[0]["marginal"], TABLE_4):
        assert matches(m["posterior"], posterior_text) and matches(m["risk"], risk_text)
    for v, (x, mass, posteriors, risks) in zip(level[0]["released_values"], TABLE_3):
        assert v["released"] == x and matches(v["mass_given_out"], mass)
        assert all(matches(v["posterior"][f"{p.numerator}/{p.denominator}"], t) for p, t in zip(P, posteriors))
        assert all(matches(v["risk_ratio"][f"{p.numerator}/{p.denominator}"], t) for p, t in zip(P, risks))
