"""Empirical accuracy of the private algorithm on synthetic or otherwise non-confidential data.

:func:`run_accuracy` runs the private algorithm ``trials`` times on the same data and compares
every released cell with the truth, using only the public engine API
(:func:`phsafe.sequence.run_private`, :func:`phsafe.engine.run_nonprivate`):

* truth: one non-private run (no truncation, no noise) -- ``OUT/truth/``;
* trial t: one private run with the config as given -- ``OUT/trials/NNN/`` -- and one with the
  same truncation key and every positive budget replaced by ``Infinity`` -- ``OUT/truncated/NNN/``
  -- whose output is the exact *truncated* count of every released cell (no noise). Each trial
  gets a fresh random truncation key, so the truncation error is sampled too;
* optionally (default) :func:`phsafe.postprocess.postprocess` on each trial --
  ``OUT/postprocessed/NNN/`` -- to measure the coverage of its credible intervals.

Every run is recorded as non-confidential (the lifetime cap is not enforced for such runs, and
Infinity budgets are allowed only for them) in ``OUT/ledgers/NNN.jsonl``, one ledger per trial
holding its two runs. The command refuses to
start -- spending nothing, writing nothing -- unless the caller states that the data is not
confidential: it publishes ``2 * trials`` full releases of the same data.

Metrics, per output table x population-group level, pooled over cells and trials (errors are
released COUNT minus the reference; MOE = 1.645 sqrt(VARIANCE), as
:attr:`phsafe.accounting.PlannedMeasurement.moe90`):

* ``MAE``, ``RMSE``, ``P90_ABS_ERROR``: total error against the untruncated truth;
* ``MOE_COVERAGE``: share of cells with |COUNT - truncated exact| <= MOE -- what the stated MOE
  claims (it covers the noise only); ``MOE_COVERAGE_VS_TRUTH``: the same against the truth;
* ``EXPECTED_NOISE_MAE``: E|noise| from the exact noise pmf, for comparison with ``MAE``;
* ``TRUNCATION_MAE``, ``TRUNCATION_MAX_ABS``, ``TRUNCATION_SHARE``: the truncation error on its
  own, truncated exact counts against the truth (mean, max, share of cells affected);
* with post-processing: ``CI90_COVERAGE`` (credible interval contains the truncated exact
  count), ``CI90_COVERAGE_VS_TRUTH``, ``CI90_MEAN_WIDTH``, ``ESTIMATE_MAE`` (posterior mean
  against the truth); and for the averages PH1, PH5, PH8 the same against the exact ratios;
* with post-processing and ``compare_production``: our Census-layout estimate files against the
  Census Bureau's production method on the same noisy tables -- coverage of the 90% intervals,
  mean interval length, share outside the logical bounds, share the production could not fit
  (:mod:`phsafe.accuracy.comparison`, :mod:`phsafe.accuracy.production`) -- in
  ``comparison.csv``, ``comparison_side_by_side.csv`` and the report.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from phsafe.errors import ConfidentialityNotConfirmed, PHSafeError
from phsafe.logs import get_logger
from phsafe.outputs import CSV_SEPARATOR, cell_column
from phsafe.postprocess import (
    GROUP_KEYS,
    RATIO_SHELLS,
    NoiseModel,
    cell_parts,
    posterior_for,
    postprocess,
    read_private_outputs,
)
from phsafe.accuracy.comparison import (
    COMPARISON_COLUMNS,
    compare_trial,
    comparison_metrics,
    read_estimate_files,
    side_by_side,
    truncated_truth,
)
from phsafe.accuracy.levels import COVERAGE_INTERVAL, coverage_interval, level_of, level_order
from phsafe.accuracy.production import production_files
from phsafe.tables import OUTPUT_TABLES

if TYPE_CHECKING:
    from phsafe.progress import Progress

log = get_logger("phsafe.accuracy")

MOE_Z = 1.645
"""The z of the stated 90% margin of error (spec §6, :mod:`phsafe.accounting`)."""
NOMINAL = 0.90
KEYS = [*GROUP_KEYS, "CELL"]
DEFAULT_TRIALS = 20
DEFAULT_ACCURACY_DRAWS = 2000

METRIC_COLUMNS = (
    "TABLE", "LEVEL", "NOISE_DISTRIBUTION", "CELLS", "TRIALS", "MEAN_MOE", "MAE", "RMSE", "P90_ABS_ERROR",
    "EXPECTED_NOISE_MAE", "MOE_COVERAGE", "MOE_COVERAGE_LOW", "MOE_COVERAGE_HIGH", "MOE_COVERAGE_VS_TRUTH",
    "TRUNCATION_MAE",
    "TRUNCATION_MAX_ABS", "TRUNCATION_SHARE", "CI90_COVERAGE", "CI90_COVERAGE_VS_TRUTH", "CI90_MEAN_WIDTH",
    "ESTIMATE_MAE",
)
AVERAGE_METRIC_COLUMNS = (
    "TABLE", "LEVEL", "CELLS", "TRIALS", "UNDEFINED", "MAE", "P90_ABS_ERROR", "CI90_COVERAGE", "CI90_COVERAGE_LOW",
    "CI90_COVERAGE_HIGH", "CI90_COVERAGE_VS_TRUTH", "CI90_MEAN_WIDTH", "MEAN_P_DENOMINATOR_POSITIVE",
)


@dataclass
class AccuracyResult:
    """What :func:`run_accuracy` produced.

    Attributes:
        output_dir: The experiment directory.
        metrics: Per table x level metrics (:data:`METRIC_COLUMNS`).
        average_metrics: Per average table x level metrics (empty without post-processing).
        comparison: Our estimate files against the production's method, per table x level x
            method (:data:`phsafe.accuracy.comparison.COMPARISON_COLUMNS`; empty without it).
        files: Report files written (relative to ``output_dir``).
        seconds: Wall time.
    """

    output_dir: Path
    metrics: pd.DataFrame
    average_metrics: pd.DataFrame
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    comparison: pd.DataFrame = field(default_factory=pd.DataFrame)


# --------------------------------------------------------------------------------------------
# Configs and levels
# --------------------------------------------------------------------------------------------


def noiseless_config(config_path: Path, destination: Path) -> Path:
    """Write a copy of the config whose every positive budget is ``Infinity`` (no noise).

    Levels with budget 0 stay 0 (not measured), so both runs release the same cells. Allowed
    only for non-confidential data (the engine enforces it).
    """
    raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
    budgets = raw.get("privacy_budget")
    if isinstance(budgets, dict):
        for levels in budgets.values():
            if isinstance(levels, dict):
                for key, value in levels.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                        levels[key] = math.inf
    destination.write_text(json.dumps(raw, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    return destination


def _read_nonprivate(directory: Path, table: str) -> pd.DataFrame | None:
    path = directory / table / f"{table}.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path, sep=CSV_SEPARATOR, dtype=str, keep_default_na=False)
    if "ITERATION_CODE" not in frame:
        frame.insert(2, "ITERATION_CODE", "*")
    frame = frame.rename(columns={cell_column(table): "CELL"})
    frame["CELL"] = frame["CELL"].astype(np.int64)
    frame["COUNT"] = frame["COUNT"].astype(np.int64)
    return frame[[*KEYS, "COUNT"]]


def _private_long(directory: Path) -> dict[str, pd.DataFrame]:
    tables, _ = read_private_outputs(directory)
    return {t: f.rename(columns={cell_column(t): "CELL"}) for t, f in tables.items()}


def _noise_abs_mean(frame: pd.DataFrame, table: str) -> np.ndarray:
    """E|noise| of each row, exactly from its noise model."""
    parts = cell_parts(table, frame["CELL"].to_numpy())
    out = np.zeros(len(frame))
    keys = pd.DataFrame({"d": frame["NOISE_DISTRIBUTION"], "v": frame["VARIANCE"], "k": parts})
    for (d, v, k), idx in keys.groupby(["d", "v", "k"]).groups.items():
        if v > 0:
            out[frame.index.get_indexer(idx)] = posterior_for(NoiseModel.of(d, v, int(k))).noise_abs_mean
    return out


def _exact_ratios(counts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Exact averages (numerator / denominator, NaN where the denominator is 0) from count tables
    holding KEYS + COUNT (cells missing from a table count 0)."""
    parts = []
    for spec in RATIO_SHELLS.values():
        if spec.numerator not in counts or spec.denominator not in counts:
            continue
        num = counts[spec.numerator].pivot_table(index=list(GROUP_KEYS), columns="CELL", values="COUNT", aggfunc="sum")
        den = counts[spec.denominator].pivot_table(index=list(GROUP_KEYS), columns="CELL", values="COUNT", aggfunc="sum")
        groups = num.index.intersection(den.index)
        for cell, ncells, dcells in spec.cells:
            top = num.reindex(index=groups, columns=list(ncells)).fillna(0).sum(axis=1)
            bottom = den.reindex(index=groups, columns=list(dcells)).fillna(0).sum(axis=1)
            ratio = (top / bottom.where(bottom > 0)).rename("RATIO").reset_index()
            ratio["TABLE"], ratio["CELL"] = spec.name, cell
            parts.append(ratio)
    if not parts:
        return pd.DataFrame(columns=["TABLE", *KEYS, "RATIO"])
    return pd.concat(parts, ignore_index=True)[["TABLE", *KEYS, "RATIO"]]


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------


def run_accuracy(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    *,
    trials: int = DEFAULT_TRIALS,
    non_confidential: bool = False,
    with_postprocess: bool = True,
    draws: int = DEFAULT_ACCURACY_DRAWS,
    seed: int | None = None,
    plots: bool = True,
    overwrite: bool = False,
    compare_production: bool = True,
    progress: "Progress | None" = None,
) -> AccuracyResult:
    """Run the accuracy experiment (see the module docstring) and write its report.

    Args:
        config_path: The config of the private runs.
        data_dir: Synthetic or otherwise non-confidential input data.
        output_dir: New (or empty) directory for every run, the ledger and the report.
        trials: Number of private runs (K >= 1).
        non_confidential: The caller's statement that the data is not confidential. Without it
            nothing is run, spent or written.
        with_postprocess: Post-process each trial and measure credible-interval coverage.
        draws: Posterior draws per cell for the averages (post-processing).
        seed: Seed of the post-processing simulations (trial t uses seed + t); random if None.
        plots: Write the PNG plots (matplotlib).
        overwrite: Empty an ``output_dir`` that already holds files (otherwise it is refused).
        compare_production: With post-processing, also estimate every trial by the Census
            Bureau's production method (:mod:`phsafe.accuracy.production`) and compare the two
            (:mod:`phsafe.accuracy.comparison`).
        progress: Where to report the stages and the trials (:mod:`phsafe.progress`).

    Raises:
        ConfidentialityNotConfirmed: ``non_confidential`` is not True.
        PHSafeError: Bad config or data (from the engine), or the output directory holds files
            and ``overwrite`` is not set.
    """
    if non_confidential is not True:
        raise ConfidentialityNotConfirmed(
            "the accuracy experiment publishes many private releases of the same data and is for "
            "synthetic or otherwise non-confidential data only; confirm with --non-confidential"
        )
    if trials < 1:
        raise PHSafeError("--trials must be at least 1")
    from phsafe._plots import report_folder
    from phsafe.api import run_private
    from phsafe.engine import run_nonprivate
    from phsafe.progress import NULL
    from phsafe.truncation import TRUNCATION_KEY_BYTES

    progress = progress or NULL
    started = time.perf_counter()
    output_dir = report_folder(Path(output_dir).absolute(), overwrite=overwrite)
    noiseless = noiseless_config(Path(config_path), output_dir / "config-noiseless.json")
    if seed is None:
        seed = secrets.randbits(62)

    with progress.stage("truth: non-private run"):
        run_nonprivate(Path(config_path), Path(data_dir), output_dir / "truth", non_confidential=True)
        truth = {t: f for t in OUTPUT_TABLES if (f := _read_nonprivate(output_dir / "truth", t)) is not None}
        truth_ratios = _exact_ratios(truth)

    cells: list[pd.DataFrame] = []
    averages: list[pd.DataFrame] = []
    compared: list[pd.DataFrame] = []
    for folder in ("trials", "truncated"):  # a private run publishes into an existing folder
        (output_dir / folder).mkdir(exist_ok=True)
    with progress.stage("private runs and their truncated exact counts"), \
            progress.task("trials", total=trials, unit="trials") as task:
        for trial in range(1, trials + 1):
            name = f"{trial:03d}"
            key = secrets.token_hex(TRUNCATION_KEY_BYTES)
            # One ledger per trial (both of its runs): every spend is recorded, and appends stay
            # cheap -- appending to one ledger of 2K runs costs time that grows with its size.
            options = dict(ledger=output_dir / "ledgers" / f"{name}.jsonl", non_confidential=True, truncation_key=key)
            task.update(trial - 1, item=f"trial {trial}: private run")
            run_private(Path(config_path), Path(data_dir), output_dir / "trials" / name, **options)
            task.update(trial - 1, item=f"trial {trial}: truncated exact counts")
            run_private(noiseless, Path(data_dir), output_dir / "truncated" / name, **options)
            noisy = _private_long(output_dir / "trials" / name)
            exact = _private_long(output_dir / "truncated" / name)
            post = None
            if with_postprocess:
                task.update(trial - 1, item=f"trial {trial}: post-processing")
                result = postprocess(output_dir / "trials" / name, output_dir / "postprocessed" / name,
                                     draws=draws, seed=seed + trial)
                post = result.destination
            cells.append(_trial_cells(trial, noisy, exact, truth, post))
            if post is not None:
                exact_ratios = _exact_ratios({t: f[[*KEYS, "COUNT"]] for t, f in exact.items()})
                averages.append(_trial_averages(trial, post, exact_ratios, truth_ratios))
                if compare_production:
                    task.update(trial - 1, item=f"trial {trial}: the production's method")
                    tables, facts = read_private_outputs(output_dir / "trials" / name)
                    theirs = production_files(tables, np.random.default_rng([seed, trial]))
                    compared.append(compare_trial(trial, read_estimate_files(post), theirs,
                                                  truncated_truth(exact, exact_ratios), facts.get("tau") or {}))
            task.update(trial, item="")

    with progress.stage("metrics, plots and report"):
        frame = pd.concat(cells, ignore_index=True)
        avg = pd.concat(averages, ignore_index=True) if averages else pd.DataFrame()
        metrics = table_metrics(frame)
        average_metrics = average_table_metrics(avg) if len(avg) else pd.DataFrame(columns=AVERAGE_METRIC_COLUMNS)
        rows = pd.concat(compared, ignore_index=True) if compared else pd.DataFrame()
        comparison = comparison_metrics(rows) if len(rows) else pd.DataFrame(columns=list(COMPARISON_COLUMNS))
        seconds = time.perf_counter() - started
        files = write_report(output_dir, frame, avg, metrics, average_metrics, config_path=Path(config_path),
                             data_dir=Path(data_dir), trials=trials, seconds=seconds, plots=plots,
                             with_postprocess=with_postprocess, draws=draws, seed=seed, comparison=comparison,
                             comparison_rows=rows)
    log.info("accuracy report written", output=str(output_dir), trials=trials, seconds=round(seconds, 1))
    return AccuracyResult(output_dir, metrics, average_metrics, files, seconds, comparison)


def _trial_cells(
    trial: int,
    noisy: dict[str, pd.DataFrame],
    exact: dict[str, pd.DataFrame],
    truth: dict[str, pd.DataFrame],
    post: Path | None,
) -> pd.DataFrame:
    """One row per released cell of one trial: released, truncated exact and true counts."""
    parts = []
    for table, frame in noisy.items():
        rows = frame[[*KEYS, "COUNT", "NOISE_DISTRIBUTION", "VARIANCE"]].copy()
        rows["EXPECTED_ABS_NOISE"] = _noise_abs_mean(rows, table)
        ex = exact[table][[*KEYS, "COUNT"]].rename(columns={"COUNT": "TRUNCATED"})
        rows = rows.merge(ex, on=KEYS, how="left", validate="one_to_one")
        if rows["TRUNCATED"].isna().any():
            raise PHSafeError(f"{table}: the noiseless run released other cells than the private run")
        tr = truth.get(table)
        if tr is not None:
            rows = rows.merge(tr.rename(columns={"COUNT": "TRUTH"}), on=KEYS, how="left", validate="one_to_one")
            rows["TRUTH"] = rows["TRUTH"].fillna(0)  # spec §7: a missing row is a count of 0
        else:
            rows["TRUTH"] = 0
        if post is not None:
            pp = pd.read_csv(post / f"{table}.csv", sep=CSV_SEPARATOR, dtype={"REGION_ID": str}, keep_default_na=False)
            if "ITERATION_CODE" not in pp:
                pp.insert(2, "ITERATION_CODE", "*")
            pp = pp.rename(columns={cell_column(table): "CELL"})[[*KEYS, "ESTIMATE", "CI90_LOWER", "CI90_UPPER"]]
            pp["ITERATION_CODE"] = pp["ITERATION_CODE"].astype(str)
            rows = rows.merge(pp, on=KEYS, how="left", validate="one_to_one")
        rows.insert(0, "TABLE", table)
        parts.append(rows)
    out = pd.concat(parts, ignore_index=True)
    out.insert(0, "TRIAL", trial)
    out["LEVEL"] = level_of(out["REGION_TYPE"], out["ITERATION_CODE"])
    for col in ("TRUNCATED", "TRUTH"):
        out[col] = out[col].astype(np.int64)
    return out


def _trial_averages(trial: int, post: Path, exact: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    parts = []
    for name in RATIO_SHELLS:
        path = post / f"{name}.csv"
        if not path.is_file():
            continue
        pp = pd.read_csv(path, sep=CSV_SEPARATOR, dtype={"REGION_ID": str, "ITERATION_CODE": str},
                         keep_default_na=False, na_values=[""])
        pp = pp.rename(columns={f"{name}_DATA_CELL": "CELL"})
        pp.insert(0, "TABLE", name)
        parts.append(pp)
    if not parts:
        return pd.DataFrame()
    frame = pd.concat(parts, ignore_index=True)
    frame = frame.merge(exact.rename(columns={"RATIO": "TRUNCATED_RATIO"}), on=["TABLE", *KEYS], how="left")
    frame = frame.merge(truth.rename(columns={"RATIO": "TRUE_RATIO"}), on=["TABLE", *KEYS], how="left")
    frame.insert(0, "TRIAL", trial)
    frame["LEVEL"] = level_of(frame["REGION_TYPE"], frame["ITERATION_CODE"])
    return frame


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def table_metrics(cells: pd.DataFrame) -> pd.DataFrame:
    """Per table x level metrics (:data:`METRIC_COLUMNS`) from the per-cell rows of all trials,
    plus an ``ALL``/``ALL`` row pooling everything."""
    c = cells.copy()
    c["ERR"] = (c["COUNT"] - c["TRUTH"]).astype(np.float64)
    c["ABS"] = c["ERR"].abs()
    c["MOE"] = MOE_Z * np.sqrt(c["VARIANCE"])
    c["COVERED"] = (c["COUNT"] - c["TRUNCATED"]).abs() <= c["MOE"]
    c["COVERED_TRUTH"] = c["ABS"] <= c["MOE"]
    c["TRUNC_ABS"] = (c["TRUNCATED"] - c["TRUTH"]).abs()
    post = "CI90_LOWER" in c
    if post:
        c["CI_COVERED"] = (c["CI90_LOWER"] <= c["TRUNCATED"]) & (c["TRUNCATED"] <= c["CI90_UPPER"])
        c["CI_COVERED_TRUTH"] = (c["CI90_LOWER"] <= c["TRUTH"]) & (c["TRUTH"] <= c["CI90_UPPER"])
        c["CI_WIDTH"] = c["CI90_UPPER"] - c["CI90_LOWER"]
        c["EST_ABS"] = (c["ESTIMATE"] - c["TRUTH"]).abs()

    def summarize(g: pd.DataFrame) -> dict:
        n = len(g)
        cov = float(g["COVERED"].mean())
        low, high = coverage_interval(int(g["COVERED"].sum()), n)
        row = {
            "NOISE_DISTRIBUTION": ", ".join(sorted(g["NOISE_DISTRIBUTION"].unique())),
            "CELLS": int(n // g["TRIAL"].nunique()),
            "TRIALS": int(g["TRIAL"].nunique()),
            "MEAN_MOE": float(g["MOE"].mean()),
            "MAE": float(g["ABS"].mean()),
            "RMSE": float(np.sqrt((g["ERR"] ** 2).mean())),
            "P90_ABS_ERROR": float(np.quantile(g["ABS"], 0.9)),
            "EXPECTED_NOISE_MAE": float(g["EXPECTED_ABS_NOISE"].mean()),
            "MOE_COVERAGE": cov,
            "MOE_COVERAGE_LOW": low,
            "MOE_COVERAGE_HIGH": high,
            "MOE_COVERAGE_VS_TRUTH": float(g["COVERED_TRUTH"].mean()),
            "TRUNCATION_MAE": float(g["TRUNC_ABS"].mean()),
            "TRUNCATION_MAX_ABS": int(g["TRUNC_ABS"].max()),
            "TRUNCATION_SHARE": float((g["TRUNC_ABS"] > 0).mean()),
        }
        if post:
            row.update({
                "CI90_COVERAGE": float(g["CI_COVERED"].mean()),
                "CI90_COVERAGE_VS_TRUTH": float(g["CI_COVERED_TRUTH"].mean()),
                "CI90_MEAN_WIDTH": float(g["CI_WIDTH"].mean()),
                "ESTIMATE_MAE": float(g["EST_ABS"].mean()),
            })
        return row

    rows = []
    table_rank = {t: i for i, t in enumerate(OUTPUT_TABLES)}
    for (table, level), g in c.groupby(["TABLE", "LEVEL"], sort=False):
        rows.append({"TABLE": table, "LEVEL": level, **summarize(g)})
    out = pd.DataFrame(rows)
    out = out.sort_values(by=["TABLE", "LEVEL"], key=lambda s: s.map(table_rank) if s.name == "TABLE" else level_order(s))
    out = pd.concat([out, pd.DataFrame([{"TABLE": "ALL", "LEVEL": "ALL", **summarize(c)}])], ignore_index=True)
    out["CELLS"] = out["CELLS"].astype(np.int64)
    return out.reindex(columns=list(METRIC_COLUMNS))


def average_table_metrics(avg: pd.DataFrame) -> pd.DataFrame:
    """Per average table x level metrics (:data:`AVERAGE_METRIC_COLUMNS`), pooled over trials;
    cells whose exact (truncated) denominator is 0 have no defined average and are counted in
    ``UNDEFINED`` only."""
    rows = []

    def summarize(g: pd.DataFrame) -> dict:
        defined = g[g["TRUNCATED_RATIO"].notna() & g["ESTIMATE"].notna()]
        n = len(defined)
        covered = (defined["CI90_LOWER"] <= defined["TRUNCATED_RATIO"]) & (defined["TRUNCATED_RATIO"] <= defined["CI90_UPPER"])
        with_truth = defined[defined["TRUE_RATIO"].notna()]
        covered_truth = (with_truth["CI90_LOWER"] <= with_truth["TRUE_RATIO"]) & (with_truth["TRUE_RATIO"] <= with_truth["CI90_UPPER"])
        abs_err = (with_truth["ESTIMATE"] - with_truth["TRUE_RATIO"]).abs()
        cov = float(covered.mean()) if n else math.nan
        low, high = coverage_interval(int(covered.sum()), n)
        return {
            "CELLS": int(len(g) // max(g["TRIAL"].nunique(), 1)),
            "TRIALS": int(g["TRIAL"].nunique()),
            "UNDEFINED": int(len(g) - n),
            "MAE": float(abs_err.mean()) if len(abs_err) else math.nan,
            "P90_ABS_ERROR": float(np.quantile(abs_err, 0.9)) if len(abs_err) else math.nan,
            "CI90_COVERAGE": cov,
            "CI90_COVERAGE_LOW": low,
            "CI90_COVERAGE_HIGH": high,
            "CI90_COVERAGE_VS_TRUTH": float(covered_truth.mean()) if len(with_truth) else math.nan,
            "CI90_MEAN_WIDTH": float((defined["CI90_UPPER"] - defined["CI90_LOWER"]).mean()) if n else math.nan,
            "MEAN_P_DENOMINATOR_POSITIVE": float(g["P_DENOMINATOR_POSITIVE"].mean()),
        }

    for (table, level), g in avg.groupby(["TABLE", "LEVEL"], sort=False):
        rows.append({"TABLE": table, "LEVEL": level, **summarize(g)})
    out = pd.DataFrame(rows)
    out = out.sort_values(by=["TABLE", "LEVEL"], key=lambda s: s if s.name == "TABLE" else level_order(s))
    out = pd.concat([out, pd.DataFrame([{"TABLE": "ALL", "LEVEL": "ALL", **summarize(avg)}])], ignore_index=True)
    return out.reindex(columns=list(AVERAGE_METRIC_COLUMNS))


# --------------------------------------------------------------------------------------------
# Plots and report
# --------------------------------------------------------------------------------------------


def _labels(metrics: pd.DataFrame) -> list[str]:
    return [f"{t} {lv}" for t, lv in zip(metrics["TABLE"], metrics["LEVEL"])]


def _margins(fig, height: float) -> None:
    """Fixed margins for a figure with table x level labels on the y axis (``tight_layout``
    measures every label and takes seconds per figure)."""
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.9 / height, top=1 - 0.45 / height)


def _interval_bars(frame: pd.DataFrame, column: str) -> np.ndarray:
    """matplotlib's asymmetric error bars (below, above) of a coverage and its interval."""
    value = frame[column].to_numpy(dtype=float)
    low = frame[f"{column}_LOW"].to_numpy(dtype=float)
    high = frame[f"{column}_HIGH"].to_numpy(dtype=float)
    return np.nan_to_num(np.vstack([value - low, high - value]), nan=0.0)


def _plots(directory: Path, cells: pd.DataFrame, avg: pd.DataFrame, metrics: pd.DataFrame,
           average_metrics: pd.DataFrame) -> list[str]:
    """Write the PNG plots; returns their paths relative to the report directory."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    per = metrics[metrics["TABLE"] != "ALL"].reset_index(drop=True)
    labels = _labels(per)
    y = np.arange(len(per))
    height = max(4.0, 0.22 * len(per) + 1.5)

    # 1. Coverage of the stated MOE (and of the credible intervals) per table x level.
    fig, ax = plt.subplots(figsize=(8, height))
    ax.errorbar(per["MOE_COVERAGE"], y, xerr=_interval_bars(per, "MOE_COVERAGE"), fmt="o", ms=4,
                label="MOE vs truncated exact (noise only)")
    ax.plot(per["MOE_COVERAGE_VS_TRUTH"], y, "x", ms=5, label="MOE vs untruncated truth")
    if per["CI90_COVERAGE"].notna().any():
        ax.plot(per["CI90_COVERAGE"], y + 0.25, "s", ms=3.5, mfc="none", label="90% credible interval vs truncated exact")
    ax.axvline(NOMINAL, color="k", lw=0.8, ls="--")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"empirical coverage (bars: {COVERAGE_INTERVAL:.0%} Wilson score intervals)")
    ax.set_xlim(min(0.5, float(np.nanmin(per[["MOE_COVERAGE_LOW", "MOE_COVERAGE_VS_TRUTH"]].to_numpy())) - 0.02), 1.01)
    ax.set_title("Coverage of the stated 90% margin of error")
    ax.legend(fontsize=7, loc="lower left")
    _margins(fig, height)
    fig.savefig(directory / "coverage.png", dpi=100)
    plt.close(fig)
    written.append("coverage.png")

    # 2. Mean absolute error: total, noise expectation, truncation alone.
    fig, ax = plt.subplots(figsize=(8, height))
    w = 0.27
    floor = 1e-2  # log scale: zeros drawn at the floor
    ax.barh(y - w, np.maximum(per["MAE"], floor), w, label="MAE vs truth (observed)")
    ax.barh(y, np.maximum(per["EXPECTED_NOISE_MAE"], floor), w, label="E|noise| (exact)")
    ax.barh(y + w, np.maximum(per["TRUNCATION_MAE"], floor), w, label="truncation error alone (MAE)")
    ax.set_xscale("log")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("mean absolute error (persons or units; values below 0.01 drawn at 0.01)")
    ax.set_title("Mean absolute error per table and level")
    ax.legend(fontsize=7, loc="lower right")
    _margins(fig, height)
    fig.savefig(directory / "mae.png", dpi=100)
    plt.close(fig)
    written.append("mae.png")

    # 3. Error distributions: standardized noise against its model, and |error| per level.
    noisy = cells[cells["VARIANCE"] > 0]
    if len(noisy):
        z = ((noisy["COUNT"] - noisy["TRUNCATED"]) / np.sqrt(noisy["VARIANCE"])).to_numpy()
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        ax = axes[0]
        ax.hist(z, bins=np.linspace(-4.5, 4.5, 61), density=True, alpha=0.6, label="(COUNT - truncated exact) / sqrt(VARIANCE)")
        grid = np.linspace(-4.5, 4.5, 400)
        if (noisy["NOISE_DISTRIBUTION"] == "Discrete Gaussian").any():
            ax.plot(grid, np.exp(-grid**2 / 2) / math.sqrt(2 * math.pi), "k-", lw=1, label="N(0, 1)")
        if (noisy["NOISE_DISTRIBUTION"] == "Two-Sided Geometric").any():
            ax.plot(grid, np.exp(-math.sqrt(2) * np.abs(grid)) / math.sqrt(2), "k--", lw=1, label="Laplace, variance 1")
        for s in (-MOE_Z, MOE_Z):
            ax.axvline(s, color="r", lw=0.8, ls=":")
        ax.set_title("Standardized noise (red: ±MOE)")
        ax.set_ylim(0, 0.62)
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[1]
        ratio = (noisy["COUNT"] - noisy["TRUTH"]).abs() / (MOE_Z * np.sqrt(noisy["VARIANCE"]))
        ax.hist(np.minimum(ratio, 3), bins=np.linspace(0, 3, 61), density=True, alpha=0.6)
        ax.axvline(1.0, color="r", lw=0.8, ls=":")
        ax.set_xlabel("|COUNT - truth| / MOE (clipped at 3)")
        ax.set_title("Total error relative to the stated MOE")
        fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.9, wspace=0.2)
        fig.savefig(directory / "error_distribution.png", dpi=100)
        plt.close(fig)
        written.append("error_distribution.png")

        fig, ax = plt.subplots(figsize=(8, height))
        groups = [(cells["TABLE"] == t) & (cells["LEVEL"] == lv) for t, lv in zip(per["TABLE"], per["LEVEL"])]
        data = [(cells.loc[m, "COUNT"] - cells.loc[m, "TRUTH"]).abs().to_numpy() for m in groups]
        ax.boxplot(data, orientation="horizontal", positions=y, widths=0.6, showfliers=False)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yticks(y, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("|COUNT - truth| (whiskers: 1.5 IQR; symlog scale)")
        ax.set_title("Distribution of absolute errors per table and level")
        _margins(fig, height)
        fig.savefig(directory / "abs_errors.png", dpi=100)
        plt.close(fig)
        written.append("abs_errors.png")

    # 4. Averages.
    per_avg = average_metrics[average_metrics["TABLE"] != "ALL"].reset_index(drop=True)
    if len(per_avg):
        ya = np.arange(len(per_avg))
        fig, ax = plt.subplots(figsize=(8, max(3.0, 0.25 * len(per_avg) + 1.5)))
        ax.errorbar(per_avg["CI90_COVERAGE"], ya, xerr=_interval_bars(per_avg, "CI90_COVERAGE"), fmt="o", ms=4,
                    label="vs truncated exact ratio")
        ax.plot(per_avg["CI90_COVERAGE_VS_TRUTH"], ya, "x", ms=5, label="vs untruncated truth")
        ax.axvline(NOMINAL, color="k", lw=0.8, ls="--")
        ax.set_yticks(ya, _labels(per_avg), fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"empirical coverage (bars: {COVERAGE_INTERVAL:.0%} Wilson score intervals)")
        ax.set_xlim(right=1.01)
        ax.set_title("Coverage of the 90% credible intervals of the averages")
        ax.legend(fontsize=7, loc="lower left")
        _margins(fig, max(3.0, 0.25 * len(per_avg) + 1.5))
        fig.savefig(directory / "averages_coverage.png", dpi=100)
        plt.close(fig)
        written.append("averages_coverage.png")
    return [f"{directory.name}/{p}" for p in written]


def _fmt(value: object) -> str:
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return ""
        if float(value).is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def _table(frame: pd.DataFrame):  # type: ignore[no-untyped-def]
    from phsafe._plots import Table

    return Table([str(c) for c in frame.columns], [[_fmt(v) for v in row] for row in frame.itertuples(index=False)])


_METRIC_DOC = [
    ("CELLS", "released cells of the table at the level, per trial"),
    ("MEAN_MOE", "mean stated 90% margin of error, 1.645 * sqrt(VARIANCE)"),
    ("MAE, RMSE, P90_ABS_ERROR", "mean, root-mean-square and 90th percentile of |COUNT - truth|, truth = non-private run (no truncation)"),
    ("EXPECTED_NOISE_MAE", "E|noise| from the exact noise distribution (what MAE would be without truncation)"),
    ("MOE_COVERAGE (_LOW, _HIGH)", "share of cells with |COUNT - truncated exact| <= MOE (noise only: what the MOE "
     "states), and its 95% Wilson score interval"),
    ("MOE_COVERAGE_VS_TRUTH", "share of cells with |COUNT - truth| <= MOE (noise and truncation)"),
    ("TRUNCATION_MAE, _MAX_ABS, _SHARE", "truncation error alone: |truncated exact - truth|, mean, maximum, share of cells > 0"),
    ("CI90_COVERAGE (_VS_TRUTH)", "share of cells whose post-processed 90% credible interval holds the truncated exact count (the truth)"),
    ("CI90_MEAN_WIDTH, ESTIMATE_MAE", "mean interval width; mean |posterior mean - truth|"),
]


def write_report(
    directory: Path,
    cells: pd.DataFrame,
    avg: pd.DataFrame,
    metrics: pd.DataFrame,
    average_metrics: pd.DataFrame,
    *,
    config_path: Path,
    data_dir: Path,
    trials: int,
    seconds: float,
    plots: bool,
    with_postprocess: bool,
    draws: int,
    seed: int,
    comparison: pd.DataFrame | None = None,
    comparison_rows: pd.DataFrame | None = None,
) -> list[str]:
    """Write ``metrics.csv``, ``average_metrics.csv``, ``cells.parquet``, ``averages.parquet``,
    ``plots/*.png``, ``report.md`` and ``report.html``; returns the files written."""
    files = ["metrics.csv"]
    metrics.to_csv(directory / "metrics.csv", index=False, lineterminator="\n")
    cells.to_parquet(directory / "cells.parquet", index=False)
    files.append("cells.parquet")
    if with_postprocess:
        average_metrics.to_csv(directory / "average_metrics.csv", index=False, lineterminator="\n")
        files.append("average_metrics.csv")
        if len(avg):
            avg.to_parquet(directory / "averages.parquet", index=False)
            files.append("averages.parquet")
    has_comparison = comparison is not None and len(comparison) > 0
    if has_comparison:
        comparison.to_csv(directory / "comparison.csv", index=False, lineterminator="\n")
        side_by_side(comparison).to_csv(directory / "comparison_side_by_side.csv", index=False, lineterminator="\n")
        files += ["comparison.csv", "comparison_side_by_side.csv"]
        if comparison_rows is not None and len(comparison_rows):
            comparison_rows.to_parquet(directory / "comparison_rows.parquet", index=False)
            files.append("comparison_rows.parquet")
    images = _plots(directory / "plots", cells, avg, metrics, average_metrics) if plots else []
    files.extend(images)

    overall = metrics[metrics["TABLE"] == "ALL"].iloc[0]
    facts = [
        ("config", f"`{config_path}`"),
        ("data (declared non-confidential)", f"`{data_dir}`"),
        ("trials", str(trials)),
        ("noise", str(overall["NOISE_DISTRIBUTION"])),
        ("cells per trial", str(int(overall["CELLS"]))),
        ("pooled MOE coverage (noise only)",
         f"{overall['MOE_COVERAGE']:.4f} (95% interval {overall['MOE_COVERAGE_LOW']:.4f} to {overall['MOE_COVERAGE_HIGH']:.4f})"),
        ("pooled MOE coverage vs truth", f"{overall['MOE_COVERAGE_VS_TRUTH']:.4f}"),
        ("cells with truncation error", f"{overall['TRUNCATION_SHARE']:.4f}"),
        ("wall time", f"{seconds:.1f} s"),
        ("ledgers", "`ledgers/NNN.jsonl` (per trial: its private and its noiseless run, non-confidential)"),
    ]
    if with_postprocess:
        facts.append(("pooled 90% credible-interval coverage (noise only)", f"{overall['CI90_COVERAGE']:.4f}"))
        facts.append(("post-processing", f"{draws} draws per cell, seed {seed} + trial"))
    from phsafe._plots import Bullets, Document, Heading, Image, Para, Table

    doc = Document("PHSafe accuracy report")
    doc.add(Para("Synthetic or otherwise non-confidential data only. Every trial is a full private run; truncated "
                 "exact counts come from a run with the same truncation key and `Infinity` budgets; the truth from "
                 "the non-private run."))
    doc.add(Table(("Field", "Value"), [list(f) for f in facts]))
    cols = [c for c in metrics.columns if metrics[c].notna().any()]
    doc.add(Heading(2, "Counts, per table and level"), _table(metrics[cols]),
            Bullets([f"`{k}`: {v}" for k, v in _METRIC_DOC]))
    if with_postprocess and len(average_metrics):
        doc.add(Heading(2, "Averages (post-processed PH1, PH5, PH8)"), _table(average_metrics), Bullets([
            "`CI90_COVERAGE` (`_LOW`, `_HIGH`: its 95% Wilson score interval): share of defined cells whose 90% "
            "credible interval holds the exact ratio of the truncated counts; `_VS_TRUTH`: of the untruncated "
            "counts; `UNDEFINED`: cells (x trials) whose exact denominator is 0 or whose posterior had no draw with "
            "a positive denominator; `MAE`: |median ratio - true ratio|.",
        ]))
    if has_comparison:
        doc.add(Heading(2, "Estimate files: ours against the production's method"),
                Para("Every row of the Census Bureau's estimate files (internal and marginal cells, the averages), "
                     "from the same noisy tables: ours as `phsafe postprocess` writes them (exact discrete "
                     "posterior, equal-tailed 90% interval) and the production's continuous method "
                     "(`phsafe.accuracy.production`, re-implemented for this comparison only). Coverage: the "
                     "interval holds the truncated truth; out of bounds: an estimate or interval end outside the "
                     "logical bounds (count >= 0; average in [1, tau], families' total [2, tau], parts [0, tau]) "
                     "or not finite; failed: the production's sampler could not start (its run would stop)."),
                _table(side_by_side(comparison)),
                _table(comparison))
    if images:
        doc.add(Heading(2, "Plots"), *[Image(p, p) for p in images])
    doc.add(Heading(2, "Notes"), Bullets([
        "The stated MOE and the credible intervals describe the noise only; truncation (tau) error is reported "
        "separately and is why coverage against the untruncated truth can be lower.",
        "Coverage intervals are 95% Wilson score intervals (`scipy.stats.binomtest`) over the K trials x n cells, "
        "whose noise is independent; they stay inside [0, 1] even with few trials.",
    ]))
    doc.write(directory / "report.md", directory / "report.html")
    files += ["report.md", "report.html"]
    return files
