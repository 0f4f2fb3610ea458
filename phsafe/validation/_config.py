"""The configuration: the run's one read of it, and the config suite on a flat frame.

:func:`phsafe.config.read_config_file` is the authority (the engine runs with the model it
makes) and names the first offending key; the ``config`` suite states the same rules of spec §2
for review and reports every broken rule at once, on the same read's JSON document flattened to
one row per entry (a document that is not strict JSON -- a duplicate key, an overlong number --
has no frame: the load failure says why).
"""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd

from phsafe.config import ConfigFile, PHSafeConfig, as_config_file
from phsafe.errors import ConfigError
from phsafe.schema import PUERTO_RICO
from phsafe.validation._report import Failure

_SECTIONS = ("privacy_defn", "privacy_budget", "tau", "state_filter", "reader", "sensitivity")
_FRAME_COLUMNS = ("KEY", "SECTION", "GEOGRAPHY", "TEXT", "NUMBER", "IS_INTEGER", "STATE_COUNT",
                  "STATE_REPEATS", "PUERTO_RICO")


def load(source: ConfigFile | Path) -> tuple[ConfigFile, Failure | None]:
    """The run's read of its config (made here from a path), and the failure naming the
    offending key when it is not a valid config."""
    name = source.name if isinstance(source, ConfigFile) else Path(source).name
    try:
        config_file = as_config_file(source)
    except ConfigError as exc:  # not readable at all: no bytes, no document
        empty = ConfigFile(Path(name), b"", "", None, None, exc)
        return empty, Failure(name, (exc.key,), exc.rule, suite=None, rule_id="config.load", row_noun="key")
    if config_file.error is None:
        return config_file, None
    exc = config_file.error
    return config_file, Failure(name, (exc.key,), exc.rule, suite=None, rule_id="config.load", row_noun="key")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def flatten(raw: Any) -> pd.DataFrame:
    """The config as one row per entry (see the frame's description in ``config.json``)."""
    rows: list[dict[str, Any]] = []
    if not isinstance(raw, dict):
        return pd.DataFrame({c: [] for c in _FRAME_COLUMNS})
    states = raw.get("state_filter")
    state_list = states if isinstance(states, list) else []
    puerto_rico = state_list == [PUERTO_RICO]  # a Puerto Rico run (mixing is its own rule)

    def row(key: str, section: str, value: Any, **extra: Any) -> None:
        rows.append(
            {
                "KEY": key,
                "SECTION": section,
                "GEOGRAPHY": extra.get("geography"),
                "TEXT": value if isinstance(value, str) else None,
                "NUMBER": _number(value),
                "IS_INTEGER": _is_integer(value),
                "STATE_COUNT": extra.get("state_count"),
                "STATE_REPEATS": extra.get("state_repeats"),
                "PUERTO_RICO": puerto_rico,
            }
        )

    for section in _SECTIONS:
        if section not in raw:
            continue
        value = raw[section]
        if section == "privacy_budget" and isinstance(value, dict):
            for table, levels in value.items():
                if not isinstance(levels, dict):
                    row(f"privacy_budget.{table}", section, None)
                    continue
                for level, budget in levels.items():
                    geography = level.split("_", 1)[0] if "_" in level else None
                    row(f"privacy_budget.{table}.{level}", section, budget, geography=geography)
        elif section == "tau" and isinstance(value, dict):
            for table, tau in value.items():
                row(f"tau.{table}", section, tau)
        elif section == "state_filter" and isinstance(value, list):
            hashable = [v if isinstance(v, (str, int, float)) else repr(v) for v in value]
            for i, code in enumerate(value):
                row(f"state_filter[{i}]", section, code, state_count=len(value),
                    state_repeats=hashable.count(hashable[i]))
        else:
            row(section, section, value if not isinstance(value, (dict, list)) else None)
    frame = pd.DataFrame(rows, columns=list(_FRAME_COLUMNS))
    for name in ("STATE_COUNT", "STATE_REPEATS"):
        frame[name] = frame[name].astype("Int64")
    frame["NUMBER"] = frame["NUMBER"].astype("float64")
    frame["IS_INTEGER"] = frame["IS_INTEGER"].astype(bool)
    frame["PUERTO_RICO"] = frame["PUERTO_RICO"].astype(bool)
    for name in ("KEY", "SECTION", "GEOGRAPHY", "TEXT"):
        frame[name] = frame[name].astype("str")
    return frame


def state_filter(config: PHSafeConfig | None, raw: Any) -> list[str] | None:
    """The state filter the geo rule checks against, if the config gives a usable one."""
    if config is not None:
        return list(config.state_filter)
    states = raw.get("state_filter") if isinstance(raw, dict) else None
    if isinstance(states, list) and states and all(isinstance(s, str) for s in states):
        return list(states)
    return None
