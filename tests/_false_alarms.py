"""The registry of the suite's statistical tests: each test that asserts on random draws it does
not seed (noise, coverage, the empirical audit's verdicts, rehearsal tolerances) and the
probability that it fails on correct code, per run of the suite.

Every entry is mirrored by a comment at the test itself, on the line above its assertion or at
the top of its body::

    # false-alarm rate: 2.0e-06 per run -- two-sided binomial tail at n=400, p=0.9, |x-np|>=...

The number is computed from the statistic's distribution (a binomial or normal tail, a union
bound over the assertions of one test, ...), never guessed; ``derivation`` says how. The key is
the test's node id without parameters (``tests/unit/test_noise.py::test_name``); a parametrized
test's rate is the sum over its parameters. The suite's total is at most ``SUITE_LIMIT``.
"""

from __future__ import annotations

from dataclasses import dataclass

SUITE_LIMIT = 1e-3
"""At most one correct run of the whole suite in a thousand fails on chance alone."""


@dataclass(frozen=True)
class FalseAlarm:
    rate: float
    """Probability per run of the suite that this test fails on correct code."""
    derivation: str
    """How the rate was computed: the statistic, its distribution, the bound."""


# Sorted by key; one entry per test.
FALSE_ALARMS: dict[str, FalseAlarm] = {
    "tests/flows/test_empirical_audit_flow.py::test_the_flow_audits_the_release_path_and_shows_its_report": FalseAlarm(
        5.0e-06, "one empirical audit of correct code, two calibrations: per calibration a false VIOLATION/EXCESS "
                 "and a false WEAK each at most alpha = 1e-6 (Bonferroni over the rows, Clopper-Pearson limits); "
                 "a false statistical check at most check_alpha = 1e-6"),
    "tests/system/test_empirical_audit_cli.py::test_a_pool_of_processes_runs_the_same_audit": FalseAlarm(
        1.0e-30, "compares seeded coins only; the truncation keys' distinctness: 170 fresh 16-byte keys, birthday "
                 "bound 170^2 / 2^129"),
    "tests/system/test_empirical_audit_cli.py::test_a_small_audit_writes_its_report": FalseAlarm(
        1.0e-05, "two audits of correct code must pass, each of two calibrations: 2 x (1e-6 + 1e-6) + 1e-6 each "
                 "(alpha of the verdicts and the WEAK bound per calibration, check_alpha)"),
    "tests/unit/test_empirical_audit.py::test_correct_code_passes": FalseAlarm(
        5.0e-06, "two calibrations x (alpha 1e-6 for a false VIOLATION/EXCESS + alpha 1e-6 for a false WEAK) + "
                 "check_alpha 1e-6; mu_lb > 0 at the lead level fails below 1e-100 (25 standard errors)"),
    "tests/unit/test_empirical_audit.py::test_defects_smaller_than_2x_at_one_level_are_caught": FalseAlarm(
        7.0e-07, "7 planted defects, each run for a miss probability below 1e-7 (its runs from the normal "
                 "approximation of the Clopper-Pearson limits: mu_hat 5.2 standard errors above the verdict's "
                 "threshold plus the bound's margin); the white-box checks are deterministic"),
    "tests/unit/test_empirical_audit.py::test_each_planted_bug_is_caught": FalseAlarm(
        4.0e-09, "4 black-box bugs with mu_lb 6 to 28 standard errors above the EXCESS threshold (miss below 1e-9 "
                 "each, normal approximation); the others' checks are deterministic or at chance below 1e-40"),
    "tests/unit/test_empirical_audit.py::test_pure_dp_is_audited_with_the_tail_event": FalseAlarm(
        3.1e-06, "correct code: alpha 1e-6 (VIOLATION/EXCESS) + alpha 1e-6 (WEAK) + check_alpha 1e-6, and the "
                 "bounds' ordering below 1e-10 (6.5 and 7.9 standard errors); the bug: epsilon_lb 7.6 standard "
                 "errors above the EXCESS threshold at 80 runs (below 1e-13)"),
    "tests/unit/test_empirical_audit.py::test_the_seed_seeds_the_data_never_the_noise": FalseAlarm(
        1.0e-100, "two audits' fresh noise equal in every one of thousands of cells (below 0.1 per cell)"),
}
