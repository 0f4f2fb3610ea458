"""The Python API: one function per thing a user does, with keyword arguments and plain types.

Exported from :mod:`phsafe` (``import phsafe; phsafe.run_private(...)``); the command line is a
thin layer over the same functions. Paths may be strings or :class:`pathlib.Path`; budgets may
be strings, Decimals, Fractions or ints (never floats: budgets are exact).

* :func:`validate` -- the config and the inputs against the suites; spends nothing.
* :func:`init_ledger` -- create an audit ledger with its policy (once, before any data is seen).
* :func:`run_private` -- the private run: checks, spends (recorded), publishes the release.
* :func:`run_nonprivate` -- exact ground-truth tables, for synthetic data only.
* :func:`verify_ledger` -- the auditor's check of a ledger (and a release against it).
* :func:`read_release` / :func:`read_tables` -- a release as pandas DataFrames, labelled.
* :func:`read_estimates` -- the estimates of ``phsafe postprocess`` as DataFrames, labelled the same
  way.
* :func:`plan` -- budgets from MOE targets, or the MOEs of a config.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from phsafe.errors import PHSafeError

if TYPE_CHECKING:
    import pandas as pd

    from phsafe.audit.verify import VerifyResult
    from phsafe.engine import RunResult
    from phsafe.ledger import Ledger
    from phsafe.progress import Progress
    from phsafe.validation import ValidationReport

Amount = str | int | Decimal | Fraction


def _exact(value: Amount | None, what: str) -> Fraction | None:
    """An exact budget from a string, int, Decimal or Fraction (a float is refused: inexact)."""
    if value is None:
        return None
    if isinstance(value, float):
        raise PHSafeError(f"{what}: give budgets exactly (a string, Decimal or Fraction), not a float")
    try:
        amount = Fraction(Decimal(value)) if isinstance(value, (str, Decimal)) else Fraction(value)
    except (ArithmeticError, ValueError, TypeError):
        raise PHSafeError(f"{what}: {value!r} is not a number") from None
    if amount < 0:
        raise PHSafeError(f"{what}: must be non-negative")
    return amount


def validate(config: str | Path, data: str | Path, *, report_dir: str | Path | None = None,
             progress: "Progress | None" = None) -> "ValidationReport":
    """Validate ``config`` and the persons, units and geo files in ``data``; spends nothing.

    Args:
        config: The run's ``config.json``.
        data: Folder with the persons, units and geo inputs (CSV, Parquet, or Parquet stored by state).
        report_dir: A new folder for the HTML and JSON reports.
        progress: Where to show progress (:mod:`phsafe.progress`): a bar of the input files read.

    Returns:
        The report: ``.ok``, ``.failures`` (file, columns, rule, failing rows -- never a value),
        ``.to_text()``; with ``report_dir``, HTML and JSON reports are written there.
    """
    from phsafe.intake import validate_inputs

    return validate_inputs(Path(config), Path(data), report_dir=Path(report_dir) if report_dir else None,
                           progress=progress)


def init_ledger(
    path: str | Path,
    *,
    lifetime_cap: Amount,
    reason: str,
    privacy_defn: str = "zcdp",
    non_confidential: bool = False,
    witnesses: tuple[tuple[str, str], ...] = (),
    witness_quorum: int | None = None,
    log_name: str | None = None,
    datasets: tuple[str, ...] = (),
) -> "Ledger":
    """Create an audit ledger, its lineage key (``<path>.key``) and its public privacy-loss log
    (``<path>.public-log/``, signed with ``<path>.log.key``) with its policy.

    Args:
        path: The ledger file (must not exist).
        lifetime_cap: Every dataset's lifetime cap, rho for ``zcdp`` (epsilon for ``puredp``).
        reason: Why this policy (recorded).
        privacy_defn: ``"zcdp"`` or ``"puredp"``: the unit of caps and charges.
        non_confidential: A throwaway ledger for synthetic data.
        witnesses: ``(URL, verifier key)`` of each witness service (``phsafe witness serve``) whose
            cosignature every run needs before it spends; their keys and the quorum are bound into
            the ledger's first entry.
        witness_quorum: How many of them must cosign (default: all).
        log_name: The public log's name (default ``phsafe.privacy-loss/<ledger id>``).
        datasets: The datasets the ledger accounts (it refuses runs of others); its witnesses
            witness a new log only once its policy names them (``docs/public_log.md``).
    """
    from phsafe.config import PrivacyDefinition
    from phsafe.engine import code_version
    from phsafe.publog import create_ledger

    cap = _exact(lifetime_cap, "lifetime_cap")
    assert cap is not None
    return create_ledger(Path(path), lifetime_cap=cap, reason=reason, privacy_defn=PrivacyDefinition(privacy_defn),
                         non_confidential=non_confidential, code_version=code_version(),
                         witnesses=tuple(witnesses), witness_quorum=witness_quorum, log_name=log_name,
                         datasets=tuple(datasets))


def run_private(
    config: str | Path,
    data: str | Path,
    out: str | Path,
    *,
    ledger: str | Path | None = None,
    dataset: str | None = None,
    new_version: str | None = None,
    re_release: str | None = None,
    overlap_reason: str | None = None,
    signing_key: str | Path | None = None,
    public_key: str | Path | None = None,
    validate: bool = True,
    validate_private_output: bool = False,
    lifetime_cap: Amount | None = None,
    cap_reason: str | None = None,
    resume: str | None = None,
    resume_reason: str | None = None,
    non_confidential: bool = False,
    work_dir: str | Path | None = None,
    truncation_key: str | None = None,
    memory_limit: str | int | None = None,
    progress: "Progress | None" = None,
) -> "RunResult":
    """Run PHSafe privately on ``data`` with ``config`` and publish the eleven tables to ``out``.

    Everything is checked first (config, ledger, keys, paths, space, and -- with ``validate`` --
    the inputs); nothing is spent if anything is wrong. Each measurement is recorded in the
    ledger before its noise is drawn; the release is published, then recorded. The arguments are
    the fields of :class:`phsafe.parameters.PrivateRunParameters` (``phsafe private`` and the
    flows take the same ones), where each is described once.

    Args:
        config, data, out: As ``phsafe private CONFIG DATA OUT``; ``out`` must not exist.
        ledger: The audit ledger (:func:`init_ledger`); for non-confidential data a throwaway
            one is made beside ``out`` when none is given.
        dataset: The dataset the run spends against (default: the config's ``"dataset"``).
        new_version: Why these records are a new content version of the dataset (recorded).
        re_release: Why records that another run of the dataset already released are released
            again (recorded). Without it such a run is refused before any spend: a content
            version is released once, whatever room the lifetime cap leaves.
        overlap_reason: Why records that overlap another dataset's (beyond 1%) are a version of
            this dataset (recorded). Without it such a run is refused before any spend.
        signing_key, public_key: Sign the ledger checkpoints (Ed25519 PEM); the key must match
            the public key if given.
        validate: Run the full input suites first (recorded in the ledger).
        validate_private_output: Validate the tables before publishing them (``-vo/--validate-private-output``).
        lifetime_cap, cap_reason: Raise the dataset's lifetime cap (recorded with the reason).
        resume, resume_reason: Complete the failed run with this id, reusing what it committed.
        non_confidential: The data is synthetic or public.
        work_dir: Folder of the runs' confidential work folders (default: beside the ledger).
        truncation_key: Replay a run with this truncation key (hex) -- non-confidential data only.
        memory_limit: Memory the input pass may use (bytes, or a size such as ``"8G"``).
        progress: Where to show progress (:mod:`phsafe.progress`).

    Returns:
        The run's id, output folder, released files, plan, stage timings, ledger and work folder.
    """
    arguments = dict(locals())  # first: exactly the arguments, each named as the parameters' InPython says
    del arguments["progress"]
    arguments["lifetime_cap"] = _exact(lifetime_cap, "lifetime_cap")
    from phsafe.parameters import PrivateRunParameters
    from phsafe.sequence import InProcess, run_release

    return run_release(PrivateRunParameters.from_python(arguments), runner=InProcess(progress))


def run_nonprivate(
    config: str | Path,
    data: str | Path,
    out: str | Path,
    *,
    non_confidential: bool,
    validate: bool = False,
    progress: "Progress | None" = None,
) -> "RunResult":
    """Exact ground-truth tables (no truncation, no noise) -- for synthetic data only.

    Args:
        non_confidential: Must be True: declares the data synthetic or public.
    """
    from phsafe.engine import run_nonprivate as run

    return run(Path(config), Path(data), Path(out), non_confidential=non_confidential, validate=validate,
               progress=progress)


def verify_ledger(
    ledger: str | Path,
    *,
    outputs: str | Path | None = None,
    public_key: str | Path | None = None,
    checkpoints: tuple[str | Path, ...] = (),
) -> "VerifyResult":
    """The auditor's check (``phsafe audit verify``): the ledger's chain and rules, and optionally
    checkpoints and a release against it.

    Returns:
        What was verified (``.notes``) and what the operator must do (``.actions``: an interrupted
        write or repair to finish, a finished run's leftovers, ... each naming its command; the
        command exits 3 when there are any). Nothing needs doing when ``.actions`` is empty.

    Raises:
        phsafe.audit.verify.VerificationFailure: naming the first failing entry or file.
    """
    from phsafe.audit.verify import verify

    return verify(Path(ledger), outputs=Path(outputs) if outputs else None,
                  public_key=Path(public_key) if public_key else None,
                  checkpoints=tuple(Path(c) for c in checkpoints))


def read_estimates(directory: str | Path, *, files: str = "census", labels: bool = True,
                   verify: bool = True) -> dict[str, "pd.DataFrame"]:
    """Read the estimates ``phsafe postprocess`` wrote: table -> typed, labelled frame.

    Labelled like :func:`read_release`: the code columns keep their codes as ordered categoricals
    (the nation, then the states by FIPS code; ``*``, ``A`` ... ``I``; cells as integers) and,
    with ``labels=True``, each is followed by ``<COLUMN>_LABEL`` ("Alabama", "Asian alone",
    "Own child: in married couple family").

    Args:
        directory: The post-processing folder (``OUT-postprocessed``).
        files: ``"census"`` -- the Census Bureau's estimate files, one frame per table PH1 ... PH8
            with every level (nation, state) in one frame, in file order: ``GEOID`` (``1`` the
            nation, the states' 2-digit FIPS codes), ``REGION_TYPE``, ``ITERATION_CODE``,
            ``DATA_CELL``, then the files' columns; the count tables' ``PRED``, ``PRED_LO`` and
            ``PRED_HI`` as integers (``Int64``; the files may write 100000 as ``1e+05``).
            ``"ours"`` -- our own tables (``PH1_num`` ... ``PH8_denom`` with every released and
            marginal cell's posterior summaries, and the averages ``PH1``, ``PH5``, ``PH8``).
        labels: Add the ``<COLUMN>_LABEL`` columns.
        verify: Check the SHA-256 of every file read against ``postprocess.json``.

    Raises:
        phsafe.release.ReleaseError: Not a post-processing folder, or a file differs from its
            recorded digest.
    """
    from phsafe.postprocess.reading import read_estimates as read

    return read(Path(directory), files=files, labels=labels, verify=verify)


def audit_public(
    out: str | Path,
    *,
    key: str | Path,
    log: str | Path | None = None,
    witness_keys: tuple[str | Path, ...] = (),
    witness_quorum: int | None = None,
    state_file: str | Path | None = None,
    no_witness: bool = False,
) -> list[str]:
    """The outsider's check (``phsafe audit public``), with public files only: the release's
    proof, manifest and table digests and VARIANCE columns against the public log; with ``log``,
    the whole log, its consistency with the checkpoint seen before (``state_file``) and each
    dataset's privacy-loss statement. The witnesses' keys are required unless ``no_witness``.
    Returns what was verified, one line each.

    Raises:
        phsafe.audit.verify.VerificationFailure: The first check that fails.
    """
    from phsafe.audit.public import audit_public as check

    return check(Path(out), Path(key), log=Path(log) if log else None,
                 witness_keys=tuple(Path(w) for w in witness_keys), quorum=witness_quorum,
                 state_file=Path(state_file) if state_file else None, no_witness=no_witness)
