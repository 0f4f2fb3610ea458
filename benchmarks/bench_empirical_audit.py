"""The empirical privacy audit's goals, measured (issue 30): not timed tests, a script.

    .venv/bin/python benchmarks/bench_empirical_audit.py quick [--seed S] [--workers N]
    .venv/bin/python benchmarks/bench_empirical_audit.py bugs [--tables PH3,PH7] [--seed S]
    .venv/bin/python benchmarks/bench_empirical_audit.py false-alarms [--seeds 20] [--first 1]

* ``quick``: ``phsafe audit empirical --mode quick`` (production US config) in a child process,
  its wall time, CPU time and peak memory, and the goal: epsilon_hat / epsilon >= 0.5 on the
  whole-table rows of PH3, PH7, PH1_num, PH4 and PH2 (production budgets), within 10 minutes.
* ``bugs``: the planted-bug corpus of tests/_planted_bugs.py, each audited in quick mode at the
  production budgets of the given tables (their planned runs): the verdict each gets and the
  checks that fail. The goal: every bug flagged (VIOLATION, EXCESS or a failed check).
* ``false-alarms``: quick audits of correct code with seeds first .. first + seeds - 1; the goal:
  no VIOLATION or EXCESS in any. Each audit's summary is appended as it ends, so a long series
  can be stopped and resumed (``--first``).

Every result is appended to ``benchmarks/_work/results.jsonl``; the quick audits' folders are
kept under ``benchmarks/_work/empirical-audit/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "benchmarks" / "_work"
sys.path.insert(0, str(REPO))  # tests/_planted_bugs.py

from _measure import run_phase  # noqa: E402 -- beside this script

GOAL_TABLES = ("PH3", "PH7", "PH1_num", "PH4", "PH2")
GOAL_RATIO = 0.5
GOAL_SECONDS = 600


def _record(entry: dict) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "results.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _load() -> float:
    return os.getloadavg()[0]


def _quick(seed: int, workers: int, label: str) -> dict:
    out = WORK / "empirical-audit" / f"{label}-seed{seed}"
    phsafe = Path(sys.executable).parent / "phsafe"
    args = [str(phsafe), "-q", "audit", "empirical", "--mode", "quick", "--seed", str(seed), "--workers", str(workers),
            "--out", str(out), "--overwrite"]
    load_before = _load()
    phase = run_phase(f"empirical audit quick seed {seed}", args, check=False)  # exit 1: a failed audit
    document = json.loads((out / "audit.json").read_text())
    rows = document["tables"]
    whole = {r["table"]: r for r in rows if r["level"] == "all"}
    goal = {t: whole[t]["epsilon_ratio"] for t in GOAL_TABLES if t in whole}
    entry = {
        "benchmark": "empirical_audit_quick", "seed": seed, "workers": workers, **phase.as_dict(),
        "load_before": round(load_before, 1), "load_after": round(_load(), 1), "verdict": document["verdict"],
        "ratios": goal, "ratio_goal_met": all((v or 0) >= GOAL_RATIO for v in goal.values()),
        "time_goal_met": phase.wall_seconds <= GOAL_SECONDS,
        "violations": [(r["table"], r["level"]) for r in rows if r["verdict"] == "VIOLATION"],
        "excess": [(r["table"], r["level"]) for r in rows if r["verdict"] == "EXCESS"],
        "weak": [(r["table"], r["level"]) for r in rows if r["verdict"] == "WEAK"],
        "failed_checks": [(c["name"], c["table"], c["level"]) for c in document["checks"] if c["status"] == "FAIL"],
        "rows": [{k: r[k] for k in ("table", "level", "mu_lb", "mu_ub", "mu_reach", "mu_declared", "epsilon_ratio",
                                    "verdict", "runs", "seconds", "cpu_seconds", "budget_scale")} for r in rows],
        "folder": str(out),
    }
    _record(entry)
    return entry


def quick(args: argparse.Namespace) -> None:
    entry = _quick(args.seed, args.workers, "quick")
    print(json.dumps({k: v for k, v in entry.items() if k != "rows"}, indent=1))
    print(f"{'table':10s} {'level':10s} {'mu_lb':>7s} {'mu_ub':>7s} {'reach':>7s} {'decl':>7s} {'eps/eps':>7s} "
          f"{'verdict':9s} {'runs':>6s} {'s':>6s} {'cpu s':>6s}")
    for r in entry["rows"]:
        f = lambda x: "-" if x is None else f"{x:7.3f}"  # noqa: E731
        print(f"{r['table']:10s} {r['level']:10s} {f(r['mu_lb'])} {f(r['mu_ub'])} {f(r['mu_reach'])} "
              f"{f(r['mu_declared'])} {f(r['epsilon_ratio'])} {r['verdict']:9s} {r['runs']:6d} {r['seconds']:6.0f} "
              f"{r['cpu_seconds']:6.0f}")


def bugs(args: argparse.Namespace) -> None:
    from phsafe.audit.empirical import AuditSettings, run_audit
    from tests import _planted_bugs

    tables = tuple(t.strip() for t in args.tables.split(",") if t.strip())
    for mechanism in _planted_bugs.corpus():
        wall, cpu = time.perf_counter(), time.process_time()
        result = run_audit(AuditSettings(tables=tables, seed=args.seed), mechanism)
        entry = {
            "benchmark": "empirical_audit_planted_bug", "bug": mechanism.name, "tables": tables, "seed": args.seed,
            "verdict": result.verdict, "flagged": result.failed,
            "rows": {f"{r.table}/{r.level}": [r.verdict, None if r.mu_lb is None else round(r.mu_lb, 3),
                                              None if r.mu_declared is None else round(r.mu_declared, 3)]
                     for r in result.rows},
            "failed_checks": sorted({c.name for c in result.checks if c.status == "FAIL"}),
            "wall_seconds": round(time.perf_counter() - wall, 1), "cpu_seconds": round(time.process_time() - cpu, 1),
            "load": round(_load(), 1),
        }
        _record(entry)
        whole = {k: v[0] for k, v in entry["rows"].items() if k.endswith("/all")}
        print(f"{mechanism.name:34s} {entry['verdict']:13s} whole-table rows {whole} failed checks "
              f"{entry['failed_checks']} ({entry['wall_seconds']} s)", flush=True)


def false_alarms(args: argparse.Namespace) -> None:
    alarms = []
    for seed in range(args.first, args.first + args.seeds):
        entry = _quick(seed, args.workers, "false-alarms")
        alarmed = entry["violations"] + entry["excess"]
        alarms += [(seed, *a) for a in alarmed]
        print(f"seed {seed}: {entry['verdict']:13s} VIOLATION/EXCESS {alarmed or 'none'}, WEAK {entry['weak'] or 'none'}, "
              f"failed checks {entry['failed_checks'] or 'none'}, ratios "
              f"{ {t: round(v, 3) for t, v in entry['ratios'].items()} }, {entry['wall_seconds']:.0f} s "
              f"({entry['cpu_seconds']:.0f} CPU-s, load {entry['load_before']}->{entry['load_after']})", flush=True)
    print(f"{args.seeds} audits of correct code: {len(alarms)} false VIOLATION/EXCESS rows {alarms}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quick")
    q.add_argument("--seed", type=int, default=1)
    q.add_argument("--workers", type=int, default=1)
    b = sub.add_parser("bugs")
    b.add_argument("--tables", default="PH3")
    b.add_argument("--seed", type=int, default=1)
    f = sub.add_parser("false-alarms")
    f.add_argument("--seeds", type=int, default=20)
    f.add_argument("--first", type=int, default=1)
    f.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    {"quick": quick, "bugs": bugs, "false-alarms": false_alarms}[args.command](args)


if __name__ == "__main__":
    main()
