"""What every stage of the post-processing shares: its error, its accuracy bound, its keys."""

from __future__ import annotations

from phsafe.errors import PostprocessError

TAIL_BOUND = 1e-12
"""Upper bound on the posterior mass ignored by a finite summation window, relative to the mass
summed (:mod:`phsafe.postprocess.posterior`)."""
NOISE_TAIL = TAIL_BOUND / 2  # T(L) = P(|Z| > L) of a noise table
CREDIBLE_LEVEL = 0.90
MAX_TABLE = 50_000_000  # refuse noise tables beyond this (variance ~1e13)

GROUP_KEYS = ("REGION_ID", "REGION_TYPE", "ITERATION_CODE")
"""A population group: geographic entity and iteration code (spec §3)."""

__all__ = ["CREDIBLE_LEVEL", "GROUP_KEYS", "MAX_TABLE", "NOISE_TAIL", "PostprocessError", "TAIL_BOUND"]
