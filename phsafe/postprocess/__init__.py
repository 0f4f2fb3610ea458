"""Statistical post-processing of a private output directory: the estimates the public reads.

Pure post-processing (paper, §6.5): computed from the published private tables alone, spending
no privacy-loss budget. ``phsafe postprocess OUT`` (:func:`postprocess`) writes the Census
Bureau's model-based estimate files (``shared/spec/MODEL_BASED_ESTIMATES.md``) -- non-negative
integer estimates with 90% intervals for every internal and marginal cell of PH2, PH3, PH4, PH6,
PH7, and the average household and family sizes PH1, PH5, PH8 under their logical constraints --
computed from the exact discrete likelihood of each cell instead of a continuous normal, plus our
own files with every posterior summary, the production's checks and summary metrics, and a report.

The stages, one module each:

* :mod:`~phsafe.postprocess.source` -- read the release (and nothing else);
* :mod:`~phsafe.postprocess.noise` -- the noise of a cell and its exact pmf;
* :mod:`~phsafe.postprocess.posterior` -- the exact posterior of one count, and of sums;
* :mod:`~phsafe.postprocess.shells` -- which cells each estimate table holds;
* :mod:`~phsafe.postprocess.counts` -- released and marginal cells;
* :mod:`~phsafe.postprocess.lattice`, :mod:`~phsafe.postprocess.ratios` -- the averages: joint
  posterior of numerator and denominator on the constrained lattice;
* :mod:`~phsafe.postprocess.polytope` -- the production's polytope (where it is empty);
* :mod:`~phsafe.postprocess.census` -- the Census Bureau's file layout and number format;
* :mod:`~phsafe.postprocess.checks` -- the production's checks and summary metrics;
* :mod:`~phsafe.postprocess.command` -- the command: write, check, publish, report.

:func:`phsafe.read_estimates` reads the result back, labelled like :func:`phsafe.read_release`.
"""

from __future__ import annotations

from phsafe.errors import EstimateChecksFailed, PostprocessError
from phsafe.postprocess._base import CREDIBLE_LEVEL, GROUP_KEYS, TAIL_BOUND
from phsafe.postprocess.command import PostprocessResult, default_destination, postprocess
from phsafe.postprocess.counts import COUNT_COLUMNS, cell_parts, count_estimates, summarize_table
from phsafe.postprocess.noise import NoiseModel, geometric_q
from phsafe.postprocess.posterior import Posterior, hpd_rows, posterior_for
from phsafe.postprocess.ratios import AVERAGE_COLUMNS, ratio_table
from phsafe.postprocess.shells import COUNT_SHELLS, ESTIMATE_TABLES, RATIO_SHELLS
from phsafe.postprocess.source import read_private_outputs

__all__ = [
    "AVERAGE_COLUMNS", "COUNT_COLUMNS", "COUNT_SHELLS", "CREDIBLE_LEVEL", "ESTIMATE_TABLES", "GROUP_KEYS",
    "EstimateChecksFailed", "NoiseModel", "Posterior", "PostprocessError", "PostprocessResult", "RATIO_SHELLS",
    "TAIL_BOUND", "cell_parts", "count_estimates", "default_destination", "geometric_q", "hpd_rows", "posterior_for",
    "postprocess", "ratio_table", "read_private_outputs", "summarize_table",
]
