"""The weekly rehearsal: the production code path on fresh synthetic inputs, and its accuracy.

A health check that never touches confidential data or a production ledger::

    synthesize-us-inputs, synthesize-pr-inputs     (phsafe synth: the configs' states, fresh seed)
      ─► make-throwaway-signing-key                 (phsafe keys generate, in the rehearsal's folder)
      ─► sdhc-us, sdhc-pr subflows                 (the production flows, production budgets,
                                                    non-confidential, throwaway ledgers, signed)
      ─► verify-us-release, verify-pr-release       (phsafe audit verify --outputs --public-key)
      ─► measure-us-accuracy, measure-pr-accuracy   (phsafe accuracy: K private runs vs the truth)
      ─► check-us-coverage, check-pr-coverage       (MOE coverage vs its binomial tolerance)
      ─► artifacts: rehearsal-moe-coverage, rehearsal-accuracy-errors (tables),
                    rehearsal-accuracy-report (runs, verification and the plots, in the UI)

It ends Failed when a production flow fails on the synthetic inputs, when a release does not
verify as the auditors check it, or when the coverage of the stated 90% MOE of any table × level
falls outside its binomial tolerance (:mod:`phsafe.rehearsal`): a correct pipeline fails with
probability ``alpha`` at most.

Everything of one rehearsal is under ``<work_root>/<rehearsal id>/`` (inputs, keys, runs,
ledgers, accuracy, log); the ``keep`` most recent rehearsal folders are kept, older ones deleted (they
hold synthetic data only, and are recognized by their ``rehearsal.json``).
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from flows._ended import END_HOOKS
from flows._logging import configure_once, events_to_file_only
from flows.sdhc import PositiveCount, flow_run_name, pr_flow, run_id_for, us_flow
from phsafe.errors import PHSafeError
from phsafe.parameters import front_end
from phsafe.rehearsal import DEFAULT_ALPHA
from tasks import artifacts
from tasks import rehearsal as t

log = structlog.get_logger("flows.rehearsal")

MARKER = "rehearsal.json"
InputFormat = Literal["csv", "parquet", "parquet-partitioned"]


def _started(folder: Path) -> str:
    try:
        return str(json.loads((folder / MARKER).read_text(encoding="utf-8")).get("started", ""))
    except (OSError, ValueError, AttributeError):
        return ""  # an unreadable marker: the oldest


def _prune(work_root: Path, keep: int, current: Path) -> list[str]:
    """Delete all but the ``keep`` most recent rehearsal folders (never the current one)."""
    folders = sorted((p for p in work_root.iterdir() if p.is_dir() and (p / MARKER).is_file() and p != current),
                     key=_started)
    doomed = folders[:max(len(folders) - (keep - 1), 0)]
    for folder in doomed:
        shutil.rmtree(folder)
    return [p.name for p in doomed]


@flow(name="sdhc-rehearsal", flow_run_name=flow_run_name("rehearsal"), retries=0, validate_parameters=True,
      **END_HOOKS)
def rehearsal_flow(
    us_config: str,
    pr_config: str,
    work_root: str,
    persons: PositiveCount = 300_000,
    pr_persons: PositiveCount = 30_000,
    trials: Annotated[int, Field(ge=1, le=200)] = 10,
    alpha: Annotated[float, Field(gt=0, lt=1)] = DEFAULT_ALPHA,
    input_format: InputFormat = "csv",
    postprocess: bool = False,
    keep: Annotated[int, Field(ge=1)] = 8,
    seed: int | None = None,
) -> dict[str, Any]:
    """Weekly rehearsal of the US and Puerto Rico runs on fresh synthetic inputs, with accuracy.

    Args:
        us_config: The production US config (its budgets and states are rehearsed).
        pr_config: The production Puerto Rico config.
        work_root: Each rehearsal writes ``<work_root>/<rehearsal id>/``.
        persons: Synthetic persons of the US dataset, shared out over the config's states.
        pr_persons: Synthetic persons of Puerto Rico.
        trials: Private runs of the accuracy experiment per dataset (K).
        alpha: Probability that a correct pipeline fails a rehearsal (binomial tolerance).
        input_format: Format of the synthetic inputs: as production stores its inputs.
        postprocess: Also measure the coverage of the post-processed credible intervals.
        keep: Rehearsal folders kept under ``work_root`` (this one included).
        seed: Seed of the synthetic data (default: fresh each week; recorded). Never used for noise.
    """
    with front_end("flow"):
        rehearsal_id = run_id_for("rehearsal")
        root = Path(work_root).absolute()
        folder = root / rehearsal_id
        folder.mkdir(parents=True, exist_ok=True)
        configure_once(folder / "phsafe-log.jsonl")
        (folder / MARKER).write_text(json.dumps({
            "rehearsal": rehearsal_id, "flow_run_id": str(flow_run.id),
            "started": datetime.now(timezone.utc).isoformat(),
            "us_config": str(Path(us_config).absolute()), "pr_config": str(Path(pr_config).absolute()),
            "persons": persons, "pr_persons": pr_persons, "trials": trials, "alpha": alpha,
            "note": "synthetic data declared non-confidential; deleted when older than the last rehearsals kept",
        }, indent=1) + "\n", encoding="utf-8")
        datasets = {"us": (Path(us_config), persons, us_flow), "pr": (Path(pr_config), pr_persons, pr_flow)}

        inputs = {label: t.synthesize_inputs(label, config, folder / "inputs" / label, size, input_format,
                                             None if seed is None else seed + i)
                  for i, (label, (config, size, _)) in enumerate(datasets.items())}
        # Signed as production signs, with a key of its own (never the production key).
        keys = t.make_signing_key(folder / "keys")
        states = {}
        for label, (config, _, dataset_flow) in datasets.items():
            states[label] = dataset_flow.with_options(flow_run_name=flow_run_name(f"rehearsal-{label}"))(
                config=str(config), data=inputs[label]["data"], output_root=str(folder / "runs"),
                ledger=str(folder / "ledgers" / f"{label}.jsonl"), non_confidential=True,
                signing_key=keys["signing_key"], public_key=keys["public_key"],
                validate=True, validate_private_output=True, log_file=str(folder / "phsafe-log.jsonl"),
                return_state=True)
        runs = {label: ("Completed, run " + s.result()["run_id"]) if s.is_completed()
                else f"{s.type.value.title()}: {s.message}" for label, s in states.items()}
        published = {label: s.result() for label, s in states.items() if s.is_completed()}
        checks = {label: t.verify_release(label, Path(r["ledger"]), Path(r["outputs"]), Path(keys["public_key"]),
                                          return_state=True)
                  for label, r in published.items()}
        verified = {label: c.result() if c.is_completed() else None for label, c in checks.items()}
        completed = [label for label in published if verified[label] is not None]

        with events_to_file_only():  # 2·K runs per dataset: the task logs one line a step instead
            accuracy = {label: t.measure_accuracy(label, datasets[label][0], Path(inputs[label]["data"]),
                                                  folder / "accuracy" / label, trials, postprocess)
                        for label in completed}
        verdicts = {label: t.check_coverage(label, folder / "accuracy" / label, alpha) for label in completed}
        if verdicts:
            artifacts.rehearsal_coverage(rehearsal_id, verdicts, alpha)
            artifacts.rehearsal_errors(rehearsal_id, {label: a["errors"] for label, a in accuracy.items()})
        verification = {label: (f"verified with the throwaway public key {keys['fingerprint'][:16]}"
                                if verified[label] is not None else f"DOES NOT VERIFY: {checks[label].message}")
                        for label in published}
        artifacts.rehearsal_report(rehearsal_id, folder, inputs, runs, verification, accuracy)
        pruned = _prune(root, keep, folder)
        if pruned:
            log.info("old rehearsals deleted", folders=len(pruned))

        problems = [f"{label}: the production flow ended {runs[label]}" for label in states if label not in published]
        problems += [f"{label}: its release does not verify as the auditors check it "
                     f"(phsafe audit verify --outputs --public-key): {checks[label].message}"
                     for label in published if verified[label] is None]
        for label, verdict in verdicts.items():
            for r in verdict.outside.to_dict(orient="records"):
                problems.append(
                    f"{label} {r['TABLE']} {r['LEVEL']}: MOE coverage {r['COVERAGE']:.4f} outside its binomial "
                    f"tolerance [{r['TOLERANCE_LOW']:.4f}, {r['TOLERANCE_HIGH']:.4f}] "
                    f"(expected {r['EXPECTED']:.4f}, nominal 0.90, {r['N']} cells x trials)")
        if problems:
            raise PHSafeError(f"rehearsal {rehearsal_id} failed:\n  " + "\n  ".join(problems))
        pooled = {label: float(v.rows.iloc[-1]["COVERAGE"]) for label, v in verdicts.items()}
        log.info("rehearsal passed", rehearsal=rehearsal_id,
                 **{f"{label}_pooled_coverage": round(c, 4) for label, c in pooled.items()})
        return {"rehearsal": rehearsal_id, "folder": str(folder), "runs": runs, "verified": verification,
                "pooled_moe_coverage": pooled, "accuracy_reports": {k: a["report"] for k, a in accuracy.items()}}
