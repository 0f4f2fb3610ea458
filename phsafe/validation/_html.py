"""The HTML pages of a validation report, rendered from Jinja2 templates (:mod:`phsafe.templates`).

The project's own pages replace Great Expectations' Data Docs: those loaded Bootstrap, jQuery,
Font Awesome and Vega from CDNs (blank offline), advertised a newsletter, named the run
``__none__`` and the data asset ``None``, and linked to a Home page and expectation pages that
were never written. These pages are built from the same value-free Great Expectations result
JSON (``results/<suite>.json``), need nothing but the files next to them, and every link
resolves:

* ``<report dir>/index.html`` -- every validation written into the folder (inputs, outputs);
* ``<subject>/index.html`` -- the failures (each linking to its rule), notes, and the suites;
* ``<subject>/data_docs/<suite>.html`` -- every rule of a suite: what it requires, the file and
  columns, its verdict and the number of failing rows (an anchor per rule id).

Like the rest of the report they hold counts only, never a value of a record: a rule's
parameters come from the suite (public code lists, ``$PARAMETER`` references), the numbers from
the result's count keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, Sequence

from phsafe.templates import render


class ReportSummary(Protocol):
    """What the pages read of a :class:`~phsafe.validation._report.ValidationReport` (the report
    module writes its pages with this one, so this one does not import it)."""

    @property
    def subject(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def failures(self) -> Sequence[Any]: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def results(self) -> Sequence[Mapping[str, Any]]: ...

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def page_name(suite: str) -> str:
    """The file name of a suite's page (and of its result JSON, with ``.json``)."""
    return _SAFE_NAME.sub("_", suite)


def _rule_row(result: Mapping[str, Any]) -> dict[str, Any]:
    config = result["expectation_config"]
    meta = config.get("meta") or {}
    counts = result.get("result") or {}
    raised = (result.get("exception_info") or {}).get("raised_exception")
    if raised:
        verdict = "could not be evaluated"
    else:
        verdict = "holds" if result["success"] else "FAILS"
    failing = counts.get("unexpected_count")
    of = counts.get("element_count")
    return {
        "rule_id": meta.get("rule_id", ""),
        "description": config.get("description") or config["type"],
        "file": meta.get("file", ""),
        "columns": list(meta.get("columns") or []),
        "verdict": verdict,
        "success": bool(result["success"]) and not raised,
        "failing": "" if failing is None or raised else f"{failing:,}",
        "of": "" if of is None else f"{of:,}",
        "type": config["type"],
        "severity": config.get("severity"),
        "kwargs": json.dumps(config.get("kwargs") or {}, indent=1, ensure_ascii=False),
    }


def suite_page(result: Mapping[str, Any], subject: str = "validation") -> str:
    """The page of one suite's value-free result (``data_docs/<suite>.html``)."""
    rules = [_rule_row(r) for r in result["results"]]
    return render(
        "validation_suite.html.j2",
        title=f"PHSafe {subject} validation: suite {result['suite_name']}",
        subject=subject,
        suite=result["suite_name"],
        success=bool(result["success"]),
        stats=result["statistics"],
        files=sorted({r["file"] for r in rules if r["file"]}),
        gx_version=(result.get("meta") or {}).get("great_expectations_version"),
        result_file=page_name(result["suite_name"]) + ".json",
        rules=rules,
    )


def index_page(report: ReportSummary, pages: Mapping[str, str]) -> str:
    """The summary page of one validation (``<subject>/index.html``).

    Args:
        report: The validation report.
        pages: Suite name -> its page, relative to the summary (``data_docs/<suite>.html``).
    """
    failures = []
    for f in report.failures:
        link = None
        if f.suite in pages and f.rule_id:
            link = f"{pages[f.suite]}#{f.rule_id}"
        failures.append({"text": f.to_text(), "link": link})
    suites = []
    for result in report.results:
        stats = result["statistics"]
        name = result["suite_name"]
        suites.append({
            "name": name,
            "page": pages.get(name, f"results/{page_name(name)}.json"),
            "json": f"results/{page_name(name)}.json",
            "success": bool(result["success"]),
            "passed": stats["successful_expectations"],
            "evaluated": stats["evaluated_expectations"],
            "failed": stats["unsuccessful_expectations"],
        })
    return render(
        "validation_index.html.j2",
        title=f"PHSafe {report.subject} validation",
        subject=report.subject,
        ok=report.ok,
        failures=failures,
        notes=list(report.notes),
        suites=suites,
        written=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def reports_page(report_dir: Path) -> str:
    """The page listing every validation written into ``report_dir`` (its ``index.html``)."""
    reports = []
    for index in sorted(Path(report_dir).glob("*/index.html")):
        folder = index.parent
        verdict, failures, ok = "see the report", "", True
        summary = folder / "report.json"
        if summary.is_file():
            try:
                data = json.loads(summary.read_text(encoding="utf-8"))
                ok = bool(data.get("ok"))
                verdict = "passed" if ok else "FAILED"
                failures = str(len(data.get("failures") or []))
            except (ValueError, UnicodeDecodeError):
                pass
        reports.append({"name": folder.name, "link": f"{folder.name}/index.html", "verdict": verdict,
                        "failures": failures, "ok": ok})
    return render("validation_reports.html.j2", title="PHSafe validation reports", reports=reports)
