"""The transparency log's files: hash file, checkpoint-state file, key files, the published log
folder (writing, reading, tampering) and its recovery from an append killed at any byte."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from phsafe.tlog.checkpoint import Checkpoint
from phsafe.tlog.client import SeenCheckpoints
from phsafe.errors import (
    ForkError, MalformedError, ProofError, RollbackError, SignatureError, StaleStateError, StoreError, WitnessRefusal,
)
from phsafe.tlog.files import (
    FileSeenLogs,
    FileCheckpointStore,
    FileHashStore,
    read_signer_key,
    read_verifier_key,
    write_signer_key,
    write_verifier_key,
)
from phsafe.tlog.keys import format_verifier_key, generate_keys
from phsafe.tlog.layout import ENTRIES_FILE, HASHES_FILE, VERIFIER_KEY_FILE, encode_entries, verify_published_log
from phsafe.tlog.log import MemoryHashStore, TransparencyLog
from phsafe.tlog.merkle import EMPTY_ROOT, stored_hash_count
from phsafe.tlog.note import ALG_COSIGNATURE_V1
from phsafe.tlog.proof import format_tlog_proof, verify_tlog_proof
from phsafe.tlog.publication import LogDirectory, read_published_log
from phsafe.tlog.witness import AddCheckpointRequest, Witness
from tests._tlog import ORIGIN, entries, log_signer, log_verifier, signed_checkpoint, witness_signer, witness_verifier


# ---- hash file ------------------------------------------------------------------------------

def test_file_hash_store_matches_memory_and_detects_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "hashes"
    with FileHashStore.create(path) as store:
        log = TransparencyLog(store)
        log.append(entries(20))
        log.append(entries(33)[20:])
        memory = TransparencyLog.of_entries(entries(33))
        assert store.read_hashes(range(stored_hash_count(33))) == memory.store.read_hashes(range(stored_hash_count(33)))
        assert log.root() == memory.root() and log.inclusion_proof(7) == memory.inclusion_proof(7)
    with pytest.raises(StoreError, match="exists"):
        FileHashStore.create(path)
    with FileHashStore.open(path) as store:
        assert TransparencyLog(store).size == 33
    with open(path, "ab") as fh:
        fh.write(b"\x00" * 5)
    with pytest.raises(StoreError, match="torn"):
        FileHashStore.open(path)
    with open(path, "ab") as fh:
        fh.write(b"\x00" * 27)  # a whole hash, but not a whole tree
    with pytest.raises(StoreError, match="torn"):
        FileHashStore.open(path)
    with FileHashStore.open(path, check=False) as store:
        store.truncate(stored_hash_count(33))
        assert TransparencyLog(store).root() == memory.root()


# ---- checkpoint-state file ------------------------------------------------------------------

def test_file_checkpoint_store_compare_and_swap(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path / "state" / "witness.json")
    assert store.load(ORIGIN) is None
    store.replace(ORIGIN, None, b"first\n")
    with pytest.raises(StaleStateError):
        store.replace(ORIGIN, None, b"second\n")
    with pytest.raises(StaleStateError):
        store.replace(ORIGIN, b"other\n", b"second\n")
    store.replace(ORIGIN, b"first\n", b"second \xe2\x80\x94\n")
    store.replace("other.example", None, b"x\n")
    again = FileCheckpointStore(tmp_path / "state" / "witness.json")
    assert again.load(ORIGIN) == "second \u2014\n".encode() and again.load("other.example") == b"x\n"
    assert [p.name for p in (tmp_path / "state").iterdir()] in (["witness.json", "witness.json.lock"],
                                                                 ["witness.json.lock", "witness.json"])
    (tmp_path / "state" / "witness.json").write_text('{"format": "something else", "checkpoints": {}}')
    with pytest.raises(StoreError, match="not a phsafe-tlog-checkpoints/1"):
        again.load(ORIGIN)


def test_file_checkpoint_store_is_atomic_across_writers(tmp_path: Path) -> None:
    path = tmp_path / "counter.json"
    FileCheckpointStore(path).replace("count", None, b"0")

    def bump() -> None:
        store = FileCheckpointStore(path)  # its own file descriptors, as another process would
        for _ in range(10):
            while True:
                current = store.load("count")
                try:
                    store.replace("count", current, str(int(current or b"0") + 1).encode())
                    break
                except StaleStateError:
                    continue

    threads = [threading.Thread(target=bump) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert FileCheckpointStore(path).load("count") == b"30"  # no increment lost


def test_a_witness_and_a_client_remember_across_restarts(tmp_path: Path) -> None:
    log = TransparencyLog.of_entries(entries(9))
    Witness(witness_signer(1), [log_verifier()], FileCheckpointStore(tmp_path / "w.json")).add_checkpoint(
        AddCheckpointRequest(0, (), signed_checkpoint(log, 6)))
    restarted = Witness(witness_signer(1), [log_verifier()], FileCheckpointStore(tmp_path / "w.json"))
    fork = TransparencyLog.of_entries(entries(9, "fork"))
    with pytest.raises(WitnessRefusal) as refusal:
        restarted.add_checkpoint(AddCheckpointRequest(6, tuple(fork.consistency_proof(6, 9)), signed_checkpoint(fork)))
    assert refusal.value.status == 422
    restarted.add_checkpoint(AddCheckpointRequest(6, tuple(log.consistency_proof(6, 9)), signed_checkpoint(log)))

    from phsafe.tlog.merkle import leaf_hash

    SeenCheckpoints(FileSeenLogs(tmp_path / "seen.json"), log_verifier()).observe(
        signed_checkpoint(log, 9), log.consistency_proof, b"".join(leaf_hash(e) for e in entries(9)))
    with pytest.raises(ForkError):
        SeenCheckpoints(FileSeenLogs(tmp_path / "seen.json"), log_verifier()).observe(
            signed_checkpoint(fork, 9), fork.consistency_proof)
    # Restarted, the client still tells an older view of the log (rollback) from a smaller fork.
    with pytest.raises(RollbackError, match="rollback: .* a prefix of the larger"):
        SeenCheckpoints(FileSeenLogs(tmp_path / "seen.json"), log_verifier()).observe(
            signed_checkpoint(log, 6), log.consistency_proof)
    with pytest.raises(ForkError, match="fork: .* not a prefix"):
        SeenCheckpoints(FileSeenLogs(tmp_path / "seen.json"), log_verifier()).observe(
            signed_checkpoint(fork, 6), fork.consistency_proof)


def test_a_client_state_of_the_earlier_format_is_read_and_rewritten(tmp_path: Path) -> None:
    log = TransparencyLog.of_entries(entries(5))
    old = FileCheckpointStore(tmp_path / "seen.json")  # what `audit public` wrote before leaf hashes were kept
    old.replace(ORIGIN, None, signed_checkpoint(log, 3))
    seen = SeenCheckpoints(FileSeenLogs(tmp_path / "seen.json"), log_verifier())
    assert seen.latest().checkpoint.size == 3  # type: ignore[union-attr]
    seen.observe(signed_checkpoint(log, 5), log.consistency_proof)
    assert '"format": "phsafe-seen-logs/1"' in (tmp_path / "seen.json").read_text()


# ---- key files --------------------------------------------------------------------------------

def test_key_files(tmp_path: Path) -> None:
    skey, vkey = generate_keys(ORIGIN)
    write_signer_key(tmp_path / "log.key", skey)
    assert stat.S_IMODE((tmp_path / "log.key").stat().st_mode) == 0o600
    signer = read_signer_key(tmp_path / "log.key")
    assert format_verifier_key(signer) == vkey
    with pytest.raises(StoreError, match="never overwritten"):
        write_signer_key(tmp_path / "log.key", skey)
    os.chmod(tmp_path / "log.key", 0o640)
    with pytest.raises(StoreError, match="chmod 600"):
        read_signer_key(tmp_path / "log.key")
    os.chmod(tmp_path / "log.key", 0o600)
    (tmp_path / "link.key").symlink_to(tmp_path / "log.key")
    with pytest.raises(StoreError):
        read_signer_key(tmp_path / "link.key")
    with pytest.raises(MalformedError):
        write_signer_key(tmp_path / "bad.key", "PRIVATE+KEY+not+a+key")
    assert not (tmp_path / "bad.key").exists()
    (tmp_path / "junk.key").write_text("not a key\n")
    os.chmod(tmp_path / "junk.key", 0o600)
    with pytest.raises(StoreError, match="not a signer key"):
        read_signer_key(tmp_path / "junk.key")
    write_verifier_key(tmp_path / "log.vkey", vkey)
    assert read_verifier_key(tmp_path / "log.vkey").key_id == signer.key_id
    wskey, _ = generate_keys("witness.example", ALG_COSIGNATURE_V1)
    write_signer_key(tmp_path / "witness.key", wskey)
    cosigner = read_signer_key(tmp_path / "witness.key", clock=lambda: 5)
    assert cosigner.sign(Checkpoint(ORIGIN, 0, EMPTY_ROOT).text().encode())[:8] == (5).to_bytes(8, "big")


# ---- the log folder -------------------------------------------------------------------------

def _published(tmp_path: Path, n: int = 12) -> LogDirectory:
    folder = LogDirectory.create(tmp_path / "log", format_verifier_key(log_verifier()))
    folder.append(entries(n)[:5])
    folder.publish_checkpoint(folder.sign_checkpoint(log_signer()))
    folder.append(entries(n)[5:])
    folder.publish_checkpoint(folder.sign_checkpoint(log_signer()))
    return folder


def test_log_folder_writes_what_readers_verify(tmp_path: Path) -> None:
    with _published(tmp_path) as folder:
        assert sorted(p.name for p in folder.path.iterdir()) == ["checkpoint", "entries", "hashes", "log.vkey"]
        assert (folder.path / ENTRIES_FILE).read_bytes() == encode_entries(entries(12))
        assert read_verifier_key(folder.path / VERIFIER_KEY_FILE).public_key == log_verifier().public_key
        published = read_published_log(folder.path, log_verifier())
        assert published.entries == tuple(entries(12)) and published.unsigned_tail == 0
        assert published.checkpoint.checkpoint.size == 12
        assert published.log.root() == TransparencyLog.of_entries(entries(12)).root()
        for index in (0, 5, 11):
            proof = format_tlog_proof(folder.proof(index))
            verify_tlog_proof(proof, entries(12)[index], log_verifier())
        folder.append([b"not yet signed"])
        assert read_published_log(folder.path, log_verifier()).unsigned_tail == 1
        with pytest.raises(MalformedError, match="newline"):
            folder.append([b"two\nlines"])
        assert folder.size == 13
    with LogDirectory.open(tmp_path / "log") as reopened:
        assert reopened.size == 13 and reopened.log.root(12) == published.log.root()
    with pytest.raises(StoreError, match="not empty"):
        LogDirectory.create(tmp_path / "log")


def test_log_folder_publishes_only_its_own_tree_heads(tmp_path: Path) -> None:
    with _published(tmp_path) as folder:
        other = TransparencyLog.of_entries(entries(12, "other"))
        with pytest.raises(StoreError, match="not a tree head"):
            folder.publish_checkpoint(signed_checkpoint(other))
        with pytest.raises(StoreError, match="not a tree head"):
            folder.publish_checkpoint(signed_checkpoint(TransparencyLog.of_entries(entries(13))))
        with pytest.raises(StoreError, match="larger"):
            folder.publish_checkpoint(signed_checkpoint(folder.log, 5))


def _tampered(tmp_path: Path, lines: list[bytes]) -> None:
    (tmp_path / "log" / ENTRIES_FILE).write_bytes(b"".join(line + b"\n" for line in lines))


@pytest.mark.parametrize("tamper", ["changed", "removed", "reordered", "inserted", "truncated"])
def test_a_tampered_published_log_is_refused(tmp_path: Path, tamper: str) -> None:
    _published(tmp_path).close()
    lines = entries(12)
    if tamper == "changed":
        lines[3] = lines[3].replace(b"3", b"4")
    elif tamper == "removed":
        del lines[3]
        lines.append(b'{"entry":99}')  # keep the count: only the hashes can tell
    elif tamper == "reordered":
        lines[3], lines[4] = lines[4], lines[3]
    elif tamper == "inserted":
        lines.insert(3, b'{"entry":"new"}')
    else:
        lines = lines[:11]
    _tampered(tmp_path, lines)
    with pytest.raises(ProofError):
        read_published_log(tmp_path / "log", log_verifier())


def test_a_published_checkpoint_by_another_key_or_without_witnesses_is_refused(tmp_path: Path) -> None:
    _published(tmp_path).close()
    folder = tmp_path / "log"
    with pytest.raises(SignatureError, match="1 of 1 witness"):
        read_published_log(folder, log_verifier(), witnesses=[witness_verifier(1)], quorum=1)
    (folder / "checkpoint").write_bytes(signed_checkpoint(TransparencyLog.of_entries(entries(12)),
                                                         signer=log_signer(label="rogue")))
    with pytest.raises(SignatureError):
        read_published_log(folder, log_verifier())
    with pytest.raises(StoreError):
        read_published_log(tmp_path / "nowhere", log_verifier())


# ---- recovery from an append killed at any byte -----------------------------------------------

def test_recovery_after_an_append_killed_at_any_point(tmp_path: Path) -> None:
    """Every state a kill can leave during one append (entries written up to any byte, then
    hashes up to any byte) recovers to a log of the old or the new entries, never another."""
    before, added = entries(5), entries(8)[5:]
    old_root = TransparencyLog.of_entries(before).root()
    new_root = TransparencyLog.of_entries(before + added).root()
    new_lines = encode_entries(added)
    new_hashes = TransparencyLog.of_entries(before).hashes_for(added)
    base = _published(tmp_path / "base", 5)
    base.close()
    states = [(new_lines[:cut], b"") for cut in range(len(new_lines) + 1)]
    states += [(new_lines, b"".join(new_hashes)[:cut]) for cut in range(0, 32 * len(new_hashes) + 1, 8)]
    for number, (lines, hashes) in enumerate(states):
        folder = tmp_path / f"state{number}"
        folder.mkdir()
        for name in ("entries", "hashes", "checkpoint", "log.vkey"):
            (folder / name).write_bytes((base.path / name).read_bytes())
        with open(folder / ENTRIES_FILE, "ab") as fh:
            fh.write(lines)
        with open(folder / HASHES_FILE, "ab") as fh:
            fh.write(hashes)
        whole_entries = lines.count(b"\n")
        untouched = lines == b""
        complete = lines == new_lines and hashes == b"".join(new_hashes)
        if not (untouched or complete):
            with pytest.raises(StoreError, match="recover"):
                LogDirectory.open(folder).close()
        LogDirectory.recover(folder)
        with LogDirectory.open(folder) as recovered:
            assert recovered.size == 5 + whole_entries
            assert recovered.log.root() == (new_root if whole_entries == 3 else
                                            TransparencyLog.of_entries(before + added[:whole_entries]).root())
            assert recovered.log.root(5) == old_root
        assert read_published_log(folder, log_verifier()).checkpoint.checkpoint.size == 5
    assert LogDirectory.recover(tmp_path / "state0") == []  # nothing left to do


def test_recovery_refuses_lost_entries(tmp_path: Path) -> None:
    _published(tmp_path).close()
    _tampered(tmp_path, entries(12)[:10])
    with pytest.raises(StoreError, match="not repairable"):
        LogDirectory.recover(tmp_path / "log")


def test_verify_published_log_on_bytes() -> None:
    log = TransparencyLog(MemoryHashStore())
    log.append(entries(4))
    data = encode_entries(entries(4)) + b'{"torn'
    published = verify_published_log(signed_checkpoint(log), data, log_verifier())
    assert published.unsigned_tail == 1 and len(published.entries) == 4
    assert published.consistency_proof(2, 4) == log.consistency_proof(2, 4)


def test_a_failed_append_stops_the_writer_until_recovered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _published(tmp_path, 5)

    def disk_full(self: FileHashStore, hashes: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(FileHashStore, "append_hashes", disk_full)
        with pytest.raises(OSError):
            folder.append(entries(7)[5:])
    with pytest.raises(StoreError, match="recover it first"):
        folder.append(entries(7)[5:])  # would write the two entries twice
    folder.close()
    assert LogDirectory.recover(tmp_path / "log") == ["hashed entries 5 to 6, written before their hashes"]
    with LogDirectory.open(tmp_path / "log") as recovered:
        assert recovered.size == 7 and recovered.log.root() == TransparencyLog.of_entries(entries(7)).root()


def test_a_log_folder_dropped_unclosed_closes_its_files_and_a_closed_one_never_again(tmp_path: Path) -> None:
    from tests._descriptors import assert_closes_its_files_once

    path = tmp_path / "log"
    LogDirectory.create(path).close()
    assert_closes_its_files_once(lambda: LogDirectory.open(path), {path / ENTRIES_FILE, path / HASHES_FILE})
