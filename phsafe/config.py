"""The production ``config.json`` as typed, validated models (spec §2).

Budgets are kept exactly: JSON numbers are parsed as :class:`decimal.Decimal` (so ``2.2e-05`` is
exactly 0.000022) and every sum of budgets is done in exact arithmetic. ``Infinity`` (as Python's
``json`` reads it) is allowed and means "no noise" -- for non-production test runs only.

Every rule violation raises :class:`~phsafe.errors.ConfigError` naming the key and the rule.
"""

from __future__ import annotations

import enum
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict

from phsafe.errors import ConfigError
from phsafe.logs import get_logger
from phsafe.iterations import GeographyLevel, PopulationGroupLevel
from phsafe.schema import PUERTO_RICO, STATE_CODES
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TAU_TABLES
KNOWN_KEYS = frozenset({"privacy_defn", "privacy_budget", "tau", "state_filter", "reader"})


class PrivacyDefinition(enum.Enum):
    """``zcdp``: budgets are rho, discrete Gaussian noise. ``puredp``: epsilon, geometric noise."""

    ZCDP = "zcdp"
    PUREDP = "puredp"


INFINITE = Decimal("Infinity")


class PHSafeConfig(BaseModel):
    """A validated PHSafe configuration.

    Attributes:
        privacy_defn: zCDP or pure DP.
        privacy_budget: table -> population-group level -> budget (exact; may be Infinity).
        tau: person table -> truncation threshold.
        state_filter: state FIPS codes of the run, in config order.
        reader: always ``"csv"`` (CSV or Parquet files on disk).
        ignored_keys: top-level keys that were present but are not part of the contract.
    """

    # Infinity budgets ("no noise", test runs only) must survive model validation.
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, allow_inf_nan=True)

    privacy_defn: PrivacyDefinition
    privacy_budget: Mapping[str, Mapping[PopulationGroupLevel, Decimal]]
    tau: Mapping[str, int]
    state_filter: tuple[str, ...]
    reader: str = "csv"
    ignored_keys: tuple[str, ...] = ()

    @property
    def is_puerto_rico(self) -> bool:
        return self.state_filter == (PUERTO_RICO,)

    @property
    def states(self) -> tuple[str, ...]:
        """Released states, sorted by FIPS code (the public STATE domain)."""
        return tuple(sorted(self.state_filter))

    @property
    def has_infinite_budget(self) -> bool:
        return any(b == INFINITE for lv in self.privacy_budget.values() for b in lv.values())

    def budget(self, table: str, level: PopulationGroupLevel) -> Decimal:
        return self.privacy_budget[table][level]

    def measured_levels(self, table: str) -> tuple[PopulationGroupLevel, ...]:
        """Levels of ``table`` with a positive budget, i.e. the ones measured and released."""
        return tuple(lv for lv in TABLE_LEVELS[table] if self.privacy_budget[table][lv] > 0)

    def geography_levels(self) -> tuple[GeographyLevel, ...]:
        """Geography levels this run can release: Puerto Rico has no USA level."""
        if self.is_puerto_rico:
            return (GeographyLevel.STATE,)
        return (GeographyLevel.USA, GeographyLevel.STATE)

    def total_budget(self) -> Fraction | Decimal:
        """Sequential composition: the exact sum of every finite budget (Infinity if any is)."""
        if self.has_infinite_budget:
            return INFINITE
        return sum(
            (Fraction(b) for lv in self.privacy_budget.values() for b in lv.values()),
            Fraction(0),
        )


def _reject_nan(constant: str) -> Decimal:
    if constant == "NaN":
        # A NaN budget has no meaning; reported against the key by the checks below.
        return Decimal("NaN")
    return Decimal(constant)


def load_config(path: str | Path) -> PHSafeConfig:
    """Read and validate ``config.json``.

    Raises:
        ConfigError: The file is missing, is not JSON, or breaks a rule of spec §2.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("<file>", f"config file {path} does not exist") from None
    except UnicodeDecodeError:
        raise ConfigError("<file>", f"config file {path.name} is not UTF-8 text") from None
    try:
        raw = json.loads(text, parse_float=Decimal, parse_constant=_reject_nan)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "<file>", f"{path.name} is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    try:
        return parse_config(raw)
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.rule, file=path.name) from None


def parse_config(raw: Any) -> PHSafeConfig:
    """Validate an already-parsed configuration mapping (see :func:`load_config`)."""
    if not isinstance(raw, dict):
        raise ConfigError("<root>", "must be a JSON object")
    for key in ("privacy_defn", "privacy_budget", "tau", "state_filter", "reader"):
        if key not in raw:
            raise ConfigError(key, "is required")
    ignored = tuple(sorted(k for k in raw if k not in KNOWN_KEYS))
    for key in ignored:
        get_logger("phsafe.config").warning("config key ignored", key=key)

    defn_raw = raw["privacy_defn"]
    try:
        defn = PrivacyDefinition(defn_raw)
    except ValueError:
        raise ConfigError("privacy_defn", 'must be "zcdp" or "puredp"') from None

    reader = raw["reader"]
    if reader == "cef":
        raise ConfigError(
            "reader",
            'the Census-internal "cef" reader is not part of this project; use "csv" '
            "(CSV or Parquet files in the data directory)",
        )
    if reader != "csv":
        raise ConfigError("reader", 'must be "csv"')

    states = _parse_state_filter(raw["state_filter"])
    budgets = _parse_budgets(raw["privacy_budget"])
    tau = _parse_tau(raw["tau"])

    if states == (PUERTO_RICO,):
        for table, levels in budgets.items():
            for level, value in levels.items():
                if level.geography is GeographyLevel.USA and value != 0:
                    raise ConfigError(
                        f"privacy_budget.{table}.{level.config_key}",
                        "must be 0 for a Puerto Rico run (Puerto Rico has no USA level)",
                    )
    return PHSafeConfig(
        privacy_defn=defn,
        privacy_budget=budgets,
        tau=tau,
        state_filter=states,
        reader=reader,
        ignored_keys=ignored,
    )


def _parse_state_filter(value: Any) -> tuple[str, ...]:
    key = "state_filter"
    if not isinstance(value, list) or not value:
        raise ConfigError(key, "must be a non-empty list of 2-digit state FIPS codes")
    for i, code in enumerate(value):
        if not isinstance(code, str) or len(code) != 2 or not code.isdigit():
            raise ConfigError(f"{key}[{i}]", "must be a 2-digit state FIPS code as a string, e.g. \"01\"")
        if code != PUERTO_RICO and code not in STATE_CODES:
            raise ConfigError(
                f"{key}[{i}]", "is not a state FIPS code (01-56 except 03, 07, 14, 43, 52; or 72)"
            )
    if len(set(value)) != len(value):
        raise ConfigError(key, "must not list a state twice")
    if PUERTO_RICO in value and len(value) > 1:
        raise ConfigError(key, 'Puerto Rico ("72") is a separate run and cannot be mixed with states')
    return tuple(value)


def _parse_budget_value(key: str, value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise ConfigError(key, "must be a number")
    # A float can only come from a mapping parsed without load_config; its shortest repr is the
    # decimal literal it was read from.
    value = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if value.is_nan():
        raise ConfigError(key, "must be a number, not NaN")
    if value < 0:
        raise ConfigError(key, "must be non-negative")
    return value


def _parse_budgets(value: Any) -> dict[str, dict[PopulationGroupLevel, Decimal]]:
    if not isinstance(value, dict):
        raise ConfigError("privacy_budget", "must be an object mapping table names to budgets")
    for table in value:
        if table not in TABLE_LEVELS:
            raise ConfigError(
                f"privacy_budget.{table}", f"is not a measured table (expected one of {', '.join(MEASURED_TABLES)})"
            )
    out: dict[str, dict[PopulationGroupLevel, Decimal]] = {}
    for table in MEASURED_TABLES:
        if table not in value:
            raise ConfigError(f"privacy_budget.{table}", "is required")
        entry = value[table]
        if not isinstance(entry, dict):
            raise ConfigError(f"privacy_budget.{table}", "must be an object mapping levels to budgets")
        expected = {lv.config_key: lv for lv in TABLE_LEVELS[table]}
        for k in entry:
            if k not in expected:
                raise ConfigError(
                    f"privacy_budget.{table}.{k}",
                    f"is not a level of {table} (expected {', '.join(expected)})",
                )
        levels: dict[PopulationGroupLevel, Decimal] = {}
        for k, level in expected.items():
            if k not in entry:
                raise ConfigError(f"privacy_budget.{table}.{k}", "is required")
            levels[level] = _parse_budget_value(f"privacy_budget.{table}.{k}", entry[k])
        out[table] = levels
    return out


def _parse_tau(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ConfigError("tau", "must be an object mapping person tables to integers")
    for table in value:
        if table not in TAU_TABLES:
            raise ConfigError(f"tau.{table}", f"is not a person table (expected one of {', '.join(TAU_TABLES)})")
    out: dict[str, int] = {}
    for table in TAU_TABLES:
        key = f"tau.{table}"
        if table not in value:
            raise ConfigError(key, "is required")
        tau = value[table]
        if isinstance(tau, bool) or not isinstance(tau, int):
            raise ConfigError(key, "must be an integer")
        if tau < 1:
            raise ConfigError(key, "must be at least 1")
        out[table] = tau
    return out
