"""``phsafe private`` with input validation through the one pass (benchmarks only).

    .venv/bin/python benchmarks/private_validated.py CONFIG DATA OUT --ledger LEDGER [--log FILE]

Runs the ``phsafe private`` command with validation on, the way a private run validates once
:func:`phsafe.counting.validated_counts` is wired into the engine: one pass over the inputs
validates them and counts the tables, before the ledger is touched. Until the engine calls it
(it is the lead's file), this script makes the engine's "validate inputs" step run that pass and
its counting step use the counts the pass returned -- nothing else of the run changes (digests,
plan, ledger, noise, outputs, publication). Once the engine calls ``validated_counts`` itself,
the script runs the command unchanged.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any


def _wire() -> None:
    from phsafe import engine
    from phsafe.counting import validated_counts
    from phsafe.tables import TABLES

    if "validated_counts" in inspect.getsource(engine):
        return  # the engine does it
    pending: dict[str, Any] = {}
    count_exact = engine.count_exact

    def check_inputs(run: Any) -> Any:
        counts, report = validated_counts(run.config_path, run.data_dir, list(TABLES.values()),
                                          key=run.truncation_key, validate=True, report_dir=run.report_dir)
        pending["counts"] = counts
        return report

    def counted(run: Any, config: Any, stage: Any = None) -> Any:
        counts = pending.pop("counts", None)
        return engine.ExactCounts(counts) if counts is not None else count_exact(run, config, stage)

    engine.check_inputs = check_inputs
    engine.count_exact = counted


def main() -> int:
    _wire()
    from phsafe.cli import main as cli

    args = sys.argv[1:]
    if "--validate" not in args and "-v" not in args:
        args.append("--validate")
    return cli(["private", *args], standalone_mode=False) or 0


if __name__ == "__main__":
    sys.exit(main())
