"""Runs ``phsafe`` with a fault injected at a chosen point (for tests/system/test_recovery.py).

    python -m tests.system._fault_driver MODE POINT -- phsafe arguments...

MODE is ``kill`` (SIGKILL: the process vanishes), ``raise`` (an exception the run handles as a
failure), or ``sigint`` / ``sigterm`` (the signal an operator's Ctrl-C or a ``kill`` sends: the run
goes on to its next safe point). POINT is ``append:K`` (just after the K-th ledger append returned: the entries are
durable, nothing after them happened) or ``renamed`` (just after the release was renamed into
place, before the ledger recorded it), ``log-append:K`` (the K-th append to the public log, before
it wrote anything: the ledger's entries are durable, the log is behind) or ``log-torn:K`` (the same,
after half of its first entry line), ``cosigned:K`` (just after the K-th cosignature a witness
service gave: the witness's state is ahead of the log's published checkpoint), or
``stop-witness:K`` (not a fault of the run: after its K-th INTENT, the witness service whose
process id is ``$PHSAFE_TEST_WITNESS_PID`` is stopped, and the run goes on).
"""

from __future__ import annotations

import os
import signal
import sys


class Injected(RuntimeError):
    """The injected failure."""


def _fail(mode: str) -> None:
    if mode in ("sigint", "sigterm"):
        os.kill(os.getpid(), signal.SIGINT if mode == "sigint" else signal.SIGTERM)
        return
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise Injected("injected failure")


def main(argv: list[str]) -> int:
    mode, point = argv[0], argv[1]
    args = argv[argv.index("--") + 1:]
    from phsafe.cli import main as cli

    install(mode, point)
    return cli.main(args=args, prog_name="phsafe", standalone_mode=True)


def install(mode: str, point: str) -> None:
    """Installs the fault in this process (also used by tests/_warm_process.py in a forked child)."""
    import phsafe.engine
    import phsafe.ledger

    if point.startswith("append:"):
        target, calls = int(point.split(":")[1]), []
        original = phsafe.ledger.Ledger.append_entries

        def append(self, items, **kw):  # noqa: ANN001, ANN003
            entries = original(self, items, **kw)
            calls.append(1)
            if len(calls) == target:
                _fail(mode)
            return entries

        phsafe.ledger.Ledger.append_entries = append
    elif point.startswith(("log-append:", "log-torn:")):
        # The K-th append to the public log: stopped before it wrote anything (the ledger's
        # entries are durable, the log is behind), or after half of its first entry line.
        from phsafe.tlog.publication import LogDirectory

        target, calls = int(point.split(":")[1]), []
        original_log_append = LogDirectory.append

        def log_append(self, entries):  # noqa: ANN001
            calls.append(1)
            if len(calls) == target:
                if point.startswith("log-torn:"):
                    with open(self.path / "entries", "ab") as f:
                        f.write(entries[0][: len(entries[0]) // 2])
                        f.flush()
                        os.fsync(f.fileno())
                _fail(mode)
            return original_log_append(self, entries)

        LogDirectory.append = log_append
    elif point.startswith("cosigned:"):
        from phsafe.publog.witnesses import HttpWitness

        target, calls = int(point.split(":")[1]), []
        original_add = HttpWitness.add_checkpoint

        def add_checkpoint(self, request):  # noqa: ANN001
            lines = original_add(self, request)
            calls.append(1)
            if len(calls) == target:
                _fail(mode)
            return lines

        HttpWitness.add_checkpoint = add_checkpoint
    elif point.startswith("stop-witness:"):
        target, calls = int(point.split(":")[1]), []
        original_append = phsafe.ledger.Ledger.append_entries
        witness_pid = int(os.environ["PHSAFE_TEST_WITNESS_PID"])
        host, port = os.environ["PHSAFE_TEST_WITNESS_URL"].split("//", 1)[1].rsplit(":", 1)

        def append_then_stop(self, items, **kw):  # noqa: ANN001, ANN003
            entries = original_append(self, items, **kw)
            if any(kind.value == "INTENT" for kind, _, _ in items):
                calls.append(1)
                if len(calls) == target:
                    import socket

                    os.kill(witness_pid, signal.SIGKILL)
                    while True:  # until nothing answers at its address: no request of the run reaches it
                        try:
                            socket.create_connection((host, int(port)), timeout=5).close()
                        except OSError:
                            break
            return entries

        phsafe.ledger.Ledger.append_entries = append_then_stop
    elif point == "reading":  # once the inputs are read, before the run can spend
        original_digest = phsafe.engine.fingerprint_inputs

        def digest(*a, **k):  # noqa: ANN001
            _fail(mode)
            return original_digest(*a, **k)

        phsafe.engine.fingerprint_inputs = digest
    elif point == "renamed":
        original_publish = phsafe.engine.publish_release

        def publish(*a, **k):  # noqa: ANN001
            digest = original_publish(*a, **k)
            _fail(mode)
            return digest

        phsafe.engine.publish_release = publish
    else:
        raise SystemExit(f"unknown point {point}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
