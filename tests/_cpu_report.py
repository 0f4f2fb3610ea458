"""``--cpu-report FILE``: each test's CPU-seconds, appended to FILE as JSON lines.

The suite's speed goal is in CPU-seconds (the machines are shared: wall time says as much about
the neighbours as about the tests), so this is what finds the tests worth making cheaper. Each
line is one test: its own process's user+system CPU over setup, call and teardown (a module's
fixtures fall on its first test), the CPU of the child processes it waited for, and its wall
time. With xdist each worker appends its own lines (one ``write`` each, so they do not mix).

A child's CPU is counted when it is reaped, so a process a fixture or an earlier test started
and left running (a server, a process pool) lands on the test during which it ends -- a unit test
of milliseconds can show tens of "children" seconds. The totals are right; look at ``own`` and
at the test that started the process before blaming the one it ended under.

    python -m pytest -n 2 --cpu-report /tmp/cpu.jsonl ...
    python -m tests._cpu_report /tmp/cpu.jsonl          # the largest, by test and by module
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-report", metavar="FILE", default=None,
                     help="append each test's CPU-seconds (own and its children's) to FILE as JSON lines")


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    report = item.config.getoption("--cpu-report")
    if not report:
        yield
        return
    own, children, wall = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    yield
    line = json.dumps({"test": item.nodeid, "own": round(_cpu(resource.RUSAGE_SELF) - own, 3),
                       "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
                       "wall": round(time.perf_counter() - wall, 3)}) + "\n"
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def summary(path: Path, top: int = 40) -> str:
    """The report's totals, its largest tests and its largest modules, as text."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_module: dict[str, float] = defaultdict(float)
    for row in rows:
        row["cpu"] = row["own"] + row["children"]
        by_module[row["test"].partition("::")[0]] += row["cpu"]
    total = sum(row["cpu"] for row in rows)
    lines = [f"{len(rows)} tests, {total:.0f} CPU-s (own {sum(r['own'] for r in rows):.0f}, "
             f"children {sum(r['children'] for r in rows):.0f})", "", "largest modules:"]
    lines += [f"  {cpu:8.1f}  {module}" for module, cpu in sorted(by_module.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["", "largest tests:"]
    lines += [f"  {r['cpu']:8.1f}  {r['test']}" for r in sorted(rows, key=lambda r: -r["cpu"])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(summary(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:3])))
