"""phsafe.rehearsal: the binomial test of MOE coverage that the weekly rehearsal applies."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from phsafe.postprocess import NoiseModel, posterior_for
from phsafe.rehearsal import expected_moe_coverage, moe_coverage_verdict

GAUSS = "Discrete Gaussian"
GEOMETRIC = "Two-Sided Geometric"


def _noise(rng: np.random.Generator, distribution: str, variance: float, size: int, parts: int = 1) -> np.ndarray:
    """Exact draws of a cell's noise (inverse cdf on its pmf)."""
    posterior = posterior_for(NoiseModel.of(distribution, variance, parts))
    return rng.choice(posterior.x, size=size, p=posterior.pmf)


def _cells(rng, levels: dict[tuple[str, str], tuple[str, float, int]], trials: int, widen: float = 1.0) -> pd.DataFrame:
    parts = []
    for (table, level), (distribution, variance, cells) in levels.items():
        n = cells * trials
        truncated = rng.integers(0, 5000, n)
        noise = _noise(rng, distribution, variance * widen**2, n)  # the stated VARIANCE stays `variance`
        parts.append(pd.DataFrame({
            "TRIAL": np.repeat(np.arange(1, trials + 1), cells), "TABLE": table, "LEVEL": level,
            "CELL": np.tile(np.arange(1, cells + 1), trials), "COUNT": truncated + noise, "TRUNCATED": truncated,
            "VARIANCE": variance, "NOISE_DISTRIBUTION": distribution,
        }))
    return pd.concat(parts, ignore_index=True)


LEVELS = {("PH3", "state_A-G"): (GAUSS, 148.0, 2499), ("PH2", "state_*"): (GAUSS, 14782.24, 408),
          ("PH6", "usa_*"): (GEOMETRIC, 2000.0, 16), ("PH1_denom", "state_H,I"): (GAUSS, 4.0, 102)}


def test_expected_coverage_is_the_exact_probability_of_the_noise_law():
    # Large sigma: the continuous 90%; small sigma: the integer noise's own value, far from it.
    assert expected_moe_coverage(GAUSS, 1e6) == pytest.approx(0.90, abs=2e-4)
    assert expected_moe_coverage(GAUSS, 148.0) == pytest.approx(0.9083, abs=1e-3)  # sigma 12.2: +0.8 points
    # Two-sided geometric of variance V: P(|Z| <= m) = 1 - 2 q^(m+1) / (1 + q).
    v = 2000.0
    q = v / (v + 1 + math.sqrt(2 * v + 1))
    m = math.floor(1.645 * math.sqrt(v))
    assert expected_moe_coverage(GEOMETRIC, v) == pytest.approx(1 - 2 * q ** (m + 1) / (1 + q), rel=1e-9)
    assert expected_moe_coverage(GAUSS, 0.0) == 1.0


def test_a_correct_noise_passes_and_the_tolerance_is_centred_on_the_exact_coverage():
    rng = np.random.default_rng(2026)
    verdict = moe_coverage_verdict(_cells(rng, LEVELS, trials=10), alpha=0.01)
    assert verdict.ok, verdict.outside
    rows = verdict.rows.set_index(["TABLE", "LEVEL"])
    assert list(rows.index[-1]) == ["ALL", "ALL (measured tables)"]
    dense = rows.loc[("PH3", "state_A-G")]
    assert dense["N"] == 24990 and dense["TOLERANCE_LOW"] < dense["EXPECTED"] < dense["TOLERANCE_HIGH"]
    # Centred on 0.9083, not on 0.90: a tolerance around 0.90 would call this correct noise a failure.
    assert dense["TOLERANCE_LOW"] > 0.90
    assert (rows["NOMINAL"] == 0.90).all()


def test_noise_wider_than_stated_fails():
    rng = np.random.default_rng(7)
    verdict = moe_coverage_verdict(_cells(rng, LEVELS, trials=5, widen=1.25), alpha=0.01)
    assert not verdict.ok
    assert ("PH3", "state_A-G") in set(zip(verdict.outside["TABLE"], verdict.outside["LEVEL"]))


def test_false_alarms_stay_below_alpha():
    rng = np.random.default_rng(11)
    levels = {("PH2", f"level{i}"): (GAUSS, 25.0, 50) for i in range(10)}
    failed = sum(not moe_coverage_verdict(_cells(rng, levels, trials=2), alpha=0.1).ok for _ in range(200))
    assert failed <= 0.1 * 200 * 1.5  # Bonferroni is conservative: about alpha or fewer


def test_noiseless_cells_are_left_out_and_alpha_is_checked():
    rng = np.random.default_rng(3)
    cells = _cells(rng, {("PH2", "state_*"): (GAUSS, 100.0, 40)}, trials=2)
    noiseless = cells.assign(VARIANCE=0.0, COUNT=cells["TRUNCATED"], TABLE="PH6")
    verdict = moe_coverage_verdict(pd.concat([cells, noiseless]))
    assert set(verdict.rows["TABLE"]) == {"PH2", "ALL"}
    with pytest.raises(ValueError):
        moe_coverage_verdict(cells, alpha=1.5)
