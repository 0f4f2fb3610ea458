"""``phsafe`` commands as real processes, forked from a warm helper instead of started afresh.

The kill and recovery tests SIGKILL ``phsafe private`` at chosen points of a release: the process
must really die (nothing after the kill runs, not a flush, not a ``finally``) and leave real files
behind, fsynced or not. A fresh ``phsafe`` interpreter pays about a CPU-second of imports (pandas,
pyarrow, numpy, OpenDP, the package) before it reaches any of those points, and these tests start
dozens. Here a helper process (:class:`WarmProcesses`) pays the imports once; each command is a
child it forks: a process of its own, with its own pid, files and exit status, that SIGKILL kills
as it kills the console script -- only without the imports.

A fork copies the forking thread only: a process with other threads (OpenBLAS's workers,
jemalloc's background thread in pyarrow) can fork a child that deadlocks on a lock one of them
held. So the helper is started with those threads switched off (``OPENBLAS_NUM_THREADS=1``,
``JE_ARROW_MALLOC_CONF=background_thread:false``), never runs a command itself, and before every
fork checks that it has exactly one thread (``/proc/self/task``): a preloaded module that starts
a thread makes every command fail loudly, not hang now and then. Each child then starts what
threads it needs, as a fresh process does.

What a fresh process would start with, each child gets: standard input from ``/dev/null``, its
standard output and error in files of its own (returned as text, as ``capture_output=True,
text=True`` returns them), the environment and working folder the caller gives, the default
signal handlers, a ``random`` module seeded anew; at its end, what an interpreter's exit does
(non-daemon threads joined, ``atexit`` functions, streams flushed), then ``os._exit`` -- never
back into the helper's loop. An exception that escapes the command is printed as the interpreter
prints it and gives exit status 1.

A fault (:func:`tests.system._fault_driver.install`) can be installed in the child before the
command runs: ``kill`` points SIGKILL the child at an exact step of the release.

The helper reaps its children; their CPU-seconds reach the test process's ``RUSAGE_CHILDREN``
(``--cpu-report``) when the helper itself is reaped (:meth:`WarmProcesses.close`).

Kept a fresh interpreter on purpose: ``tests/system/test_crash_safety.py`` kills one of its runs
as the installed console script started afresh, as an operator starts it. ``PHSAFE_TEST_SUBPROCESS=1``
(tests/_cli.py) makes every command here a fresh interpreter too (:class:`FreshChild`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHSAFE = Path(sys.executable).parent / "phsafe"

PRELOAD = (
    "numpy", "pandas", "pyarrow", "pyarrow.csv", "pyarrow.parquet", "pyarrow.compute", "opendp.prelude",
    "phsafe", "phsafe.cli", "phsafe.engine", "phsafe.private_run", "phsafe.ledger", "phsafe.publog",
    "phsafe.audit.verify", "tests.system._fault_driver",
)
"""What a ``phsafe private`` run imports that is worth importing once (not Great Expectations:
the tests that fork here run with ``--no-validate``; a child imports what else it needs)."""

_QUIET_THREADS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                  "JE_ARROW_MALLOC_CONF": "background_thread:false"}


class Child:
    """One forked command: its pid while it runs; :meth:`wait` gives its exit as ``subprocess``
    does (negative: the signal that ended it)."""

    def __init__(self, owner: "WarmProcesses", pid: int, args: list[str], stdout: Path, stderr: Path) -> None:
        self.owner, self.pid, self.args = owner, pid, args
        self._stdout, self._stderr = stdout, stderr
        self.returncode: int | None = None

    def kill(self) -> None:
        """SIGKILL the child. (The helper reaps it only once the next command is asked for, so its
        pid is not reused before then: this never signals another process.)"""
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        """Its exit status if it has ended, else None (at once)."""
        if self.returncode is None:
            self.returncode = self.owner._reaped(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Its end, as ``subprocess.run(..., capture_output=True, text=True)`` gives it; with a
        ``timeout``, ``subprocess.TimeoutExpired`` if it is still running then."""
        if self.returncode is None:
            self.returncode = self.owner._reaped(self.pid, timeout=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(["phsafe", *self.args], timeout or 0)
        stdout = self._stdout.read_text(errors="replace")
        stderr = self._stderr.read_text(errors="replace")
        return subprocess.CompletedProcess(["phsafe", *self.args], self.returncode, stdout, stderr)


class FreshChild:
    """The same command as a fresh interpreter (``PHSAFE_TEST_SUBPROCESS=1``): the console
    script, or with a fault ``python -m tests.system._fault_driver``; the same interface."""

    def __init__(self, args: list[str], fault: tuple[str, str] | None, env: Mapping[str, str] | None,
                 cwd: os.PathLike | str | None) -> None:
        self.args = args
        command = [sys.executable, "-m", "tests.system._fault_driver", *fault, "--", *args] if fault else \
            [str(PHSAFE), *args]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         stdin=subprocess.DEVNULL, env=None if env is None else dict(env),
                                         cwd=REPO if fault and cwd is None else cwd)
        self.pid = self._process.pid
        self.returncode: int | None = None

    def kill(self) -> None:
        self._process.kill()

    def poll(self) -> int | None:
        self.returncode = self._process.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> subprocess.CompletedProcess:
        stdout, stderr = self._process.communicate(timeout=timeout)
        self.returncode = self._process.returncode
        return subprocess.CompletedProcess(["phsafe", *self.args], self.returncode, stdout, stderr)


class WarmProcesses:
    """The helper process: start it once (a module's fixture), fork commands from it, close it.
    With ``PHSAFE_TEST_SUBPROCESS=1`` (tests/_cli.py) there is no helper: each command is a fresh
    interpreter (:class:`FreshChild`), to compare the two ways."""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        from tests._cli import SUBPROCESS

        self._folder = Path(tempfile.mkdtemp(prefix="phsafe-warm-"))
        self._count = 0
        self._running: Child | FreshChild | None = None
        self.fresh = SUBPROCESS
        if self.fresh:
            return
        env = {**os.environ, **_QUIET_THREADS}
        self._helper = subprocess.Popen([sys.executable, "-m", "tests._warm_process", *preload], cwd=REPO, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._buffer = b""
        ready = self._read()
        assert ready == {"ready": True}, ready

    def start(self, *args: object, fault: tuple[str, str] | None = None, env: Mapping[str, str] | None = None,
              cwd: os.PathLike | str | None = None) -> Child | FreshChild:
        """Fork ``phsafe ARGS`` (with the fault ``(mode, point)`` installed first); one at a time."""
        assert self._running is None or self._running.returncode is not None, "one child at a time"
        self._count += 1
        argv = [str(a) for a in args]
        if self.fresh:
            self._running = FreshChild(argv, fault, env, cwd)
            return self._running
        stdout, stderr = self._folder / f"{self._count}.out", self._folder / f"{self._count}.err"
        request = {"args": argv, "fault": list(fault) if fault else None, "stdout": str(stdout),
                   "stderr": str(stderr), "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd if cwd is not None else os.getcwd())}
        self._write(request)
        answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"the warm helper could not fork: {answer['error']}")
        self._running = Child(self, answer["pid"], argv, stdout, stderr)
        return self._running

    def run(self, *args: object, **kw: object) -> subprocess.CompletedProcess:
        """``phsafe ARGS`` to its end, as ``subprocess.run(..., capture_output=True, text=True)``."""
        return self.start(*args, **kw).wait()  # type: ignore[arg-type]

    def close(self) -> None:
        if self.fresh:
            if self._running is not None and self._running.poll() is None:
                self._running.kill()
                self._running.wait()
        elif self._helper.poll() is None:
            if self._running is not None and self._running.returncode is None:
                self._running.kill()
                self._running.wait()
            assert self._helper.stdin is not None
            self._helper.stdin.close()
            self._helper.wait(timeout=120)
        for path in self._folder.iterdir():
            path.unlink()
        self._folder.rmdir()

    def __enter__(self) -> "WarmProcesses":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reaped(self, pid: int, timeout: float | None = None) -> int | None:
        answer = self._read(timeout)
        if answer is None:
            return None
        assert answer.get("pid") == pid and "returncode" in answer, answer
        return int(answer["returncode"])

    def _write(self, message: dict) -> None:
        assert self._helper.stdin is not None
        self._helper.stdin.write((json.dumps(message) + "\n").encode())

    def _read(self, timeout: float | None = None) -> dict | None:
        """The helper's next answer; None if none came within ``timeout`` seconds."""
        assert self._helper.stdout is not None
        fd = self._helper.stdout.fileno()
        while b"\n" not in self._buffer:
            # poll, not select: select refuses a descriptor numbered 1024 or more, which a test
            # process holding many files (the crash-state modules before it, in one process) reaches.
            if timeout is not None:
                readable = select.poll()
                readable.register(fd, select.POLLIN)
                if not readable.poll(timeout * 1000):
                    return None
            data = os.read(fd, 65536)
            if not data:
                raise RuntimeError(f"the warm helper ended (exit {self._helper.wait(timeout=60)})")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


# --------------------------------------------------------------------------------------------
# The helper process
# --------------------------------------------------------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(request: dict, channels: tuple[int, int]) -> None:
    """In the forked child: become the command's process, run it, exit. Never returns."""
    code = 1
    try:
        for fd in channels:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import random

        random.seed()  # not the helper's state, which every child would share
        from phsafe.cli import main

        if request["fault"]:
            from tests.system._fault_driver import install

            install(*request["fault"])
        try:
            code = main.main(args=request["args"], prog_name="phsafe", standalone_mode=True)
        except SystemExit as exc:  # what the interpreter makes of sys.exit(...)
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        else:
            code = 0 if code is None else int(code)
        # What an interpreter's exit does before it ends the process.
        threading._shutdown()  # type: ignore[attr-defined]  # joins the non-daemon threads
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 -- printed as the interpreter prints an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001,S110 -- a closed stream: nothing left to flush
                pass
        os._exit(code)


def _serve(preload: Sequence[str]) -> None:
    import importlib

    # The protocol's pipes, off the standard descriptors the children replace.
    requests = os.fdopen(os.dup(0), "r")
    answers = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # anything the imports print goes to the tests' standard error
    os.close(null)
    for name in preload:
        importlib.import_module(name)

    def answer(message: dict) -> None:
        os.write(answers, (json.dumps(message) + "\n").encode())

    answer({"ready": True})
    ended = None  # the last child: ended, not reaped yet (see below)
    for line in requests:
        if ended is not None:
            os.waitpid(ended, 0)
            ended = None
        request = json.loads(line)
        threads = _threads()
        if threads != 1:  # a fork now could copy a lock another thread holds
            answer({"error": f"the helper has {threads} threads; it forks only with one"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, (requests.fileno(), answers))
        answer({"pid": pid})
        # Its end, leaving it a zombie: its pid stays its own until the test process sends the
        # next request (or closes), so a SIGKILL sent after it ended -- before its status was
        # read -- reaches no other process. Reaped then; its CPU counts in the helper's children.
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        assert info is not None
        killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        answer({"pid": pid, "returncode": -info.si_status if killed else info.si_status})
        ended = pid
    if ended is not None:
        os.waitpid(ended, 0)


if __name__ == "__main__":
    _serve(sys.argv[1:])
