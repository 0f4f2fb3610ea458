"""Prefect tasks of the weekly empirical privacy audit: one per table, then the verdicts and the
report, and its artifacts.

Thin wrappers over :mod:`phsafe.audit.empirical`. The audit runs the release code on data it
generates itself, never on inputs: its numbers are public facts about the code, so its report is
shown whole in the Prefect UI (the artifacts say so). The production rules of noise-drawing tasks
hold all the same (as in tasks/pipeline.py): nothing cached or persisted, no retry that draws again.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.logging import get_run_logger

from phsafe.audit.empirical import AuditResult, AuditSettings, ReleaseMechanism, write_report
from phsafe.audit.empirical.audit import AuditPlan, TableAudit, TablePlan, audit_background, audit_table, conclude

_NOTHING_KEPT = {"cache_policy": NONE, "persist_result": False}
PUBLIC = ("Generated data only: the audit runs the release code on a synthetic background and canary households "
          "it makes itself, never on inputs; these figures are public facts about the code.")


class _Progress:
    """A task's progress: one log line per tenth of its runs (the runs are many)."""

    def __init__(self, table: str, total: int) -> None:
        self.table, self.total, self.done = table, total, 0
        self.logger = get_run_logger()

    def advance(self, amount: int = 1, *, item: str | None = None) -> None:
        self.done += amount
        step = max(1, self.total // 10)
        if self.done == self.total or (self.done - amount) // step != self.done // step:
            self.logger.info("%s: %d of %d runs", self.table, self.done, self.total)

    def update(self, completed: int, *, total: int | None = None, item: str | None = None) -> None:
        self.done = completed


@task(name="audit-table", task_run_name="audit-{table_plan.table}-{table_plan.sensitivity}", **_NOTHING_KEPT,
      retries=0)
def audit_one_table(settings: AuditSettings, table_plan: TablePlan, salt: bytes) -> TableAudit:
    """The runs of one table under one calibration (the release path, many times, on its
    canaries), in ``settings.workers`` processes."""
    background = audit_background(settings)
    return audit_table(settings, table_plan, ReleaseMechanism(), salt, background,
                       _Progress(f"{table_plan.table} ({table_plan.sensitivity})", table_plan.runs),
                       workers=settings.workers)



@task(name="conclude-audit", **_NOTHING_KEPT, retries=0)
def conclude_audit(plan: AuditPlan, audits: list[TableAudit], folder: Path, seconds: float, cpu_seconds: float,
                   started: str) -> AuditResult:
    """The verdicts and checks, and the report (``audit.json``, ``audit.html``) in ``folder``."""
    result = conclude(plan, audits, ReleaseMechanism(), seconds=seconds, cpu_seconds=cpu_seconds, started=started)
    write_report(result, folder)
    return result


def _number(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def report_artifacts(audit_id: str, result: AuditResult, folder: Path) -> None:
    """The verdict table, and the summary with the plots embedded (public: generated data)."""
    rows = []
    for r in result.rows:
        d = r.as_dict()
        rows.append({"table": r.table, "level": r.level, "sensitivity": r.sensitivity,
                     "budget": "production" if r.budget_scale == 1 else f"x{r.budget_scale:g} (scaled)",
                     "mu_lb": _number(d["mu_lb"]), "mu_ub": _number(d["mu_ub"]), "mu_reach": _number(d["mu_reach"]),
                     "mu_declared": _number(d["mu_declared"]), "epsilon_hat / epsilon": _number(d["epsilon_ratio"]),
                     "ceiling": _number(d["ceiling"]), "verdict": r.verdict,
                     "runs to separate": "-" if r.runs_to_separate is None else r.runs_to_separate,
                     "runs": r.runs, "seconds": round(r.seconds)})
    create_table_artifact(key="empirical-audit-verdicts", table=rows,
                          description=f"Empirical audit {audit_id}: {result.verdict}. {PUBLIC}")
    failed = [c for c in result.checks if c.status == "FAIL"]
    lines = [f"# Empirical privacy audit `{audit_id}`: {result.verdict}", "", PUBLIC, "",
             f"- mode {result.settings.mode}, seed {result.settings.seed}, sensitivities "
             f"{' and '.join(result.calibrations)}, {len(result.rows)} rows "
             f"({sum(r.verdict == 'INCONCLUSIVE' for r in result.rows)} inconclusive), "
             f"{result.seconds:,.0f} s ({result.cpu_seconds:,.0f} CPU-seconds)",
             f"- report on the worker: `{folder / 'audit.html'}` and `audit.json`",
             f"- checks: {sum(c.status == 'PASS' for c in result.checks)} passed, {len(failed)} failed, "
             f"{sum(c.status == 'INCONCLUSIVE' for c in result.checks)} inconclusive"]
    lines += [f"- **FAILED** {c.name} ({c.table} {c.level}): {c.detail}" for c in failed[:20]]
    for name, caption in (("mu_bounds.png", "Bounds on mu per table and level"),
                          ("statistics.png", "The canaries' test statistic")):
        path = folder / name
        if path.is_file():
            uri = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
            lines += ["", f"**{caption}**", "", f"![{caption}]({uri})"]
    create_markdown_artifact(key="empirical-audit-report", markdown="\n".join(lines) + "\n",
                             description=f"Empirical audit {audit_id}. {PUBLIC}")
