"""Runs ``phsafe witness serve`` SIGKILLed at its K-th durable write step (tests/system/test_witness_service.py).

    python -m tests.system._witness_driver K -- witness serve arguments...

A durable write (:mod:`phsafe.durable`) is a sequence of steps -- write the bytes, fsync them,
rename the file into place, fsync the folder -- and the process is killed (SIGKILL: nothing after
it runs, not even a flush) right after the K-th step taken since it started serving. Its
state is then whatever those steps left on disk.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    target = int(argv[0])
    args = argv[argv.index("--") + 1:]
    from phsafe import durable
    from phsafe.cli import main as cli

    steps = [0]
    real_os = durable.os

    class Steps:
        """``os`` as phsafe.durable sees it: every write step counted, the K-th one the last."""

        def __getattr__(self, name: str):  # noqa: ANN204
            value = getattr(real_os, name)
            if name not in ("write", "fsync", "replace"):
                return value

            def step(*a, **k):  # noqa: ANN002, ANN003, ANN202
                result = value(*a, **k)
                steps[0] += 1
                if steps[0] == target:
                    os.kill(os.getpid(), signal.SIGKILL)
                return result

            return step

    durable.os = Steps()  # type: ignore[assignment]
    return cli.main(args=args, prog_name="phsafe", standalone_mode=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
