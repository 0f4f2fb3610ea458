"""``phsafe witness``: a witness of public privacy-loss logs, kept apart from the ledgers it watches.

``init`` makes a witness folder (its cosigning key, 0600, and its public verifier key);
``trust`` tells it to witness a log; ``cosign`` checks a log's new checkpoint against the last
one it cosigned (consistency) and adds its cosignature. A ledger made with ``phsafe ledger init
--witness DIR`` asks the witness itself, before every spend.
"""

from __future__ import annotations

from pathlib import Path

import click

from phsafe.cli._common import PATH, handle_errors, start

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


@click.group()
def witness() -> None:
    """Witness public privacy-loss logs: cosign checkpoints that extend the last one cosigned."""


@witness.command("init")
@click.argument("folder", type=PATH)
@click.option("--name", required=True, metavar="NAME", help="The witness's name (e.g. witness.census.example).")
@handle_errors
def init_command(folder: Path, name: str) -> None:
    """Create the witness FOLDER: its cosigning key (0600) and its verifier key (public).

    Keep FOLDER apart from the ledgers it witnesses (another volume or host): a witness whose
    state is copied with a ledger protects nothing.
    """
    start(None)
    from phsafe.publog.witness import WITNESS_VKEY, init_witness

    vkey = init_witness(folder, name)
    click.echo(f"phsafe: created the witness {folder}; its verifier key (give it to auditors) is "
               f"{Path(folder).absolute() / WITNESS_VKEY}:")
    click.echo(vkey)


@witness.command("trust")
@click.argument("folder", type=_DIR)
@click.option("--log-key", "log_key", type=_FILE, required=True, metavar="VKEY", help="The log's verifier key file.")
@handle_errors
def trust_command(folder: Path, log_key: Path) -> None:
    """Witness the log whose verifier key is VKEY from now on."""
    start(None)
    from phsafe.publog.witness import WitnessFolder

    vkey = log_key.read_text(encoding="utf-8").strip()
    WitnessFolder(folder.absolute()).trust_log(vkey)
    click.echo(f"phsafe: {folder} witnesses the log {vkey.split('+', 1)[0]}")


@witness.command("cosign")
@click.argument("folder", type=_DIR)
@click.argument("log", type=_DIR)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Write the cosigned checkpoint here (default: print it).")
@handle_errors
def cosign_command(folder: Path, log: Path, out: Path | None) -> None:
    """Cosign the checkpoint of the published log LOG, if it extends the last one cosigned.

    Reads LOG/checkpoint and LOG/entries, proves consistency from the checkpoint this witness
    last cosigned for the log to the new one, and cosigns; a log that does not extend it (a
    fork, a rolled-back or stale copy) is refused with one line, and nothing is cosigned.
    """
    start(None)
    from phsafe.errors import PHSafeError, WitnessRefusal
    from phsafe.publog.witness import WitnessFolder
    from phsafe.tlog import parse_checkpoint, parse_note, read_published_log, request_cosignature
    from phsafe.tlog.layout import CHECKPOINT_FILE

    witness_folder = WitnessFolder(folder.absolute())
    w = witness_folder.witness()
    checkpoint = (log / CHECKPOINT_FILE).read_bytes()
    origin = parse_checkpoint(parse_note(checkpoint)[0]).origin
    verifier = witness_folder.log_verifier(origin)
    if verifier is None:
        raise PHSafeError(f"this witness does not witness the log {origin!r} (phsafe witness trust)")
    published = read_published_log(log, verifier)
    try:
        cosigned = request_cosignature(w, published.log, published.checkpoint.message)
    except WitnessRefusal as refusal:
        raise PHSafeError(f"refused to cosign {origin} at {published.checkpoint.checkpoint.size} entries: "
                          f"{refusal}") from None
    if out is not None:
        out.write_bytes(cosigned)
        click.echo(f"phsafe: cosigned {origin} at {published.checkpoint.checkpoint.size} entries; wrote {out}")
    else:
        click.echo(cosigned.decode("utf-8"), nl=False)
