"""Which tests draw unseeded randomness, and whether each one says what it does with it.

A test that asserts on random draws it does not seed can fail on correct code; the suite keeps
that chance written down (``tests/_false_alarms.py``). This plugin finds the tests that draw: it
records, per test, the unseeded randomness drawn in this process -- by the test's body or by any
fixture it uses (a module's release built once counts for every test that reads it) -- and fails
a test that drew and is neither

* registered in ``FALSE_ALARMS`` (a statistical test, with its false-alarm rate), nor
* declared as not asserting on what it drew: ``@pytest.mark.noise_not_asserted("why")`` on the
  test (or ``pytestmark`` for its module), or an entry of ``NOT_ASSERTED`` (a test, a class or a
  whole module), each with its reason.

What counts as a draw (in this process; a subprocess's draws are not seen):

* an OpenDP measurement invoked (``opendp.core.measurement_invoke``: every noise sample of
  :mod:`phsafe.noise`, and the tests' own OpenDP noise);
* numpy: ``default_rng()`` without a seed called from the project's code, or numpy's global
  generator advanced without ``numpy.random.seed`` (its state compared before and after);
* the standard library: ``random``'s module functions, or a ``random.Random()`` made without a
  seed, called from the project's code; ``secrets`` called from the project's code, except where
  it names things (:data:`IDENTIFIER_SITES`: temporary file names, a ledger's lineage key --
  identifiers no test can assert on statistically).

"The project's code" is a module of ``phsafe``, ``tests``, ``flows``, ``tasks``, ``deployments``,
``benchmarks`` or ``demo``, or a test module (``test_*``/``conftest``): libraries that use
randomness for their own ends (retries' jitter, temporary names) are not the test's draws.

Cheap by design: the samplers are wrapped once (lazily, when first imported), a wrapper adds a
counter increment and one frame lookup, and each test and fixture costs two dictionary copies
and a comparison of numpy's global state.

``PHSAFE_RANDOMNESS_REPORT=<file>`` turns failures into a report: one JSON line per test that
drew (its node id, what it drew, and whether it is registered or declared), for surveys.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import re
import sys
from collections import Counter
from typing import Any, Callable

import pytest

FIRST_PARTY = frozenset({"phsafe", "tests", "flows", "tasks", "deployments", "benchmarks", "demo"})
IDENTIFIER_SITES = {
    "phsafe.durable": "temporary file names",
    "phsafe.ledger.keys": "a ledger's lineage key",
}
MARKER = "noise_not_asserted"
REPORT_ENV = "PHSAFE_RANDOMNESS_REPORT"

Draws = Counter  # (kind, where) -> times

_draws: Draws = Counter()
"""Every draw seen in this process, by kind and site (only ever increases)."""
_seeded: set[str] = set()
"""Generators seeded explicitly during the current test ("numpy global", "random")."""


# --------------------------------------------------------------------------------------------
# What the samplers record
# --------------------------------------------------------------------------------------------


def _module_of(depth: int) -> str:
    return sys._getframe(depth + 1).f_globals.get("__name__", "")


def _first_party(module: str) -> bool:
    if module == __name__:
        return False  # numpy's SeedSequence draws its entropy through the wrapped secrets.randbits
    top, _, _ = module.partition(".")
    last = module.rpartition(".")[2]
    return top in FIRST_PARTY or last.startswith("test_") or last == "conftest"


def _project_caller(skip: int = 2, limit: int = 30) -> str:
    """The nearest module of the project's code on the stack, or ''."""
    frame = sys._getframe(skip)
    for _ in range(limit):
        if frame is None:
            break
        name = frame.f_globals.get("__name__", "")
        if _first_party(name):
            return name
        frame = frame.f_back
    return ""


def _patch_opendp(core: Any) -> None:
    original = core.measurement_invoke
    if getattr(original, "_phsafe_counted", False):
        return

    def measurement_invoke(measurement, arg):  # type: ignore[no-untyped-def]
        _draws[("OpenDP noise", _project_caller())] += 1
        return original(measurement, arg)

    measurement_invoke._phsafe_counted = True  # type: ignore[attr-defined]
    core.measurement_invoke = measurement_invoke


def _patch_numpy(random: Any) -> None:
    original = random.default_rng
    if getattr(original, "_phsafe_counted", False):
        return

    def default_rng(seed=None):  # type: ignore[no-untyped-def]
        if seed is None:
            caller = _module_of(1)
            if _first_party(caller):
                _draws[("numpy default_rng() without a seed", caller)] += 1
        return original(seed)

    def seed(seed=None):  # type: ignore[no-untyped-def]
        if seed is not None:
            _seeded.add("numpy global")
        return original_seed(seed)

    original_seed = random.seed
    default_rng._phsafe_counted = True  # type: ignore[attr-defined]
    default_rng.__doc__ = original.__doc__
    random.default_rng = default_rng
    random.seed = seed
    _numpy_global.update(at_import=_numpy_state(random))


_numpy_global: dict[str, Any] = {}


def _numpy_state(random: Any) -> tuple[int, bytes] | None:
    try:
        state = random.mtrand._rand.get_state(legacy=False)["state"]
        return int(state["pos"]), state["key"].tobytes()
    except Exception:  # noqa: BLE001 -- a numpy without the legacy global generator
        return None


def _patch_stdlib() -> None:
    import random
    import secrets

    if getattr(random.random, "_phsafe_counted", False):
        return

    def counted(kind: str, function: Callable, module: Any, name: str) -> None:
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            caller = _module_of(1)
            if _first_party(caller) and caller not in IDENTIFIER_SITES and kind not in _seeded:
                _draws[(kind, caller)] += 1
            return function(*args, **kwargs)

        wrapper._phsafe_counted = True  # type: ignore[attr-defined]
        wrapper.__doc__ = function.__doc__
        setattr(module, name, wrapper)

    for name in ("random", "uniform", "triangular", "randint", "randrange", "choice", "choices", "shuffle",
                 "sample", "gauss", "normalvariate", "lognormvariate", "expovariate", "vonmisesvariate",
                 "gammavariate", "betavariate", "paretovariate", "weibullvariate", "getrandbits", "randbytes",
                 "binomialvariate"):
        if hasattr(random, name):
            counted("random", getattr(random, name), random, name)
    for name in ("token_bytes", "token_hex", "token_urlsafe", "randbits", "randbelow", "choice"):
        counted("secrets", getattr(secrets, name), secrets, name)

    original_seed = random.seed

    def seed(a=None, version=2):  # type: ignore[no-untyped-def]
        if a is not None and _first_party(_module_of(1)):
            _seeded.add("random")
        return original_seed(a, version)

    random.seed = seed
    instance_seed = random.Random.seed

    def instance_seed_counted(self, a=None, version=2):  # type: ignore[no-untyped-def]
        if a is None and type(self) is random.Random:  # Random() without a seed: from os.urandom
            caller = _module_of(2) if sys._getframe(1).f_code.co_name == "__init__" else _module_of(1)
            if _first_party(caller):
                _draws[("random.Random() without a seed", caller)] += 1
        return instance_seed(self, a, version)

    random.Random.seed = instance_seed_counted


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a module right after it is imported (so that importing the samplers is left to
    the tests that need them) -- again whenever it is imported anew (a test that restores
    ``sys.modules``, as pytester does, makes the next import a fresh, unpatched module)."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):  # type: ignore[no-untyped-def]
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    """Wrap the samplers (now, or when first imported). Idempotent."""
    _patch_stdlib()
    patches = {"opendp.core": _patch_opendp, "numpy.random": _patch_numpy}
    for name, patch in patches.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(patches))


# --------------------------------------------------------------------------------------------
# Windows: what a test or a fixture drew
# --------------------------------------------------------------------------------------------


class _Window:
    def __init__(self) -> None:
        self.before = _draws.copy()
        random = sys.modules.get("numpy.random")
        self.numpy_before = _numpy_state(random) if random is not None and _numpy_global else None

    def drawn(self) -> Draws:
        out = _draws - self.before
        random = sys.modules.get("numpy.random")
        if random is not None and _numpy_global:
            reference = self.numpy_before if self.numpy_before is not None else _numpy_global["at_import"]
            if _numpy_state(random) != reference and "numpy global" not in _seeded:
                out[("numpy's global generator (numpy.random.<function>)", "")] += 1
        return out


_fixture_draws: dict[Any, Draws] = {}


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):  # type: ignore[no-untyped-def]
    window = _Window()
    try:
        return (yield)
    finally:
        drawn = window.drawn()
        if drawn:
            _fixture_draws[fixturedef] = _fixture_draws.get(fixturedef, Counter()) + drawn


@pytest.hookimpl
def pytest_fixture_post_finalizer(fixturedef, request):  # type: ignore[no-untyped-def]
    _fixture_draws.pop(fixturedef, None)


def _fixtures_drawn(item: pytest.Item) -> Draws:
    info = getattr(item, "_fixtureinfo", None)
    out: Draws = Counter()
    if info is None:
        return out
    for name in item.fixturenames:  # type: ignore[attr-defined]
        for fixturedef in info.name2fixturedefs.get(name, ()):
            out += _fixture_draws.get(fixturedef, Counter())
    return out


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):  # type: ignore[no-untyped-def]
    _seeded.clear()
    for fixturedef in [f for f in _fixture_draws if f.scope == "function"]:
        del _fixture_draws[fixturedef]  # set up again for this test
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):  # type: ignore[no-untyped-def]
    window = _Window()
    result = yield  # a failing test fails on its own; this check runs only after a pass
    drawn = window.drawn() + _fixtures_drawn(item)
    if drawn:
        _check(item, drawn)
    return result


# --------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------


def registry_key(nodeid: str) -> str:
    """A test's key in the registry: its node id without parameters."""
    return re.sub(r"\[.*\]$", "", nodeid)


def declaration(item: pytest.Item) -> str | None:
    """Why the test does not assert on what it draws, if it says so; else None."""
    from tests._false_alarms import NOT_ASSERTED

    marker = item.get_closest_marker(MARKER)
    if marker is not None:
        reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
        if not str(reason).strip():
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER} needs a reason")
        return str(reason)
    key = registry_key(item.nodeid)
    parts = key.split("::")
    for i in range(len(parts), 0, -1):  # the test, its class, its module
        reason = NOT_ASSERTED.get("::".join(parts[:i]))
        if reason:
            return reason
    return None


def describe(drawn: Draws) -> str:
    return "; ".join(f"{kind} x{n}" + (f" ({where})" if where else "") for (kind, where), n in sorted(drawn.items()))


def _check(item: pytest.Item, drawn: Draws) -> None:
    from tests._false_alarms import FALSE_ALARMS

    key = registry_key(item.nodeid)
    registered = key in FALSE_ALARMS
    declared = None if registered else declaration(item)
    report = os.environ.get(REPORT_ENV)
    if report:
        line = json.dumps({"test": item.nodeid, "drawn": describe(drawn), "registered": registered,
                           "declared": declared})
        with open(report, "a", encoding="utf-8") as out:
            out.write(line + "\n")
        return
    if registered or declared:
        return
    pytest.fail(
        f"{key} drew unseeded randomness in this process ({describe(drawn)}) but says nothing about it. "
        "Seed what it draws if it does not test randomness; if it asserts on the draws, state its false-alarm "
        "rate in a comment (# false-alarm rate: X per run -- how computed) and register it in "
        f"tests/_false_alarms.py (FALSE_ALARMS); if it never asserts on them, declare it: "
        f"@pytest.mark.{MARKER}(\"why\") or an entry of NOT_ASSERTED there.", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(reason): the test draws unseeded randomness (noise, a truncation key, an "
        "unseeded generator) but asserts nothing that depends on the values drawn (tests/_false_alarm_plugin.py)")


install()
