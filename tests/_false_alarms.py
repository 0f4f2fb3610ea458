"""The registry of the suite's statistical tests: each test that asserts on random draws it does
not seed (noise, coverage, the empirical audit's verdicts, rehearsal tolerances) and the
probability that it fails on correct code, per run of the suite.

Every entry is mirrored by a comment at the test itself, on the line above its assertion or at
the top of its body::

    # false-alarm rate: 2.0e-06 per run -- two-sided binomial tail at n=400, p=0.9, |x-np|>=...

(several comments in one test add up to its entry). The number is computed from the statistic's
distribution, never guessed; ``method`` says how (:data:`METHODS`) and ``derivation`` what was
computed. ``tests/_false_alarm_rates.py`` recomputes the entries it can (``python -m
tests._false_alarm_rates``). The key is the test's node id without parameters
(``tests/unit/test_noise.py::test_name``); a parametrized test's rate is the sum over its
parameters. The suite's total is at most ``SUITE_LIMIT``.

``NOT_ASSERTED`` declares the tests that draw unseeded randomness in this process (a private
run's noise or truncation key) but assert nothing that depends on the values drawn -- a whole
module, a class or one test, each with its reason. ``tests/_false_alarm_plugin.py`` fails a test
that draws such randomness and is in neither (a test may also say so itself:
``@pytest.mark.noise_not_asserted("why")``). ``tests/unit/test_false_alarms.py`` checks the
registry against the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

SUITE_LIMIT = 1e-3
"""At most one correct run of the whole suite in a thousand fails on chance alone."""

METHODS = ("exact", "bound", "monte carlo", "approximation")
"""How a rate was obtained: ``exact`` -- the probability itself, from the statistic's exact
distribution (binomial, a sum of independent binomials or Bernoullis, by convolution); ``bound``
-- a rigorous upper bound (a union bound, Bonferroni, Chernoff, Bernstein, Cauchy-Schwarz);
``monte carlo`` -- an upper confidence bound from seeded replications of the test's statistic;
``approximation`` -- an asymptotic rate (e.g. the chi-square law of Pearson's statistic) checked
by Monte Carlo, as the derivation says."""


@dataclass(frozen=True)
class FalseAlarm:
    rate: float
    """Probability per run of the suite that this test fails on correct code (or a bound of it)."""
    derivation: str
    """How the rate was computed: the statistic, its distribution, the bound."""
    method: str | None = None
    """One of :data:`METHODS` (None: the derivation says)."""


# Sorted by key; one entry per test.
FALSE_ALARMS: dict[str, FalseAlarm] = {
    "tests/flows/test_empirical_audit_flow.py::test_the_flow_audits_the_release_path_and_shows_its_report": FalseAlarm(
        5.0e-06, "one empirical audit of correct code, two calibrations: per calibration a false VIOLATION/EXCESS "
                 "and a false WEAK each at most alpha = 1e-6 (Bonferroni over the rows, Clopper-Pearson limits); "
                 "a false statistical check at most check_alpha = 1e-6", "bound"),
    "tests/flows/test_rehearsal.py::test_rehearsal_fails_when_the_noise_is_wider_than_the_stated_moe": FalseAlarm(
        1.2e-07, "noise of twice the stated variance (a sum of two draws): P(US pooled MOE coverage >= 0.8) = 1.1e-25 (the "
                 "flow passes only if that row is inside its tolerance, which lies above 0.8), P(Puerto Rico pooled >= 0.9) "
                 "= 1.2e-7; each the Poisson-binomial law of the pooled count, every cell at its exact coverage under the "
                 "doubled variance (10,608 and 204 cells, mean 0.758)", "exact"),
    "tests/flows/test_rehearsal.py::test_rehearsal_runs_the_production_path_on_synthetic_inputs": FalseAlarm(
        2.0e-06, "the flow's two verdicts at family-wise alpha 1e-6 each (Bonferroni over the rows; a Poisson-binomial "
                 "count is less dispersed than the binomial of its tolerance): 2e-6; the pooled coverages outside 0.85-0.95 "
                 "(US, 21,216 cells: 2.8e-124) and 0.80-0.98 (Puerto Rico, 408 cells: 5.7e-10), exact Poisson-binomial "
                 "laws; a pooled MAE of 0 (every noise 0): below 1e-300", "bound"),
    "tests/system/test_accuracy.py::test_coverage_on_the_demo_data": FalseAlarm(
        1.0e-06, "the rehearsal verdict at family-wise alpha 1e-6 (Bonferroni over its rows): 1e-6; the measured tables' "
                 "pooled MOE coverage outside 0.88-0.92, its exact Poisson-binomial law (9,792 cells, mean 0.9014): "
                 "1.2e-10; the credible intervals' pooled coverage of counts (0.88-0.96) and averages (0.86-0.98, "
                 "lattices above 1,000,000 points drawn): the normal law of the mean of 8 independent trials, its mean "
                 "and sd at the 99.9% limits of 22 seeded replications of a trial (0.9165, sd 0.0076; 0.9222, sd "
                 "0.0105): 6.5e-11 and 4.2e-14", "monte carlo"),
    "tests/system/test_accuracy.py::test_small_experiment_writes_metrics_report_and_plots": FalseAlarm(
        6.5e-15, "the production's averages out of bounds somewhere fails only if no PH5 model is fitted in either trial "
                 "(a fitted one's mean ratio is above tau = 2 surely): the usa_* model fits when each of its 5 rows' noise "
                 "is above 1.5 - 6 sd (truth + 1 person lies in the shrunken polytope), failing with at most 8.0e-8 a "
                 "trial by the discrete Gaussian's sub-Gaussian tails (Canonne-Kamath-Steinke), squared; the other "
                 "assertions are deterministic", "bound"),
    "tests/system/test_accuracy_bounds.py::test_both_bounds_at_the_same_budgets": FalseAlarm(
        1.0e-300, "the pooled row's MAE is 0 only if all 1,224 noises are 0: the product of P(Z = 0) over its cells; the "
                  "MOE ratios and the coverage ranges are deterministic", "bound"),
    "tests/system/test_empirical_audit_cli.py::test_a_pool_of_processes_runs_the_same_audit": FalseAlarm(
        1.0e-30, "compares seeded coins only; the truncation keys' distinctness: 170 fresh 16-byte keys, birthday "
                 "bound 170^2 / 2^129", "bound"),
    "tests/system/test_empirical_audit_cli.py::test_a_small_audit_writes_its_report": FalseAlarm(
        1.0e-05, "two audits of correct code must pass, each of two calibrations: 2 x (1e-6 + 1e-6) + 1e-6 each "
                 "(alpha of the verdicts and the WEAK bound per calibration, check_alpha)", "bound"),
    "tests/system/test_estimate_coverage.py::test_average_interval_coverage_within_its_binomial_tolerance": FalseAlarm(
        8.9e-08, "per cell, the covered count over 600 independent groups, whose tails the binomial at its mean "
                 "bounds (Hoeffding 1956), the mean at the ends of its 99.9% interval from 70 seeded replications "
                 "(0.9006-0.9119), outside 0.83-0.97; summed over the three cells", "monte carlo"),
    "tests/system/test_estimate_coverage.py::test_count_interval_coverage_within_its_binomial_tolerance": FalseAlarm(
        1.7e-06, "Binomial(4000, p) outside [ppf(5e-7), isf(5e-7)] for the discrete Gaussian (p = 0.926: 8.1e-7) and "
                 "the geometric (p = 0.919: 9.3e-7), p the noise pmf's mass on the set that the far interval covers",
        "exact"),
    "tests/system/test_postprocess_coverage.py::test_average_coverage_full_simulation": FalseAlarm(
        8.6e-06, "Bennett's inequality over the 1,500 independent groups (covered count 0-3 each; its variance sum "
                 "bounded by E sum C^2 - (E sum C)^2 / G) with the mean at the 99.9% limits of 20 seeded replications of "
                 "the test (noise from the exact pmf): large denominators outside 0.85-0.96 8.0e-6, small outside "
                 "0.92-0.995 5.4e-7, pooled outside 0.87-0.97 1.2e-9", "monte carlo"),
    "tests/system/test_postprocess_coverage.py::test_credible_interval_coverage_full_simulation": FalseAlarm(
        5.0e-10, "per noise law, the Poisson-binomial laws of the covered counts (each seeded truth at its exact HPD "
                 "coverage under the pmf) outside their bands, summed over the four bands (pooled, zero, near, far with "
                 "40,000 far truths) and the four laws; the zero truths dominate (4.4e-10 and 5.9e-11)", "exact"),
    "tests/system/test_postprocess_coverage.py::test_moe_coverage_full_simulation": FalseAlarm(
        2.5e-16, "per noise law, Binomial(120000, p) outside 0.888-0.915, p the law's exact MOE coverage "
                 "(0.8975-0.9083), summed over the 12 laws (sigma 12.2's 0.9083 dominates)", "exact"),
    "tests/unit/test_empirical_audit.py::test_correct_code_passes": FalseAlarm(
        5.0e-06, "two calibrations x (alpha 1e-6 for a false VIOLATION/EXCESS + alpha 1e-6 for a false WEAK) + "
                 "check_alpha 1e-6; mu_lb > 0 at the lead level fails below 1e-100 (25 standard errors)", "bound"),
    "tests/unit/test_empirical_audit.py::test_defects_smaller_than_2x_at_one_level_are_caught": FalseAlarm(
        7.0e-07, "7 planted defects, each run for a miss probability below 1e-7 (its runs from the normal "
                 "approximation of the Clopper-Pearson limits: mu_hat 5.2 standard errors above the verdict's "
                 "threshold plus the bound's margin); the white-box checks are deterministic", "approximation"),
    "tests/unit/test_empirical_audit.py::test_each_planted_bug_is_caught": FalseAlarm(
        4.0e-09, "4 black-box bugs with mu_lb 6 to 28 standard errors above the EXCESS threshold (miss below 1e-9 "
                 "each, normal approximation); the others' checks are deterministic or at chance below 1e-40", "approximation"),
    "tests/unit/test_empirical_audit.py::test_pure_dp_is_audited_with_the_tail_event": FalseAlarm(
        3.1e-06, "correct code: alpha 1e-6 (VIOLATION/EXCESS) + alpha 1e-6 (WEAK) + check_alpha 1e-6, and the "
                 "bounds' ordering below 1e-10 (6.5 and 7.9 standard errors); the bug: epsilon_lb 7.6 standard "
                 "errors above the EXCESS threshold at 80 runs (below 1e-13)", "bound"),
    "tests/unit/test_empirical_audit.py::test_the_seed_seeds_the_data_never_the_noise": FalseAlarm(
        1.0e-100, "two audits' fresh noise equal in every one of thousands of cells (below 0.1 per cell)", "bound"),
    "tests/unit/test_noise.py::test_discrete_gaussian_goodness_of_fit": FalseAlarm(
        9.5e-06, "the size of Pearson's test at chi2.isf(1e-6) by 10^6 seeded multinomial samples of the test's bins "
                 "(200,000 draws of the exact pmf): 1 exceedance each for sigma 121.6 (815 bins) and sigma 2 (17 bins), "
                 "Clopper-Pearson 95% upper limits 4.7e-6 each; the power checks' misses below 1e-300 (a merged bin's "
                 "binomial bound)", "monte carlo"),
    "tests/unit/test_noise.py::test_large_counts_do_not_saturate": FalseAlarm(
        1.6e-43, "3 cells x P(|Z| >= 100) for the two-sided geometric of scale 1: 2 q^100 / (1 + q), q = 1/e", "exact"),
    "tests/unit/test_noise.py::test_noise_is_not_seeded_and_is_integer": FalseAlarm(
        8.9e-11, "2000 draws of the discrete Gaussian, sigma^2 = 4, its exact pmf: Chernoff bounds of P(mean Z^2 >= 5.29) "
                 "(2e-19: std >= 2.3), P(mean Z^2 <= 3.2) and P(|mean Z| >= 0.557) (8.9e-11: std <= 1.7); equal vectors, "
                 "all zeros or one sign only below 1e-300", "bound"),
    "tests/unit/test_noise.py::test_two_sided_geometric_goodness_of_fit": FalseAlarm(
        1.6e-05, "the size of Pearson's test at chi2.isf(1e-6) by 10^6 seeded multinomial samples of the test's bins "
                 "(200,000 draws of the exact pmf): 4 exceedances for s = 36.4 (515 bins) and 2 for s = 2 (39 bins), "
                 "Clopper-Pearson 95% upper limits 9.2e-6 and 6.3e-6; the power checks' misses below 1e-300 (a merged "
                 "bin's binomial bound)", "monte carlo"),
    "tests/unit/test_postprocess.py::test_average_intervals_cover_about_90_percent_fast": FalseAlarm(
        1.5e-07, "Bennett's inequality over the 300 independent groups (covered count 0-3 each): the sum of their "
                 "variances at most 300 x 0.438 and the coverage's mean within 0.9084-0.9132, 99.9% limits from 250 "
                 "seeded replications of the test with the noise drawn from the exact pmf; lower band 1.1e-7, upper "
                 "4.3e-8", "monte carlo"),
    "tests/unit/test_postprocess.py::test_credible_intervals_cover_about_90_percent_fast": FalseAlarm(
        9.1e-07, "the covered counts' exact laws: near 0, Poisson-binomial over the seeded truths, each at its exact "
                 "coverage (sum of the noise pmf over the draws whose interval holds the truth): outside 0.88-0.95 "
                 "6.4e-24 (discrete Gaussian) and 2.5e-29 (geometric); far from 0, Binomial(8000, 0.9012) outside its "
                 "central 1 - 1e-6: 9.1e-7", "exact"),
    "tests/unit/test_postprocess.py::test_stated_moe_covers_about_90_percent_of_the_noise": FalseAlarm(
        9.4e-07, "the covered count's exact law, the convolution of Binomial(8000, p_i) at the three smallest production "
                 "variances' exact MOE coverages (0.9083, 0.8975, 0.9024), outside its central interval (5e-7 a tail)",
        "exact"),
}

# Sorted by key: a module, a class or a test -> why its assertions do not depend on the draws.
NOT_ASSERTED: dict[str, str] = {
    "tests/flows/test_dask.py":
        "releases through the Dask task runner: the counts are compared exact (before noise), the releases for "
        "files and ledger entries only",
    "tests/flows/test_flows.py":
        "the release flows' states, artifacts, logs and ledgers; the noisy tables are checked for files, digests "
        "and counts of draws, never values",
    "tests/flows/test_rehearsal.py::test_rehearsal_fails_when_a_release_does_not_verify":
        "a table altered after publication fails the verification, whatever its noise: messages and artifacts "
        "only",
    "tests/flows/test_release_path.py":
        "the release path's stages, spends and refusals; the noisy tables for files and digests only",
    "tests/flows/test_server_e2e.py":
        "the production stack end to end: states, artifacts, units and logs; releases checked as files",
    "tests/system/test_accuracy.py::test_cli_smoke_on_the_demo_data":
        "the command's output, files and refusals; no coverage or error value asserted",
    "tests/system/test_bad_inputs.py":
        "bad inputs are refused before any spend; the good runs are checked for exit codes and files",
    "tests/system/test_cli_output.py":
        "progress lines, quiet and error output of the commands; never a released value",
    "tests/system/test_command_line_refusals.py":
        "refusals and stops of the command line: exit codes, messages, ledgers",
    "tests/system/test_config_read_once.py":
        "the config is read once per run: file opens counted; the release as files only",
    "tests/system/test_crash_safety.py":
        "kills at every step: what the ledger and the outputs hold afterwards, digests against the ledger, never "
        "values",
    "tests/system/test_crash_states.py":
        "crashes at every write of a release, a resume and a repair: what the ledger, the log and the release folder hold afterwards and what the audit says; noise only as digests",
    "tests/system/test_datapackage.py":
        "the data package's schema and digests; a count is changed by +1 and detected by its digest, whatever its"
        " value",
    "tests/system/test_estimate_files.py":
        "the Census estimate files' names, columns, formats and checks; identities between columns, never a "
        "value's size",
    "tests/system/test_exact_sensitivity_release.py":
        "releases at the exact sensitivities: variances and statements, deterministic functions of the plan",
    "tests/system/test_governance.py":
        "policy, caps and reasons in the ledger; releases as spends and files",
    "tests/system/test_ledger_concurrency.py":
        "concurrent spends on one ledger: the ledger's entries and the refusals",
    "tests/system/test_national.py":
        "national inputs: exact counts (before noise) against a reference, memory refusals and messages",
    "tests/system/test_partitioned.py":
        "partitioned inputs: exact counts (before noise) equal across layouts; releases as files",
    "tests/system/test_postprocess_release.py":
        "post-processing of a release: columns and the estimates' logical bounds, which hold for every noisy "
        "value",
    "tests/system/test_private_engine.py":
        "the private engine: exact and truncated counts, variances, ledger entries; noisy counts as written, "
        "never their size",
    "tests/system/test_public_log.py":
        "the public log and its witnesses: signatures, cosignatures, proofs and statements",
    "tests/system/test_public_log_monitor.py":
        "the monitor's and the witnesses' findings, exit statuses and time-outs; releases only as log entries",
    "tests/system/test_readme_api.py":
        "the README's Python API runs as written; outputs as files and labels",
    "tests/system/test_recovery.py":
        "stops and resumes: what the ledger, the log and the outputs say afterwards; recovered tables equal to "
        "those committed",
    "tests/system/test_release_once.py":
        "a run publishes once: ledger entries, folders and refusals",
    "tests/system/test_reliability.py":
        "faults before and after spending: recovery without new noise is checked by the ledger's digests, never "
        "by values",
    "tests/system/test_reports_offline.py":
        "the HTML reports open offline: their structure, links and embedded plots, never a figure's value",
    "tests/system/test_resume.py":
        "resumes reuse the committed noise: the resumed tables equal the committed ones (digests), whatever their"
        " values",
    "tests/system/test_witnessed_recovery.py":
        "recovery with witnesses: ledger, log and statements",
    "tests/unit/test_audit.py":
        "the auditor's checks of ledgers and releases; the content mutants change a noisy table in ways detected "
        "for every value (a count +1, two different counts swapped)",
    "tests/unit/test_dataset_claims.py":
        "datasets declared, claimed and retired: the ledger's accounts, the log's entries and the outsider's and the monitor's findings; noise only as spends",
    "tests/unit/test_ledger.py":
        "the ledger's entries, chain, caps and repairs; noise only as digests of what was drawn",
    "tests/unit/test_ledger_resume.py":
        "resumes and re-spends in the ledger: charges and entries; noise only as digests",
    "tests/unit/test_noise.py::test_intent_is_recorded_before_the_sampler_runs":
        "the order of the ledger's entries and the sampler's call; the noisy vector's type, shape and digest",
    "tests/unit/test_noise.py::test_with_the_production_ledger_intent_is_durable_before_the_draw":
        "what the ledger holds on disk when the sampler runs, and the digest of the draw",
    "tests/unit/test_public_monitor.py":
        "the monitor's findings and exit statuses for genuine and attacked logs; releases only as log entries",
    "tests/unit/test_public_statement.py":
        "the public statement of spends and releases, a function of the ledger's public facts",
    "tests/unit/test_publog.py":
        "the public log as the ledger's projection, its quorum and forks; noise only as digests",
}
