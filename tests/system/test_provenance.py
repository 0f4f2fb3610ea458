"""The code version a run records comes from the install stamp, not from git at run time: a
checkout built by root and run by a service user (whom git refuses) still records its commit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from phsafe import provenance
from phsafe.provenance import Provenance, provenance_of, stamp


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A tiny checkout laid out like the project's: the library, a flow, the lock."""
    root = tmp_path / "checkout"
    (root / "phsafe").mkdir(parents=True)
    (root / "flows").mkdir()
    (root / "phsafe" / "__init__.py").write_text("__version__ = '0.1.0'\n")
    (root / "phsafe" / "engine.py").write_text("SPEND = 1\n")
    (root / "flows" / "sdhc.py").write_text("FLOW = 1\n")
    (root / "requirements.lock").write_text("numpy==2.0\n")
    (root / "README.md").write_text("docs are not code\n")
    (root / ".gitignore").write_text("/phsafe/_stamp.json\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "first")
    return root


def test_the_stamp_names_the_commit_and_is_what_a_run_reads(checkout: Path, monkeypatch):
    commit = _git(checkout, "rev-parse", "HEAD").strip()
    made = stamp(checkout)
    assert made.commit == commit and made.clean
    document = json.loads((checkout / "phsafe" / "_stamp.json").read_text())
    assert document["commit"] == commit and document["clean"] is True
    assert sorted(document["files"]) == ["flows/sdhc.py", "phsafe/__init__.py",
                                         "phsafe/engine.py", "requirements.lock"]
    # At run time git is not asked when the files match the stamp: as for a service user whom
    # git refuses ("dubious ownership"), here git is not even found.
    monkeypatch.setattr(provenance, "_git", lambda *a: None)
    found = provenance_of(checkout / "phsafe")
    assert found == Provenance(found.version, commit, True, "stamp", None)
    assert found.code_version == f"{found.version}+g{commit[:12]}"
    # A change outside the code (docs) is not a change of the code.
    (checkout / "README.md").write_text("edited\n")
    assert provenance_of(checkout / "phsafe").clean is True


def test_code_changed_after_the_stamp_is_recorded_dirty_and_said_once(checkout: Path, monkeypatch):
    commit = _git(checkout, "rev-parse", "HEAD").strip()
    stamp(checkout)
    (checkout / "phsafe" / "engine.py").write_text("SPEND = 2\n")
    monkeypatch.setattr(provenance, "_git", lambda *a: None)  # git cannot read the checkout
    found = provenance_of(checkout / "phsafe")
    assert found.commit == commit and found.clean is False and found.code_version.endswith(".dirty")
    assert found.note.startswith(f"1 file(s) of the code changed since it was installed from commit {commit[:12]} "
                                 "(first: phsafe/engine.py)")
    assert "\n" not in found.note


def test_a_checkout_that_moved_on_asks_git_when_git_can_answer(checkout: Path):
    stamp(checkout)
    (checkout / "phsafe" / "engine.py").write_text("SPEND = 3\n")
    _git(checkout, "commit", "-qam", "second")
    found = provenance_of(checkout / "phsafe")
    assert found.source == "git" and found.clean and found.commit == _git(checkout, "rev-parse", "HEAD").strip()


def test_without_stamp_or_git_the_run_says_the_commit_is_unknown(checkout: Path, monkeypatch):
    monkeypatch.setattr(provenance, "_git", lambda *a: None)
    found = provenance_of(checkout / "phsafe")
    assert found.commit is None and found.code_version.endswith("+unknown")
    assert found.note.startswith("the code's commit cannot be known: no install stamp") and "\n" not in found.note


def test_uncommitted_changes_at_install_are_stamped_dirty(checkout: Path, monkeypatch):
    (checkout / "flows" / "sdhc.py").write_text("FLOW = 2\n")
    made = stamp(checkout)
    assert made.clean is False
    monkeypatch.setattr(provenance, "_git", lambda *a: None)
    found = provenance_of(checkout / "phsafe")
    assert found.source == "stamp" and found.code_version.endswith(".dirty") and "uncommitted" in found.note


def test_stamping_where_git_cannot_say_the_commit_is_refused(tmp_path: Path):
    (tmp_path / "phsafe").mkdir()
    with pytest.raises(RuntimeError, match="git cannot say which commit"):
        stamp(tmp_path)
