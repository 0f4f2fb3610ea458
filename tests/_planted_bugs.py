"""The planted-bug corpus of the empirical privacy audit: the release path with one bug each.

Each class is the production :class:`~phsafe.audit.empirical.mechanism.ReleaseMechanism` with one
step replaced -- the smallest switch that makes the bug -- so that the audit's tests (and its
benchmark) can check that the audit flags every one of them. They live with the tests, never in
the package: nothing of this is reachable from ``phsafe audit empirical``.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import numpy as np

from phsafe.audit.empirical.mechanism import Release, ReleaseMechanism
from phsafe.config import PrivacyDefinition
from phsafe.engine import exact_vector
from phsafe.preprocess import prepare
from phsafe.tables import TABLES
from phsafe.tabulate import tabulate


class SigmaTooSmall(ReleaseMechanism):
    """The noise is drawn with a scale ``factor`` times smaller than the plan's."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.name = f"noise scale too small by {factor:g}x"

    def draw_plan(self, m):  # type: ignore[no-untyped-def]
        power = 2 if m.privacy_defn is PrivacyDefinition.ZCDP else 1
        return replace(m, budget=m.budget * Decimal(repr(self.factor)) ** power)


class SensitivityUnderDeclared(ReleaseMechanism):
    """The plan declares half the spec's sensitivity (and calibrates the noise to it)."""

    name = "sensitivity under-declared 2x"

    def plan(self, config, table):  # type: ignore[no-untyped-def]
        return tuple(replace(m, sensitivity=max(1, m.sensitivity // 2)) for m in super().plan(config, table))


class TruncationSkipped(ReleaseMechanism):
    """Every person of a household is counted: no truncation."""

    name = "truncation skipped"

    def exact_counts(self, inputs, config, table, key):  # type: ignore[no-untyped-def]
        return tabulate([TABLES[table]], prepare(inputs, config.states), taus=None, key=None)[table]


class TauPlusOne(ReleaseMechanism):
    """Truncation keeps tau + 1 persons per household."""

    name = "tau + 1 persons kept"

    def exact_counts(self, inputs, config, table, key):  # type: ignore[no-untyped-def]
        taus = {name: tau + 1 for name, tau in config.tau.items()}
        return tabulate([TABLES[table]], prepare(inputs, config.states), taus=taus, key=key)[table]


class NoiseBeforeTruncation(ReleaseMechanism):
    """The noise is added to the join's counts before truncation; truncation then runs too late."""

    name = "noise drawn before truncation"

    def release(self, inputs, config, table, measurements, commit):  # type: ignore[no-untyped-def]
        key = self.new_truncation_key()
        commitment = commit(key)
        joined = tabulate([TABLES[table]], prepare(inputs, config.states), taus=None, key=None)[table]
        noisy = {m.key: self.measure(m, exact_vector(m, joined)) for m in measurements}
        self.exact_counts(inputs, config, table, key)  # the truncated counts, computed after the draw
        return Release(noisy, commitment)


class OneCellUnnoised(ReleaseMechanism):
    """One cell (the first of the first measured level) is released without its noise."""

    name = "one cell released without noise"

    def measure(self, m, exact):  # type: ignore[no-untyped-def]
        noisy = super().measure(m, exact)
        if m.level == TABLES[m.table].levels[0] or not hasattr(self, "_first"):
            self._first = getattr(self, "_first", m.key)
        if m.key == self._first:
            noisy[0] = exact[0]
        return noisy


class NoiseReused(ReleaseMechanism):
    """Each level's noise vector is drawn once and added again in every later run."""

    name = "noise reused across runs"

    def __init__(self) -> None:
        self._noise: dict[str, np.ndarray] = {}

    def measure(self, m, exact):  # type: ignore[no-untyped-def]
        if m.key not in self._noise:
            self._noise[m.key] = super().measure(m, exact) - np.asarray(exact, dtype=np.int64)
        return np.asarray(exact, dtype=np.int64) + self._noise[m.key]


class FixedKey(ReleaseMechanism):
    """The truncation key is the same in every run."""

    name = "a fixed truncation key"

    def new_truncation_key(self) -> bytes:
        return bytes(16)


def corpus() -> list[ReleaseMechanism]:
    """One of each planted bug."""
    return [SigmaTooSmall(1.5), SigmaTooSmall(2.0), SensitivityUnderDeclared(), TruncationSkipped(), TauPlusOne(),
            NoiseBeforeTruncation(), OneCellUnnoised(), NoiseReused(), FixedKey()]
