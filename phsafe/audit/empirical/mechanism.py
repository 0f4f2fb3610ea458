"""The mechanism under audit: the release path of ``phsafe private``, from records to noisy vectors.

:class:`ReleaseMechanism` runs, in process, the same code a private run runs on its records --

1. a fresh truncation key from the operating system's secure source, as the run's preflight
   draws it (``secrets.token_bytes``), seen by the audit only as a commitment;
2. the state filter, the MAFID join and the geography (:func:`phsafe.preprocess.prepare`);
3. truncate-and-join and the count vectors over the full public domain
   (:func:`phsafe.tabulate.tabulate`, :func:`phsafe.engine.exact_vector`);
4. the measurement: :func:`phsafe.noise.measure`, which draws the noise with OpenDP's exact
   sampler from OpenDP's discrete Gaussian (or geometric) measurement for the plan's budget and
   sensitivity, its privacy map checked -- built by :func:`phsafe.noise.build`, the constructor of
   every draw, once per planned measurement for a chunk of runs (:meth:`ReleaseMechanism.drawing`)
   and drawn from run after run, as a private run draws from the one it builds;
5. the release tables (:func:`phsafe.outputs.private_tables`), with the derived PH5_num and
   PH8_num;

-- without what a private run adds around it for confidential data: no input files or their
validation, no ledger (the spend recorder is a stand-in that records nothing: the data is
generated), no release folder. The plan (budgets, sensitivities, noise scales) is the one
:func:`phsafe.accounting.plan_run` makes for the config.

Each step is a method, so that the audit's own tests can subclass the mechanism and plant one
bug at one step (a smaller sigma, a skipped truncation, a reused noise vector ...) and check
that the audit catches it. Nothing of the sort is reachable from the command line: it always
audits this class.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd

from phsafe.accounting import PlannedMeasurement, RunPlan, plan_run
from phsafe.config import PHSafeConfig
from phsafe.engine import exact_vector
from phsafe.noise import BuiltMeasurement, SpendReceipt, build, check_privacy_map, measure
from phsafe.outputs import private_tables
from phsafe.preprocess import prepare
from phsafe.reader import InputTables
from phsafe.tables import TABLES
from phsafe.tabulate import TableCounts, tabulate
from phsafe.truncation import TRUNCATION_KEY_BYTES

__all__ = ["Release", "ReleaseMechanism"]


class _NoLedger:
    """The spend recorder of the audit's draws: generated data, nothing to account for."""

    def record_intent(self, measurement: PlannedMeasurement) -> SpendReceipt:
        return SpendReceipt(measurement.key, 0, "")

    def record_committed(self, receipt: SpendReceipt, *, noisy_digest: str) -> None:
        return None


@dataclass(frozen=True)
class Release:
    """What one run of the mechanism released.

    Attributes:
        noisy: Measurement key (``TABLE/level``) -> the noisy count vector, in domain order.
        key_commitment: The commitment to the run's truncation key (never the key).
    """

    noisy: dict[str, np.ndarray]
    key_commitment: str


class ReleaseMechanism:
    """The production release path, one step per method (see the module docstring)."""

    name = "phsafe release path"

    def plan(self, config: PHSafeConfig, table: str) -> tuple[PlannedMeasurement, ...]:
        """The measurements of ``table`` as the run's plan has them (budget, sensitivity, scale)."""
        return plan_run(config).for_table(table)

    def new_truncation_key(self) -> bytes:
        """A fresh key, as a private run's preflight draws it."""
        return secrets.token_bytes(TRUNCATION_KEY_BYTES)

    def draw_plan(self, m: PlannedMeasurement) -> PlannedMeasurement:
        """The measurement the noise is drawn for (the planned one)."""
        return m

    def noise_scale(self, m: PlannedMeasurement) -> float:
        """The scale handed to OpenDP for ``m``: sigma (zCDP) or s (pure DP)."""
        return check_privacy_map(self.draw_plan(m))

    def exact_counts(self, inputs: InputTables, config: PHSafeConfig, table: str, key: bytes) -> TableCounts:
        """Filter, join, truncate with ``key`` and count ``table`` over the config's states."""
        data = prepare(inputs, config.states)
        return tabulate([TABLES[table]], data, taus=dict(config.tau), key=key)[table]

    @contextmanager
    def drawing(self) -> Iterator[None]:
        """Within: each measurement drawn for is built once (:func:`phsafe.noise.build`) and drawn
        from in every run -- the runs of one plan draw from the same OpenDP measurement. The
        builds are forgotten on leaving: a later audit builds again (a test may have replaced the
        constructor in between)."""
        previous = getattr(self, "_built", None)
        self._built: dict[PlannedMeasurement, BuiltMeasurement] | None = {}
        try:
            yield
        finally:
            self._built = previous

    def measure(self, m: PlannedMeasurement, exact: np.ndarray) -> np.ndarray:
        """Release ``exact`` with the noise of ``m`` (OpenDP's exact sampler)."""
        drawn = self.draw_plan(m)
        built = getattr(self, "_built", None)
        if built is None:
            return measure(drawn, exact, _NoLedger())
        if drawn not in built:
            built[drawn] = build(drawn)
        return measure(drawn, exact, _NoLedger(), built=built[drawn])

    def release(self, inputs: InputTables, config: PHSafeConfig, table: str,
                measurements: Sequence[PlannedMeasurement], commit: Callable[[bytes], str]) -> Release:
        """One run: a fresh key, the exact counts, and every measurement of the table."""
        key = self.new_truncation_key()
        commitment = commit(key)
        counts = self.exact_counts(inputs, config, table, key)
        del key
        noisy = {m.key: self.measure(m, exact_vector(m, counts)) for m in measurements}
        return Release(noisy, commitment)

    def tables(self, config: PHSafeConfig, measurements: Sequence[PlannedMeasurement],
               noisy: dict[str, np.ndarray]) -> dict[str, pd.DataFrame]:
        """The released tables of the measurements (the table and any table derived from it)."""
        plan = RunPlan(config.privacy_defn, tuple(measurements))
        return private_tables(config, plan, noisy)
