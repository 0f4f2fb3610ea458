"""The accuracy experiment: K private runs of the private algorithm on synthetic or otherwise non-confidential data.

:func:`run_accuracy` runs the private algorithm ``trials`` times on the same data and compares
every released cell with the truth, using only the public engine API
(:func:`phsafe.sequence.run_private`, :func:`phsafe.engine.run_nonprivate`):

* truth: one non-private run (no truncation, no noise) -- ``OUT/truth/``; it validates the inputs,
  once, and the trials' runs do not again;
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

from phsafe.accuracy.comparison import (
    COMPARISON_COLUMNS,
    compare_trial,
    comparison_metrics,
    read_estimate_files,
    truncated_truth,
)
from phsafe.accuracy.levels import level_of
from phsafe.accuracy.metrics import (
    AVERAGE_METRIC_COLUMNS,
    KEYS,
    average_table_metrics,
    exact_ratios,
    noise_abs_mean,
    table_metrics,
)
from phsafe.accuracy.production import production_files
from phsafe.accuracy.report import write_report
from phsafe.errors import ConfidentialityNotConfirmed, PHSafeError
from phsafe.logs import get_logger
from phsafe.outputs import CSV_SEPARATOR, cell_column
from phsafe.postprocess import RATIO_SHELLS, postprocess, read_private_outputs
from phsafe.postprocess.ratios import DEFAULT_EXACT_LIMIT
from phsafe.tables import OUTPUT_TABLES

if TYPE_CHECKING:
    from phsafe.progress import Progress

log = get_logger("phsafe.accuracy")

DEFAULT_TRIALS = 20
DEFAULT_ACCURACY_DRAWS = 2000


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


def config_with_bound(config_path: Path, destination: Path, bound: str) -> Path:
    """Write a copy of the config calibrated to ``bound`` (``"paper"`` or ``"exact"``), budgets
    unchanged."""
    raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
    raw["sensitivity"] = bound
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


def _private_long(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    return {t: f.rename(columns={cell_column(t): "CELL"}) for t, f in tables.items()}


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
    exact_limit: int = DEFAULT_EXACT_LIMIT,
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
        draws: Independent exact draws per cell of an average whose two-dimensional lattice
            is larger than ``exact_limit`` (post-processing; :func:`phsafe.postprocess.postprocess`).
        exact_limit: Largest two-dimensional lattice (points) of an average computed exactly
            (post-processing); the quantiles of a larger one come from ``draws`` draws.
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
    if exact_limit < 0:
        raise PHSafeError("--exact-limit must be at least 0")
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
        # The inputs are validated once, here, before any trial spends: the 2K private runs read
        # the same files, and validating them again would cost a pass over the inputs each.
        run_nonprivate(Path(config_path), Path(data_dir), output_dir / "truth", non_confidential=True, validate=True)
        truth = {t: f for t in OUTPUT_TABLES if (f := _read_nonprivate(output_dir / "truth", t)) is not None}
        truth_ratios = exact_ratios(truth)

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
            options = dict(ledger=output_dir / "ledgers" / f"{name}.jsonl", non_confidential=True, truncation_key=key,
                           validate=False)
            task.update(trial - 1, item=f"trial {trial}: private run")
            run_private(Path(config_path), Path(data_dir), output_dir / "trials" / name, **options)
            task.update(trial - 1, item=f"trial {trial}: truncated exact counts")
            run_private(noiseless, Path(data_dir), output_dir / "truncated" / name, **options)
            # The release is read once (and its variances checked once) for the cells and the production's method.
            tables, facts = read_private_outputs(output_dir / "trials" / name)
            noisy = _private_long(tables)
            exact = _private_long(read_private_outputs(output_dir / "truncated" / name)[0])
            post = None
            if with_postprocess:
                task.update(trial - 1, item=f"trial {trial}: post-processing")
                result = postprocess(output_dir / "trials" / name, output_dir / "postprocessed" / name,
                                     draws=draws, seed=seed + trial, exact_limit=exact_limit)
                post = result.destination
            cells.append(_trial_cells(trial, noisy, exact, truth, post))
            if post is not None:
                trial_ratios = exact_ratios({t: f[[*KEYS, "COUNT"]] for t, f in exact.items()})
                averages.append(_trial_averages(trial, post, trial_ratios, truth_ratios))
                if compare_production:
                    task.update(trial - 1, item=f"trial {trial}: the production's method")
                    theirs = production_files(tables, np.random.default_rng([seed, trial]))
                    compared.append(compare_trial(trial, read_estimate_files(post), theirs,
                                                  truncated_truth(exact, trial_ratios), facts.get("tau") or {}))
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
                             with_postprocess=with_postprocess, draws=draws, exact_limit=exact_limit, seed=seed,
                             comparison=comparison,
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
        rows["EXPECTED_ABS_NOISE"] = noise_abs_mean(rows, table)
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
# The paper's bound against the exact one
# --------------------------------------------------------------------------------------------


@dataclass
class BoundComparisonResult:
    """What :func:`compare_bounds` produced: both experiments and their comparison
    (:data:`phsafe.accuracy.bounds.BOUND_COMPARISON_COLUMNS`)."""

    output_dir: Path
    paper: AccuracyResult
    exact: AccuracyResult
    comparison: pd.DataFrame
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0


def compare_bounds(
    config_path: Path,
    data_dir: Path,
    output_dir: Path,
    *,
    trials: int = DEFAULT_TRIALS,
    non_confidential: bool = False,
    with_postprocess: bool = True,
    draws: int = DEFAULT_ACCURACY_DRAWS,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    seed: int | None = None,
    plots: bool = True,
    overwrite: bool = False,
    progress: "Progress | None" = None,
) -> BoundComparisonResult:
    """The accuracy experiment with the config's budgets calibrated to the paper's sensitivities
    (``OUT/paper/``) and to the exact ones (``OUT/exact/``), and their comparison per table x
    level (``sensitivity_comparison.csv``, ``.md``, ``.html``). Same data, same budgets, same
    trials and post-processing seed; see :func:`run_accuracy` for everything else.

    Raises:
        ConfidentialityNotConfirmed: ``non_confidential`` is not True.
    """
    if non_confidential is not True:
        raise ConfidentialityNotConfirmed(
            "the accuracy experiment publishes many private releases of the same data and is for "
            "synthetic or otherwise non-confidential data only; confirm with --non-confidential"
        )
    from phsafe._plots import report_folder
    from phsafe.accuracy.bounds import bound_comparison
    from phsafe.accuracy.report import write_bound_report

    started = time.perf_counter()
    output_dir = report_folder(Path(output_dir).absolute(), overwrite=overwrite)
    if seed is None:
        seed = secrets.randbits(62)
    results: dict[str, AccuracyResult] = {}
    for bound in ("paper", "exact"):
        config = config_with_bound(Path(config_path), output_dir / f"config-{bound}.json", bound)
        results[bound] = run_accuracy(config, Path(data_dir), output_dir / bound, trials=trials, non_confidential=True,
                                      with_postprocess=with_postprocess, draws=draws, exact_limit=exact_limit,
                                      seed=seed, plots=plots, compare_production=False, progress=progress)
    frame = bound_comparison(results["paper"].metrics, results["exact"].metrics)
    seconds = time.perf_counter() - started
    files = write_bound_report(output_dir, frame, config_path=Path(config_path), data_dir=Path(data_dir),
                               trials=trials, seconds=seconds)
    log.info("sensitivity comparison written", output=str(output_dir), trials=trials, seconds=round(seconds, 1))
    return BoundComparisonResult(output_dir, results["paper"], results["exact"], frame, files, seconds)
