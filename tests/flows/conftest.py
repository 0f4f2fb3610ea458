"""Flow tests run against a temporary Prefect server (``prefect_test_harness``), one per worker."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(autouse=True)
def _fresh_logging(monkeypatch):
    """Each test configures structlog for its own log file (a process configures once)."""
    import flows._logging

    monkeypatch.setattr(flows._logging, "_configured", False)
    yield
    from phsafe import logs

    logs.configure(None)
