"""What an insider, a typo and Ctrl-C can do at the command line, and what they get.

Each test drives the command line as an operator types it and checks what the operator sees (one
``phsafe: error:`` line, no traceback) and what the ledger holds afterwards. A run stopped by a
signal or killed is a real process of its own, forked from a warm helper
(tests/_warm_process.py: its own pid, signal handlers and exit status, without a fresh
interpreter's imports -- a fresh interpreter is not what these tests prove).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from phsafe.ledger import read_ledger
from tests._ledgers import new_ledger
from tests._warm_process import WarmProcesses
from tests.system.test_reliability import (
    CONFIG, DEMO_US, FIRST, ONE_RUN, REPO, _limit_file_size, cli, entries, error_line, private,
)

PLANTED = "LISTING.csv"  # made-up identifiers and values, dropped into a release folder by an insider


@pytest.fixture(scope="module")
def warm() -> Iterator[WarmProcesses]:
    with WarmProcesses() as processes:
        yield processes


def _stop_after_rename(warm: WarmProcesses, out: Path, ledger: Path) -> str:
    """A run killed after its release folder was renamed into place, before the ledger recorded it."""
    args = ["private", CONFIG, DEMO_US, out, "--ledger", ledger, "--no-validate", *FIRST]
    stopped = warm.run(*args, fault=("kill", "renamed"), cwd=REPO)
    assert stopped.returncode != 0 and out.is_dir(), stopped.stderr[-2000:]
    (run_id, run), = read_ledger(ledger).runs.items()
    assert not run.published
    return run_id


def test_resume_does_not_record_a_file_planted_in_the_release_folder(warm: WarmProcesses, tmp_path: Path):
    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN).path
    out = tmp_path / "out"
    run_id = _stop_after_rename(warm, out, ledger)
    (out / PLANTED).write_text("MAFID,NAME\n100000001,Jane Doe\n")
    resume = ["--resume", run_id, "--resume-reason", "the host rebooted"]

    refused = private(out, ledger, "--no-validate", *resume)
    assert refused.returncode == 1
    line = error_line(refused)
    assert PLANTED in line and "not part of run" in line and "not recorded" in line, line
    run = read_ledger(ledger).runs[run_id]
    assert not run.published and run.status.value == "failed"
    assert "OUTPUTS_PUBLISHED" not in {e["kind"] for e in entries(ledger)}
    assert cli("audit", "verify", ledger, "--outputs", out).returncode == 1  # never vouched for

    (out / PLANTED).unlink()  # the operator removes what is not the release, and resumes
    done = private(out, ledger, "--no-validate", *resume)
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_ledger(ledger).runs[run_id].published
    verified = cli("audit", "verify", ledger, "--outputs", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads((out / "manifest.json").read_text())["run_id"] == run_id


def test_a_file_size_limit_during_validation_is_named(tmp_path: Path):
    """EFBIG while the validation writes its report: the cause in words, not a class name."""
    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN).path
    out = tmp_path / "out"
    proc = private(out, ledger, *FIRST, preexec_fn=_limit_file_size(20_000))
    assert proc.returncode == 1
    line = error_line(proc)
    assert "file too large (EFBIG)" in line and "(OSError)" not in line, line
    assert not out.exists() and not [e for e in entries(ledger) if e["kind"] == "INTENT"]


def test_a_reason_over_the_limit_is_refused_before_reading_and_never_cut(tmp_path: Path):
    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN).path
    out = tmp_path / "out"
    proc = private(out, ledger, "--new-version", "w" * 5000, "--no-validate")
    assert proc.returncode == 1
    line = error_line(proc)
    assert line == "phsafe: error: --new-version is 5000 characters long; the ledger records at most 500 (never cut): " \
                   "shorten it", line
    assert "count" not in proc.stderr  # refused in the preflight, before the inputs are read
    assert [e["kind"] for e in entries(ledger)] == ["LEDGER_INIT"]
    raised = cli("ledger", "raise-cap", ledger, "--dataset", "cef2020-uss", "--to", "2", "--reason", "memo")
    assert raised.returncode == 1 and "knows no dataset 'cef2020-uss'" in error_line(raised)
    assert [e["kind"] for e in entries(ledger)] == ["LEDGER_INIT"]


def _ledger_with_entries(tmp_path: Path) -> Path:
    from phsafe.accounting import plan_run
    from phsafe.config import load_config
    from tests._ledgers import start

    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN)
    plan = plan_run(load_config(CONFIG))
    start(ledger, plan, "run-1").fail("stopped before spending")
    start(ledger, plan, "run-2", re_release="again").fail("stopped before spending")
    return ledger.path


def test_repair_of_a_ledger_damaged_in_the_middle_says_what_it_found(tmp_path: Path):
    ledger = _ledger_with_entries(tmp_path)
    lines = ledger.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 5
    lines[2] = lines[2].replace(b'"kind":"RUN_STARTED"', b'"kind":"RUN_STARTEE"')  # one byte rotted, mid-ledger
    damaged = b"".join(lines)
    for tail in (b"", b'{"seq":9,"ki'):  # ends in a complete entry; or in a torn one besides
        ledger.write_bytes(damaged + tail)
        repaired = cli("ledger", "repair", ledger)
        assert repaired.returncode == 1, repaired.stdout + repaired.stderr
        line = error_line(repaired)
        for phrase in ("entry 2 is damaged", "tampering", "disk corrupted it", "Nothing was changed",
                       "restore the ledger from its backup"):
            assert phrase in line, line
        assert ledger.read_bytes() == damaged + tail  # untouched
    verified = cli("audit", "verify", ledger)
    assert verified.returncode == 1 and "entry 2" in verified.stdout + verified.stderr


def test_an_empty_or_foreign_file_is_refused_as_a_ledger_by_every_command(tmp_path: Path):
    key = tmp_path / "key"
    real = new_ledger(tmp_path / "real", cap=ONE_RUN).path
    key.write_bytes((real.parent / (real.name + ".key")).read_bytes())
    for name, content, phrase in (("empty.jsonl", b"", "is empty (0 bytes; entry 0: missing): it is not a ledger"),
                                  ("geo.jsonl", (DEMO_US / "geo.csv").read_bytes()[:300],
                                   "is not a ledger: its first line (entry 0) is not a ledger entry")):
        path = tmp_path / name
        path.write_bytes(content)
        path.chmod(0o600)
        out = tmp_path / "out"
        for args in (["audit", "verify", path], ["audit", "verify", path, "--lineage-key", key],
                     ["ledger", "repair", path],
                     ["ledger", "raise-cap", path, "--dataset", "cef2020-us", "--to", "3", "--reason", "memo"],
                     ["private", CONFIG, DEMO_US, out, "--ledger", path, *FIRST, "--no-validate"]):
            proc = cli(*args)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            assert phrase in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)
            assert "OK" not in proc.stdout.split(), (args, proc.stdout)
            assert "spent budget" not in proc.stderr and "--resume" not in proc.stderr, proc.stderr  # nothing spent
        assert path.read_bytes() == content and not out.exists()


def test_ledger_files_are_private_and_a_run_refuses_them_open_to_others(tmp_path: Path):
    import os
    import stat

    folder = tmp_path / "enclave" / "ledgers"
    ledger = folder / "us.jsonl"
    made = cli("ledger", "init", ledger, "--lifetime-cap", ONE_RUN, "--reason", "policy memo",
               preexec_fn=lambda: os.umask(0o002))  # a permissive umask must not loosen the modes
    assert made.returncode == 0, made.stderr
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    key, lock = folder / "us.jsonl.key", folder / "us.jsonl.lock"
    assert (mode(ledger), mode(key), mode(lock)) == (0o600, 0o600, 0o600)
    assert mode(folder) == mode(folder.parent) == 0o700

    out = tmp_path / "out"
    for path, what, loose in ((key, "the ledger's lineage key", 0o644), (ledger, "the ledger", 0o666)):
        path.chmod(loose)
        proc = private(out, ledger, *FIRST, "--no-validate")
        assert proc.returncode == 1
        line = error_line(proc)
        assert line == (f"phsafe: error: {what} {path} is open to others (mode {loose:04o}); it is confidential: "
                        f"make it private to its owner with `chmod 600 {path}`, then run again"), line
        assert [e["kind"] for e in entries(ledger)] == ["LEDGER_INIT"] and not out.exists()
        path.chmod(0o600)
    done = private(out, ledger, *FIRST, "--no-validate")
    assert done.returncode == 0, done.stderr[-2000:]
    (run_id,) = read_ledger(ledger).runs
    assert mode(folder / "runs") == mode(folder / "runs" / run_id) == 0o700


STRUCTURAL = {  # bad-input case -> what the one line says, with --no-validate
    "duplicate_mafid_units": "units.csv, column MAFID: every MAFID is unique in units",
    "duplicate_mafid_geo": "geo.csv, column MAFID: every MAFID is unique in geo",
    "orphan_person": "persons.csv, column MAFID: every person's MAFID is in units",
    "unit_without_geo": "units.csv, column MAFID: every unit's MAFID is in geo",
    "geo_without_unit": "geo.csv, column MAFID: every geo MAFID is in units",
    "two_householders": "units.csv, column persons.RELSHIP: every household has exactly one householder",
    "no_householder": "units.csv, column persons.RELSHIP: every household has exactly one householder",
    "bad_code": "units.csv, column TEN: must be one of",
    "age_out_of_range": "persons.csv, column QAGE: must be between 0 and 115",
}


@pytest.mark.parametrize("name", sorted(STRUCTURAL))
def test_no_validate_still_refuses_broken_structure_before_any_spend(name: str, tmp_path: Path):
    from phsafe.errors import InputError
    from phsafe import run_private
    from tests.system._bad_inputs import CASES, base_dataset, build

    (case,) = [c for c in CASES if c.name == name]
    data = tmp_path / "data"
    dataset = build(case, base_dataset(), data)
    ledger = new_ledger(tmp_path / "ledger", cap="10").path
    out = tmp_path / "out"
    options = dict(ledger=ledger, new_version="records", validate=False)
    with pytest.raises(InputError) as refused:
        run_private(data / "config.json", data, out, **options)
    message = str(refused.value)
    assert message.startswith(STRUCTURAL[name]) and "\n" not in message, message
    assert not any(secret in message for secret in case.secrets)
    assert [e["kind"] for e in entries(ledger)] == ["LEDGER_INIT"] and not out.exists()
    del dataset


def _signalled(warm: WarmProcesses, mode: str, point: str, out: Path, ledger: Path,
               *extra: str) -> subprocess.CompletedProcess:
    args = ["private", CONFIG, DEMO_US, out, "--ledger", ledger, "--no-validate", *FIRST, *extra]
    return warm.run(*args, fault=(mode, point), cwd=REPO)


@pytest.mark.parametrize("mode", ["sigint", "sigterm"])
def test_a_signal_while_measuring_stops_at_a_safe_point_and_says_how_to_resume(mode: str, warm: WarmProcesses,
                                                                              tmp_path: Path):
    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN).path
    out = tmp_path / "out"
    stopped = _signalled(warm, mode, "append:6", out, ledger)  # after RUN_STARTED and a few spends
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    text = stopped.stdout + stopped.stderr
    assert "Traceback" not in text and "Exception ignored" not in text and "KeyboardInterrupt" not in text, text
    lines = [line for line in stopped.stderr.splitlines() if line.startswith("phsafe: interrupted:")]
    assert len(lines) == 1 and not [line for line in stopped.stderr.splitlines() if "error" in line], stopped.stderr
    (run_id, run), = read_ledger(ledger).runs.items()
    signal_name = "SIGINT" if mode == "sigint" else "SIGTERM"
    assert lines[0].startswith(f"phsafe: interrupted: stopped by a signal ({signal_name}) at a safe point"), lines[0]
    assert run.failure_reason.startswith(f"stopped by a signal ({signal_name})"), run.failure_reason
    assert f"--resume {run_id} --resume-reason TEXT" in lines[0], lines[0]
    # No INTENT after the request: the one in flight was committed, and nothing was left dangling.
    assert run.status.value == "failed" and run.intents and set(run.intents) == set(run.reusable)
    assert len(run.intents) <= 3
    assert not out.exists() and cli("audit", "verify", ledger).returncode == 0
    resumed = private(out, ledger, "--no-validate", "--resume", run_id, "--resume-reason", "operator stopped it")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = read_ledger(ledger).runs[run_id]
    assert all(len(final.intents[k]) == 1 for k in run.intents)  # nothing committed was spent again
    assert cli("audit", "verify", ledger, "--outputs", out).returncode == 0


def test_ctrl_c_before_any_spend_stops_at_once_with_nothing_to_resume(warm: WarmProcesses, tmp_path: Path):
    ledger = new_ledger(tmp_path / "ledger", cap=ONE_RUN).path
    out = tmp_path / "out"
    stopped = _signalled(warm, "sigint", "reading", out, ledger)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "Aborted" not in stopped.stderr, stopped.stderr
    (line,) = [x for x in stopped.stderr.splitlines() if x.startswith("phsafe: interrupted:")]
    assert "before any budget was spent" in line and "--resume" not in line, line
    assert [e["kind"] for e in entries(ledger)] == ["LEDGER_INIT"] and not out.exists()


def test_near_identical_records_under_a_new_name_are_refused_unless_the_relation_is_declared(tmp_path: Path):
    import csv

    ledger = new_ledger(tmp_path / "ledger", cap="2.6").path
    demo = DEMO_US.parent
    for label in ("us", "pr"):  # disjoint: both keep working in one ledger
        ran = private(tmp_path / f"out-{label}", ledger, "--no-validate", "--new-version", "first",
                      config=demo / label / "config.json", data=demo / label)
        assert ran.returncode == 0, ran.stderr[-2000:]
    copy = tmp_path / "copy"  # the US records with one person removed, under a new dataset name
    copy.mkdir()
    for stem in ("units", "geo"):
        (copy / f"{stem}.csv").write_bytes((DEMO_US / f"{stem}.csv").read_bytes())
    with open(DEMO_US / "persons.csv", newline="") as f:
        rows = list(csv.reader(f))
    roommate = next(i for i, row in enumerate(rows) if row[rows[0].index("RELSHIP")] == "34")
    with open(copy / "persons.csv", "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows[:roommate] + rows[roommate + 1:])
    config = json.loads(CONFIG.read_text())
    config["dataset"] = "another-name"
    (copy / "config.json").write_text(json.dumps(config))
    before = entries(ledger)

    refused = private(tmp_path / "out-copy", ledger, "--no-validate", "--new-version", "fresh records",
                      config=copy / "config.json", data=copy)
    assert refused.returncode == 1
    line = error_line(refused)
    assert "of these records are also in dataset 'demo-us'" in line and "--overlap-reason" in line, line
    assert entries(ledger) == before and not (tmp_path / "out-copy").exists()

    declared = private(tmp_path / "out-copy", ledger, "--no-validate", "--new-version", "fresh records",
                       "--overlap-reason", "a disjoint population, memo 7", config=copy / "config.json", data=copy)
    assert declared.returncode == 0, declared.stderr[-2000:]
    (version,) = [e for e in entries(ledger) if e["kind"] == "DATASET_VERSION" and e["dataset"] == "another-name"]
    assert version["overlap"]["dataset"] == "demo-us" and version["overlap"]["reason"].startswith("a disjoint")
    verified = cli("audit", "verify", ledger)
    assert verified.returncode == 0 and "version overlaps dataset demo-us's records" in verified.stdout
    published = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "out-copy").rglob("*.json"))
    assert version["sketch"]["tags"][0] not in published and '"sketch"' not in published  # never published
