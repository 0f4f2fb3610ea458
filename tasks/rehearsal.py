"""Prefect tasks of the weekly rehearsal: synthetic inputs, a throwaway signing key, the auditors'
check of its releases, the accuracy experiment, its verdict.

Thin wrappers over :mod:`phsafe.synthetic`, :mod:`phsafe.signing`, :mod:`phsafe.audit.verify`,
:mod:`phsafe.accuracy` and :mod:`phsafe.rehearsal`.
Everything here runs on synthetic data declared non-confidential; the rules of the production
tasks hold all the same: no task caches or persists its result (a cached result could replay
noise, a persisted one would write data outside the enclave), and a task that draws noise (the
accuracy experiment, 2·K private runs) is never retried by Prefect -- a retried draw would be a
new spend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from prefect.logging import get_run_logger

from phsafe.config import load_config
from phsafe.rehearsal import CoverageVerdict, verdict_from_report

_NOTHING_KEPT = {"cache_policy": NONE, "persist_result": False}


@task(name="synthesize-inputs", task_run_name="synthesize-{label}-inputs", **_NOTHING_KEPT, retries=0)
def synthesize_inputs(label: str, config: Path, directory: Path, persons: int, fmt: str,
                      seed: int | None) -> dict[str, Any]:
    """Fresh synthetic persons, units and geo for the states of ``config`` (``phsafe synth``)."""
    from phsafe.synthetic import synthesize

    states = list(load_config(config).states)
    result = synthesize(directory, persons, states, fmt=fmt, seed=seed)  # type: ignore[arg-type]
    return {"data": str(directory), "persons": result.n_persons, "units": result.n_units,
            "states": len(states), "seed": result.seed, "format": fmt, "seconds": round(result.seconds, 1)}


@task(name="make-signing-key", task_run_name="make-throwaway-signing-key", **_NOTHING_KEPT, retries=0)
def make_signing_key(folder: Path) -> dict[str, str]:
    """A throwaway Ed25519 pair (``phsafe keys generate``) that signs this rehearsal's releases,
    so that the signing path production uses is rehearsed too. Deleted with the rehearsal."""
    from phsafe.signing import generate_signing_key

    pair = generate_signing_key(folder)
    return {"signing_key": str(pair.private_key), "public_key": str(pair.public_key),
            "fingerprint": pair.fingerprint}


@task(name="verify-release", task_run_name="verify-{label}-release", **_NOTHING_KEPT, retries=0)
def verify_release(label: str, ledger: Path, outputs: Path, public_key: Path) -> list[str]:
    """What an auditor runs: ``phsafe audit verify LEDGER --outputs DIR --public-key KEY`` -- the
    ledger's chain and rules, the release's tables and manifest against it, and the checkpoint's
    signature against the given public key. Fails naming the first thing that does not hold."""
    from phsafe.audit.verify import verify
    from phsafe.errors import PHSafeError

    result = verify(ledger, outputs=outputs, public_key=public_key)
    if result.actions:  # `phsafe audit verify` exits 3: never a pass
        raise PHSafeError("it holds, but the operator must act: " + "; ".join(result.actions))
    return result.notes


@task(name="measure-accuracy", task_run_name="measure-{label}-accuracy", **_NOTHING_KEPT, retries=0)
def measure_accuracy(label: str, config: Path, data: Path, directory: Path, trials: int,
                     with_postprocess: bool) -> dict[str, Any]:
    """``phsafe accuracy CONFIG DATA OUT --non-confidential --trials K``: K private runs at the
    config's budgets against the truth, each with its own throwaway ledger; report and plots."""
    from phsafe.accuracy import run_accuracy
    from phsafe.progress import PlainProgress

    # One line per finished stage of the experiment in the run log (its 2K runs' events go to
    # the JSON-lines file only). The comparison with the Census Bureau's production method is an
    # analysis (``phsafe accuracy``), not a health check: the weekly run skips its sampler.
    result = run_accuracy(config, data, directory, trials=trials, non_confidential=True,
                          with_postprocess=with_postprocess, plots=True, compare_production=False,
                          progress=PlainProgress(write=get_run_logger().info))
    metrics = result.metrics
    return {
        "report": str(directory / "report.html"),
        "plots": sorted(str(p) for p in (directory / "plots").glob("*.png")),
        "errors": metrics[["TABLE", "LEVEL", "MEAN_MOE", "MAE", "P90_ABS_ERROR", "TRUNCATION_MAE"]]
        .to_dict(orient="records"),
        "seconds": round(result.seconds, 1),
    }


@task(name="check-coverage", task_run_name="check-{label}-coverage", **_NOTHING_KEPT, retries=0)
def check_coverage(label: str, directory: Path, alpha: float) -> CoverageVerdict:
    """MOE coverage per table × level against its binomial tolerance (:mod:`phsafe.rehearsal`)."""
    return verdict_from_report(directory, alpha=alpha)
