"""The labelled data package of an output folder: ``datapackage.json`` (Frictionless).

Every output folder (private releases and non-private tabulations) carries a
`Frictionless Data Package <https://datapackage.org/>`_ describing each table it holds, twice --
the ``|``-separated CSV (``<TABLE>/<TABLE>.csv``) and the Parquet copy
(``parquet/<TABLE>.parquet``) -- with:

* the columns in order, their types and constraints (codes as strings, counts as integers);
* the primary key (``REGION_ID``, ``REGION_TYPE``, ``ITERATION_CODE``, ``<TABLE>_DATA_CELL``), in
  the order of the columns: readers that turn the key into an index (``frictionless``'s
  ``to_pandas``) pair each level with its column by position, and a key in another order swapped
  ``REGION_ID`` and ``REGION_TYPE``;
* the label of every code, as the field's ``categories`` (Data Package 2.0: a list of
  ``{"value": ..., "label": ...}``) and the same values as an ``enum`` constraint (read by
  Data Package 1.0 tools): ``REGION_ID`` (``1`` = United States, state FIPS -> state name),
  ``REGION_TYPE``, ``ITERATION_CODE`` and every ``<TABLE>_DATA_CELL`` number;
* what ``COUNT``, ``NOISE_DISTRIBUTION`` and ``VARIANCE`` mean;
* for a private release, which sensitivity its noise was calibrated to (``sensitivity``: the
  bound -- the PHSafe paper's 2*tau+2 and 2, or the exact sensitivities of ``docs/sensitivity.md``
  -- and every measurement's Delta, in the norm of its privacy definition; a custom property of
  the descriptor, also said in its description).

Everything is generated from the table definitions in code (:mod:`phsafe.tables`,
:mod:`phsafe.iterations`, :mod:`phsafe.schema`, :mod:`phsafe.accounting`) -- one source of
truth -- and from the public structure of the tables written (which regions, iteration codes
and cells they hold: the public domain of the run, spec §4), never from a count. The file is part
of the public release: it is written into the staging folder with the tables, and its SHA-256 goes
into the manifest and the ledger's output digests with theirs.

Check a release with ``frictionless validate OUT/datapackage.json``; read it labelled with
:func:`phsafe.release.read_release`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

import phsafe
from phsafe.accounting import NoiseDistribution, RunPlan
from phsafe.domain import USA_REGION_ID
from phsafe.iterations import ITERATION_LABELS, GeographyLevel
from phsafe.schema import STATE_NAMES
from phsafe.sensitivity import DOCUMENT, SensitivityBound
from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES, TABLES, IterationSource, output_spec

DATAPACKAGE = "datapackage.json"
CSV_SEPARATOR = "|"  # spec §7; the same as phsafe.outputs.CSV_SEPARATOR
PROFILE = "https://datapackage.org/profiles/2.0/datapackage.json"
DIALECT_PROFILE = "https://datapackage.org/profiles/2.0/tabledialect.json"
SCHEMA_PROFILE = "https://datapackage.org/profiles/2.0/tableschema.json"
PARQUET_MEDIATYPE = "application/vnd.apache.parquet"

REGION_NAMES: dict[str, str] = {USA_REGION_ID: "United States", **STATE_NAMES}
"""``REGION_ID`` -> name: ``1`` is the nation, the others are state FIPS codes."""

NOISE_LABELS: dict[str, str] = {
    NoiseDistribution.DISCRETE_GAUSSIAN.value: (
        "zCDP: exact discrete Gaussian noise N_Z(0, sigma^2) was added to the count; "
        "VARIANCE = sigma^2 = Delta^2 / (2 rho)"
    ),
    NoiseDistribution.TWO_SIDED_GEOMETRIC.value: (
        "pure DP: exact two-sided geometric noise, P(k) proportional to exp(-|k|/s) with s = Delta / epsilon, "
        "was added to the count; VARIANCE = 2 exp(-1/s) / (1 - exp(-1/s))^2"
    ),
}
"""``NOISE_DISTRIBUTION`` value -> what it means (spec §6)."""

VARIANCE_DESCRIPTION = (
    "Variance of the noise added to COUNT (spec §6). The 90% margin of error of the count is "
    "1.645 * sqrt(VARIANCE). Cells derived by adding measured cells (PH5_num, PH8_num) carry the "
    "sum of their variances. 0 when the level's budget is Infinity (no noise: test runs on "
    "non-confidential data only). The noise is independent between cells and between levels."
)

_ITERATION_BY = {
    IterationSource.HOUSEHOLDER: "the race and ethnicity of the householder (HHRACE, HHSPAN)",
    IterationSource.PERSON: "the race and ethnicity of the person (CENRACE, CENHISP)",
}


def cell_column(table: str) -> str:
    """``<TABLE>_DATA_CELL`` (spec §7); the same rule as :func:`phsafe.outputs.cell_column`."""
    return f"{table.upper()}_DATA_CELL"


def resource_name(table: str, fmt: str) -> str:
    """The resource name of ``table`` in format ``csv`` or ``parquet`` (``ph1_num``,
    ``ph1_num-parquet``): Frictionless names are lowercase."""
    return table.lower() if fmt == "csv" else f"{table.lower()}-parquet"


def is_private(frame: pd.DataFrame) -> bool:
    """A private table has the noise columns; a non-private (ground-truth) one does not."""
    return "NOISE_DISTRIBUTION" in frame.columns and "VARIANCE" in frame.columns


def _categories(values: list[Any], labels: Mapping[Any, str]) -> list[dict[str, Any]]:
    return [{"value": v, "label": labels[v]} for v in values]


def _coded(name: str, kind: str, values: list[Any], labels: Mapping[Any, str], description: str) -> dict[str, Any]:
    """A code column: its labels as Data Package 2.0 ``categories``, its values as an ``enum``."""
    return {
        "name": name,
        "type": kind,
        "description": description,
        "categories": _categories(values, labels),
        "constraints": {"required": True, "enum": list(values)},
    }


def _unique(frame: pd.DataFrame, column: str, order: list[Any]) -> list[Any]:
    """The distinct values of ``column``, in the order of ``order`` (values outside it raise)."""
    present = set(frame[column].tolist())
    unknown = present - set(order)
    if unknown:
        # A value with no label would be published unexplained: a defect, never data-dependent.
        raise ValueError(f"{column}: value(s) without a label: {sorted(map(str, unknown))}")
    return [v for v in order if v in present]


def table_schema(table: str, frame: pd.DataFrame) -> dict[str, Any]:
    """The Table Schema of one output table as written (``frame`` holds its rows)."""
    spec = output_spec(table)
    private = is_private(frame)
    cell = cell_column(table)
    region_order = [USA_REGION_ID, *sorted(STATE_NAMES)]
    regions = _unique(frame.astype({"REGION_ID": str}), "REGION_ID", region_order)
    geo_labels = {g.value: g.label for g in GeographyLevel}
    region_types = _unique(frame, "REGION_TYPE", [g.value for g in GeographyLevel])
    fields: list[dict[str, Any]] = [
        _coded("REGION_ID", "string", regions, REGION_NAMES,
               "The geographic entity: 1 for the United States, else the state's 2-digit FIPS code "
               "(leading zero kept)."),
        _coded("REGION_TYPE", "string", region_types, geo_labels,
               "The geography level of the row (spec §4): USA (REGION_ID 1; no USA rows in a Puerto Rico "
               "run) or STATE (REGION_ID is the state's FIPS code)."),
    ]
    primary_key = ["REGION_ID", "REGION_TYPE"]  # column order (see the module docstring)
    if spec.has_iteration_column:
        codes = _unique(frame, "ITERATION_CODE", list(ITERATION_LABELS))
        fields.append(_coded(
            "ITERATION_CODE", "string", codes, ITERATION_LABELS,
            f"The race or ethnicity group (spec §3), by {_ITERATION_BY[spec.iteration_source]}; * is the total.",
        ))
        primary_key.append("ITERATION_CODE")
    cells = _unique(frame, cell, sorted(n for n, _ in spec.cell_labels))
    fields.append(_coded(cell, "integer", [int(c) for c in cells], dict(spec.cell_labels),
                         f"The table cell (spec §5): {spec.title}."))
    primary_key.append(cell)
    if private:
        fields.append({
            "name": "COUNT", "type": "integer", "constraints": {"required": True},
            "description": "The noisy count of the cell: the exact count (after truncation, for person tables) "
                           "plus independent noise. It may be negative; it is an unbiased estimate.",
        })
        distributions = _unique(frame, "NOISE_DISTRIBUTION", list(NOISE_LABELS))
        fields.append(_coded("NOISE_DISTRIBUTION", "string", distributions, NOISE_LABELS,
                             "The distribution of the noise added to COUNT (spec §6)."))
        fields.append({
            "name": "VARIANCE", "type": "number", "constraints": {"required": True, "minimum": 0},
            "description": VARIANCE_DESCRIPTION,
        })
    else:
        fields.append({
            "name": "COUNT", "type": "integer", "constraints": {"required": True, "minimum": 0},
            "description": "The exact count of the cell, without truncation or noise (non-private tabulation "
                           "of synthetic data, for testing; " + (
                               "the sum of FINAL_POP over occupied housing units)" if spec.weight else "records)"),
        })
    names = [f["name"] for f in fields]
    if names != list(frame.columns):
        raise ValueError(f"{table}: columns {list(frame.columns)} are not the output columns {names}")
    return {"$schema": SCHEMA_PROFILE, "fields": fields, "primaryKey": primary_key, "missingValues": []}


def _table_description(table: str, private: bool) -> str:
    spec = output_spec(table)
    parts = [f"{spec.title}. Universe: {spec.universe}."]
    if table in DERIVED_TABLES:
        d = DERIVED_TABLES[table]
        sums = "; ".join(f"cell {n} = {d.source} cell{'s' if len(src) > 1 else ''} {' + '.join(map(str, src))}"
                         for n, src in d.cells)
        parts.append(f"Derived from {d.source} without further privacy loss ({sums}; variances added alike)."
                     if private else f"Non-private: tabulated directly (the private release derives it from {d.source}).")
    elif private:
        measured = TABLES[table]
        parts.append("Measured cells: " + ", ".join(map(str, measured.basis_numbers)) + "; the others are sums "
                     "of them and are not released privately.")
    parts.append("One row per cell of every released population-group level (zeros included)."
                 if private else "Basis and aggregate cells; a missing row is a count of 0.")
    return " ".join(parts)


def sensitivity_property(plan: RunPlan) -> dict[str, Any]:
    """The descriptor's ``sensitivity``: the bound a private release's noise was calibrated to and
    every measurement's Delta (L2 for zCDP, L1 for pure DP; an integer or ``"sqrt(N)"``)."""
    return _statement(plan.bound, plan.privacy_defn.value,
                      [(m.table, m.level.config_key, m.sensitivity) for m in plan.measurements])


def _statement(bound: SensitivityBound, privacy_defn: str, deltas: list[tuple[str, str, Any]]) -> dict[str, Any]:
    return {
        "bound": bound.value,
        "description": bound.description,
        "proof": DOCUMENT if bound is SensitivityBound.EXACT else "PHSafe paper, Lemma 6 and Theorems 1-2",
        "norm": "L2" if privacy_defn == "zcdp" else "L1",
        "measurements": [{"table": t, "level": lv, "delta": d} for t, lv, d in deltas],
    }


def _statement_from_manifest(directory: Path) -> dict[str, Any] | None:
    """The ``sensitivity`` property of a published release, rebuilt from its manifest (None for a
    release whose manifest does not name its bound: written before it was stated)."""
    try:
        manifest = json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8"))
        bound = SensitivityBound(manifest["config"]["sensitivity"])
        deltas = [(m["table"], m["level"], m["sensitivity"]) for m in manifest["measurements"]]
        return _statement(bound, manifest["privacy_defn"], deltas)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def package_descriptor(frames: Mapping[str, pd.DataFrame], plan: RunPlan | None = None, *,
                       statement: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``datapackage.json`` descriptor of the output tables ``frames`` (table -> rows); for a
    private release, ``plan`` (or its ``statement``, :func:`sensitivity_property`) adds which
    sensitivity its noise was calibrated to.

    Raises:
        ValueError: A table is not an output table, mixes private and non-private layouts with
            the others, or has a code without a label.
    """
    unknown = set(frames) - set(OUTPUT_TABLES)
    if unknown:
        raise ValueError(f"not output tables: {sorted(unknown)}")
    kinds = {is_private(f) for f in frames.values()}
    if len(kinds) > 1:
        raise ValueError("private and non-private tables in one folder")
    private = kinds != {False}
    resources: list[dict[str, Any]] = []
    for table in (t for t in OUTPUT_TABLES if t in frames):
        schema = table_schema(table, frames[table])
        spec = output_spec(table)
        common = {"type": "table", "title": f"{table}: {spec.title}", "description": _table_description(table, private)}
        resources.append({
            "name": resource_name(table, "csv"), "path": f"{table}/{table}.csv", **common,
            "scheme": "file", "format": "csv", "mediatype": "text/csv", "encoding": "utf-8",
            "dialect": {"$schema": DIALECT_PROFILE, "delimiter": CSV_SEPARATOR, "header": True},
            "schema": schema,
        })
        resources.append({
            "name": resource_name(table, "parquet"), "path": f"parquet/{table}.parquet", **common,
            "scheme": "file", "format": "parquet", "mediatype": PARQUET_MEDIATYPE,
            "schema": schema,
        })
    what = "private release" if private else "non-private tabulation (synthetic data; testing only)"
    calibrated = ""
    if private and plan is not None:
        statement = sensitivity_property(plan)
    if not private:
        statement = None
    if statement is not None:
        calibrated = (f"The noise of every measurement is calibrated to {statement['description']} "
                      "(property 'sensitivity'). ")
    descriptor = {
        "$schema": PROFILE,
        "name": "phsafe-sdhc" if private else "phsafe-sdhc-nonprivate",
        "title": f"S-DHC tables, PHSafe {what}",
        "description": (
            "Supplemental Demographic and Housing Characteristics File (S-DHC) tables PH1-PH8 "
            + ("under differential privacy (PHSafe): noisy counts with the variance of their noise. "
               "PH1, PH5 and PH8 are averages: divide the _num table by its _denom table. "
               if private else "tabulated exactly, without noise, for testing on synthetic data. ")
            + calibrated
            + "Each table is given twice, as |-separated CSV and as Parquet, with the same columns; "
            "every code's label is in its field's categories."
        ),
        "version": phsafe.__version__,
        "keywords": ["census", "S-DHC", "differential privacy", "PHSafe"],
        "resources": resources,
    }
    if statement is not None:
        descriptor["sensitivity"] = statement
    return descriptor


def write_datapackage(directory: Path, frames: Mapping[str, pd.DataFrame] | None = None, *,
                      plan: RunPlan | None = None) -> Path:
    """Write ``datapackage.json`` into ``directory`` for the output tables in it.

    Args:
        directory: An output folder (or its staging folder) holding ``<T>/<T>.csv`` and
            ``parquet/<T>.parquet``.
        frames: The tables as written (table -> rows); read back from the Parquet files of
            ``directory`` when None.
        plan: A private release's run plan: the descriptor states the sensitivity bound it used.
            Without it (rebuilding a published release's descriptor from its files), the
            statement comes from the release's manifest.

    Returns:
        The path written.

    Raises:
        ValueError: The descriptor does not validate against the Data Package profile (a
            defect), or see :func:`package_descriptor`.
    """
    import frictionless

    directory = Path(directory)
    if frames is None:
        frames = {t: pd.read_parquet(p) for t in OUTPUT_TABLES
                  if (p := directory / "parquet" / f"{t}.parquet").is_file()}
    statement = None if plan is not None else _statement_from_manifest(directory)
    descriptor = package_descriptor(frames, plan, statement=statement)
    report = frictionless.Package.validate_descriptor(descriptor)
    if not report.valid:
        raise ValueError("datapackage.json does not validate: "
                         + "; ".join(note for _, note in report.flatten(["type", "note"])))
    path = directory / DATAPACKAGE
    path.write_text(json.dumps(descriptor, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path



class SensitivityStatementError(ValueError):
    """A release's stated sensitivity bound disagrees with its plan: ``file`` says what."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file, self.reason = file, reason


def check_sensitivity_statement(directory: Path, files: Mapping[str, str], measurements: list[Any]) -> str:
    """What a release says about its sensitivity bound, against the plan the ledger or the public
    log holds (``measurements``: planned measurements, each with its ``bound`` and ``sensitivity``).

    The manifest's ``config.sensitivity`` and the data package's ``sensitivity`` must name the
    plan's one bound and, in the data package, every measurement's Delta as planned. Releases
    written before the key existed state nothing: their plan must be the paper's bound.

    Returns:
        One line saying what was verified.

    Raises:
        SensitivityStatementError: A statement disagrees with the plan (or the plan mixes bounds).
    """
    bounds = {m.bound for m in measurements}
    if len(bounds) != 1:
        raise SensitivityStatementError("plan", "its measurements are calibrated to different bounds")
    bound = bounds.pop()
    stated: list[str] = []
    manifest_path = Path(directory) / "manifest.json"
    if manifest_path.is_file():
        try:
            config = json.loads(manifest_path.read_text(encoding="utf-8")).get("config") or {}
        except (OSError, ValueError, AttributeError):
            raise SensitivityStatementError("manifest.json", "cannot be read as a JSON object") from None
        said = config.get("sensitivity", SensitivityBound.PAPER.value) if isinstance(config, dict) else None
        if said != bound.value:
            raise SensitivityStatementError("manifest.json", f"states the sensitivity bound {said!r}; the plan "
                                            f"calibrated every measurement to {bound.value!r}")
        stated.append("manifest.json")
    if DATAPACKAGE in files:
        try:
            descriptor = json.loads((Path(directory) / DATAPACKAGE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise SensitivityStatementError(DATAPACKAGE, "cannot be read as JSON") from None
        prop = descriptor.get("sensitivity") if isinstance(descriptor, dict) else None
        if prop is None:
            if bound is not SensitivityBound.PAPER:
                raise SensitivityStatementError(DATAPACKAGE, f"does not state the {bound.value!r} sensitivity bound "
                                                "its noise was calibrated to")
        else:
            want = [(m.table, m.level.config_key, m.sensitivity) for m in measurements]
            got = [(d.get("table"), d.get("level"), d.get("delta")) for d in prop.get("measurements", [])
                   if isinstance(d, dict)] if isinstance(prop, dict) else None
            if not isinstance(prop, dict) or prop.get("bound") != bound.value or sorted(got or [], key=str) != \
                    sorted(want, key=str):
                raise SensitivityStatementError(DATAPACKAGE, "its 'sensitivity' is not the plan's bound and "
                                                "per-measurement Delta")
            stated.append(DATAPACKAGE)
    where = " and ".join(stated) if stated else "nothing (an older release: the paper's bound)"
    return f"sensitivity: every measurement calibrated to the {bound.value} bound, as {where} state"
