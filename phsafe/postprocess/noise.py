"""The noise of a released cell and its exact probability mass function (spec §6).

* ``Discrete Gaussian`` (zCDP): Z ~ N_Z(0, s2), P(Z = z) ∝ exp(-z^2 / (2 s2)), s2 = VARIANCE;
* ``Two-Sided Geometric`` (pure DP): P(Z = z) ∝ q^|z| with q = e^(-1/s). The spec reports
  VARIANCE = 2q / (1 - q)^2, so q is recovered exactly as the root in (0, 1) of
  V q^2 - 2(V + 1) q + V = 0, i.e. q = V / (V + 1 + sqrt(2V + 1));
* derived cells (PH8_num cell 2 = PH7 cells 2 + 3) carry the *sum* of the noises of the cells
  they add up, each with variance V / k. Their likelihood is the exact k-fold convolution
  (closed forms for k = 2 below), not a single discrete Gaussian or geometric of variance V;
* VARIANCE 0 (an ``Infinity`` budget, test runs only): no noise.

Every noise here is symmetric and log-concave (the discrete Gaussian, the two-sided geometric and
their convolutions), which the posterior windows and the samplers rely on.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from phsafe.accounting import NoiseDistribution


def geometric_q(variance: float) -> float:
    """The ratio q = e^(-1/s) of the two-sided geometric whose variance is ``variance``.

    Inverts :func:`phsafe.accounting.geometric_variance`: V = 2q / (1 - q)^2 gives
    V q^2 - 2(V + 1) q + V = 0, whose roots multiply to 1; the root in (0, 1) is
    q = V / (V + 1 + sqrt(2V + 1)) (written this way to avoid cancellation).
    """
    if not variance > 0:
        raise ValueError("a geometric variance must be positive")
    return variance / (variance + 1.0 + math.sqrt(2.0 * variance + 1.0))


@dataclass(frozen=True)
class NoiseModel:
    """The noise of one released cell.

    Attributes:
        distribution: Discrete Gaussian (zCDP) or two-sided geometric (pure DP).
        variance: The cell's reported ``VARIANCE`` (of the whole, summed noise).
        parts: How many independent, identically distributed noises the cell adds up (2 for
            PH8_num cell 2, which is PH7 cells 2 + 3; 1 otherwise).
    """

    distribution: NoiseDistribution
    variance: float
    parts: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.variance) and self.variance >= 0):
            raise ValueError("VARIANCE must be finite and non-negative")
        if self.parts not in (1, 2):
            raise ValueError("only cells that sum one or two noises have an exact likelihood here")

    @property
    def is_noiseless(self) -> bool:
        return self.variance == 0

    @property
    def sd(self) -> float:
        return math.sqrt(self.variance)

    @functools.cached_property
    def _constants(self) -> tuple[float, ...]:
        """Constants of :meth:`log_pmf` that depend only on the model."""
        v = self.variance / self.parts  # variance of one part
        if self.distribution is NoiseDistribution.DISCRETE_GAUSSIAN:
            if self.parts == 1:
                return ()
            # Sum of two N_Z(0, v): sum_{j1 + j2 = x} exp(-(j1^2 + j2^2) / (2v)), and
            # j1^2 + j2^2 = 2 (j1 - x/2)^2 + x^2 / 2, so the pmf is
            # exp(-x^2 / (2V)) * theta(x mod 2) with V = 2v and
            # theta(r) = sum_m exp(-(m - r/2)^2 / v): a discrete Gaussian of variance
            # parameter V, reweighted by parity (theta(0) ≈ theta(1) unless v is small).
            m = np.arange(-int(40 * math.sqrt(v)) - 3, int(40 * math.sqrt(v)) + 4, dtype=np.float64)
            thetas = [np.logaddexp.reduce(-((m - r / 2.0) ** 2) / v) for r in (0, 1)]
            return (float(thetas[0]), float(thetas[1]))
        q = geometric_q(v)
        if self.parts == 1:
            return (math.log(q),)
        # Sum of two independent two-sided geometrics, P(Z = z) = c q^|z|, c = (1-q)/(1+q): for
        # x >= 0, sum_j q^(|j| + |x - j|) = q^x [(x + 1) + 2 q^2 / (1 - q^2)] (j in [0, x]
        # gives x + 1 terms q^x; j < 0 and j > x each give q^x q^2 / (1 - q^2)).
        return (math.log(q), 2.0 * q * q / (1.0 - q * q))

    def log_pmf(self, x: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """log P(Z = x) up to an additive constant (the same for every x), exactly.

        Args:
            x: Integer noise values.
        """
        x = np.asarray(x)
        if self.is_noiseless:
            return np.where(x == 0, 0.0, -np.inf)
        xf = x.astype(np.float64)
        if self.distribution is NoiseDistribution.DISCRETE_GAUSSIAN:
            out = -(xf * xf) / (2.0 * self.variance)
            if self.parts == 2:
                theta0, theta1 = self._constants
                out += np.where(x % 2 == 0, theta0, theta1)
            return out
        ax = np.abs(xf)
        if self.parts == 1:
            (log_q,) = self._constants
            return ax * log_q
        log_q, extra = self._constants
        return ax * log_q + np.log(ax + 1.0 + extra)

    def log_pmf_diff(self, x: npt.ArrayLike, x0: int) -> npt.NDArray[np.float64]:
        """log P(Z = x) - log P(Z = x0), computed from integer differences.

        ``log_pmf`` of a value far out (x^2 / 2V for x = 10^6 sigma) carries a rounding error
        larger than the differences that matter between neighbours; relative to a nearby
        ``x0`` they are exact to double precision.
        """
        x = np.asarray(x, dtype=np.int64)
        x0 = int(x0)
        if self.is_noiseless:
            return self.log_pmf(x) - float(self.log_pmf(np.array([x0]))[0])
        if self.distribution is NoiseDistribution.DISCRETE_GAUSSIAN:
            out = -((x - x0) * (x + x0)).astype(np.float64) / (2.0 * self.variance)
            if self.parts == 2:
                theta0, theta1 = self._constants
                out += np.where(x % 2 == 0, theta0, theta1) - (theta0 if x0 % 2 == 0 else theta1)
            return out
        ax, a0 = np.abs(x), abs(x0)
        if self.parts == 1:
            (log_q,) = self._constants
            return (ax - a0).astype(np.float64) * log_q
        log_q, extra = self._constants
        return (ax - a0).astype(np.float64) * log_q + np.log1p((ax - a0) / (a0 + 1.0 + extra))

    def table_half_width(self) -> int:
        """A half-width B beyond which the pmf is negligible (< 1e-20 relative)."""
        if self.distribution is NoiseDistribution.DISCRETE_GAUSSIAN:
            # exp(-x^2 / (2V)) at x = 12 sd is e^-72; the parity factor is bounded.
            return int(math.ceil(12.0 * self.sd)) + 4
        q = geometric_q(self.variance / self.parts)
        scale = -1.0 / math.log(q)  # s
        # q^x (x + 1 + ...) <= 1e-25 well before x = s (60 + 2 log(1 + s)) + a few.
        return int(math.ceil(scale * (60.0 + 2.0 * math.log1p(scale)))) + 4

    @classmethod
    def of(cls, distribution: str | NoiseDistribution, variance: float, parts: int = 1) -> "NoiseModel":
        return cls(NoiseDistribution(distribution), float(variance), int(parts))
