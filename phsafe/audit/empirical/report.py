"""The audit's files: ``audit.json`` for scripts, ``audit.html`` (with its plots) for people.

Both hold public facts only: the audit runs on data it generated itself, so its numbers -- the
bounds, the counts of false positives, the residual checks -- are not a function of any
confidential record. The HTML page is rendered from the Jinja2 template
``empirical_audit.html.j2`` (:mod:`phsafe.templates`); its plots are PNG files next to it, so it
opens offline.

``audit.json``::

    {"audit": "empirical", "verdict": "PASS", "mode": "quick", "seed": 0,
     "sensitivity": ["paper", "exact"], ...,
     "tables": [{"table": "PH3", "level": "all", "sensitivity": "paper", "mu_lb": 0.64,
                 "mu_ub": 0.77, "mu_reach": 0.70, "mu_declared": 1.17, "ceiling": 0.60,
                 "epsilon_hat": 4.1, "epsilon_declared": 7.75, "delta": 1e-10,
                 "budget_scale": 1, "verdict": "PASS", "conclusive": true,
                 "runs_to_separate": null, "runs": 51, "seconds": 31.2, ...}, ...],
     "side_by_side": [{"table": "PH3", "level": "all", "paper": {"epsilon_ratio": 0.53,
                       "ceiling": 0.60, "verdict": "PASS", ...}, "exact": {...}}, ...],
     "checks": [{"name": "noise variance", "kind": "residual", "table": "PH3",
                 "level": "state_A-G", "status": "PASS", ...}, ...],
     "not_audited": [...], "canaries": {...}}

Every row says the calibration its release was drawn for (``sensitivity``); with ``--sensitivity
both`` the two are audited on their own (each with its own family-wise alpha) and set side by
side. A row whose bounds hold both 0 and ``mu_declared`` is ``INCONCLUSIVE`` with
``conclusive: false`` and the runs that would separate them. A bound that is infinite
(``mu_ub`` when no false positive was seen) is ``null``; pure-DP rows
have ``null`` mu fields, ``delta`` 0, and count their tail event (``events_out``, ``events_in``)
where zCDP rows count errors (``false_positives``, ``false_negatives``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from phsafe.audit.empirical.audit import WHOLE_TABLE, AuditResult, Row
from phsafe.audit.empirical.checks import FAIL, INCONCLUSIVE, PASS

__all__ = ["write_report", "report_json", "JSON_NAME", "HTML_NAME"]

JSON_NAME = "audit.json"
HTML_NAME = "audit.html"
PUBLIC_NOTE = ("The audit runs the release code on data it generates itself (a synthetic background population "
               "and canary households); no input data is read. Its figures are public facts about the code, not "
               "about any confidential record.")


def _code_version() -> str:
    from phsafe.private_run import code_version

    return code_version()


def report_json(result: AuditResult) -> dict:
    """The audit as a JSON-ready mapping (see the module docstring)."""
    s = result.settings
    config = s.config
    return {
        "audit": "empirical",
        "verdict": result.verdict,
        "failed": result.failed,
        "data": PUBLIC_NOTE,
        "mode": s.mode,
        "seed": s.seed,
        "started": result.started,
        "seconds": round(result.seconds, 3),
        "cpu_seconds": round(result.cpu_seconds, 3),
        "code_version": _code_version(),
        "opendp_version": result.opendp,
        "config": {"privacy_defn": config.privacy_defn.value, "states": list(config.states),
                   "tau": dict(config.tau), "sensitivity": config.sensitivity.value},
        "sensitivity": list(result.calibrations),
        "workers": s.workers,
        "delta": s.delta,
        "alpha": s.alpha,
        "check_alpha": s.check_alpha,
        "background_persons": s.background_persons,
        "tables": [r.as_dict() for r in result.rows],
        "side_by_side": side_by_side(result),
        "not_audited": result.not_audited,
        "checks": [c.as_dict() for c in result.checks],
        "canaries": result.canaries,
    }


def side_by_side(result: AuditResult) -> list[dict]:
    """Per table and level, each calibration's epsilon_hat / epsilon, ceiling and verdict."""
    out: dict[tuple[str, str], dict] = {}
    for r in result.rows:
        entry = out.setdefault((r.table, r.level), {"table": r.table, "level": r.level})
        entry[r.sensitivity] = {"epsilon_ratio": _num(r.ratio), "ceiling": _num(r.ceiling),
                                "epsilon_ceiling": _num(r.epsilon_ceiling), "verdict": r.verdict,
                                "budget_scale": r.budget_scale, "lead": r.lead}
    return list(out.values())


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.{digits}f}"


def _scale(row: Row) -> str:
    return "production" if row.budget_scale == 1 else f"x{row.budget_scale:g} (scaled)"


def _row_view(row: Row) -> dict:
    pure = row.mu_lb is None
    return {
        "table": row.table, "level": "whole table" if row.level == WHOLE_TABLE else row.level,
        "sensitivity": row.sensitivity, "ceiling": _fmt(row.ceiling), "lead": row.lead,
        "conclusive": row.conclusive, "runs_to_separate": "-" if row.runs_to_separate is None else
        f"{row.runs_to_separate:,}", "reach_note": row.reach_note, "scale": _scale(row), "runs": f"{row.runs:,}", "canaries": f"{row.canaries_per_run:,}",
        "mu_lb": _fmt(row.mu_lb), "mu_ub": _fmt(row.mu_ub), "mu_reach": _fmt(row.mu_reach),
        "mu_declared": _fmt(row.mu_declared), "epsilon_hat": _fmt(row.epsilon_hat),
        "epsilon_declared": _fmt(row.epsilon_declared), "ratio": _fmt(row.ratio), "verdict": row.verdict,
        "seconds": f"{row.seconds:,.0f}", "pure": pure, "ok": row.verdict in ("PASS", "INCONCLUSIVE"),
        "epsilon_reach": _fmt(row.epsilon_reach), "epsilon_ub": _fmt(row.epsilon_ub),
    }


def _pair_view(entry: dict, calibrations: tuple[str, ...]) -> dict:
    view = {"table": entry["table"], "level": "whole table" if entry["level"] == WHOLE_TABLE else entry["level"]}
    for c in calibrations:
        e = entry.get(c)
        view[c] = None if e is None else {
            "ratio": _fmt(e["epsilon_ratio"]), "ceiling": _fmt(e["ceiling"]), "verdict": e["verdict"],
            "scale": "" if e["budget_scale"] == 1 else f"x{e['budget_scale']:g}", "lead": e["lead"]}
    return view


def write_report(result: AuditResult, out: Path) -> tuple[Path, Path]:
    """Write ``audit.json``, ``audit.html`` and its plots into the folder ``out`` (made if needed)."""
    from phsafe.templates import write

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    document = report_json(result)
    json_path = out / JSON_NAME
    json_path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    plots = _plots(result, out)
    checks = result.checks
    summary: dict[tuple[str, str], dict[str, int]] = {}
    for c in checks:
        if c.kind == "residual":
            table = c.table if c.sensitivity is None else f"{c.table} ({c.sensitivity})"
            counts = summary.setdefault((table, c.name), {PASS: 0, FAIL: 0, INCONCLUSIVE: 0})
            counts[c.status] += 1
    html_path = write(
        out / HTML_NAME, "empirical_audit.html.j2",
        title="Empirical privacy audit of the release path",
        result=result, doc=document, public_note=PUBLIC_NOTE,
        rows=[_row_view(r) for r in result.rows],
        whole=[_row_view(r) for r in result.rows if r.level == WHOLE_TABLE],
        flagged=[c for c in checks if c.status != PASS],
        white_box=[c for c in checks if c.kind in ("white-box", "release")],
        residual_summary=[{"table": t, "name": n, **v} for (t, n), v in sorted(summary.items())],
        plots=plots, pure=result.settings.config.privacy_defn.value == "puredp",
        calibrations=result.calibrations, both=len(result.calibrations) > 1,
        side_by_side=[_pair_view(e, result.calibrations) for e in document["side_by_side"]],
        notes=sorted({(r.table, r.level, r.sensitivity, r.reach_note) for r in result.rows if r.reach_note}),
        inconclusive=sum(r.verdict == "INCONCLUSIVE" for r in result.rows),
    )
    return json_path, html_path


# --------------------------------------------------------------------------------------------
# Plots (matplotlib's Agg canvas; no pyplot, no global state)
# --------------------------------------------------------------------------------------------


def _figure(width: float, height: float):  # type: ignore[no-untyped-def]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _plots(result: AuditResult, out: Path) -> list[dict]:
    plots = []
    rows = [r for r in result.rows if r.mu_lb is not None]
    if rows:
        plots.append(_interval_plot(rows, out / "mu_bounds.png"))
    hist = _histograms(result, out / "statistics.png")
    if hist:
        plots.append(hist)
    return plots


def _interval_plot(rows: list[Row], path: Path) -> dict:
    """Each row's [mu_lb, mu_ub] over its declared mu, with the reachable mu and 1 (declared)."""
    fig = _figure(8.5, max(3.4, 0.28 * len(rows) + 2.0))
    ax = fig.add_subplot(1, 1, 1)
    labels = []
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        decl = r.mu_declared or 1.0
        lo = max(r.mu_lb or 0.0, 0.0) / decl
        hi = r.mu_ub / decl if r.mu_ub is not None and math.isfinite(r.mu_ub) else 2.0
        colour = {"PASS": "#1a7f37", "INCONCLUSIVE": "#8c959f", "WEAK": "#9a6700", "EXCESS": "#cf222e",
                  "VIOLATION": "#82071e"}[r.verdict]
        ax.plot([lo, min(hi, 2.0)], [y, y], "-", color=colour, linewidth=3, solid_capstyle="butt")
        ax.plot([(r.mu_reach or 0) / decl], [y], "|", color="black", markersize=10)
        scaled = "" if r.budget_scale == 1 else f" (x{r.budget_scale:g})"
        labels.append(f"{r.table} {'whole table' if r.level == WHOLE_TABLE else r.level}{scaled} [{r.sensitivity}]")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.9, label="declared (mu_declared)")
    ax.plot([], [], "|", color="black", markersize=10, label="reachable by correct code (mu_reach)")
    ax.plot([], [], "-", color="#1a7f37", linewidth=3, label="[mu_lb, mu_ub] / mu_declared")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels[::-1], fontsize="small")
    ax.set_xlim(0, 2.05)
    ax.set_xlabel("mu / mu_declared")
    ax.set_title("Bounds on the Gaussian-DP mu of each table and level", pad=22)
    ax.grid(True, axis="x", linewidth=0.3, alpha=0.6)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.legend(fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, format="png", bbox_inches="tight")
    return {"src": path.name, "alt": "mu bounds per table and level",
            "caption": "Each bar is the confidence interval [mu_lb, mu_ub] of a row, over its declared mu "
                       "(dashed line at 1: a bar starting right of it is a VIOLATION). The tick is the mu correct "
                       "code gives with these canaries, its ceiling (a bar starting right of it is an EXCESS, one "
                       "ending left of it is WEAK). Grey bars are INCONCLUSIVE: they hold both 0 and the declared "
                       "mu -- at these levels' budgets the runs tell nothing."}


def _histograms(result: AuditResult, path: Path) -> dict | None:
    """The test statistic of the whole-table canaries, with and without the canary."""
    keys = [k for k in result.tallies if k[2] == WHOLE_TABLE and result.tallies[k].scores_out]
    if not keys:
        return None
    cols = 3
    rows_n = math.ceil(len(keys) / cols)
    fig = _figure(10.0, 2.6 * rows_n + 0.6)
    for i, key in enumerate(keys):
        tally = result.tallies[key]
        out_scores = np.concatenate(tally.scores_out)
        in_scores = np.concatenate(tally.scores_in) if tally.scores_in else np.empty(0)
        ax = fig.add_subplot(rows_n, cols, i + 1)
        both = np.concatenate([out_scores, in_scores])
        bins = np.linspace(float(np.percentile(both, 0.5)), float(np.percentile(both, 99.5)), 40)
        ax.hist(out_scores, bins=bins, alpha=0.55, density=True, label="canary out")
        ax.hist(in_scores, bins=bins, alpha=0.55, density=True, label="canary in")
        mu = float(np.median(tally.family.mus))
        ax.axvline(mu / 2, color="black", linewidth=0.8, linestyle="--", label="threshold mu/2")
        ax.set_title(f"{key[1]} ({key[0]})", fontsize="small")
        ax.tick_params(labelsize="x-small")
        if i == 0:
            ax.legend(fontsize="x-small")
    fig.suptitle("The canaries' test statistic T (whole table): N(0, 1) out, N(mu, 1) in, for correct code",
                 fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return {"src": path.name, "alt": "histograms of the test statistic",
            "caption": "Histograms of the whole-table statistic T of each canary and run (a sample), with the canary "
                       "out and in. The test says 'in' right of the dashed threshold; its error rates give the bounds."}
