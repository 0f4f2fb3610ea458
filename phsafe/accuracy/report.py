"""Writing the accuracy experiment: metrics CSVs, per-cell Parquet files, plots and the report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from phsafe.accuracy.comparison import side_by_side
from phsafe.accuracy.plots import write_plots


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
    exact_limit: int | None = None,
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
    images = write_plots(directory / "plots", cells, avg, metrics, average_metrics) if plots else []
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
        limit = "" if exact_limit is None else f" whose lattice exceeds {exact_limit:,} points"
        facts.append(("post-processing", f"{draws} draws per average cell{limit}, seed {seed} + trial"))
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


def write_bound_report(directory: Path, frame: pd.DataFrame, *, config_path: Path, data_dir: Path, trials: int,
                       seconds: float) -> list[str]:
    """Write ``sensitivity_comparison.csv``, ``.md`` and ``.html``: the paper's bound against the
    exact one at the same budgets (:func:`phsafe.accuracy.bounds.bound_comparison`)."""
    from phsafe._plots import Bullets, Document, Heading, Para, Table

    frame.to_csv(directory / "sensitivity_comparison.csv", index=False, lineterminator="\n")
    doc = Document("PHSafe accuracy: the paper's sensitivity against the exact one")
    doc.add(Para("The same config, data and number of trials, with the noise calibrated to the PHSafe paper's "
                 "sensitivity (2 tau + 2 for person tables, 2 for unit tables) and to the exact sensitivity of each "
                 "measurement (`docs/sensitivity.md`): the budgets (unbounded rho) are the same, so is the privacy "
                 "loss under unbounded neighbours. Synthetic or otherwise non-confidential data only."))
    doc.add(Table(("Field", "Value"), [["config", f"`{config_path}`"], ["data (declared non-confidential)",
                                                                          f"`{data_dir}`"],
                                        ["trials per bound", str(trials)], ["wall time", f"{seconds:.1f} s"],
                                        ["experiments", "`paper/`, `exact/` (each a full accuracy report)"]]))
    shown = frame.copy()
    cols = ["TABLE", "LEVEL", "CELLS", "MOE_PAPER", "MOE_EXACT", "MOE_RATIO", "COVERAGE_PAPER", "COVERAGE_EXACT",
            "MAE_PAPER", "MAE_EXACT", "MAE_RATIO"]
    if shown["CI90_COVERAGE_PAPER"].notna().any():
        cols += ["CI90_COVERAGE_PAPER", "CI90_COVERAGE_EXACT", "CI90_WIDTH_RATIO"]
    doc.add(Heading(2, "Per table and level"), _table(shown[cols]))
    doc.add(Heading(2, "Notes"), Bullets([
        "`MOE_*`: mean stated 90% margin of error, 1.645 sqrt(VARIANCE); `MOE_RATIO` exact / paper (the variance "
        "ratio is its square). `COVERAGE_*`: share of cells with |COUNT - truncated exact count| <= MOE (the noise "
        "only: what the MOE states), 95% Wilson intervals in the CSV. `MAE_*`: mean |COUNT - truth| (noise and "
        "truncation). `CI90_*`: post-processed 90% credible intervals' coverage and width ratio.",
        "Under bounded neighbours (one record changed) the exact calibration's loss is 4 rho, the paper's 2 rho: "
        "see `docs/sensitivity.md`.",
    ]))
    doc.write(directory / "sensitivity_comparison.md", directory / "sensitivity_comparison.html")
    return ["sensitivity_comparison.csv", "sensitivity_comparison.md", "sensitivity_comparison.html"]
