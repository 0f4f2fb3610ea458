"""Shared fixtures: paths to the production fixtures in ../shared."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Prefect reads its settings when first imported: point it at a throwaway home (its database and
# settings), off the network (no telemetry), before any test module imports it.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="phsafe-prefect-home-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.pop("PREFECT_API_URL", None)

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
REFERENCE = FIXTURES / "reference"
END_TO_END = REFERENCE / "end_to_end_test1"
US_CONFIG = FIXTURES / "production_config_us.json"
PR_CONFIG = FIXTURES / "production_config_pr.json"


@pytest.fixture
def end_to_end_dir() -> Path:
    if not END_TO_END.exists():
        pytest.fail(f"reference fixture missing: {END_TO_END}")
    return END_TO_END
