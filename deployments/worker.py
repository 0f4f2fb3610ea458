"""The phsafe worker: Prefect's process worker, stopped so that no flow run loses budget.

Run it as ``prefect worker start`` would be run (``prefect-worker.service`` does; so does an
operator in a terminal)::

    .venv/bin/python deployments/worker.py --pool phsafe-process --type process --limit 1

It starts ``prefect worker start`` with those arguments and, on SIGTERM or SIGINT -- however it
was started (systemd, a terminal's Ctrl-C, ``kill`` of a background job) -- stops it in the one
order that costs nothing:

1. the Prefect worker is killed at once (it keeps no state of its own): its own graceful stop
   would tell the flow runs in progress to exit without a final state, and wait a fixed 30 s;
2. every flow-run process it started gets SIGTERM: a phsafe flow run stops at its next safe
   point (no INTENT after the request; a measurement whose spend is recorded is drawn and
   committed first), records the run failed in its ledger ("stopped by a signal") and ends the
   flow run Failed, which a Retry resumes with nothing spent twice;
3. it waits for them, up to ``--grace`` seconds (default 80, inside the unit's TimeoutStopSec of
   90 s), then SIGKILLs what is left. A second SIGTERM or SIGINT skips the wait.

Why not ``prefect worker start`` alone: it turns a first SIGTERM into SIGINT to itself, which a
shell's background job ignores (POSIX shells start background jobs with SIGINT ignored): the
worker and its runs went on; and its graceful stop leaves runs "Running" with no process.

The worker process gets ``PR_SET_PDEATHSIG``: if this process dies (SIGKILL), the worker dies
with it and polls no more; flow runs already started go on and end on their own. This process
is the flow runs' subreaper (``PR_SET_CHILD_SUBREAPER``), so it finds and waits for them after
the worker is gone.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
DEFAULT_GRACE = 80.0
_libc = ctypes.CDLL(None, use_errno=True)


def say(message: str) -> None:
    print(f"phsafe worker: {message}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _children() -> dict[int, list[int]]:
    """Parent pid -> pids of its children, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":  # a zombie is already gone
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """The living processes below ``pid``."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    """Collect the exit status of every child that ended (flow runs reparented to us)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_each(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Supervisor:
    def __init__(self, worker_args: list[str], grace: float) -> None:
        self.worker_args = worker_args
        self.grace = grace
        self.worker: subprocess.Popen[bytes] | None = None
        self.stop_requested: str | None = None
        self.hurry = False

    def _on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested is None:
            self.stop_requested = name
        else:
            self.hurry = True

    def run(self) -> int:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)  # a caught signal is SIG_DFL again in the worker
        prefect = Path(sys.executable).parent / "prefect"
        env = dict(os.environ)
        if not env.get("TMPDIR") and env.get("PREFECT_HOME"):
            # Prefect's runner keeps its files in $TMPDIR/runner_storage: in a /tmp shared with
            # other users (a worker started from a shell, not the unit's PrivateTmp) another
            # user's runner_storage would stop it. Its own folder instead.
            private = Path(env["PREFECT_HOME"]) / "tmp"
            private.mkdir(parents=True, exist_ok=True, mode=0o700)
            env["TMPDIR"] = str(private)
        # Its own session: a terminal's Ctrl-C reaches this process only, never the worker directly.
        self.worker = subprocess.Popen([str(prefect), "worker", "start", *self.worker_args], env=env,
                                       start_new_session=True, preexec_fn=_die_with_parent)
        say(f"started the Prefect worker (pid {self.worker.pid}); SIGTERM or SIGINT stops its flow runs at their "
            "next safe point")
        while self.stop_requested is None:
            code = self.worker.poll()
            if code is not None:
                _reap()
                say(f"the Prefect worker exited ({code})")
                return code if code > 0 else 1
            time.sleep(0.2)
        return self.stop()

    def stop(self) -> int:
        assert self.worker is not None
        clock = time.monotonic()
        flow_runs = [pid for pid in descendants(os.getpid()) if pid != self.worker.pid]  # before the worker dies
        try:
            os.killpg(self.worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.worker.wait()
        # Everything below us now, the flow runs reparented to this subreaper included.
        flow_runs = sorted(set(flow_runs) | set(descendants(os.getpid())))
        say(f"{self.stop_requested} received: stopped the Prefect worker; SIGTERM to {len(flow_runs)} flow-run "
            f"process(es), which stop at their next safe point (waiting up to {self.grace:g} s)")
        _signal_each(flow_runs, signal.SIGTERM)
        deadline = clock + self.grace
        while True:
            _reap()
            left = descendants(os.getpid())
            if not left:
                break
            if self.hurry or time.monotonic() >= deadline:
                say(f"{len(left)} process(es) still running after {time.monotonic() - clock:.0f} s: SIGKILL")
                _signal_each(left, signal.SIGKILL)
                time.sleep(0.2)
                _reap()
                break
            time.sleep(0.2)
        say(f"stopped in {time.monotonic() - clock:.1f} s")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="deployments/worker.py", add_help=True,
        description="Prefect's process worker (`prefect worker start ARGS`), stopped by SIGTERM or SIGINT so that "
                    "its flow runs end at their next safe point, never in the middle of a spend.")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE, metavar="SECONDS",
                        help=f"How long the flow runs get to stop before SIGKILL (default {DEFAULT_GRACE:g}).")
    args, worker_args = parser.parse_known_args(argv)
    return Supervisor(worker_args, args.grace).run()


if __name__ == "__main__":
    sys.exit(main())
