"""``phsafe witness serve``: a witness as a service of its own, speaking C2SP tlog-witness over HTTP.

Real servers on loopback (ports the system picks), in processes of their own:

* the protocol's shapes: ``POST /add-checkpoint`` with the old size, the proof and the checkpoint;
  200 and a cosignature line (cosignature/v1, by the witness's key, timestamped); 409 with the
  size it knows (``text/x.tlog.size``) on a stale old size and on another tree of a size it
  cosigned; 422 on a proof that does not verify; 404 for a log it does not witness; 400 on junk;
  405 for another method; one service per state folder;
* the refused requests that prove two histories are kept as evidence and served (``GET
  /evidence``, ``GET /evidence/<name>``), each verifying with the log's key alone;
* a log added to its logs folder is witnessed without a restart; its key rewritten in place under
  the same file name is read by content and refused (a new key is a new log);
* its state survives SIGKILL at every step of every durable write: restarted, it knows the
  checkpoint before the request or the one after it -- and from there never cosigns a second
  tree of a size it cosigned, nor a checkpoint that does not extend its last.

The ledger's side against two and three such witnesses (quorum 2 of 2, 2 of 3) is
``tests/system/test_public_log.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from phsafe.tlog import (
    AddCheckpointRequest,
    TransparencyLog,
    format_add_checkpoint_request,
    format_signer_key,
    format_verifier_key,
    generate_keys,
    parse_note,
    verify_checkpoint,
    verifier_from_key,
    with_cosignatures,
)
from phsafe.tlog.evidence import parse_evidence, verify_evidence
from phsafe.tlog.note import ALG_COSIGNATURE_V1
from phsafe.tlog.registration import format_registration, make_registration
from tests._tlog import ORIGIN, log_signer, log_verifier, private_key, signed_checkpoint
from tests._tlog import entries as plain_entries

POLICY = b'{"datasets":["test-data"],"type":"policy"}'


def entries(n: int, tag: str = "") -> list[bytes]:
    """A log's entries: its policy (naming the dataset it accounts) first, as every log's."""
    return [POLICY, *plain_entries(n, tag)[1:]][:n]


def registration() -> bytes:
    """The log's registration: its policy, proven as entry 0 of its first checkpoint (size 1)."""
    first = TransparencyLog.of_entries(entries(1))
    return format_registration(make_registration(signed_checkpoint(first), entries(1)))


PHSAFE = Path(sys.executable).parent / "phsafe"
REPO = Path(__file__).resolve().parents[2]


class Service:
    """``phsafe witness serve`` in a process of its own; ``url`` once it listens."""

    def __init__(self, key: Path, state: Path, *logs: str, folder: Path | None = None, kill_at: int | None = None,
                 registrations: tuple[Path, ...] = ()):
        args = ["witness", "serve", "--key", str(key), "--state", str(state), "--bind", "127.0.0.1:0"]
        for log in logs:
            args += ["--log", log]
        for path in registrations:
            args += ["--registration", str(path)]
        if folder is not None:
            args += ["--logs", str(folder)]
        if kill_at is None:
            command = [str(PHSAFE), *args]
        else:
            command = [sys.executable, "-m", "tests.system._witness_driver", str(kill_at), "--", *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert " at http://127.0.0.1:" in line, (line, self.process.stderr.read() if self.process.stderr else "")
        self.url = line.split(" at ", 1)[1].split()[0]
        self.client = httpx.Client(timeout=60)

    def post(self, body: bytes) -> httpx.Response:
        return self.client.post(f"{self.url}/add-checkpoint", content=body)

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("witness-keys")
    made = subprocess.run([str(PHSAFE), "witness", "init", str(root / "w"), "--name", "witness.test"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    (root / "log.vkey").write_text(format_verifier_key(log_verifier()) + "\n")
    (root / "log.registration").write_bytes(registration())
    return {"key": root / "w" / "witness.key", "vkey": root / "w" / "witness.vkey", "log": root / "log.vkey",
            "registration": root / "log.registration"}


def request(log: TransparencyLog, old: int, new: int | None = None, *, signer=None,  # noqa: ANN001
            origin: str = ORIGIN) -> bytes:
    new = log.size if new is None else new
    return format_add_checkpoint_request(AddCheckpointRequest(
        old, tuple(log.consistency_proof(old, new)), signed_checkpoint(log, new, signer=signer, origin=origin)))


def test_the_protocol_over_http(keys: dict[str, Path], tmp_path: Path) -> None:
    service = Service(keys["key"], tmp_path / "state", str(keys["log"]), registrations=(keys["registration"],))
    try:
        log = TransparencyLog.of_entries(entries(9))
        # its registration's checkpoint (entry 0, the policy) is the first it cosigned of the log
        known = service.post(request(log, 0, 5))
        assert (known.status_code, known.text) == (409, "1\n")
        ok = service.post(request(log, 1, 5))
        assert ok.status_code == 200 and ok.text.startswith("— witness.test ") and ok.text.endswith("\n")
        witness_key = verifier_from_key(keys["vkey"].read_text())
        cosigned = with_cosignatures(signed_checkpoint(log, 5), ok.content)
        verified = verify_checkpoint(cosigned, log_verifier(), witnesses=[witness_key], quorum=1)
        assert verified.cosigners == ("witness.test",)
        stale = service.post(request(log, 0, 9))
        assert (stale.status_code, stale.headers["content-type"], stale.text) == (409, "text/x.tlog.size", "5\n")
        fork = TransparencyLog.of_entries(entries(3) + entries(9, "fork")[3:])
        same_size = service.post(format_add_checkpoint_request(AddCheckpointRequest(5, (), signed_checkpoint(fork, 5))))
        assert (same_size.status_code, same_size.text) == (409, "5\n")
        assert service.post(request(fork, 5, 9)).status_code == 422  # does not extend what it cosigned
        good = AddCheckpointRequest(5, tuple(log.consistency_proof(5, 9)), signed_checkpoint(log, 9))
        bad = AddCheckpointRequest(5, (good.consistency_proof[0][::-1],) + good.consistency_proof[1:], good.checkpoint)
        assert service.post(format_add_checkpoint_request(bad)).status_code == 422
        other = log_signer("other.example/log", "other")
        assert service.post(request(log, 0, signer=other, origin=other.name)).status_code == 404
        assert service.post(request(log, 5, 9, signer=log_signer(label="rogue"))).status_code == 403
        assert service.post(b"old five\n\n").status_code == 400
        assert service.client.get(f"{service.url}/add-checkpoint").status_code == 405
        assert service.client.post(f"{service.url}/other", content=b"").status_code == 404
        assert service.post(format_add_checkpoint_request(good)).status_code == 200
        # the refused requests signed by the log are kept; those that prove two histories (another
        # tree of the size cosigned; a tree its own proof ties to another prefix) as evidence,
        # served over HTTP; the one with a broken proof proves nothing
        assert len(list((tmp_path / "state" / "refused").iterdir())) == 3
        listing = service.client.get(f"{service.url}/evidence")
        names = listing.text.split()
        assert listing.status_code == 200 and len(names) == 2
        for name in names:
            served = service.client.get(f"{service.url}/evidence/{name}")
            assert served.status_code == 200 and served.headers["content-type"] == "application/json"
            proved = verify_evidence(parse_evidence(served.content), log_verifier())
            assert "signed two histories" in proved.statement()
            assert served.content == (tmp_path / "state" / "evidence" / name).read_bytes()
        assert service.client.get(f"{service.url}/evidence/..%2Fcheckpoints.json").status_code == 404
        assert service.client.get(f"{service.url}/evidence/nothing.equivocation.json").status_code == 404
        # one service per state folder
        second = subprocess.run([str(PHSAFE), "witness", "serve", "--key", str(keys["key"]), "--state",
                                 str(tmp_path / "state"), "--log", str(keys["log"]), "--bind", "127.0.0.1:0"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1 and "another witness process serves the state" in second.stderr
    finally:
        service.stop()


def test_a_log_put_in_the_logs_folder_is_witnessed_without_a_restart(keys: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    service = Service(keys["key"], tmp_path / "state", folder=folder)
    try:
        log = TransparencyLog.of_entries(entries(4))
        assert service.post(request(log, 0)).status_code == 404
        (folder / "census.vkey").write_text(format_verifier_key(log_verifier()) + "\n")
        unregistered = service.post(request(log, 0))
        assert unregistered.status_code == 403 and "no registration of the log" in unregistered.text
        (folder / "census.registration").write_bytes(registration())
        assert service.post(request(log, 1)).status_code == 200
        (folder / "junk.vkey").write_text("not a key\n")  # a bad file is skipped, not fatal
        assert service.post(request(log, 4)).status_code == 200
        # The log's key rewritten in place under the same file name (the folder's entries do not
        # change): read by content, it is another key of that log's name -- refused, since the
        # witness cosigned the log under the first key.
        rogue = log_signer(label="rewritten")
        (folder / "census.vkey").write_text(format_verifier_key(log_verifier(label="rewritten")) + "\n")
        larger = TransparencyLog.of_entries(entries(6))
        refused = service.post(request(larger, 4, signer=rogue))
        print(f"a log key rewritten in place: {refused.status_code} {refused.text.strip()}")
        assert refused.status_code == 403 and "under another key" in refused.text
        # Both keys in the folder under two file names: the one it cosigned under is used.
        (folder / "census-old.vkey").write_text(format_verifier_key(log_verifier()) + "\n")
        assert service.post(request(larger, 4)).status_code == 200
        assert service.post(request(larger, 6, signer=rogue)).status_code == 403
    finally:
        service.stop()


def known_size(service: Service) -> int:
    """The size the witness last cosigned (its 409 to a request from size 0 says it)."""
    log = TransparencyLog.of_entries(entries(1))
    answer = service.post(request(log, 0))
    if answer.status_code == 200:
        raise AssertionError("the witness had cosigned nothing")
    assert answer.status_code == 409, answer.text
    return int(answer.text)


def test_the_state_survives_sigkill_at_every_write_step(keys: dict[str, Path], tmp_path: Path) -> None:
    """An update of the state is four steps (write, fsync, rename, fsync the folder): killed right
    after each, the restarted witness knows the state before or after the request -- and never
    cosigns a fork of a size it cosigned nor a tree that does not extend its last."""
    log = TransparencyLog.of_entries(entries(12))
    fork = TransparencyLog.of_entries(entries(6) + entries(12, "fork")[6:])
    before = tmp_path / "state-before"
    first = Service(keys["key"], before, str(keys["log"]), registrations=(keys["registration"],))
    try:
        assert first.post(request(log, 1, 8)).status_code == 200  # the state before: size 8
    finally:
        first.stop()
    outcomes = []
    for kill_at in (1, 2, 3, 4):
        state = tmp_path / f"state-{kill_at}"
        state.mkdir(mode=0o700)
        for name in ("checkpoints.json", "claims.json"):  # each kill from the same state
            shutil.copyfile(before / name, state / name)
        killed = Service(keys["key"], state, str(keys["log"]), kill_at=kill_at, registrations=(keys["registration"],))
        try:
            with pytest.raises(httpx.TransportError):  # killed before it answered
                killed.post(request(log, 8, 12))
        finally:
            killed.stop()
            assert killed.process.returncode == -signal.SIGKILL
        restarted = Service(keys["key"], state, str(keys["log"]), registrations=(keys["registration"],))
        try:
            size = known_size(restarted)
            assert size in (8, 12), size
            outcomes.append(size)
            document = json.loads((state / "checkpoints.json").read_text())  # whole, never half-written
            stored = document["checkpoints"][ORIGIN].encode()
            assert parse_note(stored)[0].split("\n")[1] == str(size)
            # never a second tree of the size it knows, never one that does not extend it
            same = service_answer(restarted, AddCheckpointRequest(size, (), signed_checkpoint(fork, size)))
            assert same.status_code == 409
            larger = AddCheckpointRequest(size, tuple(fork.consistency_proof(size, 12)) if size < 12 else (),
                                          signed_checkpoint(fork, 12))
            assert service_answer(restarted, larger).status_code in (409, 422)
            # and it goes on with the genuine log from where it is
            assert restarted.post(request(log, size, 12)).status_code == 200
        finally:
            restarted.stop()
    print(f"state after SIGKILL at write steps 1-4: sizes {outcomes}")
    assert outcomes[-1] == 12  # killed after the folder's fsync: the new state is durable


def service_answer(service: Service, req: AddCheckpointRequest) -> httpx.Response:
    return service.post(format_add_checkpoint_request(req))


def test_witness_keys_are_refused_where_a_log_key_belongs_and_back(keys: dict[str, Path], tmp_path: Path) -> None:
    logkey = tmp_path / "log.key"
    logkey.write_text(format_signer_key("a.log", private_key("a log")) + "\n")
    os.chmod(logkey, 0o600)
    wrong_key = subprocess.run([str(PHSAFE), "witness", "serve", "--key", str(logkey), "--state", str(tmp_path / "s"),
                                "--log", str(keys["log"])], capture_output=True, text=True, timeout=120)
    assert wrong_key.returncode == 1 and "a log's signing key, not a witness's" in wrong_key.stderr
    _, vkey = generate_keys("another.witness", ALG_COSIGNATURE_V1)
    wrong_log = subprocess.run([str(PHSAFE), "witness", "serve", "--key", str(keys["key"]), "--state",
                                str(tmp_path / "s"), "--log", vkey], capture_output=True, text=True, timeout=120)
    assert wrong_log.returncode == 1 and "a witness's key, not a log's" in wrong_log.stderr
