"""The one module that imports Great Expectations (pinned in pyproject.toml).

Great Expectations is heavy (seconds to import) and its API churns between releases, so it stays
behind this small surface: :func:`run` evaluates the rules of one suite on one pandas frame and
returns value-free counts. It is
imported lazily -- ``phsafe --help`` never pays for it -- with its analytics and progress bars
off and an ephemeral (in-memory) context: nothing is written anywhere by Great Expectations.

Results are requested as verdicts only (``BOOLEAN_ONLY``) or as counts (``SUMMARY`` with no
partial unexpected list, no unexpected rows and no index query), and only counts are kept from
them: an expectation result can otherwise carry values of the rows it rejects
(``observed_value``, ``partial_unexpected_list``, ...). Exceptions raised by Great Expectations
are reduced to their class name, because their messages may quote data.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

# trim_imports lives apart (standard library only: the ``phsafe`` command calls it before it
# imports anything else) and is named here too, beside the import it trims.
from phsafe._trimmed_imports import ABSENT_MODULES, LAZY_MODULES, trim_imports  # noqa: F401
from phsafe.validation._report import safe_result_counts
from phsafe.validation._suites import Rule, Suite, load_suite, subsuite_json

# Verdicts only: no counts, no values.
VERDICT_FORMAT: dict[str, Any] = {"result_format": "BOOLEAN_ONLY"}
# Counts, and no value: an empty partial list, no unexpected rows, no index query.
COUNTS_FORMAT: dict[str, Any] = {
    "result_format": "SUMMARY",
    "partial_unexpected_count": 0,
    "include_unexpected_rows": False,
    "return_unexpected_index_query": False,
}


class RuleResult(NamedTuple):
    rule_id: str
    success: bool
    counts: dict[str, Any]
    raised: str | None  # exception class name, never its message


_lock = threading.Lock()
_state: dict[str, Any] = {}


def import_gx() -> dict[str, Any]:
    """Import Great Expectations once, configured for a batch pipeline (thread-safe)."""
    with _lock:
        # Before the import: analytics read this variable when the package loads. Set on every
        # call, not only the first: something may have restored the environment since (a test's
        # patched environment), and processes started from this one inherit it.
        os.environ["GX_ANALYTICS_ENABLED"] = "False"
        if _state:
            return _state
        # Great Expectations' own log lines may quote data from failed metric computations.
        logging.getLogger("great_expectations").setLevel(logging.CRITICAL)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import great_expectations as gx
            from great_expectations.data_context.types.base import (
                DataContextConfig,
                InMemoryStoreBackendDefaults,
                ProgressBarsConfig,
            )
            from great_expectations.execution_engine import pandas_execution_engine

            # GX fingerprints every pandas batch below this size by hashing all of its values
            # (an MD5 of the confidential data, written into the result's metadata, and a full
            # extra pass over the batch). Fingerprinting is off: threshold 0 -- and a release
            # that renamed the setting must not silently turn it back on.
            if not hasattr(pandas_execution_engine, "HASH_THRESHOLD"):
                raise RuntimeError("great_expectations: HASH_THRESHOLD is gone; batch fingerprints "
                                   "would hash confidential data (pin the reviewed version)")
            pandas_execution_engine.HASH_THRESHOLD = 0

            context = gx.get_context(
                mode="ephemeral",
                project_config=DataContextConfig(
                    analytics_enabled=False,
                    progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
                    store_backend_defaults=InMemoryStoreBackendDefaults(),
                ),
            )
            asset = context.data_sources.add_pandas("phsafe").add_dataframe_asset("frame")
            memoized = _memoize_within_a_run(gx)
            _state.update(
                gx=gx,
                memoized=memoized,
                context=context,
                batch_definition=asset.add_batch_definition_whole_dataframe("whole"),
                suites={},
            )
        return _state


PINNED_VERSION = "1.24.1"
"""The Great Expectations release whose internals :func:`_memoize_within_a_run` was reviewed
against (pyproject.toml pins it); with any other, Great Expectations runs unchanged."""


class _RunMemo(threading.local):
    """What one :func:`run` (one ``batch.validate``) of this thread may reuse: None outside a run.

    Attributes:
        configurations: ``id(expectation)`` -> (the expectation, its configuration).
        expectations: ``id(configuration)`` -> (the configuration, its expectation object).
        filtered: (``id(frame)``, the row condition as JSON) -> (the frame, its filtered rows).
        mismatches: When a list (a test's check), every reuse is compared with what Great
            Expectations builds afresh, and a difference is appended instead of trusted.
        checked: The number of reuses so compared.
    """

    configurations: dict[int, tuple[Any, Any]] | None = None
    expectations: dict[int, tuple[Any, Any]] | None = None
    filtered: dict[tuple[int, str], tuple[Any, Any]] | None = None
    mismatches: list[str] | None = None
    checked: int = 0


_memo = _RunMemo()
REUSE_WITHIN_A_RUN = True
"""Whether :func:`run` lets Great Expectations reuse what :func:`_memoize_within_a_run` keeps
(False: Great Expectations' own behaviour, for a comparison)."""


def _memoize_within_a_run(gx: Any) -> bool:
    """Let Great Expectations reuse, within one ``batch.validate``, three things it rebuilds from
    scratch many times per expectation (measured: about 60 % of its CPU in validating an input).

    * ``Expectation.configuration`` is a property that serialises the expectation (a pydantic
      ``dict()``) and builds a new ``ExpectationConfiguration`` on every read -- some 70 reads per
      expectation while its metrics are planned. Within a run the expectation objects are never
      changed, so the first read is kept (per object, holding it: an ``id`` is never reused).
    * ``ExpectationConfiguration.to_domain_obj`` validates the configuration into a new
      expectation object (pydantic) each time -- once per metric of the expectation, and each new
      object builds its configuration again. The first object is kept per configuration object.
    * A rule's row condition is applied (``DataFrame.query``: a parse of the condition each time)
      once per metric of the rule -- three or more times for the same rows. The first filtered
      frame is kept per (batch frame, condition).

    Outside :func:`run` all three behave exactly as Great Expectations' own. Returns whether it applied
    (only with :data:`PINNED_VERSION`); ``tests/unit/test_validation.py`` checks every reuse against a
    fresh build and the results against an unmemoized run.
    """
    if getattr(gx, "__version__", None) != PINNED_VERSION:
        return False
    from great_expectations.execution_engine.pandas_execution_engine import PandasExecutionEngine
    from great_expectations.expectations.expectation import Expectation
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    build = Expectation.configuration.fget
    validate_into = ExpectationConfiguration.to_domain_obj
    apply_condition = PandasExecutionEngine._apply_row_condition_filter

    def configuration(self: Any) -> Any:
        kept = _memo.configurations
        if kept is None:
            return build(self)
        hit = kept.get(id(self))
        if hit is not None and hit[0] is self:
            _memo.checked += _memo.mismatches is not None
            if _memo.mismatches is not None and build(self) != hit[1]:
                _memo.mismatches.append(f"configuration of {type(self).__name__}")
                return build(self)
            return hit[1]
        value = build(self)
        kept[id(self)] = (self, value)
        return value

    def to_domain_obj(self: Any) -> Any:
        kept = _memo.expectations
        if kept is None:
            return validate_into(self)
        hit = kept.get(id(self))
        if hit is not None and hit[0] is self:
            _memo.checked += _memo.mismatches is not None
            if _memo.mismatches is not None and validate_into(self) != hit[1]:
                _memo.mismatches.append(f"expectation of {self.type}")
                return validate_into(self)
            return hit[1]
        value = validate_into(self)
        kept[id(self)] = (self, value)
        return value

    def row_condition_filter(self: Any, data: Any, row_condition: Any, domain_kwargs: dict) -> Any:
        kept = _memo.filtered
        if kept is None or not isinstance(row_condition, (dict, str)):
            return apply_condition(self, data, row_condition, domain_kwargs)
        try:
            condition = json.dumps([row_condition, domain_kwargs.get("condition_parser")], sort_keys=True)
        except (TypeError, ValueError):
            return apply_condition(self, data, row_condition, domain_kwargs)
        hit = kept.get((id(data), condition))
        if hit is not None and hit[0] is data:
            _memo.checked += _memo.mismatches is not None
            if _memo.mismatches is not None and not apply_condition(self, data, row_condition,
                                                                      domain_kwargs).equals(hit[1]):
                _memo.mismatches.append("rows of a row condition")
                return apply_condition(self, data, row_condition, domain_kwargs)
            return hit[1]
        value = apply_condition(self, data, row_condition, domain_kwargs)
        kept[(id(data), condition)] = (data, value)
        return value

    configuration.__doc__ = build.__doc__
    to_domain_obj.__doc__ = validate_into.__doc__
    ExpectationConfiguration.to_domain_obj = to_domain_obj  # type: ignore[method-assign]
    Expectation.configuration = property(configuration)  # type: ignore[method-assign,assignment]
    PandasExecutionEngine._apply_row_condition_filter = row_condition_filter  # type: ignore[method-assign]
    return True


def prewarm() -> threading.Thread:
    """Start importing Great Expectations in the background.

    The import is mostly Python bytecode while reading the input files is mostly pyarrow work
    that releases the GIL, so the two overlap.
    """
    thread = threading.Thread(target=import_gx, name="phsafe-gx-import", daemon=True)
    thread.start()
    return thread


def _suite(suite: Suite, frame: str, rules: Sequence[Rule]) -> Any:
    state = import_gx()
    key = (suite.name, frame, tuple(r.rule_id for r in rules))
    cached = state["suites"].get(key)
    if cached is None:
        raw = subsuite_json(suite, rules)
        raw["name"] = f"{suite.name}.{frame}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cached = state["gx"].ExpectationSuite(**raw)
        if len(cached.expectations) != len(rules):
            # GX drops an expectation it cannot parse (and only logs it): never run a suite
            # with a silently missing rule.
            raise ValueError(f"suite {suite.name}: an expectation of frame {frame} is not valid for this GX version")
        state["suites"][key] = cached
    return cached


def run(
    suite: Suite,
    frame: str,
    data: Any,
    rules: Sequence[Rule],
    parameters: Mapping[str, Any] | None = None,
    *,
    counts: bool = True,
) -> list[RuleResult]:
    """Evaluate ``rules`` (all of ``suite``'s frame ``frame``) on the pandas frame ``data``.

    Args:
        counts: Ask for counts (``SUMMARY``); otherwise for verdicts only (``BOOLEAN_ONLY``).

    Returns:
        One value-free result per rule.
    """
    if not rules:
        return []
    state = import_gx()
    gx_suite = _suite(suite, frame, rules)
    if REUSE_WITHIN_A_RUN:
        _memo.configurations, _memo.expectations, _memo.filtered = {}, {}, {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batch = state["batch_definition"].get_batch(batch_parameters={"dataframe": data})
            result = batch.validate(
                gx_suite,
                result_format=COUNTS_FORMAT if counts else VERDICT_FORMAT,
                expectation_parameters=dict(parameters or {}),
            )
    except Exception as exc:  # noqa: BLE001 -- reduced to its class: the message may hold data
        return [RuleResult(r.rule_id, False, {}, type(exc).__name__) for r in rules]
    finally:
        _memo.configurations = _memo.expectations = _memo.filtered = None
    out: dict[str, RuleResult] = {}
    for r in result.results:
        config = r.expectation_config
        rule_id = (config.meta or {}).get("rule_id")
        info = r.exception_info or {}
        # exception_info is keyed by metric when several metrics failed; find any raise.
        raised = None
        if isinstance(info, dict):
            entries = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
            if any(e.get("raised_exception") for e in entries):
                raised = "ExpectationError"
        out[rule_id] = RuleResult(rule_id, bool(r.success), safe_result_counts(r.result), raised)
    missing = [r for r in rules if r.rule_id not in out]
    for r in missing:
        out[r.rule_id] = RuleResult(r.rule_id, False, {}, "NotEvaluated")
    return [out[r.rule_id] for r in rules]


@dataclass(frozen=True)
class Job:
    """One evaluation: the rules ``rule_ids`` of ``suite``'s ``frame`` on ``data``.

    Attributes:
        data: The frame: pandas, or its columns as classes (:class:`~phsafe.validation._frames.
            FrameColumn` s, turned into values where the job is evaluated). With ``weights``, its
            rows are distinct combinations of values
            and ``weights[i]`` is the number of rows row ``i`` stands for.
        weights: Rows each frame row stands for (int64), or None (one each).
        parameters: Suite parameters (``$PARAMETER`` values).
        column_weights: Instead of ``weights``, for rules that each read one column: the frame's
            columns are independent lists of distinct values -- column ``c``'s are its first
            ``len(column_weights[c])`` rows, repeated to the frame's length (a repeated value
            changes no such rule's verdict) -- and ``column_weights[c][i]`` is the number of rows
            value ``i`` of ``c`` stands for. One frame then carries every one-column rule of a
            suite.
    """

    suite: str
    frame: str
    rule_ids: tuple[str, ...]
    data: Any
    weights: Any = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    column_weights: Mapping[str, Any] | None = None


_SUMMED = ("element_count", "unexpected_count", "missing_count")


def evaluate(job: Job) -> list[RuleResult]:
    """Evaluate a job: every rule's verdict, and the exact counts of the rules that fail.

    Verdicts come from one run on the frame. A rule that fails is evaluated again for counts;
    with weights, on the sub-frames of the rows whose weight has bit ``b`` set, for each bit
    ``b``: a row of weight ``w`` is in the sub-frames of the bits of ``w``, so the counts of
    sub-frame ``b`` times ``2**b``, added up, count every row as ``w`` rows -- exactly what the
    rule would count on the file itself (element, missing and unexpected counts alike), with
    Great Expectations doing every count.
    """
    from phsafe.validation._frames import frame

    suite = load_suite(job.suite)
    rules = [suite.rule(r) for r in job.rule_ids]
    data = frame(job.data)
    results = run(suite, job.frame, data, rules, job.parameters, counts=False)
    failed = [rule for rule, result in zip(rules, results) if not result.success and result.raised is None]
    if not failed:
        return results
    if job.column_weights is not None:
        recount = {}
        for column, weights in job.column_weights.items():
            rules = [r for r in failed if r.referenced_columns() == {column}]
            if rules:
                values = data[[column]].iloc[: len(weights)].reset_index(drop=True)
                recount.update(_weighted(suite, job, rules, values, weights))
    elif job.weights is None:
        recount = {r.rule_id: r for r in run(suite, job.frame, data, failed, job.parameters, counts=True)}
    else:
        recount = _weighted(suite, job, failed, data, job.weights)
    return [recount.get(r.rule_id, r) for r in results]


def _weighted(suite: Suite, job: Job, rules: Sequence[Rule], data: Any, weights: Any) -> dict[str, RuleResult]:
    weights = np.asarray(weights, dtype=np.int64)
    totals: dict[str, dict[str, int]] = {r.rule_id: {} for r in rules}
    raised: dict[str, str | None] = {r.rule_id: None for r in rules}
    for bit in range(int(weights.max(initial=0)).bit_length()):
        rows = np.flatnonzero((weights >> bit) & 1)
        if not len(rows):
            continue
        part = data.iloc[rows].reset_index(drop=True)
        for result in run(suite, job.frame, part, rules, job.parameters, counts=True):
            if result.raised is not None:
                raised[result.rule_id] = raised[result.rule_id] or result.raised
            for key in _SUMMED:
                value = result.counts.get(key)
                if isinstance(value, int):
                    totals[result.rule_id][key] = totals[result.rule_id].get(key, 0) + (value << bit)
    return {rule_id: RuleResult(rule_id, False, counts, raised[rule_id]) for rule_id, counts in totals.items()}
