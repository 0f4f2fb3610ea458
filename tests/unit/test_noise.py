"""The noise entry point (spec §6): spend recorded before noise, exact samplers, the privacy map.

Fast tests check :func:`phsafe.noise.measure`'s contract and the accounting formulas. The slow
tests draw large samples through ``measure`` and test them against the exact discrete Gaussian /
two-sided geometric pmf (chi-square, every expected bin count >= 5, two open tail bins,
alpha = 1e-6), and check that the same test rejects the pmf at 0.7x and 1.3x the scale.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import phsafe.noise as noise
from phsafe.accounting import NoiseDistribution, PlannedMeasurement, geometric_variance, plan_run
from phsafe.config import PrivacyDefinition, load_config, parse_config
from phsafe.errors import BudgetError, PrivacyMapMismatchError
from phsafe.iterations import GeographyLevel, IterationLevel, PopulationGroupLevel
from phsafe.noise import SpendReceipt, check_privacy_map, measure

from tests.conftest import END_TO_END, PR_CONFIG, US_CONFIG

ZCDP, PUREDP = PrivacyDefinition.ZCDP, PrivacyDefinition.PUREDP
STATE_TOTAL = PopulationGroupLevel(GeographyLevel.STATE, IterationLevel.TOTAL)


def planned(defn: PrivacyDefinition, budget: str, sensitivity: int, n_cells: int,
            table: str = "PH1_num") -> PlannedMeasurement:
    tau = (sensitivity - 2) // 2 if table in ("PH1_num", "PH2", "PH3", "PH4", "PH6", "PH7") else None
    return PlannedMeasurement(table, STATE_TOTAL, defn, Decimal(budget), sensitivity, tau, n_cells)


class Recorder:
    """A minimal SpendRecorder that remembers every call, in order."""

    def __init__(self, fail_on_intent: bool = False, wrong_key: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_on_intent = fail_on_intent
        self.wrong_key = wrong_key

    @property
    def intents(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "intent"]

    def record_intent(self, m: PlannedMeasurement) -> SpendReceipt:
        self.calls.append(("intent", m.key))
        if self.fail_on_intent:
            raise OSError("disk full")
        key = "PH2/usa_*" if self.wrong_key else m.key
        return SpendReceipt(measurement_key=key, sequence=len(self.calls), entry_hash="ab" * 32)

    def record_committed(self, receipt: SpendReceipt, *, noisy_digest: str) -> None:
        self.calls.append(("committed", receipt.measurement_key, noisy_digest))


class SamplerSpy:
    """Records every OpenDP measurement invocation (the only way noise is sampled) and, at that
    moment, the result of each hook (e.g. what the recorder has recorded so far)."""

    def __init__(self) -> None:
        self.calls: list[list] = []
        self.hooks: list = []


@pytest.fixture
def sampler(monkeypatch: pytest.MonkeyPatch) -> SamplerSpy:
    import opendp.core

    spy = SamplerSpy()
    original = opendp.core.measurement_invoke

    def invoke(measurement, arg):
        spy.calls.append([h() for h in spy.hooks])
        return original(measurement, arg)

    monkeypatch.setattr(opendp.core, "measurement_invoke", invoke)
    return spy


def _sha256_i8(values: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(values, dtype="<i8").tobytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# measure(): input checks, ordering of the spend and the draw
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(9,), (11,), (0,), (2, 5)])
def test_measure_refuses_a_vector_of_the_wrong_size(shape, sampler) -> None:
    m = planned(ZCDP, "0.5", 2, 10, table="PH1_denom")
    rec = Recorder()
    with pytest.raises(ValueError):
        measure(m, np.zeros(shape, dtype=np.int64), rec)
    assert rec.calls == [] and sampler.calls == []


def test_measure_refuses_non_integer_counts(sampler) -> None:
    m = planned(ZCDP, "0.5", 2, 3, table="PH1_denom")
    rec = Recorder()
    with pytest.raises(TypeError):
        measure(m, np.array([1.0, 2.0, 3.0]), rec)
    assert rec.calls == [] and sampler.calls == []


@pytest.mark.parametrize("defn", [ZCDP, PUREDP])
def test_failing_intent_means_no_noise_is_drawn(defn, sampler) -> None:
    m = planned(defn, "0.5", 2, 5, table="PH1_denom")
    rec = Recorder(fail_on_intent=True)
    result = None
    with pytest.raises(OSError):
        result = measure(m, np.arange(5), rec)
    assert result is None
    assert rec.calls == [("intent", m.key)]  # never committed
    assert sampler.calls == []  # the sampler was never invoked


def test_receipt_for_another_measurement_means_no_noise(sampler) -> None:
    m = planned(ZCDP, "0.5", 2, 5, table="PH1_denom")
    rec = Recorder(wrong_key=True)
    with pytest.raises(RuntimeError):
        measure(m, np.arange(5), rec)
    assert sampler.calls == []
    assert [c[0] for c in rec.calls] == ["intent"]


@pytest.mark.parametrize("defn", [ZCDP, PUREDP])
def test_intent_is_recorded_before_the_sampler_runs(defn, sampler) -> None:
    m = planned(defn, "0.25", 2, 7, table="PH8_denom")
    rec = Recorder()
    sampler.hooks.append(lambda: list(rec.calls))
    exact = np.array([0, 1, 2, 3, 4, 5, 100], dtype=np.int64)
    noisy = measure(m, exact, rec)
    assert len(sampler.calls) == 1
    # At the moment of sampling, the intent (and nothing else) had been recorded.
    assert sampler.calls[0] == [[("intent", m.key)]]
    assert rec.calls[0] == ("intent", m.key)
    assert rec.calls[1] == ("committed", m.key, _sha256_i8(noisy))
    assert len(rec.calls) == 2
    assert noisy.dtype == np.int64 and noisy.shape == (7,)


@pytest.mark.noise_not_asserted("counts the builds and the draws, never looks at a drawn value")
def test_a_built_measurement_is_drawn_from_many_times(sampler, monkeypatch: pytest.MonkeyPatch) -> None:
    """build() goes through the same (replaceable) constructor as every draw, once; measure()
    draws from it, spend first each time, and refuses it for another plan."""
    m = planned(ZCDP, "0.25", 2, 7, table="PH8_denom")
    builds = []
    real_build = noise._build_mechanism

    def build(planned_m):  # noqa: ANN001, ANN202
        builds.append(planned_m)
        return real_build(planned_m)

    monkeypatch.setattr(noise, "_build_mechanism", build)
    built = noise.build(m)
    assert builds == [m] and built.planned == m and built.scale == check_privacy_map(m)
    builds.clear()
    rec = Recorder()
    sampler.hooks.append(lambda: len(rec.calls))
    for _ in range(3):
        out = measure(m, np.arange(7), rec, built=built)
        assert out.dtype == np.int64 and out.shape == (7,)
    assert builds == []  # the draws built nothing
    assert sampler.calls == [[1], [3], [5]]  # each draw after its intent
    assert [c[0] for c in rec.calls] == ["intent", "committed"] * 3
    other = planned(ZCDP, "0.5", 2, 7, table="PH8_denom")
    rec = Recorder()
    with pytest.raises(ValueError, match="built for another plan"):
        measure(other, np.arange(7), rec, built=built)
    assert rec.calls == [] and len(sampler.calls) == 3
    noiseless = planned(ZCDP, "Infinity", 2, 3, table="PH8_denom")
    assert measure(noiseless, np.arange(3), Recorder(), built=noise.build(noiseless)).tolist() == [0, 1, 2]


def test_infinity_budget_returns_the_exact_counts(sampler) -> None:
    for defn in (ZCDP, PUREDP):
        m = planned(defn, "Infinity", 22, 6)
        assert m.is_noiseless and m.variance == 0.0
        exact = np.array([0, 5, 7, 1, 2**30, 3], dtype=np.int32)
        rec = Recorder()
        out = measure(m, exact, rec)
        assert out.dtype == np.int64
        assert out.tolist() == exact.tolist()
        assert out is not exact
        assert [c[0] for c in rec.calls] == ["intent", "committed"]
        assert rec.calls[1][2] == _sha256_i8(exact)
        assert check_privacy_map(m) == 0.0
    assert sampler.calls == []


def test_noise_is_not_seeded_and_is_integer() -> None:
    m = planned(ZCDP, "0.5", 2, 2000, table="PH1_denom")  # sigma = 2
    a = measure(m, np.zeros(2000, dtype=np.int64), Recorder())
    b = measure(m, np.zeros(2000, dtype=np.int64), Recorder())
    assert a.dtype == np.int64 and b.dtype == np.int64
    assert not np.array_equal(a, b)
    assert a.any() and (a < 0).any() and (a > 0).any()
    # false-alarm rate: 8.9e-11 per run -- Chernoff bounds from the exact pmf (2000 draws, sigma^2 = 4): std >= 2.3
    # needs mean(Z^2) >= 5.29 (2e-19), std <= 1.7 needs mean(Z^2) <= 3.2 or |mean Z| >= 0.557 (8.9e-11); equal
    # vectors, all zero or no sign: (sum p^2)^2000, p0^2000, 0.6^2000 (< 1e-300)
    assert abs(a.std() - 2.0) < 0.3


def test_large_counts_do_not_saturate() -> None:
    # i64 domain: counts beyond the i32 range come back with small noise, not clipped.
    m = planned(PUREDP, "2", 2, 3, table="PH1_denom")  # s = 1
    exact = np.array([2**31 + 5, 3 * 2**40, -(2**33)], dtype=np.int64)
    out = measure(m, exact, Recorder())
    # false-alarm rate: 1.6e-43 per run -- exact: 3 cells x P(|Z| >= 100) = 3 x 2 q^100 / (1 + q), q = e^-1
    assert (np.abs(out - exact) < 100).all()


# --------------------------------------------------------------------------------------------
# The production recorder (phsafe.ledger), when it exists
# --------------------------------------------------------------------------------------------


def _small_config(defn: str = "zcdp") -> dict:
    levels = {"usa_*": "0.01", "usa_A-G": "0", "usa_H,I": "0", "state_*": "0.02", "state_A-G": "0",
              "state_H,I": "0"}
    budgets = {t: dict(levels) for t in ("PH1_num", "PH1_denom", "PH3", "PH4", "PH5_denom", "PH7", "PH8_denom")}
    budgets.update({t: {"usa_*": Decimal("0.01"), "state_*": Decimal("0")} for t in ("PH2", "PH6")})
    for t in budgets:
        budgets[t] = {k: Decimal(v) for k, v in budgets[t].items()}
    return {"privacy_defn": defn, "privacy_budget": budgets,
            "tau": {t: 3 for t in ("PH1_num", "PH2", "PH3", "PH4", "PH6", "PH7")},
            "state_filter": ["06", "01"], "reader": "csv"}


def test_with_the_production_ledger_intent_is_durable_before_the_draw(tmp_path: Path, sampler) -> None:
    from tests._ledgers import new_ledger, start

    plan = plan_run(parse_config(_small_config()))
    ledger = new_ledger(tmp_path, cap="inf", non_confidential=True)
    path = ledger.path
    recorder = start(ledger, plan, "run-noise-test", non_confidential=True)

    def ledger_kinds() -> list[tuple[str, str | None]]:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return [(e["kind"], e.get("key")) for e in lines]

    sampler.hooks.append(ledger_kinds)
    m = plan.for_table("PH1_num")[0]
    noisy = measure(m, np.zeros(m.n_cells, dtype=np.int64), recorder)
    assert len(sampler.calls) == 1
    # On disk before the sampler ran: RUN_STARTED, then the INTENT of this measurement.
    assert sampler.calls[0][0][-1] == ("INTENT", m.key)
    assert ("COMMITTED", m.key) not in sampler.calls[0][0]
    entries = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    assert entries[-1]["kind"] == "COMMITTED" and entries[-1]["key"] == m.key
    assert entries[-1]["noisy_digest"] == _sha256_i8(noisy)

    # A measurement the plan does not contain is refused before any noise.
    before = len(sampler.calls)
    rogue = dataclasses.replace(plan.for_table("PH2")[0], budget=Decimal("0.5"))
    with pytest.raises(BudgetError):
        measure(rogue, np.zeros(rogue.n_cells, dtype=np.int64), recorder)
    assert len(sampler.calls) == before
    # Spending the same measurement twice is refused before any noise.
    with pytest.raises(BudgetError):
        measure(m, np.zeros(m.n_cells, dtype=np.int64), recorder)
    assert len(sampler.calls) == before


# --------------------------------------------------------------------------------------------
# Privacy map cross-check
# --------------------------------------------------------------------------------------------


def _opendp_map(defn: PrivacyDefinition, scale: float, sensitivity: int) -> float:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    if defn is ZCDP:
        return dp.m.make_gaussian(domain, dp.l2_distance(T="i64"), scale=scale).map(sensitivity)
    return dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=scale).map(sensitivity)


@pytest.mark.parametrize("path", [US_CONFIG, PR_CONFIG, END_TO_END / "config.json"])
def test_check_privacy_map_accepts_every_measurement_of_the_production_configs(path: Path) -> None:
    config = load_config(path)
    plan = plan_run(config)
    assert plan.measurements
    for m in plan.measurements:
        scale = check_privacy_map(m)
        budget = float(m.budget_fraction)
        if m.privacy_defn is ZCDP:
            exact_scale = math.sqrt(float(m.gaussian_sigma_squared))
            closed_form = m.sensitivity**2 / (2 * scale**2)
        else:
            exact_scale = float(m.geometric_scale)
            closed_form = m.sensitivity / scale
        assert scale == pytest.approx(exact_scale, rel=1e-12), m.key
        assert scale >= exact_scale, m.key  # rounded towards more noise, never less
        spent = _opendp_map(m.privacy_defn, scale, m.sensitivity)
        assert spent <= budget, m.key
        assert spent == pytest.approx(budget, rel=1e-9), m.key
        assert closed_form == pytest.approx(budget, rel=1e-9), m.key


@pytest.mark.parametrize("factor", [Fraction(2), Fraction(1, 2), Fraction(101, 100)])
def test_tampered_budget_is_caught(monkeypatch: pytest.MonkeyPatch, factor: Fraction, sampler) -> None:
    plan = plan_run(load_config(US_CONFIG))
    m = plan.for_table("PH1_num")[0]
    sigma2 = m.gaussian_sigma_squared  # the scale the honest plan would use
    tampered = dataclasses.replace(m, budget=Decimal(str(m.budget)) * Decimal(str(float(factor))))
    monkeypatch.setattr(PlannedMeasurement, "gaussian_sigma_squared", property(lambda self: sigma2))
    with pytest.raises(PrivacyMapMismatchError):
        check_privacy_map(tampered)
    rec = Recorder()
    with pytest.raises(PrivacyMapMismatchError):
        measure(tampered, np.zeros(tampered.n_cells, dtype=np.int64), rec)
    assert rec.calls == [] and sampler.calls == []  # nothing recorded, nothing drawn


@pytest.mark.parametrize("defn", [ZCDP, PUREDP])
def test_tampered_sensitivity_is_caught(monkeypatch: pytest.MonkeyPatch, defn: PrivacyDefinition) -> None:
    m = planned(defn, "0.33", 12, 4)
    honest = m.gaussian_sigma_squared if defn is ZCDP else m.geometric_scale
    tampered = dataclasses.replace(m, sensitivity=14)
    name = "gaussian_sigma_squared" if defn is ZCDP else "geometric_scale"
    monkeypatch.setattr(PlannedMeasurement, name, property(lambda self: honest))
    assert check_privacy_map(m) > 0  # the honest plan still passes
    with pytest.raises(PrivacyMapMismatchError):
        check_privacy_map(tampered)


def test_tampered_puredp_budget_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    m = planned(PUREDP, "0.33", 12, 4)
    s = m.geometric_scale
    monkeypatch.setattr(PlannedMeasurement, "geometric_scale", property(lambda self: s))
    for budget in ("0.66", "0.165", "0.34"):
        with pytest.raises(PrivacyMapMismatchError):
            check_privacy_map(dataclasses.replace(m, budget=Decimal(budget)))


# --------------------------------------------------------------------------------------------
# Formulas (spec §6)
# --------------------------------------------------------------------------------------------


def test_sensitivities_of_the_production_plan() -> None:
    plan = plan_run(load_config(US_CONFIG))
    taus = {"PH1_num": 10, "PH2": 10, "PH3": 6, "PH4": 10, "PH6": 6, "PH7": 10}
    for m in plan.measurements:
        expected = 2 * taus[m.table] + 2 if m.table in taus else 2
        assert m.sensitivity == expected, m.key


@pytest.mark.parametrize(("delta", "rho"), [(22, "0.016371"), (2, "0.5"), (14, "0.662976"), (2, "0.000022")])
def test_gaussian_variance_is_delta_squared_over_two_rho_exactly(delta: int, rho: str) -> None:
    m = planned(ZCDP, rho, delta, 1)
    expected = Fraction(delta * delta) / (2 * Fraction(Decimal(rho)))
    assert m.gaussian_sigma_squared == expected
    assert m.variance == float(expected)
    assert m.distribution is NoiseDistribution.DISCRETE_GAUSSIAN
    assert m.distribution.value == "Discrete Gaussian"
    assert noise.planned_scale(m) == expected


@pytest.mark.parametrize(("delta", "eps"), [(12, "0.33"), (2, "1"), (2, "0.000022"), (22, "5")])
def test_geometric_variance_formula(delta: int, eps: str) -> None:
    m = planned(PUREDP, eps, delta, 1)
    s = Fraction(delta) / Fraction(Decimal(eps))
    assert m.geometric_scale == s
    q = math.exp(-1 / float(s))
    assert m.variance == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-12)
    assert m.distribution.value == "Two-Sided Geometric"


@pytest.mark.parametrize("s", [0.5, 2.0, 36.36])
def test_geometric_variance_is_the_variance_of_the_pmf(s: float) -> None:
    # Independent check of the closed form: sum k^2 P(k) with P(k) = (1-q)/(1+q) q^|k|.
    q = math.exp(-1 / s)
    k = np.arange(-int(80 * s) - 50, int(80 * s) + 51, dtype=np.float64)
    pmf = (1 - q) / (1 + q) * q ** np.abs(k)
    assert pmf.sum() == pytest.approx(1.0, rel=1e-12)
    assert geometric_variance(s) == pytest.approx(float((k**2 * pmf).sum()), rel=1e-9)


def test_spec_moe_example() -> None:
    # MOE 200, tau 10 (Delta = 22): rho = 1.645^2 * 22^2 / (2 * 200^2) -> 0.016371.
    rho = 1.645**2 * 22**2 / (2 * 200**2)
    assert round(rho, 6) == 0.016371
    plan = plan_run(load_config(US_CONFIG))
    m = next(x for x in plan.measurements if x.key == "PH1_num/state_*")
    assert m.sensitivity == 22 and m.budget == Decimal("0.016371")
    assert m.moe90 == pytest.approx(200, abs=0.01)
    assert m.moe90 == pytest.approx(1.645 * math.sqrt(22**2 / (2 * 0.016371)), rel=1e-12)


# --------------------------------------------------------------------------------------------
# Goodness of fit (slow)
# --------------------------------------------------------------------------------------------

N_DRAWS = 200_000
ALPHA = 1e-6


def gaussian_pmf(sigma2: float) -> tuple[np.ndarray, np.ndarray]:
    sigma = math.sqrt(sigma2)
    K = int(math.ceil(40 * sigma)) + 20
    k = np.arange(-K, K + 1)
    w = np.exp(-(k.astype(np.float64) ** 2) / (2 * sigma2))
    return k, w / w.sum()


def geometric_pmf(s: float) -> tuple[np.ndarray, np.ndarray]:
    q = math.exp(-1 / s)
    K = int(math.ceil(60 * s)) + 20
    k = np.arange(-K, K + 1)
    p = (1 - q) / (1 + q) * q ** np.abs(k).astype(np.float64)
    return k, p / p.sum()


def chi_square_pvalue(sample: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> tuple[float, int]:
    """Chi-square test of ``sample`` against ``pmf`` on ``support`` (consecutive integers).

    Consecutive integers are merged, left to right, until each bin's expected count is >= 5; the
    first bin is open to the left and the last open to the right (the two tail bins).
    """
    from scipy.stats import chi2

    n = len(sample)
    expected_int = n * pmf
    edges = [0]  # bin b covers support indices [edges[b], edges[b+1])
    acc = 0.0
    for i, e in enumerate(expected_int):
        acc += e
        if acc >= 5:
            edges.append(i + 1)
            acc = 0.0
    if edges[-1] != len(support):
        edges[-1] = len(support)  # leftover (< 5 expected) joins the last bin
    edges_arr = np.array(edges)
    expected = np.add.reduceat(expected_int, edges_arr[:-1])
    assert (expected >= 5).all()
    index = np.clip(sample - support[0], 0, len(support) - 1)  # tails: outside -> first/last bin
    bin_of = np.searchsorted(edges_arr, index, side="right") - 1
    observed = np.bincount(bin_of, minlength=len(expected))
    assert observed.sum() == n
    stat = float(((observed - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, len(expected) - 1)), len(expected)


def test_chi_square_helper_on_a_known_sample() -> None:
    # The helper itself: exact multinomial draws from the pmf pass, a shifted sample fails.
    rng = np.random.default_rng(1)
    k, p = geometric_pmf(3.0)
    sample = rng.choice(k, size=50_000, p=p)
    assert chi_square_pvalue(sample, k, p)[0] > ALPHA
    assert chi_square_pvalue(sample + 1, k, p)[0] < ALPHA


def _draw(m: PlannedMeasurement) -> np.ndarray:
    rec = Recorder()
    out = measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
    assert [c[0] for c in rec.calls] == ["intent", "committed"]
    return out


@pytest.mark.parametrize(("delta", "rho"), [(22, "0.016371"), (2, "0.5")])
def test_discrete_gaussian_goodness_of_fit(delta: int, rho: str) -> None:
    m = planned(ZCDP, rho, delta, N_DRAWS, table="PH1_num" if delta == 22 else "PH1_denom")
    sample = _draw(m)
    sigma2 = float(m.gaussian_sigma_squared)
    k, p = gaussian_pmf(sigma2)
    pvalue, bins = chi_square_pvalue(sample, k, p)
    assert bins > 10
    # false-alarm rate: 9.5e-06 per run -- monte carlo: Pearson's statistic of 10^6 seeded multinomial samples of the
    # test's bins (200,000 draws of the exact pmf) above chi2.isf(1e-6): 1 exceedance each (sigma 121.6, 815 bins;
    # sigma 2, 17 bins), Clopper-Pearson 95% upper limits 4.7e-6 each; the power checks' misses below 1e-300 (a merged
    # bin's binomial bound)
    assert pvalue > ALPHA, (pvalue, bins)
    for factor in (0.7, 1.3):  # power: the same test rejects sigma scaled by 0.7 and 1.3
        k2, p2 = gaussian_pmf(sigma2 * factor**2)
        assert chi_square_pvalue(sample, k2, p2)[0] < ALPHA, factor


@pytest.mark.parametrize(("delta", "eps"), [(12, "0.33"), (2, "1")])
def test_two_sided_geometric_goodness_of_fit(delta: int, eps: str) -> None:
    m = planned(PUREDP, eps, delta, N_DRAWS, table="PH3" if delta == 12 else "PH1_denom")
    sample = _draw(m)
    s = float(m.geometric_scale)
    k, p = geometric_pmf(s)
    pvalue, bins = chi_square_pvalue(sample, k, p)
    assert bins > 10
    # false-alarm rate: 1.6e-05 per run -- monte carlo: Pearson's statistic of 10^6 seeded multinomial samples of the
    # test's bins (200,000 draws of the exact pmf) above chi2.isf(1e-6): 4 (s = 36.4, 515 bins) and 2 (s = 2, 39 bins)
    # exceedances, Clopper-Pearson 95% upper limits 9.2e-6 and 6.3e-6 (the chi-square law's 1e-6 is optimistic with
    # 515 bins of at least 5 expected); the power checks' miss: below 1e-300 (a merged-bin binomial bound)
    assert pvalue > ALPHA, (pvalue, bins)
    for factor in (0.7, 1.3):
        k2, p2 = geometric_pmf(s * factor)
        assert chi_square_pvalue(sample, k2, p2)[0] < ALPHA, factor


@given(
    defn=st.sampled_from([ZCDP, PUREDP]),
    mantissa=st.integers(1, 999_999),
    exponent=st.integers(-7, 0),
    tau=st.integers(1, 20),
)
@settings(max_examples=150, deadline=None)
def test_the_privacy_map_never_exceeds_the_budget_exactly(defn, mantissa: int, exponent: int, tau: int) -> None:
    """Exact, not float, comparison: OpenDP's map at Delta, as the rational its float is, is never
    above the planned budget (a float comparison could call a spend a hair above it equal)."""
    budget = Decimal(mantissa).scaleb(exponent)
    m = planned(defn, str(budget), 2 * tau + 2, 4)
    scale = check_privacy_map(m)
    assert Fraction(_opendp_map(defn, scale, m.sensitivity)) <= m.budget_fraction


def test_a_map_a_hair_above_the_budget_is_nudged_to_more_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """If OpenDP's map returns the float nearest the budget but above it as a rational, the
    scale is raised until the map is within the budget exactly -- never accepted as equal."""
    import opendp.prelude as dp

    m = planned(ZCDP, "0.1", 22, 4)
    above = math.nextafter(float(m.budget_fraction), math.inf)
    assert Fraction(above) > m.budget_fraction
    original = dp.m.make_gaussian
    scales = []

    def make(domain, metric, scale):  # noqa: ANN001 -- the first scale "spends" a hair too much
        scales.append(scale)
        mechanism = original(domain, metric, scale=scale)
        if len(scales) == 1:
            class Above:
                def map(self, d_in):  # noqa: ANN001
                    return above
            return Above()
        return mechanism

    monkeypatch.setattr(dp.m, "make_gaussian", make)
    scale = check_privacy_map(m)
    assert len(scales) >= 2 and scale > scales[0]
