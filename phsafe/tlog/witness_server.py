"""A witness as a service: C2SP tlog-witness ``add-checkpoint`` over HTTP, on a real ASGI server.

``phsafe witness serve --key K --state DIR --log VKEY --bind 127.0.0.1:PORT`` runs one. It holds
its own cosigning key and its own state; the logs it witnesses are its operator's choice, never a
request's: verifier keys given when it starts (``--log``), and those its operator puts in a
folder (``--logs DIR``: every ``*.vkey`` file there, read by content at every request, so a log
is added without a restart and a key rewritten in place is seen: :class:`LogKeys`). It cosigns a
log only once it accepted the log's registration (``--registration FILE``, or a ``*.registration``
file in the folder: :mod:`phsafe.tlog.registration`), and never a second log for a dataset it
holds for another. The routes::

    POST <prefix>/add-checkpoint          the spec's (C2SP tlog-witness)
    GET  <prefix>/claims                  the datasets it holds: one "<dataset> <log origin>" line each
    GET  <prefix>/evidence                the names of the evidence files kept, one per line
    GET  <prefix>/evidence/<name>         one evidence file (phsafe-equivocation/1, JSON)
    (every other path: 404; another method: 405)

answered by :func:`phsafe.tlog.witness.answer_add_checkpoint` -- 200 with the cosignature line,
409 with the size it last cosigned (``text/x.tlog.size``), 422 when the proof does not verify,
400/403/404 as the spec says. Requests are answered one at a time (check, persist, answer): the
compare-and-swap of the state is then never contended within the service, and another process
cannot serve the same state at all (:class:`WitnessState` holds an exclusive lock on the folder
while it serves).

State folder ``DIR`` (created 0700 if missing)::

    DIR/checkpoints.json     the last checkpoint cosigned per log (phsafe.tlog.files.FileCheckpointStore:
                             replaced atomically and durably before every 200 answer)
    DIR/claims.json          the registrations accepted: which log holds each dataset
                             (phsafe.tlog.files.FileClaimStore; written after the log's first
                             checkpoint, which its registration fixes)
    DIR/serving.lock         held (flock) by the one service that serves this state
    DIR/evidence/            proofs that a log's key signed two histories (phsafe.tlog.evidence):
                             the checkpoint it cosigned and a refused one of the same size with
                             another root, or one whose own consistency proof ties it to another
                             prefix; served over HTTP; each file and the folder synced before the
                             refusal is answered
    DIR/refused/             every refused request whose log signature verified, as it came

Killed at any point, the folder holds the state before the request or the state after it, and
an answer is sent only once the state after it is durable: a restarted witness never cosigns a
checkpoint that does not extend what it cosigned, nor a second tree of a size it cosigned.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from phsafe import durable
from phsafe.errors import MalformedError, StoreError, WitnessRefusal
from phsafe.tlog.cosignature import CosignatureSigner
from phsafe.tlog.evidence import EVIDENCE_SUFFIX, Evidence, format_evidence
from phsafe.tlog.files import FileCheckpointStore, FileClaimStore
from phsafe.tlog.registration import REGISTRATION_SUFFIX
from phsafe.tlog.note import Verifier, parse_note
from phsafe.tlog.witness import HttpAnswer, Witness, answer_add_checkpoint

STATE_FILE = "checkpoints.json"
CLAIMS_FILE = "claims.json"
SERVING_LOCK = "serving.lock"
EVIDENCE_FOLDER = "evidence"
REFUSED_FOLDER = "refused"
CLAIMS_PATH = "/claims"
"""``GET <prefix>/claims``: the datasets this witness holds, one ``<dataset> <origin>`` line each."""
EVIDENCE_PATH = "/evidence"
"""``GET <prefix>/evidence``: the names of the evidence files, one per line; ``GET
<prefix>/evidence/<name>``: one of them (``application/json``)."""


class WitnessState:
    """A witness's state folder, held exclusively while it is open (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_fd = os.open(self.folder / SERVING_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot use the witness state folder {self.folder}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreError(f"another witness process serves the state {self.folder}; one state, one witness") from None
        self.store = FileCheckpointStore(self.folder / STATE_FILE)
        self.claims = FileClaimStore(self.folder / CLAIMS_FILE)

    def keep_evidence(self, origin: str, request: bytes, evidence: Evidence | None) -> None:
        """Keep a refused request signed by the log (``refused/``) and, when it proves the log
        signed two histories, the evidence (``evidence/``, served over HTTP) -- each file and its
        folder synced before the refusal is answered."""
        tag = hashlib.sha256(origin.encode("utf-8")).hexdigest()[:12]
        try:
            if evidence is not None:
                self._keep(EVIDENCE_FOLDER, evidence.name(), format_evidence(evidence))
            self._keep(REFUSED_FOLDER, f"{tag}-{hashlib.sha256(request).hexdigest()[:20]}.add-checkpoint", request)
        except OSError:
            pass  # kept when it can be; the refusal stands either way

    def _keep(self, folder_name: str, name: str, data: bytes) -> None:
        folder = self.folder / folder_name
        if not folder.is_dir():
            folder.mkdir(mode=0o700, exist_ok=True)
            durable.fsync_folder(self.folder)  # the new folder's name is durable too
        if not (folder / name).exists():  # the same evidence twice is kept once
            durable.create(folder / name, data, mode=0o644)

    def evidence_names(self) -> list[str]:
        """The evidence files kept, oldest name first (sorted)."""
        folder = self.folder / EVIDENCE_FOLDER
        try:
            return sorted(p.name for p in folder.iterdir() if p.name.endswith(EVIDENCE_SUFFIX))
        except OSError:
            return []

    def evidence(self, name: str) -> bytes | None:
        """The bytes of one evidence file (None: no such file; names are checked, never paths)."""
        if name not in self.evidence_names():
            return None
        try:
            return (self.folder / EVIDENCE_FOLDER / name).read_bytes()
        except OSError:
            return None

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = -1


class LogKeys:
    """The logs a witness witnesses: keys given at start, and the ``*.vkey`` files of a folder,
    read by content -- every file read again at every request (they are a few short lines), so
    that a key added, removed or rewritten in place under the same file name is seen at once.

    A log is known by its name (its checkpoints' origin) and its key. Two keys of one name
    (two files, or a file and a ``--log``) are ambiguous: the one the witness has cosigned under
    (``pinned``: the key ID its state holds for that origin) is used, and without one neither is.
    A key rewritten in place for a log already cosigned is loaded as what it is -- another key
    of that name -- and the witness refuses it (403: a log's key never changes)."""

    def __init__(self, fixed: Sequence[Verifier], folder: Path | None = None,
                 read_key: Callable[[Path], Verifier] | None = None,
                 pinned: Callable[[str], set[int]] | None = None,
                 registrations: Sequence[tuple[str, bytes]] = ()) -> None:
        self._fixed = list(fixed)
        self._fixed_registrations = list(registrations)
        self.registrations: list[tuple[str, bytes]] = list(registrations)
        """Every registration given (where from, its bytes): ``--registration`` files, and the
        ``*.registration`` files of the folder, read again whenever the folder changes."""
        self.generation = 0
        """Counts the changes of the folder seen (registrations are read again at each)."""
        self._folder = None if folder is None else Path(folder)
        self._read_key = read_key
        self._pinned = pinned
        self._seen: tuple[tuple[str, str], ...] | None = None
        self._keys: list[Verifier] = list(fixed)
        self.skipped: list[str] = []

    def _contents(self) -> tuple[tuple[str, str], ...]:
        """Each ``*.vkey`` file's name and the SHA-256 of its bytes."""
        if self._folder is None:
            return ()
        out = []
        try:
            paths = sorted([*self._folder.glob("*.vkey"), *self._folder.glob(f"*{REGISTRATION_SUFFIX}")])
        except OSError:
            return ()
        for path in paths:
            try:
                out.append((path.name, hashlib.sha256(path.read_bytes()).hexdigest()))
            except OSError:
                out.append((path.name, "unreadable"))
        return tuple(out)

    def current(self) -> list[Verifier]:
        if self._folder is None or self._read_key is None:
            return self._keys
        contents = self._contents()
        if contents == self._seen:
            return self._keys
        candidates: list[tuple[str, Verifier]] = [("--log", k) for k in self._fixed]
        skipped: list[str] = []
        registrations = list(self._fixed_registrations)
        for name, _ in contents:
            if name.endswith(REGISTRATION_SUFFIX):
                try:
                    registrations.append((name, (self._folder / name).read_bytes()))
                except OSError as exc:
                    skipped.append(f"{name}: {exc.strerror or exc}")
                continue
            try:
                candidates.append((name, self._read_key(self._folder / name)))
            except Exception as exc:  # noqa: BLE001 -- a bad file is skipped and said, never fatal
                skipped.append(f"{name}: {exc}")
        by_origin: dict[str, dict[bytes, tuple[str, Verifier]]] = {}
        for source, key in candidates:
            by_origin.setdefault(key.name, {}).setdefault(key.public_key, (source, key))
        keys: list[Verifier] = []
        for origin, found in by_origin.items():
            if len(found) == 1:
                keys.append(next(iter(found.values()))[1])
                continue
            pinned = self._pinned(origin) if self._pinned is not None else set()
            chosen = [key for _, key in found.values() if key.key_id in pinned]
            sources = ", ".join(source for source, _ in found.values())
            if len(chosen) == 1:
                keys.append(chosen[0])
                skipped.append(f"{sources}: {len(found)} keys for the log {origin}; the one it cosigned under is used")
            else:
                skipped.append(f"{sources}: {len(found)} keys for the log {origin}; none is used until one is removed")
        self._keys, self.skipped, self._seen = keys, skipped, contents
        self.registrations = registrations
        self.generation += 1
        return self._keys


def open_witness(signer: CosignatureSigner, logs: Sequence[Verifier] | LogKeys, state: WitnessState, *,
                 say: Callable[[str], None] = lambda line: None) -> Callable[[], Witness]:
    """The witness of ``logs`` with ``signer``'s key and ``state``'s checkpoints and claims (made
    again when the logs change). It cosigns only the logs whose registration it accepted
    (:meth:`~phsafe.tlog.witness.Witness.register`): the registrations given are read again
    whenever the logs folder changes, and ``say`` is told, in one line, what each one did."""
    keys = logs if isinstance(logs, LogKeys) else LogKeys(logs)
    made: dict[str, Any] = {}

    def witness() -> Witness:
        current = keys.current()
        if made.get("keys") is not current:
            made["keys"], made["witness"] = current, Witness(signer, current, state.store, evidence=state.keep_evidence,
                                                             claims=state.claims)
        if made.get("generation") != keys.generation:
            made["generation"] = keys.generation
            said: dict[str, str] = made.setdefault("said", {})
            for source, data in keys.registrations:
                try:
                    line = made["witness"].register(data)
                except WitnessRefusal as refusal:
                    line = f"refused: {refusal}"
                except StoreError as exc:
                    line = f"not read: the witness cannot use its state ({exc})"
                if said.get(source) != line:  # each outcome once, not at every change of the folder
                    said[source] = line
                    say(f"{source}: {line}")
        return made["witness"]

    return witness


def pinned_key_ids(store: FileCheckpointStore) -> Callable[[str], set[int]]:
    """For :class:`LogKeys`: the key IDs of the log signatures on the checkpoint cosigned last."""

    def pinned(origin: str) -> set[int]:
        try:
            stored = store.load(origin)
            return set() if stored is None else {s.key_id for s in parse_note(stored)[1] if s.name == origin}
        except (StoreError, MalformedError):
            return set()

    return pinned


def witness_app(witness: Callable[[], Witness], state: WitnessState | None = None) -> Any:
    """The ASGI application (Starlette) of the witness ``witness()`` returns; with ``state``,
    its evidence of equivocation is served too (:data:`EVIDENCE_PATH`)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    one_at_a_time = threading.Lock()

    def answer(body: bytes) -> HttpAnswer:
        with one_at_a_time:
            return answer_add_checkpoint(witness(), body)

    async def add_checkpoint(request: Request) -> Response:
        body = await request.body()
        reply = await run_in_threadpool(answer, body)
        # The content type exactly as the spec writes it (Starlette would add a charset to text/*).
        return Response(reply.body, status_code=reply.status, headers={"content-type": reply.content_type})

    async def evidence_list(request: Request) -> Response:
        assert state is not None
        names = await run_in_threadpool(state.evidence_names)
        return Response("".join(f"{n}\n" for n in names).encode("utf-8"),
                        headers={"content-type": "text/plain; charset=utf-8"})

    async def evidence_file(request: Request) -> Response:
        assert state is not None
        data = await run_in_threadpool(state.evidence, request.path_params["name"])
        if data is None:
            return Response(b"no such evidence\n", status_code=404, headers={"content-type": "text/plain; charset=utf-8"})
        return Response(data, headers={"content-type": "application/json"})

    def claim_lines() -> bytes:
        with one_at_a_time:
            held = witness().claims()
        return "".join(f"{name} {origin}\n" for name, origin in sorted(held.claims.items())).encode("utf-8")

    async def claims(request: Request) -> Response:
        return Response(await run_in_threadpool(claim_lines), headers={"content-type": "text/plain; charset=utf-8"})

    routes = [Route("/add-checkpoint", add_checkpoint, methods=["POST"]), Route(CLAIMS_PATH, claims, methods=["GET"])]
    if state is not None:
        routes += [Route(EVIDENCE_PATH, evidence_list, methods=["GET"]),
                   Route(EVIDENCE_PATH + "/{name}", evidence_file, methods=["GET"])]
    return Starlette(routes=routes)


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (port 0: any free port) as (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8321; port 0 takes a free one)")
    return host.strip("[]"), int(port)


def serve(witness: Callable[[], Witness], host: str, port: int, *, ready: Callable[[str], None],
          state: WitnessState | None = None) -> None:
    """Serve ``witness`` on ``host:port`` until SIGINT or SIGTERM; ``ready(url)`` is called with
    the URL it listens on (the port the system chose, for port 0) once it accepts requests."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StoreError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    config = uvicorn.Config(witness_app(witness, state), log_level="warning", access_log=False, lifespan="off",
                            timeout_keep_alive=30)

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            ready(f"http://{shown}:{bound}")

    server = Announcing(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
