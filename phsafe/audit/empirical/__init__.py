"""The empirical privacy audit: a statistically valid lower bound on the privacy loss of the real
release path, measured by running it on neighbouring datasets it generates (``phsafe audit
empirical``; ``docs/empirical_audit.md``).

* :mod:`.canaries` -- key-invariant canary households and their packing into owned cells;
* :mod:`.population` -- the generated background and a table's runs' records;
* :mod:`.oracle` -- the auditor's own exact counts, without the truncation key;
* :mod:`.mechanism` -- the release path under audit (subclassed by the tests to plant bugs);
* :mod:`.bounds` -- Clopper-Pearson, Gaussian-DP mu and epsilon, pure-DP event bounds;
* :mod:`.checks` -- residual and white-box checks;
* :mod:`.audit` -- planning, running and concluding the audit; verdicts;
* :mod:`.report` -- ``audit.json`` and ``audit.html``.

Pure and Prefect-free; the command line and the weekly flow are thin layers over
:func:`run_audit` and :func:`write_report`.
"""

from __future__ import annotations

from phsafe.audit.empirical.audit import (
    EXCESS, INCONCLUSIVE_ROW, MODES, PASS_VERDICT, QUICK_SCALES, SENSITIVITIES, VIOLATION, WEAK, AuditResult,
    AuditSettings, Row, default_workers, production_config, run_audit,
)
from phsafe.audit.empirical.mechanism import Release, ReleaseMechanism
from phsafe.audit.empirical.report import HTML_NAME, JSON_NAME, report_json, write_report

__all__ = [
    "AuditSettings", "AuditResult", "Row", "run_audit", "write_report", "report_json", "ReleaseMechanism", "Release",
    "production_config", "default_workers", "MODES", "QUICK_SCALES", "SENSITIVITIES", "VIOLATION", "EXCESS", "WEAK",
    "INCONCLUSIVE_ROW", "PASS_VERDICT", "JSON_NAME", "HTML_NAME",
]
