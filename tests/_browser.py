"""Headless Chromium for the browser tests: Debian's ``chromium`` driven by Playwright.

Playwright's own browser download cannot work on these machines (no internet), so the tests
drive the system browser through ``executable_path``. ``make test`` installs Debian's
``chromium`` package when it is missing and the user is root; otherwise a browser test fails
with :data:`INSTALL_HINT` -- it never skips silently.

Chromium is started with the flags that keep it off the network on its own (no background
networking, component updates, sync or QUIC) and with a fresh profile.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

import pytest

INSTALL_HINT = (
    "the browser tests need Debian's chromium: run `apt-get install -y chromium` as root "
    "(`make test` does it when run as root)"
)
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    """The system chromium, or a test failure saying how to install it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(INSTALL_HINT)
    return path


@contextmanager
def browser_page(*, allow: tuple[str, ...] = (), webgl: bool = True) -> Iterator["object"]:
    """A fresh Playwright page in headless chromium, off the network.

    Args:
        allow: URL prefixes the page may load over http(s) (e.g. a test server on loopback);
            every other http(s) request is aborted, and so shows up as a failed request.
            ``file:`` and ``data:`` URLs always load.
        webgl: False: no software WebGL (``--disable-software-rasterizer``), for pages whose
            canvas (Prefect's run graph) nothing looks at -- drawn in software it keeps
            Chromium's GPU process busy all the time the page is open (about 0.4 CPU-s a second).

    Yields:
        The page; its ``failed_requests`` and ``console_errors`` lists collect what went wrong.
    """
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with tempfile.TemporaryDirectory(prefix="phsafe-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True,
            args=CHROMIUM_ARGS + ([] if webgl else ["--disable-software-rasterizer"]),
            viewport={"width": 1400, "height": 1000},
        )
        try:
            def route(r) -> None:  # noqa: ANN001 -- playwright's Route
                url = r.request.url
                if url.startswith(("http://", "https://")) and not url.startswith(allow):
                    r.abort()
                else:
                    r.continue_()

            context.route("**/*", route)
            page = context.pages[0] if context.pages else context.new_page()
            failed: list[str] = []
            errors: list[str] = []
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.failed_requests = failed  # type: ignore[attr-defined]
            page.console_errors = errors  # type: ignore[attr-defined]
            yield page
        finally:
            context.close()
