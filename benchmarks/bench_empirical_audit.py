"""The empirical privacy audit's goals, measured (issues 30, 34, 36): not timed tests, a script.

    .venv/bin/python benchmarks/bench_empirical_audit.py quick [--seed S] [--workers N] [--sensitivity both]
    .venv/bin/python benchmarks/bench_empirical_audit.py bugs [--sensitivity both] [--seed S]
    .venv/bin/python benchmarks/bench_empirical_audit.py false-alarms [--seeds 20] [--first 1] [--sensitivity both]
    .venv/bin/python benchmarks/bench_empirical_audit.py full-plan

* ``quick``: ``phsafe audit empirical --mode quick`` (production US config) in a child process:
  its wall time, the CPU-seconds of the whole process tree (the command and its workers), peak
  memory and the machine's load, and the goals: at most 3 CPU-minutes per calibration;
  epsilon_hat / epsilon >= 0.5 on the whole-table rows of PH3, PH7, PH1_num, PH4 and PH2 with
  the paper's sensitivities (production budgets); >= 0.85 on the best-audited level of every
  table with the exact ones (the person tables at production budgets, the unit tables at the
  quick mode's scale).
* ``bugs``: the planted-bug corpus of tests/_planted_bugs.py -- the gross bugs at PH3 and PH7, the
  defects smaller than 2x at one level of PH1_num -- each audited in quick mode under each
  calibration (that table alone, its planned runs, alpha 0.05): the verdict of the planted row,
  the checks that fail, and the runs the black-box verdict needs at alpha 0.05 with 90% power
  (the audit's own planning arithmetic at the measured mu_hat).
* ``false-alarms``: quick audits of correct code with seeds first .. first + seeds - 1 (both
  calibrations in each by default). A false alarm is an audit of one calibration that fails: a
  VIOLATION or EXCESS row, or a failed check (WEAK rows are listed, not counted: they fail
  nothing). Each audit's summary is appended as it ends; seeds already recorded with the same
  plan (the runs of every table) are skipped, so a long series can be stopped and resumed.
* ``full-plan``: the full mode's planned runs per table and calibration, and its CPU time
  extrapolated from each table's per-run CPU measured at its production budgets over ``--runs``
  runs (a run costs the same whatever the number of runs).

Every result is appended to ``benchmarks/_work/results.jsonl``; the quick audits' folders are
kept under ``benchmarks/_work/empirical-audit/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "benchmarks" / "_work"
sys.path.insert(0, str(REPO))  # tests/_planted_bugs.py

from _measure import run_phase  # noqa: E402 -- beside this script

PAPER_GOAL_TABLES = ("PH3", "PH7", "PH1_num", "PH4", "PH2")
PAPER_GOAL_RATIO = 0.5
EXACT_GOAL_RATIO = 0.85
CPU_GOAL_SECONDS = 180  # per calibration


def _record(entry: dict) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "results.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _recorded() -> list[dict]:
    path = WORK / "results.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _load() -> float:
    return os.getloadavg()[0]


def _goals(rows: list[dict], calibrations: list[str]) -> dict:
    out = {}
    for c in calibrations:
        mine = [r for r in rows if r["sensitivity"] == c]
        if c == "paper":
            whole = {r["table"]: r["epsilon_ratio"] or 0.0 for r in mine if r["level"] == "all"}
            ratios = {t: whole[t] for t in PAPER_GOAL_TABLES if t in whole}
            out[c] = {"ratios": ratios, "met": all(v >= PAPER_GOAL_RATIO for v in ratios.values())}
        else:
            best = {}
            for r in mine:
                if r["level"] != "all":
                    best[r["table"]] = max(best.get(r["table"], 0.0), r["epsilon_ratio"] or 0.0)
            lead = {r["table"]: r["level"] for r in mine if r.get("lead")}
            out[c] = {"ratios": best, "lead": lead, "met": all(v >= EXACT_GOAL_RATIO for v in best.values())}
    return out


def _plan_runs(sensitivity: str) -> dict[str, int]:
    """The quick plan's runs per calibration and table: a series is resumed only over audits of
    the same plan (the code that decides the runs is what a series measures)."""
    from phsafe.audit.empirical import AuditSettings
    from phsafe.audit.empirical.audit import plan_audit

    return {f"{t.sensitivity}/{t.table}": t.runs for t in plan_audit(AuditSettings(sensitivity=sensitivity)).tables}


def _quick(seed: int, workers: int | None, sensitivity: str, label: str) -> dict:
    out = WORK / "empirical-audit" / f"{label}-{sensitivity}-seed{seed}"
    phsafe = Path(sys.executable).parent / "phsafe"
    args = [str(phsafe), "-q", "audit", "empirical", "--mode", "quick", "--seed", str(seed), "--sensitivity",
            sensitivity, "--out", str(out), "--overwrite"]
    if workers is not None:
        args += ["--workers", str(workers)]
    load_before = _load()
    phase = run_phase(f"empirical audit quick seed {seed} ({sensitivity})", args, check=False)  # exit 1: failed
    document = json.loads((out / "audit.json").read_text())
    rows = document["tables"]
    calibrations = document["sensitivity"]
    alarms = {}
    for c in calibrations:
        mine = [r for r in rows if r["sensitivity"] == c]
        failed_checks = [(k["name"], k["table"], k["level"]) for k in document["checks"] if k["status"] == "FAIL"
                         and k.get("sensitivity") in (c, None)]
        alarms[c] = {
            "violations": [(r["table"], r["level"]) for r in mine if r["verdict"] == "VIOLATION"],
            "excess": [(r["table"], r["level"]) for r in mine if r["verdict"] == "EXCESS"],
            "weak": [(r["table"], r["level"]) for r in mine if r["verdict"] == "WEAK"],
            "inconclusive": sum(r["verdict"] == "INCONCLUSIVE" for r in mine),
            "failed_checks": failed_checks,
        }
        alarms[c]["false_alarm"] = bool(alarms[c]["violations"] or alarms[c]["excess"] or failed_checks)
    cpu_by = {c: round(sum({(r["table"]): r["cpu_seconds"] for r in rows if r["sensitivity"] == c}.values()), 1)
              for c in calibrations}
    entry = {
        "benchmark": "empirical_audit_quick", "label": label, "seed": seed, "sensitivity": sensitivity,
        "workers": document.get("workers"), **phase.as_dict(), "load_before": round(load_before, 1),
        "load_after": round(_load(), 1), "verdict": document["verdict"], "goals": _goals(rows, calibrations),
        "cpu_goal_met": phase.cpu_seconds <= CPU_GOAL_SECONDS * len(calibrations),
        "plan_runs": {f"{r['sensitivity']}/{r['table']}": r["runs"] for r in rows if r["level"] == "all"},
        "table_cpu_seconds": cpu_by, "alarms": alarms,
        "rows": [{k: r.get(k) for k in ("sensitivity", "table", "level", "mu_lb", "mu_ub", "mu_reach", "mu_declared",
                                        "ceiling", "epsilon_ratio", "epsilon_ceiling", "verdict", "lead", "runs",
                                        "runs_to_separate", "seconds", "cpu_seconds", "budget_scale",
                                        "canaries_per_run")} for r in rows],
        "folder": str(out),
    }
    _record(entry)
    return entry


def quick(args: argparse.Namespace) -> None:
    entry = _quick(args.seed, args.workers, args.sensitivity, "quick")
    print(json.dumps({k: v for k, v in entry.items() if k != "rows"}, indent=1))
    print(f"{'sens':5s} {'table':10s} {'level':10s} {'mu_lb':>7s} {'mu_ub':>7s} {'reach':>7s} {'decl':>7s} "
          f"{'ceil':>6s} {'eps/eps':>7s} {'verdict':12s} {'runs':>6s} {'cpu s':>6s}")
    for r in entry["rows"]:
        f = lambda x: "-" if x is None else f"{x:7.3f}"  # noqa: E731
        print(f"{r['sensitivity']:5s} {r['table']:10s} {r['level'] + (' *' if r['lead'] else ''):10s} "
              f"{f(r['mu_lb'])} {f(r['mu_ub'])} {f(r['mu_reach'])} {f(r['mu_declared'])} {f(r['ceiling'])[1:]} "
              f"{f(r['epsilon_ratio'])} {r['verdict']:12s} {r['runs']:6d} {r['cpu_seconds']:6.0f}")


def _runs_to_catch(row, settings, plan, threshold: float, power: float = 0.9) -> int | None:  # type: ignore[no-untyped-def]
    """Runs after which the row's mu_lb exceeds ``threshold`` with probability ``power`` at the
    row's alpha, if its mu is the measured mu_hat (the plan's normal approximations)."""
    from scipy import stats

    from phsafe.audit.empirical.audit import _rate_spread

    if row.mu_hat is None or not math.isfinite(row.mu_hat) or row.mu_hat <= threshold:
        return None
    z = float(stats.norm.isf(row.alpha / 2))
    s = _rate_spread(row.mu_hat)
    per_side = ((2 * z * s + float(stats.norm.ppf(power)) * math.sqrt(2) * s) / (row.mu_hat - threshold)) ** 2
    return max(1, math.ceil(per_side / (row.canaries_per_run / 2.0)))


def bugs(args: argparse.Namespace) -> None:
    from phsafe.audit.empirical import AuditSettings, default_workers, run_audit
    from phsafe.audit.empirical.audit import plan_audit
    from tests import _planted_bugs

    calibrations = ["paper", "exact"] if args.sensitivity == "both" else [args.sensitivity]
    cases = [(m, ("PH3", "PH7")) for m in _planted_bugs.corpus()] + [(m, ("PH1_num",))
                                                                     for m in _planted_bugs.small_defects()]
    for mechanism, tables in cases:
        for calibration in calibrations:
            settings = AuditSettings(tables=tables, seed=args.seed, sensitivity=calibration,
                                     workers=args.workers or default_workers())
            wall, cpu = time.perf_counter(), time.process_time()
            result = run_audit(settings, mechanism)
            plan = plan_audit(settings, mechanism)
            flagged_rows = {f"{r.table}/{r.level}": r.verdict for r in result.rows if r.verdict in
                            ("VIOLATION", "EXCESS", "WEAK")}
            planted = getattr(mechanism, "level", None)
            rows = [r for r in result.rows if (r.level == planted if planted else r.level == "all")]
            needed = {}
            for r in rows:
                key = f"{r.table}/{r.level}"
                needed[key] = {
                    "verdict": r.verdict, "mu_lb": round(r.mu_lb, 3), "mu_hat": round(r.mu_hat, 3),
                    "mu_declared": round(r.mu_declared, 3), "excess_threshold": round(r.excess_threshold, 3),
                    "runs": r.runs,
                    "runs_for_violation": _runs_to_catch(r, settings, plan, r.mu_declared),
                    "runs_for_excess": _runs_to_catch(r, settings, plan, r.excess_threshold),
                }
            entry = {
                "benchmark": "empirical_audit_planted_bug", "bug": mechanism.name, "tables": tables,
                "sensitivity": calibration, "seed": args.seed, "verdict": result.verdict, "flagged": result.failed,
                "planted_rows": needed, "flagged_rows": flagged_rows,
                "failed_checks": sorted({c.name for c in result.checks if c.status == "FAIL"}),
                "wall_seconds": round(time.perf_counter() - wall, 1),
                "cpu_seconds": round(result.cpu_seconds, 1), "load": round(_load(), 1),
            }
            _record(entry)
            print(f"{mechanism.name:48s} {calibration:5s} {entry['verdict']:13s} "
                  f"{ {k: (v['verdict'], v['runs'], v['runs_for_violation'], v['runs_for_excess']) for k, v in needed.items()} } "
                  f"checks {entry['failed_checks']} ({entry['cpu_seconds']} CPU-s)", flush=True)


def false_alarms(args: argparse.Namespace) -> None:
    done = {e["seed"] for e in _series(args.sensitivity)}
    for seed in range(args.first, args.first + args.seeds):
        if seed in done:
            print(f"seed {seed}: already recorded", flush=True)
            continue
        entry = _quick(seed, args.workers, args.sensitivity, "false-alarms")
        parts = []
        for c, a in entry["alarms"].items():
            parts.append(f"{c}: {'FALSE ALARM' if a['false_alarm'] else 'no alarm'} (VIOLATION {a['violations'] or '-'}, "
                         f"EXCESS {a['excess'] or '-'}, checks {a['failed_checks'] or '-'}, WEAK {a['weak'] or '-'}, "
                         f"ratios { {t: round(v, 3) for t, v in entry['goals'][c]['ratios'].items()} })")
        print(f"seed {seed}: {entry['verdict']}; " + "; ".join(parts) + f"; {entry['wall_seconds']:.0f} s "
              f"({entry['cpu_seconds']:.0f} CPU-s, load {entry['load_mean']})", flush=True)
    summary(args)


def _series(sensitivity: str) -> list[dict]:
    """The series' audits recorded so far with the current plan."""
    plan = _plan_runs(sensitivity)
    return [e for e in _recorded() if e.get("benchmark") == "empirical_audit_quick"
            and e.get("label") == "false-alarms" and e.get("sensitivity") == sensitivity
            and e.get("plan_runs") == plan]


def summary(args: argparse.Namespace) -> None:
    series = _series(args.sensitivity)
    by_seed = {e["seed"]: e for e in series}
    for c in (["paper", "exact"] if args.sensitivity == "both" else [args.sensitivity]):
        alarms = [(s, e["alarms"][c]) for s, e in sorted(by_seed.items()) if e["alarms"][c]["false_alarm"]]
        weak = sum(len(e["alarms"][c]["weak"]) for e in by_seed.values())
        ratios = [e["goals"][c]["ratios"] for e in by_seed.values()]
        low = {t: min(r[t] for r in ratios) for t in (ratios[0] if ratios else {})}
        print(f"{c}: {len(by_seed)} quick audits of correct code, {len(alarms)} false alarm(s) {alarms or ''}, "
              f"{weak} WEAK row(s); the lowest epsilon_hat/epsilon per table {low}")
    cpu = [e["cpu_seconds"] for e in by_seed.values()]
    if cpu:
        print(f"CPU-seconds per audit: {min(cpu):.0f} to {max(cpu):.0f}; load "
              f"{min(e['load_mean'] for e in by_seed.values())} to {max(e['load_max'] for e in by_seed.values())}")


def full_plan(args: argparse.Namespace) -> None:
    """The full mode's CPU: each table's per-run CPU measured at its production budgets (a full-mode
    audit of ``--runs`` runs per table, one process), times the full mode's planned runs."""
    from phsafe.audit.empirical import AuditSettings, run_audit
    from phsafe.audit.empirical.audit import plan_audit

    settings = AuditSettings(mode="full", sensitivity=args.sensitivity, seed=args.seed, workers=1)
    planned = {t.key: t.runs for t in plan_audit(settings).tables}
    load_before = _load()
    wall, cpu = time.perf_counter(), time.process_time()
    sample = run_audit(AuditSettings(mode="full", sensitivity=args.sensitivity, seed=args.seed, workers=1,
                                     runs=args.runs))
    measured_cpu = time.process_time() - cpu
    total = 0.0
    lines = []
    for r in sample.rows:
        if r.level != "all":
            continue
        each = r.cpu_seconds / r.runs
        runs = planned[(r.sensitivity, r.table)]
        total += runs * each
        lines.append({"sensitivity": r.sensitivity, "table": r.table, "runs": runs, "cpu_per_run": round(each, 5),
                      "cpu_seconds": round(runs * each)})
        print(f"{r.sensitivity:5s} {r.table:10s} runs {runs:7,d} x {each * 1000:6.1f} ms = {runs * each:8.0f} CPU-s")
    entry = {"benchmark": "empirical_audit_full_plan", "sensitivity": args.sensitivity, "sample_runs": args.runs,
             "sample_cpu_seconds": round(measured_cpu, 1), "sample_wall_seconds": round(time.perf_counter() - wall, 1),
             "extrapolated_cpu_seconds": round(total), "tables": lines, "load_before": round(load_before, 1),
             "load_after": round(_load(), 1)}
    _record(entry)
    print(f"full mode ({args.sensitivity}): about {total / 3600:.2f} CPU-hours of runs (each table's per-run CPU "
          f"measured over {args.runs} runs at its production budgets: {measured_cpu:.0f} CPU-s), plus the plan and "
          "the conclusion (seconds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quick")
    q.add_argument("--seed", type=int, default=1)
    q.add_argument("--workers", type=int, default=None)
    q.add_argument("--sensitivity", choices=("paper", "exact", "both"), default="both")
    b = sub.add_parser("bugs")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--workers", type=int, default=None)
    b.add_argument("--sensitivity", choices=("paper", "exact", "both"), default="both")
    f = sub.add_parser("false-alarms")
    f.add_argument("--seeds", type=int, default=20)
    f.add_argument("--first", type=int, default=1)
    f.add_argument("--workers", type=int, default=None)
    f.add_argument("--sensitivity", choices=("paper", "exact", "both"), default="both")
    s = sub.add_parser("summary")
    s.add_argument("--sensitivity", choices=("paper", "exact", "both"), default="both")
    p = sub.add_parser("full-plan")
    p.add_argument("--sensitivity", choices=("paper", "exact", "both"), default="both")
    p.add_argument("--runs", type=int, default=120)
    p.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    {"quick": quick, "bugs": bugs, "false-alarms": false_alarms, "summary": summary,
     "full-plan": full_plan}[args.command](args)


if __name__ == "__main__":
    main()
