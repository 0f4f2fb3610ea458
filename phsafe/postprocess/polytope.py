"""The Census Bureau's production polytope for the ratio models, and projections onto it.

The production fits PH1, PH5 and PH8 by sampling a truncated normal on a polytope
l <= A Y <= u whose upper bounds depend on the noisy values (noisy + 6 sigma;
``MODEL_BASED_ESTIMATES.md`` §4). The sampler refuses a row with l >= u, and its starting point
-- the Euclidean projection of the noisy values onto the shrunken set l + 0.5 <= A Y <= u - 0.5
-- fails when that set is empty: the production then stops. We never use these bounds for our
estimates (:mod:`phsafe.postprocess.ratios` explains why); this module only says where the
production's polytope is empty (``PRODUCTION_FEASIBLE`` in our files) and gives the
re-implementation of the production's method (:mod:`phsafe.accuracy.production`) its polytope
and its starting point.

:func:`project` is an exact quadratic program for the few dimensions here (2 or 3): the
projection lies in the relative interior of a face, i.e. it is the projection onto the affine
hull of at most d active constraints; every such candidate is tried (one pseudo-inverse per
active set, shared by all groups) and the nearest feasible one kept.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
SIGMAS = 6.0  # the production's data-dependent upper bounds: noisy + 6 sigma


@dataclass(frozen=True)
class Polytope:
    """l <= A y <= u for every group (rows of ``lower``/``upper``), one matrix A for all."""

    A: Array  # (rows, d)
    lower: Array  # (groups, rows)
    upper: Array  # (groups, rows)


def shared_denominator_polytope(num2: Array, v2: Array, num3: Array, v3: Array, den: Array, vd: Array,
                                b: int, tau: int) -> Polytope:
    """PH1 (b = 1) and PH5 (b = 2): Y = (N2, N3, H), spec §4's five rows."""
    A = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, -b], [-1, -1, tau]], dtype=np.float64)
    lower = np.tile(np.array([0.0, 0.0, 1.0, 0.0, 0.0]), (num2.size, 1))
    upper = np.stack([
        num2 + SIGMAS * np.sqrt(v2),
        num3 + SIGMAS * np.sqrt(v3),
        den + SIGMAS * np.sqrt(vd),
        num2 + num3 - b * den + SIGMAS * np.sqrt(v2 + v3 + b * b * vd),
        tau * den - num2 - num3 + SIGMAS * np.sqrt(v2 + v3 + tau * tau * vd),
    ], axis=1)
    return Polytope(A, lower, upper)


def own_denominator_polytope(num: Array, vn: Array, den: Array, vd: Array, tau: int) -> Polytope:
    """PH8, each cell: Y = (P, U), spec §4's three rows (with the absolute values it takes)."""
    A = np.array([[0, 1], [1, -1], [-1, tau]], dtype=np.float64)
    lower = np.tile(np.array([1.0, 0.0, 0.0]), (num.size, 1))
    upper = np.stack([
        np.abs(den) + SIGMAS * np.sqrt(vd),
        np.abs(num - den) + SIGMAS * np.sqrt(vn + vd),
        np.abs(tau * den - num) + SIGMAS * np.sqrt(tau * tau * vd + vn),
    ], axis=1)
    return Polytope(A, lower, upper)


def project(z: Array, A: Array, lower: Array, upper: Array) -> tuple[Array, npt.NDArray[np.bool_]]:
    """The Euclidean projection of each row of ``z`` onto {y : lower <= A y <= upper} (per row).

    Returns:
        The projections (NaN where the set is empty) and whether each set is non-empty.
    """
    groups, d = z.shape
    rows = A.shape[0]
    C = np.vstack([A, -A])  # C y <= h
    h = np.hstack([upper, -lower])  # (groups, 2 rows)
    best = np.full((groups, d), np.nan)
    best_dist = np.full(groups, np.inf)
    tol = 1e-7 * (1.0 + np.abs(h).max(axis=1, initial=0.0))
    for k in range(0, d + 1):
        for subset in itertools.combinations(range(2 * rows), k):
            if len({i % rows for i in subset}) < k:
                continue  # both sides of one row
            if k == 0:
                y = z.copy()
            else:
                Ct = C[list(subset)]
                gram = Ct @ Ct.T
                if abs(np.linalg.det(gram)) < 1e-12:
                    continue
                P = Ct.T @ np.linalg.inv(gram)  # (d, k)
                y = z - (z @ Ct.T - h[:, list(subset)]) @ P.T
            ok = np.all(y @ C.T <= h + tol[:, None], axis=1)
            dist = np.sum((y - z) ** 2, axis=1)
            better = ok & (dist < best_dist)
            best[better] = y[better]
            best_dist[better] = dist[better]
    return best, np.isfinite(best_dist)


def production_feasible(poly: Polytope, z: Array) -> npt.NDArray[np.bool_]:
    """Whether the production's sampler can start: every row has l < u, and the shrunken set
    l + 0.5 <= A y <= u - 0.5 is non-empty (its start is the projection of ``z`` onto it)."""
    rows_ok = np.all(poly.lower < poly.upper, axis=1)
    _, shrunk_ok = project(z, poly.A, poly.lower + 0.5, poly.upper - 0.5)
    return rows_ok & shrunk_ok & np.all(np.isfinite(poly.upper), axis=1) & ~np.isnan(z).any(axis=1)

