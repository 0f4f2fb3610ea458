"""The public privacy-loss log beside a ledger (issues 21 and 29), through the ledger's API.

* the log is exactly the projection of the ledger's public facts, and holds nothing
  confidential (no input or config digest, fingerprint, truncation key, lineage key id, chain
  hash, no operator message of a failure: a code and a stage);
* it stays in step with the ledger when a process stops between the ledger's append and the
  log's (before it, in the middle of its line, between its line and its hashes), and through
  ``ledger repair``; a log that is not the projection stops the ledger;
* a ledger is bound to its log from its first entry: without its log folder, its log key or its
  witness list -- or with a witness list that drops a witness or lowers the quorum -- it is
  refused, with one line, before anything is recorded; the ledger itself never imports the log;
* with witnesses (services in memory, asked over HTTP through a mock transport), a copy of the
  ledger made before a release, or in the middle of a run and resumed on both copies, cannot
  spend from the copy: no INTENT is added there, one refusal; a witness taken down stops the
  run before its next spend; quorum 2 of 3 goes on without one of them;
* the public statement recomputed from the log matches the ledger's odometer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from phsafe.errors import ForkRefused, LedgerError, VerificationFailure, WitnessesUnavailable
from phsafe.ledger import Ledger, key_id, read_ledger, read_lineage_key
from phsafe.noise import measure
from phsafe.publog import log_key_path, log_path, open_ledger, project, public_log_of, repair_ledger, witnesses_path
from phsafe.audit.public import statement
from phsafe.publog.confidential import check_public_log
from phsafe.tlog import LogDirectory
from tests._ledgers import DIGESTS_A, FP_A, KEY_HEX, new_ledger, rewind_public_log
from tests._ledgers import start as start_run
from tests._witnesses import Witnesses
from tests.unit.test_ledger_resume import FILES, PLAN, resume

OUTPUTS = dict(FILES)


def spend(rec, m) -> None:  # noqa: ANN001
    measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)


def log_entries(ledger: Path) -> list[bytes]:
    return (log_path(ledger) / "entries").read_bytes().split(b"\n")[:-1]


def in_step(ledger: Path) -> list[str]:
    """The confidential audit's notes; asserts the log is exactly the projection, not behind."""
    notes = check_public_log(ledger, read_ledger(ledger))
    assert "exactly the projection" in notes[0] and not any("behind" in n for n in notes), notes
    assert log_entries(ledger) == project(read_ledger(ledger).lines)
    return notes


def full_history(ledger: Ledger) -> None:
    """A run that fails after spending, is resumed, re-spends and publishes; a cap raise."""
    rec = start_run(ledger, PLAN, "run-1", cap_raise=(10 * PLAN.total, "room for a re-spend"))
    spend(rec, PLAN.measurements[0])
    rec.fail("worker lost: /srv/enclave/out/pr-release already exists", "output-exists")
    rec2 = resume(ledger, "run-1")
    for m in PLAN.measurements:
        spend(rec2, m)
    rec2.record_published(OUTPUTS, ledger.path.parent / "out")


def test_the_log_is_the_projection_of_the_ledgers_public_facts(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    full_history(ledger)
    in_step(ledger.path)
    kinds = [json.loads(e)["type"] for e in log_entries(ledger.path)]
    assert kinds[:4] == ["policy", "cap-raised", "dataset-version", "run-started"]
    assert kinds.count("spend") == 1 + len(PLAN.measurements)
    assert kinds[-1] == "release" and "run-failed" in kinds and "run-resumed" in kinds
    release = json.loads(log_entries(ledger.path)[-1])
    assert release["manifest_sha256"] == FILES["manifest.json"]
    assert [s["times"] for s in release["spends"]] == [2] + [1] * (len(PLAN.measurements) - 1)
    # The statement an outsider recomputes is the ledger's own odometer.
    state = read_ledger(ledger.path)
    (s,) = statement(log_entries(ledger.path)).datasets.values()
    assert s.spent == state.dataset_spent("test-data", state.unit) and s.releases == ["run-1"]
    assert s.cap == 10 * PLAN.total


def test_the_log_holds_nothing_confidential(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    full_history(ledger)
    state = read_ledger(ledger.path)
    secrets = {FP_A, KEY_HEX, "c" * 64, *DIGESTS_A.values(), key_id(read_lineage_key(ledger.path, state.policy)),
               read_lineage_key(ledger.path, state.policy).hex(), str(tmp_path)}
    secrets |= {json.loads(line)["hash"] for line in state.lines}
    published = b"".join(p.read_bytes() for p in log_path(ledger.path).iterdir() if p.is_file())
    for secret in secrets:
        assert secret.encode() not in published and secret[:16].encode() not in published
    assert log_key_path(ledger.path).stat().st_mode & 0o777 == 0o600
    assert (log_path(ledger.path) / "log.vkey").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("stop", ["before the log append", "torn log line", "lines without hashes", "no checkpoint"])
def test_the_log_catches_up_after_a_process_stopped_between_ledger_and_log(tmp_path: Path, stop: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = new_ledger(tmp_path)
    rec = start_run(ledger, PLAN, "run-1")
    real_append, real_publish = LogDirectory.append, LogDirectory.publish_checkpoint

    class Stopped(BaseException):
        """The process 'dies' here: nothing after it runs."""

    def append(self, entries):  # noqa: ANN001
        if stop == "torn log line":
            with open(self.path / "entries", "ab") as f:
                f.write(entries[0][: len(entries[0]) // 2])
        elif stop == "lines without hashes":
            with open(self.path / "entries", "ab") as f:
                f.write(b"".join(e + b"\n" for e in entries))
        elif stop == "no checkpoint":
            real_append(self, entries)
            return range(0)
        raise Stopped

    def publish(self, message):  # noqa: ANN001
        raise Stopped

    monkeypatch.setattr(LogDirectory, "append", append)
    if stop == "no checkpoint":
        monkeypatch.setattr(LogDirectory, "append", lambda self, e: real_append(self, e))
        monkeypatch.setattr(LogDirectory, "publish_checkpoint", publish)
    with pytest.raises(Stopped):
        spend(rec, PLAN.measurements[0])
    monkeypatch.setattr(LogDirectory, "append", real_append)
    monkeypatch.setattr(LogDirectory, "publish_checkpoint", real_publish)
    # The INTENT is in the ledger (written first); the confidential audit says the log is behind.
    assert read_ledger(ledger.path).runs["run-1"].intents
    notes = check_public_log(ledger.path, read_ledger(ledger.path))
    assert any("behind the ledger" in n for n in notes), notes
    # The next use of the ledger (any process, under its lock) brings the log in step.
    open_ledger(ledger.path)
    in_step(ledger.path)


def test_ledger_repair_keeps_the_log_in_step(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    # Power lost in the middle of the ledger's last line: that write never reached the log.
    data = ledger.path.read_bytes()
    last = data[:-1].rsplit(b"\n", 1)[-1]
    ledger.path.write_bytes(data[:len(data) - len(last) - 1 + 30])
    rewind_public_log(ledger.path)
    with pytest.raises(LedgerError):
        open_ledger(ledger.path)
    repair = repair_ledger(ledger.path)
    assert repair is not None
    notes = in_step(ledger.path)
    assert json.loads(log_entries(ledger.path)[-1])["type"] == "ledger-repaired"
    assert notes


@pytest.mark.parametrize("tamper", ["changed", "removed", "appended"])
def test_a_log_that_is_not_the_projection_stops_the_ledger(tmp_path: Path, tamper: str) -> None:
    ledger = new_ledger(tmp_path)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    entries_file = log_path(ledger.path) / "entries"
    lines = entries_file.read_bytes().split(b"\n")[:-1]
    if tamper == "changed":
        lines[1] = lines[1].replace(b'"reason":"first version"', b'"reason":"another one"')
        assert lines[1] != entries_file.read_bytes().split(b"\n")[1]
    elif tamper == "removed":
        del lines[2]
    else:
        lines.append(b'{"type":"spend"}')
    entries_file.write_bytes(b"".join(line + b"\n" for line in lines))
    with pytest.raises(VerificationFailure):
        check_public_log(ledger.path, read_ledger(ledger.path))
    with pytest.raises(LedgerError, match="not the projection of the ledger"):
        spend(rec, PLAN.measurements[1])
    assert sum(1 for line in read_ledger(ledger.path).lines if b'"INTENT"' in line) == 1


# --------------------------------------------------------------------------------------------
# The ledger is bound to its log: it cannot spend without it
# --------------------------------------------------------------------------------------------


def test_the_first_entry_binds_the_log_and_the_ledger_never_reads_it(tmp_path: Path) -> None:
    ws = Witnesses(2)
    ledger = new_ledger(tmp_path, witnesses=ws.listed(), transport=ws.transport)
    genesis = json.loads(read_ledger(ledger.path).lines[0])
    binding = genesis["public_log"]
    assert genesis["format"] == 3 and binding["origin"] == binding["vkey"].split("+")[0]
    assert binding["witnesses"] == [ws[1].vkey, ws[2].vkey] and binding["quorum"] == 2
    assert binding["vkey"] == (log_path(ledger.path) / "log.vkey").read_text().strip()
    # The ledger opened without its log reads, but appends nothing.
    bare = Ledger.open(ledger.path)
    with pytest.raises(LedgerError, match="bound to its public log .* opened without it"):
        start_run(bare, PLAN, "run-1")
    assert not read_ledger(ledger.path).runs
    # The public policy names the witnesses (their public keys), never a URL.
    policy = json.loads(log_entries(ledger.path)[0])
    assert policy["witnesses"] == binding["witnesses"] and policy["quorum"] == 2
    assert "http" not in log_entries(ledger.path)[0].decode()


@pytest.mark.parametrize("missing", ["log folder", "log key", "witness list", "a witness dropped", "quorum lowered",
                                     "a quorum that need not intersect"])
def test_a_ledger_without_its_log_or_witnesses_is_refused_before_anything_is_recorded(tmp_path: Path,
                                                                                       missing: str) -> None:
    ws = Witnesses(3)
    ledger = new_ledger(tmp_path / "enclave", cap=10 * PLAN.total, witnesses=ws.listed(), transport=ws.transport)
    ws.trust(ledger.state.public_log["vkey"])
    start_run(ledger, PLAN, "run-1")
    size = len(read_ledger(ledger.path).lines)
    listed = json.loads(witnesses_path(ledger.path).read_text())
    if missing == "log folder":
        shutil.rmtree(log_path(ledger.path))
    elif missing == "log key":
        log_key_path(ledger.path).unlink()
    elif missing == "witness list":
        witnesses_path(ledger.path).unlink()
    elif missing == "a witness dropped":
        listed["witnesses"], listed["quorum"] = listed["witnesses"][:2], 2
        witnesses_path(ledger.path).write_text(json.dumps(listed))
    else:  # 3 of 3 bound: lowered to 2 of 3 (a policy the rule allows, not the bound one), or to 1
        listed["quorum"] = 2 if missing == "quorum lowered" else 1
        witnesses_path(ledger.path).write_text(json.dumps(listed))
    with pytest.raises(LedgerError) as refused:
        open_ledger(ledger.path, transport=ws.transport)
    line = str(refused.value)
    print(f"{missing}: {line}")
    assert "\n" not in line and line.startswith("refused:") and "nothing was spent" in line
    assert {"log folder": "log folder", "log key": "its log key", "witness list": "witness list",
            "a witness dropped": "witnesses are never removed", "quorum lowered": "quorum 2",
            "a quorum that need not intersect": "a witness quorum of 1 of 3 is refused: any two quorums must share a "
                                                "witness"}[missing] in line
    # repair is refused too, and changes nothing
    with pytest.raises(LedgerError, match="refused:"):
        repair_ledger(ledger.path, transport=ws.transport)
    assert len(read_ledger(ledger.path).lines) == size


def test_a_run_failure_is_public_as_a_code_and_a_stage_never_the_message(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    full_history(ledger)
    failed = [json.loads(e) for e in log_entries(ledger.path) if b'"run-failed"' in e]
    assert failed == [{"type": "run-failed", "run_id": "run-1", "spent": failed[0]["spent"], "code": "output-exists",
                       "stage": "measure", "time": failed[0]["time"]}]
    assert b"/srv/enclave" not in b"".join(log_entries(ledger.path))
    assert "/srv/enclave" in read_ledger(ledger.path).runs["run-1"].attempts[0].end_reason  # confidential, kept


# --------------------------------------------------------------------------------------------
# Witnesses: other parties, asked over HTTP
# --------------------------------------------------------------------------------------------


def witnessed_ledger(tmp_path: Path, ws: Witnesses, *numbers: int, quorum: int | None = None) -> Ledger:
    ledger = new_ledger(tmp_path / "enclave", cap=10 * PLAN.total, witnesses=ws.listed(*numbers),
                        witness_quorum=quorum, transport=ws.transport)
    ws.trust(ledger.state.public_log["vkey"])
    return ledger


def copy_ledger(ledger: Ledger, to: Path, ws: Witnesses) -> Ledger:
    """An insider's copy of the ledger's whole folder (ledger, keys, log, witness list)."""
    shutil.copytree(ledger.path.parent, to)
    return open_ledger(to / ledger.path.name, transport=ws.transport)


def intents(ledger: Ledger) -> int:
    return sum(1 for line in read_ledger(ledger.path).lines if b'"kind":"INTENT"' in line)


def test_every_spend_is_cosigned_by_the_quorum_before_its_noise(tmp_path: Path) -> None:
    ws = Witnesses(2)
    ledger = witnessed_ledger(tmp_path, ws)
    rec = start_run(ledger, PLAN, "run-1")
    seen = []
    for m in PLAN.measurements:
        spend(rec, m)
        # the checkpoint published after the spend holds the INTENT and both cosignatures
        for number in (1, 2):
            cosigned = ws[number].store.load(ledger.state.public_log["origin"])
            seen.append(cosigned.split(b"\n")[1])
    assert seen[-1] == str(len(log_entries(ledger.path))).encode()
    notes = in_step(ledger.path)
    assert "cosigned by witness1.test, witness2.test (2 of the 2 bound witnesses, quorum 2)" in notes[0]


def test_a_ledger_copied_before_a_release_cannot_spend(tmp_path: Path) -> None:
    ws = Witnesses(2)
    ledger = witnessed_ledger(tmp_path, ws)
    copy = copy_ledger(ledger, tmp_path / "copy", ws)
    rec = start_run(ledger, PLAN, "run-1")
    for m in PLAN.measurements:
        spend(rec, m)
    rec.record_published(OUTPUTS, tmp_path / "out")
    with pytest.raises(ForkRefused, match="an older copy or was rolled back.*copied or rolled-back ledger cannot "
                                          "spend") as refused:
        start_run(copy, PLAN, "run-2", re_release="the copy tries again")
    assert "\n" not in str(refused.value)
    assert intents(copy) == 0 and intents(ledger) == len(PLAN.measurements)
    assert len(read_ledger(copy.path).runs) == 0  # refused before RUN_STARTED was recorded


def test_a_ledger_copied_in_the_middle_of_a_run_and_resumed_on_both_cannot_spend_twice(tmp_path: Path) -> None:
    ws = Witnesses(2)
    ledger = witnessed_ledger(tmp_path, ws)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    copy = copy_ledger(ledger, tmp_path / "copy", ws)
    # The original's worker dies; the run is resumed on the copy first, which finishes it.
    on_copy = resume(copy, "run-1")
    for m in PLAN.measurements[1:]:
        spend(on_copy, m)
    before = intents(ledger)
    # The original's worker was only slow, not dead: its next spend is refused ...
    with pytest.raises(ForkRefused, match="an older copy or was rolled back.* cannot spend"):
        spend(rec, PLAN.measurements[1])
    # ... and so is resuming the run on the original: no INTENT is added there.
    with pytest.raises(ForkRefused, match="cannot spend"):
        resume(ledger, "run-1")
    assert intents(ledger) == before == 1
    assert intents(copy) == len(PLAN.measurements)


def test_a_witness_taken_down_stops_the_run_before_its_next_spend(tmp_path: Path) -> None:
    ws = Witnesses(2)
    ledger = witnessed_ledger(tmp_path, ws)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    ws[2].down = True
    with pytest.raises(WitnessesUnavailable) as stopped:
        spend(rec, PLAN.measurements[1])
    line = str(stopped.value)
    print(f"a witness down: {line}")
    assert "witness witness2.test at http://witness2.test:8000 cannot be reached" in line and "\n" not in line
    assert intents(ledger) == 1  # refused before the INTENT: nothing more was spent
    rec.fail("a witness could not be reached", "witness-unreachable")
    ws[2].down = False
    resumed = resume(ledger, "run-1")
    for m in PLAN.measurements[1:]:
        spend(resumed, m)
    assert intents(ledger) == len(PLAN.measurements)


@pytest.mark.parametrize("when", ["before the spend's INTENT", "between the INTENT and its confirmation"])
def test_a_frozen_witness_stops_the_run_within_one_time_out(tmp_path: Path, when: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen witness (SIGSTOP: it accepts connections, never answers) costs one time-out
    before the run stops, wherever it freezes: it used to cost two when it froze after the
    confirmation before an INTENT -- once when the INTENT's checkpoint was published, once more
    in the confirmation after it."""
    ws = Witnesses(2)
    ledger = witnessed_ledger(tmp_path, ws)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    if when.startswith("before"):
        ws[2].frozen = True
    else:
        real = type(public_log_of(ledger)).confirm

        def freeze_after_the_first(log, lines, *, fresh=True):  # noqa: ANN001, ANN202
            real(log, lines, fresh=fresh)
            if fresh:
                ws[2].frozen = True  # the witness freezes right after it confirmed the ledger

        monkeypatch.setattr(type(public_log_of(ledger)), "confirm", freeze_after_the_first)
    with pytest.raises(WitnessesUnavailable) as stopped:
        spend(rec, PLAN.measurements[1])
    line = str(stopped.value)
    print(f"a frozen witness, {when}: {line}")
    assert "witness witness2.test at http://witness2.test:8000 cannot be reached (no answer within 10 s)" in line
    assert ws[2].timeouts == 1, f"{ws[2].timeouts} time-outs before the run stopped"
    assert intents(ledger) == (1 if when.startswith("before") else 2)
    rec.fail("a witness did not answer", "witness-unreachable")  # recording the failure waits for nobody
    assert ws[2].timeouts == 1


def test_one_deadline_covers_a_witness_round_and_its_second_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 409 answered at the deadline is not followed by a second request with a fresh time-out."""
    import httpx

    from phsafe.errors import WitnessUnreachable
    from phsafe.publog import witnesses as module
    from phsafe.publog.witnesses import HttpWitness, WitnessList
    from phsafe.tlog import request_cosignature
    from tests._tlog import entries, signed_checkpoint
    from phsafe.tlog.log import TransparencyLog

    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    sent = []

    def slow_409(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        clock[0] += module.WITNESS_TIMEOUT_SECONDS  # the answer comes at the deadline
        return httpx.Response(409, headers={"content-type": "text/x.tlog.size"}, content=b"3\n")

    ws = Witnesses(1)
    entry = WitnessList.of(ws.listed(), None).witnesses[0]
    client = HttpWitness(entry, httpx.MockTransport(slow_409))
    log = TransparencyLog.of_entries(entries(5))
    client.start_round()
    with pytest.raises(WitnessUnreachable, match="no answer within 10 s"):
        request_cosignature(client, log, signed_checkpoint(log), old_size=0)
    assert len(sent) == 1


def test_a_quorum_of_two_of_three_goes_on_without_one_witness(tmp_path: Path) -> None:
    ws = Witnesses(3)
    ledger = witnessed_ledger(tmp_path, ws, quorum=2)
    rec = start_run(ledger, PLAN, "run-1")
    ws[3].down = True
    for m in PLAN.measurements:
        spend(rec, m)
    assert intents(ledger) == len(PLAN.measurements)
    ws[2].down = True
    with pytest.raises(WitnessesUnavailable, match="1 of the 2 required"):
        start_run(ledger, PLAN, "run-2")


def test_a_witness_answering_with_another_key_counts_for_nothing(tmp_path: Path) -> None:
    """A "cosignature" made without the witness (here: a service answering with a key of the
    witness's name that is not the bound one) does not verify and is not published."""
    from phsafe.tlog.cosignature import CosignatureSigner
    from tests._tlog import private_key

    ws = Witnesses(1)
    ledger = witnessed_ledger(tmp_path, ws)
    ws[1].signer = CosignatureSigner(ws[1].name, private_key("an impostor"))
    with pytest.raises(ForkRefused, match="not a cosignature .*does not verify with the witness's key"):
        start_run(ledger, PLAN, "run-1")
    assert intents(ledger) == 0


def test_without_a_witness_a_copy_spends_and_only_the_logs_show_the_fork(tmp_path: Path) -> None:
    """What a ledger without a witness is missing: the copy spends again; the fork shows only when
    someone compares the two logs (audit public with a kept checkpoint)."""
    from phsafe.errors import ForkError
    from phsafe.tlog import MemorySeenLogs, SeenCheckpoints, leaf_hash, read_published_log, read_verifier_key

    ledger = new_ledger(tmp_path / "a", cap=10 * PLAN.total)
    shutil.copytree(ledger.path.parent, tmp_path / "b")
    copy = open_ledger(tmp_path / "b" / ledger.path.name)
    for led, run_id in ((ledger, "run-1"), (copy, "run-2")):
        rec = start_run(led, PLAN, run_id)
        spend(rec, PLAN.measurements[0])
    key = read_verifier_key(log_path(ledger.path) / "log.vkey")
    seen = SeenCheckpoints(MemorySeenLogs(), key)
    first = read_published_log(log_path(ledger.path), key)
    seen.observe(first.checkpoint.message, first.consistency_proof, b"".join(leaf_hash(e) for e in first.entries))
    second = read_published_log(log_path(copy.path), key)
    with pytest.raises(ForkError, match="forked or rewrote its history"):
        seen.observe(second.checkpoint.message, second.consistency_proof)


def test_ledger_repair_cuts_a_torn_log_line_and_checks_the_whole_log(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    start_run(ledger, PLAN, "run-1")
    ledger.close()
    with open(log_path(ledger.path) / "entries", "ab") as f:
        f.write(b'{"type":"spe')  # what a killed log append left
    assert any("torn last line" in n for n in check_public_log(ledger.path, read_ledger(ledger.path)))
    assert repair_ledger(ledger.path) is None  # the ledger ends in a whole entry; the log is caught up
    in_step(ledger.path)
    # A changed entry is not "repaired": it is refused, and stays for someone to look at.
    entries_file = log_path(ledger.path) / "entries"
    entries_file.write_bytes(entries_file.read_bytes().replace(b'"reason":"first version"', b'"reason":"other"'))
    with pytest.raises(LedgerError, match="not the projection of the ledger"):
        repair_ledger(ledger.path)


# --------------------------------------------------------------------------------------------
# Ledgers of format 2 (a log beside them, not bound): bound by `ledger migrate`
# --------------------------------------------------------------------------------------------


def format_2_ledger(tmp_path: Path, *, folder_witness: bool = False) -> Path:
    """A ledger as `ledger init` made them before the binding: LEDGER_INIT of format 2, its lineage
    key, its log folder and key beside it (and, then, maybe a list of witness folders)."""
    from fractions import Fraction

    from phsafe.config import PrivacyDefinition
    from phsafe.ledger.admin import new_ledger_id, policy_body
    from phsafe.ledger.keys import new_lineage_key, write_lineage_key
    from phsafe.publog.log import create_log_files, default_log_name
    from tests._ledgers import craft

    path = tmp_path / "old" / "ledger.jsonl"
    path.parent.mkdir(parents=True)
    key = new_lineage_key()
    body = policy_body(Fraction(10) * PLAN.total, "the old policy", PrivacyDefinition.ZCDP, False, key, "v-old",
                       ledger_id=new_ledger_id())
    body["format"] = 2
    path.write_bytes(b"")
    craft(path, "LEDGER_INIT", None, body)
    path.chmod(0o600)
    write_lineage_key(path, key)
    create_log_files(path, default_log_name(body["ledger_id"]))
    if folder_witness:
        witnesses_path(path).write_text(json.dumps({"format": "phsafe-witnesses/1", "quorum": 1,
                                                    "witnesses": [str(tmp_path / "a-witness-folder")]}))
    return path


def test_a_ledger_of_format_2_takes_nothing_until_its_log_is_bound(tmp_path: Path) -> None:
    from phsafe.publog import bind_public_log

    path = format_2_ledger(tmp_path)
    ledger = open_ledger(path)
    assert ledger.state.format == 2 and ledger.state.awaits_log_binding
    with pytest.raises(LedgerError, match="made before ledgers were bound to their public log: bind its log to it "
                                          "with `phsafe ledger migrate"):
        start_run(ledger, PLAN, "run-1")
    ws = Witnesses(2)
    before = path.read_bytes()
    with pytest.raises(LedgerError) as refused:  # 1 of 2: two quorums need not share a witness
        bind_public_log(path, reason="bound by the migration", witnesses=ws.listed(), witness_quorum=1,
                        transport=ws.transport)
    assert "a witness quorum of 1 of 2 is refused: any two quorums must share a witness" in str(refused.value)
    assert path.read_bytes() == before and not witnesses_path(path).exists()
    bound = bind_public_log(path, reason="bound by the migration", witnesses=ws.listed(), transport=ws.transport)
    ws.trust(bound.state.public_log["vkey"])
    state = read_ledger(path)
    assert state.format == 3 and state.public_log_seq == 1 and state.public_log["quorum"] == 2
    assert json.loads(log_entries(path)[-1])["type"] == "log-bound"
    rec = start_run(open_ledger(path, transport=ws.transport), PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    rec.fail("stopped", "interrupted")  # format 3 from the binding on: a code, a stage
    assert json.loads(log_entries(path)[-1])["code"] == "interrupted"
    in_step(path)
    with pytest.raises(LedgerError, match="bound to its public log already"):
        bind_public_log(path, reason="again")


def test_a_ledger_that_had_witnesses_is_never_bound_to_none(tmp_path: Path) -> None:
    from phsafe.publog import bind_public_log

    path = format_2_ledger(tmp_path, folder_witness=True)
    with pytest.raises(LedgerError, match="never downgraded to no witness"):
        bind_public_log(path, reason="no witness any more")
    assert read_ledger(path).format == 2
    with pytest.raises(LedgerError, match="lists witness folders, which the ledger no longer reads"):
        from phsafe.publog import read_witness_list

        read_witness_list(path)


def test_the_rules_of_format_3_failures_and_bindings(tmp_path: Path) -> None:
    from tests._ledgers import craft

    ledger = new_ledger(tmp_path)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    ledger.close()
    data = ledger.path.read_bytes()
    budget = json.loads(read_ledger(ledger.path).lines[-2])["budget"]
    for body, match in (
        ({"spent": budget, "reason": "x"}, r"wrong fields \(missing \['code', 'stage'\]"),
        ({"spent": budget, "reason": "x", "code": "it broke", "stage": "measure"}, "not one of the failure codes"),
        ({"spent": budget, "reason": "x", "code": "interrupted", "stage": "release"}, "is not where the attempt stands"),
    ):
        ledger.path.write_bytes(data)
        craft(ledger.path, "RUN_FAILED", "run-1", body)
        with pytest.raises(LedgerError, match=match):
            read_ledger(ledger.path)
    ledger.path.write_bytes(data)
    genesis = json.loads(read_ledger(ledger.path).lines[0])
    craft(ledger.path, "LOG_BOUND", None, {"public_log": genesis["public_log"], "reason": "again"})
    with pytest.raises(LedgerError, match="bound to its public log already"):
        read_ledger(ledger.path)


def test_damaged_hashes_are_refused_and_a_removed_hash_file_is_made_again(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    start_run(ledger, PLAN, "run-1")
    ledger.close()
    hashes = log_path(ledger.path) / "hashes"
    data = bytearray(hashes.read_bytes())
    data[0] ^= 1
    hashes.write_bytes(bytes(data))
    with pytest.raises(LedgerError, match="hashes .* are not those of its entries: remove the file"):
        open_ledger(ledger.path)
    hashes.unlink()
    open_ledger(ledger.path)
    in_step(ledger.path)
