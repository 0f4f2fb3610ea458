"""The production's checks of the estimate files, and its summary metrics.

Checks (``MODEL_BASED_ESTIMATES.md`` §6, ``validate_modeling.R``), run on every file as written
(read back from disk, so the header and the formatting are checked too), each a row of
``checks.csv`` and of the report:

* every file: the column names equal the spec's list, in order;
* count tables: every ``PRED`` is a whole number and >= 0 (the production demands > 0; a
  posterior mean below one half rounds to 0, so ``PRED > 0`` is reported but not an error:
  a noiseless empty cell is 0, and a noisy one can be);
  ``PRED_LO <= PRED_HI`` with ``PRED_LO >= 0``; and ``|PRED - COUNT_NOISY| <= 6 sqrt(VARIANCE)``
  (marginal rows: the summed variance) -- a statistical rule: a released count more than about
  6 sigma below 0 is a one-in-a-billion event for Gaussian noise but about one in 3,000 per empty
  cell for the heavier-tailed geometric noise, and its estimate (near 0) is then "too far" from
  it; it is reported as a warning, not an error;
* PH1, PH5: ``0 <= RATIO_PRED <= tau`` (the production's rule) and PH8: ``1 <= RATIO_PRED <=
  tau``; ours are stronger and checked as errors: every cell's ``RATIO_PRED`` and interval lie in
  [the cell's lower bound, tau] -- 1 (households) or 2 (families) for a total, 0 for a part,
  1 for PH8 -- unless the ratio is undefined (``NA``: a noiseless group with no household). (The
  mean need not lie in the equal-tailed interval: with 95% of the posterior on the bound, both
  ends are the bound and the mean lies above it.)

An error means a defect of this code: ``phsafe postprocess`` then publishes nothing.

Summary (``summarize_results.R``), per file, for the noisy values (``NM``) and the estimates
(``PRED``): min and max of COUNT_NOISY / PRED (RATIO_NOISY / RATIO_PRED), the percentage of
rows out of their logical bounds (counts <= 0; ratios: a total below 1 -- 2 for families -- or
above tau, a part below 0; non-finite values count as out of bounds), and the interval length
(counts: median of 2 MOE_NOISY and of PRED_HI - PRED_LO; ratios: none for the noisy values, the
mean of RATIO_PRED_HI - RATIO_PRED_LO for the estimates). The production summarizes the US state
file only, pooled; :func:`production_summary` gives that long form (``out_count.csv``,
``out_ratio.csv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from phsafe.postprocess.census import FILE_COLUMNS
from phsafe.postprocess.shells import COUNT_SHELLS, RATIO_SHELLS

CHECK_COLUMNS = ("FILE", "TABLE", "CHECK", "SEVERITY", "ROWS", "FAILED", "PASSED", "RULE")
SUMMARY_COLUMNS = ("FILE", "TABLE", "REGION_TYPE", "SOURCE", "ROWS", "MIN", "MAX", "PERCENT_OUT_OF_BOUNDS",
                   "INTERVAL_LENGTH", "LENGTH_STATISTIC")
ERROR, WARNING, NOTE = "error", "warning", "note"
SIGMAS = 6.0


@dataclass(frozen=True)
class Bounds:
    """The logical bounds of a ratio table: its total's lower bound and tau."""

    total_lower: int
    tau: int

    def lower(self, cells: pd.Series, table: str) -> np.ndarray:
        part = 1.0 if table == "PH8" else 0.0
        return np.where(cells.to_numpy() == 1, float(self.total_lower), part)


def table_of(rel: str) -> str:
    return rel.split("/", 1)[0]


def check_file(rel: str, frame: pd.DataFrame, header: list[str], bounds: Mapping[str, Bounds]) -> list[dict]:
    """Every check of one file (see the module docstring); one dict per check."""
    table = table_of(rel)
    out: list[dict] = []

    def add(check: str, severity: str, failed: int, rule: str, rows: int | None = None) -> None:
        out.append({"FILE": rel, "TABLE": table, "CHECK": check, "SEVERITY": severity,
                    "ROWS": len(frame) if rows is None else rows, "FAILED": int(failed),
                    "PASSED": int(failed) == 0, "RULE": rule})

    expected = list(FILE_COLUMNS[table])
    add("columns", ERROR, 0 if header == expected else 1, f"columns are {', '.join(expected)}, in this order", 1)
    if header != expected:
        return out
    if table in COUNT_SHELLS:
        pred = frame["PRED"].to_numpy(dtype=float)
        whole = np.isfinite(pred) & (pred == np.round(pred))
        add("pred_integer", ERROR, int((~whole | (pred < 0)).sum()), "PRED is a whole number >= 0")
        add("pred_positive", NOTE, int((pred <= 0).sum()),
            "PRED > 0 (the production's rule; a posterior mean below 1/2 rounds to 0)")
        lo, hi = frame["PRED_LO"].to_numpy(dtype=float), frame["PRED_HI"].to_numpy(dtype=float)
        ok = np.isfinite(lo) & np.isfinite(hi) & (lo >= 0) & (lo <= hi) & (lo == np.round(lo)) & (hi == np.round(hi))
        add("interval", ERROR, int((~ok).sum()), "0 <= PRED_LO <= PRED_HI, whole numbers")
        noisy = frame["COUNT_NOISY"].to_numpy(dtype=float)
        sd = np.sqrt(frame["VARIANCE"].to_numpy(dtype=float))
        far = ~(np.abs(pred - noisy) <= SIGMAS * sd + 1e-9)
        add("within_6_sigma", WARNING, int(far.sum()), "|PRED - COUNT_NOISY| <= 6 sqrt(VARIANCE)")
        return out
    b = bounds[table]
    ratio = frame["RATIO_PRED"].to_numpy(dtype=float)
    defined = ~np.isnan(ratio)
    floor = 1.0 if table == "PH8" else 0.0
    prod_ok = ~defined | ((ratio >= floor) & (ratio <= b.tau))
    add("ratio_range", ERROR, int((~prod_ok).sum()),
        f"{floor:g} <= RATIO_PRED <= tau = {b.tau} (the production's rule)")
    lower = b.lower(frame["DATA_CELL"], table)
    lo, hi = frame["RATIO_PRED_LO"].to_numpy(dtype=float), frame["RATIO_PRED_HI"].to_numpy(dtype=float)
    eps = 1e-9
    # (the mean may lie outside the equal-tailed interval: when 95% of the posterior sits on the
    # lower bound, both ends are that bound and the mean is above it)
    inside = (~defined & np.isnan(lo) & np.isnan(hi)) | (
        defined & (lo >= lower - eps) & (lo <= hi) & (hi <= b.tau + eps) & (ratio >= lower - eps))
    add("ratio_bounds", ERROR, int((~inside).sum()),
        f"cell bound <= RATIO_PRED_LO <= RATIO_PRED_HI <= tau = {b.tau} and RATIO_PRED >= cell bound (cell bound: "
        f"{b.total_lower} for the total, {floor:g} for a part)")
    return out


def check_estimates(files: Mapping[str, tuple[pd.DataFrame, list[str]]], bounds: Mapping[str, Bounds]) -> pd.DataFrame:
    """The checks of every file: relative path -> (rows, header as written)."""
    rows = []
    for rel, (frame, header) in files.items():
        rows.extend(check_file(rel, frame, header, bounds))
    return pd.DataFrame(rows, columns=list(CHECK_COLUMNS))


def read_header(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        first = fh.readline().rstrip("\n")
    return [c.strip('"') for c in first.split("|")]


# --------------------------------------------------------------------------------------------
# Summary metrics
# --------------------------------------------------------------------------------------------


def _out_of_bounds_ratio(values: np.ndarray, cells: np.ndarray, b: Bounds, table: str) -> np.ndarray:
    floor = 1.0 if table == "PH8" else 0.0
    total = cells == 1
    with np.errstate(invalid="ignore"):
        bad_total = total & ((values < b.total_lower) | (values > b.tau))
        bad_part = ~total & ((values < floor) | (values > b.tau))
    return bad_total | bad_part | ~np.isfinite(values)


def summarize_file(rel: str, frame: pd.DataFrame, bounds: Mapping[str, Bounds]) -> list[dict]:
    """The NM and PRED rows of one file."""
    table = table_of(rel)
    region_type = str(frame["REGION_TYPE"].iloc[0]) if len(frame) else ""
    rows = []

    def row(source: str, values: np.ndarray, bad: np.ndarray, length: float, statistic: str) -> dict:
        finite = values[np.isfinite(values)]
        return {"FILE": rel, "TABLE": table, "REGION_TYPE": region_type, "SOURCE": source, "ROWS": len(values),
                "MIN": float(finite.min()) if finite.size else np.nan,
                "MAX": float(finite.max()) if finite.size else np.nan,
                "PERCENT_OUT_OF_BOUNDS": 100.0 * float(bad.mean()) if len(values) else np.nan,
                "INTERVAL_LENGTH": length, "LENGTH_STATISTIC": statistic}

    if table in COUNT_SHELLS:
        noisy = frame["COUNT_NOISY"].to_numpy(dtype=float)
        pred = frame["PRED"].to_numpy(dtype=float)
        rows.append(row("NM", noisy, ~(noisy > 0), float(np.median(2 * frame["MOE_NOISY"])) if len(frame) else np.nan,
                        "median"))
        width = (frame["PRED_HI"] - frame["PRED_LO"]).to_numpy(dtype=float)
        rows.append(row("PRED", pred, ~(pred > 0), float(np.median(width)) if len(frame) else np.nan, "median"))
        return rows
    b = bounds[table]
    cells = frame["DATA_CELL"].to_numpy()
    noisy = frame["RATIO_NOISY"].to_numpy(dtype=float)
    pred = frame["RATIO_PRED"].to_numpy(dtype=float)
    rows.append(row("NM", noisy, _out_of_bounds_ratio(noisy, cells, b, table), 0.0, "none"))
    width = (frame["RATIO_PRED_HI"] - frame["RATIO_PRED_LO"]).to_numpy(dtype=float)
    rows.append(row("PRED", pred, _out_of_bounds_ratio(pred, cells, b, table),
                    float(np.nanmean(width)) if np.isfinite(width).any() else np.nan, "mean"))
    return rows


def summarize_estimates(files: Mapping[str, pd.DataFrame], bounds: Mapping[str, Bounds]) -> pd.DataFrame:
    rows = []
    for rel, frame in files.items():
        rows.extend(summarize_file(rel, frame, bounds))
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def production_summary(summary: pd.DataFrame, state_files: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``out_count.csv`` and ``out_ratio.csv`` as the production writes them (long form:
    ``table`` e.g. ``ph2_pred``, ``variable``, ``harden``), from the given state files."""
    parts = {"count": [], "ratio": []}
    for _, r in summary[summary["FILE"].isin(state_files)].iterrows():
        kind = "count" if r["TABLE"] in COUNT_SHELLS else "ratio"
        name = f"{r['TABLE'].lower()}_{r['SOURCE'].lower()}"
        bad = "p_neg" if kind == "count" else "p_bad"
        for variable, value in (("min", r["MIN"]), ("max", r["MAX"]), (bad, r["PERCENT_OUT_OF_BOUNDS"]),
                                ("len", r["INTERVAL_LENGTH"])):
            parts[kind].append({"table": name, "variable": variable, "harden": value})
    return (pd.DataFrame(parts["count"], columns=["table", "variable", "harden"]),
            pd.DataFrame(parts["ratio"], columns=["table", "variable", "harden"]))


def ratio_bounds(tau: Mapping[str, int]) -> dict[str, Bounds]:
    """Each ratio table's bounds from the run's tau (a tau below 2 lowers the families' bound)."""
    return {name: Bounds(min(shell.lower_bound, int(tau[shell.tau_table])), int(tau[shell.tau_table]))
            for name, shell in RATIO_SHELLS.items() if shell.tau_table in tau}
