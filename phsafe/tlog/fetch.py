"""I/O for outsiders: a published log's files and a witness's evidence, from a folder or over HTTP.

A published log (:mod:`.layout`) is static files; an outsider reads them from a copy (a folder)
or from any web server, with plain ``GET`` requests -- ``<URL>/checkpoint`` first, then
``<URL>/entries`` (the writer appends entries before it replaces the checkpoint, so entries read
after a checkpoint cover it). A witness serves the evidence of equivocation it kept
(:mod:`.witness_server`): ``GET <URL>/evidence`` lists the files, ``GET <URL>/evidence/<name>``
gives one. Nothing here verifies anything: the callers do, with the keys they trust.

Every failure is a :class:`~phsafe.errors.StoreError` naming what could not be read and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from phsafe.errors import StoreError
from phsafe.tlog.layout import CHECKPOINT_FILE, ENTRIES_FILE
from phsafe.tlog.witness_server import EVIDENCE_PATH

FETCH_TIMEOUT_SECONDS = 30.0
"""How long one GET may take."""
MAX_FETCH_BYTES = 256 << 20
"""The largest file read from a server (an entries file of a very long log fits many times)."""


def is_url(source: str | Path) -> bool:
    """Whether ``source`` is an http(s) URL rather than a path."""
    return urlsplit(str(source)).scheme in ("http", "https")


def _get(url: str, transport: Any = None) -> bytes:
    import httpx

    try:
        with httpx.Client(timeout=FETCH_TIMEOUT_SECONDS, transport=transport, trust_env=False,
                          follow_redirects=True) as client:
            with client.stream("GET", url) as reply:
                if reply.status_code != 200:
                    raise StoreError(f"GET {url} answered HTTP {reply.status_code}")
                chunks, size = [], 0
                for chunk in reply.iter_bytes():
                    size += len(chunk)
                    if size > MAX_FETCH_BYTES:
                        raise StoreError(f"GET {url} sent over {MAX_FETCH_BYTES} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
    except httpx.TimeoutException:
        raise StoreError(f"GET {url}: no answer within {FETCH_TIMEOUT_SECONDS:g} s") from None
    except httpx.HTTPError as exc:
        raise StoreError(f"GET {url}: {network_reason(exc)}") from None


def network_reason(exc: BaseException) -> str:
    """What went wrong with a request, in a few words: the operating system's reason where there
    is one (``connection refused``), else the error's first line (at most 200 characters)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def fetch_published_log(source: str | Path, *, transport: Any = None) -> tuple[bytes, bytes]:
    """The ``checkpoint`` and ``entries`` bytes of a published log: a folder, or an http(s) URL
    of the folder as a web server serves it (checkpoint first)."""
    if is_url(source):
        base = str(source).rstrip("/")
        return _get(f"{base}/{CHECKPOINT_FILE}", transport), _get(f"{base}/{ENTRIES_FILE}", transport)
    folder = Path(source)
    try:
        return (folder / CHECKPOINT_FILE).read_bytes(), (folder / ENTRIES_FILE).read_bytes()
    except OSError as exc:
        raise StoreError(f"cannot read the published log in {folder}: {exc.strerror or exc}") from None


def fetch_evidence(source: str | Path, *, transport: Any = None) -> list[tuple[str, bytes]]:
    """Evidence documents and where each came from: an evidence file, a folder of them, or the
    URL of a witness (every file it serves)."""
    if is_url(source):
        base = str(source).rstrip("/")
        listing = _get(f"{base}{EVIDENCE_PATH}", transport).decode("utf-8", "replace")
        names = [line.strip() for line in listing.splitlines() if line.strip()]
        return [(f"{base}{EVIDENCE_PATH}/{name}", _get(f"{base}{EVIDENCE_PATH}/{quote(name)}", transport))
                for name in names]
    path = Path(source)
    try:
        if path.is_dir():
            return [(str(p), p.read_bytes()) for p in sorted(path.iterdir()) if p.is_file()]
        return [(str(path), path.read_bytes())]
    except OSError as exc:
        raise StoreError(f"cannot read the evidence {path}: {exc.strerror or exc}") from None
