"""What a run shows in the Prefect UI: budget spends, validation summary, manifest, checkpoint.

Every artifact is value-free: budgets, sensitivities, variances, cell counts of public domains,
rule names with failing-row counts, file digests and the signed ledger checkpoint. No microdata,
no exact count, no raw value of a bad row ever goes into one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact


def _key(label: str, what: str) -> str:
    # Artifact keys: lowercase letters, digits and dashes. The key is per dataset, so the UI
    # shows each run's artifact as a new version of e.g. ``us-budget-spends``.
    return f"{label}-{what}".lower().replace("_", "-")


def budget_spends(label: str, run_id: str, rows: list[dict[str, Any]], total: str) -> None:
    """Table × level: ρ or ε, Δ, σ², 90% MOE, cells, spends and status (from the ledger)."""
    create_table_artifact(
        key=_key(label, "budget-spends"),
        table=rows,
        description=f"Privacy-loss spends of run `{run_id}` as recorded in the ledger; planned total {total}.",
    )


def validation_summary(label: str, run_id: str, subject: str, report: Any) -> None:
    """Each broken rule: file, columns, rule, failing row count (never the rows)."""
    failures = [
        {"file": f.file, "columns": ", ".join(f.columns), "rule": f.rule,
         "failing": "" if f.failing_rows is None else f"{f.failing_rows} {f.row_noun}s"}
        for f in report.failures
    ]
    verdict = "passed" if report.ok else f"FAILED ({len(failures)} rule(s) broken)"
    if failures:
        create_table_artifact(key=_key(label, f"{subject}-validation"), table=failures,
                              description=f"{subject.capitalize()} validation of run `{run_id}`: {verdict}.")
    else:
        create_markdown_artifact(key=_key(label, f"{subject}-validation"),
                                 markdown=f"# {subject.capitalize()} validation: {verdict}\n\nRun `{run_id}`.\n"
                                 + "".join(f"\n- {n}" for n in report.notes),
                                 description=f"{subject.capitalize()} validation of run `{run_id}`: {verdict}.")


def output_manifest(label: str, output_dir: Path) -> None:
    """The published manifest: every file with its SHA-256, lineage digests."""
    manifest = json.loads((Path(output_dir) / "manifest.json").read_text(encoding="utf-8"))
    lines = [
        f"# Outputs of run `{manifest['run_id']}`", "",
        f"Published to `{output_dir}`.", "",
        f"- privacy definition: {manifest['privacy_defn']}, total budget {manifest['total_budget']}",
        f"- config: `{manifest['config']['path']}` sha256 `{manifest['config']['sha256']}`",
        f"- code: `{manifest['code_version']}`",
        f"- ledger: `{manifest['ledger']}`", "",
        "| input | sha256 |", "|---|---|",
        *[f"| {name} | `{digest}` |" for name, digest in sorted(manifest["inputs"].items())], "",
        "| file | sha256 |", "|---|---|",
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
