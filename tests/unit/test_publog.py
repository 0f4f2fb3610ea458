"""The public privacy-loss log beside a ledger (issue 21), through the ledger's API.

* the log is exactly the projection of the ledger's public facts, and holds nothing
  confidential (no input or config digest, fingerprint, truncation key, lineage key id, chain
  hash);
* it stays in step with the ledger when a process stops between the ledger's append and the
  log's (before it, in the middle of its line, between its line and its hashes), and through
  ``ledger repair``; a log that is not the projection stops the ledger;
* with a witness, a copy of the ledger made before a release, or in the middle of a run and
  resumed on both copies, cannot spend from the copy: no INTENT is added there, one refusal;
* the public statement recomputed from the log matches the ledger's odometer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from phsafe.errors import ForkRefused, LedgerError, VerificationFailure
from phsafe.ledger import Ledger, key_id, read_ledger, read_lineage_key, repair_ledger
from phsafe.noise import measure
from phsafe.publog import PublicLog, init_witness, log_key_path, log_path, project
from phsafe.publog.audit import statement
from phsafe.publog.confidential import check_public_log
from phsafe.tlog import LogDirectory
from tests._ledgers import DIGESTS_A, FP_A, KEY_HEX, new_ledger, rewind_public_log
from tests._ledgers import start as start_run
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
    rec.fail("worker lost")
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
    (s,) = statement(log_entries(ledger.path)).values()
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
    Ledger.open(ledger.path)
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
        Ledger.open(ledger.path)
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
    if tamper != "appended":  # (appended lines past the checkpoint are not the log's yet)
        with pytest.raises(LedgerError, match="not the projection of the ledger"):
            spend(rec, PLAN.measurements[1])
        assert sum(1 for line in read_ledger(ledger.path).lines if b'"INTENT"' in line) == 1


# --------------------------------------------------------------------------------------------
# Forks, with a witness: a copy cannot spend
# --------------------------------------------------------------------------------------------


def witnessed_ledger(tmp_path: Path) -> Ledger:
    init_witness(tmp_path / "witness", "witness.test")
    from phsafe.ledger import init_ledger

    return init_ledger(tmp_path / "enclave" / "ledger.jsonl", lifetime_cap=10 * PLAN.total, reason="test policy",
                       code_version="test", witnesses=[tmp_path / "witness"])


def copy_ledger(ledger: Ledger, to: Path) -> Ledger:
    """An insider's copy of the ledger's whole folder (ledger, keys, log, witness list)."""
    shutil.copytree(ledger.path.parent, to)
    return Ledger.open(to / ledger.path.name)


def intents(ledger: Ledger) -> int:
    return sum(1 for line in read_ledger(ledger.path).lines if b'"kind":"INTENT"' in line)


def test_a_ledger_copied_before_a_release_cannot_spend(tmp_path: Path) -> None:
    ledger = witnessed_ledger(tmp_path)
    copy = copy_ledger(ledger, tmp_path / "copy")
    rec = start_run(ledger, PLAN, "run-1")
    for m in PLAN.measurements:
        spend(rec, m)
    rec.record_published(OUTPUTS, tmp_path / "out")
    with pytest.raises(ForkRefused, match="an older copy or was rolled back.*nothing was spent") as refused:
        start_run(copy, PLAN, "run-2", re_release="the copy tries again")
    assert "\n" not in str(refused.value)
    assert intents(copy) == 0 and intents(ledger) == len(PLAN.measurements)


def test_a_ledger_copied_in_the_middle_of_a_run_and_resumed_on_both_cannot_spend_twice(tmp_path: Path) -> None:
    ledger = witnessed_ledger(tmp_path)
    rec = start_run(ledger, PLAN, "run-1")
    spend(rec, PLAN.measurements[0])
    copy = copy_ledger(ledger, tmp_path / "copy")
    # The original's worker dies; the run is resumed on the copy first, which finishes it.
    on_copy = resume(copy, "run-1")
    for m in PLAN.measurements[1:]:
        spend(on_copy, m)
    before = intents(ledger)
    # The original's worker was only slow, not dead: its next spend is refused ...
    with pytest.raises(ForkRefused, match="copied or rolled-back ledger cannot spend -- nothing was spent"):
        spend(rec, PLAN.measurements[1])
    # ... and so is resuming the run on the original: no INTENT is added there.
    with pytest.raises(ForkRefused, match="copied or rolled-back ledger cannot spend -- nothing was spent"):
        resume(ledger, "run-1")
    assert intents(ledger) == before == 1
    assert intents(copy) == len(PLAN.measurements)


def test_without_a_witness_a_copy_spends_and_only_the_logs_show_the_fork(tmp_path: Path) -> None:
    """What the README says a ledger without a witness is missing: the copy spends again; the
    fork shows only when someone compares the two logs (audit public with a kept checkpoint)."""
    from phsafe.tlog import MemoryCheckpointStore, SeenCheckpoints, read_published_log, read_verifier_key
    from phsafe.errors import ForkError

    ledger = new_ledger(tmp_path / "a", cap=10 * PLAN.total)
    copy = copy_ledger(ledger, tmp_path / "b")
    for led, run_id in ((ledger, "run-1"), (copy, "run-2")):
        rec = start_run(led, PLAN, run_id)
        spend(rec, PLAN.measurements[0])
    key = read_verifier_key(log_path(ledger.path) / "log.vkey")
    seen = SeenCheckpoints(MemoryCheckpointStore(), key)
    first = read_published_log(log_path(ledger.path), key)
    seen.observe(first.checkpoint.message, first.consistency_proof)
    second = read_published_log(log_path(copy.path), key)
    with pytest.raises(ForkError, match="forked or rewrote its history"):
        seen.observe(second.checkpoint.message, second.consistency_proof)


def test_preflight_style_check_refuses_a_missing_or_loose_log_key(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path)
    log_key_path(ledger.path).chmod(0o644)
    fresh = Ledger.open(ledger.path)
    with pytest.raises(LedgerError, match="may be read by others"):
        fresh.public_log.check()
    log_key_path(ledger.path).unlink()
    with pytest.raises(LedgerError, match="signer key .* is missing"):
        Ledger.open(ledger.path)
    assert PublicLog.for_ledger(tmp_path / "none.jsonl") is None


def test_ledger_repair_cuts_a_torn_log_line_and_checks_the_whole_log(tmp_path: Path) -> None:
    from phsafe.publog.log import repair_public_log

    ledger = new_ledger(tmp_path)
    start_run(ledger, PLAN, "run-1")
    with open(log_path(ledger.path) / "entries", "ab") as f:
        f.write(b'{"type":"spe')  # what a killed log append left
    assert any("torn last line" in n for n in check_public_log(ledger.path, read_ledger(ledger.path)))
    assert repair_public_log(Ledger.open(ledger.path)) == len(project(read_ledger(ledger.path).lines))
    in_step(ledger.path)
    # A changed entry is not "repaired": it is refused, and stays for someone to look at.
    entries_file = log_path(ledger.path) / "entries"
    entries_file.write_bytes(entries_file.read_bytes().replace(b'"reason":"first version"', b'"reason":"other"'))
    with pytest.raises(LedgerError, match="not the projection of the ledger"):
        repair_public_log(Ledger.open(ledger.path))


def test_init_refuses_a_witness_folder_that_is_not_one_and_writes_nothing(tmp_path: Path) -> None:
    from phsafe.ledger import init_ledger

    (tmp_path / "not-a-witness").mkdir()
    with pytest.raises(LedgerError, match="is not a usable witness folder"):
        init_ledger(tmp_path / "enclave" / "ledger.jsonl", lifetime_cap=PLAN.total, reason="r",
                    witnesses=[tmp_path / "not-a-witness"])
    assert not (tmp_path / "enclave").exists()
