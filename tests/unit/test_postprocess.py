"""Post-processing (:mod:`phsafe.postprocess`): exact posteriors, credible intervals, averages.

* the noise pmfs are exact: the variance inversion of the geometric, the two-part convolutions;
* the vectorized posterior summaries (mean, median, HPD and equal-tailed intervals, P(0)) equal
  a brute-force computation; samples follow the posterior; noiseless cells are point masses; the
  summation window's tail is below the bound;
* coverage by simulation, with noise drawn by OpenDP (the samplers of the private runs): the
  stated 90% MOE (1.645 sigma) and the 90% credible intervals of counts and of averages cover
  the truth about 90% of the time (fast versions here; full simulations marked ``slow``);
* ``postprocess`` takes only the output directory and opens nothing else: the input data is
  moved away, the reader is patched to fail, and every file opened is recorded.

The estimate files, marginal cells, the constrained averages and the checks are tested in
``test_estimates.py``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from phsafe import postprocess as pp
from phsafe.accounting import NoiseDistribution, geometric_variance, plan_run
from phsafe.config import load_config
from phsafe.postprocess import RATIO_SHELLS, NoiseModel, Posterior, geometric_q, posterior_for, ratio_table
from tests.conftest import PR_CONFIG, US_CONFIG

DG = "Discrete Gaussian"
GEO = "Two-Sided Geometric"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


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


def brute_force(model: NoiseModel, y: int) -> tuple[float, int, int, int, float, int, int]:
    """Posterior mean, median, HPD interval, P(0) and the equal-tailed interval by direct
    summation on a huge window, with the HPD set found by sorting."""
    sd = max(model.sd, 1.0)
    n = np.arange(0, max(y, 0) + int(80 * sd) + 200)
    if model.distribution is NoiseDistribution.DISCRETE_GAUSSIAN and model.parts == 1:
        logw = -((y - n) ** 2) / (2 * model.variance)  # independent of NoiseModel.log_pmf
    else:
        logw = model.log_pmf(y - n)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    cdf = np.cumsum(w)
    order = np.argsort(-w, kind="stable")
    k = int(np.argmax(np.cumsum(w[order]) >= 0.9))
    inside = n[w >= w[order][k] * (1 - 1e-9)]  # ties within round-off, as hpd_rows
    # equal-tailed: Q(p) = min{n : P(N <= n) >= p}, so that P(N < Q(0.05)) < 0.05, P(N > Q(0.95)) <= 0.05
    et = (int(n[np.argmax(cdf >= 0.05)]), int(n[np.argmax(cdf >= 0.95)]))
    return (float(w @ n), int(n[np.argmax(cdf >= 0.5)]), int(inside.min()), int(inside.max()), float(w[0]),
            *et)


MODELS = [
    NoiseModel.of(DG, 0.3),
    NoiseModel.of(DG, 4.0),
    NoiseModel.of(DG, 1709.4017094017095),
    NoiseModel.of(DG, 0.8, 2),
    NoiseModel.of(DG, 50.0, 2),
    NoiseModel.of(GEO, geometric_variance(0.4)),
    NoiseModel.of(GEO, geometric_variance(3.0)),
    NoiseModel.of(GEO, 2 * geometric_variance(5.0), 2),
]


# --------------------------------------------------------------------------------------------
# Exact pmfs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.05, 0.4, 1.0, 11.0, 1234.5])
def test_geometric_scale_is_recovered_from_the_reported_variance(scale: float) -> None:
    assert geometric_q(geometric_variance(scale)) == pytest.approx(math.exp(-1 / scale), rel=1e-12)


def _table(model: NoiseModel, half: int) -> np.ndarray:
    x = np.arange(-half, half + 1)
    lp = model.log_pmf(x)
    p = np.exp(lp - lp.max())
    return p / p.sum()


@pytest.mark.parametrize("distribution,part_variance", [(DG, 0.3), (DG, 2.0), (DG, 60.0),
                                                        (GEO, geometric_variance(0.5)),
                                                        (GEO, geometric_variance(4.0))])
def test_two_part_pmf_is_the_convolution_of_two_noises(distribution: str, part_variance: float) -> None:
    one = NoiseModel.of(distribution, part_variance)
    two = NoiseModel.of(distribution, 2 * part_variance, 2)
    half = one.table_half_width()
    p1 = _table(one, half)
    conv = np.convolve(p1, p1)  # support [-2 half, 2 half]
    inner = half // 2  # far from the truncated edges of the convolution
    direct = _table(two, 2 * half)
    sl = slice(2 * half - inner, 2 * half + inner + 1)
    big = conv[sl] > 1e-200
    np.testing.assert_allclose(direct[sl][big], conv[sl][big], rtol=1e-9)


def test_geometric_pmf_matches_its_definition() -> None:
    s = 2.5
    model = NoiseModel.of(GEO, geometric_variance(s))
    x = np.arange(-40, 41)
    expected = np.exp(-np.abs(x) / s)
    got = np.exp(model.log_pmf(x) - model.log_pmf(np.array([0]))[0])
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.distribution.name}-{m.variance:.3g}-{m.parts}")
def test_summation_window_ignores_less_than_the_bound(model: NoiseModel) -> None:
    post = posterior_for(model)
    half = post.half_width
    wide = _table(model, 4 * half + 50)
    centre = 4 * half + 50
    outside = wide[: centre - half].sum() + wide[centre + half + 1:].sum()
    assert outside <= pp.TAIL_BOUND / 2 * (1 + 1e-6)
    # and the window is not needlessly wide: one step in loses more than the bound allows
    if half > 0:
        assert wide[: centre - half + 1].sum() * 2 > pp.TAIL_BOUND / 2 * 0.5


# --------------------------------------------------------------------------------------------
# Posterior summaries and samples
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.distribution.name}-{m.variance:.3g}-{m.parts}")
def test_vectorized_summaries_equal_brute_force(model: NoiseModel) -> None:
    ys = np.array([-5000, -500, -40, -3, -1, 0, 1, 2, 5, 17, 40, 300, 10_000])
    s = posterior_for(model).summarize(ys)
    for i, y in enumerate(ys):
        mean, median, lower, upper, p0, et_lower, et_upper = brute_force(model, int(y))
        assert s.mean[i] == pytest.approx(mean, rel=1e-9, abs=1e-9), y
        assert (s.median[i], s.lower[i], s.upper[i]) == (median, lower, upper), y
        assert (s.et_lower[i], s.et_upper[i]) == (et_lower, et_upper), y
        assert s.p_zero[i] == pytest.approx(p0, abs=1e-12), y
        assert 0 <= s.lower[i] <= s.median[i] <= s.upper[i]
        assert s.mean[i] >= 0


def test_far_from_zero_the_interval_is_the_symmetric_moe() -> None:
    sigma2 = 14783.3
    post = posterior_for(NoiseModel.of(DG, sigma2))
    s = post.summarize([100_000, 250_000])
    half = s.upper - s.mean
    assert np.all(s.mean == [100_000, 250_000])
    assert np.all(s.mean - s.lower == half)
    assert abs(half[0] - 1.645 * math.sqrt(sigma2)) <= 1.0
    assert s.sd[0] == pytest.approx(math.sqrt(sigma2), rel=1e-3)


def test_negative_counts_give_intervals_starting_at_zero() -> None:
    s = posterior_for(NoiseModel.of(DG, 1709.4)).summarize([-300, -38, -1, 0])
    assert np.all(s.lower == 0)
    assert np.all(s.upper > 0)
    assert np.all(np.diff(s.mean) > 0)  # a lower count never gives a higher estimate
    assert np.all(np.diff(s.upper) >= 0)


def test_noiseless_cells_are_point_masses() -> None:
    post = Posterior(NoiseModel.of(DG, 0.0))
    s = post.summarize([0, 7, 123])
    assert list(s.mean) == [0, 7, 123] and list(s.lower) == [0, 7, 123] and list(s.upper) == [0, 7, 123]
    assert list(s.p_zero) == [1.0, 0.0, 0.0] and list(s.sd) == [0, 0, 0]
    draws = post.sample([0, 7], 5, np.random.default_rng(0))
    assert (draws == np.array([[0] * 5, [7] * 5])).all()
    with pytest.raises(pp.PostprocessError):
        post.summarize([-1])


@pytest.mark.parametrize("model", [MODELS[2], MODELS[4], MODELS[6], MODELS[7]],
                         ids=lambda m: f"{m.distribution.name}-{m.variance:.3g}-{m.parts}")
def test_samples_follow_the_posterior(model: NoiseModel) -> None:
    post = posterior_for(model)
    ys = np.array([-60, 0, 3, 25, post.half_width + 10])
    draws = post.sample(np.repeat(ys, 2), 20_000, np.random.default_rng(42))
    for i, y in enumerate(np.repeat(ys, 2)):
        sd = max(model.sd, 1)
        n = np.arange(0, max(y, 0) + int(40 * sd) + 100)
        lw = model.log_pmf(y - n)
        w = np.exp(lw - lw.max())
        cdf = np.cumsum(w / w.sum())
        emp = np.searchsorted(np.sort(draws[i]), n, side="right") / draws.shape[1]
        assert np.abs(emp - cdf).max() < 0.015, y  # KS distance; critical value ~0.0115 at 1%
        assert draws[i].min() >= 0


# --------------------------------------------------------------------------------------------
# Coverage by simulation (fast)
# --------------------------------------------------------------------------------------------


def test_stated_moe_covers_about_90_percent_of_the_noise() -> None:
    """The MOE of spec §6 (1.645 sigma) against OpenDP noise of production variances."""
    plan = plan_run(load_config(US_CONFIG))
    variances = sorted({m.variance for m in plan.measurements})
    covered = total = 0
    for v in variances[:3]:
        z = opendp_noise(DG, math.sqrt(v), 8000)
        covered += int((np.abs(z) <= 1.645 * math.sqrt(v)).sum())
        total += z.size
    assert 0.89 <= covered / total <= 0.91


def test_stated_moe_exact_coverage_for_every_production_measurement() -> None:
    """Exactly, from the noise pmf: the discreteness moves coverage by at most ~0.1 / sigma."""
    for config in (US_CONFIG, PR_CONFIG):
        for m in plan_run(load_config(config)).measurements:
            post = posterior_for(NoiseModel.of(m.distribution.value, m.variance))
            coverage = post.pmf[np.abs(post.x) <= m.moe90].sum()
            assert 0.897 <= coverage <= 0.91, (m.key, coverage)


def _count_coverage(distribution: str, scale: float, variance: float, truths: np.ndarray) -> float:
    y = truths + opendp_noise(distribution, scale, truths.size)
    s = posterior_for(NoiseModel.of(distribution, variance)).summarize(y)
    return float(((s.lower <= truths) & (truths <= s.upper)).mean())


def test_credible_intervals_cover_about_90_percent_fast() -> None:
    rng = np.random.default_rng(1)
    sigma = 10.0
    truths = np.concatenate([np.zeros(2000, np.int64), rng.integers(0, int(6 * sigma), 8000)])
    assert 0.88 <= _count_coverage(DG, sigma, sigma**2, truths) <= 0.95
    s = 4.0
    assert 0.88 <= _count_coverage(GEO, s, geometric_variance(s), truths) <= 0.95
    far = rng.integers(1000, 5000, 8000)
    assert 0.89 <= _count_coverage(DG, sigma, sigma**2, far) <= 0.915


def _average_frames(num_truth: np.ndarray, den_truth: np.ndarray, sigma: float, shell: str = "PH1",
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


def _households(rng: np.random.Generator, groups: int, lo: int, hi: int, tau: int = 10) -> tuple[np.ndarray, ...]:
    """Truncated truths of PH1 groups: households, persons under 18 and 18 and over (>= 1 adult
    per household, at most tau persons each)."""
    den = rng.integers(lo, hi, groups)
    kids = rng.binomial(den * 2, 0.3)
    adults = np.minimum(den + rng.binomial(den, 0.8), tau * den - kids)
    return den, kids, adults


def test_average_intervals_cover_about_90_percent_fast() -> None:
    rng = np.random.default_rng(3)
    den, kids, adults = _households(rng, 300, 1, 200)
    num, denom = _average_frames(np.stack([kids, adults], 1), den[:, None], 10.0)
    out = ratio_table(RATIO_SHELLS["PH1"], num, denom, {"PH1_num": 10}, rng=np.random.default_rng(4))
    truth = np.stack([(kids + adults) / den, kids / den, adults / den], 1).ravel()
    covered = (out["CI90_LOWER"] <= truth) & (truth <= out["CI90_UPPER"])
    # 900 intervals: binomial sd 0.01 around a coverage that is 0.90-0.92 here (slow test below)
    assert 0.87 <= covered.mean() <= 0.95
    assert (out["P_DENOMINATOR_POSITIVE"] > 0).all() and (out["METHOD"] == "exact").all()


# --------------------------------------------------------------------------------------------
# Averages: structure
# --------------------------------------------------------------------------------------------


def _noiseless(table: str, rows: list[tuple[str, int, int]]) -> pd.DataFrame:
    return pd.DataFrame({
        "REGION_ID": [r[0] for r in rows], "REGION_TYPE": "STATE", "ITERATION_CODE": "*",
        f"{table.upper()}_DATA_CELL": [r[1] for r in rows], "COUNT": [r[2] for r in rows],
        "NOISE_DISTRIBUTION": DG, "VARIANCE": 0.0,
    })


def test_ph8_total_is_built_from_its_parts_and_zero_denominators_give_no_ratio() -> None:
    num = _noiseless("PH8_num", [("01", 2, 300), ("01", 3, 100), ("02", 2, 0), ("02", 3, 50), ("03", 2, 9)])
    den = _noiseless("PH8_denom", [("01", 2, 100), ("01", 3, 25), ("02", 2, 0), ("02", 3, 20),
                                   ("03", 2, 3), ("03", 3, 1)])
    with pytest.raises(pp.PostprocessError, match="lacks a cell"):  # 03's numerator lacks cell 3
        ratio_table(RATIO_SHELLS["PH8"], num, den, {"PH7": 10})
    out = ratio_table(RATIO_SHELLS["PH8"], num.head(4), den.head(4), {"PH7": 10})
    out = out.set_index(["REGION_ID", "PH8_DATA_CELL"])
    assert out.loc[("01", 1), "ESTIMATE"] == pytest.approx(400 / 125)
    assert out.loc[("01", 2), "ESTIMATE"] == pytest.approx(3.0)
    assert out.loc[("01", 3), "ESTIMATE"] == pytest.approx(4.0)
    assert out.loc[("01", 1), "CI90_LOWER"] == out.loc[("01", 1), "CI90_UPPER"] == pytest.approx(3.2)
    assert out.loc[("02", 1), "ESTIMATE"] == pytest.approx(50 / 20)
    assert math.isnan(out.loc[("02", 2), "ESTIMATE"]) and out.loc[("02", 2), "P_DENOMINATOR_POSITIVE"] == 0
    assert out.loc[("02", 2), "METHOD"] == "undefined"
    assert out.loc[("02", 3), "ESTIMATE"] == pytest.approx(2.5)
    assert list(out.columns) == ["REGION_TYPE", "ITERATION_CODE", *pp.ratios.NOISY_COLUMNS, "NOISE_DISTRIBUTION",
                                 *pp.AVERAGE_COLUMNS]


def test_ph1_cells_share_the_denominator() -> None:
    num = _noiseless("PH1_num", [("01", 2, 30), ("01", 3, 70)])
    den = _noiseless("PH1_denom", [("01", 1, 40)])
    out = ratio_table(RATIO_SHELLS["PH1"], num, den, {"PH1_num": 10})
    assert list(out["PH1_DATA_CELL"]) == [1, 2, 3]
    assert list(out["ESTIMATE"]) == pytest.approx([2.5, 0.75, 1.75])
    assert list(out["DENOMINATOR_ESTIMATE"]) == [40, 40, 40]
    assert list(out["LOWER_BOUND"]) == [1, 0, 0] and list(out["UPPER_BOUND"]) == [10, 10, 10]


# --------------------------------------------------------------------------------------------
# The command on a real private output
# --------------------------------------------------------------------------------------------

STATES = ["01", "06"]
FAST_LIMIT = 2_000_000


@pytest.fixture(scope="module")
def private_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A published private output of synthetic data with the production (US) budgets; the
    input data is deleted afterwards, so nothing can read it."""
    from phsafe import synthetic
    from phsafe import run_private

    root = tmp_path_factory.mktemp("pp")
    data = root / "data"
    synthetic.write(synthetic.generate(1500, STATES, seed=11), data)
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    config = root / "config.json"
    config.write_text(json.dumps(raw))
    out = root / "out"
    run_private(config, data, out, ledger=root / "ledger.jsonl", non_confidential=True)
    shutil.rmtree(data)
    config.unlink()
    return out


def test_postprocess_writes_every_table_with_documented_columns(private_output: Path, tmp_path: Path) -> None:
    dest = tmp_path / "pp"
    # Nation-level averages beyond 2 million lattice points are sampled here (the lattices
    # themselves are tested against brute force in test_estimates.py): the test stays fast.
    result = pp.postprocess(private_output, dest, draws=200, seed=5, exact_limit=FAST_LIMIT)
    assert result.destination == dest
    for table in ("PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_num", "PH5_denom", "PH6", "PH7", "PH8_num",
                  "PH8_denom"):
        frame = pd.read_csv(dest / f"{table}.csv", sep="|", dtype={"REGION_ID": str})
        source = pd.read_csv(private_output / table / f"{table}.csv", sep="|", dtype={"REGION_ID": str})
        assert list(frame.columns) == list(source.columns) + list(pp.COUNT_COLUMNS)
        marginals = pp.shells.marginal_cells(table)
        groups = len(source.drop_duplicates([c for c in ("REGION_ID", "REGION_TYPE", "ITERATION_CODE") if c in source]))
        assert len(frame) == len(source) + groups * len(marginals)  # every released and marginal cell
        released = frame.merge(source, on=list(source.columns), how="inner")
        assert len(released) == len(source)
        assert (frame["CI90_LOWER"] >= 0).all() and (frame["ESTIMATE"] >= 0).all()
        assert (frame["CI90_LOWER"] <= frame["CI90_UPPER"]).all()
        parquet = pd.read_parquet(dest / f"{table}.parquet")
        assert list(parquet.columns) == list(frame.columns) and len(parquet) == len(frame)
    for name in ("PH1", "PH5", "PH8"):
        frame = pd.read_csv(dest / f"{name}.csv", sep="|", dtype={"REGION_ID": str})
        assert list(frame.columns) == [*pp.GROUP_KEYS, f"{name}_DATA_CELL", *pp.AVERAGE_COLUMNS]
        assert set(frame[f"{name}_DATA_CELL"]) == {1, 2, 3}
        ok = frame["ESTIMATE"].notna()
        assert ok.all()  # noisy denominators: always a posterior
        assert ((frame["CI90_LOWER"] <= frame["MEDIAN"]) & (frame["MEDIAN"] <= frame["CI90_UPPER"])).all()
        assert ((frame["LOWER_BOUND"] <= frame["ESTIMATE"]) & (frame["ESTIMATE"] <= frame["UPPER_BOUND"])).all()
        assert (frame["CI90_LOWER"] >= frame["LOWER_BOUND"]).all() and (frame["CI90_UPPER"] <= frame["UPPER_BOUND"]).all()
    meta = json.loads((dest / "postprocess.json").read_text())
    assert meta["seed"] == 5 and meta["draws"] == 200 and meta["source"]["run_id"]
    assert meta["tau"] == json.loads(US_CONFIG.read_text())["tau"]  # from the release's manifest
    assert "CI90_LOWER" in (dest / "README.md").read_text()
    # same seed, same results
    again = pp.postprocess(private_output, tmp_path / "pp2", draws=200, seed=5, exact_limit=FAST_LIMIT)
    assert (dest / "PH8.csv").read_bytes() == (again.destination / "PH8.csv").read_bytes()


def test_postprocess_never_reads_input_data(private_output: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the output directory is read: the data is gone, the reader fails if called, and an
    audit hook sees every file opened by Python."""
    import phsafe.reader

    def forbidden(*args, **kwargs):
        raise AssertionError("post-processing called the input reader")

    for name in ("read_inputs", "locate_inputs", "input_digests"):
        if hasattr(phsafe.reader, name):
            monkeypatch.setattr(phsafe.reader, name, forbidden)
    pp.postprocess(private_output, tmp_path / "warm", draws=20, seed=1, exact_limit=FAST_LIMIT)  # imports happen here
    opened: list[tuple[str, str]] = []
    active = [True]

    def hook(event: str, args: tuple) -> None:
        if active[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            writing = any(c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR))
            opened.append((os.path.abspath(path), "w" if writing else "r"))

    sys.addaudithook(hook)
    dest = tmp_path / "dest"
    try:
        pp.postprocess(private_output, dest, draws=20, seed=1, exact_limit=FAST_LIMIT)
    finally:
        active[0] = False
    root = private_output.resolve()
    dest = dest.resolve()

    def own_output(p: Path) -> bool:  # what postprocess wrote (read back to hash it), and fsyncs
        return (p == dest.parent or p.is_relative_to(dest)
                or any(part.startswith(".dest.partial-") for part in p.relative_to(dest.parent).parts[:1])
                if p.is_relative_to(dest.parent) else False)

    ignore = tuple(str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}) + ("/proc", "/sys", "/dev")
    reads = {Path(p).resolve() for p, m in opened if m == "r" and not p.startswith(ignore)}
    writes = {Path(p).resolve() for p, m in opened if m == "w"}
    assert any(p.is_relative_to(root) for p in reads), "the audit hook saw no read of the outputs"
    assert [p for p in reads if not (p.is_relative_to(root) or own_output(p))] == []
    assert writes and [p for p in writes if not own_output(p) or p == dest.parent] == []


def test_postprocess_command_takes_only_the_output_directory(private_output: Path, tmp_path: Path) -> None:
    from phsafe.cli import main

    command = main.commands["postprocess"]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    assert [a.name for a in arguments] == ["output"]
    dest = tmp_path / "cli"
    result = CliRunner().invoke(main, ["postprocess", str(private_output), "--dest", str(dest), "--draws", "50",
                                       "--seed", "3", "--exact-limit", str(FAST_LIMIT)])
    assert result.exit_code == 0, result.output
    assert (dest / "PH1.csv").is_file() and (dest / "PH1.parquet").is_file()
    again = CliRunner().invoke(main, ["postprocess", str(private_output), "--dest", str(dest)])
    assert again.exit_code == 1 and "already exists" in again.output


def test_postprocess_refuses_what_it_cannot_use(private_output: Path, tmp_path: Path) -> None:
    with pytest.raises(pp.PostprocessError, match="outside the output directory"):
        pp.postprocess(private_output, private_output / "pp")
    with pytest.raises(pp.PostprocessError, match="does not exist"):
        pp.postprocess(tmp_path / "missing", tmp_path / "x")
    nonprivate = tmp_path / "np" / "PH2"
    nonprivate.mkdir(parents=True)
    (nonprivate / "PH2.csv").write_text("REGION_ID|REGION_TYPE|PH2_DATA_CELL|COUNT\n1|USA|1|5\n")
    with pytest.raises(pp.PostprocessError, match="not a private output"):
        pp.postprocess(tmp_path / "np", tmp_path / "y")
    tampered = tmp_path / "tampered"
    shutil.copytree(private_output, tampered)
    with open(tampered / "PH2" / "PH2.csv", "a") as fh:
        fh.write("\n")
    with pytest.raises(pp.PostprocessError, match="SHA-256"):
        pp.postprocess(tampered, tmp_path / "z")
    assert not (tmp_path / "z").exists()


def test_many_rows_are_summarized_at_once() -> None:
    rng = np.random.default_rng(0)
    n = 60_000
    frame = pd.DataFrame({
        "REGION_ID": "1", "REGION_TYPE": "STATE", "ITERATION_CODE": "*", "PH3_DATA_CELL": 2,
        "COUNT": rng.integers(-800, 20_000, n), "NOISE_DISTRIBUTION": DG,
        "VARIANCE": rng.choice([1709.4017094017095, 90909.09090909091, 14783.3], n),
    })
    out = pp.summarize_table(frame, "PH3")
    for i in rng.choice(n, 25, replace=False):
        model = NoiseModel.of(DG, frame["VARIANCE"][i])
        mean, median, lower, upper, _, et_lower, et_upper = brute_force(model, int(frame["COUNT"][i]))
        assert out["ESTIMATE"][i] == pytest.approx(mean, rel=1e-9)
        assert (out["CI90_LOWER"][i], out["CI90_UPPER"][i]) == (lower, upper)
        assert (out["CI90_ET_LOWER"][i], out["CI90_ET_UPPER"][i]) == (et_lower, et_upper)


# --------------------------------------------------------------------------------------------
# Full simulations (slow)
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_moe_coverage_full_simulation() -> None:
    """OpenDP noise at every distinct production variance (zCDP) and at pure-DP scales."""
    results = {}
    for config in (US_CONFIG,):
        for v in sorted({m.variance for m in plan_run(load_config(config)).measurements}):
            z = opendp_noise(DG, math.sqrt(v), 30_000)
            results[f"DG sigma={math.sqrt(v):.1f}"] = float((np.abs(z) <= 1.645 * math.sqrt(v)).mean())
    for s in (2.0, 10.0, 55.0):
        v = geometric_variance(s)
        z = opendp_noise(GEO, s, 30_000)
        results[f"geometric s={s}"] = float((np.abs(z) <= 1.645 * math.sqrt(v)).mean())
    print(results)
    for key, cov in results.items():
        assert 0.888 <= cov <= 0.915, (key, cov)  # exact values 0.8975-0.9083, SE 0.0017


@pytest.mark.slow
def test_credible_interval_coverage_full_simulation() -> None:
    """Count intervals for truths spread over the range where the boundary at 0 matters, and far
    from it, for the discrete Gaussian (one and two parts) and the geometric."""
    rng = np.random.default_rng(7)
    results = {}
    for distribution, scale, variance, parts in ((DG, 41.345, 41.345**2, 1), (DG, 3.0, 9.0, 1), (GEO, 12.0, geometric_variance(12.0), 1),
                                                 (DG, 41.345, 2 * 41.345**2, 2)):
        sd = math.sqrt(variance)
        truths = np.concatenate([np.zeros(6000, np.int64), rng.integers(0, int(4 * sd) + 1, 24_000),
                                 rng.integers(int(6 * sd), int(40 * sd), 10_000)])
        noise = opendp_noise(distribution, scale, truths.size * parts).reshape(parts, -1).sum(0)
        y = truths + noise
        post = posterior_for(NoiseModel.of(distribution, variance, parts))
        s = post.summarize(y)
        hit = (s.lower <= truths) & (truths <= s.upper)
        # Far from 0 the interval is y +- h: its coverage is exactly P(|Z| <= h) >= 0.9 (more
        # for a small sigma, where the integers are coarse).
        lo, hi = pp.hpd_rows(post.pmf)
        exact_far = float(post.pmf[lo[0]: hi[0] + 1].sum())
        key = f"{distribution} scale={scale} parts={parts}"
        results[key] = (float(hit.mean()), float(hit[:6000].mean()), float(hit[6000:30_000].mean()),
                        float(hit[30_000:].mean()), exact_far)
    print(results)
    for key, (pooled, zero, near, far, exact_far) in results.items():
        assert 0.89 <= pooled <= 0.95, (key, pooled)
        assert zero >= 0.89, (key, zero)
        assert 0.88 <= near <= 0.96, (key, near)
        assert 0.9 <= exact_far <= 0.94 and abs(far - exact_far) <= 0.012, (key, far, exact_far)


@pytest.mark.slow
def test_average_coverage_full_simulation() -> None:
    """The averages' 90% equal-tailed intervals on 1,500 groups (4,500 intervals), small and large
    households counts, sigma 41 (the production's state-level PH1 sigma is 122)."""
    rng = np.random.default_rng(9)
    groups, sigma = 1500, 41.345
    den = np.concatenate([rng.integers(1, 50, groups // 2), rng.integers(50, 3000, groups // 2)])
    kids = rng.binomial(den * 2, 0.3)
    adults = np.minimum(den + rng.binomial(den, 0.8), 10 * den - kids)
    num, denom = _average_frames(np.stack([kids, adults], 1), den[:, None], sigma)
    out = ratio_table(RATIO_SHELLS["PH1"], num, denom, {"PH1_num": 10}, rng=np.random.default_rng(10))
    truth = np.stack([(kids + adults) / den, kids / den, adults / den], 1).ravel()
    covered = ((out["CI90_LOWER"] <= truth) & (truth <= out["CI90_UPPER"])).to_numpy()
    small = np.repeat(den < 50, 3)
    print({"pooled": covered.mean(), "small denominators": covered[small].mean(), "large": covered[~small].mean()})
    assert 0.88 <= covered.mean() <= 0.94
    assert 0.87 <= covered[~small].mean() <= 0.94
