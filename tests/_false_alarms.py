"""The registry of the suite's statistical tests: each test that asserts on random draws it does
not seed (noise, coverage, the empirical audit's verdicts, rehearsal tolerances) and the
probability that it fails on correct code, per run of the suite.

Every entry is mirrored by a comment at the test itself, on the line above its assertion or at
the top of its body::

    # false-alarm rate: 2.0e-06 per run -- two-sided binomial tail at n=400, p=0.9, |x-np|>=...

The number is computed from the statistic's distribution (a binomial or normal tail, a union
bound over the assertions of one test, ...), never guessed; ``derivation`` says how. The key is
the test's node id without parameters (``tests/unit/test_noise.py::test_name``); a parametrized
test's rate is the sum over its parameters. The suite's total is at most ``SUITE_LIMIT``.
"""

from __future__ import annotations

from dataclasses import dataclass

SUITE_LIMIT = 1e-3
"""At most one correct run of the whole suite in a thousand fails on chance alone."""


@dataclass(frozen=True)
class FalseAlarm:
    rate: float
    """Probability per run of the suite that this test fails on correct code."""
    derivation: str
    """How the rate was computed: the statistic, its distribution, the bound."""


# Sorted by key; one entry per test.
FALSE_ALARMS: dict[str, FalseAlarm] = {}
