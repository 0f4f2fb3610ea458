"""A witness as a service: C2SP tlog-witness ``add-checkpoint`` over HTTP, on a real ASGI server.

``phsafe witness serve --key K --state DIR --log VKEY --bind 127.0.0.1:PORT`` runs one. It holds
its own cosigning key and its own state; the logs it witnesses are its operator's choice, never a
request's: verifier keys given when it starts (``--log``), and those its operator puts in a
folder (``--logs DIR``: every ``*.vkey`` file there, read again when the folder changes, so a log
is added without a restart). The one route is the spec's::

    POST <prefix>/add-checkpoint      (every other path: 404; another method: 405)

answered by :func:`phsafe.tlog.witness.answer_add_checkpoint` -- 200 with the cosignature line,
409 with the size it last cosigned (``text/x.tlog.size``), 422 when the proof does not verify,
400/403/404 as the spec says. Requests are answered one at a time (check, persist, answer): the
compare-and-swap of the state is then never contended within the service, and another process
cannot serve the same state at all (:class:`WitnessState` holds an exclusive lock on the folder
while it serves).

State folder ``DIR`` (created 0700 if missing)::

    DIR/checkpoints.json     the last checkpoint cosigned per log (phsafe.tlog.files.FileCheckpointStore:
                             replaced atomically and durably before every 200 answer)
    DIR/serving.lock         held (flock) by the one service that serves this state
    DIR/evidence/            refused requests whose log signature verified: a checkpoint that
                             does not extend the one cosigned, another tree of a cosigned size

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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from phsafe import durable
from phsafe.errors import StoreError
from phsafe.tlog.cosignature import CosignatureSigner
from phsafe.tlog.files import FileCheckpointStore
from phsafe.tlog.note import Verifier
from phsafe.tlog.witness import HttpAnswer, Witness, answer_add_checkpoint

STATE_FILE = "checkpoints.json"
SERVING_LOCK = "serving.lock"
EVIDENCE_FOLDER = "evidence"


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

    def keep_evidence(self, origin: str, size: int, request: bytes) -> None:
        folder = self.folder / EVIDENCE_FOLDER
        folder.mkdir(mode=0o700, exist_ok=True)
        tag = hashlib.sha256(origin.encode("utf-8")).hexdigest()[:16]
        name = f"{tag}-{size}-{time.time_ns()}.add-checkpoint"
        try:
            durable.create(folder / name, request, mode=0o600)
        except OSError:
            pass  # evidence is kept when it can be; the refusal stands either way

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = -1


class LogKeys:
    """The logs a witness witnesses: keys given at start, and the ``*.vkey`` files of a folder
    (read again whenever the folder's entries change)."""

    def __init__(self, fixed: Sequence[Verifier], folder: Path | None = None,
                 read_key: Callable[[Path], Verifier] | None = None) -> None:
        self._fixed = list(fixed)
        self._folder = None if folder is None else Path(folder)
        self._read_key = read_key
        self._seen: tuple[int, tuple[str, ...]] | None = None
        self._keys: list[Verifier] = list(fixed)
        self.skipped: list[str] = []

    def current(self) -> list[Verifier]:
        if self._folder is None or self._read_key is None:
            return self._keys
        try:
            stamp = (os.stat(self._folder).st_mtime_ns, tuple(sorted(p.name for p in self._folder.glob("*.vkey"))))
        except OSError:
            stamp = (0, ())
        if stamp != self._seen:
            keys, skipped, names = list(self._fixed), [], {k.name for k in self._fixed}
            for name in stamp[1]:
                try:
                    key = self._read_key(self._folder / name)
                except Exception as exc:  # noqa: BLE001 -- a bad file is skipped and said, never fatal
                    skipped.append(f"{name}: {exc}")
                    continue
                if key.name not in names:
                    keys.append(key)
                    names.add(key.name)
            self._keys, self.skipped, self._seen = keys, skipped, stamp
        return self._keys


def open_witness(signer: CosignatureSigner, logs: Sequence[Verifier] | LogKeys, state: WitnessState) -> Callable[[], Witness]:
    """The witness of ``logs`` with ``signer``'s key and ``state``'s checkpoints (made again when
    the logs change)."""
    keys = logs if isinstance(logs, LogKeys) else LogKeys(logs)
    made: dict[str, Any] = {}

    def witness() -> Witness:
        current = keys.current()
        if made.get("keys") is not current:
            made["keys"], made["witness"] = current, Witness(signer, current, state.store, evidence=state.keep_evidence)
        return made["witness"]

    return witness


def witness_app(witness: Callable[[], Witness]) -> Any:
    """The ASGI application (Starlette) of the witness ``witness()`` returns."""
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

    return Starlette(routes=[Route("/add-checkpoint", add_checkpoint, methods=["POST"])])


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (port 0: any free port) as (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8321; port 0 takes a free one)")
    return host.strip("[]"), int(port)


def serve(witness: Callable[[], Witness], host: str, port: int, *, ready: Callable[[str], None]) -> None:
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
    config = uvicorn.Config(witness_app(witness), log_level="warning", access_log=False, lifespan="off",
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
