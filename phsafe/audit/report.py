"""``phsafe audit report``: the auditors' report of a verified ledger, in Markdown and HTML.

The report is CONFIDENTIAL and says so on every page: it lists the input file digests, the
content fingerprints and the truncation keys the ledger recorded, facts about the confidential
inputs that must stay inside the enclave with the ledger (by default the report is written
beside it, ``<ledger folder>/audit-report/``). It is never published with the tables.

Per dataset it shows the policy cap, every recorded cap raise and content version (each with its
reason), the odometer and what is left; runs that spent and did not publish are named, with how
to complete them without new noise.

Per run and per dataset it lists, for every table x population-group level, the budget, the
sensitivity Delta, the noise variance sigma^2, the 90% margin of error and the number of cells,
and converts the totals:

* zCDP runs: unbounded rho (sequential composition: the exact sum), bounded rho = 2 rho (PHSafe
  paper §5.3) for a run calibrated to the paper's sensitivities, 4 rho for one calibrated to the
  exact ones (``docs/sensitivity.md``: every exact bounded sensitivity is twice the unbounded one,
  :func:`phsafe.sensitivity.bounded_factor`), and (epsilon, delta) at delta = 1e-10 both by the analytic bound
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
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path

from phsafe._plots import Block, Document, Heading, Para, Table, report_folder
from phsafe.config import PrivacyDefinition
from phsafe.amounts import Amount, add_amounts, amount_exceeds, format_exact
from phsafe.ledger import (
    LedgerState,
    RunAttempt,
    RunState,
    RunStatus,
    read_ledger,
)
from phsafe.sensitivity import SensitivityBound, bounded_factor

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
        bounded: Exact bounded-neighbour total (2x; 4x for zCDP runs calibrated to the exact
            sensitivities).
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


def totals(definition: PrivacyDefinition, amount: Amount, bounded: Amount | None = None) -> Totals:
    """Convert an exact total of ``definition`` (see :class:`Totals`); ``bounded`` defaults to
    twice ``amount`` (the paper's bound; :func:`run_bounded` gives a run's own)."""
    if bounded is None:
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


def bound_of(run: RunState) -> SensitivityBound:
    """The sensitivity bound a run's plan calibrated its noise to (one per run; the ledger checks)."""
    bounds = {spend.measurement.bound for spend in run.planned.values()}
    return bounds.pop() if len(bounds) == 1 else SensitivityBound.PAPER


def run_bounded(run: RunState, amount: Amount) -> Amount:
    """The bounded-neighbour loss of ``amount`` spent by ``run``: its bound's factor times it."""
    if not isinstance(amount, Fraction):
        return amount  # Infinity stays Infinity
    return bounded_factor(bound_of(run), zcdp=run.privacy_defn is PrivacyDefinition.ZCDP) * amount


def _dataset_bounded(state: LedgerState, runs: list[RunState], spent: Amount) -> Amount | None:
    """A dataset's bounded-neighbour total: each run's charge times its bound's factor."""
    if not isinstance(spent, Fraction) or all(bound_of(r) is SensitivityBound.PAPER for r in runs):
        return None  # twice the total
    unit = state.unit or next(iter(runs)).privacy_defn
    total: Amount = Fraction(0)
    for r in runs:
        charge = r.charge(unit)
        if not isinstance(charge, Fraction):
            return charge  # Infinity
        total = add_amounts(total, bounded_factor(bound_of(r), zcdp=unit is PrivacyDefinition.ZCDP) * charge)
    return total


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
    "Bounded (2x; 4x zCDP with exact sensitivities)",
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


def _orchestrated_by(a: RunAttempt) -> str:
    """Who ran an attempt: the command line, or a Prefect flow run (and its parent)."""
    o = a.orchestration
    if o is None:
        return "command line or API"
    return f"Prefect flow run {o.flow_run_id}" + (f" (subflow of {o.parent_flow_run_id})" if o.parent_flow_run_id else "")


def _attempt_blocks(run: RunState) -> list[Block]:
    rows = [
        [
            str(a.number),
            f"{'started' if a.number == 1 else 'resumed'} {a.time} (entry {a.seq})",
            a.code_version,
            a.resume_reason or "-",
            format_exact(a.lifetime_cap),
            a.cap_reason or "-",
            _orchestrated_by(a),
            _attempt_end(run, a),
        ]
        for a in run.attempts
    ]
    blocks: list[Block] = [
        Heading(3, "Attempts"),
        Table(
            ("Attempt", "Opened", "Code version", "Reason for resuming", "Lifetime cap", "Cap reason", "Run by",
             "Ended"),
            rows,
        ),
    ]
    respent = run.respent
    blocks.append(Heading(3, "Measurements spent more than once"))
    if not respent:
        blocks.append(Para("None: every measurement was spent at most once."))
    else:
        blocks.append(
            Table(
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


def _fp(text: str | None) -> str:
    return "-" if not text else f"{text[:16]}..."


def _run_blocks(run: RunState, state: LedgerState) -> list[Block]:
    status = {
        RunStatus.FINISHED: "finished",
        RunStatus.FAILED: f"failed: {run.failure_reason}",
        RunStatus.RUNNING: "no terminal entry (running or crashed; its whole plan stays reserved)",
    }[run.status]
    resumes = run.attempt - 1
    validated = {True: "yes (the full suites passed)", False: "NO (--no-validate)", None: "not recorded (first format)"}
    blocks: list[Block] = [
        Heading(2, f"Run {run.run_id}"),
        Table(
            ("Field", "Value"),
            [
                ["Status", status],
                ["Published to", run.output_path or ("-" if not run.published else "(first format: not recorded)")],
                ["Started", f"{run.started_time} (entry {run.started_seq})"],
                ["Ended", f"{run.terminal_time} (entry {run.terminal_seq})" if run.terminal_seq is not None else "-"],
                ["Attempts", f"{run.attempt} ({resumes} resume{'s' if resumes != 1 else ''}, "
                             f"{len(run.failures)} failed or crashed)"],
                ["Privacy definition", _unit(run.privacy_defn)],
                ["Sensitivity bound", bound_of(run).description],
                ["Dataset", run.dataset or "-"] + ([] if not run.legacy else []),
                ["Inputs validated", validated[run.validated]],
                ["Non-confidential (cap not enforced)", "YES" if run.non_confidential else "no"],
                ["Spent on the dataset before the run", format_exact(run.spent_before)],
                ["Planned total", format_exact(run.planned_total)],
                ["Lifetime cap" + (" (latest)" if resumes else ""), format_exact(run.lifetime_cap)],
                ["Cap reason", run.cap_reason or "-"],
                ["Declared re-release (the same records released again)", run.re_release or "no"],
                ["Charged to the dataset (re-spends included)", format_exact(run.charge())],
                ["of which re-spends", format_exact(_respend_charge(run))],
            ],
        ),
        Heading(3, "Lineage (confidential)"),
        Table(
            ("Item", "SHA-256 / value"),
            ([["content fingerprint (HMAC under the lineage key)", run.fingerprint]] if run.fingerprint else [])
            + ([["dataset id (first format)", run.legacy_dataset_id]] if run.legacy_dataset_id else [])
            + [[f"input {name}", digest] for name, digest in sorted(run.input_digests.items())]
            + [
                ["config", run.config_digest],
                ["code version", run.code_version + (" (at start; see Attempts)" if resumes else "")],
                ["truncation key", run.truncation_key],
            ],
        ),
        *_attempt_blocks(run),
        Heading(3, "Measurements"),
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
        Table(
            ("Table", "Level", "Budget", "Delta", "tau", "sigma^2", "90% MOE", "Cells", "Status", "INTENTs", "Charged"),
            rows,
        )
    )
    blocks.append(Heading(3, "Totals"))
    blocks.append(
        Table(
            _TOTALS_HEADER,
            _totals_rows("charged", totals(run.privacy_defn, run.charge(), run_bounded(run, run.charge())))
            + _totals_rows("planned", totals(run.privacy_defn, run.planned_total,
                                             run_bounded(run, run.planned_total))),
        )
    )
    blocks.append(Heading(3, "Outputs"))
    if run.outputs is None:
        blocks.append(Para("No outputs were published."))
    else:
        blocks.append(Table(("File", "SHA-256"), [[rel, digest] for rel, digest in sorted(run.outputs.items())]))
    return blocks


CONFIDENTIAL = (
    "CONFIDENTIAL -- keep this report inside the enclave with the ledger. It lists the input file "
    "digests, the content fingerprints and the truncation keys the ledger recorded: facts about the "
    "confidential inputs. It is never published with the tables; the public release carries only "
    "the signed ledger checkpoint and a keyed lineage commitment."
)


def _dataset_blocks(state: LedgerState) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Datasets")]
    unit = state.unit
    rows: list[list[str]] = []
    for account, runs in state.datasets().items():
        defn = unit or runs[0].privacy_defn
        spent = state.dataset_spent(account, defn)
        ds = state.dataset_states.get(account)
        if state.policy is not None and not account.startswith("legacy:"):
            cap = state.dataset_cap(account)
            left = "not enforced" if state.policy.non_confidential else (
                format_exact(Fraction(cap) - Fraction(spent)) if not amount_exceeds(spent, cap) and
                isinstance(cap, Fraction) else "0")
        else:
            cap, left = None, "per run (first format)"
        rows.append([
            account if not account.startswith("legacy:") else f"first-format dataset {account[7:23]}",
            str(len(runs)),
            str(len(ds.versions)) if ds else "-",
            format_exact(spent),
            "-" if cap is None else format_exact(cap),
            left,
        ])
    blocks.append(Table(("Dataset", "Runs", "Content versions", f"Spent ({_unit(unit) if unit else 'its unit'})",
                         "Lifetime cap", "Left"), rows))
    for name, ds in state.dataset_states.items():
        if ds.versions:
            blocks.append(Heading(3, f"Content versions of {name}"))
            blocks.append(Table(("Entry", "Declared", "Fingerprint (keyed)", "Reason"),
                                [[str(v.seq), v.time, _fp(v.fingerprint), v.reason] for v in ds.versions]))
        if ds.raises:
            blocks.append(Heading(3, f"Cap raises of {name}"))
            blocks.append(Table(("Entry", "Raised", "New cap", "Reason"),
                                [[str(r.seq), r.time, format_exact(r.lifetime_cap), r.reason] for r in ds.raises]))
    return blocks


def build_report(state: LedgerState, ledger_path: Path) -> Document:
    """The report, from a verified ledger."""
    digest = hashlib.sha256(Path(ledger_path).read_bytes()).hexdigest()
    policy = state.policy
    doc = Document("PHSafe privacy-loss audit report (CONFIDENTIAL)")
    doc.add(Para(CONFIDENTIAL))
    header = [
        ["Ledger", Path(ledger_path).name],
        ["Ledger SHA-256", digest],
        ["Format", "current" if policy is not None else "first (before policies; migrate with phsafe ledger migrate)"],
    ]
    if policy is not None:
        header += [
            ["Ledger id", policy.ledger_id],
            ["Kind", "non-confidential (throwaway)" if policy.non_confidential else "confidential"],
            ["Policy", f"every dataset's lifetime cap {format_exact(policy.lifetime_cap)} ({_unit(policy.privacy_defn)}), "
                       f"set at entry {policy.seq}: {policy.reason}"],
        ]
    header += [
        ["Entries", str(state.size)],
        ["Head hash", state.head_hash],
        ["Runs", str(len(state.runs))],
        ["Generated", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")],
        ["delta for (epsilon, delta)", f"{DELTA:g}"],
    ]
    doc.add(Table(("Field", "Value"), header))
    doc.add(Para(
        "The ledger's hash chain, sequence and rules were verified before this report was "
        "written. A failed run charges its dataset every INTENT it recorded (an INTENT without "
        "COMMITTED counts; a measurement spent again after a resume counts again); any other "
        "run -- finished, running or crashed -- charges its whole plan, each measurement times "
        "the number of its INTENTs if it was spent more than once. Nothing is refunded. "
        "Budgets and sums are exact; the epsilon figures are floating-point conversions."
    ))
    doc.add(*_dataset_blocks(state))
    doc.add(Heading(2, "Totals by dataset"))
    rows: list[list[str]] = []
    for account, runs in state.datasets().items():
        defns = {state.unit} if state.unit else {r.privacy_defn for r in runs}
        for defn in (PrivacyDefinition.ZCDP, PrivacyDefinition.PUREDP):
            if defn in defns:
                label = account if not account.startswith("legacy:") else account[7:23]
                spent = state.dataset_spent(account, defn)
                rows += _totals_rows(f"dataset {label} ({len(runs)} runs)",
                                     totals(defn, spent, _dataset_bounded(state, runs, spent)))
    doc.add(Table(_TOTALS_HEADER, rows))
    if len({r.privacy_defn for r in state.runs.values()}) > 1:
        doc.add(Para(
            "Runs of the other privacy definition count in the ledger's unit: a pure-DP spend of "
            "epsilon counts as epsilon^2/2 in zCDP; a zCDP spend has no pure-DP bound (Infinity)."
        ))
    unpublished = state.unpublished()
    doc.add(Heading(2, "Runs that spent and did not publish"))
    if unpublished:
        doc.add(Table(("Run", "Dataset", "Status", "Charged", "Committed", "Complete it with"),
                      [[r.run_id, r.dataset or "-", r.status.value, format_exact(r.charge()),
                        f"{len(r.reusable)} of {len(r.planned)}", f"phsafe private ... --resume {r.run_id}"]
                       for r in unpublished]))
    else:
        doc.add(Para("None: every run that spent published its release."))
    if state.repairs:
        doc.add(Heading(2, "Repaired interrupted writes"))
        doc.add(Table(("Entry", "Repaired", "Dropped bytes", "Their SHA-256", "Reason"),
                      [[str(r.seq), r.time, str(r.dropped_bytes), r.dropped_sha256, r.reason] for r in state.repairs]))
    if any(r.non_confidential for r in state.runs.values()):
        doc.add(Para("WARNING: some runs were declared non-confidential; the lifetime cap was not enforced for them."))
    for run in state.runs.values():
        doc.add(*_run_blocks(run, state))
    doc.add(Heading(2, "Method"))
    doc.add(Para(
        "sigma^2 = Delta^2 / (2 rho) for the discrete Gaussian; 2e^(-1/s)/(1-e^(-1/s))^2 with "
        "s = Delta/epsilon for the two-sided geometric. 90% MOE = 1.645 sigma. Bounded "
        "neighbours: 2x (PHSafe paper, section 5.3). Analytic: epsilon = rho + 2 sqrt(rho ln(1/delta)). "
        "Renyi: epsilon = inf over alpha > 1 of rho alpha + (ln(1/delta) + (alpha-1) ln(1-1/alpha) "
        "- ln alpha)/(alpha-1) (SafeTab paper, eq. 7), minimised numerically."
    ))
    return doc


def default_report_dir(ledger: Path) -> Path:
    """Where the report goes by default: beside the ledger, inside the confidential zone."""
    return Path(ledger).absolute().parent / "audit-report"


def write_report(ledger: Path, out_dir: Path | None = None, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Verify ``ledger`` and write the Markdown and HTML reports into ``out_dir``.

    Args:
        ledger: The ledger.
        out_dir: The report folder (default :func:`default_report_dir`); a new or empty folder.
        overwrite: Replace what ``out_dir`` holds.

    Raises:
        LedgerError: The ledger does not verify (no report is written then).
        ReportFolderExists: ``out_dir`` holds files and ``overwrite`` is not set.
    """
    state = read_ledger(Path(ledger))
    doc = build_report(state, Path(ledger))
    folder = report_folder(out_dir or default_report_dir(ledger), overwrite=overwrite, what="report folder")
    return doc.write(folder / REPORT_MD, folder / REPORT_HTML)
