"""The empirical audit end to end in the library: correct code passes, every planted bug is caught.

Small on purpose (the production-budget quick audit is in benchmarks/bench_empirical_audit.py):
12 states, PH3 with tau = 2 (so that keeping tau + 1 moves 1.5 times as much) at 4x its budgets,
40 runs -- a few seconds of CPU per audit.

Probabilities. The noise is OpenDP's, unseeded, as in production, so these tests are
statistical:

* correct code passes: the audit runs with alpha = 1e-6 (a false VIOLATION/EXCESS, and a false
  WEAK) and check_alpha = 1e-6 (a false check failure): this test fails on correct code with
  probability at most 3e-6;
* each planted bug is caught: the truncation key, noise scale and sensitivity checks are
  deterministic for their bugs; the reused noise, the unnoised cell and the noise variance are
  caught at z-scores in the hundreds or chance levels below 1e-40; the black-box bugs (tau + 1
  kept, truncation skipped, noise before truncation, sigma / 2) put the state_A-G row's mu_hat
  more than 6 of its standard errors above the EXCESS threshold plus the bound's margin (miss
  probability below 1e-9 by the normal approximation, measured margins in the comments).
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from phsafe.audit.empirical import AuditSettings, report_json, run_audit
from phsafe.audit.empirical.audit import QUICK_SCALES, plan_audit
from phsafe.audit.empirical.checks import FAIL
from tests import _planted_bugs as bugs
from tests._empirical import small_config

STATES = ["01", "02", "04", "05", "06", "08", "09", "10", "11", "12", "13", "15"]


def _config(privacy_defn: str = "zcdp", **tau: int):  # type: ignore[no-untyped-def]
    return small_config(STATES, privacy_defn, **tau)


def _settings(**changes) -> AuditSettings:  # type: ignore[no-untyped-def]
    options = dict(config=_config(PH3=2), tables=("PH3",), runs=40, budget_scale=4, alpha=1e-3, check_alpha=1e-3,
                   background_persons=300, seed=5)
    options.update(changes)
    return AuditSettings(**options)


def test_correct_code_passes() -> None:
    settings = _settings(tables=("PH3", "PH2", "PH8_denom"), alpha=1e-6, check_alpha=1e-6)
    result = run_audit(settings)
    bad_rows = [(r.table, r.level, r.verdict, r.mu_lb, r.mu_ub) for r in result.rows if r.verdict != "PASS"]
    bad_checks = [(c.name, c.table, c.level, c.detail) for c in result.checks if c.status == FAIL]
    assert not bad_rows and not bad_checks, (bad_rows, bad_checks)
    assert result.verdict == "PASS" and not result.failed
    # Every audited table has its whole-table row and its level rows; PH3's bound is informative.
    levels = {(r.table, r.level) for r in result.rows}
    assert {("PH3", "all"), ("PH2", "all"), ("PH8_denom", "all"), ("PH3", "state_A-G")} <= levels
    ph3 = next(r for r in result.rows if (r.table, r.level) == ("PH3", "state_A-G"))
    assert 0 < ph3.mu_lb < ph3.mu_reach < ph3.mu_ub and ph3.mu_reach < ph3.mu_declared
    assert {c.name for c in result.checks} >= {"truncation key fresh", "OpenDP exact sampler", "noise scale",
                                               "sensitivity covers a neighbour", "unnoised cells", "reused noise",
                                               "noise variance", "noise shape", "noise independence",
                                               "release tables"}
    document = report_json(result)
    for row in document["tables"]:
        assert {"table", "level", "mu_lb", "mu_ub", "mu_reach", "mu_declared", "epsilon_hat", "epsilon_declared",
                "delta", "budget_scale", "verdict", "runs", "seconds"} <= set(row)
        assert row["budget_scale"] == 4 and row["runs"] == 40


# What catches each bug: verdicts of PH3 rows, and/or failed checks (at least one of each listed).
EXPECTED = {
    "noise scale too small by 1.5x": (None, {"noise scale", "noise variance"}),
    "noise scale too small by 2x": ({"EXCESS", "VIOLATION"}, {"noise scale", "noise variance"}),
    "sensitivity under-declared 2x": (None, {"sensitivity covers a neighbour"}),
    "truncation skipped": ({"EXCESS", "VIOLATION"}, None),
    "tau + 1 persons kept": ({"EXCESS", "VIOLATION"}, None),
    "noise drawn before truncation": ({"EXCESS", "VIOLATION"}, None),
    "one cell released without noise": (None, {"unnoised cells"}),
    "noise reused across runs": (None, {"reused noise"}),
    "a fixed truncation key": (None, {"truncation key fresh"}),
}


@pytest.mark.parametrize("mechanism", bugs.corpus(), ids=lambda m: m.name)
def test_each_planted_bug_is_caught(mechanism) -> None:  # type: ignore[no-untyped-def]
    # Halving the declared 2 tau + 2 is a bug only when tau sqrt 2 -- the most a neighbour moves
    # a level -- exceeds tau + 1, i.e. tau >= 3: audited at PH3's production tau of 6.
    config = _config() if isinstance(mechanism, bugs.SensitivityUnderDeclared) else _config(PH3=2)
    result = run_audit(_settings(config=config), mechanism)
    assert result.failed, mechanism.name
    verdicts, checks = EXPECTED[mechanism.name]
    row_verdicts = {r.verdict for r in result.rows if r.level in ("all", "state_A-G")}
    failed = {c.name for c in result.checks if c.status == FAIL}
    if verdicts:
        assert row_verdicts & verdicts, (mechanism.name, [(r.level, r.mu_lb, r.excess_threshold) for r in result.rows])
    if checks:
        assert checks <= failed, (mechanism.name, failed)


def test_pure_dp_is_audited_with_the_tail_event() -> None:
    config = _config("puredp", PH3=2)
    correct = run_audit(_settings(config=config, budget_scale=None, alpha=1e-6, check_alpha=1e-6))
    assert correct.verdict == "PASS", [(r.level, r.epsilon_hat, r.epsilon_ub, r.epsilon_reach, r.verdict)
                                       for r in correct.rows]
    row = next(r for r in correct.rows if r.level == "state_A-G")
    assert row.mu_lb is None and row.delta == 0.0
    # Reachable: 2 tau / (2 tau + 2) of the declared epsilon, for correct code exactly.
    assert row.epsilon_reach == pytest.approx(1.0 * 4 / 6, rel=1e-9)
    assert 0 < row.epsilon_hat < row.epsilon_reach < row.epsilon_ub
    buggy = run_audit(_settings(config=config, budget_scale=None), bugs.SigmaTooSmall(2.0))
    assert {"noise scale", "noise variance"} <= {c.name for c in buggy.checks if c.status == FAIL}
    assert any(r.verdict in ("EXCESS", "VIOLATION") for r in buggy.rows if r.level == "state_A-G")


def test_the_plan_is_fixed_before_any_run() -> None:
    """Runs, scales and thresholds come from the config and the canaries only."""
    quick = plan_audit(AuditSettings())
    assert [t.table for t in quick.tables] == ["PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_denom", "PH6",
                                              "PH7", "PH8_denom"]
    for t in quick.tables:
        assert t.scale == QUICK_SCALES.get(t.table, 1)
        assert t.runs >= 30
    again = plan_audit(AuditSettings(seed=99))
    assert [t.runs for t in again.tables] == [t.runs for t in quick.tables]
    # Bonferroni: the whole-table rows share half of alpha, the level rows the other half.
    whole = [a for (table, level), a in quick.alpha_row.items() if level == "all"]
    levels = [a for (table, level), a in quick.alpha_row.items() if level != "all"]
    assert sum(whole) == pytest.approx(0.025) and sum(levels) == pytest.approx(0.025)
    with pytest.raises(ValueError):
        AuditSettings(tables=("PH5_num",))
    with pytest.raises(ValueError):
        AuditSettings(mode="slow")
    noiseless = _config().model_copy(update={"privacy_budget": {
        t: {lv: Decimal("Infinity") for lv in levels} for t, levels in _config().privacy_budget.items()}})
    with pytest.raises(ValueError, match="Infinity"):
        AuditSettings(config=noiseless)


def test_the_seed_seeds_the_data_never_the_noise() -> None:
    settings = _settings(runs=3, tables=("PH3",))
    a, b = run_audit(settings), run_audit(settings)
    ta, tb = a.tallies[("PH3", "state_A-G")], b.tallies[("PH3", "state_A-G")]
    # Same coins (canaries in and out), different noise: the statistics differ.
    assert (ta.negatives, ta.positives) == (tb.negatives, tb.positives)
    assert not np.array_equal(np.concatenate(ta.scores_out), np.concatenate(tb.scores_out))
