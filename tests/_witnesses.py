"""Witness services in memory, for the unit tests: reached through ``httpx.MockTransport``.

Each witness is a :class:`phsafe.tlog.Witness` (its own key, its own state) answering
``POST <url>/add-checkpoint`` with :func:`phsafe.tlog.answer_add_checkpoint` -- the very answer
``phsafe witness serve`` gives -- so the ledger's side runs its real HTTP client against them, with
no socket. The ledger's side gets only their URLs and public keys, as in production; the tests
hold the witnesses' keys because the tests play the witnesses' operators. A witness can be taken
down (connections refused) and brought back. The system tests run real servers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from phsafe.tlog import (
    MemoryCheckpointStore,
    Witness,
    answer_add_checkpoint,
    format_verifier_key,
    verifier_from_key,
)
from phsafe.errors import WitnessRefusal
from phsafe.tlog.cosignature import CosignatureSigner
from phsafe.tlog.registration import ClaimStore
from tests._tlog import private_key


@dataclass
class MemoryWitness:
    name: str
    signer: CosignatureSigner
    store: MemoryCheckpointStore = field(default_factory=MemoryCheckpointStore)
    logs: list[str] = field(default_factory=list)
    down: bool = False
    frozen: bool = False
    """A frozen process (SIGSTOP): connections are accepted, no answer ever comes (a read time-out)."""
    requests: int = 0
    timeouts: int = 0
    claims: ClaimStore | None = None
    """With a claim store, it keeps one log per dataset, as the witness service does: it cosigns
    only the logs whose registration (in ``registrations``) it accepted."""
    registrations: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.name}:8000"

    @property
    def vkey(self) -> str:
        return format_verifier_key(self.signer)

    def witness(self) -> Witness:
        witness = Witness(self.signer, [verifier_from_key(v) for v in self.logs], self.store, claims=self.claims)
        for data in self.registrations if self.claims is not None else ():
            try:
                witness.register(data)
            except WitnessRefusal:
                pass  # said to the log's requests
        return witness


class Witnesses:
    """Several witnesses in memory, and the transport that reaches them by URL."""

    def __init__(self, count: int = 2, *, claims: bool = False) -> None:
        self.by_host: dict[str, MemoryWitness] = {}
        for number in range(1, count + 1):
            name = f"witness{number}.test"
            self.by_host[name] = MemoryWitness(name, CosignatureSigner(name, private_key(f"memory witness {number}")),
                                               claims=ClaimStore() if claims else None)
        self.transport = httpx.MockTransport(self._handle)

    def __getitem__(self, number: int) -> MemoryWitness:
        return list(self.by_host.values())[number - 1]

    def listed(self, *numbers: int) -> list[tuple[str, str]]:
        """(URL, verifier key) of the given witnesses (default: all), as ``ledger init`` takes them."""
        chosen = [self[n] for n in numbers] if numbers else list(self.by_host.values())
        return [(w.url, w.vkey) for w in chosen]

    def trust(self, log_vkey: str, registration: bytes | None = None) -> None:
        """Every witness witnesses the log from now on (its operator restarts it with --log), and
        is given its registration (``phsafe ledger registration``), if any."""
        for w in self.by_host.values():
            if log_vkey not in w.logs:
                w.logs.append(log_vkey)
            if registration is not None:
                w.registrations.append(registration)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        host = urlsplit(str(request.url)).hostname or ""
        witness = self.by_host.get(host)
        if witness is None or witness.down:
            raise httpx.ConnectError("Connection refused", request=request)
        if witness.frozen:
            witness.timeouts += 1
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.path != "/add-checkpoint" or request.method != "POST":
            return httpx.Response(404)
        witness.requests += 1
        answer = answer_add_checkpoint(witness.witness(), request.content)
        return httpx.Response(answer.status, headers={"content-type": answer.content_type}, content=answer.body)
