"""Running suites on frames and adding their results up (the engine of every public entry point).

Two passes: every rule is first evaluated for a verdict only; a rule that fails is evaluated again
with counts, on every row, so the number of failing rows in a report is always exact.

Distinct rows: a row rule's verdict depends only on the values of the row, so a rule holds on a
frame exactly when it holds on the frame's distinct rows -- and census files repeat the same
few combinations of codes a million times (a million persons rows hold some 30,000 distinct
combinations once MAFID is set aside). The first pass therefore runs on distinct rows when the
caller allows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from phsafe.logs import get_logger
from phsafe.validation import _gx
from phsafe.validation._report import Tally
from phsafe.validation._suites import Rule, Suite, load_suite

log = get_logger("phsafe.validation")


class SuiteRun:
    """One suite, evaluated on any number of frames (e.g. the batches of a file), tallied.

    Args:
        name: Suite name (``expectations/<name>.json``).
        parameters: Suite parameters (``$PARAMETER`` values); a rule needing one that is not
            given is not evaluated, and the report says so.
        row_nouns: Frame name -> what one row of it is, for the report.
    """

    def __init__(self, name: str, parameters: Mapping[str, Any] | None = None,
                 row_nouns: Mapping[str, str] | None = None) -> None:
        self.suite: Suite = load_suite(name)
        self.parameters = {k: v for k, v in (parameters or {}).items() if v is not None}
        self.tally = Tally(self.suite, row_nouns)

    def rules(self, frame: str, *, only: set[str] | None = None, exclude: set[str] | None = None) -> list[Rule]:
        if frame not in self.suite.frames:
            raise ValueError(f"suite {self.suite.name} has no frame {frame!r} (it has {', '.join(self.suite.frames)})")
        return [
            r for r in self.suite.rules_for(frame)
            if (only is None or r.rule_id in only) and not (exclude and r.rule_id in exclude)
        ]

    def check(
        self,
        frame: str,
        data: pd.DataFrame,
        *,
        only: set[str] | None = None,
        exclude: set[str] | None = None,
        every_row: Callable[[], pd.DataFrame] | None = None,
        distinct: bool = False,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        """Evaluate the suite's rules of ``frame`` on ``data`` and add the results up.

        Args:
            frame: Frame name as in the suite.
            data: The frame -- or, when ``every_row`` is given, its distinct rows.
            only: Evaluate only these rule ids.
            exclude: Do not evaluate these rule ids.
            every_row: Builds the frame with every row; given when ``data`` holds distinct rows
                only. Called only if a rule fails, to count its failing rows.
            distinct: Evaluate on ``data.drop_duplicates()`` and recount failures on ``data``.
            parameters: Suite parameters for this frame only, on top of the run's.
        """
        params = {**self.parameters, **{k: v for k, v in (parameters or {}).items() if v is not None}}
        if distinct and every_row is None:
            full = data
            data = data.drop_duplicates(ignore_index=True)
            every_row = lambda: full  # noqa: E731
        columns = set(map(str, data.columns))
        rules = []
        for rule in self.rules(frame, only=only, exclude=exclude):
            missing_columns = rule.referenced_columns() - columns
            missing_parameters = rule.parameters() - set(params)
            if missing_columns:
                self.tally.skip(rule.rule_id, f"column {', '.join(sorted(missing_columns))} is not in the data")
            elif missing_parameters:
                self.tally.skip(rule.rule_id, f"no valid {', '.join(sorted(missing_parameters))} in the config")
            else:
                rules.append(rule)
        started = time.perf_counter()
        # Pass 1 asks only whether each rule holds (GX's cheapest result format: about half the
        # work of one with counts); pass 2 counts the failing rows of the rules that failed,
        # on every row. A valid file never needs pass 2.
        results = _gx.run(self.suite, frame, data, rules, params, counts=False)
        failed = {r.rule_id for r in results if not r.success and r.raised is None}
        if failed:
            rows = every_row() if every_row is not None else data
            recount = {r.rule_id: r for r in _gx.run(self.suite, frame, rows,
                                                     [r for r in rules if r.rule_id in failed],
                                                     params, counts=True)}
            results = [recount.get(r.rule_id, r) for r in results]
        log.debug("suite evaluated", suite=self.suite.name, frame=frame, rules=len(rules),
                  seconds=round(time.perf_counter() - started, 3))
        for result in results:
            self.tally.add(result.rule_id, result.success, result.counts, result.raised)
