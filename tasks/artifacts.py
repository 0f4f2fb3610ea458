"""What a run shows in the Prefect UI: five artifacts per dataset run, one summary per release.

``<dataset>-budget-spends`` (table; the dataset's spent / cap / left beside the plan),
``<dataset>-input-validation`` and ``<dataset>-output-validation`` (table of broken rules, or a
note that every rule holds), ``<dataset>-output-manifest`` and ``<dataset>-ledger-checkpoint``
(Markdown); the release run's ``release-summary`` (per dataset: where published, what this
attempt spent -- "nothing spent by this attempt" on a Retry of a published release -- the run's
charge, the dataset's lifetime spend, cap and what is left, the ledger checkpoint).

Artifacts live in the Prefect database, outside the data's trust boundary: each holds public
facts only -- budgets (as decimals), sensitivities, variances, MOEs, cell counts of public
domains, names of broken rules, digests of the published (noisy) tables, the signed ledger
checkpoint. Never microdata, an exact count, a failing-row count or a digest of the inputs: the
number of rows breaking a rule is a statistic of the confidential data, and stays in the
validation report inside the enclave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tasks._format import decimal_text

_BUDGET_COLUMNS = ("rho", "epsilon", "budget")


def _key(label: str, what: str) -> str:
    # Artifact keys: lowercase letters, digits and dashes. The key is per dataset, so the UI
    # shows each run's artifact as a new version of e.g. ``us-budget-spends``.
    return f"{label}-{what}".lower().replace("_", "-")


def account_text(budget: Any) -> str:
    """``dataset demo-us: spent 1.257281 of its lifetime cap 2.6 (rho); 1.342719 left``."""
    if budget is None:
        return "the dataset's account could not be read from the ledger"
    cap = f"lifetime cap {decimal_text(budget.cap)} ({budget.unit})"
    if not budget.enforced:
        cap += ", recorded but not enforced: a throwaway ledger of non-confidential data"
    return f"dataset `{budget.dataset}`: spent {decimal_text(budget.spent)} of its {cap}; {decimal_text(budget.left)} left"


def budget_spends(label: str, run_id: str, rows: list[dict[str, Any]], total: Any, budget: Any = None) -> None:
    """Table × level: ρ or ε, Δ, σ², 90% MOE, cells, spends and status (from the ledger); the
    dataset's spent, cap and left in the description, beside the plan's total."""
    table = [{k: decimal_text(v) if k in _BUDGET_COLUMNS else (round(v, 2) if k == "moe90" else v)
              for k, v in row.items()} for row in rows]
    charge = f", charged {decimal_text(budget.run_charge)}" if budget is not None else ""
    create_table_artifact(
        key=_key(label, "budget-spends"),
        table=table,
        description=f"Privacy-loss spends of run `{run_id}` as recorded in the ledger: planned total "
                    f"{decimal_text(total)}{charge}. The {account_text(budget)}.",
    )


def attempt_spend_text(outcome: dict[str, Any]) -> str:
    """What this attempt of a dataset run spent: ``1.257281``, or ``nothing spent by this attempt``
    (a Retry of a run that had published, or a resume that reused every measurement)."""
    spent = outcome.get("attempt_spend")
    if outcome.get("already_published") or spent in (None, "0"):
        return "nothing spent by this attempt"
    return decimal_text(spent)


def release_summary(run_name: str, outcomes: dict[str, dict[str, Any]]) -> None:
    """The release run's summary: one row per dataset (published where, what this attempt spent,
    the run's charge, the dataset's lifetime spend, cap and what is left, the ledger checkpoint),
    or why it failed."""
    lines = [f"# Release `{run_name}`", "",
             "| dataset | outcome | release | spent by this attempt | the run's charge | lifetime spent | cap | left "
             "| ledger checkpoint |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, o in outcomes.items():
        if o.get("failed"):
            lines.append(f"| {label} | **failed**: {o['failed']} | - | - | - | - | - | - | - |")
            continue
        outcome = "already published (nothing done)" if o.get("already_published") else (
            "published" + (f", attempt {o['attempt']}" if o.get("attempt", 1) > 1 else ""))
        checkpoint = (f"size {o['checkpoint_size']}, head `{o['checkpoint_head']}`"
                      + ("" if o.get("checkpoint_signed") else " (unsigned)")) if o.get("checkpoint_size") else "-"
        lines.append(f"| {label} (`{o['dataset']}`) | {outcome}: run `{o['run_id']}` | `{o['outputs']}` "
                     f"| {attempt_spend_text(o)} | {decimal_text(o.get('run_charge', '-'))} "
                     f"| {decimal_text(o.get('dataset_spent', '-'))} "
                     f"| {decimal_text(o.get('lifetime_cap', '-'))} ({o.get('unit', '')}) "
                     f"| {decimal_text(o.get('left', '-'))} | {checkpoint} |")
    lines += ["", "Each dataset's spends, validation, manifest and checkpoint are in its subflow run's artifacts "
              "(`us-…`, `pr-…`). Auditors check a release offline with `phsafe audit verify LEDGER --outputs "
              "RELEASE --public-key KEY`."]
    create_markdown_artifact(key="release-summary", markdown="\n".join(lines) + "\n",
                             description=f"Release {run_name}: where each dataset was published and its privacy-loss account")


def broken_rules(report: Any) -> list[dict[str, str]]:
    """The public part of a validation report: file, columns and rule of each broken rule."""
    return [{"file": f.file, "columns": ", ".join(f.columns), "rule": f.rule} for f in report.failures]


def broken_rules_text(subject: str, report: Any) -> str:
    """A failed validation as the flow run's message shows it: rules only, no counts."""
    rules = broken_rules(report)
    lines = [f"{subject}: {len(rules)} rule{'s' if len(rules) != 1 else ''} failed"]
    lines += [f"  {r['file']}" + (f" [{r['columns']}]" if r["columns"] else "") + f": {r['rule']}" for r in rules]
    return "\n".join(lines)


def validation_summary(label: str, run_id: str, subject: str, report: Any) -> None:
    """Each broken rule: file, columns, rule. Failing-row counts stay in the confidential report."""
    failures = broken_rules(report)
    verdict = "passed" if report.ok else f"FAILED ({len(failures)} rule(s) broken)"
    description = f"{subject.capitalize()} validation of run `{run_id}`: {verdict}."
    if failures:
        create_table_artifact(key=_key(label, f"{subject}-validation"), table=failures,
                              description=description + " Failing-row counts are in the validation "
                                                        "report inside the enclave.")
    else:
        create_markdown_artifact(key=_key(label, f"{subject}-validation"),
                                 markdown=f"# {subject.capitalize()} validation: {verdict}\n\nRun `{run_id}`.\n"
                                 + "".join(f"\n- {n}" for n in report.notes),
                                 description=description)


def output_manifest(label: str, output_dir: Path) -> None:
    """The published manifest, as published: public facts only (the plan's budgets, the code, the
    dataset name, every released file's SHA-256, the keyed lineage commitment)."""
    manifest = json.loads((Path(output_dir) / "manifest.json").read_text(encoding="utf-8"))
    lines = [
        f"# Outputs of run `{manifest['run_id']}`", "",
        f"Published to `{output_dir}`.", "",
        f"- dataset: `{manifest.get('dataset', '-')}`",
        f"- privacy definition: {manifest['privacy_defn']}, total budget {decimal_text(manifest['total_budget'])}",
        f"- code: `{manifest['code_version']}`",
    ]
    lineage = manifest.get("lineage")
    if lineage:
        lines.append(f"- lineage commitment (keyed; auditors check it with the ledger's key): "
                     f"`{lineage['commitment']}`")
    lines += [
        "", "| file | sha256 |", "|---|---|",
        *[f"| {name} | `{digest}` |" for name, digest in sorted(manifest["files"].items())],
    ]
    create_markdown_artifact(key=_key(label, "output-manifest"), markdown="\n".join(lines) + "\n",
                             description=f"Output manifest of run {manifest['run_id']}")


def ledger_checkpoint(label: str, run_id: str, checkpoint: dict[str, Any]) -> None:
    """The ledger checkpoint after the run (size, head hash, Ed25519 signature if signed)."""
    signed = "signed" if checkpoint.get("signature") else "UNSIGNED (no signing key configured)"
    markdown = (
        f"# Ledger checkpoint after run `{run_id}` ({signed})\n\n"
        "Verify offline with `phsafe audit verify LEDGER --checkpoint FILE --public-key KEY`.\n\n"
        f"```json\n{json.dumps(checkpoint, indent=2, sort_keys=True)}\n```\n"
    )
    create_markdown_artifact(key=_key(label, "ledger-checkpoint"), markdown=markdown,
                             description=f"Ledger checkpoint after run {run_id} ({signed})")


# --------------------------------------------------------------------------------------------
# The weekly rehearsal (synthetic inputs declared non-confidential)
# --------------------------------------------------------------------------------------------

_SYNTHETIC = ("Synthetic inputs declared non-confidential: accuracy figures like these are computed "
              "only on such data, never on the production inputs.")


def _share(value: float) -> str:
    return f"{value:.4f}"


def rehearsal_coverage(run_id: str, verdicts: dict[str, Any], alpha: float) -> None:
    """Coverage of the stated 90% MOE per dataset × table × level, against its binomial tolerance.

    Eight narrow columns, so the table fits the UI's artifact pane; the error figures of the same
    rows are :func:`rehearsal_errors`, the plots :func:`rehearsal_report`."""
    rows = []
    for label, verdict in verdicts.items():
        for r in verdict.rows.to_dict(orient="records"):
            rows.append({
                "dataset": label, "table": r["TABLE"], "level": r["LEVEL"], "n": r["N"],
                "coverage": _share(r["COVERAGE"]), "expected": _share(r["EXPECTED"]),
                "tolerance": f"[{_share(r['TOLERANCE_LOW'])}, {_share(r['TOLERANCE_HIGH'])}]",
                "verdict": "ok" if r["OK"] else "OUTSIDE",
            })
    outside = sum(r["verdict"] != "ok" for r in rows)
    verdict = "every table and level within tolerance" if not outside else f"{outside} OUTSIDE tolerance"
    create_table_artifact(
        key="rehearsal-moe-coverage", table=rows,
        description=(f"Rehearsal `{run_id}`: {verdict}. 'coverage': the share of the n released cells × trials "
                     "within the stated 90% MOE of the truncated exact count (nominal 0.90); 'expected': the exact "
                     "coverage of the integer noise; 'tolerance': its binomial interval (Bonferroni: a correct "
                     f"pipeline fails a rehearsal with probability ≤ {alpha:g}). Errors: rehearsal-accuracy-errors; "
                     f"plots: rehearsal-accuracy-report. {_SYNTHETIC}"),
    )


def rehearsal_errors(run_id: str, errors: dict[str, list[dict[str, Any]]]) -> None:
    """The error figures of the accuracy experiment per dataset × table × level (seven columns)."""
    rows = [{"dataset": label, "table": e["TABLE"], "level": e["LEVEL"], "mean MOE": f"{e['MEAN_MOE']:.1f}",
             "MAE": f"{e['MAE']:.1f}", "P90 |error|": f"{e['P90_ABS_ERROR']:.1f}",
             "truncation MAE": f"{e['TRUNCATION_MAE']:.2f}"}
            for label, figures in errors.items() for e in figures]
    create_table_artifact(
        key="rehearsal-accuracy-errors", table=rows,
        description=(f"Rehearsal `{run_id}`: errors of the released counts against the true counts over the "
                     "trials -- mean stated 90% MOE, mean absolute error, 90th percentile of |error|, and the "
                     f"part of the MAE due to truncation. {_SYNTHETIC}"),
    )


# The plots of ``phsafe accuracy``, in the order the report shows them.
_PLOTS = (("coverage.png", "MOE coverage per table and level, with ±2 SE"),
          ("mae.png", "Mean absolute error per table and level"),
          ("error_distribution.png", "Distribution of the errors"),
          ("abs_errors.png", "Absolute errors per table and level"),
          ("averages_coverage.png", "Coverage of the averages"))


def _embedded_png(path: Path) -> str:
    """A PNG as a ``data:`` URI: the UI shows it inline (it cannot open a worker's ``file://``)."""
    import base64

    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def rehearsal_report(run_id: str, folder: Path, inputs: dict[str, dict[str, Any]], runs: dict[str, str],
                     verification: dict[str, str], accuracy: dict[str, dict[str, Any]]) -> None:
    """The rehearsal at a glance: per dataset its inputs, its production run, the auditors' check of
    its release and the accuracy plots, embedded so that the Prefect UI shows them (synthetic data:
    the plots are public facts). Lists, not a wide table, so that it fits the artifact pane."""
    lines = [f"# Rehearsal `{run_id}`", "", _SYNTHETIC, "", f"Folder on the worker: `{folder}`"]
    for label in inputs:
        i, a = inputs[label], accuracy.get(label, {})
        lines += ["", f"## {label}", "",
                  f"- **Synthetic inputs**: {i['persons']:,} persons, {i['states']} state(s), {i['format']}, "
                  f"seed {i['seed']}",
                  f"- **Production flow**: {runs.get(label, '-')}",
                  f"- **Release**: {verification.get(label, 'not published')}",
                  f"- **Accuracy report**: `{a['report']}`" if a else "- **Accuracy**: not measured"]
        plots = {Path(p).name: Path(p) for p in a.get("plots", []) if Path(p).is_file()}
        captions = dict(_PLOTS)
        for name in sorted(plots, key=lambda n: ([p for p, _ in _PLOTS] + [n]).index(n)):
            caption = captions.get(name, name)
            lines += ["", f"**{label}: {caption}**", "", f"![{label} {caption}]({_embedded_png(plots[name])})"]
    create_markdown_artifact(key="rehearsal-accuracy-report", markdown="\n".join(lines) + "\n",
                             description=f"Rehearsal {run_id}: inputs, runs, verification and accuracy plots. "
                                         f"{_SYNTHETIC}")
