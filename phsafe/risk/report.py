"""Writing the disclosure-risk analysis: ``risk.json``, the Markdown/HTML report and its plot."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from phsafe.accounting import PlannedMeasurement
from phsafe.config import PrivacyDefinition
from phsafe.risk.analysis import (
    GAUSSIAN,
    GEOMETRIC,
    NONE,
    CellNoise,
    ConfigRisk,
    NoiseRisk,
    noise_pmf,
    risk_ratio,
    significant,
)

RISK_JSON = "risk.json"
REPORT_MD = "risk_report.md"
REPORT_HTML = "risk_report.html"
RISK_PNG = "risk_ratio.png"


PROBABILITY_FLOOR = 1e-300
"""Probabilities below this are printed as "< 1e-300" (their exact log10 is in risk.json)."""


def probability_text(x: float, log10: float | None = None) -> str:
    """A probability for people: six decimals, scientific below 1e-4, "< 1e-300" below that."""
    if log10 is not None and math.isfinite(log10) and log10 < math.log10(PROBABILITY_FLOOR):
        return f"< {PROBABILITY_FLOOR:.0e}"
    if x == 0:
        return "0"
    if x < PROBABILITY_FLOOR:
        return f"< {PROBABILITY_FLOOR:.0e}"
    if x < 1e-4:
        return f"{x:.3e}"
    return f"{x:.6f}"


def _prior_text(p: Fraction) -> str:
    return f"{p.numerator}/{p.denominator}"


def _noise_json(noise: CellNoise) -> dict[str, Any]:
    out: dict[str, Any] = {"distribution": noise.kind}
    if noise.kind == GAUSSIAN:
        out.update(sigma2=float(noise.sigma2), sigma2_exact=_frac(noise.sigma2),
                   effective_rho=float(noise.effective_rho), effective_rho_exact=_frac(noise.effective_rho))
    elif noise.kind == GEOMETRIC:
        out.update(scale=float(noise.scale), scale_exact=_frac(noise.scale),
                   effective_epsilon=float(noise.effective_epsilon),
                   effective_epsilon_exact=_frac(noise.effective_epsilon), variance=noise.variance)
    return out


def _frac(x: Fraction) -> str:
    from phsafe.amounts import format_exact

    return format_exact(x)


def _analysis_json(nr: NoiseRisk) -> dict[str, Any]:
    return {
        "noise": _noise_json(nr.noise),
        "marginal": [
            {"prior": _prior_text(m.prior), "posterior": m.posterior, "risk": m.risk,
             "p_correct_guess": m.p_correct,
             "log10_p_correct_guess": m.log10_p_correct if math.isfinite(m.log10_p_correct) else None,
             "decision_threshold_offset": m.threshold}
            for m in nr.marginals
        ],
        "released_values": [
            {"released": v.released, "quantile": v.quantile, "p_at_least_given_in": v.tail_in,
             "mass_given_out": v.mass_out, "mass_given_in": v.mass_in,
             "posterior": {_prior_text(p): x for p, x in zip(nr.priors, v.posterior)},
             "risk_ratio": {_prior_text(p): x for p, x in zip(nr.priors, v.risk)}}
            for v in nr.values
        ],
    }


def risk_json(cr: ConfigRisk) -> dict[str, Any]:
    """The analysis as JSON: one entry per measured level (each with its full analysis)."""
    def budget(m: PlannedMeasurement) -> str:
        return "Infinity" if m.is_noiseless else _frac(m.budget_fraction)

    return {
        "source": cr.source,
        "privacy_defn": cr.config.privacy_defn.value,
        "known_count": cr.known,
        "priors": [_prior_text(p) for p in next(iter(cr.by_noise.values())).priors] if cr.by_noise else [],
        "levels": [
            {"table": lr.measurement.table, "level": lr.measurement.level.config_key,
             "budget": budget(lr.measurement), "sensitivity": lr.measurement.sensitivity,
             **_analysis_json(cr.by_noise[lr.noise])}
            for lr in cr.levels
        ],
        "combined_person_tables": None if cr.combined is None else {
            "approximate": True, **_analysis_json(cr.combined)},
    }


def _explanation(cr: ConfigRisk):  # type: ignore[no-untyped-def]
    from phsafe._plots import Bullets, Heading, Para

    zcdp = cr.config.privacy_defn is PrivacyDefinition.ZCDP
    return [
        Heading(2, "What this report measures"),
        Para(
            "Every released cell of a population-group level carries independent noise. Picture an "
            "intruder who knows every person who could be counted in one released cell except one, "
            "the target -- so they know the count without the target, k -- and who wants to learn "
            "whether the target is in the cell too (for example: does this child live in a "
            "married-couple household in this state?). Before the release they believe it with "
            "probability p, the prior. After seeing the released count x, Bayes' rule gives their "
            "posterior. This is the worst case of Kazan and Reiter's analysis (§3.1): an intruder "
            "who knows fewer of the others learns less."
        ),
        Bullets([
            "Posterior P[in | x]: what the intruder believes after seeing x (eq. 10).",
            "Risk ratio R'(x) = posterior / prior (eq. 13): 1 means the release taught them nothing; "
            "the largest possible value is 1/p (certainty).",
            "Marginal risk R (eq. 15): R'(x) averaged over the values x that are released when the "
            "target really is in the cell -- the expected gain of confidence, before the release.",
            "Correct guess (eqs. 18-19): an intruder who must decide says \"in\" when the posterior "
            "exceeds 1/2; this is the probability that they then name the target correctly. For p = 1/2 "
            "it is at least 1/2 whatever the noise (a coin flip would do as well).",
            "P(X* = x | out) is the probability of the released value when the target is not in the "
            "cell (the paper's Table 3 'Probability Mass' column, whose caption says 'in' but whose "
            "numbers are for 'out'); P(X* = x | in) and P(X* >= x | in) are given too.",
        ]),
        Heading(2, "Which noise the intruder faces"),
        Para(
            ("A level with budget rho and sensitivity Delta adds discrete Gaussian noise with "
             "sigma^2 = Delta^2 / (2 rho) to each cell. Delta (2 tau + 2 for person tables, 2 for "
             "unit tables) is the worst-case change of a whole table when one person is added or "
             "removed; the target alone moves their own cell's count by one, so for this question the "
             "noise behaves as zCDP with the effective rho_eff = 1/(2 sigma^2) = rho / Delta^2. "
             if zcdp else
             "A level with budget epsilon and sensitivity Delta adds two-sided geometric noise with "
             "scale s = Delta / epsilon to each cell; the target moves their cell's count by one, so "
             "for this question the noise behaves as pure DP with epsilon_eff = epsilon / Delta. ")
            + "The results do not depend on k (paper §5.2); released values are shown for k = 0, "
            "a target who is unique in the cell, and shift by k otherwise."
        ),
        Heading(2, "Limits of this analysis"),
        Bullets([
            "One released cell at a time. The target is counted in one cell of every level of every "
            "table they belong to; an intruder who knew everyone else in all those cells could "
            "combine them. The last section gives an approximate figure for that (combined) case.",
            "The intruder asks about the target's own count. A person's presence can change more than "
            "one count (their household's type, tenure or size; Delta = 2 tau + 2 bounds this), and "
            "the differential-privacy guarantee -- the budgets -- covers those questions; this "
            "report does not.",
            "The priors are the intruder's; the report does not say which intruder is plausible.",
            "Post-processing of the released counts (e.g. non-negativity) cannot increase the risk.",
            "Numbers are exact sums of the noise distribution (no sampling, no continuous approximation).",
        ]),
    ]


def _analysis_blocks(nr: NoiseRisk, known: int):  # type: ignore[no-untyped-def]
    from phsafe._plots import Table

    pri = [_prior_text(p) for p in nr.priors]
    rows = []
    for v in nr.values:
        rows.append(
            [str(v.released), "-" if v.quantile is None else f"{v.quantile:g}", probability_text(v.tail_in),
             probability_text(v.mass_out), probability_text(v.mass_in)]
            + [f"{x:.4f}" for x in v.posterior] + [f"{x:.4f}" for x in v.risk]
        )
    header = (["released x", "quantile (in)", "P(X* >= x | in)", "P(X* = x | out)", "P(X* = x | in)"]
              + [f"posterior p={p}" for p in pri] + [f"R'(x) p={p}" for p in pri])
    marg = [[_prior_text(m.prior), f"{m.posterior:.6f}", f"{m.risk:.6f}",
             probability_text(m.p_correct, m.log10_p_correct),
             "never" if m.p_correct == 0 and m.threshold is None else
             ("always" if m.threshold is None else f"x >= {known + m.threshold}")]
            for m in nr.marginals]
    return [
        Table(header, rows),
        Table(("prior p", "marginal posterior (eq. 14)", "marginal risk R (eq. 15)",
               "P(correct guess) (eq. 19)", "intruder says \"in\" when"), marg),
    ]


def build_report(cr: ConfigRisk, files: Mapping[str, str]):  # type: ignore[no-untyped-def]
    """The analysis as a :class:`phsafe._plots.Document`."""
    from phsafe._plots import Document, Heading, Image, Para, Table

    doc = Document("PHSafe disclosure-risk analysis")
    zcdp = cr.config.privacy_defn is PrivacyDefinition.ZCDP
    doc.add(Table(("Field", "Value"), [
        ["Config", f"`{cr.source}`"],
        ["Privacy definition", "zCDP (discrete Gaussian)" if zcdp else "pure DP (two-sided geometric)"],
        ["Measured population-group levels", str(len(cr.levels))],
        ["Distinct noises", str(len(cr.by_noise))],
        ["Priors", ", ".join(_prior_text(p) for p in next(iter(cr.by_noise.values())).priors) if cr.by_noise else "-"],
        ["Method", "Kazan & Reiter §3.1 / §4.2 (no hierarchical information), exact sums"],
    ]))
    doc.add(*_explanation(cr))

    doc.add(Heading(2, "Summary by level"))
    priors = next(iter(cr.by_noise.values())).priors if cr.by_noise else ()
    eff = "rho_eff" if zcdp else "epsilon_eff"
    header = ["Table", "Level", "budget", "Delta", "noise variance", eff] \
        + [f"R p={_prior_text(p)}" for p in priors] + [f"P(correct) p={_prior_text(p)}" for p in priors]
    rows = []
    for lr in cr.levels:
        m, nr = lr.measurement, cr.by_noise[lr.noise]
        e = lr.noise.effective_rho if zcdp else lr.noise.effective_epsilon
        rows.append([m.table, f"`{m.level.config_key}`", "Infinity" if m.is_noiseless else _frac(m.budget_fraction),
                     str(m.sensitivity), significant(lr.noise.variance), "-" if e is None else significant(float(e))]
                    + [f"{mm.risk:.6f}" for mm in nr.marginals]
                    + [probability_text(mm.p_correct, mm.log10_p_correct) for mm in nr.marginals])
    doc.add(Table(header, rows))
    if "chart" in files:
        doc.add(Image(files["chart"], "risk ratio against released value"))

    doc.add(Heading(2, "Detail by noise"))
    doc.add(Para("Levels with the same budget and Delta have the same noise and the same risk; each "
                 "noise is detailed once, with the levels it applies to. Released values are the "
                 "quantiles of X* when the target is in the cell (k = %d)." % cr.known))
    for i, (noise, nr) in enumerate(cr.by_noise.items(), start=1):
        applies = [f"{lr.measurement.table} `{lr.measurement.level.config_key}`" for lr in cr.levels if lr.noise == noise]
        doc.add(Heading(3, f"Noise {i}: {noise.describe()}"))
        doc.add(Para("Applies to: " + ", ".join(applies) + "."))
        doc.add(*_analysis_blocks(nr, cr.known))

    if cr.combined is not None:
        doc.add(Heading(2, "Combined: the target's cell in every person-table level (approximate)"))
        doc.add(Para(
            "If an intruder knew everyone else in the target's cell of every measured level of every "
            "person table (a far stronger intruder than above: state and national cells), they could "
            "combine the independent releases. For Gaussian noise the combined evidence is that of a "
            "single release with rho_eff equal to the sum of the levels' rho_eff; with discrete "
            "Gaussian noise this is an approximation (exact in the first two moments of the "
            f"log-likelihood ratio). Sum of rho_eff: {significant(float(cr.combined.noise.effective_rho))}."
        ))
        doc.add(Para(f"Noise: {cr.combined.noise.describe()}."))
        doc.add(*_analysis_blocks(cr.combined, cr.known))
    return doc


def _chart(cr: ConfigRisk, path: Path) -> Path | None:
    """R'(x) against the released value for the noise with the largest effective parameter."""
    from phsafe._plots import Series, line_chart

    noisy = [n for n in cr.by_noise if n.kind != NONE]
    if not noisy:
        return None
    worst = max(noisy, key=lambda n: float(n.effective_rho if n.kind == GAUSSIAN else n.effective_epsilon))
    pmf = noise_pmf(worst)
    lo, hi = cr.known + 1 + pmf.quantile(0.001), cr.known + 1 + pmf.quantile(0.999)
    xs = np.unique(np.linspace(lo, hi, 200).round().astype(np.int64))
    series = [Series(f"p = {_prior_text(p)}", xs.tolist(), risk_ratio(worst, p, xs, cr.known).tolist(), "-")
              for p in cr.by_noise[worst].priors]
    eff = (f"rho_eff = {significant(float(worst.effective_rho), 4)}" if worst.kind == GAUSSIAN
           else f"epsilon_eff = {significant(float(worst.effective_epsilon), 4)}")
    return line_chart(path, series, title=f"Risk ratio R'(x) of the least noisy level ({eff})",
                      xlabel=f"released value x, 0.1% to 99.9% quantile when the target is in (k = {cr.known})",
                      ylabel="R'(x) = posterior / prior")


def write_risk(cr: ConfigRisk, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """Write ``risk.json``, ``risk_report.md``, ``risk_report.html`` and ``risk_ratio.png`` into
    ``out_dir``, a new or empty folder unless ``overwrite`` (:func:`phsafe._plots.report_folder`)."""
    from phsafe._plots import report_folder

    out = report_folder(out_dir, overwrite=overwrite)
    paths: dict[str, Path] = {}
    paths["json"] = out / RISK_JSON
    paths["json"].write_text(json.dumps(risk_json(cr), indent=2) + "\n", encoding="utf-8")
    chart = _chart(cr, out / RISK_PNG)
    if chart is not None:
        paths["chart"] = chart
    md, page = build_report(cr, {k: p.name for k, p in paths.items()}).write(out / REPORT_MD, out / REPORT_HTML)
    paths["report_md"], paths["report_html"] = md, page
    return paths
