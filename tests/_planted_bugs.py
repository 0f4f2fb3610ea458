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
from phsafe.sensitivity import SensitivityBound, encode_l2
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
    """The plan declares half the proven sensitivity (and calibrates the noise to it)."""

    name = "sensitivity under-declared 2x"

    def plan(self, config, table):  # type: ignore[no-untyped-def]
        return tuple(replace(m, sensitivity=_halved(m)) for m in super().plan(config, table))


def _halved(m):  # type: ignore[no-untyped-def]
    if isinstance(m.sensitivity, int):
        return max(1, m.sensitivity // 2)
    return encode_l2(max(1, m.sensitivity_squared // 4))


# --------------------------------------------------------------------------------------------
# Defects smaller than 2x, at one level (issue 34): the size an exact calibration makes plausible
# --------------------------------------------------------------------------------------------


class SigmaTooSmallAt(ReleaseMechanism):
    """One level's noise is drawn with a scale ``factor`` times smaller than the plan's."""

    def __init__(self, table: str, level: str, factor: float) -> None:
        self.table, self.level, self.factor = table, level, factor
        self.name = f"noise scale too small by {factor:g}x at {table} {level}"

    def draw_plan(self, m):  # type: ignore[no-untyped-def]
        if (m.table, m.level.config_key) != (self.table, self.level):
            return m
        power = 2 if m.privacy_defn is PrivacyDefinition.ZCDP else 1
        return replace(m, budget=m.budget * Decimal(repr(self.factor)) ** power)


class SensitivityScaledAt(ReleaseMechanism):
    """One level's plan declares its sensitivity ``factor`` times too small (L2 squared rounded to
    an integer, as the ledger carries it) and calibrates its noise to it; every other level is
    right. With the paper's 2 tau + 2 a factor below (2 tau + 2) / (tau sqrt 2) still covers every
    neighbour: not a privacy bug, and the audit rightly passes it."""

    def __init__(self, table: str, level: str, factor: float) -> None:
        self.table, self.level, self.factor = table, level, factor
        self.name = f"sensitivity {factor:g}x too small at {table} {level}"

    def plan(self, config, table):  # type: ignore[no-untyped-def]
        out = []
        for m in super().plan(config, table):
            if (m.table, m.level.config_key) == (self.table, self.level):
                squared = max(1, round(m.sensitivity_squared / self.factor ** 2))
                m = replace(m, sensitivity=encode_l2(squared) if m.privacy_defn is PrivacyDefinition.ZCDP
                            else max(1, round(m.sensitivity / self.factor)))
            out.append(m)
        return tuple(out)


class TauPlusTwoAt(ReleaseMechanism):
    """The paper's bound written as tau + 2 instead of 2 tau + 2 at one level (the kept rows
    counted once instead of removed and added): 12 for 22 at tau 10, 1.83x too small."""

    def __init__(self, table: str, level: str) -> None:
        self.table, self.level = table, level
        self.name = f"sensitivity tau + 2 for 2 tau + 2 at {table} {level}"

    def plan(self, config, table):  # type: ignore[no-untyped-def]
        return tuple(replace(m, sensitivity=m.tau + 2) if (m.table, m.level.config_key) == (self.table, self.level)
                     else m for m in super().plan(config, table))


# The exact L2 sensitivity (squared) of each case of the proof (docs/sensitivity.md), by tau.
_CASE_SQUARED = {
    "P-moves": lambda tau: 2 * tau * tau,
    "P-fixed": lambda tau: 2,
    "P-filtered": lambda tau: max(tau * tau, 2),
    "U-moves": lambda tau: 2,
    "U-single": lambda tau: 1,
}


class CaseTakenFor(ReleaseMechanism):
    """With the exact sensitivities, one level's case of the proof taken for another's: its plan
    declares (and its noise is calibrated to) the other case's sensitivity, e.g. PH1_num at A-G
    (P-moves, tau sqrt 2) given P-filtered's tau -- 1.41x too small -- or PH1_denom at A-G
    (U-moves, sqrt 2) given U-single's 1. A plan calibrated to the paper's bound has no cases:
    there it changes nothing."""

    def __init__(self, table: str, level: str, case: str) -> None:
        self.table, self.level, self.case = table, level, case
        self.name = f"{table} {level} given case {case}"

    def plan(self, config, table):  # type: ignore[no-untyped-def]
        out = []
        for m in super().plan(config, table):
            if (m.table, m.level.config_key) == (self.table, self.level) and m.bound is SensitivityBound.EXACT:
                squared = _CASE_SQUARED[self.case](m.tau or 1)
                m = replace(m, sensitivity=encode_l2(squared) if m.privacy_defn is PrivacyDefinition.ZCDP
                            else {"P-moves": 2 * (m.tau or 1), "P-fixed": 2, "P-filtered": max(m.tau or 1, 2),
                                  "U-moves": 2, "U-single": 1}[self.case])
            out.append(m)
        return tuple(out)


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
    """One of each gross planted bug."""
    return [SigmaTooSmall(1.5), SigmaTooSmall(2.0), SensitivityUnderDeclared(), TruncationSkipped(), TauPlusOne(),
            NoiseBeforeTruncation(), OneCellUnnoised(), NoiseReused(), FixedKey()]


def small_defects(table: str = "PH1_num") -> list[ReleaseMechanism]:
    """Defects smaller than 2x at one level of ``table`` (a person table iterated by race)."""
    return [SigmaTooSmallAt(table, "state_A-G", 1.25), SensitivityScaledAt(table, "state_A-G", 1.25),
            TauPlusTwoAt(table, "state_A-G"), CaseTakenFor(table, "state_A-G", "P-filtered"),
            SigmaTooSmallAt(table, "state_*", 1.5)]
