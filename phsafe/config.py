"""The production ``config.json`` as typed, validated models (spec §2).

Budgets are kept exactly: JSON numbers are parsed as :class:`decimal.Decimal` (so ``2.2e-05`` is
exactly 0.000022) and every sum of budgets is done in exact arithmetic. ``Infinity`` (as Python's
``json`` reads it) is allowed and means "no noise" -- for non-production test runs only.

Every rule violation raises :class:`~phsafe.errors.ConfigError` naming the key and the rule.

Every key is known: an unknown key, at any level, is refused with the key and the file named --
a misspelt key (``"privacy_budgte"``, ``"PH2": {"usa_all": ...}``) would otherwise be silently
lost. (The spec's §2 says unknown top-level keys are "ignored with a log line"; the production
configs have none, and a run must not publish under a config that does not say what its operator
meant.)

Budgets are checked for sanity as the file is read, before anything else runs: a duplicate key
is an error (JSON would silently keep the last value); numbers are bounded in size so that exact
arithmetic on them cannot hang; every positive budget must leave a noise scale that 64-bit counts
can carry (:data:`MAX_NOISE_SCALE`). :func:`check_budget_policy` adds what a run on confidential
data must meet: no ``Infinity`` and no budget so large that its noise scale falls below one count
(such a release would be essentially exact).
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict

from phsafe.amounts import INFINITE
from phsafe.errors import BudgetError, ConfigError, os_reason
from phsafe.parameters import option
from phsafe.iterations import GeographyLevel, PopulationGroupLevel
from phsafe.schema import PUERTO_RICO, STATE_CODES
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TAU_TABLES
KNOWN_KEYS = frozenset({"privacy_defn", "privacy_budget", "tau", "state_filter", "reader", "dataset"})

MAX_NOISE_SCALE = 2**30
"""Largest noise scale a budget may imply (sigma for zCDP, s for pure DP): about 1e9 counts, so
that noisy counts stay far inside 64-bit integers. Smaller budgets are rejected."""
MIN_CONFIDENTIAL_SCALE = 1
"""Smallest noise scale a run on confidential data may use: one count."""
MAX_TAU = 100_000
"""Largest truncation threshold (the largest FINAL_POP of a unit)."""
_MAX_NUMBER_TEXT = 40  # characters of a JSON number literal
_MAX_EXPONENT = 40  # |decimal exponent| of a budget

class PrivacyDefinition(enum.Enum):
    """``zcdp``: budgets are rho, discrete Gaussian noise. ``puredp``: epsilon, geometric noise."""

    ZCDP = "zcdp"
    PUREDP = "puredp"


_DATASET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class PHSafeConfig(BaseModel):
    """A validated PHSafe configuration.

    Attributes:
        privacy_defn: zCDP or pure DP.
        privacy_budget: table -> population-group level -> budget (exact; may be Infinity).
        tau: person table -> truncation threshold.
        state_filter: state FIPS codes of the run, in config order.
        reader: always ``"csv"`` (CSV or Parquet files on disk).
        dataset: the declared dataset name the runs of this config spend against (optional;
            the command line's ``--dataset`` gives it otherwise).
    """

    # Infinity budgets ("no noise", test runs only) must survive model validation.
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, allow_inf_nan=True)

    privacy_defn: PrivacyDefinition
    privacy_budget: Mapping[str, Mapping[PopulationGroupLevel, Decimal]]
    tau: Mapping[str, int]
    state_filter: tuple[str, ...]
    reader: str = "csv"
    dataset: str | None = None

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


class _Pairs(list):
    """A JSON object as its (key, value) pairs, in order: duplicates are found with their path."""


class _NumberTooLong(Exception):
    pass


def _number(text: str) -> Decimal | int:
    """A JSON number, exactly: Decimal for fractions and exponents, int for plain integers.

    Literals longer than 40 characters are refused, so that neither parsing nor exact arithmetic
    on them can take unbounded time (``1e999999999`` is short but is caught by the range checks).
    """
    if len(text) > _MAX_NUMBER_TEXT:
        raise _NumberTooLong()  # carries nothing of the literal
    if any(c in text for c in ".eE"):
        return Decimal(text)
    return int(text)


def _constant(constant: str) -> Decimal:
    # Infinity is allowed (no noise, test runs only); NaN is reported against its key below.
    return Decimal(constant)


def _unpairs(value: Any, path: str) -> Any:
    """Turn parsed pairs into dicts, refusing duplicate keys (named with their path)."""
    if isinstance(value, _Pairs):
        out: dict[str, Any] = {}
        for k, v in value:
            where = f"{path}.{k}" if path else k
            if k in out:
                raise ConfigError(where, "appears twice in the same object (JSON would silently keep the last)")
            out[k] = _unpairs(v, where)
        return out
    if isinstance(value, list):
        return [_unpairs(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


# A config is a few hundred bytes; anything far larger is not one (and is not read whole).
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class ConfigFile:
    """One read of a ``config.json``: its bytes, their digest, and what they parse to.

    A run reads its config once, makes this, and passes it down: the ledger's config digest, the
    config suite's frame and the model every stage runs with all come from the same bytes, so a
    file edited during a run changes nothing of it.

    Attributes:
        path: Where it was read from (for messages).
        data: The bytes read.
        sha256: Hex SHA-256 of ``data``.
        document: The JSON document (the strict parse: exact numbers, no duplicate keys), or
            None when the bytes are not such a document.
        config: The validated model, or None when ``error`` says why not.
        error: Why the bytes are not a valid config, or None.
    """

    path: Path
    data: bytes = field(repr=False)
    sha256: str
    document: Any = field(repr=False, compare=False)
    config: PHSafeConfig | None = field(compare=False)
    error: ConfigError | None = field(compare=False)

    @property
    def name(self) -> str:
        return self.path.name

    def model(self) -> PHSafeConfig:
        """The validated config.

        Raises:
            ConfigError: The bytes are not a valid config (the first broken rule, key named).
        """
        if self.config is None:
            assert self.error is not None
            raise self.error
        return self.config


def read_config_file(path: str | Path) -> ConfigFile:
    """Read ``path`` once and parse it strictly (see :class:`ConfigFile`).

    A file that cannot be read raises; a file read but not valid is returned with its ``error``
    (validation reports it beside the other inputs' failures).

    Raises:
        ConfigError: The file is missing, a directory, unreadable or too large.
    """
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("<file>", f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError("<file>", f"config file {path} is a directory") from None
    except OSError as exc:
        raise ConfigError("<file>", f"config file {path} cannot be read ({os_reason(exc)})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError("<file>", f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes: not a config")
    sha256 = hashlib.sha256(data).hexdigest()
    document: Any = None
    try:
        document = parse_document(data, path.name)
        config = parse_config(document)
    except ConfigError as exc:
        error = exc if exc.file else ConfigError(exc.key, exc.rule, file=path.name)
        return ConfigFile(path, data, sha256, document, None, error)
    return ConfigFile(path, data, sha256, document, config, None)


def as_config_file(source: "ConfigFile | str | Path") -> ConfigFile:
    """``source`` itself when it is a :class:`ConfigFile` (a run passes its one read down),
    else one read of the file it names."""
    return source if isinstance(source, ConfigFile) else read_config_file(source)


def parse_document(data: bytes, name: str) -> Any:
    """The JSON document of a config's bytes: numbers exact, duplicate keys and overlong numbers
    refused (see :func:`_number`).

    Raises:
        ConfigError: Not UTF-8, not JSON, a duplicate key, a number too long, nested too deeply.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("<file>", f"config file {name} is not UTF-8 text", file=name) from None
    try:
        raw = json.loads(text, parse_float=_number, parse_int=_number, parse_constant=_constant,
                         object_pairs_hook=_Pairs)
        return _unpairs(raw, "")
    except json.JSONDecodeError as exc:
        raise ConfigError("<file>", f"{name} is not valid JSON (line {exc.lineno}, column {exc.colno})",
                          file=name) from None
    except _NumberTooLong:
        raise ConfigError("<file>", f"{name} holds a number longer than {_MAX_NUMBER_TEXT} characters",
                          file=name) from None
    except RecursionError:
        raise ConfigError("<file>", f"{name} is nested too deeply", file=name) from None
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.rule, file=name) from None


def load_config(path: str | Path) -> PHSafeConfig:
    """Read and validate ``config.json`` (one read; :func:`read_config_file` keeps the bytes).

    Raises:
        ConfigError: The file is missing, is not JSON, has a duplicate key or an overlong
            number, or breaks a rule of spec §2.
    """
    return read_config_file(path).model()


def parse_config(raw: Any) -> PHSafeConfig:
    """Validate an already-parsed configuration mapping (see :func:`load_config`)."""
    if not isinstance(raw, dict):
        raise ConfigError("<root>", "must be a JSON object")
    raw = _unpairs(raw, "")
    for key in ("privacy_defn", "privacy_budget", "tau", "state_filter", "reader"):
        if key not in raw:
            raise ConfigError(key, "is required")
    for key in raw:
        if key not in KNOWN_KEYS:
            raise ConfigError(str(key), "is not a key of the config (the keys are " + ", ".join(sorted(KNOWN_KEYS))
                              + "); a misspelt key would be silently lost, so none is ignored")

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

    dataset = raw.get("dataset")
    if dataset is not None and (not isinstance(dataset, str) or not _DATASET.fullmatch(dataset)):
        raise ConfigError("dataset", "must be a dataset name: letters, digits, '.', '_' and '-', at most 128, "
                                     "starting with a letter or digit (e.g. \"cef2020-us\")")
    _check_scales(defn, budgets, tau)

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
        dataset=dataset,
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
    if value.is_finite() and value != 0 and abs(value.adjusted()) > _MAX_EXPONENT:
        # Decided on the exponent alone: exact arithmetic on 1e999999999 would never finish.
        raise ConfigError(key, f"is out of range (budgets lie between 1e-{_MAX_EXPONENT} and 1e{_MAX_EXPONENT})")
    return value


def noise_scale(defn: PrivacyDefinition, budget: Decimal, sensitivity: int) -> float:
    """The noise scale a finite positive budget implies: sigma = Delta / sqrt(2 rho) (zCDP) or
    s = Delta / epsilon (pure DP), in counts."""
    if defn is PrivacyDefinition.ZCDP:
        return float(sensitivity) / float(2 * budget) ** 0.5
    return float(sensitivity) / float(budget)


def _sensitivity(table: str, tau: Mapping[str, int]) -> int:
    # The spec's integer sensitivities (§5): 2*tau+2 for person tables, 2 for unit tables.
    return 2 * tau[table] + 2 if table in tau else 2


def _check_scales(defn: PrivacyDefinition, budgets: Mapping[str, Mapping[PopulationGroupLevel, Decimal]],
                  tau: Mapping[str, int]) -> None:
    """Every finite positive budget leaves a noise scale 64-bit counts can carry."""
    for table, levels in budgets.items():
        for level, b in levels.items():
            if b == 0 or b.is_infinite():
                continue
            scale = noise_scale(defn, b, _sensitivity(table, tau))
            if scale > MAX_NOISE_SCALE:
                raise ConfigError(
                    f"privacy_budget.{table}.{level.config_key}",
                    f"is too small: its noise would have a scale of {scale:.3g} counts, more than 64-bit "
                    f"counts can carry (at most {MAX_NOISE_SCALE:.3g})",
                )


def check_budget_policy(config: "PHSafeConfig", *, non_confidential: bool) -> None:
    """What a run on confidential data must meet, on top of the config's own rules.

    No ``Infinity`` budget (no noise) and no budget so large that its noise scale falls below
    :data:`MIN_CONFIDENTIAL_SCALE` count: such a release would be essentially exact. Both are
    allowed for data declared non-confidential (synthetic data, tests).

    Whatever the data, a run must measure something: a config whose budgets are all 0 is refused.

    Raises:
        ConfigError: Every budget is 0.
        BudgetError: naming the level and what to do.
    """
    if not any(b != 0 for levels in config.privacy_budget.values() for b in levels.values()):
        raise ConfigError("privacy_budget", "every budget is 0: the run would measure and release nothing")
    if non_confidential:
        return
    if config.has_infinite_budget:
        raise BudgetError(
            "Infinity budgets (no noise) are for non-confidential test data only: "
            f"pass {option('non_confidential')} if this data is synthetic"
        )
    for table, levels in config.privacy_budget.items():
        for level, b in levels.items():
            if b == 0:
                continue
            scale = noise_scale(config.privacy_defn, b, _sensitivity(table, config.tau))
            if scale < MIN_CONFIDENTIAL_SCALE:
                raise BudgetError(
                    f"config key 'privacy_budget.{table}.{level.config_key}': {b} gives noise of scale "
                    f"{scale:.3g} counts, below {MIN_CONFIDENTIAL_SCALE}: the release would be essentially "
                    "exact. Production budgets are far smaller; such a budget is allowed only for "
                    f"synthetic data ({option('non_confidential')})"
                )


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
        if tau > MAX_TAU:
            raise ConfigError(key, f"must be at most {MAX_TAU} (the largest unit)")
        out[table] = tau
    return out
