"""The ``phsafe accuracy`` command (mounted by :mod:`phsafe.cli`).

``phsafe accuracy CONFIG DATA OUT --trials K --non-confidential`` runs the private algorithm K
times on synthetic (non-confidential) DATA and reports its accuracy against the non-private
truth; without ``--non-confidential`` it refuses, runs nothing and writes nothing. With
``--compare-sensitivity`` it runs the experiment twice, calibrated to the paper's sensitivities and
to the exact ones at the same budgets, and compares them. See :mod:`phsafe.accuracy`.
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import handle_errors, log_option
from phsafe.cli._output import command_progress, overwrite_option, result_line, verbosity_options

_EXISTING = click.Path(exists=True, path_type=Path)


@click.command("accuracy")
@click.argument("config", type=_EXISTING)
@click.argument("data", type=_EXISTING)
@click.argument("output", type=click.Path(path_type=Path))
@overwrite_option
@click.option("--trials", "-k", type=click.IntRange(min=1), default=20, show_default=True,
              help="Number of private runs.")
@click.option("--non-confidential", is_flag=True,
              help="Required: confirm that DATA is synthetic or otherwise not confidential "
                   "(the experiment publishes 2*K releases of it).")
@click.option("--postprocess/--no-postprocess", "with_postprocess", default=True, show_default=True,
              help="Post-process every trial and measure the coverage of its credible intervals.")
@click.option("--draws", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Independent exact draws for an average whose two-dimensional lattice exceeds --exact-limit "
                   "(post-processing).")
@click.option("--exact-limit", type=click.IntRange(min=0), default=12_000_000, show_default=True,
              help="Largest two-dimensional lattice (points) of an average computed exactly (post-processing); "
                   "a larger one's interval comes from --draws exact draws.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of the post-processing simulations (default: random, shown in the report).")
@click.option("--production/--no-production", "compare_production", default=True, show_default=True,
              help="With post-processing: also estimate every trial by the Census Bureau's production method and "
                   "compare the estimate files (coverage, interval length, out-of-bounds share).")
@click.option("--compare-sensitivity", is_flag=True,
              help="Run the experiment twice at the config's budgets, calibrated to the PHSafe paper's sensitivities "
                   "and to the exact ones (docs/sensitivity.md), into OUTPUT/paper and OUTPUT/exact, and compare "
                   "MOE and coverage per table and level (sensitivity_comparison.csv/.md/.html).")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@log_option
@verbosity_options
@handle_errors
def accuracy(config: Path, data: Path, output: Path, overwrite: bool, trials: int, non_confidential: bool,
             with_postprocess: bool, draws: int, exact_limit: int, seed: int | None, compare_production: bool,
             compare_sensitivity: bool, no_plots: bool, log_file: Path | None) -> None:
    """Accuracy of K private runs of CONFIG on synthetic DATA, written to OUTPUT.

    Per table and level: mean and 90th-percentile absolute error against the non-private truth,
    empirical coverage of the stated 90% MOE, the truncation error on its own, and (with
    post-processing) the coverage of the 90% credible intervals and, per row of the Census
    Bureau's estimate files, ours against the production's method; Markdown, HTML, CSV and plots.
    Refuses unless --non-confidential is given.
    """
    if not non_confidential:
        click.echo(
            "phsafe: error: refusing to run: `phsafe accuracy` publishes 2*K private releases of DATA and is "
            "for synthetic or otherwise non-confidential data only. Pass --non-confidential to confirm that "
            "DATA is not confidential. Nothing was run or spent.",
            err=True,
        )
        raise SystemExit(1)
    from phsafe.accuracy import compare_bounds, run_accuracy

    if compare_sensitivity:
        with command_progress(log_file) as progress:
            compared = compare_bounds(config, data, output, trials=trials, non_confidential=True,
                                      with_postprocess=with_postprocess, draws=draws, exact_limit=exact_limit,
                                      seed=seed, plots=not no_plots, overwrite=overwrite, progress=progress)
        pooled = compared.comparison.set_index("TABLE").loc["ALL"]
        result_line(f"phsafe: sensitivity comparison in {compared.output_dir / 'sensitivity_comparison.html'} "
                    f"(pooled MOE exact/paper {pooled['MOE_RATIO']:.3f}; MOE coverage paper "
                    f"{pooled['COVERAGE_PAPER']:.3f}, exact {pooled['COVERAGE_EXACT']:.3f}; {compared.seconds:.0f} s)")
        return
    with command_progress(log_file) as progress:
        result = run_accuracy(config, data, output, trials=trials, non_confidential=True,
                              with_postprocess=with_postprocess, draws=draws, exact_limit=exact_limit, seed=seed,
                              plots=not no_plots, overwrite=overwrite, compare_production=compare_production,
                              progress=progress)
    overall = result.metrics[result.metrics["TABLE"] == "ALL"].iloc[0]
    note = ""
    if len(result.comparison):
        pooled = result.comparison[result.comparison["TABLE"] == "ALL"].set_index("METHOD")
        note = "; estimate files' 90% interval coverage " + ", ".join(
            f"{method} {pooled.loc[method, 'COVERAGE']:.3f}" for method in pooled.index)
    result_line(f"phsafe: accuracy report in {result.output_dir / 'report.html'} "
                f"(pooled MOE coverage {overall['MOE_COVERAGE']:.3f}{note}, {result.seconds:.0f} s)")
