"""Every configuration rule of spec §2 has a failing case whose message names the key and rule.

The valid base configuration is the production US config from ``../shared/fixtures``; each test
breaks exactly one rule and asserts :class:`ConfigError`'s ``.key`` and words of ``.rule``.
"""

from __future__ import annotations

import copy
import json
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from phsafe.config import PrivacyDefinition, load_config, parse_config
from phsafe.errors import ConfigError
from phsafe.iterations import GeographyLevel

from tests.conftest import PR_CONFIG, US_CONFIG

# Written out here from spec §2, independently of phsafe.tables.
RACE_ITERATED = ("PH1_num", "PH1_denom", "PH3", "PH4", "PH5_denom", "PH7", "PH8_denom")
TOTAL_ONLY = ("PH2", "PH6")
ALL_LEVEL_KEYS = ("usa_*", "usa_A-G", "usa_H,I", "state_*", "state_A-G", "state_H,I")
TOTAL_LEVEL_KEYS = ("usa_*", "state_*")
PERSON_TABLES = ("PH1_num", "PH2", "PH3", "PH4", "PH6", "PH7")


def _raw(path: Path = US_CONFIG) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture
def base() -> dict[str, Any]:
    return copy.deepcopy(_raw())


def _write(tmp_path: Path, raw: Any) -> Path:
    path = tmp_path / "config.json"
    # allow_nan (the default) writes NaN / Infinity / -Infinity as Python's json reads them.
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def _fails(tmp_path: Path, raw: Any) -> ConfigError:
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    # The message carries both the key and the rule, for the one-line CLI error.
    assert err.key in str(err) and err.rule in str(err)
    return err


def _zcdp_valid(tmp_path: Path, raw: dict[str, Any]):
    return load_config(_write(tmp_path, raw))


# --------------------------------------------------------------------------------------------
# Production configs
# --------------------------------------------------------------------------------------------


def test_production_us_config_loads_with_exact_total() -> None:
    config = load_config(US_CONFIG)
    assert config.privacy_defn is PrivacyDefinition.ZCDP
    assert len(config.state_filter) == 51 and not config.is_puerto_rico
    assert config.total_budget() == Fraction(1257281, 1000000)
    assert not config.has_infinite_budget


def test_production_pr_config_loads_with_exact_total() -> None:
    config = load_config(PR_CONFIG)
    assert config.is_puerto_rico
    assert config.state_filter == ("72",)
    assert config.total_budget() == Fraction(1226649, 1000000)


def test_total_is_the_exact_sum_of_the_json_numbers() -> None:
    # Independent of phsafe: sum the decimal strings of the file exactly.
    for path in (US_CONFIG, PR_CONFIG):
        raw = json.loads(path.read_text(), parse_float=Decimal)
        expected = sum(
            (Fraction(v) for levels in raw["privacy_budget"].values() for v in levels.values()),
            Fraction(0),
        )
        assert load_config(path).total_budget() == expected


def test_small_budget_is_parsed_exactly() -> None:
    config = load_config(US_CONFIG)
    budgets = {str(lv): b for lv, b in config.privacy_budget["PH1_denom"].items()}
    assert budgets["usa_*"] == Decimal("0.000022")
    assert Fraction(budgets["usa_*"]) == Fraction(22, 1_000_000)
    # float(2.2e-05) is not 22/10^6; the parse must not go through a float.
    assert Fraction(2.2e-05) != Fraction(22, 1_000_000)


def test_production_budgets_and_taus_are_read_per_level() -> None:
    config = load_config(US_CONFIG)
    raw = json.loads(US_CONFIG.read_text(), parse_float=Decimal)
    for table, levels in raw["privacy_budget"].items():
        got = {lv.config_key: b for lv, b in config.privacy_budget[table].items()}
        assert got == levels, table
    assert dict(config.tau) == raw["tau"]


def test_puerto_rico_has_no_usa_geography_level() -> None:
    from phsafe.domain import regions

    config = load_config(PR_CONFIG)
    assert config.geography_levels() == (GeographyLevel.STATE,)
    assert regions(GeographyLevel.USA, config) == ()
    for table in RACE_ITERATED + TOTAL_ONLY:
        assert all(lv.geography is GeographyLevel.STATE for lv in config.measured_levels(table))
    us = load_config(US_CONFIG)
    assert set(us.geography_levels()) == {GeographyLevel.USA, GeographyLevel.STATE}


def test_state_domain_is_sorted_state_filter() -> None:
    config = load_config(US_CONFIG)
    assert config.states == tuple(sorted(_raw()["state_filter"]))


# --------------------------------------------------------------------------------------------
# The file itself
# --------------------------------------------------------------------------------------------


def test_not_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"privacy_defn": "zcdp",', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "<file>"
    assert "not valid JSON" in info.value.rule


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.json")
    assert info.value.key == "<file>"
    assert "does not exist" in info.value.rule


@pytest.mark.parametrize("raw", [[1, 2], "zcdp", 3, None])
def test_not_an_object(tmp_path: Path, raw: Any) -> None:
    err = _fails(tmp_path, raw)
    assert err.key == "<root>"
    assert "JSON object" in err.rule


@pytest.mark.parametrize("key", ["privacy_defn", "privacy_budget", "tau", "state_filter", "reader"])
def test_missing_top_level_key(tmp_path: Path, base: dict[str, Any], key: str) -> None:
    del base[key]
    err = _fails(tmp_path, base)
    assert err.key == key
    assert "required" in err.rule


@pytest.mark.parametrize(("where", "key"), [
    ((), "comment"),                                   # a key the contract does not have
    ((), "privacy_budgte"),                            # a misspelt one: its budgets would be lost
    (("privacy_budget",), "PH9"),                      # a table that does not exist
    (("privacy_budget", "PH2"), "usa_A-G"),            # a level PH2 does not have
    (("privacy_budget", "PH3"), "state_ALL"),          # a misspelt level
    (("tau",), "PH5_num"),                             # a table without tau
])
def test_an_unknown_key_at_any_level_is_refused_naming_key_and_file(tmp_path: Path, base: dict[str, Any],
                                                                    where: tuple[str, ...], key: str) -> None:
    """Issue 22: no key is silently ignored (the spec's "ignored with a log line" departs here:
    a misspelt key would lose what the operator meant)."""
    target = base
    for part in where:
        target = target[part]
    target[key] = 1
    err = _fails(tmp_path, base)
    assert err.key == ".".join((*where, key)) and err.file == "config.json"
    assert str(err).startswith(f"config.json: config key '{err.key}': ")


def test_the_refusal_is_one_line_on_the_command_line(tmp_path: Path, base: dict[str, Any]) -> None:
    from click.testing import CliRunner

    from phsafe.cli import main

    base["foo"] = {"bar": 1}
    config = _write(tmp_path, base)
    result = CliRunner().invoke(main, ["-q", "private", str(config), str(tmp_path), str(tmp_path / "out"),
                                       "--ledger", str(tmp_path / "ledger.jsonl")])
    assert result.exit_code == 1 and not (tmp_path / "out").exists()
    assert result.output.startswith("phsafe: error: config.json: config key 'foo': is not a key of the config")
    assert len(result.output.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------
# privacy_defn and reader
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("defn", ["approxdp", "ZCDP", "", None, 1])
def test_unknown_privacy_defn(tmp_path: Path, base: dict[str, Any], defn: Any) -> None:
    base["privacy_defn"] = defn
    err = _fails(tmp_path, base)
    assert err.key == "privacy_defn"
    assert "zcdp" in err.rule and "puredp" in err.rule


def test_puredp_is_accepted(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_defn"] = "puredp"
    assert _zcdp_valid(tmp_path, base).privacy_defn is PrivacyDefinition.PUREDP


def test_cef_reader_gets_a_clear_error(tmp_path: Path, base: dict[str, Any]) -> None:
    base["reader"] = "cef"
    err = _fails(tmp_path, base)
    assert err.key == "reader"
    assert "cef" in err.rule and "csv" in err.rule


@pytest.mark.parametrize("reader", ["parquet", "CSV", "", None, 0])
def test_other_readers_are_rejected(tmp_path: Path, base: dict[str, Any], reader: Any) -> None:
    base["reader"] = reader
    err = _fails(tmp_path, base)
    assert err.key == "reader"
    assert "csv" in err.rule


# --------------------------------------------------------------------------------------------
# privacy_budget
# --------------------------------------------------------------------------------------------


def test_budget_not_an_object(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_budget"] = [0.1]
    err = _fails(tmp_path, base)
    assert err.key == "privacy_budget"
    assert "object" in err.rule


def test_unknown_table(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_budget"]["PH9"] = {"usa_*": 0.1, "state_*": 0.1}
    err = _fails(tmp_path, base)
    assert err.key == "privacy_budget.PH9"
    assert "not a measured table" in err.rule


@pytest.mark.parametrize("table", ["PH5_num", "PH8_num"])
def test_derived_table_has_no_budget(tmp_path: Path, base: dict[str, Any], table: str) -> None:
    base["privacy_budget"][table] = {k: 0.1 for k in ALL_LEVEL_KEYS}
    err = _fails(tmp_path, base)
    assert err.key == f"privacy_budget.{table}"
    assert "not a measured table" in err.rule


@pytest.mark.parametrize("table", RACE_ITERATED + TOTAL_ONLY)
def test_missing_table(tmp_path: Path, base: dict[str, Any], table: str) -> None:
    del base["privacy_budget"][table]
    err = _fails(tmp_path, base)
    assert err.key == f"privacy_budget.{table}"
    assert "required" in err.rule


def test_table_entry_not_an_object(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_budget"]["PH3"] = 0.5
    err = _fails(tmp_path, base)
    assert err.key == "privacy_budget.PH3"
    assert "object" in err.rule


@pytest.mark.parametrize(
    ("table", "level"),
    [("PH1_num", "state_AG"), ("PH3", "usa_H"), ("PH2", "usa_A-G"), ("PH6", "state_H,I"),
     ("PH8_denom", "county_*"), ("PH4", "USA_*")],
)
def test_unknown_level_key(tmp_path: Path, base: dict[str, Any], table: str, level: str) -> None:
    base["privacy_budget"][table][level] = 0.1
    err = _fails(tmp_path, base)
    assert err.key == f"privacy_budget.{table}.{level}"
    assert f"not a level of {table}" in err.rule


@pytest.mark.parametrize(
    ("table", "level"),
    [(t, k) for t in RACE_ITERATED for k in ALL_LEVEL_KEYS]
    + [(t, k) for t in TOTAL_ONLY for k in TOTAL_LEVEL_KEYS],
)
def test_missing_level_key(tmp_path: Path, base: dict[str, Any], table: str, level: str) -> None:
    del base["privacy_budget"][table][level]
    err = _fails(tmp_path, base)
    assert err.key == f"privacy_budget.{table}.{level}"
    assert "required" in err.rule


@pytest.mark.parametrize("value", [-0.1, -1, -1e-300])
def test_negative_budget(tmp_path: Path, base: dict[str, Any], value: float) -> None:
    base["privacy_budget"]["PH4"]["state_H,I"] = value
    err = _fails(tmp_path, base)
    assert err.key == "privacy_budget.PH4.state_H,I"
    assert "non-negative" in err.rule


def test_minus_infinity_budget(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_budget"]["PH7"]["usa_*"] = float("-inf")
    assert "-Infinity" in json.dumps(base)
    err = _fails(tmp_path, base)
    assert err.key == "privacy_budget.PH7.usa_*"
    assert "non-negative" in err.rule


def test_nan_budget(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_budget"]["PH2"]["state_*"] = float("nan")
    assert "NaN" in json.dumps(base)
    err = _fails(tmp_path, base)
    assert err.key == "privacy_budget.PH2.state_*"
    assert "NaN" in err.rule


@pytest.mark.parametrize("value", [True, False, "0.1", None, [0.1], {"rho": 0.1}])
def test_non_numeric_budget(tmp_path: Path, base: dict[str, Any], value: Any) -> None:
    base["privacy_budget"]["PH1_denom"]["usa_A-G"] = value
    err = _fails(tmp_path, base)
    assert err.key == "privacy_budget.PH1_denom.usa_A-G"
    assert "number" in err.rule


def test_infinity_budget_is_allowed(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_budget"]["PH6"]["state_*"] = float("inf")
    assert "Infinity" in json.dumps(base)
    config = _zcdp_valid(tmp_path, base)
    assert config.has_infinite_budget
    budgets = {lv.config_key: b for lv, b in config.privacy_budget["PH6"].items()}
    assert budgets["state_*"].is_infinite() and budgets["state_*"] > 0
    assert budgets["usa_*"] == Decimal("0.001061")
    assert config.total_budget() == Decimal("Infinity")


def test_integer_and_zero_budgets_are_allowed(tmp_path: Path, base: dict[str, Any]) -> None:
    base["privacy_budget"]["PH2"] = {"usa_*": 0, "state_*": 1}
    config = _zcdp_valid(tmp_path, base)
    assert [str(lv) for lv in config.measured_levels("PH2")] == ["state_*"]
    assert config.total_budget() == Fraction(1257281, 1000000) - Fraction(16371 + 2619, 10**6) + 1


# --------------------------------------------------------------------------------------------
# tau
# --------------------------------------------------------------------------------------------


def test_tau_not_an_object(tmp_path: Path, base: dict[str, Any]) -> None:
    base["tau"] = 10
    err = _fails(tmp_path, base)
    assert err.key == "tau"
    assert "object" in err.rule


@pytest.mark.parametrize("table", PERSON_TABLES)
def test_tau_missing(tmp_path: Path, base: dict[str, Any], table: str) -> None:
    del base["tau"][table]
    err = _fails(tmp_path, base)
    assert err.key == f"tau.{table}"
    assert "required" in err.rule


@pytest.mark.parametrize("value", [0, -1, -10])
def test_tau_below_one(tmp_path: Path, base: dict[str, Any], value: int) -> None:
    base["tau"]["PH3"] = value
    err = _fails(tmp_path, base)
    assert err.key == "tau.PH3"
    assert "at least 1" in err.rule


@pytest.mark.parametrize("value", [2.5, 10.0, "10", True, None, float("inf"), float("nan")])
def test_tau_not_an_integer(tmp_path: Path, base: dict[str, Any], value: Any) -> None:
    base["tau"]["PH1_num"] = value
    err = _fails(tmp_path, base)
    assert err.key == "tau.PH1_num"
    assert "integer" in err.rule


@pytest.mark.parametrize("table", ["PH1_denom", "PH5_denom", "PH8_denom", "PH5_num", "PH99"])
def test_tau_for_a_table_without_truncation(tmp_path: Path, base: dict[str, Any], table: str) -> None:
    base["tau"][table] = 10
    err = _fails(tmp_path, base)
    assert err.key == f"tau.{table}"
    assert "not a person table" in err.rule


def test_tau_one_is_allowed(tmp_path: Path, base: dict[str, Any]) -> None:
    base["tau"] = {t: 1 for t in PERSON_TABLES}
    assert dict(_zcdp_valid(tmp_path, base).tau) == {t: 1 for t in PERSON_TABLES}


# --------------------------------------------------------------------------------------------
# state_filter
# --------------------------------------------------------------------------------------------


def test_state_filter_empty(tmp_path: Path, base: dict[str, Any]) -> None:
    base["state_filter"] = []
    err = _fails(tmp_path, base)
    assert err.key == "state_filter"
    assert "non-empty list" in err.rule


@pytest.mark.parametrize("value", ["06", {"06": True}, 6, None])
def test_state_filter_not_a_list(tmp_path: Path, base: dict[str, Any], value: Any) -> None:
    base["state_filter"] = value
    err = _fails(tmp_path, base)
    assert err.key == "state_filter"
    assert "list" in err.rule


@pytest.mark.parametrize("code", ["7", 7, 6, "006", "6 ", "", None, "AL"])
def test_state_code_not_two_digits(tmp_path: Path, base: dict[str, Any], code: Any) -> None:
    base["state_filter"] = ["01", code]
    err = _fails(tmp_path, base)
    assert err.key == "state_filter[1]"
    assert "2-digit" in err.rule


@pytest.mark.parametrize("code", ["03", "07", "14", "43", "52", "00", "57", "60", "66", "78", "99"])
def test_state_code_not_a_state(tmp_path: Path, base: dict[str, Any], code: str) -> None:
    base["state_filter"] = [code]
    err = _fails(tmp_path, base)
    assert err.key == "state_filter[0]"
    assert "not a state FIPS code" in err.rule


def test_every_valid_state_code_is_accepted(tmp_path: Path, base: dict[str, Any]) -> None:
    valid = [f"{c:02d}" for c in range(1, 57) if c not in (3, 7, 14, 43, 52)]
    assert len(valid) == 51
    base["state_filter"] = list(reversed(valid))
    config = _zcdp_valid(tmp_path, base)
    assert config.states == tuple(valid)


def test_state_filter_duplicates(tmp_path: Path, base: dict[str, Any]) -> None:
    base["state_filter"] = ["06", "01", "06"]
    err = _fails(tmp_path, base)
    assert err.key == "state_filter"
    assert "twice" in err.rule


@pytest.mark.parametrize("states", [["72", "01"], ["01", "72"], ["06", "72", "36"]])
def test_puerto_rico_mixed_with_states(tmp_path: Path, base: dict[str, Any], states: list[str]) -> None:
    base["state_filter"] = states
    err = _fails(tmp_path, base)
    assert err.key == "state_filter"
    assert "Puerto Rico" in err.rule and "mixed" in err.rule


@pytest.mark.parametrize(
    ("table", "level", "value"),
    [("PH1_num", "usa_*", 0.1), ("PH2", "usa_*", 1), ("PH8_denom", "usa_H,I", 2.2e-05),
     ("PH3", "usa_A-G", float("inf"))],
)
def test_puerto_rico_with_nonzero_usa_budget(tmp_path: Path, table: str, level: str, value: Any) -> None:
    raw = _raw(PR_CONFIG)
    raw["privacy_budget"][table][level] = value
    err = _fails(tmp_path, raw)
    assert err.key == f"privacy_budget.{table}.{level}"
    assert "must be 0" in err.rule and "Puerto Rico" in err.rule


def test_puerto_rico_with_zero_usa_budgets_and_usa_run_with_them(tmp_path: Path) -> None:
    raw = _raw(PR_CONFIG)
    assert load_config(_write(tmp_path, raw)).is_puerto_rico
    raw["state_filter"] = ["01"]  # the same zero-USA budgets are fine for a state run
    assert not load_config(_write(tmp_path, raw)).is_puerto_rico


def test_parse_config_accepts_an_already_parsed_mapping() -> None:
    raw = json.loads(US_CONFIG.read_text(), parse_float=Decimal)
    assert parse_config(raw).total_budget() == Fraction(1257281, 1000000)
    raw["tau"]["PH2"] = 0
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.key == "tau.PH2"


# --------------------------------------------------------------------------------------------
# Budget sanity at load (issue 12): duplicates, bounded numbers, noise scales, the run policy
# --------------------------------------------------------------------------------------------


def _text_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_duplicate_keys_are_refused_naming_the_key(tmp_path: Path) -> None:
    text = US_CONFIG.read_text()
    # a second "usa_*" inside PH2's object: JSON would silently keep the last one
    doubled = text.replace('"PH2": {', '"PH2": {\n "usa_*": 10,', 1)
    assert doubled != text
    with pytest.raises(ConfigError) as raised:
        load_config(_text_config(tmp_path, doubled))
    assert raised.value.key == "privacy_budget.PH2.usa_*" and "twice" in raised.value.rule
    top = text.replace("{", '{\n "tau": {},', 1)
    with pytest.raises(ConfigError, match="tau.*twice"):
        load_config(_text_config(tmp_path, top))


@pytest.mark.parametrize("literal", ["1e999999999", "1e-999999999", "1e41", "0." + "0" * 45 + "1"])
def test_huge_or_tiny_numbers_are_refused_at_once(tmp_path: Path, literal: str) -> None:
    import time

    raw = re.sub(r'"usa_\*": [0-9.e-]+', f'"usa_*": {literal}', json.dumps(_raw()), count=1)
    assert literal in raw
    start = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        load_config(_text_config(tmp_path, raw))
    assert time.monotonic() - start < 2  # decided on the exponent: exact arithmetic would never finish
    assert raised.value.key.startswith("privacy_budget.") or raised.value.key == "<file>"
    assert literal not in str(raised.value)


def test_overlong_number_literals_are_refused_without_quoting_them(tmp_path: Path) -> None:
    literal = "1" * 5000  # beyond Python's int parsing limit as well
    raw = re.sub(r'"usa_\*": [0-9.e-]+', f'"usa_*": {literal}', json.dumps(_raw()), count=1)
    assert literal in raw
    with pytest.raises(ConfigError, match="longer than 40 characters") as raised:
        load_config(_text_config(tmp_path, raw))
    assert literal[:20] not in str(raised.value)


def test_a_budget_too_small_for_64_bit_counts_is_refused_naming_the_level(tmp_path: Path) -> None:
    raw = _raw()
    raw["privacy_budget"]["PH3"]["state_A-G"] = 1e-30
    error = _fails(tmp_path, raw)
    assert error.key == "privacy_budget.PH3.state_A-G" and "too small" in error.rule and "64-bit" in error.rule
    raw["privacy_budget"]["PH3"]["state_A-G"] = 1e-300
    assert "out of range" in _fails(tmp_path, raw).rule


def test_the_run_policy_refuses_near_exact_releases_unless_non_confidential(tmp_path: Path) -> None:
    from phsafe.config import check_budget_policy
    from phsafe.errors import BudgetError

    raw = _raw()
    raw["privacy_budget"]["PH8_denom"]["state_*"] = 1e30
    config = load_config(_write(tmp_path, raw))  # a valid config: scale 2e-15 counts
    with pytest.raises(BudgetError, match=r"privacy_budget\.PH8_denom\.state_\*.*below 1.*--non-confidential"):
        check_budget_policy(config, non_confidential=False)
    check_budget_policy(config, non_confidential=True)
    # The boundary is exact enough: sigma = 1 count for a unit table (Delta 2) is rho = 2.
    raw["privacy_budget"]["PH8_denom"]["state_*"] = 2
    check_budget_policy(load_config(_write(tmp_path, raw)), non_confidential=False)
    raw["privacy_budget"]["PH8_denom"]["state_*"] = 2.001
    with pytest.raises(BudgetError):
        check_budget_policy(load_config(_write(tmp_path, raw)), non_confidential=False)
    infinite = _raw()
    infinite["privacy_budget"]["PH2"]["usa_*"] = float("inf")
    with pytest.raises(BudgetError, match="Infinity"):
        check_budget_policy(load_config(_write(tmp_path, infinite)), non_confidential=False)


def test_a_config_measuring_nothing_is_refused_for_every_run(tmp_path: Path) -> None:
    from phsafe.config import check_budget_policy

    raw = _raw()
    raw["privacy_budget"] = {t: {lv: 0 for lv in levels} for t, levels in raw["privacy_budget"].items()}
    config = load_config(_write(tmp_path, raw))
    for non_confidential in (False, True):
        with pytest.raises(ConfigError, match="every budget is 0"):
            check_budget_policy(config, non_confidential=non_confidential)


def test_the_dataset_key_names_the_dataset(tmp_path: Path) -> None:
    raw = _raw()
    raw["dataset"] = "cef2020-us"
    assert load_config(_write(tmp_path, raw)).dataset == "cef2020-us"
    for bad in ("", "a b", "../x", 7):
        raw["dataset"] = bad
        assert _fails(tmp_path, raw).key == "dataset"


def test_tau_is_bounded(tmp_path: Path) -> None:
    raw = _raw()
    raw["tau"]["PH2"] = 100_001
    assert _fails(tmp_path, raw).key == "tau.PH2"
