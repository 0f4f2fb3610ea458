"""``phsafe ledger``: create, raise, repair, migrate and cosign the privacy-loss ledger, and
clean up after finished runs.

``init`` is the only way a ledger comes to exist: a private run on confidential data refuses a
ledger that is not there. Every command appends an entry that says what was done and why, and
every one works on the ledger with its public log: a ledger whose log, log key or witness list
is missing is refused, with one line naming it.
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import EXISTING_FILE, PATH, handle_errors, parse_amount, start


@click.group()
def ledger() -> None:
    """Create, raise, repair and migrate the privacy-loss ledger."""


@ledger.command("init")
@click.argument("path", type=PATH)
@click.option("--lifetime-cap", required=True, metavar="RHO",
              help="Every dataset's lifetime cap (rho for zCDP, epsilon with --privacy-defn puredp).")
@click.option("--reason", required=True, metavar="TEXT", help="Why this policy (recorded).")
@click.option("--privacy-defn", type=click.Choice(["zcdp", "puredp"]), default="zcdp", show_default=True,
              help="The unit of caps and charges.")
@click.option("--non-confidential", is_flag=True,
              help="A throwaway ledger for synthetic data (caps not enforced; only non-confidential runs).")
@click.option("--log-name", default=None, metavar="NAME",
              help="The public log's name, its checkpoints' origin (default: phsafe.privacy-loss/<ledger id>).")
@click.option("--witness", "witnesses", type=(str, click.Path(exists=True, dir_okay=False, path_type=Path)),
              multiple=True, metavar="URL VKEY",
              help="A witness service (phsafe witness serve, run by another party) and its verifier key file, "
                   "whose cosignature every run needs before it spends; may be repeated.")
@click.option("--witness-quorum", type=click.IntRange(min=1), default=None, metavar="K",
              help="How many of the --witness services must cosign (default: all).")
@click.option("--ledger-cap", default=None, metavar="RHO",
              help="Optional: a cap on all datasets' spends together (never raised).")
@click.option("--dataset", "datasets", multiple=True, metavar="NAME",
              help="A dataset the ledger accounts (repeatable; required with --witness): published in its log's "
                   "policy, which its witnesses read from its registration; runs of any other dataset are refused.")
@handle_errors
def init_command(path: Path, lifetime_cap: str, reason: str, privacy_defn: str, non_confidential: bool,
                 log_name: str | None, witnesses: tuple[tuple[str, Path], ...], witness_quorum: int | None,
                 ledger_cap: str | None, datasets: tuple[str, ...]) -> None:
    """Create the ledger PATH, its lineage key PATH.key and its public log PATH.public-log/,
    bound to the ledger from its first entry (with the witnesses' keys and quorum).

    Set the policy before any data is seen. Keep PATH.key and PATH.log.key (the public log's
    signing key) with the ledger, inside the enclave: they are never published. Publish the
    folder PATH.public-log/ and give auditors its verifier key, log.vkey; give it to each
    witness's operator too (phsafe witness serve --log log.vkey).
    """
    from phsafe.config import PrivacyDefinition

    start(None)
    from phsafe.amounts import format_exact
    from phsafe.engine import code_version
    from phsafe.ledger import key_path
    from phsafe.publog import create_ledger

    if witnesses and not datasets:
        from phsafe.errors import PHSafeError
        from phsafe.publog import WitnessList

        WitnessList.of([(url, _read_key(vkey)) for url, vkey in witnesses], witness_quorum)  # its refusal first
        raise PHSafeError("give the datasets the ledger accounts (--dataset NAME, repeatable): its witnesses witness "
                          "a new log only once its policy names them, and refuse a second log for a dataset")
    made = create_ledger(path, lifetime_cap=parse_amount(lifetime_cap, "--lifetime-cap"), reason=reason,
                         privacy_defn=PrivacyDefinition(privacy_defn), non_confidential=non_confidential,
                         code_version=code_version(), log_name=log_name,
                         witnesses=[(url, _read_key(vkey)) for url, vkey in witnesses],
                         witness_quorum=witness_quorum, ledger_cap=parse_amount(ledger_cap, "--ledger-cap"),
                         datasets=datasets)
    policy = made.state.policy
    assert policy is not None
    unit = "rho" if policy.privacy_defn is PrivacyDefinition.ZCDP else "epsilon"
    kind = "non-confidential (throwaway)" if policy.non_confidential else "confidential"
    click.echo(f"phsafe: created the {kind} ledger {made.path} (id {policy.ledger_id}): every dataset's lifetime "
               f"cap is {unit} {format_exact(policy.lifetime_cap)}"
               + (f"; all datasets together: {format_exact(policy.ledger_cap)}" if policy.ledger_cap is not None else ""))
    click.echo(f"phsafe: its lineage key is {key_path(made.path)} -- keep it with the ledger; never publish it")
    from phsafe.publog import log_key_path, log_path, witnesses_path

    click.echo(f"phsafe: its public privacy-loss log is {log_path(made.path)}/ -- publish this folder; its "
               f"verifier key (give it to auditors) is {log_path(made.path) / 'log.vkey'}")
    click.echo(f"phsafe: the log's signing key is {log_key_path(made.path)} -- keep it with the ledger; never publish it")
    if made.state.declared_datasets is not None:
        click.echo(f"phsafe: it accounts the dataset(s) {', '.join(made.state.declared_datasets)} and no other")
    if witnesses:
        click.echo(f"phsafe: every run needs the cosignature of {witness_quorum or len(witnesses)} of the "
                   f"{len(witnesses)} witnesses listed in {witnesses_path(made.path)} before it spends; give each "
                   f"witness's operator the log's verifier key {log_path(made.path)}/log.vkey and its registration "
                   f"(phsafe ledger registration {made.path} --out FILE), for its logs folder")
    else:
        click.echo("phsafe: no witness: a copy of this ledger could spend the cap again unnoticed until the logs "
                   "are compared (docs/public_log.md, 'Witnesses'); witnesses are bound at init (--witness URL VKEY)")


def _read_key(path: Path) -> str:
    from phsafe.errors import PHSafeError

    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise PHSafeError(f"cannot read the witness key {path}: {exc}") from None


@ledger.command("raise-cap")
@click.argument("path", type=EXISTING_FILE)
@click.option("--dataset", required=True, metavar="NAME", help="The dataset whose cap is raised.")
@click.option("--to", "cap", required=True, metavar="RHO", help="The new lifetime cap (above the current one).")
@click.option("--reason", required=True, metavar="TEXT", help="Why (recorded).")
@handle_errors
def raise_cap_command(path: Path, dataset: str, cap: str, reason: str) -> None:
    """Raise one dataset's lifetime cap (a recorded CAP_RAISED entry; caps are never lowered)."""
    start(None)
    from phsafe.amounts import format_exact
    from phsafe.engine import open_ledger

    amount = parse_amount(cap, "--to")
    entry = open_ledger(path).raise_cap(dataset, amount, reason)
    click.echo(f"phsafe: dataset {dataset}'s lifetime cap is now {format_exact(amount)} (entry {entry['seq']})")


@ledger.command("repair")
@click.argument("path", type=EXISTING_FILE)
@handle_errors
def repair_command(path: Path) -> None:
    """Drop an incomplete last entry (an interrupted write) and record that (TAIL_REPAIRED).

    Safe: noise is drawn only after its spend is complete on disk. Every complete entry must
    verify; anything else is left untouched and reported.
    """
    start(None)
    from phsafe.publog import log_path, open_ledger, public_log_of, repair_ledger

    repair = repair_ledger(path)
    log = public_log_of(open_ledger(path))
    size = log.projected if log is not None else None
    if size is not None:
        click.echo(f"phsafe: the public log {log_path(path)} is in step with the ledger ({size} entries)")
    if repair is None:
        click.echo(f"phsafe: {path} ends in a complete entry and verifies; nothing to repair")
        return
    earlier = "finished the repair an earlier `phsafe ledger repair` began: " if repair.finished_earlier else ""
    click.echo(f"phsafe: {earlier}dropped {repair.dropped_bytes} bytes of an incomplete entry (SHA-256 "
               f"{repair.dropped_sha256[:16]}...), recorded as entry {repair.seq} (TAIL_REPAIRED); runs can resume")


@ledger.command("clean-finished")
@click.argument("path", type=EXISTING_FILE)
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@click.option("--work-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              metavar="DIR", help="Where the runs' work folders are, if the runs were given --work-dir "
                                  "(default: runs/ beside the ledger).")
@handle_errors
def clean_finished_command(path: Path, run_ids: tuple[str, ...], work_dir: Path | None) -> None:
    """Complete what finished runs left undone when stopped at their very end (default: every
    finished run; or the RUNs named).

    Writes a recorded release's missing public log files (privacy-loss.entry and .tlog-proof)
    and removes, durably, what the run's work folder no longer needs: the noisy vectors, the
    staged copy of the release, spill and temporary files. Only runs the ledger says finished;
    the published release, the validation reports and the final checkpoint are never touched.
    `phsafe audit verify` names the runs that need it (exit status 3).
    """
    start(None)
    from phsafe.engine import clean_finished_runs

    done = clean_finished_runs(path, run_ids, work_dir=work_dir)
    for tidied in done:
        if tidied.wrote:
            click.echo(f"phsafe: run {tidied.run_id}: wrote its release's {' and '.join(tidied.wrote)}")
        if tidied.removed:
            click.echo(f"phsafe: run {tidied.run_id}: removed {tidied.removed} from {tidied.run_dir}")
    if not done:
        click.echo(f"phsafe: {'the named runs' if run_ids else 'the finished runs of ' + str(path)} left nothing "
                   "to complete or remove")


@ledger.command("migrate")
@click.argument("path", type=EXISTING_FILE)
@click.option("--lifetime-cap", default=None, metavar="RHO",
              help="First format: every dataset's lifetime cap from now on.")
@click.option("--reason", required=True, metavar="TEXT", help="Why (recorded).")
@click.option("--privacy-defn", type=click.Choice(["zcdp", "puredp"]), default="zcdp", show_default=True)
@click.option("--dataset", default=None, metavar="NAME", help="First format: the name of the ledger's one old dataset.")
@click.option("--map", "mapping", multiple=True, metavar="ID=NAME",
              help="First format: name an old dataset id (8+ hex digits of it); repeat for each.")
@click.option("--witness", "witnesses", type=(str, click.Path(exists=True, dir_okay=False, path_type=Path)),
              multiple=True, metavar="URL VKEY",
              help="Binding a public log: a witness service and its verifier key file; may be repeated.")
@click.option("--witness-quorum", type=click.IntRange(min=1), default=None, metavar="K",
              help="Binding a public log: how many of the --witness services must cosign (default: all).")
@handle_errors
def migrate_command(path: Path, lifetime_cap: str | None, reason: str, privacy_defn: str, dataset: str | None,
                    mapping: tuple[str, ...], witnesses: tuple[tuple[str, Path], ...],
                    witness_quorum: int | None) -> None:
    """Bring a ledger of an earlier format to this one, in place.

    A ledger of the first format gets a policy and dataset names (LEDGER_MIGRATED; give
    --lifetime-cap and --dataset or --map). A ledger made before ledgers were bound to their
    public log gets its log bound (LOG_BOUND), with the witness services given (a ledger that
    listed witnesses must name the services that replace them). Its history stays as it is and
    still verifies.
    """
    from phsafe.config import PrivacyDefinition

    start(None)
    from phsafe.ledger import read_ledger

    if read_ledger(path).awaits_log_binding:
        if lifetime_cap is not None or dataset is not None or mapping:
            raise click.UsageError("this ledger has a policy: only its public log is bound (--witness, --reason)")
        from phsafe.publog import bind_public_log, log_path

        bound = bind_public_log(path, reason=reason, witnesses=[(url, _read_key(vkey)) for url, vkey in witnesses],
                                witness_quorum=witness_quorum)
        binding = bound.state.public_log
        assert binding is not None
        click.echo(f"phsafe: bound the public log {log_path(bound.path)} ({binding['origin']}) to {bound.path} "
                   f"(entry {bound.state.public_log_seq}), with {len(binding['witnesses'])} witness(es), "
                   f"quorum {binding['quorum']}")
        return
    if witnesses or witness_quorum:
        raise click.UsageError("--witness binds a public log; this ledger is of the first format (it has no log)")
    if lifetime_cap is None:
        raise click.UsageError("give --lifetime-cap RHO: the policy of a ledger of the first format")
    if (dataset is None) == (not mapping):
        raise click.UsageError("give --dataset NAME (one old dataset) or --map ID=NAME for each")
    names: dict[str, str] | str = dataset if dataset is not None else {}
    for item in mapping:
        old, sep, name = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not ID=NAME", param_hint="--map")
        names[old.strip()] = name.strip()  # type: ignore[index]
    from phsafe.engine import code_version
    from phsafe.ledger import migrate_ledger

    migrated = migrate_ledger(path, lifetime_cap=parse_amount(lifetime_cap, "--lifetime-cap"), reason=reason,
                              names=names, privacy_defn=PrivacyDefinition(privacy_defn),
                              code_version=code_version())
    click.echo(f"phsafe: migrated {migrated.path}; datasets: "
               + ", ".join(sorted(set(migrated.state.legacy_names.values()))))


@ledger.command("cosign")
@click.argument("path", type=EXISTING_FILE)
@handle_errors
def cosign_command(path: Path) -> None:
    """Ask the witnesses to cosign the public log's checkpoint as it is (nothing is appended).

    Outsiders refuse a checkpoint whose cosignatures are older than a week (phsafe audit public
    --max-age): run this daily (a timer) so that a log without new releases stays fresh. Exits 1
    with one line when fewer witnesses than the quorum cosign.
    """
    start(None)
    from phsafe.publog import cosign_public_log, log_path

    ledger, cosigners = cosign_public_log(path)
    if ledger.state.public_log is None:
        click.echo(f"phsafe: {path} has no public log bound to it; nothing to cosign")
        return
    shown = ", ".join(cosigners) if cosigners else "no witness (none bound)"
    click.echo(f"phsafe: the public log {log_path(ledger.path)} ({ledger.state.public_log['origin']}) is cosigned by "
               f"{shown} at {len(ledger.state.lines)} ledger entries")


@ledger.command("registration")
@click.argument("path", type=EXISTING_FILE)
@click.option("--out", "out", type=PATH, required=True, metavar="FILE",
              help="Where to write the registration (a new file; public).")
@click.option("--retired-in", "retired_in", multiple=True, metavar="LOG",
              help="The published log (a folder or URL) of a ledger that accounted one of this ledger's datasets "
                   "and retired it (phsafe ledger retire-dataset): its retirement goes into the registration; "
                   "may be repeated.")
@handle_errors
def registration_command(path: Path, out: Path, retired_in: tuple[str, ...]) -> None:
    """Write the registration of the ledger's public log: its policy entry, which names the
    datasets it accounts, proven as entry 0 of the log's published checkpoint (public files only).

    Give it, with the log's verifier key, to each witness's operator (their logs folder): a
    witness cosigns a log only once it accepted its registration, and refuses one whose policy
    names a dataset another log holds there -- unless the registration carries that log's
    public retirement of the dataset (--retired-in). A log its witnesses already cosigned: run
    phsafe ledger cosign first, so that the registration's checkpoint carries their cosignatures.
    """
    start(None)
    from phsafe.errors import PHSafeError
    from phsafe.publog.claims import make_log_registration
    from phsafe.tlog.files import write_new_file
    from phsafe.tlog.registration import policy_datasets

    data, registration = make_log_registration(path, retired_in=retired_in)
    try:
        write_new_file(out, data, 0o644)
    except OSError as exc:
        raise PHSafeError(f"cannot write the registration {out}: {exc.strerror or exc}") from None
    declared = policy_datasets(registration.policy)
    held = ", ".join(declared) if declared else "no dataset (a ledger made before ledgers declared their datasets)"
    retired = "".join(f"; carries {r.origin}'s retirement (entry {r.proof.index})" for r in registration.retirements)
    click.echo(f"phsafe: wrote the registration of the log {registration.origin} to {out}: its policy names {held}"
               f"{retired}; give it, with the log's verifier key, to each witness's operator")


@ledger.command("retire-dataset")
@click.argument("path", type=EXISTING_FILE)
@click.option("--dataset", required=True, metavar="NAME", help="The dataset this ledger accounts no more.")
@click.option("--reason", required=True, metavar="TEXT", help="Why (recorded and published).")
@click.option("--successor", "successor", default=None, metavar="VKEY",
              help="The verifier key (or a file holding it) of the log that accounts the dataset from now on: "
                   "the witnesses let only that log claim it.")
@handle_errors
def retire_dataset_command(path: Path, dataset: str, reason: str, successor: str | None) -> None:
    """Retire a dataset from this ledger, publicly and for good (a DATASET_RETIRED entry, in its
    public log, cosigned by its witnesses): the ledger takes no more runs, versions or cap
    raises of it, and another log may claim it at the witnesses with this retirement
    (phsafe ledger registration NEW --retired-in THIS-LOG). Refused while a run of it is open.
    """
    start(None)
    from phsafe.publog import log_path
    from phsafe.publog.claims import retire_dataset

    if successor is not None and Path(successor).is_file():
        successor = _read_key(Path(successor))
    entry = retire_dataset(path, dataset, reason=reason, successor=successor)
    named = f", in favour of the log {entry['successor']['origin']}" if "successor" in entry else ""
    click.echo(f"phsafe: retired dataset {dataset} from {path} (entry {entry['seq']}){named}; its public log "
               f"{log_path(path)} holds the retirement: the successor's registration carries it (phsafe ledger "
               f"registration NEW-LEDGER --retired-in {log_path(path)})")
