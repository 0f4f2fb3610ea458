"""Small configs for the empirical audit's tests: the production budgets and taus on a few states."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from phsafe.audit.empirical.audit import PRODUCTION_US_CONFIG
from phsafe.config import PHSafeConfig, parse_config


def config_mapping(states: list[str], privacy_defn: str = "zcdp", **tau: int) -> dict:
    """The production US config's keys with ``states``, some taus changed; pure DP: epsilon 1 at
    the state levels, 0.05 at the nation's."""
    raw = json.loads(json.dumps(PRODUCTION_US_CONFIG))
    raw["state_filter"] = list(states)
    raw["tau"].update(tau)
    raw["privacy_defn"] = privacy_defn
    budgets = {t: {k: Decimal(v) for k, v in lv.items()} for t, lv in raw["privacy_budget"].items()}
    if privacy_defn == "puredp":
        budgets = {t: {k: Decimal("1") if k.startswith("state") else Decimal("0.05") for k in lv}
                   for t, lv in budgets.items()}
    raw["privacy_budget"] = budgets
    return raw


def small_config(states: list[str], privacy_defn: str = "zcdp", **tau: int) -> PHSafeConfig:
    return parse_config(config_mapping(states, privacy_defn, **tau))


def write_config(path: Path, states: list[str], **tau: int) -> Path:
    """The same as a ``config.json`` file."""
    raw = config_mapping(states, **tau)
    raw["privacy_budget"] = {t: {k: float(v) for k, v in lv.items()} for t, lv in raw["privacy_budget"].items()}
    path.write_text(json.dumps(raw))
    return path
