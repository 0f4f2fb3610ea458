"""Shared fixtures: paths to the production fixtures in ../shared."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# The suite's processes keep what they compile (in __pycache__ folders, which git ignores): with
# PYTHONDONTWRITEBYTECODE set in the environment, each test worker rewrote and compiled every test
# module again (about 4 CPU-s a worker for the unit lane alone), and every subprocess the package's
# sources -- the same work, run after run.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Prefect reads its settings when first imported: point it at a throwaway home (its database and
# settings), off the network (no telemetry), before any test module imports it.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="phsafe-prefect-home-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.pop("PREFECT_API_URL", None)

import pytest

pytest_plugins = ["tests._cpu_report", "tests._false_alarm_plugin"]  # unseeded draws must be registered or declared

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
REFERENCE = FIXTURES / "reference"
END_TO_END = REFERENCE / "end_to_end_test1"
US_CONFIG = FIXTURES / "production_config_us.json"
PR_CONFIG = FIXTURES / "production_config_pr.json"

# `make test` runs --dist loadscope --no-loadscope-reorder: a free worker takes the next module in
# collection order. The modules that take minutes are collected first, so that none of them
# starts near the end and leaves the other worker idle (xdist's default order, by number of
# tests, started the one-test end-to-end module 25 minutes into a 34-minute run). Costliest
# first, as measured; the rest keep their order.
LONGEST_FIRST = (
    "tests/flows/test_server_e2e.py",
    "tests/system/test_accuracy.py",
    "tests/system/test_recovery.py",
    "tests/system/test_bad_inputs.py",
    "tests/system/test_reliability.py",
    "tests/system/test_public_log.py",
    "tests/flows/test_flows.py",
    "tests/flows/test_dask.py",
    "tests/flows/test_release_path.py",
    "tests/flows/test_rehearsal.py",
    "tests/system/test_command_line_refusals.py",
    "tests/system/test_reports_offline.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(LONGEST_FIRST)))  # stable


@pytest.fixture
def end_to_end_dir() -> Path:
    if not END_TO_END.exists():
        pytest.fail(f"reference fixture missing: {END_TO_END}")
    return END_TO_END
