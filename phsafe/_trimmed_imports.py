"""Great Expectations' import without what the validation suites never use, for processes that
never run Prefect -- in a module of its own, importing nothing but the standard library, so that
the ``phsafe`` command can arrange it before anything else is imported.

Great Expectations imports SciPy's statistics and Altair for expectations the suites never use
(distribution tests, the KL divergence's chart) -- about a third of its import -- and its
SQL back end is optional to it (it checks whether SQLAlchemy can be imported). After
:func:`trim_imports`, :data:`LAZY_MODULES` load on first attribute access and
:data:`ABSENT_MODULES` read as not installed. Prefect needs SQLAlchemy, so a process that may run
Prefect (a flow run, a test runner) must never call it; the processes that do: the pass's worker
processes, the validation's second process, and the installed ``phsafe`` command
(:func:`phsafe.cli.console`). The suites' results are the same either way
(``tests/unit/test_validation.py``, ``tests/system/test_cli_startup.py``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from typing import Any

LAZY_MODULES = ("scipy.stats", "altair")
"""Loaded only when an attribute of theirs is used."""
ABSENT_MODULES = ("sqlalchemy",)
"""Read as not installed."""

_lock = threading.Lock()


class _LazyFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`LAZY_MODULES` as the other finders do, with a loader that runs the module on
    first attribute access (:class:`importlib.util.LazyLoader`)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in LAZY_MODULES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = importlib.util.LazyLoader(spec.loader)
                return spec
        return None


def trim_imports() -> None:
    """Trim Great Expectations' import in this process (see the module's docstring). Call it
    before anything imports Great Expectations; afterwards, or a second time, it does nothing."""
    with _lock:
        if "great_expectations" in sys.modules or any(isinstance(f, _LazyFinder) for f in sys.meta_path):
            return
        for name in ABSENT_MODULES:
            if name not in sys.modules:
                sys.modules[name] = None  # type: ignore[assignment] -- "import name" raises ImportError
        if not any(name in sys.modules for name in LAZY_MODULES):
            sys.meta_path.insert(0, _LazyFinder())
