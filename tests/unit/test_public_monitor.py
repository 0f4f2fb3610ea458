"""``phsafe audit monitor`` against a genuine log and the insider's attacks on it, in memory.

A ledger witnessed by three witnesses (quorum 2 of 3, services in memory reached over a mock
HTTP transport) spends and releases; its public log folder is copied as it grows, as a web
server would serve it. Then the monitor (one round each, in this process) is shown the log as
an insider holding the log key could serve it -- a rollback, another history of the same size, a
checkpoint short of its quorum or with a stale cosignature, a spend past the cap, a second
release, a log that does not verify, a second log for a dataset it knows, nothing at all -- and
reports each with its own exit status; the webhook receives the findings. The same log served by
a real HTTP server, while a release appends to it, and the split view played against witness
services, are in tests/system/test_public_log_monitor.py.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from phsafe.audit.monitor import EXIT_STATUS, monitor, monitor_once
from phsafe.errors import VerificationFailure
from phsafe.ledger import canonical_json
from phsafe.noise import measure
from phsafe.publog import log_key_path, log_path
from phsafe.tlog import (
    Checkpoint,
    MemoryCheckpointStore,
    TransparencyLog,
    Witness,
    read_signer_key,
    request_cosignature,
    sign_checkpoint,
    verifier_from_key,
)
from phsafe.tlog.note import format_note, parse_note
from tests._ledgers import new_ledger
from tests._ledgers import start as start_run
from tests._witnesses import Witnesses
from tests.unit.test_ledger_resume import FILES, PLAN


def spend(rec, m) -> None:  # noqa: ANN001
    measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("monitor")
    ws = Witnesses(3)
    ledger = new_ledger(root / "enclave", cap=PLAN.total * 3 / 2, witnesses=ws.listed(), witness_quorum=2,
                        transport=ws.transport)
    ws.trust(ledger.state.public_log["vkey"])
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    shutil.copytree(log_path(ledger.path), root / "early")  # as it was served mid-run
    for m in PLAN.measurements[1:]:
        spend(rec, m)
    rec.record_published(FILES, root / "out")
    shutil.copytree(log_path(ledger.path), root / "released")
    for number in (1, 2, 3):
        (root / f"witness{number}.vkey").write_text(ws[number].vkey + "\n")
    return {"root": root, "ws": ws, "ledger": ledger, "vkey": log_path(ledger.path) / "log.vkey",
            "wkeys": [root / f"witness{n}.vkey" for n in (1, 2, 3)]}


def entries_of(log: Path) -> list[bytes]:
    return (log / "entries").read_bytes().split(b"\n")[:-1]


def served(world: dict[str, Any], tmp_path: Path, entries: list[bytes], *, cosigners: int = 3) -> Path:
    """A log folder holding ``entries``, signed with the log key (an insider has it) and cosigned
    by ``cosigners`` of the witnesses as they cosign whatever extends what they cosigned (copies
    of their state: the genuine witnesses' state is left as it is)."""
    folder = tmp_path / f"served-{len(list(tmp_path.glob('served-*')))}"
    shutil.copytree(world["root"] / "released", folder)
    tree = TransparencyLog.of_entries(entries)
    key = read_signer_key(log_key_path(world["ledger"].path))
    note = sign_checkpoint(Checkpoint(key.name, len(entries), tree.root()), [key])
    text, signatures = parse_note(note)
    lines = []
    for number in range(1, cosigners + 1):
        memory = world["ws"][number]
        store = MemoryCheckpointStore()
        witness = Witness(memory.signer, [verifier_from_key(v) for v in memory.logs], store)
        lines += [s for s in parse_note(request_cosignature(witness, tree, note))[1] if s.name == memory.name]
    (folder / "entries").write_bytes(b"".join(e + b"\n" for e in entries))
    (folder / "checkpoint").write_bytes(format_note(text, [*signatures, *lines]))
    return folder


def round_of(world: dict[str, Any], log: Path | str, state: Path, **kw: Any):  # noqa: ANN201
    return monitor_once(log, world["vkey"], state_file=state, witness_keys=world["wkeys"], **kw)


def found(report) -> str:  # noqa: ANN001
    return "; ".join(f"[{f.finding}] {f}" for f in report.findings)


def test_a_genuine_log_that_grows_is_all_good(world: dict[str, Any], tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    first = round_of(world, world["root"] / "early", state)
    assert first.status == 0, found(first)
    assert any("first seen" in line for line in first.lines)
    assert any("its policy binds 3 witness(es), quorum 2" in line for line in first.lines)
    later = round_of(world, world["root"] / "released", state)
    assert later.status == 0, found(later)
    assert any("consistent with the checkpoint of" in line for line in later.lines)
    assert any(line.startswith("dataset test-data: 1 release(s) (run-1)") for line in later.lines)
    assert json.loads(state.read_text())["claims"] == {"test-data": world["ledger"].state.public_log["origin"]}


def _rollback(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    return world["root"] / "early"


def _same_size_fork(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    lines = entries_of(world["root"] / "released")
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    return served(world, tmp_path, lines, cosigners=0)


def _larger_fork(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    lines = entries_of(world["root"] / "released")
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    return served(world, tmp_path, lines + [lines[-2]], cosigners=1)


def _quorum_not_met(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    return served(world, tmp_path, entries_of(world["root"] / "released"), cosigners=1)


def _over_cap(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    """A second run of the same records, cosigned: its start takes the dataset past its cap."""
    lines = entries_of(world["root"] / "released")
    started = next(json.loads(e) for e in lines if b'"run-started"' in e)
    release = next(json.loads(e) for e in lines if b'"type":"release"' in e)
    more = {**started, "run_id": "run-2", "spent_before": release["spent"], "re_release": "again"}
    return served(world, tmp_path, lines + [canonical_json(more)])


def _second_release(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    lines = entries_of(world["root"] / "released")
    release = next(e for e in lines if b'"type":"release"' in e)
    return served(world, tmp_path, lines + [release])


def _another_rule(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    lines = entries_of(world["root"] / "released")
    spend_entry = next(e for e in lines if b'"type":"spend"' in e)
    return served(world, tmp_path, lines + [spend_entry])  # a spend after the run's release


def _does_not_verify(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    folder = tmp_path / "changed"
    shutil.copytree(world["root"] / "released", folder)
    lines = entries_of(folder)
    lines[3] = lines[3].replace(b'"budget":"', b'"budget":"0', 1)
    (folder / "entries").write_bytes(b"".join(e + b"\n" for e in lines))
    return folder


def _stale(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    return world["root"] / "released"


def _unreadable(world: dict[str, Any], tmp_path: Path, state: Path) -> Path:
    return tmp_path / "nothing-here"


ATTACKS = {
    "a rollback to an older view": (_rollback, "rollback", "a prefix of the larger"),
    "another history of the same size": (_same_size_fork, "equivocation", "signed two histories: two trees of"),
    "a larger history that does not extend": (_larger_fork, "equivocation", "does not extend the smaller"),
    "a checkpoint short of its quorum": (_quorum_not_met, "quorum", "2 of 3 witness cosignatures are required and 1"),
    "a stale cosignature": (_stale, "stale", "older than --max-age"),
    "a spend past the cap": (_over_cap, "over-cap", "above its cap"),
    "a second release of one run": (_second_release, "second-release", "is released a second time"),
    "another rule of the ledger": (_another_rule, "rule", "a spend of run run-1, which had finished"),
    "a log that does not verify": (_does_not_verify, "invalid", "do not hash to the checkpoint's root hash"),
    "a log that cannot be read": (_unreadable, "unreadable", "cannot read the published log"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_is_reported_with_its_own_exit_status(world: dict[str, Any], tmp_path: Path, attack: str) -> None:
    make, finding, message = ATTACKS[attack]
    state = tmp_path / "state.json"
    assert round_of(world, world["root"] / "released", state).status == 0  # what the monitor saw before
    log = make(world, tmp_path, state)
    now = time.time() + 8 * 86400 if finding == "stale" else None
    report = round_of(world, log, state, now=now)
    print(f"{attack}: exit {report.status}: {found(report)}")
    assert report.status == EXIT_STATUS[finding], found(report)
    first = min(report.findings, key=lambda f: EXIT_STATUS[f.finding])
    assert first.finding == finding and message in str(first), str(first)
    if finding == "equivocation":
        assert report.evidence_kept and report.evidence_kept[0].parent == state.with_name("state.json.evidence")
        assert first.evidence is not None and report.evidence_kept[0].read_bytes() == first.evidence


def test_a_second_log_for_a_dataset_the_monitor_knows(world: dict[str, Any], tmp_path: Path) -> None:
    """A fresh ledger (a new log, a new key) publishes runs of the same dataset again: the monitor
    that follows both reports it."""
    state = tmp_path / "state.json"
    assert round_of(world, world["root"] / "released", state).status == 0
    ws = world["ws"]
    other = new_ledger(tmp_path / "again", cap=PLAN.total * 3 / 2, witnesses=ws.listed(), witness_quorum=2,
                       transport=ws.transport)
    ws.trust(other.state.public_log["vkey"])
    start_run(other, PLAN, "run-again")
    report = monitor_once(log_path(other.path), log_path(other.path) / "log.vkey", state_file=state,
                          witness_keys=world["wkeys"])
    print(f"a second log for a known dataset: exit {report.status}: {found(report)}")
    assert report.status == EXIT_STATUS["dataset-claimed"]
    assert "dataset test-data is accounted in this log" in found(report) and "must be retired publicly" in found(report)


def test_evidence_from_a_file_and_a_witness_that_proves_nothing(world: dict[str, Any], tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    assert round_of(world, world["root"] / "released", state).status == 0
    forked = round_of(world, _same_size_fork(world, tmp_path, state), state)
    evidence = forked.evidence_kept[0]
    # Another monitor, which never saw the fork itself, is shown the evidence file.
    report = round_of(world, world["root"] / "released", tmp_path / "other.json", evidence_sources=[str(evidence)])
    assert report.status == 1 and "signed two histories" in found(report)
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    report = round_of(world, world["root"] / "released", tmp_path / "other.json", evidence_sources=[str(junk)])
    assert report.status == 0 and any("proves nothing" in line for line in report.lines)


def test_options_that_cannot_be_used_are_refused(world: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(VerificationFailure, match="give the witnesses' verifier keys"):
        monitor_once(world["root"] / "released", world["vkey"], state_file=tmp_path / "s.json")
    report = round_of(world, world["root"] / "released", tmp_path / "s.json", quorum=1)
    assert report.status == EXIT_STATUS["quorum"] and "below the log's policy (2 of 3)" in found(report)
    unwitnessed = monitor_once(world["root"] / "released", world["vkey"], state_file=tmp_path / "s2.json",
                               no_witness=True)
    assert unwitnessed.status == 0 and any("none checked (--no-witness)" in line for line in unwitnessed.lines)


def test_the_webhook_gets_each_new_set_of_findings_once(world: dict[str, Any], tmp_path: Path) -> None:
    posted: list[dict[str, Any]] = []

    def hook(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        return httpx.Response(204)

    state = tmp_path / "state.json"
    assert round_of(world, world["root"] / "released", state).status == 0
    shown = []
    status = monitor(world["root"] / "early", world["vkey"], state_file=state, show=shown.append, interval=60,
                     rounds=3, sleep=lambda seconds: None, webhook="http://alerts.test/hook",
                     witness_keys=world["wkeys"], transport=httpx.MockTransport(hook))
    assert status == EXIT_STATUS["rollback"] and len(shown) == 3
    assert len(posted) == 1  # the same finding three rounds running: one alert
    alert = posted[0]
    assert alert["subject"].startswith("phsafe audit monitor: 1 finding(s) on the public log")
    assert alert["status"] == 4 and alert["findings"][0]["class"] == "rollback" and "text" in alert
