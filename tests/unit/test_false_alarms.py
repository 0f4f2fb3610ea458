"""The registry of statistical tests (``tests/_false_alarms.py``) is the suite's truth about its
false alarms: every registered test exists and states its rate where it asserts, every rate
stated in a test is registered, the total stays within ``SUITE_LIMIT``, and -- through the
plugin (``tests/_false_alarm_plugin.py``) -- a test that draws unseeded randomness without
saying what it does with it fails. The last is shown on a pytest session of its own.
"""

from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from pathlib import Path

import pytest

from tests._false_alarms import FALSE_ALARMS, METHODS, NOT_ASSERTED, SUITE_LIMIT

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
COMMENT = re.compile(r"#\s*false-alarm rate:\s*(?:<=?\s*)?([0-9][0-9.]*(?:e[-+]?[0-9]+)?)\s+per run\b", re.I)


def _test_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Node id (without parameters) -> first and last line of each test function of a module
    (its decorators included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = path.relative_to(REPO).as_posix()
    spans = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                spans[f"{prefix}::{node.name}"] = (first, node.end_lineno or node.lineno)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                visit(node.body, f"{prefix}::{node.name}")

    visit(tree.body, module)
    return spans


def _comments(path: Path) -> list[tuple[int, float, str]]:
    """(line, rate, text) of every false-alarm comment of a file."""
    out = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type == tokenize.COMMENT and "false-alarm rate" in token.string.lower():
            match = COMMENT.search(token.string)
            out.append((token.start[0], float(match.group(1)) if match else math.nan, token.string))
    return out


def _test_files() -> list[Path]:
    return sorted(p for p in (REPO / "tests").rglob("*.py") if "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def stated() -> dict[str, list[tuple[int, float, str]]]:
    """Test key -> the false-alarm comments inside it; comments outside any test under ''."""
    out: dict[str, list[tuple[int, float, str]]] = {}
    for path in _test_files():
        comments = _comments(path)
        if not comments:
            continue
        spans = _test_spans(path)
        for line, rate, text in comments:
            owner = next((key for key, (a, b) in spans.items() if a <= line <= b), "")
            out.setdefault(owner, []).append((line, rate, f"{path.relative_to(REPO)}:{line}: {text}"))
    return out


def test_every_registered_test_exists_and_states_its_rate(stated) -> None:  # type: ignore[no-untyped-def]
    problems = []
    for key, entry in sorted(FALSE_ALARMS.items()):
        module = REPO / key.split("::")[0]
        if not module.is_file() or key not in _test_spans(module):
            problems.append(f"{key}: no such test")
            continue
        rates = [rate for _, rate, _ in stated.get(key, [])]
        if not rates:
            problems.append(f"{key}: registered, but no '# false-alarm rate: X per run -- how' comment in the test")
        elif not math.isclose(sum(rates), entry.rate, rel_tol=0.05):
            problems.append(f"{key}: the comments state {sum(rates):.2g} per run, the registry {entry.rate:.2g}")
        if not (0 <= entry.rate < 1) or entry.method not in (*METHODS, None) or len(entry.derivation) < 40:
            problems.append(f"{key}: a rate in [0, 1), a method among {METHODS} and a derivation that says how")
    assert not problems, "\n".join(problems)


def test_every_stated_rate_is_registered(stated) -> None:  # type: ignore[no-untyped-def]
    problems = [f"{where}\n  not inside a test function: state the rate in the test that asserts"
                for _, _, where in stated.get("", [])]
    for key, comments in stated.items():
        for _, rate, where in comments:
            if key and key not in FALSE_ALARMS:
                problems.append(f"{where}\n  {key} states a false-alarm rate but has no entry in tests/_false_alarms.py")
            if math.isnan(rate):
                problems.append(f"{where}\n  the form is '# false-alarm rate: 2.0e-06 per run -- how it was computed'")
    assert not problems, "\n".join(problems)


def test_the_suites_false_alarm_rate_is_within_its_limit() -> None:
    total = sum(entry.rate for entry in FALSE_ALARMS.values())
    assert total <= SUITE_LIMIT, f"the suite fails a correct run with probability up to {total:.2g} (limit {SUITE_LIMIT})"
    assert list(FALSE_ALARMS) == sorted(FALSE_ALARMS), "keep the registry sorted by key"


def test_every_declaration_names_a_test_or_module_and_says_why() -> None:
    problems = []
    for key, reason in sorted(NOT_ASSERTED.items()):
        module = REPO / key.split("::")[0]
        if not module.is_file():
            problems.append(f"{key}: no such module")
        elif "::" in key and not any(k == key or k.startswith(key + "::") for k in _test_spans(module)):
            problems.append(f"{key}: no such test or class")
        if len(reason.strip()) < 20:
            problems.append(f"{key}: say why its assertions do not depend on the values drawn")
        if key in FALSE_ALARMS:
            problems.append(f"{key}: both registered as statistical and declared as not asserting on its draws")
    assert not problems, "\n".join(problems)
    assert list(NOT_ASSERTED) == sorted(NOT_ASSERTED), "keep the declarations sorted by key"


def test_the_plugin_is_active(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("tests._false_alarm_plugin")


# --------------------------------------------------------------------------------------------
# The plugin on a session of its own: a new statistical test without an entry fails
# --------------------------------------------------------------------------------------------

INNER = '''
import numpy as np
import pytest


def opendp_noise(size):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    m = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64"), scale=3.0)
    return np.asarray(m([0] * size))


@pytest.fixture(scope="module")
def release():
    return opendp_noise(50)  # a module's release, built once


def test_new_statistical_test():
    assert abs(opendp_noise(400).std() - 3.0) < 1.0


def test_unseeded_generator():
    assert np.random.default_rng().normal(size=100).std() > 0.5


def test_numpy_global_generator():
    assert np.random.normal(size=100).std() > 0.5


def test_secrets_in_a_test():
    import secrets

    assert secrets.randbelow(10) < 10


def test_reads_a_module_release(release):
    assert release.size == 50


@pytest.mark.noise_not_asserted("checks the shape of the noise only, never its values")
def test_declared():
    assert opendp_noise(10).shape == (10,)


def test_seeded():
    assert np.random.default_rng(1).normal(size=10).shape == (10,)
    np.random.seed(3)
    assert np.random.normal(size=10).shape == (10,)


def test_registered():
    assert opendp_noise(5).shape == (5,)
'''


@pytest.mark.noise_not_asserted("its inner session's tests draw; it asserts on the plugin's verdicts only")
def test_a_new_statistical_test_without_an_entry_fails(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import _false_alarms
    from tests._false_alarm_plugin import REPORT_ENV, registry_key

    monkeypatch.delenv(REPORT_ENV, raising=False)  # (a survey's report mode would turn the failures into lines)

    pytester.makepyfile(test_inner=INNER)
    registered = registry_key("test_inner.py::test_registered")
    monkeypatch.setitem(_false_alarms.FALSE_ALARMS, registered,
                        _false_alarms.FalseAlarm(1e-9, "a registered test, for this demonstration only", "exact"))
    result = pytester.runpytest_inprocess("-p", "tests._false_alarm_plugin", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=3, failed=5)
    text = "\n".join(result.outlines)
    for name, what in (("test_new_statistical_test", "OpenDP noise"),
                       ("test_unseeded_generator", "numpy default_rng() without a seed"),
                       ("test_numpy_global_generator", "numpy's global generator"),
                       ("test_secrets_in_a_test", "secrets"),
                       ("test_reads_a_module_release", "OpenDP noise")):
        assert f"test_inner.py::{name} drew unseeded randomness in this process ({what}" in text, name
    assert "register it in tests/_false_alarms.py" in text and "noise_not_asserted" in text
    for name in ("test_declared", "test_seeded", "test_registered"):
        assert f"PASSED test_inner.py::{name}" in text, name
