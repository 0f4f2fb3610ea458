"""Checks beside the verdicts: the residuals of every cell, and what the auditor can see inside.

The audit knows each run's exact counts (:mod:`.oracle`), so it sees each released cell's
*residual* (released minus exact) -- the noise, for correct code. Residual checks, per table and
level, accumulated run by run (:class:`LevelResiduals`):

* ``unnoised cells`` -- a cell whose residual was exactly 0 in every run (released without noise),
  and more exact zeros over the level than its noise law allows;
* ``reused noise`` -- two runs with the same residual vector (noise drawn once and reused), more
  often than the noise law's collision probability allows (the count of equal pairs against its
  exact mean and variance, by Cantelli's inequality: valid whatever its law);
* ``noise variance`` -- the residuals' mean square against the declared sigma^2 (a smaller or a
  larger scale than declared);
* ``noise shape`` -- a chi-squared test of the residuals' distribution against the exact discrete
  Gaussian (or two-sided geometric) pmf: a biased sampler (OpenDP's 2026 discrete-sampler bug)
  changes the shape before it changes any privacy bound;
* ``noise independence`` -- correlations of residuals of neighbouring cells within a run, and of a
  cell between consecutive runs: pooling the canaries' trials assumes independent noise.

Release checks (the first runs of each table): the released tables (:func:`phsafe.outputs.private_tables`)
hold exactly the measured noisy vector, and each derived table (PH5_num, PH8_num) the sum of
the measured cells it is defined from -- never an exact or separately noised aggregate.

White-box checks (:func:`white_box_checks`): the truncation key is fresh in every run (distinct
per-run commitments, never the key); OpenDP is at or after 0.14.2 (the release that fixed the
biased discrete samplers, opendp#2638) and every release is integer-valued; the noise scale of
every production level equals Delta / sqrt(2 rho) (Delta / epsilon); the declared sensitivity is
at least the change a canary -- a real pair of neighbours -- makes.

Every statistical check has a Bonferroni share of the audit's check alpha, so a correct pipeline
fails any of them with probability at most that alpha.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata

import numpy as np
from scipy import stats

from phsafe.audit.empirical.bounds import discrete_gaussian_pmf, tail_weights, two_sided_geometric_pmf

__all__ = ["Check", "LevelResiduals", "OPENDP_FIXED", "opendp_version", "version_at_least", "PASS", "FAIL",
           "INCONCLUSIVE"]

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
OPENDP_FIXED = (0, 14, 2)
"""The first OpenDP release with the fix of its biased discrete samplers (opendp#2638, 2026-03-11)."""
_SHAPE_BINS = 24


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: What is checked (``unnoised cells``, ``truncation key fresh``, ...).
        kind: ``residual``, ``release`` or ``white-box``.
        table: The table (``*`` for a check of the whole audit).
        level: The level (config key) or ``*``.
        status: PASS, FAIL or INCONCLUSIVE (too few runs to decide).
        detail: One line: what was seen.
        p_value: The test's p-value, when it is a statistical test.
        sensitivity: The calibration whose runs it checks (None: every run of the audit).
    """

    name: str
    kind: str
    table: str
    level: str
    status: str
    detail: str
    p_value: float | None = None
    sensitivity: str | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "table": self.table, "level": self.level,
                "sensitivity": self.sensitivity, "status": self.status, "detail": self.detail,
                "p_value": self.p_value}


def _pmf(distribution: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    return discrete_gaussian_pmf(scale) if distribution == "gaussian" else two_sided_geometric_pmf(scale)


@dataclass
class LevelResiduals:
    """One level's residuals, accumulated over runs (nothing of a run is kept but its digest).

    Attributes:
        table, level: What they belong to.
        distribution: ``gaussian`` (zCDP) or ``geometric`` (pure DP).
        scale: The declared sigma (zCDP) or s (pure DP).
        n_cells: Cells of the level's vector.
    """

    table: str
    level: str
    distribution: str
    scale: float
    n_cells: int
    runs: int = 0
    zero_runs: np.ndarray = field(init=False)
    zeros: int = 0
    sum_squares: float = 0.0
    shape_counts: np.ndarray = field(init=False)
    cell_lag: tuple[float, float, int] = (0.0, 0.0, 0)
    run_lag: tuple[float, float, int] = (0.0, 0.0, 0)
    digests: list[bytes] = field(default_factory=list)
    integral: bool = True
    _previous: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.zero_runs = np.zeros(self.n_cells, dtype=np.int64)
        if self.distribution == "gaussian":
            self._edges, self._mass = tail_weights(_SHAPE_BINS, self.scale)
        else:
            self._edges, self._mass = tail_weights(_SHAPE_BINS, scale=self.scale)
        self.shape_counts = np.zeros(len(self._mass), dtype=np.int64)

    def add(self, residual: np.ndarray) -> None:
        """One run's residuals (released minus exact), in domain order."""
        if residual.dtype.kind not in "iu":
            self.integral = self.integral and bool(np.all(residual == np.rint(residual)))
            residual = np.rint(residual)
        r = residual.astype(np.int64)
        self.runs += 1
        zero = r == 0
        self.zero_runs += zero
        self.zeros += int(zero.sum())
        rf = r.astype(np.float64)
        self.sum_squares += float(rf @ rf)
        self.shape_counts += np.bincount(np.searchsorted(self._edges, r, side="right"), minlength=len(self._mass))
        if len(rf) > 1:
            products = rf[1:] * rf[:-1]
            s, q, n = self.cell_lag
            self.cell_lag = (s + float(products.sum()), q + float(products @ products), n + len(products))
        if self._previous is not None:
            products = rf * self._previous
            s, q, n = self.run_lag
            self.run_lag = (s + float(products.sum()), q + float(products @ products), n + len(products))
        self._previous = rf
        self.digests.append(hashlib.sha256(np.ascontiguousarray(r, dtype="<i8").tobytes()).digest())

    def merge(self, other: LevelResiduals) -> None:
        """Add the residuals of another chunk of runs of the same level (the correlation of
        consecutive runs is not counted across the two chunks' boundary)."""
        if (other.table, other.level, other.n_cells) != (self.table, self.level, self.n_cells):
            raise ValueError("residuals of another level")
        self.runs += other.runs
        self.zero_runs += other.zero_runs
        self.zeros += other.zeros
        self.sum_squares += other.sum_squares
        self.shape_counts += other.shape_counts
        self.cell_lag = tuple(a + b for a, b in zip(self.cell_lag, other.cell_lag))  # type: ignore[assignment]
        self.run_lag = tuple(a + b for a, b in zip(self.run_lag, other.run_lag))  # type: ignore[assignment]
        self.digests += other.digests
        self.integral = self.integral and other.integral
        self._previous = other._previous

    # -- the tests -------------------------------------------------------------------------

    @property
    def zero_probability(self) -> float:
        k, p = _pmf(self.distribution, self.scale)
        return float(p[k == 0][0])

    @property
    def declared_variance(self) -> float:
        k, p = _pmf(self.distribution, self.scale)
        return float((k.astype(float) ** 2 * p).sum())

    def checks(self, alpha: float) -> list[Check]:
        """The residual checks of this level, each at ``alpha`` (its Bonferroni share)."""
        return [self._unnoised(alpha), self._reused(alpha), self._variance(alpha), self._shape(alpha),
                self._independence(alpha)]

    def _check(self, name: str, status: str, detail: str, p: float | None = None) -> Check:
        return Check(name, "residual", self.table, self.level, status, detail, p)

    def _unnoised(self, alpha: float) -> Check:
        p0 = self.zero_probability
        trials = self.n_cells * self.runs
        expected = f"expected {trials * p0:.1f}"
        # More exact cells over the level than Binomial(cells x runs, p0) allows (upper tail).
        p_count = float(stats.binom.sf(self.zeros - 1, trials, p0)) if trials else 1.0
        if p_count < alpha / 2:
            return self._check("unnoised cells", FAIL, f"{self.zeros} exact cells in {trials} ({expected})", p_count)
        # An unnoised cell is exact in every run; a noised one is, by chance, w.p. p0^runs.
        every = int((self.zero_runs == self.runs).sum()) if self.runs else 0
        if not every:
            return self._check("unnoised cells", PASS, f"no cell exact in all {self.runs} runs; {self.zeros} exact "
                               f"cells in {trials} ({expected})", p_count)
        p_cell = min(1.0, self.n_cells * p0 ** self.runs)
        if p_cell < alpha / 2:
            return self._check("unnoised cells", FAIL, f"{every} cell(s) released exactly in all {self.runs} runs "
                               f"(chance under the noise law {p_cell:.1e})", p_cell)
        return self._check("unnoised cells", INCONCLUSIVE, f"{every} cell(s) exact in all {self.runs} runs, which "
                           f"chance explains at this number of runs (p = {p_cell:.2g})", p_cell)

    def _reused(self, alpha: float) -> Check:
        k, p = _pmf(self.distribution, self.scale)
        q2 = float((p ** 2).sum()) ** self.n_cells  # two runs' vectors equal by chance
        q3 = float((p ** 3).sum()) ** self.n_cells  # three runs' vectors equal by chance
        runs = self.runs
        pairs = runs * (runs - 1) // 2
        expected = pairs * q2
        seen = runs - len(set(self.digests))
        equal_pairs = sum(c * (c - 1) // 2 for c in _multiplicities(self.digests))
        # The equal pairs are not independent: two pairs that share a run are equal together
        # with probability q3 > q2^2, and at a short vector with a small sigma (a nation's one
        # cell at a scaled budget) those 6 C(runs, 3) covariances dominate the variance -- a
        # Poisson law of mean pairs x q2 understates the tail (a correct audit failed at p 1.5e-7
        # with 3,277 equal pairs of 3,000 expected, about 2.4 standard deviations). The exact
        # variance and Cantelli's inequality give a p-value valid for any law of the count.
        variance = pairs * q2 * (1 - q2) + runs * (runs - 1) * (runs - 2) * max(q3 - q2 * q2, 0.0)
        excess = equal_pairs - expected
        if equal_pairs and excess > 0:
            p_value = variance / (variance + excess * excess) if variance > 0 else 0.0
        else:
            p_value = 1.0
        if equal_pairs and p_value < alpha:
            return self._check("reused noise", FAIL, f"{seen} run(s) repeat another run's residual vector "
                               f"({equal_pairs} equal pairs of {pairs}; expected {expected:.1e}, "
                               f"sd {variance ** 0.5:.1e})", p_value)
        if runs < 2:
            return self._check("reused noise", INCONCLUSIVE, "one run", None)
        return self._check("reused noise", PASS, f"{equal_pairs} equal pairs of residual vectors in {pairs} "
                           f"(expected {expected:.1e}, sd {variance ** 0.5:.1e})", p_value)

    def _variance(self, alpha: float) -> Check:
        n = self.n_cells * self.runs
        if not n:
            return self._check("noise variance", INCONCLUSIVE, "no residuals", None)
        k, p = _pmf(self.distribution, self.scale)
        var = float((k.astype(float) ** 2 * p).sum())
        fourth = float((k.astype(float) ** 4 * p).sum())
        z = (self.sum_squares - n * var) / math.sqrt(n * (fourth - var * var))
        pv = float(2 * stats.norm.sf(abs(z)))
        ratio = self.sum_squares / n / var
        status = FAIL if pv < alpha else PASS
        return self._check("noise variance", status, f"mean square {ratio:.4f} x the declared variance "
                           f"(z = {z:+.1f}, {n} residuals)", pv)

    def _shape(self, alpha: float) -> Check:
        n = int(self.shape_counts.sum())
        if not n:
            return self._check("noise shape", INCONCLUSIVE, "no residuals", None)
        expected = self._mass * n
        keep = expected > 0
        chi2 = float((((self.shape_counts - expected) ** 2)[keep] / expected[keep]).sum())
        dof = int(keep.sum()) - 1
        pv = float(stats.chi2.sf(chi2, dof))
        status = FAIL if pv < alpha else PASS
        law = "discrete Gaussian" if self.distribution == "gaussian" else "two-sided geometric"
        return self._check("noise shape", status, f"chi-squared {chi2:.1f} on {dof} degrees of freedom against the "
                           f"exact {law} pmf ({n} residuals)", pv)

    def _independence(self, alpha: float) -> Check:
        parts, worst = [], 1.0
        for what, (s, q, n) in (("neighbouring cells", self.cell_lag), ("consecutive runs", self.run_lag)):
            if n < 2 or q <= 0:
                continue
            z = s / math.sqrt(q)  # self-normalized: mean 0, variance 1 for independent noise
            pv = float(2 * stats.norm.sf(abs(z)))
            worst = min(worst, pv)
            parts.append(f"{what} z = {z:+.2f}")
        if not parts:
            return self._check("noise independence", INCONCLUSIVE, "too few cells and runs", None)
        # Two z-tests: each at alpha / 2.
        status = FAIL if worst < alpha / 2 else PASS
        return self._check("noise independence", status, "; ".join(parts), min(1.0, 2 * worst))


def _multiplicities(items: Sequence[bytes]) -> list[int]:
    counts: dict[bytes, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return [c for c in counts.values() if c > 1]


def opendp_version() -> str:
    return metadata.version("opendp")


def version_at_least(version: str, minimum: tuple[int, ...]) -> bool:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= minimum
