"""The config key ``sensitivity``: "paper" (the default) or "exact"; anything else refused.

Refused by the loader (one error naming the key and its two values), by the config suite (rule
``config.sensitivity``, every broken rule at once), and on the command line before anything runs.
The default plans the production numbers, unchanged.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from phsafe.accounting import plan_run
from phsafe.cli import main
from phsafe.config import load_config, parse_config
from phsafe.errors import ConfigError
from phsafe.sensitivity import SensitivityBound
from phsafe.validation import _config
from phsafe.validation import validate

from tests.conftest import US_CONFIG


def _raw() -> dict[str, Any]:
    return copy.deepcopy(json.loads(US_CONFIG.read_text()))


def test_the_default_is_the_papers_bound_and_plans_the_production_numbers() -> None:
    default = load_config(US_CONFIG)
    assert default.sensitivity is SensitivityBound.PAPER
    raw = _raw()
    raw["sensitivity"] = "paper"
    explicit = parse_config(raw)
    for a, b in zip(plan_run(default).measurements, plan_run(explicit).measurements, strict=True):
        assert a == b
        assert a.sensitivity == (2 * a.tau + 2 if a.tau else 2)  # spec §5, integers
        assert isinstance(a.sensitivity, int)


def test_exact_is_accepted_and_changes_only_the_sensitivities() -> None:
    raw = _raw()
    raw["sensitivity"] = "exact"
    exact = parse_config(raw)
    assert exact.sensitivity is SensitivityBound.EXACT
    paper = plan_run(load_config(US_CONFIG)).measurements
    for p, e in zip(paper, plan_run(exact).measurements, strict=True):
        assert (p.key, p.budget, p.n_cells, p.tau) == (e.key, e.budget, e.n_cells, e.tau)
        assert e.sensitivity_squared < p.sensitivity_squared
        assert e.variance < p.variance


@pytest.mark.parametrize("value", ["Exact", "tight", "", "2tau+2", None, 1, True, ["exact"], {"bound": "exact"}])
def test_an_unknown_sensitivity_is_refused_naming_the_key_and_its_values(tmp_path: Path, value: Any) -> None:
    raw = _raw()
    raw["sensitivity"] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "sensitivity" and info.value.file == "config.json"
    assert '"paper"' in info.value.rule and '"exact"' in info.value.rule


def test_the_config_suite_refuses_it_too_beside_other_broken_rules() -> None:
    raw = _raw()
    raw["sensitivity"] = "tight"
    raw["tau"]["PH3"] = 0
    report = validate({"config": _config.flatten(raw)}, "config")
    assert {f.rule_id for f in report.failures} == {"config.sensitivity", "config.tau_positive"}
    for value in ("paper", "exact"):
        raw = _raw()
        raw["sensitivity"] = value
        assert validate({"config": _config.flatten(raw)}, "config").ok


def test_the_command_line_refuses_it_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    raw = _raw()
    raw["sensitivity"] = "tight"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw))
    result = CliRunner().invoke(main, ["-q", "private", str(config), str(tmp_path), str(tmp_path / "out"),
                                       "--ledger", str(tmp_path / "ledger.jsonl")])
    assert result.exit_code == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "ledger.jsonl").exists()
    assert result.output.startswith("phsafe: error: config.json: config key 'sensitivity': must be \"paper\"")
    assert len(result.output.strip().splitlines()) == 1
