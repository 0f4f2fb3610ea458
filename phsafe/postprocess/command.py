"""``phsafe postprocess``: from a published private output directory to estimate files.

:func:`postprocess` reads the release (:mod:`phsafe.postprocess.source`), computes the count
estimates of every released and marginal cell (:mod:`~phsafe.postprocess.counts`) and the
averages PH1, PH5, PH8 (:mod:`~phsafe.postprocess.ratios`), writes them twice -- in our own
layout (the private tables' columns and every posterior summary) and in the Census Bureau's
(:mod:`~phsafe.postprocess.census`) -- checks the files written (:mod:`~phsafe.postprocess.checks`)
and publishes the folder atomically, with a report.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import phsafe
from phsafe.logs import get_logger
from phsafe.outputs import CSV_SEPARATOR, Publication, cell_column
from phsafe.errors import EstimateChecksFailed, PostprocessError
from phsafe.postprocess._base import CREDIBLE_LEVEL, GROUP_KEYS, TAIL_BOUND
from phsafe.postprocess.census import (
    FILE_COLUMNS,
    count_file_frame,
    is_puerto_rico,
    ratio_file_frame,
    read_file,
    write_files,
)
from phsafe.postprocess.checks import (
    ERROR,
    Bounds,
    check_estimates,
    production_summary,
    ratio_bounds,
    read_header,
    summarize_estimates,
)
from phsafe.postprocess.counts import HELPER_COLUMNS, count_estimates
from phsafe.postprocess.ratios import AVERAGE_COLUMNS, DEFAULT_DRAWS, DEFAULT_EXACT_LIMIT, ratio_table
from phsafe.postprocess.shells import COUNT_SHELLS, RATIO_SHELLS
from phsafe.postprocess.source import read_private_outputs
from phsafe.reader import file_digest

if TYPE_CHECKING:
    from phsafe._plots import Document
    from phsafe.progress import Progress

log = get_logger("phsafe.postprocess")

POSTPROCESS_METADATA = "postprocess.json"
README = "README.md"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
CHECKS = "checks.csv"
SUMMARY = "summary.csv"
PRODUCTION_SUMMARY = ("summary/out_count.csv", "summary/out_ratio.csv")


@dataclass
class PostprocessResult:
    """What :func:`postprocess` wrote.

    Attributes:
        destination: The directory written.
        files: Relative path -> SHA-256 of every file written.
        seed: The seed of the sampler (given or drawn).
        tables: Table (our files) -> number of rows written.
        estimate_files: The Census-layout files written (relative paths).
        checks: The checks of those files (:data:`phsafe.postprocess.checks.CHECK_COLUMNS`).
        summary: Their summary metrics (:data:`phsafe.postprocess.checks.SUMMARY_COLUMNS`).
    """

    destination: Path
    files: dict[str, str]
    seed: int
    tables: dict[str, int] = field(default_factory=dict)
    estimate_files: list[str] = field(default_factory=list)
    checks: pd.DataFrame = field(default_factory=pd.DataFrame)
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)


def default_destination(output_dir: Path) -> Path:
    """``<OUT>-postprocessed`` next to the output directory (never inside it: the published
    directory must hold exactly the files its manifest and ledger list)."""
    output_dir = Path(output_dir).absolute()
    return output_dir.parent / f"{output_dir.name}-postprocessed"


def postprocess(
    output_dir: Path,
    destination: Path | None = None,
    *,
    draws: int = DEFAULT_DRAWS,
    seed: int | None = None,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    tau: Mapping[str, int] | None = None,
    overwrite: bool = False,
    progress: "Progress | None" = None,
) -> PostprocessResult:
    """Post-process the private output directory ``output_dir`` (no access to any input data).

    Writes, to ``destination`` (default :func:`default_destination`):

    * our files: for every private table ``<TABLE>.csv`` (``|``-separated) and
      ``<TABLE>.parquet`` with its released and marginal cells and their posterior summaries,
      and the average tables ``PH1``, ``PH5``, ``PH8``;
    * the Census Bureau's files ``PH<k>/estimates/PH<k>_<level>_trunc_normal.csv``;
    * ``checks.csv`` and ``summary.csv`` (and the production's ``summary/out_count.csv``,
      ``summary/out_ratio.csv``), ``README.md`` (every column), ``postprocess.json`` (source,
      seed, digests) and a report (``report.md``, ``report.html``).

    The destination appears atomically (written to a hidden sibling, then renamed); an existing
    destination is replaced only with ``overwrite``.

    Args:
        output_dir: A published private output directory.
        destination: Where to write: a new or empty folder (or any folder, with ``overwrite``).
        draws: Independent exact draws where an average's two-dimensional lattice is larger than
            ``exact_limit`` (:mod:`phsafe.postprocess.ratios`).
        seed: Seed of those draws; drawn at random (and recorded) when None.
        exact_limit: Largest two-dimensional lattice computed exactly.
        tau: The run's truncation thresholds (table -> tau); by default from the release's
            ``manifest.json``, which records the config's.
        overwrite: Replace an existing destination that holds files (after the new one is
            complete).
        progress: Where to report the stages and tables (:mod:`phsafe.progress`).

    Raises:
        PostprocessError: The outputs cannot be read, tau is unknown, the destination holds
            files and ``overwrite`` is not set; :class:`EstimateChecksFailed` when a check fails.
    """
    from phsafe.progress import NULL

    progress = progress or NULL
    if draws < 1:
        raise PostprocessError("draws must be at least 1")
    output_dir = Path(output_dir).absolute()
    destination = Path(destination).absolute() if destination is not None else default_destination(output_dir)
    root = output_dir.resolve()
    if destination.resolve().is_relative_to(root):
        raise PostprocessError("the destination must be outside the output directory (its manifest lists every file)")
    if destination.exists() and not destination.is_dir():
        raise PostprocessError(f"destination {destination} is a file, not a folder")
    replace = destination.is_dir() and any(destination.iterdir())
    if replace and not overwrite:
        raise PostprocessError(f"destination {destination} already exists and holds files; choose a new one, "
                               "or replace it with --overwrite")
    with progress.stage("read the release"):
        tables, source = read_private_outputs(output_dir)
    taus = dict(tau) if tau is not None else source.get("tau")
    needs_tau = [s for s in RATIO_SHELLS.values() if s.numerator in tables and s.denominator in tables]
    if needs_tau and (not taus or any(s.tau_table not in taus for s in needs_tau)):
        raise PostprocessError(f"{output_dir}: the averages need the run's tau (of "
                               f"{', '.join(sorted({s.tau_table for s in needs_tau}))}); its manifest.json does "
                               "not give them: pass them (--tau TABLE=N)")
    if seed is None:
        seed = secrets.randbits(63)
    rng = np.random.default_rng(seed)
    log.info("postprocess", output=str(output_dir), destination=str(destination), tables=len(tables),
             draws=draws, seed=seed)

    counts: dict[str, pd.DataFrame] = {}
    with progress.stage("posterior of every cell and marginal"), \
            progress.task("tables", total=len(tables), unit="tables") as task:
        for table, frame in tables.items():
            task.advance(0, item=table)
            counts[table] = count_estimates(frame, table)
            task.advance(item="")
    averages: dict[str, pd.DataFrame] = {}
    with progress.stage("averages PH1, PH5, PH8 under their constraints"), \
            progress.task("averages", total=len(RATIO_SHELLS), unit="averages") as task:
        for shell in RATIO_SHELLS.values():
            task.advance(0, item=shell.name)
            if shell.numerator in tables and shell.denominator in tables:
                averages[shell.name] = ratio_table(shell, tables[shell.numerator], tables[shell.denominator],
                                                   taus or {}, draws=draws, rng=rng, exact_limit=exact_limit)
            else:
                log.warning("average not computed: a table is missing", average=shell.name)
            task.advance(item="")

    census: dict[str, pd.DataFrame] = {t: count_file_frame(t, counts[t]) for t in COUNT_SHELLS if t in counts}
    for name, frame in averages.items():
        shell = RATIO_SHELLS[name]
        census[name] = ratio_file_frame(name, frame, tables[shell.numerator], tables[shell.denominator])
    bounds = ratio_bounds(taus or {})
    if destination.is_dir() and not replace:
        destination.rmdir()  # an empty folder given as the destination: published in its place
    with progress.stage("write and check"):
        result = _publish(_own_frames(counts, averages, tables), census, destination, replace, source=output_dir,
                          facts=source, seed=seed, draws=draws, exact_limit=exact_limit, taus=taus or {},
                          bounds=bounds, puerto_rico=is_puerto_rico(tables))
    log.info("postprocess written", destination=str(destination), files=len(result.files))
    return result


def _own_frames(counts: Mapping[str, pd.DataFrame], averages: Mapping[str, pd.DataFrame],
                tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Our files: each private table (released and marginal cells) and each average table."""
    frames: dict[str, pd.DataFrame] = {}
    for table, frame in counts.items():
        out = frame.drop(columns=list(HELPER_COLUMNS))
        if tables[table].attrs.get("iteration_column") is False:
            out = out.drop(columns="ITERATION_CODE")
        frames[table] = out.reset_index(drop=True)
    for name, frame in averages.items():
        frames[name] = frame[[*GROUP_KEYS, f"{name}_DATA_CELL", *AVERAGE_COLUMNS]].reset_index(drop=True)
    return frames


def _publish(frames: Mapping[str, pd.DataFrame], census: Mapping[str, pd.DataFrame], destination: Path,
             replace: bool, *, source: Path, facts: Mapping[str, object], seed: int, draws: int, exact_limit: int,
             taus: Mapping[str, int], bounds: Mapping[str, Bounds], puerto_rico: bool) -> PostprocessResult:
    """Write everything into a hidden sibling of ``destination``, check the estimate files, and
    rename the folder into place; an existing destination (``replace``) is moved aside only once
    the new folder is complete and checked."""
    publication = Publication(destination, Publication.staging_path(destination, uuid.uuid4().hex[:12]))
    destination.parent.mkdir(parents=True, exist_ok=True)
    publication.staging.mkdir()
    try:
        staging = publication.staging
        files = _write_own(frames, staging)
        written = write_files(census, staging, puerto_rico)
        # The checks read the files back: the header, the format and the values as published.
        on_disk = {rel: (read_file(staging / rel), read_header(staging / rel)) for rel in written}
        checks = check_estimates(on_disk, bounds)
        summary = summarize_estimates({rel: f for rel, (f, _) in on_disk.items()}, bounds)
        failed = checks[(checks["SEVERITY"] == ERROR) & ~checks["PASSED"]]
        if len(failed):
            first = failed.iloc[0]
            raise EstimateChecksFailed(f"estimate check {first['CHECK']} failed on {first['FAILED']} row(s) of "
                                       f"{first['FILE']} ({first['RULE']}); nothing was published")
        for rel in written:
            files[rel] = file_digest(staging / rel)
        checks.to_csv(staging / CHECKS, index=False, lineterminator="\n")
        summary.to_csv(staging / SUMMARY, index=False, lineterminator="\n")
        state_files = [rel for rel in written if rel.endswith("_state_trunc_normal.csv")]
        (staging / "summary").mkdir()
        for rel, part in zip(PRODUCTION_SUMMARY, production_summary(summary, state_files)):
            part.to_csv(staging / rel, index=False, lineterminator="\n")
        for rel in (CHECKS, SUMMARY, *PRODUCTION_SUMMARY):
            files[rel] = file_digest(staging / rel)
        readme = staging / README
        readme.write_text(columns_doc(), encoding="utf-8")
        files[README] = file_digest(readme)
        report = build_report(frames, checks, summary, source=source, run_id=facts.get("run_id"),  # type: ignore[arg-type]
                              seed=seed, draws=draws, exact_limit=exact_limit, taus=taus)
        for path in report.write(staging / REPORT_MD, staging / REPORT_HTML):
            files[path.name] = file_digest(path)
        metadata = {
            "source": {"output_dir": str(source), **facts},
            "seed": seed,
            "draws": draws,
            "exact_limit": exact_limit,
            "tau": dict(taus),
            "credible_level": CREDIBLE_LEVEL,
            "tail_bound": TAIL_BOUND,
            "estimate": "posterior mean (flat prior on the non-negative integers; averages: on the lattice points "
                        "that satisfy the logical constraints)",
            "estimate_files": sorted(written),
            "code_version": phsafe.__version__,
            "created": datetime.now(timezone.utc).isoformat(),
            "tables": {t: len(f) for t, f in frames.items()},
            "files": files,
        }
        (staging / POSTPROCESS_METADATA).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n",
                                                    encoding="utf-8")
        old = None
        if replace:
            old = destination.parent / f".{destination.name}.replaced-{uuid.uuid4().hex[:12]}"
            os.rename(destination, old)
        publication.publish()
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        publication.abandon()
        raise
    return PostprocessResult(destination, files, seed, {t: len(f) for t, f in frames.items()}, sorted(written),
                             checks, summary)


def _write_own(frames: Mapping[str, pd.DataFrame], directory: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for name, frame in frames.items():
        csv_path = directory / f"{name}.csv"
        frame.to_csv(csv_path, sep=CSV_SEPARATOR, index=False, lineterminator="\n")
        pq_path = directory / f"{name}.parquet"
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), pq_path)
        for p in (csv_path, pq_path):
            files[p.name] = file_digest(p)
    return files


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _n(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) >= 1 else f"{x:.3f}"


def build_report(frames: Mapping[str, pd.DataFrame], checks: pd.DataFrame, summary: pd.DataFrame, *, source: Path,
                 run_id: str | None, seed: int, draws: int, exact_limit: int,
                 taus: Mapping[str, int]) -> "Document":
    """The post-processing report: facts, the checks, the summary metrics, our count tables and
    the averages of the total population group (a :class:`phsafe._plots.Document`)."""
    from phsafe._plots import Bullets, Document, Heading, Para, Table
    from phsafe.datapackage import REGION_NAMES
    from phsafe.tables import output_spec

    doc = Document("PHSafe post-processed estimates")
    doc.add(Para("Estimates and 90% intervals computed from the published private tables alone (no input data, no "
                 "privacy-loss budget), from the exact discrete likelihood of each cell. The Census Bureau's files "
                 "are under `PH<k>/estimates/`; ours (`<TABLE>.csv`, `.parquet`) hold every posterior summary. "
                 "`README.md` describes every column, `postprocess.json` the source and its digests."))
    tau_text = ", ".join(f"{t} {v}" for t, v in sorted(taus.items())) or "-"
    doc.add(Table(("Field", "Value"), [
        ["Source release", f"`{source}`"],
        ["Run", "-" if run_id is None else f"`{run_id}`"],
        ["Prior", "flat on the non-negative integers; averages: flat on the lattice points that satisfy their "
                  "logical constraints"],
        ["tau (from the release's manifest)", tau_text],
        ["Exact two-dimensional lattices up to", f"{exact_limit:,} points"],
        ["Beyond that: independent exact draws", f"{draws:,} (seed {seed})"],
    ]))
    errors = checks[checks["SEVERITY"] == ERROR]
    doc.add(Heading(2, "Checks of the estimate files"), Para(
        f"{len(checks)} checks on {checks['FILE'].nunique()} files: {int(errors['PASSED'].sum())} of {len(errors)} "
        f"error checks passed (a failure would have published nothing); warnings and notes below list the rows of "
        f"the production's rules that do not hold, with the reason in `README.md`."))
    shown = checks[(checks["SEVERITY"] != ERROR) & ~checks["PASSED"]]
    grouped = checks.groupby(["CHECK", "SEVERITY", "RULE"], sort=False).agg(FILES=("FILE", "nunique"),
                                                                             ROWS=("ROWS", "sum"),
                                                                             FAILED=("FAILED", "sum")).reset_index()
    doc.add(Table(("Check", "Severity", "Rule", "Files", "Rows", "Rows failing"),
                  [[r.CHECK, r.SEVERITY, r.RULE, str(r.FILES), f"{r.ROWS:,}", f"{r.FAILED:,}"]
                   for r in grouped.itertuples(index=False)]))
    if len(shown):
        doc.add(Table(("File", "Check", "Rows failing"),
                      [[f"`{r.FILE}`", r.CHECK, f"{r.FAILED:,} of {r.ROWS:,}"] for r in shown.itertuples(index=False)]))
    doc.add(Heading(2, "Summary metrics (the production's)"), Para(
        "Per file, for the noisy values (NM) and the estimates (PRED): range, percentage out of the logical bounds "
        "(counts <= 0; averages outside [1 or 2, tau] for a total, below 0 (PH8: 1) for a part), and the interval "
        "length (counts: median; averages: mean)."))
    doc.add(Table(("File", "Source", "Min", "Max", "% out of bounds", "Interval length"),
                  [[f"`{r.FILE}`", r.SOURCE, _n(r.MIN), _n(r.MAX), f"{r.PERCENT_OUT_OF_BOUNDS:.2f}",
                    _n(r.INTERVAL_LENGTH) if r.LENGTH_STATISTIC != "none" else "-"]
                   for r in summary.itertuples(index=False)]))
    rows = []
    for table, frame in frames.items():
        if table in RATIO_SHELLS:
            continue
        hpd = (frame["CI90_UPPER"] - frame["CI90_LOWER"]).to_numpy(dtype=float)
        et = (frame["CI90_ET_UPPER"] - frame["CI90_ET_LOWER"]).to_numpy(dtype=float)
        released = frame[cell_column(table)].isin(_released(table))
        rows.append([f"{table}: {output_spec(table).title}", f"{int(released.sum()):,}", f"{int((~released).sum()):,}",
                     _n(float(np.median(hpd))), _n(float(np.median(et))), f"{float(frame['P_ZERO'].mean()):.3f}",
                     f"{float((frame.loc[released, 'COUNT'] < 0).mean()):.3f}"])
    doc.add(Heading(2, "Our count tables"), Table(
        ("Table", "Released cells", "Marginal cells", "Median 90% HPD width", "Median 90% equal-tailed width",
         "Mean P(n = 0)", "Share of released counts < 0"), rows))
    national = []
    methods = []
    for name in RATIO_SHELLS:
        frame = frames.get(name)
        if frame is None:
            continue
        methods.append([name, f"{int((frame['METHOD'] == 'exact').sum()):,}", f"{int((frame['METHOD'] == 'sampled').sum()):,}",
                        f"{int((frame['METHOD'] == 'undefined').sum()):,}", f"{float(frame['MC_ERROR'].max()):.2g}",
                        f"{int((~frame['PRODUCTION_FEASIBLE'].astype(bool)).sum()):,}"])
        cell = f"{name}_DATA_CELL"
        top = frame[(frame["REGION_TYPE"] == "USA") & (frame["ITERATION_CODE"] == "*")]
        if top.empty:  # Puerto Rico: its own state row
            top = frame[(frame["REGION_TYPE"] == "STATE") & (frame["ITERATION_CODE"] == "*")].head(3)
        labels = dict(output_spec(RATIO_SHELLS[name].numerator).cell_labels)
        for r in top.itertuples(index=False):
            row = r._asdict()
            region = str(row["REGION_ID"])
            national.append([f"{name} cell {row[cell]} ({labels.get(row[cell], '')})", REGION_NAMES.get(region, region),
                             _n(row["ESTIMATE"]), f"{_n(row['CI90_LOWER'])} to {_n(row['CI90_UPPER'])}",
                             f"{row['P_DENOMINATOR_POSITIVE']:.3f}"])
    if methods:
        doc.add(Heading(2, "Averages PH1, PH5, PH8"), Table(
            ("Table", "Rows exact", "Rows sampled", "Rows undefined", "Largest Monte Carlo error",
             "Rows where the production's polytope is empty"), methods))
    if national:
        doc.add(Table(("Average", "Region", "Estimate (posterior mean)", "90% interval (equal-tailed)",
                       "P(denominator > 0)"), national))
    doc.add(Heading(2, "Notes"), Bullets([
        "Intervals cover the noise of disclosure avoidance only, not truncation (tau) or other non-sampling error.",
        "Nation GEOID: `1` (the release's REGION_ID); the production writes `01`, the same as Alabama.",
        "Averages never use the production's data-dependent upper bounds (noisy + 6 sigma); rows where those make "
        "its polytope empty -- where the production stops -- are computed like the others and flagged "
        "(`PRODUCTION_FEASIBLE` in our files).",
    ]))
    return doc


def _released(table: str) -> tuple[int, ...]:
    from phsafe.postprocess.shells import released_cells

    return released_cells(table)


def columns_doc() -> str:
    """The README written next to the post-processed tables."""
    counts = ", ".join(FILE_COLUMNS["PH2"])
    shared = ", ".join(FILE_COLUMNS["PH1"])
    own = ", ".join(FILE_COLUMNS["PH8"])
    return f"""# Post-processed PHSafe outputs

Computed by `phsafe postprocess` from the published private tables only (no input data; no
privacy-loss budget), from the exact discrete likelihood of every cell (discrete Gaussian or
two-sided geometric of the stated VARIANCE; derived cells by the exact convolution of their
parts). `postprocess.json` records the source directory, its run id, the SHA-256 of every table
read and of every file written, tau, the seed and the number of draws.

Read the codes as text: `GEOID` / `REGION_ID` "1" is the nation and "01" Alabama
(`pandas.read_csv(path, sep="|", dtype={{"GEOID": str}})`, or `phsafe.read_estimates(DIR)`).

## The Census Bureau's files: `PH<k>/estimates/PH<k>_<level>_trunc_normal.csv`

The production's names, columns, order and number format (`|`-separated, quoted text, R's
15-significant-digit numbers -- `1e+05` is 100000 --, `NA` missing, `Inf`/`NaN`), one file per
table and level (`nation`, `state`; `PR_state` for Puerto Rico). The name keeps `trunc_normal`;
the estimates are not the production's truncated normal but the exact discrete posterior.

* PH2, PH3, PH4, PH6, PH7: {counts}. One row per internal (released) and marginal cell; a
  marginal row's COUNT_NOISY and VARIANCE are the sums of its parts'. MOE_NOISY = 1.645 sqrt(VARIANCE).
  PRED is the posterior mean of the true count rounded to an integer (>= 0); PRED_LO, PRED_HI
  the 90% equal-tailed interval (at most 5% of the posterior below, at most 5% above). A
  marginal cell's posterior is the exact convolution of its parts' (not a sum of rounded means,
  so a marginal PRED may differ from the sum of its parts' PREDs by a few units).
* PH1, PH5: {shared}. PH8: {own}. Cell 1 is the total, 2 and 3 the parts (under 18 / 18 and
  over; owner / renter). RATIO_NOISY is the noisy numerator over the noisy denominator
  (unconstrained: it can be negative or infinite). RATIO_PRED is the posterior mean of the ratio,
  PRED_NUM / PRED_DENOM the posterior means of numerator and denominator (PH1, PH5), and
  RATIO_PRED_LO, RATIO_PRED_HI the 90% equal-tailed interval, under the logical constraints:
  denominator >= 1, a total's average >= 1 (households) or 2 (families), every average <= tau.

Departure: the nation's GEOID is `1`, not the production's `01` (which is also Alabama's).

## Our count tables: `<TABLE>.csv`, `<TABLE>.parquet` (PH1_num ... PH8_denom)

The private columns (`REGION_ID{CSV_SEPARATOR}REGION_TYPE{CSV_SEPARATOR}ITERATION_CODE{CSV_SEPARATOR}<TABLE>_DATA_CELL{CSV_SEPARATOR}COUNT{CSV_SEPARATOR}NOISE_DISTRIBUTION{CSV_SEPARATOR}VARIANCE`,
`ITERATION_CODE` absent for PH2 and PH6) for every released cell and every marginal cell (a sum of
released cells; its COUNT and VARIANCE are the sums), then the posterior of the cell's true count
n under a flat prior on n = 0, 1, 2, ...:

| column | meaning |
|---|---|
| ESTIMATE | posterior mean of n (>= 0; a float) |
| MEDIAN | posterior median of n |
| CI90_LOWER, CI90_UPPER | the 90% highest-posterior-density credible interval (the shortest interval holding >= 90%) |
| POSTERIOR_SD | posterior standard deviation of n |
| P_ZERO | posterior probability that n = 0 |
| CI90_ET_LOWER, CI90_ET_UPPER | the 90% equal-tailed interval (the Census files' PRED_LO, PRED_HI) |

These are each cell's own posterior: the ratio tables' constraints are not applied here (they are
in PH1, PH5, PH8). VARIANCE 0 (no noise, test runs only): the posterior is the released count.

## Our average tables: `PH1`, `PH5`, `PH8`

`REGION_ID{CSV_SEPARATOR}REGION_TYPE{CSV_SEPARATOR}ITERATION_CODE{CSV_SEPARATOR}<T>_DATA_CELL` then:

| column | meaning |
|---|---|
| ESTIMATE | posterior mean of the average (the Census files' RATIO_PRED) |
| MEDIAN | posterior median of the average |
| CI90_LOWER, CI90_UPPER | the 90% equal-tailed interval of the average (a ratio lives on the rationals, where a highest-density interval has no meaning) |
| NUMERATOR_ESTIMATE, DENOMINATOR_ESTIMATE | posterior means of numerator and denominator |
| P_DENOMINATOR_POSITIVE | posterior probability that the denominator is >= 1 when an empty group (0 over 0) is allowed too; the other columns are conditional on >= 1 |
| LOWER_BOUND, UPPER_BOUND | the logical bounds of the average: 1 (households, PH1 and PH8 totals and PH8 parts), 2 (families, PH5 total) or 0 (PH1, PH5 parts); tau |
| METHOD | `exact` (sums over the lattice), `sampled` (independent exact draws: the lattice was larger than the limit), `undefined` (no lattice point: a noiseless group without a household) |
| MC_DRAWS, MC_ERROR | the draws, and the largest 95% Monte Carlo half-width of MEDIAN, CI90_LOWER, CI90_UPPER (0 when exact; ESTIMATE and the numerator and denominator means are always exact) |
| PRODUCTION_FEASIBLE | False where the production's polytope (its noisy + 6 sigma upper bounds) is empty or admits no starting point: the production stops there; this post-processing does not use those bounds |

Cells: PH1 and PH5 -- 1 = (num 2 + num 3) / denom 1, 2 = num 2 / denom 1, 3 = num 3 / denom 1.
PH8 -- 1 = (PH8_num 2 + 3) / (PH8_denom 2 + 3), 2 = owner, 3 = renter.

## Checks and summaries

`checks.csv`: every check of every Census file (the production's `validate_modeling.R`, and
ours): FILE, TABLE, CHECK, SEVERITY (`error`: nothing would have been published; `warning`,
`note`: a production rule that does not hold on these rows, for the stated reason), ROWS,
FAILED, PASSED, RULE. `summary.csv`: per file, for the noisy values (NM) and the estimates
(PRED): MIN, MAX, PERCENT_OUT_OF_BOUNDS, INTERVAL_LENGTH (median for counts, mean for
averages). `summary/out_count.csv`, `summary/out_ratio.csv`: the production's long form
(`table`, `variable`, `harden`) of the state file.

Intervals cover the noise of disclosure avoidance only, not truncation (tau) or other
non-sampling error.
"""
