"""The accuracy report's plots (matplotlib, PNG)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from phsafe.accuracy.levels import COVERAGE_INTERVAL
from phsafe.accuracy.metrics import MOE_Z, NOMINAL


def _labels(metrics: pd.DataFrame) -> list[str]:
    return [f"{t} {lv}" for t, lv in zip(metrics["TABLE"], metrics["LEVEL"])]


def _margins(fig, height: float) -> None:
    """Fixed margins for a figure with table x level labels on the y axis (``tight_layout``
    measures every label and takes seconds per figure)."""
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.9 / height, top=1 - 0.45 / height)


def interval_bars(frame: pd.DataFrame, column: str) -> np.ndarray:
    """matplotlib's asymmetric error bars (below, above) of a coverage and its interval."""
    value = frame[column].to_numpy(dtype=float)
    low = frame[f"{column}_LOW"].to_numpy(dtype=float)
    high = frame[f"{column}_HIGH"].to_numpy(dtype=float)
    return np.nan_to_num(np.vstack([value - low, high - value]), nan=0.0)


def write_plots(directory: Path, cells: pd.DataFrame, avg: pd.DataFrame, metrics: pd.DataFrame,
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
    ax.errorbar(per["MOE_COVERAGE"], y, xerr=interval_bars(per, "MOE_COVERAGE"), fmt="o", ms=4,
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
        ax.errorbar(per_avg["CI90_COVERAGE"], ya, xerr=interval_bars(per_avg, "CI90_COVERAGE"), fmt="o", ms=4,
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
