"""``phsafe witness``: a witness of public privacy-loss logs, run by another party than the enclave.

``init`` makes a witness's key pair (its cosigning key, 0600, and its public verifier key);
``serve`` runs the witness as an HTTP service speaking C2SP tlog-witness
(:mod:`phsafe.tlog.witness_server`): it cosigns a log's new checkpoint only if it extends the
last one it cosigned. A ledger knows its witnesses by their public keys and URLs only
(``phsafe ledger init --witness URL VKEY``) and asks them over HTTP before every spend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from phsafe.cli._common import PATH, handle_errors, start

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group()
def witness() -> None:
    """Witness public privacy-loss logs: cosign checkpoints that extend the last one cosigned."""


@witness.command("init")
@click.argument("folder", type=PATH)
@click.option("--name", required=True, metavar="NAME", help="The witness's name (e.g. witness.census.example).")
@handle_errors
def init_command(folder: Path, name: str) -> None:
    """Create the witness's keys in FOLDER: witness.key (0600, its cosigning key) and
    witness.vkey (public: give it to the ledger's operators and to auditors).

    Keep FOLDER on the witness's own host, apart from the ledgers it witnesses: a witness whose
    key or state the enclave's operators hold protects nothing.
    """
    start(None)
    from phsafe.publog.witnesses import WITNESS_KEY, WITNESS_VKEY, init_witness

    vkey = init_witness(folder, name)
    folder = Path(folder).absolute()
    click.echo(f"phsafe: created the witness key {folder / WITNESS_KEY} (keep it on this host, never copy it); its "
               f"verifier key (give it to the ledger's operators and to auditors) is {folder / WITNESS_VKEY}:")
    click.echo(vkey)


def _log_keys(values: tuple[str, ...]) -> list:  # noqa: ANN201 -- tlog verifiers
    """Each --log value: a verifier key file, or a verifier key itself."""
    from phsafe.errors import PHSafeError, TlogError
    from phsafe.tlog.keys import verifier_from_key
    from phsafe.tlog.note import ALG_ED25519

    keys = []
    for value in values:
        path = Path(value)
        try:
            text = path.read_text(encoding="utf-8") if path.is_file() else value
            verifier = verifier_from_key(text)
        except (OSError, UnicodeDecodeError, TlogError) as exc:
            raise PHSafeError(f"--log {value}: not a log's verifier key, nor a file holding one ({exc})") from None
        if verifier.alg != ALG_ED25519:
            raise PHSafeError(f"--log {value}: a witness's key, not a log's (a log signs with type 0x01)")
        keys.append(verifier)
    return keys


@witness.command("serve")
@click.option("--key", "key", type=_FILE, required=True, metavar="KEY",
              help="The witness's cosigning key (witness.key from `phsafe witness init`; mode 0600).")
@click.option("--state", "state", type=PATH, required=True, metavar="DIR",
              help="The witness's state: the last checkpoint it cosigned per log (created if missing; "
                   "one witness process per state).")
@click.option("--log", "logs", multiple=True, metavar="VKEY",
              help="A log to witness: its verifier key, or a file holding it (log.vkey); may be repeated.")
@click.option("--logs", "logs_folder", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="A folder of logs' verifier keys (*.vkey) to witness too, read by content at every request: "
                   "a log is added by putting its key there, without a restart.")
@click.option("--registration", "registrations", type=_FILE, multiple=True, metavar="FILE",
              help="A log's registration (phsafe ledger registration): its policy, naming the datasets it "
                   "accounts, proven as its entry 0; may be repeated. Registrations are also read from --logs DIR "
                   "(*.registration). A log is cosigned only once its registration is accepted.")
@click.option("--bind", "bind", default="127.0.0.1:0", show_default=True, metavar="HOST:PORT",
              help="Where to listen (port 0: a free port, printed when it listens).")
@handle_errors
def serve_command(key: Path, state: Path, logs: tuple[str, ...], logs_folder: Path | None,
                  registrations: tuple[Path, ...], bind: str) -> None:
    """Run the witness: C2SP tlog-witness add-checkpoint over HTTP, until SIGINT or SIGTERM.

    POST <URL>/add-checkpoint with the old size, a consistency proof and the new checkpoint:
    200 and its cosignature if the checkpoint extends the last one it cosigned for that log; 409
    with the size it knows on a stale request; 422 on a proof that does not verify. A refused
    checkpoint that proves the log signed two histories is kept with the one cosigned before, as
    evidence anyone can check (phsafe audit evidence), and served: GET <URL>/evidence lists the
    files, GET <URL>/evidence/NAME gives one. Prints one line with its URL once it listens.

    One log per dataset: a log is cosigned only once its registration (phsafe ledger
    registration, beside its key in --logs DIR, or --registration FILE) is accepted; the witness
    keeps which log holds each dataset its policy names (GET <URL>/claims) and refuses (403, one
    line) a second log naming one of them, unless its registration carries the first log's
    public retirement of the dataset (phsafe ledger retire-dataset). What each registration did
    is printed on stderr, one line each.
    """
    start(None)
    from phsafe.errors import PHSafeError
    from phsafe.tlog.files import read_signer_key
    from phsafe.tlog.note import ALG_COSIGNATURE_V1
    from phsafe.tlog.witness_server import LogKeys, WitnessState, open_witness, parse_bind, pinned_key_ids, serve

    try:
        host, port = parse_bind(bind)
    except ValueError as exc:
        raise PHSafeError(f"--bind: {exc}") from None
    if not logs and logs_folder is None:
        raise PHSafeError("give the logs to witness: --log VKEY (repeatable) or --logs DIR")
    signer = read_signer_key(key)
    if signer.alg != ALG_COSIGNATURE_V1:
        raise PHSafeError(f"--key {key}: a log's signing key, not a witness's (cosignature/v1, type 0x04)")
    if logs_folder is not None:
        logs_folder.mkdir(parents=True, exist_ok=True)
    held = WitnessState(state)
    given = []
    for path in registrations:
        try:
            given.append((str(path), path.read_bytes()))
        except OSError as exc:
            raise PHSafeError(f"--registration {path}: cannot be read ({exc.strerror or exc})") from None
    keys = LogKeys(_log_keys(logs), logs_folder, read_key=lambda path: _log_keys((str(path),))[0],
                   pinned=pinned_key_ids(held.store), registrations=given)

    def say(line: str) -> None:
        click.echo(f"phsafe: witness {signer.name}: {line}", err=True)

    try:
        witness = open_witness(signer, keys, held, say=say)  # type: ignore[arg-type]
        origins = ", ".join(witness().origins) or "no log yet"
        also = f" and the logs whose keys are in {logs_folder}" if logs_folder is not None else ""

        def ready(url: str) -> None:
            click.echo(f"phsafe: witness {signer.name} serves {origins}{also} at {url} (state {held.folder})")
            sys.stdout.flush()

        serve(witness, host, port, ready=ready, state=held)
    finally:
        held.close()
    click.echo(f"phsafe: witness {signer.name} stopped")
