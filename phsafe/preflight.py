"""Preflight: everything a private run needs later, checked before the first spend.

The ledger (its file, lock, lineage key, policy and kind, and the dataset's cap for this plan),
the signing key, the output folder (new, its parent writable with room for the release), the run's
work folder -- and, for a resumed run, that the run and its work folder exist. A refusal is one
line saying what to do; nothing is spent (spec: "check before you spend").
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from phsafe import durable
from phsafe.accounting import RunPlan
from phsafe.config import INFINITE, PHSafeConfig
from phsafe.intake import SPILL_FOLDER, check_pass_memory
from phsafe.errors import BudgetError, LedgerError, OutputExistsError, PHSafeError, os_reason
from phsafe.parameters import option
from phsafe.logs import get_logger
from phsafe.outputs import MANIFEST
from phsafe.private_run import PrivateRun, open_ledger
from phsafe.tables import DERIVED_TABLES
from phsafe.truncation import TRUNCATION_KEY_BYTES

log = get_logger("phsafe.engine")

_MIN_LEDGER_FREE = 1 << 20  # bytes the ledger's file system must have free before a run starts
_NAME_MAX = 255


def _probe_folder(folder: Path, what: str) -> None:
    """Create, write, fsync, rename and remove a probe in ``folder``: proves it usable."""
    probe = folder / f".phsafe-probe-{uuid.uuid4().hex[:12]}"
    try:
        probe.mkdir()
        try:
            durable.create(probe / "probe", b"phsafe\n")  # written and synced, as a run writes
            (probe / "probe").rename(probe / "renamed")
            durable.fsync_folder(probe)
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    except OSError as exc:
        raise PHSafeError(f"{what} {folder} cannot be written: {os_reason(exc)}") from None


def _check_public_log_writable(ledger: Path) -> None:
    """The public log's folder and files can be written, with room for every spend's entry: a
    run whose log cannot follow its ledger stops at its next spend (and records its failure)."""
    import errno

    from phsafe.publog import log_path
    from phsafe.publog.log import unwritable
    from phsafe.tlog.layout import CHECKPOINT_FILE, ENTRIES_FILE, HASHES_FILE

    folder = log_path(ledger)
    if not folder.is_dir():
        return  # a ledger without a public log (first format): nothing to write
    for path in (folder, folder / ENTRIES_FILE, folder / HASHES_FILE, folder / CHECKPOINT_FILE):
        if path.exists() and not os.access(path, os.W_OK):
            read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
            raise unwritable(folder, OSError(errno.EROFS if read_only else errno.EACCES, ""))
    if _free_bytes(folder) < _MIN_LEDGER_FREE:
        raise unwritable(folder, OSError(errno.ENOSPC, ""))


def _free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def estimated_release_bytes(plan: RunPlan) -> int:
    """A generous estimate of a release's size: every cell of every table (derived tables
    included) as a CSV row and a Parquet row, plus the manifest and data package."""
    cells = sum(m.n_cells for m in plan.measurements)
    derived = sum(m.n_cells for m in plan.measurements if m.table in {d.source for d in DERIVED_TABLES.values()})
    return (cells + derived) * 96 + (1 << 20)


def _check_output_dir(run: PrivateRun, needed: int) -> None:
    out = run.output_dir
    other = f"choose another output folder ({option('output')})"
    if len(out.name.encode()) + len(f"..partial-{run.run_id}".encode()) > _NAME_MAX:
        raise PHSafeError(f"the output folder's name is too long ({len(out.name.encode())} bytes; with the "
                          f"staging suffix a name must fit in {_NAME_MAX} bytes): {other}")
    parent = out.parent
    if not parent.exists():
        raise PHSafeError(f"the output folder's parent {parent} does not exist: create it, or {other}")
    if not parent.is_dir():
        raise PHSafeError(f"the output folder's parent {parent} is not a folder: {other}")
    _probe_folder(parent, "the output folder's parent")
    free = _free_bytes(parent)
    if free < needed:
        raise PHSafeError(f"the output folder's file system has {free >> 20} MiB free; the release needs about "
                          f"{needed >> 20} MiB: free space, or {other}")


def existing_release_of(run: PrivateRun) -> bool:
    """Whether ``output_dir`` already holds this very run's release (a publish whose ledger
    record was interrupted): then a resume only records it."""
    manifest = run.output_dir / MANIFEST
    try:
        return json.loads(manifest.read_text(encoding="utf-8")).get("run_id") == run.run_id
    except (OSError, ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class Preflight:
    """What the preflight established.

    Attributes:
        run: The run, with its truncation key (fresh, or the recorded one for a resume).
        created_ledger: A throwaway ledger was created for this non-confidential run.
        republish: ``output_dir`` already holds this run's release; only the ledger record of
            the publication is missing.
    """

    run: PrivateRun
    created_ledger: bool = False
    republish: bool = False


def preflight(run: PrivateRun, config: PHSafeConfig, plan: RunPlan) -> Preflight:
    """Check everything the run will need later, before any budget is spent.

    The ledger (a regular file this process can append to and fsync, its lock file, its lineage
    key, its policy and kind, its public log's key and -- when it has witnesses -- their
    cosignature of its public log as it is now), the dataset's lifetime cap for this plan (checked again, under the
    lock, when the run starts), the signing key (loads, is Ed25519, matches ``public_key``), the
    output folder (does not exist; its parent is a writable folder with room for the release; the
    staging name fits), and the run's work folder (created and fsynced; for a resume, the run and
    its work folder exist). A non-confidential run without a ledger gets a throwaway one here.

    Raises:
        PHSafeError: One clear line saying what is wrong and what to do. Nothing is spent.
    """
    from phsafe.amounts import add_amounts, amount_exceeds, format_exact
    from phsafe.ledger import RunStatus, check_ledger_file, check_ledger_kind, key_path, load_signing_key, plan_charge
    from phsafe.publog import create_ledger
    from phsafe.ledger.format import operator_text
    from phsafe.ledger.store import check_private, make_private_folders, repair_record_path

    parameters = run.parameters
    for name in ("new_version", "re_release", "cap_reason", "resume_reason", "overlap_reason"):
        operator_text(getattr(parameters, name), option(name))  # a reason too long is refused now, not cut later
    created = False
    if parameters.non_confidential and not run.ledger.exists() and not os.path.islink(run.ledger):
        create_ledger(run.ledger, lifetime_cap=INFINITE, reason="throwaway ledger of a non-confidential run",
                      privacy_defn=config.privacy_defn, non_confidential=True, code_version=run.code_version)
        log.info("created a throwaway ledger for non-confidential data", ledger=str(run.ledger))
        created = True
    check_ledger_file(run.ledger)
    check_private(run.ledger, "the ledger")
    check_private(key_path(run.ledger), "the ledger's lineage key")
    if repair_record_path(run.ledger).exists():  # the ledger takes no entry until its repair is finished
        raise LedgerError(f"a repair of the ledger {run.ledger} is not finished (its record "
                          f"{repair_record_path(run.ledger)} is there): run `phsafe ledger repair {run.ledger}`, "
                          "then run again")
    ledger = open_ledger(run.ledger)  # with its public log: a missing log, log key or witness list refuses here
    ledger.lineage_key()  # the key file is there and is the ledger's; a first-format ledger refuses
    state = ledger.state
    assert state.policy is not None
    check_ledger_kind(state.policy, parameters.non_confidential)
    if state.awaits_log_binding:
        raise LedgerError(f"the ledger {run.ledger} was made before ledgers were bound to their public log: bind its "
                          f"log to it with `phsafe ledger migrate {run.ledger}` (recorded), then run again")
    refusal = state.dataset_refusal(run.dataset)  # the policy declares it, and it was not retired
    if refusal is not None:
        raise LedgerError(f"refused: {refusal} (ledger {run.ledger}) -- nothing was spent")
    with ledger.locked():
        # The witnesses' quorum cosigns the public log as it is now: a copied or rolled-back
        # ledger, or witnesses that cannot be reached, are refused here, before the inputs are read.
        ledger.confirm()
    if _free_bytes(run.ledger.parent) < _MIN_LEDGER_FREE:
        raise PHSafeError("the ledger's file system has less than 1 MiB free: free space before running "
                          "(the ledger must be able to record every spend)")
    _check_public_log_writable(run.ledger)
    if parameters.signing_key is not None:
        load_signing_key(parameters.signing_key, parameters.public_key)
    elif parameters.public_key is not None:
        raise PHSafeError(f"{option('public_key')} is given without {option('signing_key')}: nothing would be signed")

    key = run.truncation_key
    republish = False
    if run.resume:
        earlier = ledger.run(run.run_id)
        if earlier is None:
            raise PHSafeError(f"{option('resume_run_id')} names run {run.run_id}, which is not in the ledger {run.ledger}; "
                              "nothing to resume")
        if earlier.status is RunStatus.FINISHED:
            raise PHSafeError(f"run {run.run_id} finished and published to {earlier.output_path}; a finished "
                              "run is never resumed")
        if earlier.config_digest != run.config_sha256:
            raise PHSafeError(f"run {run.run_id} was started with a different config; it can only be resumed "
                              "with the same one")
        if earlier.dataset != run.dataset:
            raise PHSafeError(f"run {run.run_id} was started as dataset {earlier.dataset!r}, not {run.dataset!r}")
        key = bytes.fromhex(earlier.truncation_key)
        if parameters.truncation_key is not None and parameters.truncation_key.lower() != earlier.truncation_key:
            raise PHSafeError(f"{option('truncation_key')} differs from the key run {run.run_id} recorded")
        republish = run.output_dir.exists() and existing_release_of(run)
        if not run.run_dir.is_dir():
            log.warning("the run's work folder is missing: its committed measurements cannot be reused, and "
                        "every measurement would be spent again", run_dir=str(run.run_dir))
    else:
        if parameters.truncation_key is not None:
            key = bytes.fromhex(parameters.truncation_key)
        else:
            key = secrets.token_bytes(TRUNCATION_KEY_BYTES)
        if run.run_dir.exists():
            raise PHSafeError(f"the work folder {run.run_dir} exists: run {run.run_id} was started before; "
                              f"resume it ({option('resume_run_id')})")
    if run.output_dir.exists() and not republish:
        raise OutputExistsError(f"the output folder {run.output_dir} already exists; a release is never "
                                f"overwritten: choose a new output folder ({option('output')})")
    needed = estimated_release_bytes(plan)
    if not republish:
        _check_output_dir(run, needed)
    try:
        make_private_folders(run.run_dir)  # confidential: its measurements, reports and staging
    except OSError as exc:
        raise PHSafeError(f"cannot create the run's work folder {run.run_dir}: {os_reason(exc)} "
                          f"(choose another with {option('work_dir')})") from None
    _probe_folder(run.run_dir, "the run's work folder")
    if _free_bytes(run.run_dir) < 2 * needed:
        raise PHSafeError(f"the work folder's file system has {_free_bytes(run.run_dir) >> 20} MiB free; the run "
                          f"needs about {2 * needed >> 20} MiB for its measurements and release")
    # The inputs can be read within the memory limit (spilled to the work folder if need be).
    check_pass_memory(run.data_dir, config.states, memory_limit=parameters.memory_limit,
                      validate=parameters.validate_inputs, spill_dir=run.run_dir / SPILL_FOLDER)

    # A dataset's first release needs its records declared as its first content version: say so
    # now, not after hours of reading (whether later records match a declared version is known
    # only once they are read; the ledger checks it when the run starts).
    if not parameters.non_confidential and not run.resume and not (parameters.new_version or "").strip():
        known = state.dataset_states.get(run.dataset)
        if known is None or not known.versions:
            raise BudgetError(
                f"dataset {run.dataset!r} has no declared content version in the ledger {run.ledger} yet: "
                f"its first run says why these records are its first version with {option('new_version')} "
                "(recorded in the ledger)"
            )

    # The dataset's cap, before hours of reading: the authoritative check is repeated under the
    # ledger's lock when the run starts (or resumes).
    if not parameters.non_confidential and not run.resume:
        cap = state.dataset_cap(run.dataset)
        if parameters.lifetime_cap is not None:
            cap = parameters.lifetime_cap
        spent = state.dataset_spent(run.dataset, state.policy.privacy_defn)
        planned = plan_charge(plan, state.policy.privacy_defn)
        need = add_amounts(spent, planned)
        if amount_exceeds(need, cap):
            raise BudgetError(
                f"privacy-loss budget refused for dataset {run.dataset!r}: already spent {format_exact(spent)}, "
                f"this run plans {format_exact(planned)}, lifetime cap {format_exact(cap)}; spent + planned "
                f"= {format_exact(need)} exceeds the cap. Spends are never refunded. To run anyway, raise the "
                f"cap to at least {format_exact(need)} with {option('lifetime_cap')} and say why with "
                f"{option('cap_reason')} (both are recorded in the ledger)."
            )
    if parameters.lifetime_cap is not None and not (parameters.cap_reason or "").strip():
        raise BudgetError(f"{option('lifetime_cap')} raises the dataset's cap: say why with {option('cap_reason')} "
                          "(it is recorded in the ledger)")
    return Preflight(replace(run, truncation_key=key), created_ledger=created, republish=republish)
