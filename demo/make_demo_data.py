"""Regenerate the bundled synthetic demo inputs in ``demo/data/`` (deterministic).

Run from the repository root::

    .venv/bin/python demo/make_demo_data.py

It writes ``demo/data/us/`` (about 20,000 persons in Alabama, California, the District of
Columbia, New York and Texas) and ``demo/data/pr/`` (about 5,000 persons in Puerto Rico), each
with ``persons.csv``, ``units.csv``, ``geo.csv`` and a ``config.json`` in the production format
with the production (unbounded, zCDP) budgets of the PHSafe paper's Table 10. The seeds below
are for the synthetic data only; they have nothing to do with privacy noise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEMO_DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DEMO_DATA.parent.parent))  # run from a checkout without installing

from phsafe import synthetic  # noqa: E402

US_STATES = ["01", "06", "11", "36", "48"]
US_PERSONS, US_SEED = 20_000, 20200401
PR_PERSONS, PR_SEED = 5_000, 20200402

# Production budgets (rho per population-group level), as in the production config files.
_LEVELS = ("usa_A-G", "usa_H,I", "usa_*", "state_A-G", "state_H,I", "state_*")
_PERSON = (0.002619, 0.002619, 0.002619, 0.141622, 0.016371, 0.016371)
_UNIT = (2.2e-05, 2.2e-05, 2.2e-05, 0.00117, 0.000135, 0.000135)
_PH3 = (0.001061, 0.001061, 0.001061, 0.662976, 0.00663, 0.00663)
_BUDGETS = {
    "PH1_num": _PERSON, "PH1_denom": _UNIT, "PH2": (0.002619, 0.016371), "PH3": _PH3,
    "PH4": _PERSON, "PH5_denom": _UNIT, "PH6": (0.001061, 0.00663), "PH7": _PERSON,
    "PH8_denom": _UNIT,
}
_TAU = {"PH1_num": 10, "PH2": 10, "PH3": 6, "PH4": 10, "PH6": 6, "PH7": 10}


def production_config(state_filter: list[str], *, puerto_rico: bool) -> dict[str, Any]:
    """A config in the exact production format (key order included).

    Args:
        state_filter: The run's states.
        puerto_rico: Whether this is the Puerto Rico run (all ``usa_*`` budgets are 0).

    Returns:
        The config as a JSON-ready dict.
    """
    budget: dict[str, dict[str, float]] = {}
    for table, values in _BUDGETS.items():
        levels = _LEVELS if len(values) == 6 else ("usa_*", "state_*")
        budget[table] = {
            level: (0.0 if puerto_rico and level.startswith("usa_") else value)
            for level, value in zip(levels, values)
        }
    return {"privacy_budget": budget, "tau": dict(_TAU), "state_filter": list(state_filter),
            "reader": "csv", "privacy_defn": "zcdp"}


def make(directory: Path, n_persons: int, states: list[str], seed: int,
         *, puerto_rico: bool) -> None:
    """Generate one demo data directory with its config."""
    data = synthetic.generate(n_persons, states, seed=seed)
    synthetic.write(data, directory, fmt="csv")
    config = production_config(states, puerto_rico=puerto_rico)
    (directory / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    print(f"{directory}: {len(data.persons)} persons, {len(data.units)} units")


def main() -> None:
    make(DEMO_DATA / "us", US_PERSONS, US_STATES, US_SEED, puerto_rico=False)
    make(DEMO_DATA / "pr", PR_PERSONS, ["72"], PR_SEED, puerto_rico=True)


if __name__ == "__main__":
    main()
