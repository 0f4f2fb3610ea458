"""``phsafe audit report``: the auditors' report of a verified ledger, in Markdown and HTML.

Per run and per dataset it lists, for every table x population-group level, the budget, the
sensitivity Delta, the noise variance sigma^2, the 90% margin of error and the number of cells,
and converts the totals:

* zCDP runs: unbounded rho (sequential composition: the exact sum), bounded rho = 2 rho (PHSafe
  paper §5.3), and (epsilon, delta) at delta = 1e-10 both by the analytic bound
  ``epsilon = rho + 2 sqrt(rho ln(1/delta))`` (SafeTab paper, Lemma 5) and by the tighter numeric
  bound ``inf over alpha > 1 of rho alpha + (ln(1/delta) + (alpha-1) ln(1-1/alpha) - ln alpha) / (alpha-1)``
  (SafeTab paper, eq. 7);
* pure-DP runs: epsilon directly (delta = 0) and bounded epsilon = 2 epsilon.

A run that was resumed shows its attempts (how each ended, why it was resumed, the code version
and the cap of each), the measurements spent more than once (every INTENT entry), and its charge
with every re-spend included (see :mod:`phsafe.ledger`, "Lifetime rule").

Floats appear only in these derived figures; every budget and sum is printed exactly.
"""

from __future__ import annotations

import hashlib
import html
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Sequence

from phsafe.config import PrivacyDefinition
from phsafe.ledger import (
    Amount,
    LedgerState,
    RunAttempt,
    RunState,
    RunStatus,
    add_amounts,
    format_exact,
    read_ledger,
)

DELTA = 1e-10
REPORT_MD = "audit_report.md"
REPORT_HTML = "audit_report.html"

# Search range of ln(alpha - 1) for eq. 7: alpha from 1 + 2e-9 to 1 + 5e8 covers every rho of
# practical interest (the optimum is near 1 + sqrt(ln(1/delta) / rho)).
_LOG_LO, _LOG_HI, _GRID = -20.0, 20.0, 4001
_GOLDEN = (math.sqrt(5) - 1) / 2


# --------------------------------------------------------------------------------------------
# Conversions
# --------------------------------------------------------------------------------------------


def epsilon_analytic(rho: float, delta: float = DELTA) -> float:
    """epsilon = rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke; SafeTab paper, Lemma 5)."""
    if math.isinf(rho):
        return math.inf
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def renyi_epsilon_at(alpha: float, rho: float, delta: float = DELTA) -> float:
    """The (epsilon, delta) bound of rho-zCDP through order ``alpha`` (SafeTab paper, eq. 6)."""
    a1 = alpha - 1.0
    return rho * alpha + (math.log(1.0 / delta) + a1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / a1


def epsilon_renyi(rho: float, delta: float = DELTA) -> tuple[float, float]:
    """The tighter numeric bound of SafeTab eq. 7: minimise over Renyi orders alpha > 1.

    Every alpha gives a valid bound, so the result is a valid epsilon even if the search stops
    short of the exact infimum; a log-spaced grid finds the basin and a golden-section search
    refines it.

    Returns:
        ``(epsilon, alpha)`` at the best order found.
    """
    if math.isinf(rho):
        return math.inf, math.nan
    if rho == 0:
        return 0.0, math.inf

    def f(x: float) -> float:
        return renyi_epsilon_at(1.0 + math.exp(x), rho, delta)

    step = (_LOG_HI - _LOG_LO) / (_GRID - 1)
    xs = [_LOG_LO + i * step for i in range(_GRID)]
    values = [f(x) for x in xs]
    best = min(range(_GRID), key=values.__getitem__)
    lo, hi = xs[max(best - 1, 0)], xs[min(best + 1, _GRID - 1)]
    c, d = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            hi, d, fd = d, c, fc
            c = hi - _GOLDEN * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + _GOLDEN * (hi - lo)
            fd = f(d)
        if hi - lo < 1e-12:
            break
    x = min((xs[best], c, d), key=f)
    return f(x), 1.0 + math.exp(x)


@dataclass(frozen=True)
class Totals:
    """A privacy-loss total and its conversions.

    Attributes:
        definition: zCDP (``amount`` is rho) or pure DP (``amount`` is epsilon).
        amount: Exact unbounded total.
        bounded: Exact bounded-neighbour total (2x).
        eps_analytic: zCDP only: analytic epsilon at ``DELTA``.
        eps_renyi: zCDP only: numeric epsilon at ``DELTA`` (SafeTab eq. 7).
        alpha: zCDP only: the Renyi order of ``eps_renyi``.
        bounded_eps_analytic: zCDP only: analytic epsilon of the bounded rho.
        bounded_eps_renyi: zCDP only: numeric epsilon of the bounded rho.
    """

    definition: PrivacyDefinition
    amount: Amount
    bounded: Amount
    eps_analytic: float | None = None
    eps_renyi: float | None = None
    alpha: float | None = None
    bounded_eps_analytic: float | None = None
    bounded_eps_renyi: float | None = None


def totals(definition: PrivacyDefinition, amount: Amount) -> Totals:
    """Convert an exact total of ``definition`` (see :class:`Totals`)."""
    bounded = 2 * amount if isinstance(amount, Fraction) else amount  # Infinity stays Infinity
    if definition is PrivacyDefinition.PUREDP:
        return Totals(definition, amount, bounded)
    rho = float(amount)
    eps, alpha = epsilon_renyi(rho)
    return Totals(
        definition,
        amount,
        bounded,
        eps_analytic=epsilon_analytic(rho),
        eps_renyi=eps,
        alpha=alpha,
        bounded_eps_analytic=epsilon_analytic(float(bounded)),
        bounded_eps_renyi=epsilon_renyi(float(bounded))[0],
    )


# --------------------------------------------------------------------------------------------
# Document model: a few block types rendered to both Markdown and HTML
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Heading:
    level: int
    text: str


@dataclass(frozen=True)
class _Para:
    text: str


@dataclass(frozen=True)
class _Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]


_Block = _Heading | _Para | _Table


def _num(x: float | None, digits: int = 6) -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "Infinity"
    return f"{x:.{digits}f}"


def _sig(x: float) -> str:
    return "Infinity" if math.isinf(x) else f"{x:.10g}"


def _unit(defn: PrivacyDefinition) -> str:
    return "rho (zCDP)" if defn is PrivacyDefinition.ZCDP else "epsilon (pure DP)"


def _totals_rows(label: str, t: Totals) -> list[list[str]]:
    if t.definition is PrivacyDefinition.PUREDP:
        return [[label, "epsilon (pure DP, delta = 0)", format_exact(t.amount), format_exact(t.bounded), "", ""]]
    return [
        [
            label,
            "rho (zCDP)",
            format_exact(t.amount),
            format_exact(t.bounded),
            f"{_num(t.eps_analytic)} / {_num(t.bounded_eps_analytic)}",
            f"{_num(t.eps_renyi)} (alpha {_num(t.alpha, 3)}) / {_num(t.bounded_eps_renyi)}",
        ]
    ]


_TOTALS_HEADER = (
    "Scope",
    "Measure",
    "Unbounded",
    "Bounded (2x)",
    f"epsilon analytic at delta={DELTA:g} (unbounded / bounded)",
    f"epsilon Renyi, eq. 7, at delta={DELTA:g} (unbounded / bounded)",
)


def _status_of(run: RunState, key: str) -> str:
    """The state of ``key``'s latest spend (earlier spends are in the INTENTs column)."""
    if key in run.reusable:
        return "committed"
    if key in run.intents:
        return "INTENT only (counts as spent)"
    if run.status is RunStatus.FAILED:
        return "not spent (released)"
    return "reserved (no terminal entry)" if run.status is RunStatus.RUNNING else "not spent"


def _attempt_end(run: RunState, a: RunAttempt) -> str:
    if a.end is RunStatus.FINISHED:
        return f"finished (entry {a.end_seq})"
    if a.end is RunStatus.FAILED:
        return f"failed (entry {a.end_seq}): {a.end_reason}"
    if a.number < run.attempt:
        return "crashed: no terminal entry before the next attempt"
    return "running or crashed (no terminal entry)"


def _attempt_blocks(run: RunState) -> list[_Block]:
    rows = [
        [
            str(a.number),
            f"{'started' if a.number == 1 else 'resumed'} {a.time} (entry {a.seq})",
            a.code_version,
            a.resume_reason or "-",
            format_exact(a.lifetime_cap),
            a.cap_reason or "-",
            _attempt_end(run, a),
        ]
        for a in run.attempts
    ]
    blocks: list[_Block] = [
        _Heading(3, "Attempts"),
        _Table(
            ("Attempt", "Opened", "Code version", "Reason for resuming", "Lifetime cap", "Cap reason", "Ended"),
            rows,
        ),
    ]
    respent = run.respent
    blocks.append(_Heading(3, "Measurements spent more than once"))
    if not respent:
        blocks.append(_Para("None: every measurement was spent at most once."))
    else:
        blocks.append(
            _Table(
                ("Measurement", "INTENT entries", "Budget", "Times charged", "Charged"),
                [
                    [
                        key,
                        ", ".join(str(seq) for seq in run.intents[key]),
                        run.planned[key].record["budget"],
                        str(run.multiplicity(key)),
                        format_exact(run.key_charge(key)),
                    ]
                    for key in run.planned
                    if key in respent
                ],
            )
        )
    return blocks


def _respend_charge(run: RunState) -> Amount:
    """The part of the run's charge due to re-spends: each INTENT beyond a key's first."""
    total: Amount = Fraction(0)
    for key, n in run.respent.items():
        budget = run.planned[key].budget
        extra = budget * (n - 1) if isinstance(budget, Fraction) else budget  # Infinity stays Infinity
        total = add_amounts(total, extra)
    return total


def _run_blocks(run: RunState) -> list[_Block]:
    status = {
        RunStatus.FINISHED: "finished",
        RunStatus.FAILED: f"failed: {run.failure_reason}",
        RunStatus.RUNNING: "no terminal entry (running or crashed; its whole plan stays reserved)",
    }[run.status]
    resumes = run.attempt - 1
    blocks: list[_Block] = [
        _Heading(2, f"Run {run.run_id}"),
        _Table(
            ("Field", "Value"),
            [
                ["Status", status],
                ["Started", f"{run.started_time} (entry {run.started_seq})"],
                ["Ended", f"{run.terminal_time} (entry {run.terminal_seq})" if run.terminal_seq is not None else "-"],
                ["Attempts", f"{run.attempt} ({resumes} resume{'s' if resumes != 1 else ''}, "
                             f"{len(run.failures)} failed or crashed)"],
                ["Privacy definition", _unit(run.privacy_defn)],
                ["Dataset", run.dataset_id],
                ["Non-confidential (cap not enforced)", "YES" if run.non_confidential else "no"],
                ["Spent on the dataset before the run", format_exact(run.spent_before)],
                ["Planned total", format_exact(run.planned_total)],
                ["Lifetime cap" + (" (latest)" if resumes else ""), format_exact(run.lifetime_cap)],
                ["Cap reason", run.cap_reason or "-"],
                ["Charged to the dataset (re-spends included)", format_exact(run.charge())],
                ["of which re-spends", format_exact(_respend_charge(run))],
            ],
        ),
        _Heading(3, "Lineage"),
        _Table(
            ("Item", "SHA-256 / value"),
            [[f"input {name}", digest] for name, digest in sorted(run.input_digests.items())]
            + [
                ["config", run.config_digest],
                ["code version", run.code_version + (" (at start; see Attempts)" if resumes else "")],
                ["truncation key", run.truncation_key],
            ],
        ),
        *_attempt_blocks(run),
        _Heading(3, "Measurements"),
    ]
    rows = []
    for spend in run.planned.values():
        m = spend.measurement
        rows.append(
            [
                m.table,
                m.level.config_key,
                spend.record["budget"],
                str(m.sensitivity),
                "-" if m.tau is None else str(m.tau),
                _sig(m.variance) if not m.is_noiseless else "0 (no noise)",
                _sig(m.moe90) if not m.is_noiseless else "0",
                str(m.n_cells),
                _status_of(run, m.key),
                str(len(run.intents.get(m.key, ()))),
                format_exact(run.key_charge(m.key)),
            ]
        )
    blocks.append(
        _Table(
            ("Table", "Level", "Budget", "Delta", "tau", "sigma^2", "90% MOE", "Cells", "Status", "INTENTs", "Charged"),
            rows,
        )
    )
    blocks.append(_Heading(3, "Totals"))
    blocks.append(
        _Table(
            _TOTALS_HEADER,
            _totals_rows("charged", totals(run.privacy_defn, run.charge()))
            + _totals_rows("planned", totals(run.privacy_defn, run.planned_total)),
        )
    )
    blocks.append(_Heading(3, "Outputs"))
    if run.outputs is None:
        blocks.append(_Para("No outputs were published."))
    else:
        blocks.append(
            _Table(("File", "SHA-256"), [[rel, digest] for rel, digest in sorted(run.outputs.items())])
        )
    return blocks


def build_report(state: LedgerState, ledger_path: Path) -> list[_Block]:
    """The report's blocks, from a verified ledger."""
    digest = hashlib.sha256(Path(ledger_path).read_bytes()).hexdigest()
    blocks: list[_Block] = [
        _Heading(1, "PHSafe privacy-loss audit report"),
        _Table(
            ("Field", "Value"),
            [
                ["Ledger", Path(ledger_path).name],
                ["Ledger SHA-256", digest],
                ["Entries", str(state.size)],
                ["Head hash", state.head_hash],
                ["Runs", str(len(state.runs))],
                ["Generated", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")],
                ["delta for (epsilon, delta)", f"{DELTA:g}"],
            ],
        ),
        _Para(
            "The ledger's hash chain, sequence and rules were verified before this report was "
            "written. A failed run charges its dataset every INTENT it recorded (an INTENT without "
            "COMMITTED counts; a measurement spent again after a resume counts again); any other "
            "run -- finished, running or crashed -- charges its whole plan, each measurement times "
            "the number of its INTENTs if it was spent more than once. Nothing is refunded. "
            "Budgets and sums are exact; the epsilon figures are floating-point conversions."
        ),
        _Heading(2, "Totals by dataset"),
    ]
    rows: list[list[str]] = []
    for ds, runs in state.datasets().items():
        defns = {r.privacy_defn for r in runs}
        for defn in (PrivacyDefinition.ZCDP, PrivacyDefinition.PUREDP):
            if defn in defns:
                rows += _totals_rows(f"dataset {ds[:16]} ({len(runs)} runs)", totals(defn, state.dataset_spent(ds, defn)))
    blocks.append(_Table(_TOTALS_HEADER, rows))
    if len({r.privacy_defn for r in state.runs.values()}) > 1:
        blocks.append(
            _Para(
                "Datasets with both kinds of run are also shown in zCDP: a pure-DP spend of "
                "epsilon counts as epsilon^2/2; a zCDP spend has no pure-DP bound (Infinity)."
            )
        )
    if any(r.non_confidential for r in state.runs.values()):
        blocks.append(
            _Para("WARNING: some runs were declared non-confidential; the lifetime cap was not enforced for them.")
        )
    for run in state.runs.values():
        blocks.extend(_run_blocks(run))
    blocks.append(_Heading(2, "Method"))
    blocks.append(
        _Para(
            "sigma^2 = Delta^2 / (2 rho) for the discrete Gaussian; 2e^(-1/s)/(1-e^(-1/s))^2 with "
            "s = Delta/epsilon for the two-sided geometric. 90% MOE = 1.645 sigma. Bounded "
            "neighbours: 2x (PHSafe paper, section 5.3). Analytic: epsilon = rho + 2 sqrt(rho ln(1/delta)). "
            "Renyi: epsilon = inf over alpha > 1 of rho alpha + (ln(1/delta) + (alpha-1) ln(1-1/alpha) "
            "- ln alpha)/(alpha-1) (SafeTab paper, eq. 7), minimised numerically."
        )
    )
    return blocks


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


def render_markdown(blocks: Iterable[_Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, _Heading):
            out += ["#" * b.level + " " + _md_escape(b.text), ""]
        elif isinstance(b, _Para):
            out += [_md_escape(b.text), ""]
        else:
            out.append("| " + " | ".join(_md_escape(h) for h in b.header) + " |")
            out.append("|" + "|".join("---" for _ in b.header) + "|")
            out += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in b.rows]
            out.append("")
    return "\n".join(out)


_CSS = (
    "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:0.5em 0 1.5em}"
    "td,th{border:1px solid #999;padding:2px 6px;font-size:90%}th{background:#eee}"
)


def render_html(blocks: Iterable[_Block]) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>PHSafe privacy-loss audit report</title>',
        f"<style>{_CSS}</style></head><body>",
    ]
    for b in blocks:
        if isinstance(b, _Heading):
            out.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, _Para):
            out.append(f"<p>{html.escape(b.text)}</p>")
        else:
            out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b.header) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in b.rows]
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(ledger: Path, out_dir: Path) -> tuple[Path, Path]:
    """Verify ``ledger`` and write the Markdown and HTML reports into ``out_dir``.

    Raises:
        LedgerError: The ledger does not verify (no report is written then).
    """
    state = read_ledger(Path(ledger))
    blocks = build_report(state, Path(ledger))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / REPORT_MD, out_dir / REPORT_HTML
    md.write_text(render_markdown(blocks), encoding="utf-8")
    page.write_text(render_html(blocks), encoding="utf-8")
    return md, page
