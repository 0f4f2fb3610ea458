"""Shared fixtures: paths to the production fixtures in ../shared."""

from __future__ import annotations

from pathlib import Path

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
