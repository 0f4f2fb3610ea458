"""The one place noise is drawn.

:func:`measure` is the only entry point. It cannot draw noise without a recorded spend: it asks
the :class:`SpendRecorder` (the audit ledger) to durably record the spend first, and only then
samples. Samples come from OpenDP's exact integer samplers, which draw from a cryptographically
secure source -- never from rounded floating-point draws, never from a seed:

* zCDP: the discrete Gaussian N_Z(sigma^2), sigma^2 = Delta^2 / (2 rho) (paper, Algorithm 5);
* pure DP: the two-sided geometric P(k) ∝ exp(-|k|/s), s = Delta / epsilon.

Proof sketch of the budget of one measurement: the count vector changes by at most Delta in L2
(zCDP) or L1 (pure DP) norm between neighbouring inputs (:mod:`phsafe.accounting`); OpenDP's
measurement over ``vector_domain(atom_domain(i64))`` with that metric has the privacy map
d_in -> d_out, and :func:`measure` checks that map(Delta) equals the planned budget before any
spend is recorded -- a mismatch is an error, never a silent over-spend. The float scale handed to
OpenDP is rounded *up* (never down) so that its map stays within the planned budget.

An exact L2 sensitivity may be irrational (tau sqrt 2, carried as its square N): its map is then
taken in OpenDP's ``l2_distance(T="f64")`` metric at the smallest float not below sqrt(N) -- an
upper bound of Delta, so the map checked against the budget can only over-state the loss. Integer
sensitivities (every one of the paper's bound) keep the integer metric.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Protocol

import numpy as np
import numpy.typing as npt

from phsafe.accounting import PlannedMeasurement
from phsafe.config import PrivacyDefinition
from phsafe.errors import PrivacyMapMismatchError

# Relative tolerance between OpenDP's map(Delta) and the planned budget: OpenDP rounds its map
# conservatively in floating point, and our scale is rounded up by a few ulps.
_MAP_RTOL = 1e-9
_MAX_NUDGES = 64


@dataclass(frozen=True)
class SpendReceipt:
    """Proof from the ledger that a measurement's spend is durably recorded.

    Attributes:
        measurement_key: ``TABLE/level`` of the recorded measurement.
        sequence: Ledger sequence number of the INTENT entry.
        entry_hash: Hash of that entry.
    """

    measurement_key: str
    sequence: int
    entry_hash: str


class SpendRecorder(Protocol):
    """What :func:`measure` needs from the audit ledger."""

    def record_intent(self, measurement: PlannedMeasurement) -> SpendReceipt:
        """Durably (fsync) record that ``measurement``'s budget is about to be spent."""
        ...

    def record_committed(self, receipt: SpendReceipt, *, noisy_digest: str) -> None:
        """Record that the noise of the spend ``receipt`` was drawn; ``noisy_digest`` hashes it."""
        ...


def vector_digest(values: npt.NDArray[np.integer]) -> str:
    """SHA-256 of a count vector as little-endian int64, in domain order."""
    return hashlib.sha256(np.ascontiguousarray(values, dtype="<i8").tobytes()).hexdigest()


def _opendp():
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


def sensitivity_at_least(squared: int) -> float:
    """The smallest float d with d^2 >= ``squared`` (exactly): sqrt(N) rounded up."""
    d = math.sqrt(squared)
    while Fraction(d) ** 2 < squared:
        d = math.nextafter(d, math.inf)
    while d > 0 and Fraction(math.nextafter(d, 0.0)) ** 2 >= squared:
        d = math.nextafter(d, 0.0)
    return d


def _map_input(m: PlannedMeasurement) -> tuple[str, int | float]:
    """OpenDP's distance type and d_in for ``m``'s sensitivity (see the module docstring)."""
    if isinstance(m.sensitivity, int):
        return "i64", m.sensitivity
    return "f64", sensitivity_at_least(m.sensitivity_squared)


def _build_mechanism(m: PlannedMeasurement):
    """An OpenDP measurement for ``m`` whose privacy map at Delta is the planned budget."""
    dp = _opendp()
    budget = float(m.budget_fraction)
    distance_type, d_in = _map_input(m)
    if m.privacy_defn is PrivacyDefinition.ZCDP:
        metric = dp.l2_distance(T=distance_type)
        scale = math.sqrt(float(m.gaussian_sigma_squared))
        make = dp.m.make_gaussian
    else:
        metric = dp.l1_distance(T=distance_type)
        scale = float(m.geometric_scale)
        make = dp.m.make_laplace
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    planned = m.budget_fraction
    for _ in range(_MAX_NUDGES):
        mechanism = make(domain, metric, scale=scale)
        spent = mechanism.map(d_in)
        # Exact: the float OpenDP returns, as the rational it is, against the exact budget -- a
        # float comparison could round a spend above the budget down to equal it.
        if Fraction(spent) <= planned:
            break
        scale = math.nextafter(scale, math.inf)  # more noise, never less
    else:
        raise PrivacyMapMismatchError(
            f"{m.key}: OpenDP's privacy map stays above the planned budget {m.budget}"
        )
    if abs(spent - budget) > _MAP_RTOL * budget:
        raise PrivacyMapMismatchError(
            f"{m.key}: OpenDP's privacy map gives {spent!r} for sensitivity {m.sensitivity}, "
            f"but the plan says {m.budget}"
        )
    return mechanism, scale


@dataclass(frozen=True)
class BuiltMeasurement:
    """OpenDP's measurement of one planned measurement, its privacy map checked (:func:`build`).

    Attributes:
        planned: The measurement it was built for (:func:`measure` refuses it for another).
        mechanism: OpenDP's measurement (None: a noiseless measurement).
        scale: The scale handed to OpenDP (0.0 when noiseless).
    """

    planned: PlannedMeasurement
    mechanism: Any
    scale: float


def build(m: PlannedMeasurement) -> BuiltMeasurement:
    """Build ``m``'s OpenDP measurement once (through the same constructor as every draw), to
    draw from it many times with :func:`measure` -- the empirical audit's hundreds of runs of one
    plan. A private run builds each measurement once anyway: it has no use for this.

    Raises:
        PrivacyMapMismatchError: OpenDP's map(Delta) differs from the planned budget.
    """
    if m.is_noiseless:
        return BuiltMeasurement(m, None, 0.0)
    mechanism, scale = _build_mechanism(m)
    return BuiltMeasurement(m, mechanism, scale)


def check_privacy_map(m: PlannedMeasurement) -> float:
    """Cross-check ``m`` against OpenDP's privacy map; return the scale handed to OpenDP.

    Raises:
        PrivacyMapMismatchError: OpenDP's map(Delta) differs from the planned budget.
    """
    if m.is_noiseless:
        return 0.0
    return _build_mechanism(m)[1]


def measure(
    m: PlannedMeasurement,
    exact: npt.NDArray[np.integer],
    recorder: SpendRecorder,
    *,
    keep: Callable[[npt.NDArray[np.int64]], None] | None = None,
    built: BuiltMeasurement | None = None,
) -> npt.NDArray[np.int64]:
    """Release ``exact`` (the full-domain count vector of ``m``) with noise.

    The spend is recorded (durably) before the noise is drawn; if drawing fails afterwards the
    spend stands -- budgets are never refunded.

    Args:
        m: The planned measurement.
        exact: Exact counts over the full domain of ``m``, in domain order.
        recorder: The audit ledger.
        keep: Called with the noisy vector after the draw and before COMMITTED is recorded, to
            store it durably; a committed measurement can then always be reused instead of
            re-drawn (a failure in ``keep`` leaves the spend recorded and uncommitted).
        built: ``m``'s measurement from :func:`build`, to draw from (default: built here).

    Returns:
        The noisy counts, int64, same order.
    """
    exact = np.asarray(exact)
    if exact.ndim != 1 or exact.size != m.n_cells:
        raise ValueError(f"{m.key}: expected {m.n_cells} cells, got shape {exact.shape}")
    if not np.issubdtype(exact.dtype, np.integer):
        raise TypeError(f"{m.key}: counts must be integers")
    if built is not None and built.planned != m:
        raise ValueError(f"{m.key}: the measurement was built for another plan ({built.planned.key})")
    if m.is_noiseless:
        mechanism = None
    else:
        mechanism = built.mechanism if built is not None else _build_mechanism(m)[0]

    receipt = recorder.record_intent(m)
    if receipt.measurement_key != m.key:
        raise RuntimeError(f"ledger recorded {receipt.measurement_key}, expected {m.key}")

    if mechanism is None:
        noisy = exact.astype(np.int64, copy=True)
    else:
        noisy = np.asarray(mechanism(exact.astype(np.int64).tolist()), dtype=np.int64)
    if keep is not None:
        keep(noisy)
    recorder.record_committed(receipt, noisy_digest=vector_digest(noisy))
    return noisy


def planned_scale(m: PlannedMeasurement) -> Fraction | None:
    """The exact (unrounded) noise parameter: sigma^2 for zCDP, s for pure DP."""
    if m.is_noiseless:
        return None
    if m.privacy_defn is PrivacyDefinition.ZCDP:
        return m.gaussian_sigma_squared
    return m.geometric_scale
