"""``phsafe audit public`` as an outsider runs it, on real releases witnessed by real services.

Two witness services (``phsafe witness serve``, each in a process of its own on a loopback port
the system picks) witness a ledger's public log, quorum 2 of 2; the ledger holds their URLs and
public keys only. One release (``phsafe private``); its public log folder is copied out as a web
server would serve it. Then:

* the outsider's check passes on the release and the log against the two witnesses' keys, shows
  each cosignature's time, and prints the statement; the confidential audit agrees;
* every attack of issue 29 is refused with one line naming the run and the difference: a second
  release of one run appended with the log key and cosigned by the real witnesses (plain, and
  with a changed plan); a run whose release states another total than its plan; a cosignature
  made without the witness service; the log folder, the log key or the witness list removed
  (``private``, ``raise-cap``, ``repair`` refused, nothing recorded); a rollback to an older
  genuine checkpoint and a smaller fork seen after a larger one; no ``--witness-key``; a stale
  cosignature; a ``run-failed`` carrying operator text (a path);
* the tampering cases of issue 21 are still refused (an entry changed, removed or reordered; a
  fork; a release missing from the log; a table, the manifest or the entry changed; a proof by
  another key; too few cosignatures; VARIANCE not the logged spends');
* forks: a ledger copied before a release cannot spend with the witnesses (one refusal, no
  INTENT); without witnesses the copy can spend, and ``audit public`` over the two logs reports
  the fork; quorum 2 of 3 releases with one of the three witnesses down.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from phsafe import synthetic
from phsafe.ledger import canonical_json
from phsafe.publog import log_key_path, log_path, witnesses_path
from phsafe.tlog import (
    Checkpoint,
    TransparencyLog,
    make_tlog_proof,
    read_signer_key,
    read_verifier_key,
    request_cosignature,
    sign_checkpoint,
)
from phsafe.tlog.note import NoteSignature, format_note, parse_note
from phsafe.tlog.proof import format_tlog_proof, parse_tlog_proof
from tests._cli import phsafe
from tests.conftest import US_CONFIG
from tests.system._witness_services import Service


PHSAFE = Path(sys.executable).parent / "phsafe"


def cli(*args: object) -> subprocess.CompletedProcess:
    return phsafe(*args)  # in this process, as a subprocess would see it (tests/_cli.py)


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a command that also shows its progress on stderr."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("phsafe: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def release(world: dict, ledger: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("private", world["config"], world["data"], out, "--ledger", ledger, "--no-validate", *extra)


def intents(ledger: Path) -> int:
    return sum(1 for line in ledger.read_text().splitlines() if '"kind":"INTENT"' in line)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("public-log")
    synthetic.write(synthetic.generate(1200, ["01", "02"], seed=7), root / "data")
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"], raw["dataset"] = ["01", "02"], "publog-test"
    (root / "config.json").write_text(json.dumps(raw))
    world: dict = {"root": root, "data": root / "data", "config": root / "config.json"}
    services = [Service(root, "witness1").start(), Service(root, "witness2").start()]
    world["services"] = services
    try:
        ledger = root / "enclave" / "ledger.jsonl"
        made = cli("ledger", "init", ledger, "--lifetime-cap", "3", "--reason", "test policy", "--dataset", "publog-test",
                   "--witness", services[0].url, services[0].vkey, "--witness", services[1].url, services[1].vkey)
        assert made.returncode == 0 and "2 of the 2 witnesses" in made.stdout, made.stderr
        for service in services:
            service.witness(log_path(ledger))
        shutil.copytree(ledger.parent, root / "copy-before-release")  # an insider's copy
        ran = release(world, ledger, root / "out", "--new-version", "synthetic records")
        assert ran.returncode == 0, ran.stderr[-2000:]
        shutil.copytree(log_path(ledger), root / "published-log")  # as a web server serves it
        # Later, the cap is raised (witnessed): the log grows; an outsider who saw that checkpoint
        # is later shown the earlier one above -- an older, genuine view.
        raised = cli("ledger", "raise-cap", ledger, "--dataset", "publog-test", "--to", "4", "--reason", "more room")
        assert raised.returncode == 0, raised.stderr
        shutil.copytree(log_path(ledger), root / "published-log-later")
        world.update(ledger=ledger, out=root / "out", log=root / "published-log", later=root / "published-log-later",
                     vkey=root / "published-log" / "log.vkey", wkeys=[s.vkey for s in services])
        yield world
    finally:
        for service in services:
            service.stop()


def outsider(world: dict, out: Path | None, log: Path | None, state: Path, *extra: object,
             witnesses: bool = True) -> subprocess.CompletedProcess:
    args = ["audit", "public", *([out] if out is not None else []), "--key", world["vkey"], "--state", state]
    if witnesses:
        for key in world["wkeys"]:
            args += ["--witness-key", key]
    if log is not None:
        args += ["--log", log]
    return cli(*args, *extra)


def test_an_outsider_checks_the_release_against_two_witness_services(world: dict, tmp_path: Path) -> None:
    checked = outsider(world, world["out"], world["log"], tmp_path / "seen.json")
    assert checked.returncode == 0, checked.stderr
    out = checked.stdout
    print(f"$ phsafe audit public OUT --key log.vkey --witness-key witness1.vkey --witness-key witness2.vkey "
          f"--log LOG\n{out}")
    assert "proof: privacy-loss.entry is entry" in out and "cosigned by witness1.test at " in out
    assert "witness2.test at " in out and " ago)" in out
    assert "manifest.json has the SHA-256 the log records" in out
    assert "match the VARIANCE the logged spends imply" in out
    assert "first seen" in out and out.rstrip().endswith("OK")
    assert "its policy binds 2 witness(es), quorum 2: witness1.test, witness2.test" in out
    assert "dataset publog-test: 1 release(s)" in out and "nothing spent without a release" in out
    assert "of cap 3 (rho), left" in out
    again = outsider(world, world["out"], world["later"], tmp_path / "seen.json")
    assert again.returncode == 0 and "consistent with the checkpoint of" in again.stdout
    assert "of cap 4 (rho)" in again.stdout  # the raise, witnessed
    # The release alone, offline: nothing but itself, the log's key and the witnesses' keys.
    alone = outsider(world, world["out"], None, tmp_path / "seen.json")
    assert alone.returncode == 0 and "log: not checked" in alone.stdout
    # The same check from Python (phsafe.audit_public).
    import phsafe

    lines = phsafe.audit_public(world["out"], key=world["vkey"], log=world["later"], witness_keys=tuple(world["wkeys"]),
                                state_file=tmp_path / "seen.json")
    assert any(line.startswith("dataset publog-test: 1 release(s)") for line in lines)
    # The confidential audit agrees, and the release folder holds exactly the two log files more.
    verified = cli("audit", "verify", world["ledger"], "--outputs", world["out"])
    assert verified.returncode == 0 and "exactly the projection" in verified.stdout, verified.stderr
    assert "cosigned by witness1.test, witness2.test (2 of the 2 bound witnesses, quorum 2)" in verified.stdout


# --------------------------------------------------------------------------------------------
# The insider's tools: the log key (held by the enclave) and the real witnesses, asked to cosign
# --------------------------------------------------------------------------------------------


def signer(world: dict):  # noqa: ANN201
    """The log key, as an insider holding it would use it."""
    return read_signer_key(log_key_path(world["ledger"]))


def entries_of(log: Path) -> list[bytes]:
    return (log / "entries").read_bytes().split(b"\n")[:-1]


def write_log(world: dict, log: Path, entries: list[bytes], *, cosign: bool = False,
              fake_cosigners: str | None = None) -> bytes:
    """``log`` rewritten to hold ``entries``, with a checkpoint signed by the log key -- and, with
    ``cosign``, cosigned as the real witnesses cosign any append that extends what they cosigned
    (their own answer, computed here from a copy of each one's state and key, so that the
    services' state stays the genuine log's for the other tests); with ``fake_cosigners``, with
    cosignatures made without them: by keys of the witnesses' names (``"own keys"``), or forged
    under the witnesses' key IDs (``"forged"``)."""
    tree = TransparencyLog.of_entries(entries)
    key = signer(world)
    note = sign_checkpoint(Checkpoint(key.name, len(entries), tree.root()), [key])
    if cosign:
        from phsafe.tlog import FileCheckpointStore, Witness

        lines = []
        for service in world["services"]:
            state = log.parent / f"{service.folder.name}-state.json"
            shutil.copyfile(service.folder / "state" / "checkpoints.json", state)
            witness = Witness(read_signer_key(service.folder / "key" / "witness.key"),
                              [read_verifier_key(world["vkey"])], FileCheckpointStore(state))
            cosigned = request_cosignature(witness, tree, note)
            lines += [s for s in parse_note(cosigned)[1] if s.name == service.name]
        text, signatures = parse_note(note)
        note = format_note(text, [*signatures, *lines])
    if fake_cosigners:
        from phsafe.tlog.cosignature import CosignatureSigner
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        text, signatures = parse_note(note)
        fakes = []
        for service in world["services"]:
            fake = CosignatureSigner(service.name, Ed25519PrivateKey.generate())
            key_id = read_verifier_key(service.vkey).key_id if fake_cosigners == "forged" else fake.key_id
            fakes.append(NoteSignature(fake.name, key_id, fake.sign(text.encode())))
        note = format_note(text, [*signatures, *fakes])
    (log / "entries").write_bytes(b"".join(e + b"\n" for e in entries))
    (log / "checkpoint").write_bytes(note)
    return note


def copies(world: dict, tmp_path: Path) -> tuple[Path, Path]:
    out, log = tmp_path / "out", tmp_path / "log"
    shutil.copytree(world["out"], out)
    shutil.copytree(world["later"], log)
    return out, log


def release_index(out: Path) -> int:
    return parse_tlog_proof((out / "privacy-loss.tlog-proof").read_bytes()).index


def refused_line(world: dict, out: Path, log: Path, seen: Path, *extra: object) -> str:
    refused = outsider(world, out, log, seen, *extra)
    line = one_line(refused)
    assert refused.returncode == 1 and line.startswith("FAILED: "), line
    return line


# --------------------------------------------------------------------------------------------
# The attacks of issue 29
# --------------------------------------------------------------------------------------------


def test_a_second_release_of_one_run_is_refused_even_cosigned(world: dict, tmp_path: Path) -> None:
    out, log = copies(world, tmp_path)
    lines = entries_of(log)
    first = json.loads(lines[release_index(out)])
    write_log(world, log, lines + [canonical_json({**first, "time": json.loads(lines[-1])["time"]})], cosign=True)
    line = refused_line(world, out, log, tmp_path / "seen.json")
    print(f"a second release of one run: {line}")
    assert f"run {first['run_id']} is released a second time" in line


def test_a_second_release_with_a_changed_plan_is_refused(world: dict, tmp_path: Path) -> None:
    """The issue's variant: the second release claims 4x the PH2 budget, its spent disagreeing."""
    out, log = copies(world, tmp_path)
    lines = entries_of(log)
    second = json.loads(lines[release_index(out)])
    for item in second["planned"]:
        if item["table"] == "PH2":
            item["budget"] = str(float(item["budget"]) * 4).rstrip("0")
            item["variance"] = repr(float(item["variance"]) / 4)
    write_log(world, log, lines + [canonical_json(second)], cosign=True)
    line = refused_line(world, out, log, tmp_path / "seen.json")
    print(f"a second release with a changed plan: {line}")
    assert f"run {second['run_id']}" in line and "released a second time" in line


def test_a_run_whose_release_states_another_total_than_its_plan_is_refused(world: dict, tmp_path: Path) -> None:
    """A whole run made up with the log key (start, spends, release) and cosigned: its release
    states a total its own plan does not give."""
    out, log = copies(world, tmp_path)
    lines = entries_of(log)
    started = next(json.loads(e) for e in lines if b'"run-started"' in e)
    real = json.loads(lines[release_index(out)])
    made_up = []
    spent_before = real["spent"]
    made_up.append({**started, "run_id": "made-up-run", "spent_before": spent_before, "lifetime_cap": "4",
                    "re_release": "made up"})
    for item in started["planned"]:
        made_up.append({"type": "spend", "run_id": "made-up-run", "key": item["key"], "budget": item["budget"],
                        "sensitivity": item["sensitivity"], "n_cells": item["n_cells"], "time": started["time"]})
    made_up.append({**real, "run_id": "made-up-run", "spent": "0.5"})
    write_log(world, log, lines + [canonical_json(e) for e in made_up], cosign=True)
    line = refused_line(world, out, log, tmp_path / "seen.json")
    print(f"a release whose total disagrees with its plan: {line}")
    assert "run made-up-run" in line and "states it spent 0.5" in line and "give 1.257281" in line


@pytest.mark.parametrize("how", ["own keys", "forged"])
def test_a_cosignature_made_without_the_witness_service_is_refused(world: dict, tmp_path: Path, how: str) -> None:
    out, log = copies(world, tmp_path)
    lines = entries_of(log)
    write_log(world, log, lines + [lines[-1]], fake_cosigners=how)  # any append, "cosigned" by the enclave
    line = refused_line(world, out, log, tmp_path / "seen.json")
    print(f"a cosignature made without the witness ({how}): {line}")
    if how == "own keys":  # lines under the witnesses' names by other keys: not theirs, not counted
        assert "2 of 2 witness cosignatures are required and 0 verified" in line
    else:  # under the witnesses' key IDs: a forgery of a trusted key, refused as such
        assert "the signature by witness1.test" in line and "does not verify over the note's text" in line


def test_a_run_failed_entry_carrying_a_path_is_refused(world: dict, tmp_path: Path) -> None:
    out, log = copies(world, tmp_path)
    lines = entries_of(log)
    started = next(json.loads(e) for e in lines if b'"run-started"' in e)
    real = json.loads(lines[release_index(out)])
    made_up = [{**started, "run_id": "failing-run", "spent_before": real["spent"], "lifetime_cap": "4",
                "re_release": "again"},
               {"type": "run-failed", "run_id": "failing-run", "spent": "0", "time": started["time"],
                "reason": "output directory /srv/sdhc/enclave/pr-release already exists"}]
    write_log(world, log, lines + [canonical_json(e) for e in made_up], cosign=True)
    line = refused_line(world, out, log, tmp_path / "seen.json")
    print(f"a run-failed reason carrying a path: {line}")
    assert "run failing-run's failure carries operator text" in line and "/srv" not in line


@pytest.mark.parametrize("removed", ["log folder", "log key", "witness list"])
def test_a_ledger_copied_without_its_log_or_witnesses_cannot_spend(world: dict, tmp_path: Path, removed: str) -> None:
    """Copy only what the enclave's operator might keep: each command that could spend is refused
    before anything is recorded, with one line naming what is missing."""
    enclave = tmp_path / "enclave"
    shutil.copytree(world["ledger"].parent, enclave)
    ledger = enclave / world["ledger"].name
    {"log folder": lambda: shutil.rmtree(log_path(ledger)), "log key": lambda: log_key_path(ledger).unlink(),
     "witness list": lambda: witnesses_path(ledger).unlink()}[removed]()
    before = ledger.read_bytes()
    for command in (
        ("private", world["config"], world["data"], tmp_path / "out", "--ledger", ledger, "--no-validate",
         "--re-release", "the same records again"),
        ("ledger", "raise-cap", ledger, "--dataset", "publog-test", "--to", "5", "--reason", "more"),
        ("ledger", "repair", ledger),
    ):
        refused = cli(*command)
        line = error_line(refused)
        print(f"{removed} removed, {command[0]} {command[1] if command[0] == 'ledger' else ''}: {line}")
        assert refused.returncode == 1 and "refused:" in line and "nothing was spent" in line
        assert {"log folder": "its log folder", "log key": "its log key", "witness list": "witness list"}[removed] in line
    assert ledger.read_bytes() == before and not (tmp_path / "out").exists()


def test_a_rollback_and_a_smaller_fork_seen_after_a_larger_checkpoint(world: dict, tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    assert outsider(world, world["out"], world["later"], seen).returncode == 0  # the larger checkpoint
    rollback = refused_line(world, world["out"], world["log"], seen)  # then an older, genuine, cosigned one
    print(f"rollback: {rollback}")
    assert "rollback: the checkpoint of size" in rollback and "a prefix of the larger" in rollback
    assert rollback.count("(root ") == 2
    out, log = copies(world, tmp_path)
    lines = entries_of(world["log"])
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    write_log(world, log, lines)  # smaller than what was seen, and not a prefix of it
    fork = one_line(outsider(world, out, log, seen, "--no-witness", witnesses=False))
    print(f"smaller fork: {fork}")
    assert "fork: the checkpoint of size" in fork and "not a prefix of the larger" in fork
    assert "internal error" not in fork


def test_no_witness_key_is_refused_and_no_witness_says_what_it_cannot_rule_out(world: dict, tmp_path: Path) -> None:
    refused = outsider(world, world["out"], world["log"], tmp_path / "seen.json", witnesses=False)
    line = one_line(refused)
    print(f"no --witness-key: {line}")
    assert refused.returncode == 1 and "--witness-key: give the witnesses' verifier keys" in line
    unwitnessed = outsider(world, world["out"], world["log"], tmp_path / "seen.json", "--no-witness", witnesses=False)
    assert unwitnessed.returncode == 0, unwitnessed.stderr
    assert "cannot rule out that the log showed you another history than it shows others" in unwitnessed.stdout


def test_a_stale_cosignature_is_refused(world: dict, tmp_path: Path) -> None:
    """The log's checkpoint cosigned 8 days ago (made here with the witnesses' keys, as their
    state was then): older than --max-age."""
    import time

    from phsafe.tlog.files import read_signer_key as read_key

    out, log = copies(world, tmp_path)
    text, signatures = parse_note((log / "checkpoint").read_bytes())
    old = int(time.time()) - 8 * 86400
    stale = []
    for service in world["services"]:
        key = read_key(service.folder / "key" / "witness.key", clock=lambda: old)
        stale.append(NoteSignature(key.name, key.key_id, key.sign(text.encode())))
    (log / "checkpoint").write_bytes(format_note(text, [signatures[0], *stale]))
    line = refused_line(world, out, log, tmp_path / "seen.json")
    print(f"a stale cosignature: {line}")
    assert "stale: the cosignature by witness1.test is from" in line and "older than --max-age 7 days" in line
    assert outsider(world, out, log, tmp_path / "seen2.json", "--max-age", "9d").returncode == 0


# --------------------------------------------------------------------------------------------
# Tampering (issue 21's cases, against the witnessed log)
# --------------------------------------------------------------------------------------------


NO_WITNESS = ("--no-witness",)
"""An insider re-signing a rewritten history gets no witness cosignature, which alone is refused
when the outsider requires the log's quorum (and `--witness-quorum 0` is refused: an outsider
never asks for fewer than the log's policy): these cases, checked with the explicit opt-out,
show what the log key's signature alone proves."""


def tamper_entry_changed(world, out, log, seen):  # noqa: ANN001, ANN201
    lines = entries_of(log)
    lines[3] = lines[3].replace(b'"budget":"', b'"budget":"0', 1)
    (log / "entries").write_bytes(b"".join(e + b"\n" for e in lines))


def tamper_entry_removed(world, out, log, seen):  # noqa: ANN001, ANN201
    lines = entries_of(log)
    del lines[4]
    (log / "entries").write_bytes(b"".join(e + b"\n" for e in lines))


def tamper_entries_reordered(world, out, log, seen):  # noqa: ANN001, ANN201
    lines = entries_of(log)
    lines[4], lines[5] = lines[5], lines[4]
    (log / "entries").write_bytes(b"".join(e + b"\n" for e in lines))


def tamper_fork_same_size(world, out, log, seen):  # noqa: ANN001, ANN201
    """The outsider saw the genuine log; the insider then serves another tree of the same size."""
    assert outsider(world, world["out"], world["later"], seen).returncode == 0
    lines = entries_of(log)
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    write_log(world, log, lines)
    return NO_WITNESS


def tamper_fork_not_extending(world, out, log, seen):  # noqa: ANN001, ANN201
    """... or a later, larger tree that rewrote an early entry."""
    assert outsider(world, world["out"], world["later"], seen).returncode == 0
    lines = entries_of(log)
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    write_log(world, log, lines + [lines[-1]])
    return NO_WITNESS


def tamper_release_missing(world, out, log, seen):  # noqa: ANN001, ANN201
    """The insider rewrites the log without the release (re-signed, more entries after)."""
    lines = entries_of(log)
    index = release_index(out)
    write_log(world, log, lines[:index] + lines[index - 3:index] * 2)
    return NO_WITNESS


def tamper_table_changed(world, out, log, seen):  # noqa: ANN001, ANN201
    path = out / "PH2" / "PH2.csv"
    rows = path.read_text().splitlines()
    fields = rows[1].split("|")
    fields[-3] = str(int(fields[-3]) + 1)  # COUNT
    rows[1] = "|".join(fields)
    path.write_text("\n".join(rows) + "\n")


def tamper_manifest_changed(world, out, log, seen):  # noqa: ANN001, ANN201
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["total_budget"] = "0.1"
    (out / "manifest.json").write_text(json.dumps(manifest))


def tamper_proof_by_another_key(world, out, log, seen):  # noqa: ANN001, ANN201
    from phsafe.tlog import generate_keys, signer_from_key

    proof = parse_tlog_proof((out / "privacy-loss.tlog-proof").read_bytes())
    impostor = signer_from_key(generate_keys(signer(world).name)[0])
    lines = entries_of(log)[:proof.index + 1]
    tree = TransparencyLog.of_entries(lines)
    note = sign_checkpoint(Checkpoint(impostor.name, len(lines), tree.root()), [impostor])
    (out / "privacy-loss.tlog-proof").write_bytes(format_tlog_proof(make_tlog_proof(tree, proof.index, note)))


def tamper_too_few_witnesses(world, out, log, seen):  # noqa: ANN001, ANN201
    text, signatures = parse_note((log / "checkpoint").read_bytes())
    (log / "checkpoint").write_bytes(format_note(text, signatures[:2]))  # the log's and one witness's


def tamper_variance_resigned(world, out, log, seen):  # noqa: ANN001, ANN201
    """Tables whose VARIANCE is not the plan's, with manifest, log and proof all re-made and
    re-signed by the log key: the outsider still catches it from the logged spends."""
    path = out / "PH2" / "PH2.csv"
    rows = list(csv.reader(path.read_text().splitlines(), delimiter="|"))
    rows[1][-1] = repr(float(rows[1][-1]) / 2)
    path.write_text("\n".join("|".join(r) for r in rows) + "\n")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"]["PH2/PH2.csv"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    entry = json.loads((out / "privacy-loss.entry").read_bytes())
    entry["manifest_sha256"] = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    new_entry = canonical_json(entry)
    index = release_index(out)
    lines = entries_of(log)
    lines[index] = new_entry
    note = write_log(world, log, lines)
    (out / "privacy-loss.entry").write_bytes(new_entry)
    proof = make_tlog_proof(TransparencyLog.of_entries(lines), index, note)
    (out / "privacy-loss.tlog-proof").write_bytes(format_tlog_proof(proof))
    return NO_WITNESS


def tamper_entry_in_folder_changed(world, out, log, seen):  # noqa: ANN001, ANN201
    entry = (out / "privacy-loss.entry").read_bytes()
    (out / "privacy-loss.entry").write_bytes(entry.replace(b'"spent":"', b'"spent":"0', 1))


TAMPERING = {
    "an entry changed": (tamper_entry_changed, "do not hash to the checkpoint's root hash"),
    "an entry removed": (tamper_entry_removed, "entries were removed"),
    "entries reordered": (tamper_entries_reordered, "do not hash to the checkpoint's root hash"),
    "a fork: two checkpoints of one size": (tamper_fork_same_size, "signed two histories: two trees of"),
    "a fork: a later checkpoint not extending": (tamper_fork_not_extending, "the larger does not extend the smaller"),
    "a release missing from the log": (tamper_release_missing, "does not extend the checkpoint of"),
    "a table file changed": (tamper_table_changed, "PH2/PH2.csv: its SHA-256 differs from the manifest's"),
    "the manifest changed": (tamper_manifest_changed, "SHA-256 is not the one the public log records"),
    "a proof against a checkpoint the log key did not sign": (tamper_proof_by_another_key, "not signed by a trusted key"),
    "too few witness cosignatures": (tamper_too_few_witnesses, "2 of 2 witness cosignatures are required and 1 verified"),
    "VARIANCE not the logged spends' (all re-signed)": (tamper_variance_resigned, "which the budget and sensitivity"),
    "the release's entry changed": (tamper_entry_in_folder_changed, "privacy-loss.tlog-proof: the entry is not entry"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampering_is_refused_with_one_line(world: dict, tmp_path: Path, case: str) -> None:
    tamper, message = TAMPERING[case]
    out, log = copies(world, tmp_path)
    seen = tmp_path / "seen.json"
    extra = tamper(world, out, log, seen) or ()
    if extra == NO_WITNESS:
        # With the witnesses' keys, the re-signed history is refused for want of its quorum ...
        first = refused_line(world, out, log, tmp_path / "fresh-seen.json")
        assert "witness cosignatures are required" in first or "equivocation" in first or message in first, first
        # ... and with the log key alone, for what it is:
        refused = outsider(world, out, log, seen, *extra, witnesses=False)
        line = one_line(refused)
        assert refused.returncode == 1 and line.startswith("FAILED: "), line
    else:
        line = refused_line(world, out, log, seen, *extra)
    print(f"{case}: {line}")
    assert message in line, line


# --------------------------------------------------------------------------------------------
# Forks and quorums
# --------------------------------------------------------------------------------------------


def test_a_copy_made_before_a_release_cannot_spend_with_its_witnesses(world: dict) -> None:
    copy = world["root"] / "copy-before-release" / "ledger.jsonl"
    refused = release(world, copy, world["root"] / "out-from-copy", "--new-version", "synthetic records")
    line = error_line(refused)
    print(f"copy made before a release: {line}")
    assert refused.returncode != 0 and "an older copy or was rolled back" in line and "cannot spend" in line
    assert intents(copy) == 0 and not (world["root"] / "out-from-copy").exists()


def test_without_a_witness_audit_public_over_the_two_logs_reports_the_fork(world: dict, tmp_path: Path) -> None:
    ledger = tmp_path / "a" / "ledger.jsonl"
    assert cli("ledger", "init", ledger, "--lifetime-cap", "3", "--reason", "no witness").returncode == 0
    shutil.copytree(ledger.parent, tmp_path / "b")
    copy = tmp_path / "b" / "ledger.jsonl"
    assert release(world, ledger, tmp_path / "out-a", "--new-version", "v").returncode == 0
    spent = release(world, copy, tmp_path / "out-b", "--new-version", "v")
    assert spent.returncode == 0 and intents(copy) > 0  # what a witness prevents
    seen = tmp_path / "seen.json"
    vkey = log_path(ledger) / "log.vkey"
    first = cli("audit", "public", tmp_path / "out-a", "--key", vkey, "--log", log_path(ledger), "--state", seen,
                "--no-witness")
    assert first.returncode == 0, first.stderr
    second = cli("audit", "public", tmp_path / "out-b", "--key", vkey, "--log", log_path(copy), "--state", seen,
                 "--no-witness")
    line = one_line(second)
    print(f"fork over two logs: {line}")
    assert second.returncode == 1 and "the log forked or rewrote its history" in line


def test_a_quorum_of_two_of_three_releases_with_one_witness_down(world: dict, tmp_path: Path) -> None:
    services = world["services"]
    down = Service(tmp_path, "witness3")  # its key exists; nothing answers at its address
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # held, never listening: connections to it are refused
    try:
        ledger = tmp_path / "enclave" / "ledger.jsonl"
        # another dataset: the witnesses hold publog-test for the world's log (one log per dataset)
        raw = json.loads(Path(world["config"]).read_text())
        raw["dataset"] = "publog-2-of-3"
        (tmp_path / "config.json").write_text(json.dumps(raw))
        made = cli("ledger", "init", ledger, "--lifetime-cap", "3", "--reason", "2 of 3", "--dataset", "publog-2-of-3",
                   "--witness", services[0].url, services[0].vkey, "--witness", services[1].url, services[1].vkey,
                   "--witness", f"http://127.0.0.1:{closed.getsockname()[1]}", down.vkey, "--witness-quorum", "2")
        assert made.returncode == 0 and "2 of the 3 witnesses" in made.stdout, made.stderr
        for service in services:
            service.witness(log_path(ledger))
        ran = release({**world, "config": tmp_path / "config.json"}, ledger, tmp_path / "out", "--new-version", "v")
        assert ran.returncode == 0, ran.stderr[-2000:]
        checked = cli("audit", "public", tmp_path / "out", "--key", log_path(ledger) / "log.vkey", "--log",
                      log_path(ledger), "--state", tmp_path / "seen.json", "--witness-quorum", "2",
                      *[a for s in (*services, down) for a in ("--witness-key", s.vkey)])
        assert checked.returncode == 0, checked.stderr
        assert "binds 3 witness(es), quorum 2" in checked.stdout
    finally:
        closed.close()


def test_audit_verify_allows_exactly_the_two_log_files(world: dict, tmp_path: Path) -> None:
    """The confidential audit accepts the release's log entry and proof (written after the
    publication was recorded, so not among its logged files) -- and only as what they must be."""
    changed = tmp_path / "changed"
    shutil.copytree(world["out"], changed)
    entry = changed / "privacy-loss.entry"
    entry.write_bytes(entry.read_bytes().replace(b'"spent":"', b'"spent":"0', 1))
    refused = cli("audit", "verify", world["ledger"], "--outputs", changed)
    assert refused.returncode == 1 and "privacy-loss.entry: is not the public log's release entry" in refused.stderr
    extra = tmp_path / "extra"
    shutil.copytree(world["out"], extra)
    (extra / "privacy-loss.note").write_text("an unlogged file\n")
    refused = cli("audit", "verify", world["ledger"], "--outputs", extra)
    assert refused.returncode == 1 and "privacy-loss.note: is in the output directory but not in" in refused.stderr


def test_a_release_stopped_between_its_two_log_files_verifies_what_is_there(world: dict, tmp_path: Path) -> None:
    """The entry and the proof are renamed into the release one after the other, after it is
    recorded: a run stopped between the renames has one of them. That one is checked as it must
    be; the other is reported as not yet written (as when both are missing), not as a fault."""
    for kept, gone in (("privacy-loss.entry", "privacy-loss.tlog-proof"), ("privacy-loss.tlog-proof", "privacy-loss.entry")):
        alone = tmp_path / f"alone-{kept}"
        shutil.copytree(world["out"], alone)
        (alone / gone).unlink()
        checked = cli("audit", "verify", world["ledger"], "--outputs", alone)
        assert checked.returncode == 0, checked.stderr
        assert f"the release has no {gone} yet (stopped while writing it)" in checked.stdout
    entry = tmp_path / "alone-privacy-loss.entry" / "privacy-loss.entry"
    entry.write_bytes(entry.read_bytes().replace(b'"spent":"', b'"spent":"0', 1))
    refused = cli("audit", "verify", world["ledger"], "--outputs", entry.parent)
    assert refused.returncode == 1 and "privacy-loss.entry: is not the public log's release entry" in refused.stderr
    proof = tmp_path / "alone-privacy-loss.tlog-proof" / "privacy-loss.tlog-proof"
    text = proof.read_bytes()
    index = int(re.search(rb"\nindex (\d+)\n", text).group(1))
    proof.write_bytes(text.replace(b"\nindex %d\n" % index, b"\nindex %d\n" % (index + 1), 1))
    refused = cli("audit", "verify", world["ledger"], "--outputs", proof.parent)
    assert refused.returncode == 1 and "privacy-loss.tlog-proof: " in refused.stderr


def test_the_log_files_temporaries_are_written_beside_the_release(world: dict, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A write killed before its rename leaves its temporary file beside the release folder, never
    in it (the audit checks the folder file by file); the next write removes it."""
    from phsafe import durable
    from phsafe.publog import open_ledger, write_release_log_files

    release = tmp_path / "releases" / "out"
    shutil.copytree(world["out"], release)
    for name in ("privacy-loss.entry", "privacy-loss.tlog-proof"):
        (release / name).unlink()
    stale = release.parent / ".out.privacy-loss.entry.999.0badcafe.tmp"  # a write killed before its rename
    stale.write_bytes(b"partial")
    other = release.parent / ".other.privacy-loss.entry.999.0badcafe.tmp"  # another release's: not ours to remove
    other.write_bytes(b"partial")
    renamed: list[tuple[Path, Path]] = []
    real_replace = durable.os.replace

    def replace(source, target):  # type: ignore[no-untyped-def]
        renamed.append((Path(source), Path(target)))
        return real_replace(source, target)

    monkeypatch.setattr(durable.os, "replace", replace)
    run_id = json.loads((release / "manifest.json").read_text())["run_id"]
    assert write_release_log_files(open_ledger(world["ledger"]), run_id, release)
    into = [(source, target) for source, target in renamed if target.parent == release]  # (the log's own files too)
    assert sorted(target.name for _, target in into) == ["privacy-loss.entry", "privacy-loss.tlog-proof"]
    assert all(source.parent == release.parent for source, _ in into)
    assert not stale.exists() and other.exists()
    assert sorted(p.name for p in release.iterdir() if p.name.startswith(".")) == []
    checked = cli("audit", "verify", world["ledger"], "--outputs", release)
    assert checked.returncode == 0 and "proves it in the checkpoint" in checked.stdout, checked.stderr


def test_ledger_cosign_refreshes_the_cosignatures_outsiders_see(world: dict, tmp_path: Path) -> None:
    # The published checkpoint is left with the log's own signature alone (as after a lost
    # cosignature); cosign must bring back fresh ones. (Comparing signatures before and after
    # would depend on the clock: a cosignature's timestamp has whole seconds, and Ed25519 is
    # deterministic, so two cosignings within one second are byte for byte the same.)
    log = log_path(world["ledger"])
    text, signatures = parse_note((log / "checkpoint").read_bytes())
    (log / "checkpoint").write_bytes(format_note(text, signatures[:1]))
    cosigned = cli("ledger", "cosign", world["ledger"])
    assert cosigned.returncode == 0, cosigned.stderr
    assert "is cosigned by witness1.test, witness2.test" in cosigned.stdout
    after_text, after = parse_note((log / "checkpoint").read_bytes())
    assert after_text == text and after[0] == signatures[0]  # the same tree, signed by the log
    assert sorted(s.name for s in after[1:]) == sorted(s.name for s in signatures[1:])  # fresh cosignatures
    assert cli("audit", "public", "--key", world["vkey"], "--state", tmp_path / "state", "--log", log,
               *[a for key in world["wkeys"] for a in ("--witness-key", key)]).returncode == 0


# --------------------------------------------------------------------------------------------
# Trust, round three: quorums that intersect, the log alone, evidence of equivocation
# --------------------------------------------------------------------------------------------


def test_a_quorum_that_need_not_intersect_is_refused_at_init(world: dict, tmp_path: Path) -> None:
    """1 of 2 lets two copies of the enclave each get a history cosigned by a witness of its own:
    refused in one line naming the rule, nothing made."""
    services = world["services"]
    ledger = tmp_path / "enclave" / "ledger.jsonl"
    refused = cli("ledger", "init", ledger, "--lifetime-cap", "3", "--reason", "1 of 2",
                  "--witness", services[0].url, services[0].vkey, "--witness", services[1].url, services[1].vkey,
                  "--witness-quorum", "1")
    line = error_line(refused)
    print(f"ledger init, quorum 1 of 2: {line}")
    assert refused.returncode == 1 and "a witness quorum of 1 of 2 is refused: any two quorums must share a witness" in line
    assert not ledger.exists() and not log_path(ledger).exists() and not log_key_path(ledger).exists()


@pytest.mark.parametrize("asked", ["0", "1"])
def test_an_outsider_cannot_ask_for_fewer_cosignatures_than_the_logs_policy(world: dict, tmp_path: Path,
                                                                           asked: str) -> None:
    line = refused_line(world, world["out"], world["later"], tmp_path / "seen.json", "--witness-quorum", asked)
    print(f"--witness-quorum {asked} against a policy of 2 of 2: {line}")
    assert f"--witness-quorum {asked} is below the log's policy (2 of 2)" in line and "--no-witness" in line
    alone = one_line(outsider(world, world["out"], None, tmp_path / "seen.json", "--witness-quorum", "1"))
    assert "a witness quorum of 1 of 2 is refused" in alone  # without the log: the keys given, K > N/2


def test_the_whole_log_is_checked_without_a_release(world: dict, tmp_path: Path) -> None:
    checked = outsider(world, None, world["later"], tmp_path / "seen.json")
    assert checked.returncode == 0, checked.stderr
    print(f"$ phsafe audit public --log LOG --key log.vkey --witness-key ... (no release)\n{checked.stdout}")
    assert "entries hash to its checkpoint, signed by the log key, cosigned by witness1.test at" in checked.stdout
    assert "its policy binds 2 witness(es), quorum 2: witness1.test, witness2.test" in checked.stdout
    assert "dataset publog-test: 1 release(s)" in checked.stdout and "of cap 4 (rho), left" in checked.stdout
    assert "proof:" not in checked.stdout and checked.stdout.rstrip().endswith("OK")
    # A second release of one run, cosigned by the witnesses, seen in the log alone:
    out, log = copies(world, tmp_path)
    lines = entries_of(log)
    first = json.loads(lines[release_index(out)])
    write_log(world, log, lines + [canonical_json({**first, "time": json.loads(lines[-1])["time"]})], cosign=True)
    line = one_line(outsider(world, None, log, tmp_path / "seen2.json"))
    assert "is released a second time" in line


def test_a_fork_is_printed_as_evidence_anyone_can_check(world: dict, tmp_path: Path) -> None:
    """The outsider saw the genuine log; the insider serves another tree of the same size, signed
    with the log key: the refusal prints both signed checkpoints as evidence, which `audit
    evidence` checks with the log key alone (and which a witness's operator could check too)."""
    seen = tmp_path / "seen.json"
    assert outsider(world, world["out"], world["later"], seen).returncode == 0
    out, log = copies(world, tmp_path)
    lines = entries_of(log)
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    write_log(world, log, lines)
    refused = outsider(world, out, log, seen, "--no-witness", witnesses=False)
    line = one_line(refused)
    assert refused.returncode == 1 and "equivocation: the log key of" in line and "signed two histories" in line
    evidence = tmp_path / "fork.equivocation.json"
    evidence.write_text(refused.stdout)
    checked = cli("audit", "evidence", evidence, "--key", world["vkey"])
    print(f"$ phsafe audit evidence fork.equivocation.json --key log.vkey\n{checked.stderr}")
    assert checked.returncode == 1 and "signed two histories: two trees of" in checked.stderr
    other = cli("audit", "evidence", evidence, "--key", world["wkeys"][0])
    assert other.returncode == 1 and "is a witness key, not a log key" in other.stderr
    nothing = tmp_path / "nothing.json"
    document = json.loads(refused.stdout)  # the larger note's tree size made 1: a proof that leads nowhere
    larger = document["larger"].split("\n")
    document["larger"] = "\n".join([larger[0], "1", *larger[2:]])
    nothing.write_text(json.dumps(document))
    proves_nothing = cli("audit", "evidence", nothing, "--key", world["vkey"])
    assert proves_nothing.returncode == 0 and "proves nothing" in proves_nothing.stdout
