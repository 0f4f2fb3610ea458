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

import math
from decimal import Decimal

import numpy as np
import pytest

from phsafe.audit.empirical import AuditSettings, ReleaseMechanism, run_audit
from phsafe.audit.empirical.report import side_by_side
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
    # false-alarm rate: 5.0e-06 per run -- per calibration (two here), a false VIOLATION or EXCESS
    # has probability at most alpha = 1e-6 and a false WEAK at most alpha (Bonferroni over the
    # rows, Clopper-Pearson limits), a false check at most check_alpha = 1e-6 over both: 2 x 2e-6 +
    # 1e-6; the lead level's mu_lb > 0 fails with probability below 1e-100 (mu_hat about 25 of its
    # standard errors above the bound's margin).
    settings = _settings(tables=("PH3", "PH2", "PH8_denom"), alpha=1e-6, check_alpha=1e-6, sensitivity="both")
    result = run_audit(settings)
    bad_rows = [(r.sensitivity, r.table, r.level, r.verdict, r.mu_lb, r.mu_ub) for r in result.rows
                if r.verdict not in ("PASS", "INCONCLUSIVE")]
    bad_checks = [(c.name, c.table, c.level, c.detail) for c in result.checks if c.status == FAIL]
    assert not bad_rows and not bad_checks, (bad_rows, bad_checks)
    assert result.verdict == "PASS" and not result.failed
    # Every audited table has its whole-table row and its level rows, under both calibrations.
    levels = {(r.sensitivity, r.table, r.level) for r in result.rows}
    for sensitivity in ("paper", "exact"):
        assert {(sensitivity, "PH3", "all"), (sensitivity, "PH2", "all"), (sensitivity, "PH8_denom", "all"),
                (sensitivity, "PH3", "state_A-G"), (sensitivity, "PH3", "state_*")} <= levels
        ph3 = next(r for r in result.rows if (r.sensitivity, r.table, r.level) == (sensitivity, "PH3", "state_A-G"))
        assert ph3.lead == (sensitivity == "exact") and ph3.conclusive
        assert 0 < ph3.mu_lb <= ph3.excess_threshold and ph3.mu_ub >= ph3.weak_threshold
        # The ceiling: tau sqrt2 / (2 tau + 2) with the paper's bound (tau = 2), 1 with the exact one.
        assert ph3.ceiling == pytest.approx(2 * math.sqrt(2) / 6 if sensitivity == "paper" else 1.0, rel=1e-9)
    assert {c.name for c in result.checks} >= {"truncation key fresh", "OpenDP exact sampler", "noise scale",
                                               "sensitivity covers a neighbour", "unnoised cells", "reused noise",
                                               "noise variance", "noise shape", "noise independence",
                                               "release tables"}
    assert result.calibrations == ("paper", "exact")
    document = {"tables": [r.as_dict() for r in result.rows], "side_by_side": side_by_side(result)}
    for row in document["tables"]:
        assert {"table", "level", "mu_lb", "mu_ub", "mu_reach", "mu_declared", "epsilon_hat", "epsilon_declared",
                "delta", "budget_scale", "verdict", "runs", "seconds", "sensitivity", "ceiling", "conclusive",
                "runs_to_separate"} <= set(row)
        assert row["budget_scale"] == 4 and row["runs"] == 40
        assert (row["verdict"] == "INCONCLUSIVE") == (not row["conclusive"]) == (row["runs_to_separate"] is not None)
    pairs = {(e["table"], e["level"]) for e in document["side_by_side"] if "paper" in e and "exact" in e}
    assert ("PH3", "state_A-G") in pairs and len(pairs) == len(document["tables"]) // 2


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
    # false-alarm rate: 4.0e-09 per run -- the four black-box bugs (truncation skipped, noise
    # before truncation, tau + 1 kept, sigma / 2) put the whole-table or state_A-G row's mu_lb 28,
    # 28, 6 and 23 standard errors of mu_hat above the EXCESS threshold (measured at seed 5), so each
    # misses with probability below 1e-9 (normal approximation); the other bugs' checks are
    # deterministic (key, scale, sensitivity) or at chance levels below 1e-40 (reused noise, an
    # unnoised cell, the variance at z in the hundreds).
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


# Defects smaller than 2x at one level of PH1_num (12 states, tau 10, budgets x16, alpha 0.05):
# (mechanism, calibration, runs, the row that must flag it and how, the white-box check that must fail).
# Runs: the audit's own planning arithmetic (normal approximations of the Clopper-Pearson limits at
# the row's Bonferroni share of alpha) for a miss probability below 1e-7 (z = 5.2), rounded up.
SMALL_DEFECTS = [
    # mu 1.25 x mu_declared at state_A-G (the canaries move it by the exact tau sqrt2): 52 runs.
    (bugs.SigmaTooSmallAt("PH1_num", "state_A-G", 1.25), "exact", 60, ("state_A-G", {"VIOLATION"}), "noise scale"),
    # Delta^2 200 -> 128: mu 1.25 x mu_declared: 52 runs.
    (bugs.SensitivityScaledAt("PH1_num", "state_A-G", 1.25), "exact", 60, ("state_A-G", {"VIOLATION"}),
     "sensitivity covers a neighbour"),
    # 12 for tau sqrt2 = 14.14: mu 1.18 x mu_declared: 95 runs.
    (bugs.TauPlusTwoAt("PH1_num", "state_A-G"), "exact", 100, ("state_A-G", {"VIOLATION"}),
     "sensitivity covers a neighbour"),
    # P-moves (tau sqrt2) taken for P-filtered (tau): mu 1.41 x mu_declared: 23 runs.
    (bugs.CaseTakenFor("PH1_num", "state_A-G", "P-filtered"), "exact", 40, ("state_A-G", {"VIOLATION"}),
     "sensitivity covers a neighbour"),
    # At `*` the canaries reach 1 of sqrt2: sigma / 1.5 shows mu 1.5 x mu_reach, an EXCESS: 378 runs.
    (bugs.SigmaTooSmallAt("PH1_num", "state_*", 1.5), "exact", 400, ("state_*", {"EXCESS", "VIOLATION"}),
     "noise scale"),
    # With the paper's 2 tau + 2: sigma / 1.25 shows 1.25 x mu_reach, an EXCESS: 84 runs.
    (bugs.SigmaTooSmallAt("PH1_num", "state_A-G", 1.25), "paper", 90, ("state_A-G", {"EXCESS", "VIOLATION"}),
     "noise scale"),
    # tau + 2 = 12 for 22: below tau sqrt2, mu 1.18 x mu_declared: 95 runs.
    (bugs.TauPlusTwoAt("PH1_num", "state_A-G"), "paper", 100, ("state_A-G", {"VIOLATION"}),
     "sensitivity covers a neighbour"),
]


@pytest.mark.parametrize("mechanism, calibration, runs, row, check", SMALL_DEFECTS,
                         ids=[f"{m.name} ({c})" for m, c, *_ in SMALL_DEFECTS])
def test_defects_smaller_than_2x_at_one_level_are_caught(mechanism, calibration, runs, row, check) -> None:  # type: ignore[no-untyped-def]
    # false-alarm rate: 7.0e-07 per run -- each of the 7 cases misses its verdict with probability
    # below 1e-7 (its runs give mu_hat 5.2 standard errors above the threshold plus the bound's
    # margin, normal approximation); the white-box checks are deterministic.
    settings = AuditSettings(config=_config(), tables=("PH1_num",), runs=runs, budget_scale=16, sensitivity=calibration,
                             background_persons=300, seed=5)
    result = run_audit(settings, mechanism)
    level, verdicts = row
    flagged = next(r for r in result.rows if r.level == level)
    assert flagged.verdict in verdicts, (mechanism.name, flagged.mu_lb, flagged.excess_threshold, flagged.mu_declared)
    assert check in {c.name for c in result.checks if c.status == FAIL}, mechanism.name


@pytest.mark.noise_not_asserted("counts the builds and the draws, never looks at a drawn value")
def test_each_planned_measurement_is_built_once_per_chunk_through_the_replaceable_constructor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every draw of an audit comes from ``phsafe.noise._build_mechanism`` -- what a test replaces
    to plant a fault in the noise reaches every run -- built once per planned measurement for a
    chunk of runs; the next audit builds again (a constructor replaced in between is used)."""
    from phsafe import noise

    def counting(log: list):  # type: ignore[no-untyped-def]
        real = noise._build_mechanism

        def build(m):  # type: ignore[no-untyped-def]
            mechanism, scale = real(m)
            calls = [m.key, 0]
            log.append(calls)

            def draw(values):  # type: ignore[no-untyped-def]
                calls[1] += 1
                return mechanism(values)

            return draw, scale

        return build

    mechanism = ReleaseMechanism()  # one instance for both audits
    settings = _settings(runs=3, tables=("PH3",))
    measured = [m.key for m in plan_audit(settings).tables[0].measurements]
    for _ in range(2):
        log: list = []
        monkeypatch.setattr(noise, "_build_mechanism", counting(log))
        run_audit(settings, mechanism)
        drawn = [(key, n) for key, n in log if n]
        assert sorted(drawn) == sorted((key, 3) for key in measured)  # one build each, 3 runs drawn from it
    monkeypatch.undo()


@pytest.mark.noise_not_asserted("reads the plan and the white-box check, never the two runs' draws")
def test_a_defect_within_the_papers_slack_is_no_privacy_loss() -> None:
    """The paper's 2 tau + 2 over 1.25 (sqrt(310) = 17.6) still covers every neighbour (tau sqrt2 =
    14.1): the release keeps its promise, and the white-box sensitivity check says so; with the
    exact calibration the same defect is a violation (above). Deterministic: the assertions read
    the plan and the white-box check, never a draw (the two runs' noise is not looked at)."""
    settings = AuditSettings(config=_config(), tables=("PH1_num",), runs=2, budget_scale=16, sensitivity="paper",
                             background_persons=300, seed=5)
    result = run_audit(settings, bugs.SensitivityScaledAt("PH1_num", "state_A-G", 1.25))
    covers = next(c for c in result.checks if c.name == "sensitivity covers a neighbour")
    assert covers.status == "PASS"
    plan = next(t for t in plan_audit(settings, bugs.SensitivityScaledAt("PH1_num", "state_A-G", 1.25)).tables)
    m = next(m for m in plan.measurements if m.level.config_key == "state_A-G")
    assert m.sensitivity == "sqrt(310)"


def test_pure_dp_is_audited_with_the_tail_event() -> None:
    # false-alarm rate: 3.1e-06 per run -- correct code: a false VIOLATION/EXCESS or WEAK at most
    # alpha = 1e-6 each, a false check at most check_alpha = 1e-6; epsilon_hat > 0 and epsilon_ub
    # above the reach fail with probability below 1e-10 (6.5 and 7.9 standard errors of the log
    # ratio, measured: sd 0.049 at 40 runs). The bug: at 80 runs its event's log ratio (1.27 for
    # 0.67 reachable) puts epsilon_lb 7.6 standard errors above the EXCESS threshold (miss below
    # 1e-13); its noise scale check is deterministic and its variance check at z in the hundreds.
    config = _config("puredp", PH3=2)
    correct = run_audit(_settings(config=config, budget_scale=None, alpha=1e-6, check_alpha=1e-6))
    assert correct.verdict == "PASS", [(r.level, r.epsilon_hat, r.epsilon_ub, r.epsilon_reach, r.verdict)
                                       for r in correct.rows]
    row = next(r for r in correct.rows if r.level == "state_A-G")
    assert row.mu_lb is None and row.delta == 0.0
    # Reachable: 2 tau / (2 tau + 2) of the declared epsilon, for correct code exactly.
    assert row.epsilon_reach == pytest.approx(1.0 * 4 / 6, rel=1e-9)
    assert 0 < row.epsilon_hat < row.epsilon_reach < row.epsilon_ub
    buggy = run_audit(_settings(config=config, budget_scale=None, runs=80), bugs.SigmaTooSmall(2.0))
    assert {"noise scale", "noise variance"} <= {c.name for c in buggy.checks if c.status == FAIL}
    assert any(r.verdict in ("EXCESS", "VIOLATION") for r in buggy.rows if r.level == "state_A-G")


def test_the_plan_is_fixed_before_any_run() -> None:
    """Runs, scales and thresholds come from the config and the canaries only."""
    quick = plan_audit(AuditSettings())
    assert [t.table for t in quick.tables] == ["PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_denom", "PH6",
                                              "PH7", "PH8_denom"]
    for t in quick.tables:
        assert t.sensitivity == "paper" and t.scale == QUICK_SCALES["paper"].get(t.table, 1)
        assert t.runs >= 30
        # Every measured level is audited (the `*` levels too).
        assert not t.not_audited and {f.name for f in t.families} == {"all"} | {
            m.level.config_key for m in t.measurements}
    again = plan_audit(AuditSettings(seed=99))
    assert [t.runs for t in again.tables] == [t.runs for t in quick.tables]
    # Bonferroni: the whole-table rows share half of alpha, the level rows the other half.
    whole = [a for (_, table, level), a in quick.alpha_row.items() if level == "all"]
    levels = [a for (_, table, level), a in quick.alpha_row.items() if level != "all"]
    assert sum(whole) == pytest.approx(0.025) and sum(levels) == pytest.approx(0.025)
    # Both calibrations: each its own alpha; the exact one plans for its lead level too (PH6 at
    # production budgets), the paper's for the whole table only (no level is tight there).
    both = plan_audit(AuditSettings(sensitivity="both"))
    assert [t.sensitivity for t in both.tables] == ["paper"] * 9 + ["exact"] * 9
    for sensitivity in ("paper", "exact"):
        assert sum(a for key, a in both.alpha_row.items() if key[0] == sensitivity) == pytest.approx(0.05)
    exact = {t.table: t for t in both.tables if t.sensitivity == "exact"}
    assert exact["PH6"].scale == 1 and exact["PH3"].lead == "state_A-G" and exact["PH2"].lead == "state_*"
    assert all(t.lead == "all" for t in both.tables if t.sensitivity == "paper")
    with pytest.raises(ValueError):
        AuditSettings(sensitivity="loose")
    with pytest.raises(ValueError):
        AuditSettings(tables=("PH5_num",))
    with pytest.raises(ValueError):
        AuditSettings(mode="slow")
    noiseless = _config().model_copy(update={"privacy_budget": {
        t: {lv: Decimal("Infinity") for lv in levels} for t, levels in _config().privacy_budget.items()}})
    with pytest.raises(ValueError, match="Infinity"):
        AuditSettings(config=noiseless)


def test_the_seed_seeds_the_data_never_the_noise() -> None:
    # false-alarm rate: 1.0e-100 per run -- the two audits' noise would have to be equal in every
    # one of thousands of cells (the chance of one cell is below 0.1 at sigma 4.7).
    settings = _settings(runs=3, tables=("PH3",))
    a, b = run_audit(settings), run_audit(settings)
    ta, tb = a.tallies[("paper", "PH3", "state_A-G")], b.tallies[("paper", "PH3", "state_A-G")]
    # Same coins (canaries in and out), different noise: the statistics differ.
    assert (ta.negatives, ta.positives) == (tb.negatives, tb.positives)
    assert not np.array_equal(np.concatenate(ta.scores_out), np.concatenate(tb.scores_out))
