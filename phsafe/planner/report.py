"""Writing a plan: ``config.json``, ``plan.json``, the Markdown/HTML report and the plots."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

from phsafe.config import INFINITE, PrivacyDefinition, load_config
from phsafe.errors import PlanningError
from phsafe.iterations import PopulationGroupLevel
from phsafe.planner.moe import decimal_text, fraction_text, gaussian_moe_met, geometric_halfwidth
from phsafe.planner.plan import LevelPlan, Plan, PlanMode, totals_row
from phsafe.schema import STATE_CODES
from phsafe.sensitivity import SensitivityBound, squared
from phsafe.sensitivity import value as sensitivity_value
from phsafe.tables import MEASURED_TABLES

CONFIG_JSON = "config.json"
PLAN_JSON = "plan.json"
REPORT_MD = "plan_report.md"
REPORT_HTML = "plan_report.html"
MOE_RHO_PNG = "moe_vs_rho.png"
MOE_EPS_PNG = "moe_vs_epsilon.png"
SPLIT_PNG = "budget_split.png"


def config_text(raw: Mapping[str, Any]) -> str:
    """``config.json`` text with every budget written as its exact decimal (never a float)."""
    marks: dict[str, str] = {}

    def mark(value: Decimal) -> str:
        token = f"@@budget{len(marks)}@@"
        text = decimal_text(value)
        marks[f'"{token}"'] = text if "." in text else text + ".0"
        return token

    doc = dict(raw)
    doc["privacy_budget"] = {
        t: {k: mark(Decimal(v)) for k, v in levels.items()} for t, levels in raw["privacy_budget"].items()
    }
    text = json.dumps(doc, indent=4)
    for token, value in marks.items():
        text = text.replace(token, value)
    return text + "\n"


def amount_text(x: Fraction | Decimal | None, significant: int = 10) -> str:
    """An amount for the plan's reports (:func:`phsafe.amounts.amount_text`), ``n/a`` when none."""
    from phsafe.amounts import amount_text as text

    return "n/a" if x is None else text(x, significant)


def _exact_text(x: Fraction) -> str:
    """Exact text of a rational: terminating decimal, or ``numerator/denominator``."""
    from phsafe.amounts import format_exact

    return format_exact(x)


def _num(x: float | None, fmt: str = "{:.4f}") -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "Infinity"
    return fmt.format(x)


def _int(x: int | None) -> str:
    return "n/a" if x is None else str(x)


def plan_json(plan: Plan) -> dict[str, Any]:
    """Every number of the plan, budgets as exact strings."""
    def level(lp: LevelPlan) -> dict[str, Any]:
        return {
            "table": lp.table,
            "level": lp.level.config_key,
            "tau": lp.tau,
            "sensitivity": lp.sensitivity,
            "sensitivity_l2": lp.l2_sensitivity,
            "sensitivity_l1": lp.l1_sensitivity,
            "cells": lp.n_cells,
            "moe_target": None if lp.moe_target is None else amount_text(lp.moe_target),
            "rho_exact": None if lp.rho_exact is None else _exact_text(lp.rho_exact),
            "rho_exact_approx": None if lp.rho_exact is None else fraction_text(lp.rho_exact, 16),
            "rho": None if lp.rho is None else amount_text(lp.rho),
            "epsilon": None if lp.epsilon is None else amount_text(lp.epsilon),
            "gaussian_moe_1645_sigma": lp.gaussian_moe,
            "gaussian_exact_halfwidth": lp.gaussian_halfwidth,
            "geometric_exact_halfwidth": lp.geometric_halfwidth,
            "geometric_1645_sd": lp.geometric_sd_moe,
        }

    def totals(measure: str) -> dict[str, Any]:
        row = totals_row(measure, plan.total(measure), plan.delta, plan.bounded_factor(measure))
        out: dict[str, Any] = {
            "per_table": {t: None if v is None else amount_text(v, 16) for t, v in plan.table_totals(measure).items()},
            "unbounded": None if row.unbounded is None else amount_text(row.unbounded, 16),
            "bounded": None if row.bounded is None else amount_text(row.bounded, 16),
        }
        if row.eps_analytic:
            out["epsilon_at_delta"] = {
                "delta": plan.delta,
                "analytic": {"unbounded": row.eps_analytic[0], "bounded": row.eps_analytic[1]},
                "renyi": {"unbounded": row.eps_renyi[0], "bounded": row.eps_renyi[1]} if row.eps_renyi else None,
            }
        return out

    return {
        "mode": plan.mode.value,
        "source": plan.source,
        "privacy_defn": plan.privacy_defn.value,
        "digits": plan.digits,
        "delta": plan.delta,
        "tau": dict(plan.config.tau),
        "state_filter": list(plan.config.state_filter),
        "sensitivity": plan.bound.value,
        "levels": [level(lp) for lp in plan.levels],
        "totals": {"rho": totals("rho"), "epsilon": totals("epsilon")},
        **({"paper_bound": _paper_json(plan)} if plan.paper is not None else {}),
        "notes": list(plan.notes),
    }


def _paper_json(plan: Plan) -> dict[str, Any]:
    """The same targets with the paper's bound: per level and in total, rho and epsilon."""
    assert plan.paper is not None
    out: dict[str, Any] = {"levels": {}, "totals": {}}
    for lp in plan.paper.levels:
        out["levels"][lp.key] = {"sensitivity": lp.sensitivity, "rho": amount_text(lp.rho),
                                 "epsilon": amount_text(lp.epsilon)}
    for measure in ("rho", "epsilon"):
        paper, exact = plan.paper.total(measure), plan.total(measure)
        out["totals"][measure] = {
            "paper": amount_text(paper, 16), "exact": amount_text(exact, 16),
            "paper_over_exact": None if not paper or not exact or INFINITE in (paper, exact)
            else float(Fraction(paper) / Fraction(exact)),
        }
    return out


def _moe_chart(plan: Plan, path: Path) -> Path:
    """MOE against rho (log-log) for each distinct Delta of the plan, with its levels marked."""
    from phsafe._plots import Series, line_chart

    by_delta: dict[int | str, list[LevelPlan]] = {}
    for lp in plan.levels:
        by_delta.setdefault(lp.l2_sensitivity, []).append(lp)
    rhos = [float(lp.rho) for lp in plan.levels if lp.rho is not None and lp.rho != INFINITE]
    lo = min(rhos, default=1e-5) / 10
    hi = max(rhos, default=1.0) * 10
    grid = [lo * (hi / lo) ** (i / 120) for i in range(121)]
    series = []
    for d, lps in sorted(by_delta.items(), key=lambda item: squared(item[0])):
        taus = sorted({lp.tau for lp in lps if lp.tau is not None})
        label = f"tau = {', '.join(map(str, taus))} (Delta = {d})" if taus else f"unit tables (Delta = {d})"
        series.append(Series(label, grid, [1.645 * sensitivity_value(d) / math.sqrt(2 * r) for r in grid], "-"))
        pts = [(float(lp.rho), lp.gaussian_moe) for lp in lps
               if lp.rho is not None and lp.rho != INFINITE and lp.gaussian_moe]
        if pts:
            series.append(Series(f"planned levels, Delta = {d}", [p[0] for p in pts], [p[1] for p in pts], "o"))
    return line_chart(path, series, title="90% MOE (1.645 sigma) against rho, discrete Gaussian",
                      xlabel="rho (zCDP budget of a population-group level)", ylabel="90% MOE",
                      logx=True, logy=True)


def _moe_eps_chart(plan: Plan, path: Path) -> Path:
    """Exact geometric MOE against epsilon for each distinct Delta of the plan."""
    from phsafe._plots import Series, line_chart

    by_delta: dict[int, list[LevelPlan]] = {}
    for lp in plan.levels:
        by_delta.setdefault(lp.l1_sensitivity, []).append(lp)
    eps = [float(lp.epsilon) for lp in plan.levels if lp.epsilon is not None and lp.epsilon != INFINITE]
    lo = min(eps, default=1e-3) / 5
    hi = max(eps, default=1.0) * 5
    grid = [lo * (hi / lo) ** (i / 80) for i in range(81)]
    series = []
    for d, lps in sorted(by_delta.items()):
        taus = sorted({lp.tau for lp in lps if lp.tau is not None})
        label = f"tau = {', '.join(map(str, taus))} (Delta = {d})" if taus else f"unit tables (Delta = {d})"
        ys = [max(geometric_halfwidth(Fraction(e), d), 0.5) for e in grid]  # 0 shown at 0.5 (log axis)
        series.append(Series(label, grid, ys, "-"))
        pts = [(float(lp.epsilon), max(lp.geometric_halfwidth, 0.5)) for lp in lps
               if lp.epsilon is not None and lp.epsilon != INFINITE and lp.geometric_halfwidth is not None]
        if pts:
            series.append(Series(f"planned levels, Delta = {d}", [p[0] for p in pts], [p[1] for p in pts], "o"))
    return line_chart(path, series, title="Exact 90% MOE against epsilon, two-sided geometric",
                      xlabel="epsilon (pure-DP budget of a population-group level)", ylabel="90% MOE",
                      logx=True, logy=True)


def _split_chart(plan: Plan, path: Path) -> Path:
    from phsafe._plots import stacked_barh

    tables = [t for t in MEASURED_TABLES if any(lp.table == t for lp in plan.levels)]
    levels = sorted({lp.level for lp in plan.levels}, key=lambda lv: (lv.geography.value != "USA", lv.iteration.value))
    budgets = {(lp.table, lp.level): plan.budget_of(lp) for lp in plan.levels}

    def val(t: str, lv: PopulationGroupLevel) -> float:
        b = budgets.get((t, lv))
        return 0.0 if b is None or b == INFINITE else float(b)

    segments = [(lv.config_key, [val(t, lv) for t in tables]) for lv in levels]
    measure = "rho" if plan.privacy_defn is PrivacyDefinition.ZCDP else "epsilon"
    total = plan.total(measure)
    return stacked_barh(path, tables, segments,
                        title=f"Budget split of the run (total {measure} = {amount_text(total, 7)})",
                        xlabel=f"{measure} (unbounded)")


def write_plan(plan: Plan, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """Write ``config.json`` (targets mode), ``plan.json``, the Markdown/HTML report and the PNGs.

    ``out_dir`` must be a new or empty folder unless ``overwrite`` (see
    :func:`phsafe._plots.report_folder`). The written config is read back with
    :func:`phsafe.config.load_config` and must plan the same budgets, or nothing is reported as
    written.
    """
    from phsafe._plots import report_folder

    out = report_folder(out_dir, overwrite=overwrite)
    paths: dict[str, Path] = {}
    if plan.config_json is not None:
        cfg_path = out / CONFIG_JSON
        cfg_path.write_text(config_text(plan.config_json), encoding="utf-8")
        reread = load_config(cfg_path)
        if reread.privacy_budget != plan.config.privacy_budget or reread.tau != plan.config.tau:
            raise PlanningError("the written config does not read back to the planned budgets")  # pragma: no cover
        paths["config"] = cfg_path
    paths["plan"] = out / PLAN_JSON
    paths["plan"].write_text(json.dumps(plan_json(plan), indent=2) + "\n", encoding="utf-8")
    if plan.levels:
        paths["moe_chart"] = _moe_chart(plan, out / MOE_RHO_PNG)
        if plan.privacy_defn is PrivacyDefinition.PUREDP:
            paths["moe_eps_chart"] = _moe_eps_chart(plan, out / MOE_EPS_PNG)
        paths["split_chart"] = _split_chart(plan, out / SPLIT_PNG)
    md, page = build_report(plan, {k: p.name for k, p in paths.items()}).write(out / REPORT_MD, out / REPORT_HTML)
    paths["report_md"], paths["report_html"] = md, page
    return paths


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def build_report(plan: Plan, files: Mapping[str, str]):  # type: ignore[no-untyped-def]
    """The plan as a :class:`phsafe._plots.Document`."""
    from phsafe._plots import Bullets, Document, Heading, Image, Para, Table

    zcdp = plan.privacy_defn is PrivacyDefinition.ZCDP
    measure = "rho" if zcdp else "epsilon"
    cfg = plan.config
    doc = Document("PHSafe budget plan")
    run = ("Puerto Rico" if cfg.is_puerto_rico else
           f"{len(cfg.state_filter)} states" + (" (the 50 states and DC)" if set(cfg.state_filter) == STATE_CODES else ""))
    doc.add(Table(("Field", "Value"), [
        ["Mode", "MOE targets -> budgets" if plan.mode is PlanMode.TARGETS else "config budgets -> MOEs"],
        ["Source", f"`{plan.source}`"],
        ["Privacy definition of the config", "zCDP (rho, discrete Gaussian)" if zcdp else "pure DP (epsilon, two-sided geometric)"],
        ["Run", run],
        ["tau", ", ".join(f"{t} {n}" for t, n in cfg.tau.items())],
        ["Sensitivity", plan.bound.description],
        ["Budgets rounded up to", f"{plan.digits} significant digits"],
        ["delta for (epsilon, delta)", f"{plan.delta:g}"],
        ["Written config", f"`{files['config']}`" if "config" in files else "none (the input config is the plan)"],
    ]))
    if plan.notes:
        doc.add(Bullets(list(plan.notes)))

    doc.add(Heading(2, "How the margin of error is defined"), Bullets([
        "zCDP: MOE = 1.645 sigma with sigma^2 = Delta^2 / (2 rho), so rho = 1.645^2 Delta^2 / (2 MOE^2) "
        "(PHSafe paper Table 10, spec §6, `phsafe.accounting` `moe90`). "
        + ("Delta = 2 tau + 2 for person tables, 2 for unit tables (the PHSafe paper's bound)."
           if plan.bound is SensitivityBound.PAPER else
           "Delta is the exact sensitivity of each measurement (`docs/sensitivity.md`): L2 for rho, "
           "L1 for epsilon -- tau sqrt 2 and 2 tau where a unit change moves rows, sqrt 2 and 2 for PH1_num at *, "
           "max(tau, sqrt 2) and max(tau, 2) for PH4 at *, sqrt 2 and 2 for the unit tables, 1 at their one-cell "
           "levels. The table shows the config's (L2 for zCDP, L1 for pure DP)."),
        "Both noise distributions are integer-valued. Their exact 90% MOE is the smallest integer m "
        "with P(|X| <= m) >= 0.9 (half the width of the narrowest symmetric integer interval holding "
        "the noise with probability at least 90%).",
        "Pure DP: the planned epsilon is the smallest one (at the stated digits) whose exact MOE, "
        "computed from the closed form P(|X| <= m) = 1 - 2 q^(m+1)/(1+q), q = exp(-epsilon/Delta), "
        "is at most the target (rounded down to an integer). `phsafe.accounting` (and `phsafe audit "
        "report`) show 1.645 sd for pure DP instead; that column is included for reconciliation.",
        "For the discrete Gaussian the exact MOE (summing its pmf) is shown for information; the "
        "budgets follow the 1.645 sigma convention.",
        "Budgets are rounded up, never down, so every MOE is at most its target. (The production "
        "config rounds Table 10 to the nearest 6th decimal, so some of its MOEs exceed their targets "
        "slightly, e.g. 500.04 for rho 0.002619 at Delta 22.)",
    ]))

    doc.add(Heading(2, "Population-group levels"))
    header = ["Table", "Level", "tau", "Delta", "Cells", "MOE target", "rho (exact)", "rho", "1.645 sigma",
              "exact MOE (DG)", "epsilon", "exact MOE (geom.)", "1.645 sd (geom.)", "target met"]
    rows = []
    for lp in plan.levels:
        met = ""
        if lp.moe_target is not None:
            ok = (gaussian_moe_met(lp.rho, lp.l2_sensitivity, lp.moe_target) if zcdp and lp.rho is not None
                  else lp.geometric_halfwidth is not None and lp.geometric_halfwidth <= math.floor(lp.moe_target))
            met = "yes" if ok else "NO"
        rows.append([
            lp.table, f"`{lp.level.config_key}`", "-" if lp.tau is None else str(lp.tau), str(lp.sensitivity),
            str(lp.n_cells), "-" if lp.moe_target is None else amount_text(lp.moe_target),
            "-" if lp.rho_exact is None else amount_text(lp.rho_exact, 10),
            amount_text(lp.rho), _num(lp.gaussian_moe, "{:.3f}"), _int(lp.gaussian_halfwidth),
            amount_text(lp.epsilon), _int(lp.geometric_halfwidth), _num(lp.geometric_sd_moe, "{:.3f}"), met,
        ])
    if plan.mode is not PlanMode.TARGETS:
        header, rows = header[:-1], [r[:-1] for r in rows]
    doc.add(Table(header, rows))
    doc.add(Para(
        f"The config's budgets are the {measure} column. "
        + ("The epsilon column is the pure-DP budget that would give the same MOE. " if zcdp else
           "The rho column is the zCDP budget whose 1.645 sigma equals the exact geometric MOE. ")
        + "rho (exact) is the unrounded rho for the MOE target."
    ))

    doc.add(Heading(2, "Totals per table"))
    rho_t, eps_t = plan.table_totals("rho"), plan.table_totals("epsilon")
    f_rho, f_eps = plan.bounded_factor("rho"), plan.bounded_factor("epsilon")

    def scaled(x: Fraction | Decimal | None, factor: Fraction) -> Fraction | Decimal | None:
        return None if x is None else (x if x == INFINITE else factor * x)

    doc.add(Table(
        ("Table", "rho unbounded", f"rho bounded ({f_rho}x)", "epsilon unbounded", f"epsilon bounded ({f_eps}x)"),
        [[t, amount_text(rho_t[t], 12), amount_text(scaled(rho_t[t], f_rho), 12),
          amount_text(eps_t[t], 12), amount_text(scaled(eps_t[t], f_eps), 12)]
         for t in rho_t],
    ))

    doc.add(Heading(2, "Totals of the run"))
    rows = []
    for m in ("rho", "epsilon"):
        row = totals_row(m, plan.total(m), plan.delta, plan.bounded_factor(m))
        own = " (this config)" if m == measure else " (equivalent, same MOEs)"
        if m == "rho":
            rows.append([f"zCDP rho{own}", amount_text(row.unbounded, 12), amount_text(row.bounded, 12),
                         "n/a" if not row.eps_analytic else f"{_num(row.eps_analytic[0])} / {_num(row.eps_analytic[1])}",
                         "n/a" if not row.eps_renyi else f"{_num(row.eps_renyi[0])} / {_num(row.eps_renyi[1])}"])
        else:
            rows.append([f"pure-DP epsilon{own}", amount_text(row.unbounded, 12), amount_text(row.bounded, 12),
                         "delta = 0", "delta = 0"])
    doc.add(Table(("Measure", "Unbounded", "Bounded", f"epsilon at delta={plan.delta:g}, analytic (unb. / bounded)",
                   f"epsilon at delta={plan.delta:g}, Renyi (unb. / bounded)"), rows))
    doc.add(Para(
        "Totals are exact sums over levels (sequential composition). "
        + ("Bounded = 2 x unbounded: for zCDP by the PHSafe paper §5.3 (Theorems 3-4, bounded 2 rho rather "
           "than the generic 4 rho); for pure DP because changing a record is removing one and adding one. "
           if plan.bound is SensitivityBound.PAPER else
           "Bounded: 4 x unbounded for rho, 2 x for epsilon: with the exact sensitivities every bounded "
           "sensitivity is twice the unbounded one (`docs/sensitivity.md`), where the paper's loose bound "
           "leaves room for its 2 rho. ")
        + "(epsilon, delta): analytic "
        "epsilon = rho + 2 sqrt(rho ln(1/delta)), and the Renyi bound inf over alpha > 1 of "
        "rho alpha + (ln(1/delta) + (alpha-1) ln(1-1/alpha) - ln alpha)/(alpha-1) (SafeTab paper eq. 7; "
        "Kazan-Reiter Theorem 3), both from `phsafe.audit.report`."
    ))
    if plan.paper is not None:
        doc.add(*_paper_blocks(plan))
    if "moe_chart" in files or "split_chart" in files:
        doc.add(Heading(2, "Plots"))
        if "moe_chart" in files:
            doc.add(Image(files["moe_chart"], "90% MOE against rho for each tau"))
        if "moe_eps_chart" in files:
            doc.add(Image(files["moe_eps_chart"], "exact 90% MOE against epsilon for each tau"))
        if "split_chart" in files:
            doc.add(Image(files["split_chart"], "budget split of the run"))
    return doc


def _paper_blocks(plan: Plan) -> list[Any]:
    """The same targets with the paper's bound, level by level and in total."""
    from phsafe._plots import Heading, Para, Table

    assert plan.paper is not None
    paper = {lp.key: lp for lp in plan.paper.levels}
    rows = []
    for lp in plan.levels:
        p = paper[lp.key]
        ratio = "-" if not lp.rho or not p.rho else f"{float(Fraction(p.rho) / Fraction(lp.rho)):.3f}"
        rows.append([lp.table, f"`{lp.level.config_key}`", amount_text(lp.moe_target), str(p.l2_sensitivity),
                     str(lp.l2_sensitivity), amount_text(p.rho), amount_text(lp.rho), ratio])
    totals = []
    for measure in ("rho", "epsilon"):
        a, b = plan.paper.total(measure), plan.total(measure)
        ratio = "-" if not a or not b or INFINITE in (a, b) else f"{float(Fraction(a) / Fraction(b)):.3f}"
        f_paper, f_exact = plan.paper.bounded_factor(measure), plan.bounded_factor(measure)
        totals.append([measure, amount_text(a, 10), amount_text(b, 10), ratio,
                       amount_text(None if a is None else f_paper * Fraction(a), 10),
                       amount_text(None if b is None else f_exact * Fraction(b), 10)])
    return [
        Heading(2, "The same targets with the paper's bound"),
        Para("Each level's MOE target met with the paper's sensitivity (2 tau + 2, 2) and with the exact one: "
             "the budget each needs, and their ratio. Bounded totals: 2 x the paper's unbounded rho (its "
             "Theorems 3-4), 4 x the exact one."),
        Table(("Table", "Level", "MOE target", "Delta (paper)", "Delta (exact)", "rho (paper)", "rho (exact)",
               "paper / exact"), rows),
        Table(("Measure", "Unbounded, paper", "Unbounded, exact", "paper / exact", "Bounded, paper",
               "Bounded, exact"), totals),
    ]
