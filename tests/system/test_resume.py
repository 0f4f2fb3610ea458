"""Resuming a failed private run from the command line: committed measurements are reused,
never re-drawn; a lost one is a new spend, refused unless the lifetime cap admits it."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from phsafe import run_private
from phsafe.errors import BudgetError, PHSafeError
from phsafe.ledger import read_ledger
from phsafe.measurements import MeasurementStore
from tests._cli import phsafe as cli
from tests._ledgers import new_ledger

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"


def _intents(ledger: Path, run_id: str) -> Counter:
    entries = [json.loads(x) for x in ledger.read_text().splitlines()]
    return Counter(e["key"] for e in entries if e["kind"] == "INTENT" and e["run_id"] == run_id)


def _ledger(tmp_path: Path) -> Path:
    """A confidential ledger whose cap admits exactly one run of the demo's US budgets."""
    return new_ledger(tmp_path, cap="1.257281").path


def _options(ledger: Path) -> dict:
    return dict(ledger=ledger, new_version="the demo's synthetic records")


def _fail_on_save(monkeypatch, n: int) -> None:
    original, calls = MeasurementStore.save, []

    def save(store, key, vector):
        calls.append(key)
        if len(calls) == n:
            raise OSError("injected")
        return original(store, key, vector)

    monkeypatch.setattr(MeasurementStore, "save", save)


def test_failed_run_keeps_its_committed_measurements_and_resumes(tmp_path, monkeypatch):
    ledger = _ledger(tmp_path)
    out = tmp_path / "out"
    _fail_on_save(monkeypatch, 10)
    # Validation is not what fails here (the inputs are the demo's, valid): the failed attempt and
    # the refused resume skip it (the same release path without the input checks); the resume
    # that completes the run is the operator's default command, validation included.
    with pytest.raises(OSError):
        run_private(DEMO_US / "config.json", DEMO_US, out, validate=False, **_options(ledger))
    monkeypatch.undo()
    (run_id, run), = read_ledger(ledger).runs.items()
    assert run.status.value == "failed" and len(run.reusable) == 9 and len(run.intents) == 10
    staged = MeasurementStore(ledger.parent / "runs" / run_id / "measurements")
    assert len(list(staged.directory.glob("*.npy"))) == 9
    assert not out.exists()

    # The CLI: resuming with the unchanged cap is refused (the lost measurement is a re-spend).
    # (in this process, as a subprocess would see it: tests/_cli.py)
    cmd = ["private", str(DEMO_US / "config.json"), str(DEMO_US), str(out), "--ledger", str(ledger),
           "--resume", run_id, "--resume-reason", "test"]
    refused = cli(*cmd, "--no-validate")
    assert refused.returncode == 1 and "lifetime cap" in refused.stderr
    assert sum(_intents(ledger, run_id).values()) == 10

    resumed = cli(*cmd, "--lifetime-cap", "1.3", "--cap-reason", "re-spend after disk failure")
    assert resumed.returncode == 0, resumed.stderr
    intents = _intents(ledger, run_id)
    assert sum(intents.values()) == len(intents) + 1 and max(intents.values()) == 2
    final = read_ledger(ledger).runs[run_id]
    assert final.status.value == "finished"
    for key, digest in run.reusable.items():
        assert final.reusable[key] == digest  # the released vectors of attempt 1 were published
    verify = cli("audit", "verify", ledger, "--outputs", out)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not staged.directory.exists()  # published: the work folder keeps no noisy vector


def test_resume_needs_the_same_config(tmp_path, monkeypatch):
    ledger = _ledger(tmp_path)
    _fail_on_save(monkeypatch, 3)
    with pytest.raises(OSError):
        run_private(DEMO_US / "config.json", DEMO_US, tmp_path / "out", **_options(ledger))
    monkeypatch.undo()
    (run_id, _), = read_ledger(ledger).runs.items()
    other = tmp_path / "config.json"
    other.write_text((DEMO_US / "config.json").read_text().replace('"zcdp"', '"zcdp" '))
    with pytest.raises(PHSafeError, match="different config"):
        run_private(other, DEMO_US, tmp_path / "out", ledger=ledger, resume=run_id)


class _Stop(BaseException):
    """The process stopped here (a kill, a power cut)."""


def test_a_finished_run_is_never_resumed_and_its_leftovers_are_named_and_removed(tmp_path, monkeypatch):
    # Stopped after the release is published and recorded, before its final checkpoint is renamed
    # into place and its work folder cleaned: the run is finished, its work folder is not.
    import phsafe.durable

    real = phsafe.durable.replace

    def replace(path, data, **kw):  # noqa: ANN001, ANN202
        if Path(path).name == "checkpoint.json":
            real(Path(path).with_name(f".checkpoint.json.{os.getpid()}.cut.tmp"), data)  # its temporary, left
            raise _Stop()
        return real(path, data, **kw)

    ledger = _ledger(tmp_path)
    monkeypatch.setattr(phsafe.durable, "replace", replace)
    with pytest.raises(_Stop):
        run_private(DEMO_US / "config.json", DEMO_US, tmp_path / "out", validate=False, **_options(ledger))
    monkeypatch.undo()
    (run_id, run), = read_ledger(ledger).runs.items()
    assert run.status.value == "finished"
    work = ledger.parent / "runs" / run_id

    # The refusal to resume it says that, and nothing else (before: a hint to resume it followed).
    cmd = ["private", str(DEMO_US / "config.json"), str(DEMO_US), str(tmp_path / "out2"), "--ledger",
           str(ledger), "--resume", run_id, "--resume-reason", "test", "--no-validate"]
    refused = cli(*cmd)  # in this process, as a subprocess would see it (tests/_cli.py)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("phsafe: error:")]
    assert refused.returncode == 1 and errors == [
        f"phsafe: error: run {run_id} finished and published to {tmp_path / 'out'}; a finished run is never resumed"]
    assert sum(_intents(ledger, run_id).values()) == len(_intents(ledger, run_id)) == 46

    # audit verify names the leftovers and the command that removes them: exit 3, not OK.
    verify = ["audit", "verify", str(ledger)]
    reported = cli(*verify)
    assert reported.returncode == 3 and "\nOK" not in reported.stdout, reported.stdout + reported.stderr
    command = f"phsafe ledger clean-finished {ledger} {run_id}"
    assert (f"ACTION NEEDED: run {run_id} finished (entry {run.terminal_seq}) and its work folder {work} still holds "
            f"46 noisy vector(s), the staged copy of its release, 1 temporary file(s)") in reported.stdout
    assert f"remove them with `{command}`" in reported.stdout

    # The command removes exactly those, durably; the release and the reports stay.
    before = {p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*")}
    cleaned = cli(*command.split()[1:])
    assert cleaned.returncode == 0 and "removed 46 noisy vector(s)" in cleaned.stdout, cleaned.stdout + cleaned.stderr
    assert sorted(p.name for p in work.iterdir()) == []
    assert {p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*")} == before
    ok = cli(*verify, "--outputs", tmp_path / "out")
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith("OK"), ok.stdout + ok.stderr


def test_clean_finished_refuses_a_run_that_did_not_finish(tmp_path, monkeypatch):
    from phsafe.engine import clean_finished_runs

    ledger = _ledger(tmp_path)
    _fail_on_save(monkeypatch, 3)
    with pytest.raises(OSError):
        run_private(DEMO_US / "config.json", DEMO_US, tmp_path / "out", validate=False, **_options(ledger))
    monkeypatch.undo()
    (run_id, _), = read_ledger(ledger).runs.items()
    staged = MeasurementStore(ledger.parent / "runs" / run_id / "measurements")
    kept = sorted(staged.directory.iterdir())
    with pytest.raises(PHSafeError, match=f"run {run_id} has not finished \\(failed\\): its work folder is what a "
                                          "resume completes it from"):
        clean_finished_runs(ledger, [run_id])
    assert sorted(staged.directory.iterdir()) == kept and len(kept) == 2
