"""The audit's residual check for reused noise: a p-value valid whatever the law of its count.

Deterministic: the residual vectors are written out, never drawn."""

from __future__ import annotations

import numpy as np

from phsafe.audit.empirical.checks import FAIL, PASS, LevelResiduals


def _level(groups: list[int], unique: int, scale: float = 15.0) -> LevelResiduals:
    """A one-cell level whose runs repeat values in groups of the given sizes, then ``unique``
    runs of values seen once."""
    level = LevelResiduals("PH1_denom", "usa_*", "gaussian", scale, 1)
    value = 0
    for size in groups:
        for _ in range(size):
            level.add(np.array([value], dtype=np.int64))
        value += 1
    for _ in range(unique):
        level.add(np.array([value], dtype=np.int64))
        value += 1
    return level


def _reused(level: LevelResiduals, alpha: float):  # noqa: ANN202
    return next(c for c in level.checks(alpha) if c.name == "reused noise")


def test_equal_pairs_within_their_dependent_spread_pass() -> None:
    # Seed 13 of the false-alarm series: 566 runs of a one-cell level at sigma about 15, 3,277
    # equal pairs where 3,000 are expected. Pairs that share a run are dependent, so the count
    # spreads about 113 (not the Poisson law's 55): 2.4 of its standard deviations, no evidence.
    level = _level([20] * 17 + [10, 2, 2], unique=212)
    assert level.runs == 566
    check = _reused(level, alpha=1e-3)
    assert "3277 equal pairs of residual vectors in 159895" in check.detail, check.detail
    assert check.status == PASS and check.p_value > 0.1, check


def test_noise_drawn_once_and_reused_fails() -> None:
    level = _level([566], unique=0)
    check = _reused(level, alpha=1e-5)
    assert check.status == FAIL and check.p_value < 1e-6, check
    # A longer vector (40 cells): two runs equal by chance with probability about 1e-69, so a
    # single repeat is enough.
    longer = LevelResiduals("PH3", "state_A-G", "gaussian", 15.0, 40)
    for run in range(200):
        longer.add(np.arange(40, dtype=np.int64) + run)
    longer.add(np.arange(40, dtype=np.int64) + 5)
    check = _reused(longer, alpha=1e-5)
    assert check.status == FAIL, check
