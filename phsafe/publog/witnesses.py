"""A ledger's witnesses: other parties, known to the ledger by their public keys and URLs only.

A witness runs on its own host with its own key and state (``phsafe witness serve``,
:mod:`phsafe.tlog.witness_server`); the ledger's side never holds a witness's private key. It
holds, beside the ledger::

    <ledger>.witnesses.json   {"format": "phsafe-witnesses/2", "quorum": K,
                               "witnesses": [{"vkey": "<name>+<id>+<key>", "url": "http://host:port"}, ...]}

The keys and the quorum are also bound into the ledger's first entry (``public_log`` of
``LEDGER_INIT``, or ``LOG_BOUND``): this file must list exactly those keys with that quorum, or
the ledger is refused -- a witness cannot be removed, swapped for another or the quorum lowered
by editing it. Only the URLs are free to change (a witness that moves to another host). The
quorum must be more than half of the witnesses (:mod:`phsafe.tlog.policy`: any two quorums share
a witness), here and wherever a list is made or read.

:class:`HttpWitness` asks one witness over HTTP (C2SP tlog-witness ``add-checkpoint``), with
time-outs; it answers like :class:`phsafe.tlog.Witness` (the cosignature line, or a
:class:`~phsafe.errors.WitnessRefusal`), or raises :class:`~phsafe.errors.WitnessUnreachable`.

Witness operators make their keys with :func:`init_witness` (``phsafe witness init``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from phsafe import durable
from phsafe.errors import (
    LedgerError,
    MalformedError,
    QuorumPolicyError,
    StoreError,
    TlogError,
    WitnessRefusal,
    WitnessUnreachable,
)
from phsafe.tlog.cosignature import CosignatureVerifier
from phsafe.tlog.fetch import network_reason
from phsafe.tlog.files import write_signer_key, write_verifier_key
from phsafe.tlog.keys import format_verifier_key, generate_keys, verifier_from_key
from phsafe.tlog.note import ALG_COSIGNATURE_V1
from phsafe.tlog.policy import WitnessPolicy
from phsafe.tlog.witness import AddCheckpointRequest, format_add_checkpoint_request, read_add_checkpoint_answer

WITNESS_KEY = "witness.key"
WITNESS_VKEY = "witness.vkey"
WITNESSES_FORMAT = "phsafe-witnesses/2"
WITNESS_TIMEOUT_SECONDS = 10.0
"""How long one round of asking a witness may take, in all: connecting, sending, reading, and the
second request of a 409 -- one deadline, so a witness that hangs (a frozen process accepts
connections and never answers) costs one time-out per round, never two."""
WITNESS_CONNECT_SECONDS = 5.0
"""How long connecting to a witness may take (within the round's deadline)."""


def init_witness(folder: Path, name: str) -> str:
    """A witness's key pair in ``folder``: ``witness.key`` (0600) and ``witness.vkey``; returns
    the verifier key. For the witness's operator, on the witness's host."""
    folder = Path(folder).absolute()
    if folder.exists() and any(folder.iterdir()):
        raise StoreError(f"{folder} is not empty; a witness's keys are made in a new folder")
    skey, vkey = generate_keys(name, ALG_COSIGNATURE_V1)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_signer_key(folder / WITNESS_KEY, skey)
    write_verifier_key(folder / WITNESS_VKEY, vkey)
    return vkey


def witnesses_path(ledger: Path) -> Path:
    """``<ledger>.witnesses.json``: the witnesses' keys and URLs (absent: the ledger has none)."""
    return Path(ledger).with_name(Path(ledger).name + ".witnesses.json")


def witness_key(text: str, what: str) -> CosignatureVerifier:
    """A witness's verifier key (cosignature/v1), from its text."""
    try:
        verifier = verifier_from_key(text)
    except TlogError as exc:
        raise LedgerError(f"{what} is not a witness's verifier key ({exc})") from None
    if verifier.alg != ALG_COSIGNATURE_V1:
        raise LedgerError(f"{what} is a log's key, not a witness's (cosignature/v1)")
    return verifier  # type: ignore[return-value]


def check_url(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise LedgerError(f"{what} {url!r} is not an http(s) URL of a witness (http://host:port[/prefix])")
    return url.rstrip("/")


@dataclass(frozen=True)
class WitnessEntry:
    """One witness as the ledger knows it: its verifier key and where it answers."""

    verifier: CosignatureVerifier
    url: str

    @property
    def name(self) -> str:
        return self.verifier.name

    @property
    def vkey(self) -> str:
        return format_verifier_key(self.verifier)


@dataclass(frozen=True)
class WitnessList:
    """The witnesses a ledger asks, and how many of them must cosign."""

    witnesses: tuple[WitnessEntry, ...]
    quorum: int

    @property
    def vkeys(self) -> list[str]:
        return [w.vkey for w in self.witnesses]

    def document(self) -> dict[str, Any]:
        return {"format": WITNESSES_FORMAT, "quorum": self.quorum,
                "witnesses": [{"vkey": w.vkey, "url": w.url} for w in self.witnesses]}

    @classmethod
    def of(cls, witnesses: Sequence[tuple[str, str]], quorum: int | None) -> "WitnessList":
        """From (URL, verifier key text) pairs; the quorum defaults to all of them, and must be
        more than half of them (:mod:`phsafe.tlog.policy`: any two quorums share a witness).

        Raises:
            LedgerError: A URL or key is not one, a key is given twice, or the quorum cannot be
                met or need not intersect another (one line naming the rule).
        """
        entries = []
        for url, vkey in witnesses:
            entries.append(WitnessEntry(witness_key(vkey.strip(), f"the witness key for {url}"),
                                        check_url(url, "the witness URL")))
        if not entries and quorum:
            raise LedgerError("a witness quorum needs witnesses (--witness URL VKEY)")
        try:
            policy = WitnessPolicy.of([e.verifier for e in entries], quorum if entries else 0)
        except QuorumPolicyError as exc:
            raise LedgerError(str(exc)) from None
        return cls(tuple(entries), policy.quorum)


def write_witness_list(ledger: Path, witnesses: WitnessList) -> None:
    """Create ``<ledger>.witnesses.json`` (it must not exist)."""
    data = (json.dumps(witnesses.document(), indent=1) + "\n").encode("utf-8")
    try:
        durable.create(witnesses_path(ledger), data, mode=0o644)
    except FileExistsError:
        raise LedgerError(f"{witnesses_path(ledger)} already exists; a ledger's witness list is made with it") from None


def read_witness_list(ledger: Path) -> WitnessList | None:
    """The ledger's witnesses, or None when the file is absent.

    Raises:
        LedgerError: It cannot be read or is not a phsafe-witnesses/2 document (a list of the
            first format -- witness folders -- names the migration that replaces it).
    """
    target = witnesses_path(ledger)
    try:
        document = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise LedgerError(f"cannot read the ledger's witness list {target}: {exc}") from None
    if isinstance(document, dict) and document.get("format") == "phsafe-witnesses/1":
        raise LedgerError(f"{target} lists witness folders, which the ledger no longer reads (their keys were within "
                          "its reach): give it witness services with `phsafe ledger migrate LEDGER --witness URL VKEY`")
    if not isinstance(document, dict) or document.get("format") != WITNESSES_FORMAT \
            or not isinstance(document.get("witnesses"), list) or not isinstance(document.get("quorum"), int) \
            or not all(isinstance(w, dict) and set(w) == {"vkey", "url"} for w in document["witnesses"]):
        raise LedgerError(f"{target} is not a {WITNESSES_FORMAT} document")
    try:
        return WitnessList.of([(w["url"], w["vkey"]) for w in document["witnesses"]], document["quorum"])
    except LedgerError as exc:
        raise LedgerError(f"refused: the witness list {target}: {exc} -- nothing was spent") from None


# --------------------------------------------------------------------------------------------
# Asking a witness over HTTP
# --------------------------------------------------------------------------------------------


class HttpWitness:
    """One witness, asked over HTTP: ``POST <url>/add-checkpoint`` (C2SP tlog-witness).

    Args:
        entry: Its key and URL.
        transport: An ``httpx`` transport to use instead of the network (tests answer with a
            witness in memory through :class:`httpx.MockTransport`).
    """

    def __init__(self, entry: WitnessEntry, transport: Any = None) -> None:
        self.entry = entry
        self._transport = transport
        self._client: Any = None
        self._deadline: float | None = None

    @property
    def name(self) -> str:
        return self.entry.name

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.Client(timeout=httpx.Timeout(WITNESS_TIMEOUT_SECONDS, connect=WITNESS_CONNECT_SECONDS),
                                        transport=self._transport, trust_env=False, follow_redirects=False)
        return self._client

    def start_round(self, seconds: float = WITNESS_TIMEOUT_SECONDS) -> None:
        """Every request from now until the next round shares one deadline, ``seconds`` away."""
        self._deadline = time.monotonic() + seconds

    def add_checkpoint(self, request: AddCheckpointRequest) -> bytes:
        """The witness's cosignature line(s) for ``request``.

        Raises:
            WitnessRefusal: It refused (its HTTP status; 409 with the size it last cosigned).
            WitnessUnreachable: It could not be asked, or did not answer before the round's deadline.
        """
        import httpx

        left = WITNESS_TIMEOUT_SECONDS if self._deadline is None else self._deadline - time.monotonic()
        if left <= 0:
            raise WitnessUnreachable(f"no answer within {WITNESS_TIMEOUT_SECONDS:g} s")
        timeout = httpx.Timeout(left, connect=min(WITNESS_CONNECT_SECONDS, left))
        try:
            reply = self._http().post(f"{self.entry.url}/add-checkpoint", content=format_add_checkpoint_request(request),
                                      headers={"Content-Type": "text/plain; charset=utf-8"}, timeout=timeout)
        except httpx.TimeoutException:
            raise WitnessUnreachable(f"no answer within {WITNESS_TIMEOUT_SECONDS:g} s") from None
        except httpx.HTTPError as exc:
            raise WitnessUnreachable(network_reason(exc)) from None
        return read_add_checkpoint_answer(reply.status_code, reply.headers.get("content-type"), reply.content)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def describe_refusal(name: str, url: str, error: TlogError, size: int) -> str:
    """One witness's refusal, in the operator's words."""
    where = f"witness {name} at {url}"
    if isinstance(error, WitnessUnreachable):
        return f"{where} cannot be reached ({error})"
    if isinstance(error, WitnessRefusal):
        if error.status == 409 and error.latest_size is not None and error.latest_size > size:
            return (f"{where} has cosigned {error.latest_size} entries of this log and this ledger's log has {size}: "
                    "this ledger is an older copy or was rolled back")
        if error.status == 409 and error.latest_size == size:
            return f"{where} has cosigned another log of {size} entries: this ledger is a copy that diverged (a fork)"
        if error.status == 422:
            return (f"{where} refuses: this ledger's log does not extend the history it cosigned: this ledger is a "
                    "copy that diverged (a fork)")
        if error.status == 404:
            return f"{where} does not witness this log (start it with --log and this log's verifier key)"
        return f"{where} refuses ({error}; status {error.status})"
    if isinstance(error, MalformedError):
        return f"{where} answered with something that is not a cosignature ({error})"
    return f"{where}: {error}"


def quorum_text(witnesses: WitnessList) -> str:
    return f"{witnesses.quorum} of {len(witnesses.witnesses)}"


def binding_witnesses(binding: Mapping[str, Any]) -> tuple[list[str], int]:
    return list(binding.get("witnesses", [])), int(binding.get("quorum", 0))
