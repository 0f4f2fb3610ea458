"""The rehearsal's verdict: does the stated 90% margin of error cover as often as it should?

The weekly rehearsal (``flows/rehearsal.py``) runs the production code path on fresh synthetic
inputs and measures its accuracy with :func:`phsafe.accuracy.run_accuracy`. This module turns the
per-cell results (``cells.parquet``: released, truncated exact and true count of every released
cell of every trial) into a test, per output table × population-group level:

* ``covered``: cells × trials whose released count is within the stated MOE (1.645 √VARIANCE)
  of the truncated exact count -- what the MOE claims, the noise alone;
* ``expected``: the exact probability of that under the cell's noise law (discrete Gaussian or
  two-sided geometric, a sum of two for PH8_num cell 2), from its pmf
  (:class:`phsafe.postprocess.Posterior`): about 0.90, off by up to ±0.2/σ because integer noise
  has mass exactly at the MOE's edge (up to 1.5 points at σ ≈ 12, which the binomial tolerance
  of 25,000 cells would otherwise call a failure);
* the binomial tolerance: the central ``1 - alpha/m`` interval of Binomial(n, expected) for the
  m rows tested (Bonferroni): a correct pipeline fails a rehearsal with probability at most
  ``alpha`` (default 1%, about once in two years of weekly runs). Coverage indicators of one
  row are independent (independent noise per cell and trial), and a Poisson-binomial count is
  less dispersed than the binomial of the same mean, so the interval is conservative.

A pooled row per dataset takes the nine measured tables only: PH5_num repeats PH4's noise and
PH8_num sums PH7's, so pooling them would count the same draws twice.

For synthetic or otherwise non-confidential data only, like the accuracy experiment itself.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from phsafe.accuracy import MOE_Z, NOMINAL
from phsafe.postprocess import NoiseModel, cell_parts, posterior_for
from phsafe.tables import MEASURED_TABLES, OUTPUT_TABLES

DEFAULT_ALPHA = 0.01
"""Family-wise probability that a correct pipeline fails one rehearsal (per dataset)."""

COVERAGE_COLUMNS = (
    "TABLE", "LEVEL", "N", "COVERED", "COVERAGE", "NOMINAL", "EXPECTED", "TOLERANCE_LOW", "TOLERANCE_HIGH", "OK",
)


@functools.lru_cache(maxsize=512)
def expected_moe_coverage(distribution: str, variance: float, parts: int = 1) -> float:
    """P(|Z| <= 1.645 √variance) for the exact noise Z of a cell (1.0 for a noiseless cell)."""
    model = NoiseModel.of(distribution, variance, parts)
    if model.is_noiseless:
        return 1.0
    posterior = posterior_for(model)  # its pmf over -L..L holds all but 5e-13 of the mass
    moe = MOE_Z * math.sqrt(variance)
    return float(posterior.pmf[np.abs(posterior.x) <= moe].sum())


@dataclass
class CoverageVerdict:
    """The test of one accuracy experiment.

    Attributes:
        rows: One row per table × level plus the pooled ``ALL`` row (:data:`COVERAGE_COLUMNS`).
        alpha: Family-wise false-alarm probability.
    """

    rows: pd.DataFrame
    alpha: float

    @property
    def ok(self) -> bool:
        return bool(self.rows["OK"].all())

    @property
    def outside(self) -> pd.DataFrame:
        return self.rows[~self.rows["OK"]]


def _row(table: str, level: str, g: pd.DataFrame) -> dict:
    return {"TABLE": table, "LEVEL": level, "N": int(len(g)), "COVERED": int(g["_COVERED"].sum()),
            "EXPECTED": float(g["_P"].mean())}


def moe_coverage_verdict(cells: pd.DataFrame, *, alpha: float = DEFAULT_ALPHA) -> CoverageVerdict:
    """Test the MOE coverage of every table × level of ``cells`` (see the module docstring).

    Args:
        cells: One row per released cell per trial, with TABLE, LEVEL, CELL, COUNT, TRUNCATED,
            VARIANCE and NOISE_DISTRIBUTION (``cells.parquet`` of the accuracy experiment).
        alpha: Family-wise false-alarm probability, in (0, 1).
    """
    from scipy.stats import binom

    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    c = cells[cells["VARIANCE"] > 0].copy()  # noiseless cells (Infinity budgets) cover trivially
    c["_COVERED"] = (c["COUNT"] - c["TRUNCATED"]).abs() <= MOE_Z * np.sqrt(c["VARIANCE"])
    c["_PARTS"] = 1
    for table in c["TABLE"].unique():
        mask = c["TABLE"] == table
        c.loc[mask, "_PARTS"] = cell_parts(table, c.loc[mask, "CELL"].to_numpy())
    c["_P"] = [expected_moe_coverage(d, float(v), int(k))
               for d, v, k in zip(c["NOISE_DISTRIBUTION"], c["VARIANCE"], c["_PARTS"])]

    rank = {t: i for i, t in enumerate(OUTPUT_TABLES)}
    rows = [_row(t, lv, g) for (t, lv), g in c.groupby(["TABLE", "LEVEL"], sort=False)]
    rows.sort(key=lambda r: (rank.get(r["TABLE"], 99), _level_rank(r["LEVEL"])))
    measured = c[c["TABLE"].isin(MEASURED_TABLES)]
    if len(measured):
        rows.append(_row("ALL", "ALL (measured tables)", measured))
    out = pd.DataFrame(rows, columns=["TABLE", "LEVEL", "N", "COVERED", "EXPECTED"])
    m = max(len(out), 1)
    low, high = binom.interval(1 - alpha / m, out["N"].to_numpy(), out["EXPECTED"].clip(0, 1).to_numpy())
    out["COVERAGE"] = out["COVERED"] / out["N"]
    out["NOMINAL"] = NOMINAL
    out["TOLERANCE_LOW"] = low / out["N"]
    out["TOLERANCE_HIGH"] = high / out["N"]
    out["OK"] = (out["COVERED"] >= low) & (out["COVERED"] <= high)
    return CoverageVerdict(out.reindex(columns=list(COVERAGE_COLUMNS)), alpha)


def _level_rank(level: str) -> int:
    order = ("usa_*", "usa_A-G", "usa_H,I", "state_*", "state_A-G", "state_H,I")
    return order.index(level) if level in order else 99


def verdict_from_report(accuracy_dir: Path, *, alpha: float = DEFAULT_ALPHA) -> CoverageVerdict:
    """:func:`moe_coverage_verdict` of an accuracy experiment's folder (its ``cells.parquet``)."""
    return moe_coverage_verdict(pd.read_parquet(Path(accuracy_dir) / "cells.parquet"), alpha=alpha)
