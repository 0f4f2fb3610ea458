"""Witness services for the system tests: ``phsafe witness serve``, each in a process of its own.

Each has its own key (``phsafe witness init``), its own state folder and a folder of the logs it
witnesses (a log is added by putting its verifier key and its registration there, as its operator
would); it listens on a loopback port the system picks and prints its URL, which
:meth:`Service.start` reads.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
from pathlib import Path

PHSAFE = Path(sys.executable).parent / "phsafe"


class Service:
    """One witness service; ``url`` once started (a restart listens on a new port)."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = f"{name}.test"
        self.folder = root / name
        from tests._cli import phsafe  # the key is made in this process; the service runs in its own

        made = phsafe("witness", "init", self.folder / "key", "--name", self.name)
        assert made.returncode == 0, made.stderr
        self.vkey = self.folder / "key" / "witness.vkey"
        self.key = self.folder / "key" / "witness.key"
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> "Service":
        self.process = subprocess.Popen(
            [str(PHSAFE), "witness", "serve", "--key", str(self.key), "--state", str(self.folder / "state"),
             "--logs", str(self.folder / "logs"), "--bind", "127.0.0.1:0"],
            stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert " at http://127.0.0.1:" in line, line
        self.url = line.split(" at ", 1)[1].split()[0]
        return self

    def witness(self, log: Path, *, retired_in: tuple[Path, ...] = ()) -> str:
        """The log's operator hands its verifier key (``log``/log.vkey) and its registration (its
        policy, proven as its entry 0, with the retirements found in the logs ``retired_in``:
        ``phsafe ledger registration``) to the witness's operator. Returns the file names' stem."""
        from phsafe.publog.claims import make_log_registration

        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        key = (log / "log.vkey").read_text()
        stem = hashlib.sha256(key.encode()).hexdigest()[:16]
        ledger = log.with_name(log.name.removesuffix(".public-log"))
        registration, _ = make_log_registration(ledger, retired_in=retired_in)
        (self.folder / "logs" / f"{stem}.registration").write_bytes(registration)
        (self.folder / "logs" / f"{stem}.vkey").write_text(key)
        return stem

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        if self.process is not None:
            self.process.wait(timeout=120)
