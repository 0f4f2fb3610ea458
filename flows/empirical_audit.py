"""The weekly empirical privacy audit: the release code, run many times on neighbouring datasets.

Beside the rehearsal (which checks the accuracy of what a release states), this checks its
privacy: ``phsafe audit empirical`` in full mode -- every table at its production budgets, under the
config's calibration or both (``sensitivity``) -- as a flow, one task per table and calibration
(each running its runs in a process pool)::

    plan (canaries, runs, thresholds: fixed before any run)
      ─► audit-PH1_num, audit-PH1_denom, ... audit-PH8_denom   (the release path, many runs each)
      ─► conclude-audit                                        (verdicts, checks, audit.json/html)
      ─► artifacts: empirical-audit-verdicts (table), empirical-audit-report (summary, plots)

It ends Failed on a VIOLATION, an EXCESS or a failed check (a WEAK row is reported, not failed).
It reads no input data and touches no ledger: everything is generated from the seed (fresh each
week unless given, recorded), so its figures are public and shown whole in the UI.

Each audit writes ``<work_root>/empirical-audit/<audit id>/``; the ``keep`` most recent are kept.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from flows._logging import configure_once
from flows.sdhc import flow_run_name, run_id_for
from phsafe.errors import PHSafeError
from phsafe.parameters import front_end
from tasks import empirical_audit as t

log = structlog.get_logger("flows.empirical_audit")

MARKER = "empirical-audit.json"
FOLDER = "empirical-audit"


def _prune(root: Path, keep: int, current: Path) -> list[str]:
    folders = sorted((p for p in root.iterdir() if p.is_dir() and (p / MARKER).is_file() and p != current),
                     key=lambda p: p.name)
    doomed = folders[:max(len(folders) - (keep - 1), 0)]
    for folder in doomed:
        shutil.rmtree(folder)
    return [p.name for p in doomed]


@flow(name="sdhc-empirical-audit", flow_run_name=flow_run_name("empirical-audit"), retries=0,
      validate_parameters=True)
def empirical_audit_flow(
    work_root: str,
    config: str | None = None,
    mode: Literal["quick", "full"] = "full",
    sensitivity: Literal["paper", "exact", "both"] | None = None,
    tables: list[str] | None = None,
    seed: Annotated[int, Field(ge=0)] | None = None,
    runs: Annotated[int, Field(ge=2)] | None = None,
    budget_scale: Annotated[float, Field(gt=0)] | None = None,
    alpha: Annotated[float, Field(gt=0, le=0.5)] = 0.05,
    check_alpha: Annotated[float, Field(gt=0, le=0.5)] = 1e-3,
    workers: Annotated[int, Field(ge=1)] | None = None,
    keep: Annotated[int, Field(ge=1)] = 8,
) -> dict[str, Any]:
    """The empirical privacy audit of the release code, on generated data.

    Args:
        work_root: Each audit writes ``<work_root>/empirical-audit/<audit id>/``.
        config: The config whose budgets, tau and states are audited (default: the production
            US run's parameters, built in).
        mode: ``full`` (every table at production budgets) or ``quick``.
        sensitivity: The calibration audited: ``paper``, ``exact`` or ``both`` (side by side);
            default: what the config says.
        tables: The tables to audit (default: the nine measured tables).
        seed: Seed of the generated data and the canaries' coins (default: fresh, recorded).
            Never the noise, never a truncation key.
        runs: Runs of every table instead of the planned number.
        budget_scale: Multiply every audited table's budgets by this (rows are marked scaled).
        alpha: Family-wise probability of a false VIOLATION or EXCESS (per calibration).
        check_alpha: Family-wise probability that correct code fails a statistical check.
        workers: Processes running each table's runs (default: one per core of the worker).
        keep: Audit folders kept under ``work_root/empirical-audit`` (this one included).
    """
    from phsafe.audit.empirical import AuditSettings, default_workers
    from phsafe.audit.empirical.audit import children_cpu, plan_audit
    from phsafe.config import load_config

    with front_end("flow"):
        audit_id = run_id_for("empirical-audit")
        root = Path(work_root).absolute() / FOLDER
        folder = root / audit_id
        folder.mkdir(parents=True, exist_ok=True)
        configure_once(folder / "phsafe-log.jsonl")
        seed = secrets.randbelow(2**31) if seed is None else seed
        options: dict[str, Any] = {"mode": mode, "seed": seed, "runs": runs, "budget_scale": budget_scale,
                                   "alpha": alpha, "check_alpha": check_alpha, "sensitivity": sensitivity,
                                   "workers": default_workers() if workers is None else workers}
        if tables:
            options["tables"] = tuple(tables)
        if config:
            options["config"] = load_config(config)
        try:
            settings = AuditSettings(**options)
        except ValueError as exc:
            raise PHSafeError(str(exc)) from None
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        (folder / MARKER).write_text(json.dumps({
            "audit": audit_id, "flow_run_id": str(flow_run.id), "started": started, "mode": mode, "seed": seed,
            "sensitivity": [b.value for b in settings.calibrations],
            "config": str(Path(config).absolute()) if config else "production US (built in)",
            "note": "generated data only; its figures are public"}, indent=1) + "\n", encoding="utf-8")
        wall, cpu, children = time.perf_counter(), time.process_time(), children_cpu()
        plan = plan_audit(settings)
        salt = secrets.token_bytes(32)
        audits = [t.audit_one_table(settings, table_plan, salt) for table_plan in plan.tables]
        result = t.conclude_audit(plan, audits, folder, time.perf_counter() - wall,
                                  time.process_time() - cpu + children_cpu() - children, started)
        t.report_artifacts(audit_id, result, folder)
        pruned = _prune(root, keep, folder)
        if pruned:
            log.info("old empirical audits deleted", folders=len(pruned))
        summary = {"audit": audit_id, "folder": str(folder), "verdict": result.verdict, "seed": seed,
                   "rows": {f"{r.table}/{r.level} ({r.sensitivity})": r.verdict for r in result.rows}}
        if result.failed:
            problems = [f"{r.verdict}: {r.table} {r.level}, {r.sensitivity} sensitivities (mu_lb {r.mu_lb}, "
                        f"mu_declared {r.mu_declared})"
                        for r in result.rows if r.verdict in ("VIOLATION", "EXCESS")]
            problems += [f"failed check {c.name} ({c.table} {c.level}): {c.detail}"
                         for c in result.checks if c.status == "FAIL"]
            raise PHSafeError(f"empirical audit {audit_id}: {result.verdict}\n  " + "\n  ".join(problems[:20]))
        log.info("empirical audit passed", audit=audit_id, verdict=result.verdict, rows=len(result.rows))
        return summary
