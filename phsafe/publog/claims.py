"""One log per dataset: a log's registration with its witnesses, and a dataset's retirement.

A ledger's policy names the datasets it accounts (``phsafe ledger init --dataset NAME``); its
public log's first entry says so. Its witnesses learn it from the log's **registration**
(:mod:`phsafe.tlog.registration`): that entry with its inclusion proof into a checkpoint the log's
key signed, made here from the published log's own files (:func:`make_log_registration`,
``phsafe ledger registration``) and handed to each witness's operator beside the log's key. A
witness then refuses a second log whose policy names a dataset it witnesses under another log,
unless the second log's registration carries the first log's public retirement of it
(:func:`retire_dataset`, ``phsafe ledger retire-dataset``: a ``DATASET_RETIRED`` entry in the first
ledger, witnessed like a spend), found in the first log's published files.

The argument, and what each party sees, is in ``docs/public_log.md`` ("One log per dataset").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phsafe.errors import LedgerError, TlogError
from phsafe.publog.ledgers import open_ledger
from phsafe.publog.log import log_path
from phsafe.tlog.checkpoint import parse_checkpoint
from phsafe.tlog.fetch import fetch_published_log
from phsafe.tlog.keys import verifier_from_key
from phsafe.tlog.layout import VERIFIER_KEY_FILE, decode_entries, verify_published_log
from phsafe.tlog.note import ALG_ED25519, parse_note
from phsafe.tlog.registration import Registration, format_registration, make_registration, policy_datasets


def _published(source: str | Path, what: str) -> tuple[bytes, list[bytes]]:
    """A published log's checkpoint and the entries it signs (unverified: the witness verifies)."""
    try:
        checkpoint, data = fetch_published_log(source)
        entries, _ = decode_entries(data)
        size = parse_checkpoint(parse_note(checkpoint)[0]).size
    except TlogError as exc:
        raise LedgerError(f"{what} {source} cannot be read: {exc}") from None
    return checkpoint, list(entries)[:size]


def make_log_registration(ledger: Path, *, retired_in: Sequence[str | Path] = ()) -> tuple[bytes, Registration]:
    """The registration of ``ledger``'s public log (its file's bytes, and what it holds), made
    from the published folder ``<ledger>.public-log/`` as it is -- its checkpoint, with the
    cosignatures it has -- and carrying the retirements of its datasets that the published logs
    ``retired_in`` (folders or URLs of the logs that accounted them before) hold.

    Raises:
        LedgerError: The log cannot be read or does not verify with its own key; its policy
            names no dataset and no retirement applies; a log in ``retired_in`` cannot be read.
    """
    folder = log_path(Path(ledger))
    try:
        vkey = (folder / VERIFIER_KEY_FILE).read_text(encoding="utf-8").strip()
        checkpoint, data = fetch_published_log(folder)
        published = verify_published_log(checkpoint, data, verifier_from_key(vkey))
    except (OSError, UnicodeDecodeError) as exc:
        raise LedgerError(f"the public log {folder} cannot be read: {exc}") from None
    except TlogError as exc:
        raise LedgerError(f"the public log {folder} does not verify with its own key ({exc}): repair the ledger "
                          "first (phsafe ledger repair)") from None
    predecessors = [_published(source, "the published log") for source in retired_in]
    try:
        registration = make_registration(checkpoint, list(published.entries), predecessors)
    except TlogError as exc:
        raise LedgerError(f"cannot make the registration of {folder}: {exc}") from None
    declared = policy_datasets(registration.policy) or ()
    for source, (other, _) in zip(retired_in, predecessors):
        origin = parse_checkpoint(parse_note(other)[0]).origin
        if not any(r.origin == origin for r in registration.retirements):
            raise LedgerError(f"the published log {source} ({origin}) holds no retirement of "
                              f"{', '.join(declared) or 'any dataset'} (a dataset-retired entry): retire the dataset "
                              "there first (phsafe ledger retire-dataset)")
    return format_registration(registration), registration


def retire_dataset(ledger: Path, dataset: str, *, reason: str, successor: str | None = None,
                   transport: Any = None) -> dict[str, Any]:
    """Record ``DATASET_RETIRED`` in ``ledger``: it accounts ``dataset`` no more, and
    (``successor``: the verifier key of the log that accounts it from now on) names its
    successor. Witnessed like a spend: the quorum cosigns the log with the entry in it.

    Raises:
        LedgerError: The ledger does not account the dataset, retired it already, a run of it is
            open, or ``successor`` is not a log's verifier key; the witnesses refuse the ledger.
    """
    named = None
    if successor is not None:
        try:
            key = verifier_from_key(successor)
        except TlogError as exc:
            raise LedgerError(f"--successor: not a log's verifier key ({exc})") from None
        if key.alg != ALG_ED25519:
            raise LedgerError("--successor: a witness's key, not a log's (a log signs with type 0x01)")
        named = {"origin": key.name, "key_id": f"{key.key_id:08x}"}
    return open_ledger(Path(ledger), transport=transport).retire_dataset(dataset, reason, successor=named)
