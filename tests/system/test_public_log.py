"""``phsafe audit public`` as an outsider runs it, on real releases (issue 21).

A witnessed ledger publishes one release (``phsafe private``); its public log folder is copied
out as a web server would serve it. Then:

* the outsider's check passes on the release and the log, and prints the statement;
* every tampering case is refused with one line and a non-zero exit: an entry changed, removed
  or reordered; a forked log (two checkpoints of one size, a later one that does not extend the
  earlier); a release missing from the log; a table file changed; the manifest changed; a proof
  against a checkpoint the log key did not sign; too few witness cosignatures; tables whose
  VARIANCE is not the logged spends' (even with everything re-signed by the log key);
* forks: a ledger copied before a release cannot spend with the witness (one refusal, no
  INTENT); without a witness the copy can spend, and ``audit public`` over the two logs
  reports the fork.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phsafe import synthetic
from phsafe.publog import log_key_path, log_path
from phsafe.tlog import Checkpoint, TransparencyLog, make_tlog_proof, read_signer_key, sign_checkpoint
from phsafe.tlog.proof import format_tlog_proof, parse_tlog_proof
from tests.conftest import US_CONFIG

pytestmark = pytest.mark.slow

PHSAFE = Path(sys.executable).parent / "phsafe"


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(PHSAFE), *map(str, args)], capture_output=True, text=True, timeout=600)


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
    world = {"root": root, "data": root / "data", "config": root / "config.json"}
    for number in (1, 2):
        made = cli("witness", "init", root / f"witness{number}", "--name", f"witness{number}.test")
        assert made.returncode == 0, made.stderr
    ledger = root / "enclave" / "ledger.jsonl"
    made = cli("ledger", "init", ledger, "--lifetime-cap", "3", "--reason", "test policy",
               "--witness", root / "witness1")
    assert made.returncode == 0 and "public-log" in made.stdout, made.stderr
    shutil.copytree(ledger.parent, root / "copy-before-release")  # an insider's copy
    ran = release(world, ledger, root / "out", "--new-version", "synthetic records")
    assert ran.returncode == 0, ran.stderr[-2000:]
    shutil.copytree(log_path(ledger), root / "published-log")  # as a web server serves it
    world.update(ledger=ledger, out=root / "out", log=root / "published-log", vkey=root / "published-log" / "log.vkey")
    return world


def outsider(world: dict, out: Path, log: Path | None, state: Path, *extra: object) -> subprocess.CompletedProcess:
    args = ["audit", "public", out, "--key", world["vkey"], "--state", state,
            "--witness-key", world["root"] / "witness1" / "witness.vkey", *extra]
    if log is not None:
        args += ["--log", log]
    return cli(*args)


def test_an_outsider_checks_the_release_the_log_and_the_statement(world: dict, tmp_path: Path) -> None:
    checked = outsider(world, world["out"], world["log"], tmp_path / "seen.json")
    assert checked.returncode == 0, checked.stderr
    out = checked.stdout
    assert "proof: privacy-loss.entry is entry" in out and "cosigned by witness1.test" in out
    assert "manifest.json has the SHA-256 the log records" in out
    assert "match the VARIANCE the logged spends imply" in out
    assert "first seen" in out and out.rstrip().endswith("OK")
    assert "dataset publog-test: 1 release(s)" in out and "of cap 3 (rho), left" in out
    again = outsider(world, world["out"], world["log"], tmp_path / "seen.json")
    assert again.returncode == 0 and "consistent with the checkpoint of" in again.stdout
    # The release alone, offline: nothing but itself and the log's key.
    alone = outsider(world, world["out"], None, tmp_path / "seen.json")
    assert alone.returncode == 0 and "log: not checked" in alone.stdout
    # The same check from Python (phsafe.audit_public).
    import phsafe

    lines = phsafe.audit_public(world["out"], key=world["vkey"], log=world["log"],
                                witness_keys=(world["root"] / "witness1" / "witness.vkey",),
                                state_file=tmp_path / "seen.json")
    assert any(line.startswith("dataset publog-test: 1 release(s)") for line in lines)
    # The confidential audit agrees, and the release folder holds exactly the two log files more.
    verified = cli("audit", "verify", world["ledger"], "--outputs", world["out"])
    assert verified.returncode == 0 and "exactly the projection" in verified.stdout, verified.stderr


# --------------------------------------------------------------------------------------------
# Tampering
# --------------------------------------------------------------------------------------------


def signer(world: dict):  # noqa: ANN201
    """The log key, as an insider holding it would use it to re-sign a rewritten log."""
    return read_signer_key(log_key_path(world["ledger"]))


def entries_of(log: Path) -> list[bytes]:
    return (log / "entries").read_bytes().split(b"\n")[:-1]


def write_log(world: dict, log: Path, entries: list[bytes]) -> bytes:
    """``log`` rewritten to hold ``entries``, with a checkpoint signed by the log key."""
    tree = TransparencyLog.of_entries(entries)
    key = signer(world)
    note = sign_checkpoint(Checkpoint(key.name, len(entries), tree.root()), [key])
    (log / "entries").write_bytes(b"".join(e + b"\n" for e in entries))
    (log / "checkpoint").write_bytes(note)
    return note


def copies(world: dict, tmp_path: Path) -> tuple[Path, Path]:
    out, log = tmp_path / "out", tmp_path / "log"
    shutil.copytree(world["out"], out)
    shutil.copytree(world["log"], log)
    return out, log


def release_index(out: Path) -> int:
    return parse_tlog_proof((out / "privacy-loss.tlog-proof").read_bytes()).index


QUORUM_0 = ("--witness-quorum", "0")
"""An insider re-signing with the log key gets no witness cosignature (that alone is refused when
the outsider requires the witness): these cases show what the log key's signature alone proves."""


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
    assert outsider(world, world["out"], world["log"], seen).returncode == 0
    lines = entries_of(log)
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    write_log(world, log, lines)
    return QUORUM_0


def tamper_fork_not_extending(world, out, log, seen):  # noqa: ANN001, ANN201
    """... or a later, larger tree that rewrote an early entry."""
    assert outsider(world, world["out"], world["log"], seen).returncode == 0
    lines = entries_of(log)
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    write_log(world, log, lines + [lines[-1]])
    return QUORUM_0


def tamper_release_missing(world, out, log, seen):  # noqa: ANN001, ANN201
    """The insider rewrites the log without the release (re-signed, more entries after)."""
    lines = entries_of(log)
    index = release_index(out)
    write_log(world, log, lines[:index] + lines[index - 3:index] * 2)
    return QUORUM_0


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
    return ("--witness-key", world["root"] / "witness2" / "witness.vkey")  # 2 of 2 required; witness2 never cosigned


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
    from phsafe.ledger import canonical_json

    new_entry = canonical_json(entry)
    index = release_index(out)
    lines = entries_of(log)
    lines[index] = new_entry
    note = write_log(world, log, lines)
    (out / "privacy-loss.entry").write_bytes(new_entry)
    proof = make_tlog_proof(TransparencyLog.of_entries(lines), index, note)
    (out / "privacy-loss.tlog-proof").write_bytes(format_tlog_proof(proof))
    return QUORUM_0


def tamper_entry_in_folder_changed(world, out, log, seen):  # noqa: ANN001, ANN201
    entry = (out / "privacy-loss.entry").read_bytes()
    (out / "privacy-loss.entry").write_bytes(entry.replace(b'"spent":"', b'"spent":"0', 1))


TAMPERING = {
    "an entry changed": (tamper_entry_changed, "do not hash to the checkpoint's root hash"),
    "an entry removed": (tamper_entry_removed, "entries were removed"),
    "entries reordered": (tamper_entries_reordered, "do not hash to the checkpoint's root hash"),
    "a fork: two checkpoints of one size": (tamper_fork_same_size, "have different root hashes: the log forked"),
    "a fork: a later checkpoint not extending": (tamper_fork_not_extending, "does not extend the one of size"),
    "a release missing from the log": (tamper_release_missing, "does not extend the checkpoint of"),
    "a table file changed": (tamper_table_changed, "PH2/PH2.csv: its SHA-256 differs from the manifest's"),
    "the manifest changed": (tamper_manifest_changed, "SHA-256 is not the one the public log records"),
    "a proof against a checkpoint the log key did not sign": (tamper_proof_by_another_key, "the note is not signed by a trusted key"),
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
    refused = outsider(world, out, log, seen, *extra)
    line = one_line(refused)
    print(f"{case}: {line}")  # shown with -s: the note quotes these lines
    assert refused.returncode == 1 and line.startswith("FAILED: ") and message in line, line


# --------------------------------------------------------------------------------------------
# Forks
# --------------------------------------------------------------------------------------------


def test_a_copy_made_before_a_release_cannot_spend_with_a_witness(world: dict) -> None:
    copy = world["root"] / "copy-before-release" / "ledger.jsonl"
    refused = release(world, copy, world["root"] / "out-from-copy", "--new-version", "synthetic records")
    line = error_line(refused)
    print(f"copy made before a release: {line}")
    assert refused.returncode != 0 and "an older copy or was rolled back" in line and "nothing was spent" in line
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
    first = cli("audit", "public", tmp_path / "out-a", "--key", vkey, "--log", log_path(ledger), "--state", seen)
    assert first.returncode == 0, first.stderr
    second = cli("audit", "public", tmp_path / "out-b", "--key", vkey, "--log", log_path(copy), "--state", seen)
    line = one_line(second)
    print(f"fork over two logs: {line}")
    assert second.returncode == 1 and "the log forked or rewrote its history" in line


def test_witness_cosign_checks_consistency_with_what_it_cosigned(world: dict, tmp_path: Path) -> None:
    witness2 = world["root"] / "witness2"
    trusted = cli("witness", "trust", witness2, "--log-key", world["vkey"])
    assert trusted.returncode == 0, trusted.stderr
    log = tmp_path / "log"
    shutil.copytree(world["log"], log)
    cosigned = cli("witness", "cosign", witness2, log, "--out", tmp_path / "cosigned")
    assert cosigned.returncode == 0, cosigned.stderr
    note = (tmp_path / "cosigned").read_text()
    assert "— witness2.test " in note and note.startswith((log / "checkpoint").read_text().split("\n\n")[0])
    # The same log again: consistent (same size, same root); a rewritten one of the same size: refused.
    assert cli("witness", "cosign", witness2, log).returncode == 0
    lines = entries_of(log)
    lines[1] = lines[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    write_log(world, log, lines + [lines[-1]])
    refused = cli("witness", "cosign", witness2, log)
    line = error_line(refused)
    print(f"witness cosign of a rewritten log: {line}")
    assert refused.returncode == 1 and "refused to cosign" in line and "does not extend" in line


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
    alone = tmp_path / "alone"
    shutil.copytree(world["out"], alone)
    (alone / "privacy-loss.tlog-proof").unlink()
    refused = cli("audit", "verify", world["ledger"], "--outputs", alone)
    assert refused.returncode == 1 and "privacy-loss.tlog-proof: is missing beside its partner file" in refused.stderr
