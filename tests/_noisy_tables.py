"""Noisy tables for the post-processing tests: OpenDP's exact noise on known truths."""

from __future__ import annotations

import numpy as np
import pandas as pd

from phsafe.postprocess import RATIO_SHELLS

DG = "Discrete Gaussian"
GEO = "Two-Sided Geometric"


def opendp_noise(distribution: str, scale: float, size: int) -> np.ndarray:
    """Noise from OpenDP's exact samplers, as in a private run (secure randomness, no seed)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    if distribution == DG:
        m = dp.m.make_gaussian(domain, dp.l2_distance(T="i64"), scale=scale)
    else:
        m = dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=scale)
    return np.asarray(m([0] * size), dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Exact pmfs
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Posterior summaries and samples
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Coverage by simulation (fast)
# --------------------------------------------------------------------------------------------


def average_frames(num_truth: np.ndarray, den_truth: np.ndarray, sigma: float, shell: str = "PH1",
                    ids: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Private numerator and denominator tables of a ratio shell: truths plus OpenDP noise
    (``den_truth`` has one column per denominator cell: 1 for PH1/PH5, 2 for PH8's cells 2, 3)."""
    g = den_truth.shape[0]
    ids = ids or [f"{i:05d}" for i in range(g)]
    num_table, den_table = RATIO_SHELLS[shell].numerator, RATIO_SHELLS[shell].denominator

    def frame(table: str, cells: list[int], truth: np.ndarray) -> pd.DataFrame:
        rows = len(cells) * g
        noise = opendp_noise(DG, sigma, rows) if sigma > 0 else np.zeros(rows, np.int64)
        return pd.DataFrame({
            "REGION_ID": np.repeat(ids, len(cells)), "REGION_TYPE": "STATE", "ITERATION_CODE": "*",
            f"{table.upper()}_DATA_CELL": np.tile(cells, g), "COUNT": np.asarray(truth).ravel() + noise,
            "NOISE_DISTRIBUTION": DG, "VARIANCE": float(sigma) ** 2,
        })

    den_cells = [1] if RATIO_SHELLS[shell].shared_denominator else [2, 3]
    return frame(num_table, [2, 3], num_truth), frame(den_table, den_cells, den_truth)


# --------------------------------------------------------------------------------------------
# Averages: structure
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# The command on a real private output
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Full simulations (slow)
# --------------------------------------------------------------------------------------------
