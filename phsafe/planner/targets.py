"""MOE targets files and ``--tau`` / ``--state-filter`` values of ``phsafe plan``."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Mapping

from phsafe.errors import PlanningError
from phsafe.iterations import GeographyLevel, IterationLevel, PopulationGroupLevel
from phsafe.schema import PUERTO_RICO, STATE_CODES
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TAU_TABLES

_GEOGRAPHY_ALIASES = {"usa": GeographyLevel.USA, "us": GeographyLevel.USA, "nation": GeographyLevel.USA,
                      "state": GeographyLevel.STATE}
_ITERATION_ALIASES = {"*": IterationLevel.TOTAL, "unattributed": IterationLevel.TOTAL,
                      "total": IterationLevel.TOTAL, "a-g": IterationLevel.RACE_ALONE,
                      "h,i": IterationLevel.HISPANIC, "h-i": IterationLevel.HISPANIC}
_COLUMNS = ("table", "geography", "iteration", "moe")

Targets = dict[tuple[str, PopulationGroupLevel], Fraction]


def _parse_target(where: str, row: Mapping[str, Any], targets: Targets) -> None:
    missing = [c for c in _COLUMNS if c not in row or row[c] in (None, "")]
    if missing:
        raise PlanningError(f"{where}: missing {', '.join(missing)}")
    table = str(row["table"]).strip()
    if table not in TABLE_LEVELS:
        raise PlanningError(f"{where}: {table!r} is not a measured table ({', '.join(MEASURED_TABLES)})")
    geo = _GEOGRAPHY_ALIASES.get(str(row["geography"]).strip().lower())
    if geo is None:
        raise PlanningError(f"{where}: geography must be USA (or Nation) or STATE")
    it = _ITERATION_ALIASES.get(str(row["iteration"]).strip().lower())
    if it is None:
        raise PlanningError(f"{where}: iteration must be *, A-G or H,I (also: Unattributed, H-I)")
    level = PopulationGroupLevel(geo, it)
    if level not in TABLE_LEVELS[table]:
        raise PlanningError(f"{where}: {table} has no level {level.config_key}")
    raw = row["moe"]
    try:
        if isinstance(raw, bool):
            raise ValueError
        moe = Fraction(Decimal(str(raw).strip()) if not isinstance(raw, (int, Decimal)) else raw)
    except (ArithmeticError, ValueError):
        raise PlanningError(f"{where}: moe must be a positive decimal number") from None
    if moe <= 0:
        raise PlanningError(f"{where}: moe must be a positive decimal number")
    if (table, level) in targets:
        raise PlanningError(f"{where}: {table} {level.config_key} is listed twice")
    targets[(table, level)] = moe


def read_targets(path: str | Path) -> tuple[Targets, dict[str, int]]:
    """Read MOE targets from a CSV or JSON file.

    CSV: a header row with the columns ``table,geography,iteration,moe`` (any order, other
    columns ignored); lines starting with ``#`` are comments. JSON: a list of objects with the
    same keys, or ``{"targets": [...], "tau": {"PH1_num": 10, ...}}``. ``geography`` is ``USA``
    (or ``Nation``) or ``STATE``; ``iteration`` is ``*`` (or ``Unattributed``), ``A-G`` or
    ``H,I`` (or ``H-I``, which needs no quoting in CSV); ``moe`` is a positive decimal. Levels
    not listed are not measured (budget 0).

    Returns:
        The targets by (table, level), and the tau given in a JSON file (else empty).

    Raises:
        PlanningError: The file is missing or malformed; the message names the row and rule.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanningError(f"cannot read targets file {path}: {exc}") from None
    targets: Targets = {}
    tau: dict[str, int] = {}
    if path.suffix.lower() == ".json":
        try:
            raw = json.loads(text, parse_float=Decimal)
        except json.JSONDecodeError as exc:
            raise PlanningError(f"{path.name} is not valid JSON (line {exc.lineno})") from None
        rows = raw
        if isinstance(raw, dict):
            rows = raw.get("targets")
            tau_raw = raw.get("tau", {})
            if not isinstance(tau_raw, dict):
                raise PlanningError(f"{path.name}: tau must be an object")
            tau = {str(k): v for k, v in tau_raw.items()}
        if not isinstance(rows, list):
            raise PlanningError(f"{path.name}: expected a list of targets (or an object with 'targets')")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise PlanningError(f"{path.name}: target {i} must be an object")
            _parse_target(f"{path.name}: target {i}", row, targets)
    else:
        lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
        reader = csv.DictReader(io.StringIO("\n".join(lines)))
        header = [h.strip().lower() for h in (reader.fieldnames or [])]
        if not set(_COLUMNS) <= set(header):
            raise PlanningError(f"{path.name}: the header must name the columns {','.join(_COLUMNS)}")
        reader.fieldnames = header
        for i, row in enumerate(reader, start=2):
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue
            _parse_target(f"{path.name}: data row {i - 1}", row, targets)
    if not targets:
        raise PlanningError(f"{path.name}: no MOE targets")
    return targets, tau


def parse_tau(specs: Iterable[str], base: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Truncation thresholds from ``--tau`` values.

    Each spec is ``TABLE=N`` (e.g. ``PH3=6``), several of them comma-separated, or a bare ``N``
    that sets every person table; later specs override earlier ones and ``base`` (the tau of a
    JSON targets file).
    """
    out: dict[str, int] = {}
    for table, value in (base or {}).items():
        out[table] = _tau_value(table, value)
    for spec in specs:
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            if "=" in part:
                table, value = (s.strip() for s in part.split("=", 1))
                out[table] = _tau_value(table, value)
            else:
                n = _tau_value("--tau", part)
                out.update({t: n for t in TAU_TABLES})
    return out


def _tau_value(table: str, value: Any) -> int:
    if table != "--tau" and table not in TAU_TABLES:
        raise PlanningError(f"tau: {table!r} is not a person table ({', '.join(TAU_TABLES)})")
    try:
        if isinstance(value, bool):
            raise ValueError
        n = int(str(value))
    except ValueError:
        raise PlanningError(f"tau for {table}: must be an integer >= 1") from None
    if n < 1:
        raise PlanningError(f"tau for {table}: must be an integer >= 1")
    return n


def parse_state_filter(value: str) -> list[str]:
    """``us`` (the 50 states and DC), ``pr`` (Puerto Rico) or comma-separated FIPS codes."""
    v = value.strip().lower()
    if v == "us":
        return sorted(STATE_CODES)
    if v == "pr":
        return [PUERTO_RICO]
    return [s.strip() for s in value.split(",") if s.strip()]
