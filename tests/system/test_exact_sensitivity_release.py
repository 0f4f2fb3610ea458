"""A release calibrated to the exact sensitivities (``"sensitivity": "exact"``), end to end.

One witnessed ledger, one ``phsafe private`` release of synthetic data with the production
budgets and ``"sensitivity": "exact"``. Then:

* every measurement's logged sensitivity is the proven one (an irrational L2 one as
  ``"sqrt(N)"``), its plan item says ``"sensitivity_bound": "exact"``, and every VARIANCE is
  Delta^2 / (2 rho) with that Delta -- less than half the paper's for the person tables;
* the manifest and the data package say which bound the release used;
* ``audit verify`` (the ledger) and ``audit public`` (the public log, an outsider) both pass and
  say so; ``audit report`` gives the bounded loss as 4 rho;
* a plan whose sensitivity is not the proven one of its bound, or that mixes bounds, is refused
  by the ledger's rules; a release whose data package states another bound is refused.
"""

from __future__ import annotations

import copy
import csv
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import pytest

from phsafe import synthetic
from phsafe.accounting import plan_run
from phsafe.config import parse_config
from phsafe.datapackage import SensitivityStatementError, check_sensitivity_statement
from phsafe.errors import LedgerRuleViolation
from phsafe.ledger.format import planned_item
from phsafe.ledger.rules import parse_planned
from phsafe.publog import log_path
from phsafe.sensitivity import SensitivityBound, exact, squared

from tests._cli import phsafe
from tests.conftest import US_CONFIG
from tests.system._witness_services import Service


PHSAFE = Path(sys.executable).parent / "phsafe"
STATES = ["01", "02"]


def cli(*args: object) -> subprocess.CompletedProcess:
    return phsafe(*args)  # in this process, as a subprocess would see it (tests/_cli.py)


def _config(sensitivity: str) -> dict:
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"], raw["dataset"], raw["sensitivity"] = STATES, "exact-test", sensitivity
    return raw


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("exact-release")
    synthetic.write(synthetic.generate(1500, STATES, seed=11), root / "data")
    (root / "config.json").write_text(json.dumps(_config("exact")))
    witness = Service(root, "witness").start()  # a witness service of its own (tests/system/_witness_services)
    try:
        ledger = root / "enclave" / "ledger.jsonl"
        made = cli("ledger", "init", ledger, "--lifetime-cap", "3", "--reason", "test policy", "--dataset", "exact-test",
                   "--witness", witness.url, witness.vkey)
        assert made.returncode == 0, made.stderr
        witness.witness(log_path(ledger))
        ran = cli("private", root / "config.json", root / "data", root / "out", "--ledger", ledger,
                  "--new-version", "synthetic records")
        assert ran.returncode == 0, ran.stderr[-3000:]
        yield {"root": root, "ledger": ledger, "out": root / "out", "log": log_path(ledger),
               "vkey": log_path(ledger) / "log.vkey", "witness_vkey": witness.vkey}
    finally:
        witness.stop()


def _ledger_plan(ledger: Path) -> list[dict]:
    for line in ledger.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind") == "RUN_STARTED":
            return entry["planned"]
    raise AssertionError("no RUN_STARTED")


def test_the_plan_and_the_variances_are_the_exact_sensitivities(world: dict) -> None:
    plan = _ledger_plan(world["ledger"])
    assert plan and all(item["sensitivity_bound"] == "exact" for item in plan)
    config = parse_config(_config("exact"))
    by_key = {m.key: m for m in plan_run(config).measurements}
    for item in plan:
        m = by_key[item["key"]]
        want = exact(m.table, m.level, m.tau)
        assert squared(item["sensitivity"]) == want.l2_squared, item["key"]
        assert Fraction(item["noise_parameter"]) == Fraction(want.l2_squared) / (2 * Fraction(item["budget"]))
    assert by_key["PH1_num/state_A-G"].sensitivity == "sqrt(200)"  # tau 10: 10 sqrt 2
    assert by_key["PH3/state_A-G"].sensitivity == "sqrt(72)"  # tau 6
    assert by_key["PH1_num/usa_*"].sensitivity == "sqrt(2)" and by_key["PH4/usa_*"].sensitivity == 10
    assert by_key["PH1_denom/usa_*"].sensitivity == 1 and by_key["PH8_denom/state_*"].sensitivity == "sqrt(2)"
    # The released VARIANCE column is that sigma^2: less than half the paper's for person tables.
    paper = {m.key: m for m in plan_run(parse_config(_config("paper"))).measurements}
    with (world["out"] / "PH1_num" / "PH1_num.csv").open() as fh:
        rows = list(csv.DictReader(fh, delimiter="|"))
    for row in rows:
        level = ("usa" if row["REGION_TYPE"] == "USA" else "state") + "_" + (
            "*" if row["ITERATION_CODE"] == "*" else "A-G" if row["ITERATION_CODE"] in "ABCDEFG" else "H,I")
        key = f"PH1_num/{level}"
        assert float(row["VARIANCE"]) == by_key[key].variance
        assert by_key[key].variance < paper[key].variance / 2


def test_the_manifest_and_the_data_package_state_the_bound(world: dict) -> None:
    manifest = json.loads((world["out"] / "manifest.json").read_text())
    assert manifest["config"]["sensitivity"] == "exact"
    sens = {(m["table"], m["level"]): m["sensitivity"] for m in manifest["measurements"]}
    assert sens[("PH7", "usa_*")] == "sqrt(200)"
    package = json.loads((world["out"] / "datapackage.json").read_text())
    assert package["sensitivity"]["bound"] == "exact" and package["sensitivity"]["norm"] == "L2"
    assert package["sensitivity"]["proof"] == "docs/sensitivity.md"
    assert "exact sensitivity of each measurement" in package["description"]
    assert {(d["table"], d["level"]): d["delta"] for d in package["sensitivity"]["measurements"]} == sens


def test_audit_verify_and_audit_public_check_it(world: dict, tmp_path: Path) -> None:
    verified = cli("audit", "verify", world["ledger"], "--outputs", world["out"])
    assert verified.returncode == 0, verified.stderr
    assert "calibrated to the exact bound, as manifest.json and datapackage.json state" in verified.stdout
    public = cli("audit", "public", world["out"], "--key", world["vkey"], "--log", world["log"],
                 "--state", tmp_path / "seen.json", "--witness-key", world["witness_vkey"])
    assert public.returncode == 0, public.stderr
    assert "tables: sensitivity: every measurement calibrated to the exact bound" in public.stdout
    assert public.stdout.rstrip().endswith("OK")
    # The public log's plan carries the bound and the proven values.
    logged = b"".join(p.read_bytes() for p in sorted(world["log"].rglob("*")) if p.is_file())
    assert b'"sensitivity_bound":"exact"' in logged and b'"sensitivity":"sqrt(200)"' in logged


def test_the_audit_report_gives_the_bounded_loss_as_four_rho(world: dict, tmp_path: Path) -> None:
    made = cli("audit", "report", world["ledger"], "--out", tmp_path / "report")
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "report" / "audit_report.md").read_text()
    total = plan_run(parse_config(_config("exact"))).total
    assert "the exact sensitivity of each measurement" in text
    assert f"| planned | rho (zCDP) | {_exact(total)} | {_exact(4 * total)} |" in text


def _exact(x: Fraction) -> str:
    from phsafe.amounts import format_exact

    return format_exact(x)


def test_the_ledger_refuses_a_plan_that_is_not_its_bound(world: dict) -> None:
    config = parse_config(_config("exact"))
    items = [planned_item(m) for m in plan_run(config).measurements]
    assert parse_planned(copy.deepcopy(items), config.privacy_defn)  # as written: accepted
    wrong = copy.deepcopy(items)
    wrong[0]["sensitivity"] = 22  # the paper's value under the exact bound
    with pytest.raises(LedgerRuleViolation, match="is not the proven"):
        parse_planned(wrong, config.privacy_defn)
    mixed = copy.deepcopy(items)
    del mixed[3]["sensitivity_bound"]
    with pytest.raises(LedgerRuleViolation):
        parse_planned(mixed, config.privacy_defn)
    spelled = copy.deepcopy(items)
    spelled[0]["sensitivity_bound"] = "paper"  # written only for "exact"
    with pytest.raises(LedgerRuleViolation, match="written only"):
        parse_planned(spelled, config.privacy_defn)


def test_a_release_stating_another_bound_is_refused(world: dict, tmp_path: Path) -> None:
    measurements = plan_run(parse_config(_config("exact"))).measurements
    out = tmp_path / "out"
    out.mkdir()
    package = json.loads((world["out"] / "datapackage.json").read_text())
    (out / "manifest.json").write_text((world["out"] / "manifest.json").read_text())
    files = {"datapackage.json": "x"}
    package["sensitivity"]["bound"] = "paper"
    (out / "datapackage.json").write_text(json.dumps(package))
    with pytest.raises(SensitivityStatementError, match="datapackage.json"):
        check_sensitivity_statement(out, files, list(measurements))
    del package["sensitivity"]
    (out / "datapackage.json").write_text(json.dumps(package))
    with pytest.raises(SensitivityStatementError, match="does not state"):
        check_sensitivity_statement(out, files, list(measurements))
    manifest = json.loads((world["out"] / "manifest.json").read_text())
    manifest["config"]["sensitivity"] = "paper"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SensitivityStatementError, match="manifest.json"):
        check_sensitivity_statement(out, {}, list(measurements))
    assert SensitivityBound.EXACT.value == "exact"


def test_the_estimates_read_the_variance_and_the_bound(world: dict, tmp_path: Path) -> None:
    """``phsafe postprocess`` checks every measured VARIANCE against the manifest's budget and
    exact sensitivity, and records the bound with the estimates."""
    made = cli("postprocess", world["out"], "--dest", tmp_path / "estimates", "--draws", "200", "--seed", "3")
    assert made.returncode == 0, made.stderr[-2000:]
    meta = json.loads((tmp_path / "estimates" / "postprocess.json").read_text())
    assert meta["source"]["sensitivity"] == "exact"
    # A copy whose manifest claims the paper's sensitivities for the same VARIANCE is refused.
    import shutil

    from phsafe.postprocess import PostprocessError, read_private_outputs

    copy_dir = tmp_path / "copy"
    shutil.copytree(world["out"], copy_dir)
    manifest = json.loads((copy_dir / "manifest.json").read_text())
    for m in manifest["measurements"]:
        m["sensitivity"] = 22 if m["table"] == "PH1_num" else m["sensitivity"]
    (copy_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PostprocessError, match="PH1_num"):
        read_private_outputs(copy_dir)
