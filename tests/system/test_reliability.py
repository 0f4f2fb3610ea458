"""Reliability of ``phsafe private`` on bad settings and faults (issue 13), through the command line.

Every refusal is checked the same way: exit status 1, exactly one ``phsafe: error:`` line saying
what is wrong (no traceback, no ``internal error``), nothing under the output name, and the exact
ledger effect -- no spend at all for everything a preflight can see; for faults after spending,
the run is completed by ``--resume`` with no new spend of a committed measurement, and
``audit verify --outputs`` holds. The faults are real where the machine allows it (a full tmpfs,
an immutable file, a file-size limit) and simulated by a write wrapper where it does not.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from phsafe import run_private
from phsafe.errors import PHSafeError
from phsafe.ledger import lock_path, read_ledger
from tests._cli import phsafe
from tests._ledgers import new_ledger

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"
CONFIG = DEMO_US / "config.json"
PHSAFE = Path(sys.executable).parent / "phsafe"
ONE_RUN = "1.257281"  # the demo config's total: a cap that admits exactly one run
FIRST = ["--new-version", "the demo's synthetic records"]


def cli(*args: object, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", **kw.pop("env", {})}
    return phsafe(*args, env=env, **kw)  # in this process, as a subprocess would see it (tests/_cli.py)


def private(out: Path, ledger: Path, *extra: object, config: Path = CONFIG, data: Path = DEMO_US, **kw):
    return cli("private", config, data, out, "--ledger", ledger, *extra, **kw)


def entries(ledger: Path) -> list[dict]:
    if not ledger.is_file():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.endswith("}")]


def intents(ledger: Path, run_id: str | None = None) -> Counter:
    return Counter(e["key"] for e in entries(ledger)
                   if e["kind"] == "INTENT" and (run_id is None or e["run_id"] == run_id))


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (console progress lines aside)."""
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("phsafe: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if "[error" in line], proc.stderr[-3000:]
    return errors[0]


def assert_refused(proc, *phrases: str, out: Path, ledger: Path | None = None) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = error_line(proc)
    for phrase in phrases:
        assert phrase.lower() in line.lower(), line
    assert not out.exists() and not any(out.parent.glob(f".{out.name}.partial-*")), "something was published"
    if ledger is not None:
        assert not intents(ledger), "budget was spent"
    return line


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return new_ledger(tmp_path / "ledger", cap=ONE_RUN).path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    d = tmp_path_factory.mktemp("keys")
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    good, other = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    paths = {
        "good": good.private_bytes(pem, pkcs8, serialization.NoEncryption()),
        "good.pub": good.public_key().public_bytes(pem, spki),
        "other.pub": other.public_key().public_bytes(pem, spki),
        "garbage": b"-----BEGIN PRIVATE KEY-----\nnot a key at all\n-----END PRIVATE KEY-----\n",
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            pem, pkcs8, serialization.NoEncryption()),
        "passphrase": good.private_bytes(pem, pkcs8, serialization.BestAvailableEncryption(b"secret")),
    }
    for name, data in paths.items():
        (d / name).write_bytes(data)
    return {name: d / name for name in paths}


# --------------------------------------------------------------------------------------------
# Refused before anything is spent
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key, phrase", [("garbage", "not a PEM private key"), ("rsa", "not an Ed25519 key"),
                                         ("passphrase", "passphrase")])
def test_a_bad_signing_key_is_refused_before_any_spend(key: str, phrase: str, keys, ledger: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert_refused(private(out, ledger, *FIRST, "--signing-key", keys[key]), "--signing-key", phrase,
                   out=out, ledger=ledger)


def test_a_signing_key_that_is_not_the_operators_is_refused(keys, ledger: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert_refused(private(out, ledger, *FIRST, "--signing-key", keys["good"], "--public-key", keys["other.pub"]),
                   "does not match the public key", out=out, ledger=ledger)


def test_output_folder_problems_are_refused_before_any_spend(ledger: Path, tmp_path: Path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (a_file / "out", "is not a folder"),
        (tmp_path / "missing" / "out", "does not exist"),
        (tmp_path / ("o" * 250), "too long"),
        (Path("/sys/phsafe-out"), "cannot be written"),  # a parent even root cannot write
    ]
    for out, phrase in cases:
        assert_refused(private(out, ledger, *FIRST), phrase, out=out, ledger=ledger)
    existing = tmp_path / "exists"
    existing.mkdir()
    proc = private(existing, ledger, *FIRST)
    assert proc.returncode == 1 and "already exists" in error_line(proc) and not intents(ledger)


def test_a_full_file_system_under_out_is_refused_before_any_spend(ledger: Path, tmp_path: Path):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a 64 KiB tmpfs (as root): {mounted.stderr.decode().strip()}")
    try:
        out = small / "out"
        assert_refused(private(out, ledger, *FIRST), "MiB free", "the release needs", out=out, ledger=ledger)
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_ledger_problems_are_refused_before_any_spend(tmp_path: Path):
    out = tmp_path / "out"
    folder = tmp_path / "a-folder"
    folder.mkdir()
    assert_refused(private(out, folder, *FIRST), "is a directory", out=out)
    assert_refused(private(out, tmp_path / "nope.jsonl", *FIRST), "does not exist", "phsafe ledger init", out=out)

    ledger = new_ledger(tmp_path / "l1", cap=ONE_RUN).path
    lock_path(ledger).unlink(missing_ok=True)
    lock_path(ledger).mkdir()
    assert_refused(private(out, ledger, *FIRST), "lock file", "is a directory", out=out, ledger=ledger)

    # An immutable ledger cannot be appended to, even by root.
    ledger = new_ledger(tmp_path / "l2", cap=ONE_RUN).path
    assert subprocess.run(["chattr", "+i", str(ledger)]).returncode == 0, "chattr +i is needed (ext4, root)"
    try:
        assert_refused(private(out, ledger, *FIRST), "cannot append", out=out)
    finally:
        subprocess.run(["chattr", "-i", str(ledger)], check=True)
    assert not intents(ledger)

    # /dev/full is not a ledger; nothing may be created beside it.
    assert_refused(private(out, Path("/dev/full"), *FIRST), "not a regular file", out=out)
    assert not Path("/dev/full.lock").exists()

    # A deeply nested line in the ledger is a broken entry, reported as such.
    ledger = new_ledger(tmp_path / "l3", cap=ONE_RUN).path
    with open(ledger, "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    assert_refused(private(out, ledger, *FIRST), "entry 1", "nested too deeply", out=out)


def test_settings_are_refused_before_any_spend(ledger: Path, tmp_path: Path):
    out = tmp_path / "out"
    zero = tmp_path / "zero.json"
    raw = json.loads(CONFIG.read_text())
    raw["privacy_budget"] = {t: {lv: 0 for lv in levels} for t, levels in raw["privacy_budget"].items()}
    zero.write_text(json.dumps(raw))
    assert_refused(private(out, ledger, *FIRST, config=zero), "every budget is 0", out=out, ledger=ledger)
    assert_refused(private(out, ledger, *FIRST, "--lifetime-cap", "Infinity", "--cap-reason", "x"),
                   "--lifetime-cap", "finite", out=out, ledger=ledger)
    assert_refused(private(out, ledger, *FIRST, "--lifetime-cap", "3"), "--cap-reason", out=out, ledger=ledger)
    assert_refused(private(out, ledger, *FIRST, "--truncation-key", "ZZTOP"), "--truncation-key",
                   "non-confidential data only", out=out, ledger=ledger)
    assert_refused(private(out, tmp_path / "nc.jsonl", "--non-confidential", "--truncation-key", "ZZTOP"),
                   "--truncation-key", "32 hex digits", out=out)
    assert_refused(cli("private", CONFIG, DEMO_US, out, *FIRST, env={"PHSAFE_LEDGER": ""}, cwd=tmp_path),
                   "name the audit ledger", out=out)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    proc = private(out, ledger, *FIRST, "-l", f"{log_dir}/")
    assert proc.returncode == 1 and "is a folder" in error_line(proc) and not out.exists()
    assert not intents(ledger)


# --------------------------------------------------------------------------------------------
# Faults after spending: recovered without new noise
# --------------------------------------------------------------------------------------------


def _complete(ledger: Path, run_id: str, out: Path, *extra: object) -> None:
    """Resume ``run_id`` to ``out``; the run publishes and verifies."""
    before = intents(ledger, run_id)
    # What was committed before the resume is reused; a spend whose COMMITTED could not be
    # written (its noise may have been drawn) is spent again, recorded.
    committed_before = set(read_ledger(ledger).runs[run_id].committed)
    proc = private(out, ledger, "--resume", run_id, "--resume-reason", "recovery test", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = read_ledger(ledger).runs[run_id]
    assert state.status.value == "finished" and state.output_path == str(out)
    after = intents(ledger, run_id)
    for key in committed_before:
        assert after[key] == before[key], f"{key} was spent again"
    verified = cli("audit", "verify", ledger, "--outputs", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_full_disk_under_out_after_spending_is_recovered_without_new_noise(ledger: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    import phsafe.outputs

    def no_space(src, dst, *a, **k):  # noqa: ANN001
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(phsafe.outputs.shutil, "copyfile", no_space)
    out = tmp_path / "out"
    with pytest.raises(PHSafeError, match=r"no space left on device \(ENOSPC\)") as raised:
        run_private(CONFIG, DEMO_US, out, ledger=ledger, new_version="demo", validate=False)
    assert "--resume" in str(raised.value)
    monkeypatch.undo()
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))
    (run_id, run), = read_ledger(ledger).runs.items()
    assert run.status.value == "failed" and not run.published and len(run.reusable) == len(run.planned)
    before = sum(intents(ledger).values())
    _complete(ledger, run_id, tmp_path / "new-out", "--no-validate")
    assert sum(intents(ledger).values()) == before  # nothing spent again


def test_a_signing_key_lost_before_publishing_is_recovered_without_new_noise(keys, ledger: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch):
    import phsafe.ledger

    original = phsafe.ledger.load_signing_key
    calls = []

    def flaky(path, public_key=None):  # noqa: ANN001 -- fine at preflight, gone at publish
        calls.append(path)
        if len(calls) > 1:
            raise PHSafeError(f"cannot read the signing key {path}: no such file or directory (ENOENT)")
        return original(path, public_key)

    monkeypatch.setattr(phsafe.ledger, "load_signing_key", flaky)
    out = tmp_path / "out"
    with pytest.raises(PHSafeError, match="signing key"):
        run_private(CONFIG, DEMO_US, out, ledger=ledger, new_version="demo", validate=False,
                                                            signing_key=keys["good"])
    monkeypatch.undo()
    (run_id, run), = read_ledger(ledger).runs.items()
    assert not out.exists() and not run.published and run.status.value == "failed"
    before = sum(intents(ledger).values())
    _complete(ledger, run_id, out, "--no-validate", "--signing-key", keys["good"], "--public-key", keys["good.pub"])
    assert sum(intents(ledger).values()) == before
    verified = cli("audit", "verify", ledger, "--outputs", out, "--public-key", keys["good.pub"])
    assert verified.returncode == 0, verified.stderr


def test_two_runs_racing_for_one_out_lose_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import phsafe.engine

    ledger = new_ledger(tmp_path / "ledger", cap="2.514562").path
    out = tmp_path / "out"
    original = phsafe.engine.publish_release

    def another_run_publishes_first(release, target, run_id, manifest, **kw):  # noqa: ANN001
        shutil.copytree(release, target)  # the other run's release lands under the same name first
        return original(release, target, run_id, manifest, **kw)

    monkeypatch.setattr(phsafe.engine, "publish_release", another_run_publishes_first)
    with pytest.raises(PHSafeError, match="already exists"):
        run_private(CONFIG, DEMO_US, out, ledger=ledger, new_version="demo", validate=False)
    monkeypatch.undo()
    (run_id, run), = read_ledger(ledger).runs.items()
    assert run.status.value == "failed" and not run.published
    before = sum(intents(ledger).values())
    _complete(ledger, run_id, tmp_path / "out-2", "--no-validate")
    assert sum(intents(ledger).values()) == before


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_under_the_ledger_is_named_rolled_back_and_recovered(tmp_path: Path):
    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN).path
    out = tmp_path / "out"
    # Files may not grow past 40 KB: the ledger fills up in the middle of the spends.
    proc = private(out, ledger, *FIRST, "--no-validate", preexec_fn=_limit_file_size(40_000))
    line = assert_refused(proc, "could not write the ledger", "file too large (EFBIG)", "nothing of it was kept",
                          out=out)
    assert ledger.read_bytes().endswith(b"\n")  # rolled back: no partial entry
    verified = cli("audit", "verify", ledger)
    assert verified.returncode == 0, verified.stderr
    (run_id, run), = read_ledger(ledger).runs.items()
    assert "--resume" in line or run.status.value == "running"
    # Without the limit the run completes. A spend whose COMMITTED could not be written is spent
    # again (its noise may have been drawn) -- a recorded re-spend, so the cap must admit it.
    extra: list[object] = ["--no-validate"]
    if set(run.intents) - set(run.reusable):
        extra += ["--lifetime-cap", "2.6", "--cap-reason", "re-spend after a full disk"]
    _complete(ledger, run_id, out, *extra)


def test_a_torn_ledger_tail_is_named_repaired_and_the_run_resumes(tmp_path: Path):
    ledger = new_ledger(tmp_path / "ledger", cap="2.514562").path
    out = tmp_path / "out"
    first = private(out, ledger, *FIRST, "--no-validate")
    assert first.returncode == 0, first.stderr
    with open(ledger, "ab") as f:  # an interrupted write: half an entry, no newline
        f.write(b'{"hash":"0123","kind":"INT')
    out2 = tmp_path / "out2"
    assert_refused(private(out2, ledger, "--no-validate"), "incomplete entry", "phsafe ledger repair", out=out2)
    torn = cli("audit", "verify", ledger)  # the entries before the tail verify: an action, not a failure
    assert torn.returncode == 3 and "ACTION NEEDED: the ledger ends in an incomplete entry" in torn.stdout, torn.stdout
    repaired = cli("ledger", "repair", ledger)
    assert repaired.returncode == 0 and "dropped 26 bytes" in repaired.stdout, repaired.stdout + repaired.stderr
    assert entries(ledger)[-1]["kind"] == "TAIL_REPAIRED"
    second = private(out2, ledger, "--no-validate", "--re-release", "a second release after the repair")
    assert second.returncode == 0, second.stderr
    verified = cli("audit", "verify", ledger, "--outputs", out2)
    assert verified.returncode == 0 and "TAIL_REPAIRED" in verified.stdout, verified.stdout + verified.stderr


def test_no_traceback_or_raw_value_reaches_the_log_file_on_a_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A bug ends as ``internal error: <type>``; the log file gets frames, never the message."""
    from click.testing import CliRunner

    import phsafe.sequence
    from phsafe.cli import main

    def broken(*a, **k):  # noqa: ANN001
        raise ValueError("raw value 123456789 of a record")

    monkeypatch.setattr(phsafe.sequence, "run_release", broken)
    log = tmp_path / "run.log"
    result = CliRunner().invoke(main, ["private", str(CONFIG), str(DEMO_US), str(tmp_path / "out"), "--ledger",
                                       str(tmp_path / "l"), "-l", str(log)])
    assert result.exit_code == 2
    assert "internal error: ValueError" in result.output and "123456789" not in result.output
    text = log.read_text()
    assert "ValueError" in text and "123456789" not in text and "Traceback" not in text
    assert "test_reliability.py" in text  # where it happened: file and line


def test_non_private_needs_the_data_declared_non_confidential(tmp_path: Path):
    out = tmp_path / "truth"
    proc = cli("non-private", CONFIG, DEMO_US, out)
    line = assert_refused(proc, "exact counts", "--non-confidential", out=out)
    assert "synthetic or public data only" in line
    done = cli("non-private", CONFIG, DEMO_US, out, "--non-confidential")
    assert done.returncode == 0 and (out / "PH1_num" / "PH1_num.csv").exists(), done.stderr


def test_only_public_files_are_ever_published(tmp_path: Path):
    """The two zones, enforced: a release folder holding anything but the tables, the data
    package and the manifest is not published."""
    from phsafe.outputs import publish_release

    release = tmp_path / "release"
    (release / "PH2").mkdir(parents=True)
    (release / "PH2" / "PH2.csv").write_text("REGION_ID|REGION_TYPE\n")
    (release / "validation").mkdir()
    (release / "validation" / "report.txt").write_text("persons.csv: 3 failing rows")
    with pytest.raises(PHSafeError, match="validation/report.txt, which is not a public file"):
        publish_release(release, tmp_path / "out", "run-1", {"run_id": "run-1"})
    assert not (tmp_path / "out").exists() and not (release / "manifest.json").exists()


# --------------------------------------------------------------------------------------------
# Broken inputs are refused as typed: validation is on by default
# --------------------------------------------------------------------------------------------

_UNVALIDATED_PUBLISHED = [  # published at the full budget by `phsafe private` without -v, before
    "duplicate_mafid_units", "orphan_person", "two_householders", "no_householder",
    "geo_rtype_disagrees", "geo_without_unit",
]


def _header_only(stem: str):  # noqa: ANN202
    def edit(directory: Path) -> None:
        path = directory / f"{stem}.csv"
        path.write_text(path.read_text().splitlines()[0] + "\n")
    return edit


def _county_not_numeric(directory: Path) -> None:
    import pandas as pd

    geo = pd.read_csv(directory / "geo.csv", dtype=str, keep_default_na=False)
    geo.loc[geo.index[3], "TABBLKCOU"] = "A1B"
    geo.to_csv(directory / "geo.csv", index=False, lineterminator="\n")


@pytest.mark.parametrize("name", _UNVALIDATED_PUBLISHED + ["persons_header_only", "geo_header_only",
                                                           "county_not_numeric"])
def test_broken_inputs_are_refused_by_the_command_as_typed(name: str, tmp_path: Path) -> None:
    """`phsafe private CONFIG DATA OUT` -- no -v -- refuses each input that was once published at
    the full budget because validation was opt-in: one line naming file, column and rule; no
    spend; nothing published; no value of the data in any output or the log file."""
    from tests.system._bad_inputs import CASES, base_dataset, build

    data = tmp_path / "data"
    case = next((c for c in CASES if c.name == name), None)
    if case is not None:
        ds = build(case, base_dataset(), data)
        expect = (case.file, *case.columns)
        secrets = case.secrets
    else:
        ds = base_dataset()
        ds.write(data)
        edit, expect = {
            # No person at all: every household lacks its householder. No geo row: no unit is in geo.
            "persons_header_only": (_header_only("persons"), ("units.csv", "persons.RELSHIP", "householder")),
            "geo_header_only": (_header_only("geo"), ("units.csv", "MAFID", "is in geo")),
            "county_not_numeric": (_county_not_numeric, ("geo.csv", "TABBLKCOU")),
        }[name]
        edit(data)
        secrets = ("A1B",)
    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN).path
    out, log = tmp_path / "out", tmp_path / "run.log"
    proc = private(out, ledger, *FIRST, "-l", log, config=data / "config.json", data=data)
    assert proc.returncode == 1, proc.stderr[-2000:]
    text = proc.stdout + proc.stderr + log.read_text()
    assert "Traceback" not in text and "internal error" not in text
    assert all(word in proc.stderr for word in expect), proc.stderr[-2000:]
    assert not out.exists() and not intents(ledger)
    for secret in secrets:
        assert secret not in text


# --------------------------------------------------------------------------------------------
# A public log that cannot be written (its folder read-only, its disk full)
# --------------------------------------------------------------------------------------------


def _refuse_log_writes(monkeypatch: pytest.MonkeyPatch, ledger: Path, code: int, *, after: int = 0) -> list[str]:
    """Every write to the public log's folder fails with ``code`` (EACCES: as for a folder made
    read-only, which root -- these tests' user -- would write all the same; ENOSPC: a full disk),
    after the first ``after`` appends to it. Returns the refused operations."""
    import phsafe.durable as durable

    folder = str(ledger) + ".public-log"
    real_append, real_replace = durable.append, durable.replace
    appends: list[int] = []
    refused: list[str] = []

    def in_log(fd: int) -> bool:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(folder)

    def append(fd: int, data: bytes, *, end: int | None = None) -> None:
        if in_log(fd):
            appends.append(fd)
            if len(appends) > after:
                refused.append("append")
                raise OSError(code, os.strerror(code))
        real_append(fd, data, end=end)

    def replace(path, data, **kw):  # noqa: ANN001, ANN202
        if str(path).startswith(folder) and len(appends) > after:
            refused.append("replace")
            raise OSError(code, os.strerror(code), str(path))
        real_replace(path, data, **kw)

    monkeypatch.setattr(durable, "append", append)
    monkeypatch.setattr(durable, "replace", replace)
    return refused


@pytest.mark.parametrize("code, cause", [(errno.EACCES, "permission denied"), (errno.ENOSPC, "no space left")])
@pytest.mark.parametrize("after", [0, 3], ids=["at-its-start", "after-three-spends"])
def test_a_run_whose_public_log_cannot_be_written_records_its_failure_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, cause: str, after: int) -> None:
    # Before: the run stopped with no RUN_FAILED (the ledger could not be read past its log) and
    # stayed open, holding its whole plan against the cap; a resume while the folder was still
    # read-only said the log "is not the projection of the ledger ... changed or damaged".
    ledger = new_ledger(tmp_path / "ledger", cap="2.514562").path
    out = tmp_path / "out"
    refused = _refuse_log_writes(monkeypatch, ledger, code, after=after)
    with pytest.raises(PHSafeError) as raised:
        run_private(CONFIG, DEMO_US, out, ledger=ledger, new_version="demo", validate=False)
    message = str(raised.value)
    assert refused and "\n" not in message, message
    assert message.startswith(f"cannot write the public log {ledger}.public-log: {cause}"), message
    assert "changed or damaged" not in message
    assert ("spend(s) of run" in message and "--resume" in message) if after else "spend" not in message
    (run_id, run), = read_ledger(ledger).runs.items()
    assert run.status.value == "failed", "the run stayed open"
    failed = entries(ledger)[-1]
    assert failed["kind"] == "RUN_FAILED" and failed["code"] == "storage-error"
    assert not out.exists()
    # Still unwritable: the resume is refused before anything is recorded, naming the cause.
    size = ledger.stat().st_size
    with pytest.raises(PHSafeError, match=f"cannot write the public log .*: {cause}") as again:
        run_private(CONFIG, DEMO_US, out, ledger=ledger, resume=run_id, resume_reason="log fixed?", validate=False)
    assert "changed or damaged" not in str(again.value) and ledger.stat().st_size == size
    # Writable again: the log records the failure (it catches up), the run resumes and publishes.
    monkeypatch.undo()
    from phsafe.private_run import forget_ledgers

    forget_ledgers()
    _complete(ledger, run_id, out, "--no-validate")
    from phsafe.publog import log_path
    from phsafe.tlog.layout import ENTRIES_FILE

    public = [json.loads(line) for line in (log_path(ledger) / ENTRIES_FILE).read_text().splitlines()]
    assert any(e.get("type") == "run-failed" and e.get("code") == "storage-error" for e in public), public
