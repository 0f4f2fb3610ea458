"""Validation reports: failures in plain words, value-free results, and the files a reviewer opens.

Nothing here ever holds a value of a record. A failure names a file, columns, the rule and how
many rows broke it; a result keeps Great Expectations' counts (``element_count``,
``unexpected_count``, percentages) and drops every value-bearing key (``observed_value``,
``partial_unexpected_list``, ``unexpected_list``, ``unexpected_index_list``, ``details``, ...).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from phsafe.validation._suites import Rule, Suite

# Counts Great Expectations reports for column-map expectations; everything else is dropped.
_SAFE_RESULT_KEYS = (
    "element_count",
    "unexpected_count",
    "unexpected_percent",
    "missing_count",
    "missing_percent",
    "unexpected_percent_total",
    "unexpected_percent_nonmissing",
)


@dataclass(frozen=True)
class Failure:
    """One broken rule.

    Attributes:
        file: The file the rule is about, e.g. ``persons.csv`` or ``PH2/PH2.csv``.
        columns: Columns involved; ``units.RTYPE`` names a column of another file.
        rule: The rule in plain words (what a valid file satisfies).
        failing_rows: How many rows (or MAFIDs, households, cells: see ``row_noun``) break it,
            when known. Never the rows themselves.
        suite: The expectation suite holding the rule (None for a file that could not be read).
        rule_id: The rule's id in its suite.
        row_noun: What ``failing_rows`` counts.
    """

    file: str
    columns: tuple[str, ...]
    rule: str
    failing_rows: int | None = None
    suite: str | None = None
    rule_id: str | None = None
    row_noun: str = "row"

    def to_text(self) -> str:
        where = self.file + (f" [{', '.join(self.columns)}]" if self.columns else "")
        count = ""
        if self.failing_rows is not None:
            noun = self.row_noun if self.failing_rows == 1 else _plural(self.row_noun)
            count = f" ({self.failing_rows} failing {noun})"
        return f"{where}: {self.rule}{count}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["columns"] = list(self.columns)
        return out


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


@dataclass
class ValidationReport:
    """The outcome of a validation.

    Attributes:
        failures: Every broken rule, in the order the checks ran.
        notes: What was not checked and why (e.g. cross-file rules after a file was unreadable).
        results: Value-free Great Expectations suite results, one per suite run (merged over
            the batches of a file), as JSON-ready dicts.
        subject: ``inputs`` or ``outputs`` (names the report folder).
        set_aside: Input file stem -> rows the state filter set aside (a count; the report is
            confidential, but never holds a value).
    """

    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    subject: str = "validation"
    set_aside: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_text(self) -> str:
        if self.ok:
            lines = [f"{self.subject}: every rule holds ({self._n_rules()} rules checked)"]
        else:
            n = len(self.failures)
            lines = [f"{self.subject}: {n} rule{'s' if n != 1 else ''} failed"]
            lines += [f"  {f.to_text()}" for f in self.failures]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "ok": self.ok,
            "failures": [f.to_dict() for f in self.failures],
            "notes": list(self.notes),
            **({"set_aside_by_state_filter": dict(self.set_aside)} if self.set_aside else {}),
            "suites": [
                {
                    "suite": r["suite_name"],
                    "success": r["success"],
                    **r["statistics"],
                }
                for r in self.results
            ],
        }

    def _n_rules(self) -> int:
        return sum(r["statistics"]["evaluated_expectations"] for r in self.results)


# --------------------------------------------------------------------------------------------
# Results of many batches, merged per rule
# --------------------------------------------------------------------------------------------

# The parts of an expectation's JSON a result repeats: all come from the suite, none from data.
_CONFIG_KEYS = ("type", "kwargs", "meta", "description", "severity")


@dataclass
class _RuleTally:
    rule: Rule
    evaluated: bool = False
    success: bool = True
    raised: str | None = None  # exception class name; never its message (it may quote data)
    counts: dict[str, int] = field(default_factory=dict)


class Tally:
    """Adds up the value-free results of one suite over the batches it is run on.

    Args:
        suite: The suite.
        row_nouns: Frame name -> what one row of that frame is (``row``, ``MAFID``, ...).
    """

    def __init__(self, suite: Suite, row_nouns: Mapping[str, str] | None = None) -> None:
        self.suite = suite
        self.row_nouns = dict(row_nouns or {})
        self.rules = {r.rule_id: _RuleTally(r) for r in suite.rules}
        self.skipped: dict[str, str] = {}  # rule_id -> why it was not evaluated

    def add(self, rule_id: str, success: bool, result: Mapping[str, Any], raised: str | None) -> None:
        """Add one evaluation of a rule (a rule that held may come without counts)."""
        t = self.rules[rule_id]
        t.evaluated = True
        t.success = t.success and bool(success) and raised is None
        if raised and not t.raised:
            t.raised = raised
        for key in ("element_count", "unexpected_count", "missing_count"):
            value = result.get(key)
            if isinstance(value, int):
                t.counts[key] = t.counts.get(key, 0) + value
        if success and raised is None:
            t.counts.setdefault("unexpected_count", 0)

    def merge(self, other: "Tally") -> None:
        """Add the results of ``other`` (the same suite, e.g. tallied in another process)."""
        for rule_id, t in other.rules.items():
            if t.evaluated:
                self.add(rule_id, t.success, t.counts, t.raised)
        for rule_id, why in other.skipped.items():
            self.skip(rule_id, why)

    def skip(self, rule_id: str, why: str) -> None:
        if not self.rules[rule_id].evaluated:
            self.skipped.setdefault(rule_id, why)

    def failures(self, file_names: Mapping[str, str]) -> list[Failure]:
        out = []
        for t in self.rules.values():
            if not t.evaluated or t.success:
                continue
            rows = t.counts.get("unexpected_count")
            rule = t.rule.description
            if t.raised:
                rule += f" -- the rule could not be evaluated ({t.raised})"
                rows = None
            out.append(
                Failure(
                    file=file_names.get(t.rule.file, t.rule.file),
                    columns=t.rule.columns,
                    rule=rule,
                    failing_rows=rows,
                    suite=self.suite.name,
                    rule_id=t.rule.rule_id,
                    row_noun=self.row_nouns.get(t.rule.frame, "row"),
                )
            )
        return out

    def notes(self) -> list[str]:
        # One note per reason, naming the rules, so a skipped check is never silent.
        by_reason: dict[str, list[str]] = {}
        for rule_id, why in self.skipped.items():
            if not self.rules[rule_id].evaluated:
                by_reason.setdefault(why, []).append(rule_id)
        return [f"not checked ({why}): {', '.join(ids)}" for why, ids in by_reason.items()]

    def result_json(self) -> dict[str, Any]:
        """A Great Expectations ``ExpectationSuiteValidationResult``-shaped, value-free dict."""
        results = []
        for t in self.rules.values():
            if not t.evaluated:
                continue
            counts = dict(t.counts)
            if "element_count" in counts and "unexpected_count" in counts:
                total = counts["element_count"]
                counts["unexpected_percent"] = 100.0 * counts["unexpected_count"] / total if total else 0.0
            config = {k: v for k, v in t.rule.config.items() if k in _CONFIG_KEYS}
            results.append(
                {
                    "success": t.success,
                    "expectation_config": config,
                    "result": counts,
                    "meta": {},
                    "exception_info": {
                        "raised_exception": t.raised is not None,
                        "exception_traceback": None,
                        "exception_message": t.raised,
                    },
                }
            )
        n_ok = sum(1 for r in results if r["success"])
        return {
            "success": n_ok == len(results),
            "results": results,
            "suite_name": self.suite.name,
            "suite_parameters": {},
            "statistics": {
                "evaluated_expectations": len(results),
                "successful_expectations": n_ok,
                "unsuccessful_expectations": len(results) - n_ok,
                "success_percent": 100.0 * n_ok / len(results) if results else None,
            },
            "meta": {"great_expectations_version": self.suite.raw.get("meta", {}).get("great_expectations_version")},
            "id": None,
        }

    def any_evaluated(self) -> bool:
        return any(t.evaluated for t in self.rules.values())


def safe_result_counts(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The value-free part of one Great Expectations expectation result."""
    if not result:
        return {}
    return {k: result[k] for k in _SAFE_RESULT_KEYS if k in result}


# --------------------------------------------------------------------------------------------
# Report files
# --------------------------------------------------------------------------------------------

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def write_report(report: ValidationReport, report_dir: Path) -> Path:
    """Write ``report`` under ``report_dir/<subject>/`` and return that folder.

    Files: ``report.txt`` and ``report.json`` (the failures), ``results/<suite>.json`` (the
    value-free Great Expectations results), ``data_docs/<suite>.html`` (the page of each result)
    and ``index.html`` (the summary linking them): self-contained pages, see :mod:`._html`.
    """
    folder = Path(report_dir) / _SAFE_NAME.sub("_", report.subject)
    (folder / "results").mkdir(parents=True, exist_ok=True)
    (folder / "data_docs").mkdir(parents=True, exist_ok=True)
    (folder / "report.txt").write_text(report.to_text() + "\n", encoding="utf-8")
    (folder / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    pages: dict[str, str] = {}
    for result in report.results:
        name = _SAFE_NAME.sub("_", result["suite_name"])
        (folder / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        page = _data_docs_page(result, report.subject)
        (folder / "data_docs" / f"{name}.html").write_text(page, encoding="utf-8")
        pages[result["suite_name"]] = f"data_docs/{name}.html"
    (folder / "index.html").write_text(_index_html(report, pages), encoding="utf-8")
    _write_top_index(Path(report_dir))
    return folder


def _data_docs_page(result: dict[str, Any], subject: str) -> str:
    from phsafe.validation import _html

    return _html.suite_page(result, subject)


def _index_html(report: ValidationReport, pages: Mapping[str, str]) -> str:
    from phsafe.validation import _html

    return _html.index_page(report, pages)


def _write_top_index(report_dir: Path) -> None:
    from phsafe.validation import _html

    (report_dir / "index.html").write_text(_html.reports_page(report_dir), encoding="utf-8")
