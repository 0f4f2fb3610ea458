"""The split view against a quorum of 2 of 3, and a monitor following the log over HTTP.

Three witness services (``phsafe witness serve``, processes of their own on loopback) witness a
ledger's public log with the quorum 2 of 3 -- any two quorums share a witness. The insider keeps
two copies of the enclave and points each at different witnesses (the URLs in the witness list
are the one thing its operator may edit): copy A at witnesses 1 and 2, copy B at witnesses 2 and
3. A releases (the ledger's own code, in this process, asking the services over HTTP) while its
log folder is served by a real HTTP server (``python -m http.server``) and a monitor follows it
round after round, concurrently: every round is all good. Then B:

* its run is refused before anything is recorded (witness 2 has cosigned A's history);
* the insider, holding the log key, signs B's other history -- of A's size, and larger -- and
  asks witnesses 2 and 3 as the log does: witness 3 cosigns (it never saw A), witness 2 refuses
  and keeps both checkpoints as evidence, served at ``GET /evidence``; B's history gets 1 of the
  2 cosignatures it needs, so ``audit public`` refuses it, with the witnesses' keys, for its
  quorum;
* ``audit evidence`` checks the served evidence with the log key alone (exit 1: two histories);
  ``audit monitor`` on A's log given the witness's URL (exit 1, the evidence printed), and on
  B's log after A's (exit 1, from its own state).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from phsafe.audit.monitor import EXIT_STATUS, monitor_once
from phsafe.errors import ForkRefused
from phsafe.ledger import canonical_json, read_ledger
from phsafe.noise import measure
from phsafe.publog import cosign_public_log, log_key_path, log_path, open_ledger, witnesses_path
from phsafe.publog.witnesses import HttpWitness, WitnessList
from phsafe.tlog import (
    Checkpoint,
    TransparencyLog,
    WitnessRefusal,
    read_signer_key,
    request_cosignature,
    sign_checkpoint,
)
from phsafe.tlog.note import format_note, parse_note
from tests._ledgers import new_ledger
from tests._ledgers import start as start_run
from tests.system._witness_services import Service
from tests.unit.test_ledger_resume import FILES, PLAN

PHSAFE = Path(sys.executable).parent / "phsafe"


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(PHSAFE), *map(str, args)], capture_output=True, text=True, timeout=900)


def failed_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("FAILED")]
    assert len(lines) >= 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def point_at(ledger: Path, urls: dict[str, str]) -> None:
    """The insider edits the witness list's URLs (keys and quorum stay the bound ones)."""
    listed = json.loads(witnesses_path(ledger).read_text())
    for item in listed["witnesses"]:
        item["url"] = urls.get(item["vkey"], item["url"])
    witnesses_path(ledger).write_text(json.dumps(listed))


class StaticServer:
    """``python -m http.server`` serving a folder on a loopback port it picks."""

    def __init__(self, folder: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                                         "--directory", str(folder)],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert "Serving HTTP on 127.0.0.1 port " in line, line
        self.url = f"http://127.0.0.1:{line.split(' port ')[1].split()[0]}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("split-view")
    services = [Service(root, f"witness{n}").start() for n in (1, 2, 3)]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # held, never listening: connections to it are refused
    nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    server = None
    try:
        listed = [(s.url, s.vkey.read_text().strip()) for s in services]
        a = new_ledger(root / "a", cap=3 * PLAN.total, witnesses=listed, witness_quorum=2, datasets=["test-data"]).path
        for service in services:
            service.witness(log_path(a))
        shutil.copytree(a.parent, root / "b")  # the insider's second enclave
        b = root / "b" / a.name
        vkeys = [s.vkey.read_text().strip() for s in services]
        point_at(a, {vkeys[2]: nowhere})  # A asks witnesses 1 and 2
        point_at(b, {vkeys[0]: nowhere})  # B asks witnesses 2 and 3
        server = StaticServer(log_path(a))
        yield {"root": root, "services": services, "a": a, "b": b, "server": server,
               "vkey": log_path(a) / "log.vkey", "wkeys": [s.vkey for s in services]}
    finally:
        if server is not None:
            server.stop()
        for service in services:
            service.stop()
        closed.close()


def spend(rec, m) -> None:  # noqa: ANN001
    measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)


def test_a_monitor_follows_the_log_over_http_while_a_release_appends(world: dict) -> None:
    state = world["root"] / "monitor.json"
    # Made before its witnesses knew its key, the log's first checkpoint has no cosignature: a
    # monitor reports its quorum not met until it is cosigned (`phsafe ledger cosign`, or a run).
    early = monitor_once(world["server"].url, world["vkey"], state_file=state, witness_keys=world["wkeys"])
    assert early.status == EXIT_STATUS["quorum"] and "0 verified" in str(early.findings[0])
    cosign_public_log(world["a"])[0].close()
    rounds: list = []
    done = threading.Event()

    def follow() -> None:
        while not done.is_set():
            rounds.append(monitor_once(world["server"].url, world["vkey"], state_file=state,
                                       witness_keys=world["wkeys"]))

    watcher = threading.Thread(target=follow)
    watcher.start()
    try:
        ledger = open_ledger(world["a"])
        rec = start_run(ledger, PLAN, "run-a")
        for m in PLAN.measurements:
            spend(rec, m)
        rec.record_published(FILES, world["root"] / "out-a")
        ledger.close()
    finally:
        done.set()
        watcher.join(timeout=600)
    rounds.append(monitor_once(world["server"].url, world["vkey"], state_file=state, witness_keys=world["wkeys"]))
    bad = [f"[{f.finding}] {f}" for r in rounds for f in r.findings]
    sizes = [line.split(" entries hash")[0] for r in rounds for line in r.lines if " entries hash to" in line]
    print(f"{len(rounds)} monitor rounds over HTTP during the release: sizes {sorted(set(sizes))}; findings {bad}")
    assert not bad and rounds[-1].status == 0
    assert any("dataset test-data: 1 release(s) (run-a)" in line for line in rounds[-1].lines)
    # the command line, once: exit 0
    once = cli("audit", "monitor", world["server"].url, "--key", world["vkey"], "--state", state, "--once",
               *[a for k in world["wkeys"] for a in ("--witness-key", k)])
    assert once.returncode == 0 and once.stdout.rstrip().endswith("OK"), once.stderr
    world["monitor_state"] = state


def test_the_split_view_gets_no_quorum_and_the_witness_keeps_the_evidence(world: dict) -> None:
    a_log = log_path(world["a"])
    a_entries = (a_log / "entries").read_bytes().split(b"\n")[:-1]
    assert a_entries and b'"type":"release"' in a_entries[-1], "run after the release test"
    # B's own run: refused before anything is recorded.
    b = open_ledger(world["b"])
    before = len(read_ledger(world["b"]).lines)
    with pytest.raises(ForkRefused) as refused:
        start_run(b, PLAN, "run-b")
    print(f"copy B's run: {refused.value}")
    assert "witness2.test" in str(refused.value) and "older copy or was rolled back" in str(refused.value)
    assert len(read_ledger(world["b"]).lines) == before
    b.close()
    # The insider signs B's other history with the log key and asks B's witnesses, as the log does.
    b_entries = (log_path(world["b"]) / "entries").read_bytes().split(b"\n")[:-1]
    forged = [json.loads(e) for e in a_entries[len(b_entries):]]
    for entry in forged:
        if "run_id" in entry:
            entry["run_id"] = "run-b"
    history = b_entries + [canonical_json(e) for e in forged]
    assert len(history) == len(a_entries) and history != a_entries
    key = read_signer_key(log_key_path(world["b"]))
    listed = WitnessList.of([(s.url, s.vkey.read_text()) for s in world["services"]], 2)
    witness2, witness3 = (HttpWitness(w) for w in listed.witnesses[1:])
    outcomes = {}
    for extra in (0, 1):  # the same size as A's, then one entry more
        entries = history + [canonical_json({**forged[-2], "time": forged[-1]["time"]})] * extra
        tree = TransparencyLog.of_entries(entries)
        note = sign_checkpoint(Checkpoint(key.name, len(entries), tree.root()), [key])
        cosigned = []
        for witness in (witness3, witness2):
            witness.start_round()
            try:
                lines = parse_note(request_cosignature(witness, tree, note, old_size=len(b_entries)))[1]
                cosigned += [s for s in lines if s.name == witness.name]
            except WitnessRefusal as exc:
                outcomes[(witness.name, len(entries))] = exc.status
        outcomes[("cosigned", len(entries))] = [s.name for s in cosigned]
        if extra == 0:
            b_published = world["root"] / "b-published"
            shutil.copytree(log_path(world["b"]), b_published)
            (b_published / "entries").write_bytes(b"".join(e + b"\n" for e in entries))
            text, signatures = parse_note(note)
            (b_published / "checkpoint").write_bytes(format_note(text, [*signatures, *cosigned]))
    print(f"the second history at witnesses 2 and 3: {outcomes}")
    size = len(history)
    assert outcomes[("cosigned", size)] == ["witness3.test"] and outcomes[("witness2.test", size)] == 409
    assert outcomes[("witness2.test", size + 1)] == 422
    # The evidence, served by witness 2 and checked with the log key alone.
    witness2_url = world["services"][1].url
    served = cli("audit", "evidence", witness2_url, "--key", world["vkey"])
    print(f"$ phsafe audit evidence {witness2_url} --key log.vkey\n{served.stdout}{served.stderr}")
    assert served.returncode == 1 and served.stderr.count("signed two histories") == (2 if size & (size - 1) else 1)
    # B's history, shown to an outsider with the witnesses' keys: 1 of the 2 cosignatures it needs.
    outsider = cli("audit", "public", "--log", b_published, "--key", world["vkey"], "--state",
                   world["root"] / "fresh-outsider.json", *[a for k in world["wkeys"] for a in ("--witness-key", k)])
    line = failed_line(outsider)
    print(f"an outsider shown B's history: {line}")
    assert outsider.returncode == 1 and "2 of 3 witness cosignatures are required and 1 verified (witness3.test)" in line
    # The monitor that follows A's log, given witness 2's URL: equivocation, exit 1, evidence printed.
    state = world.get("monitor_state", world["root"] / "monitor.json")
    watched = cli("audit", "monitor", world["server"].url, "--key", world["vkey"], "--state", state, "--once",
                  "--evidence", witness2_url, *[a for k in world["wkeys"] for a in ("--witness-key", k)])
    line = failed_line(watched)
    print(f"$ phsafe audit monitor URL --evidence {witness2_url} ...: exit {watched.returncode}: {line}")
    assert watched.returncode == EXIT_STATUS["equivocation"] and line.startswith("FAILED [equivocation]")
    assert '"format": "phsafe-equivocation/1"' in watched.stdout
    # ... and shown B's history itself after A's: equivocation from its own state.
    shown_b = cli("audit", "monitor", b_published, "--key", world["vkey"], "--state", state, "--once",
                  *[a for k in world["wkeys"] for a in ("--witness-key", k)])
    line = failed_line(shown_b)
    print(f"$ phsafe audit monitor B-LOG ... (after A's): exit {shown_b.returncode}: {line}")
    assert shown_b.returncode == EXIT_STATUS["equivocation"] and "two trees of" in line


def test_a_frozen_witness_service_stops_a_run_within_one_time_out(world: dict, monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """SIGSTOP: the service's socket still accepts connections, nothing answers. Frozen right
    after it confirmed the ledger before an INTENT (the worst moment), it stops the run before
    the INTENT's noise after one time-out -- counted, not timed: one request to it ends without
    an answer (it used to be two of 10 s: when the INTENT's checkpoint was published, and in the
    confirmation after it). The INTENT stays, charged, as every spend whose witnessing failed."""
    import os
    import signal

    from phsafe.errors import WitnessesUnavailable, WitnessUnreachable
    from phsafe.publog.log import PublicLog

    services = world["services"][:2]
    ledger = new_ledger(tmp_path / "frozen", cap=3 * PLAN.total, datasets=["frozen-data"],  # test-data is A's
                        witnesses=[(s.url, s.vkey.read_text().strip()) for s in services])
    for service in services:
        service.witness(log_path(ledger.path))
    frozen = services[1].process
    assert frozen is not None
    silent: list[str] = []
    armed = [False]
    real_add, real_confirm = HttpWitness.add_checkpoint, PublicLog.confirm

    def counted(self, request):  # noqa: ANN001, ANN202
        try:
            return real_add(self, request)
        except WitnessUnreachable:
            silent.append(self.name)
            raise

    def confirm_then_freeze(self, lines, *, fresh=True):  # noqa: ANN001, ANN202
        real_confirm(self, lines, fresh=fresh)
        if fresh and armed[0]:
            armed[0] = False
            os.kill(frozen.pid, signal.SIGSTOP)  # confirmed the ledger, then froze

    monkeypatch.setattr(HttpWitness, "add_checkpoint", counted)
    monkeypatch.setattr(PublicLog, "confirm", confirm_then_freeze)
    rec = start_run(ledger, PLAN, "run-frozen", dataset="frozen-data")
    spend(rec, PLAN.measurements[0])
    armed[0] = True
    try:
        with pytest.raises(WitnessesUnavailable) as stopped:
            spend(rec, PLAN.measurements[1])
        rec.fail("a witness did not answer", "witness-unreachable")  # recorded without waiting for it again
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    print(f"a frozen witness: {stopped.value}")
    assert "witness2.test" in str(stopped.value) and "no answer within 10 s" in str(stopped.value)
    assert silent == ["witness2.test"], silent
    assert sum(1 for line in read_ledger(ledger.path).lines if b'"kind":"INTENT"' in line) == 2
    ledger.close()
