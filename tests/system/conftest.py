"""The system lane: the command line and the library end to end (processes allowed, no server).

Most of these modules build what their tests share once, in a module-scoped fixture (a release,
a ledger with its log and witnesses, a folder of reports): the tests of one module run on one
pytest-xdist worker (``make test`` runs ``--dist loadgroup``), so that each fixture is built once
instead of once per worker that gets one of its tests.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "system":
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
