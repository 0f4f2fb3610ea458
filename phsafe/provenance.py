"""Which code a run ran: the commit and whether the tree was clean, stamped when the code is
installed and read from the installed package when a run starts.

A run records its code version in the ledger and its manifest (``0.1.0+g1a2b3c4d5e6f``, with
``.dirty`` when the code differs from that commit, ``0.1.0+unknown`` when the commit cannot be
known). Asking git when a run starts does not survive the production layout: the checkout is
built by root and the services run as their own user, for whom git refuses the repository
("dubious ownership"). So the version is fixed when the code is installed:

* ``make env`` (run by the checkout's owner) runs ``python -m phsafe.provenance stamp``, which
  asks git for the commit and whether the tracked files differ from it, and writes
  ``phsafe/_stamp.json`` -- inside the installed package -- with the SHA-256 of every tracked file
  of the code that runs (the library, the flows and tasks, the deployments, the expectation
  suites, the dependency lock);
* a run reads the stamp and checks those files against it (a few milliseconds): the stamp's
  version when they match; when they do not (a file edited after the install), git's answer
  if git can read the checkout (a developer who committed since), else the stamp's commit
  marked ``.dirty``; without a stamp, git's answer, else ``+unknown``. Whenever the commit is
  unknown or the code differs from it, the run says so in one line (:attr:`Provenance.note`).

The deploy step (``deployments/deploy.py``) refuses code that is unknown or dirty unless told
``--allow-dirty``, and gives the deployments the version, which each flow run compares with its
own.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import phsafe
from phsafe import durable

__all__ = ["Provenance", "provenance", "provenance_of", "code_version", "stamp", "STAMP_FILE"]

STAMP_FILE = "_stamp.json"
"""The stamp, in the package's folder (``phsafe/_stamp.json``); never committed."""
CODE = ("phsafe", "flows", "tasks", "deployments", "expectations", "pyproject.toml", "requirements.lock")
"""What the stamp checks, relative to the checkout: the tracked files under these paths. At run
time, a top-level folder absent from the install (a wheel has the library only) is not checked."""


@dataclass(frozen=True)
class Provenance:
    """The code a run runs.

    Attributes:
        version: The package's version (``0.1.0``).
        commit: The git commit (40 hex digits), or None when it cannot be known.
        clean: The code is exactly that commit's (False: it differs; None: unknown).
        source: ``stamp`` (read from the install stamp), ``git`` (asked at run time) or ``none``.
        note: One line for the operator when the commit is unknown or the code differs from it.
    """

    version: str
    commit: str | None
    clean: bool | None
    source: str
    note: str | None = None

    @property
    def code_version(self) -> str:
        """``0.1.0+g1a2b3c4d5e6f``, ``0.1.0+g1a2b3c4d5e6f.dirty`` or ``0.1.0+unknown``."""
        if self.commit is None:
            return f"{self.version}+unknown"
        return f"{self.version}+g{self.commit[:12]}" + ("" if self.clean else ".dirty")


def _root() -> Path:
    """The folder holding the ``phsafe`` package: the checkout (editable install) or site-packages."""
    return Path(phsafe.__file__).resolve().parent.parent


def _git(root: Path, *args: str) -> str | None:
    """git's output in ``root``, or None when git cannot answer (absent, not a checkout, refused)."""
    try:
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _from_git(root: Path) -> Provenance | None:
    commit = (_git(root, "rev-parse", "HEAD") or "").strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if len(commit) != 40 or status is None:
        return None
    return Provenance(phsafe.__version__, commit, not status.strip(), "git")


def _tracked_code(root: Path) -> list[str]:
    listed = _git(root, "ls-files", "-z", "--", *CODE)
    if listed is None:
        raise RuntimeError(f"git cannot list the files of {root}")
    return sorted(p for p in listed.split("\0") if p and (root / p).is_file())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamp(root: Path | None = None) -> Provenance:
    """Write the install stamp of the checkout at ``root`` (default: this package's).

    Raises:
        RuntimeError: git cannot say which commit the checkout is (not a checkout, or git refuses
            it: run this as the checkout's owner).
    """
    root = Path(root) if root is not None else _root()
    found = _from_git(root)
    if found is None:
        raise RuntimeError(f"git cannot say which commit {root} is: stamp it as the checkout's owner, in a git "
                           "checkout")
    files = {p: _sha256(root / p) for p in _tracked_code(root)}
    document = {"version": found.version, "commit": found.commit, "clean": found.clean,
                "stamped": datetime.now(timezone.utc).isoformat(timespec="seconds"), "files": files}
    target = root / "phsafe" / STAMP_FILE
    # 0644: the services' user reads it
    durable.replace(target, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode("utf-8"), mode=0o644)
    provenance.cache_clear()
    return found


def _changed(root: Path, files: dict[str, str]) -> list[str]:
    """The stamped files that differ (or are gone) in the install at ``root``."""
    present = {p.split("/")[0] for p in files if (root / p.split("/")[0]).exists()}
    changed = []
    for path, digest in files.items():
        if path.split("/")[0] not in present:
            continue
        try:
            if _sha256(root / path) != digest:
                changed.append(path)
        except OSError:
            changed.append(path)
    return changed


def _stamped(package: Path) -> dict | None:
    try:
        document = json.loads((package / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or not isinstance(document.get("commit"), str) or \
            not isinstance(document.get("files"), dict):
        return None
    return document


@functools.lru_cache(maxsize=1)
def provenance() -> Provenance:
    """The code this process runs (read once per process; see the module docstring)."""
    return provenance_of(Path(phsafe.__file__).resolve().parent)


def provenance_of(package: Path) -> Provenance:
    """The code installed with the ``phsafe`` package folder ``package``: its stamp checked
    against its files, else git, else unknown (see the module docstring)."""
    root = package.parent
    document = _stamped(package)
    if document is not None:
        changed = _changed(root, document["files"])
        if not changed:
            clean = bool(document.get("clean"))
            note = None if clean else (f"the code was installed from commit {document['commit'][:12]} with "
                                       "uncommitted changes: runs record it as .dirty")
            return Provenance(phsafe.__version__, document["commit"], clean, "stamp", note)
        live = _from_git(root)
        if live is not None:
            return live if live.clean else Provenance(
                live.version, live.commit, False, "git", f"the checkout {root} has uncommitted changes: runs record "
                                                          "its commit as .dirty")
        return Provenance(phsafe.__version__, document["commit"], False, "stamp",
                          f"{len(changed)} file(s) of the code changed since it was installed from commit "
                          f"{document['commit'][:12]} (first: {changed[0]}): runs record it as .dirty; reinstall "
                          "a clean checkout (make env)")
    live = _from_git(root)
    if live is not None:
        return live
    return Provenance(phsafe.__version__, None, None, "none",
                      f"the code's commit cannot be known: no install stamp ({package / STAMP_FILE}, written by "
                      f"`make env`) and git cannot read {root}; runs record {phsafe.__version__}+unknown")


_said = False


def code_version() -> str:
    """The code version runs record (``0.1.0+g1a2b3c4d5e6f``); says once per process, in one
    line, when the commit is unknown or the code differs from it."""
    global _said
    found = provenance()
    if found.note and not _said:
        _said = True
        from phsafe.logs import get_logger

        # An unknown commit is a warning (the operator's console gets it); code that differs from
        # a known commit is in the version itself (".dirty"), and the note goes to the log.
        say = get_logger("phsafe.provenance").warning if found.commit is None else get_logger("phsafe.provenance").info
        say(found.note, code_version=found.code_version)
    return found.code_version


def interpreter_note() -> str | None:
    """One line when other users cannot run this environment's python (a venv made with a python
    under a home folder closed to them, such as pyenv's under ``/root``): the services' user could
    not run phsafe from it."""
    import os

    python = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    closed = [p for p in (python, *python.parents) if p.exists() and not p.stat().st_mode & 0o001]
    if not closed:
        return None
    return (f"note: this environment runs {python}, which other users cannot run ({closed[-1]} is closed to them): "
            "a service user cannot use it; for production build it with the system's python "
            "(make clean env PYTHON=/usr/bin/python3)")


def main(argv: list[str] | None = None) -> int:
    """``python -m phsafe.provenance stamp [ROOT]`` (make env) or ``show``."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("stamp", "show"):
        print("usage: python -m phsafe.provenance stamp [ROOT] | show", file=sys.stderr)
        return 2
    if args[0] == "stamp":
        try:
            found = stamp(Path(args[1]) if len(args) > 1 else None)
        except RuntimeError as exc:
            print(f"provenance: {exc}", file=sys.stderr)
            return 1
        print(f"provenance: stamped {found.code_version}" + ("" if found.clean else
                                                              " (uncommitted changes: runs record .dirty)"))
        note = interpreter_note()
        if note:
            print(note)
        return 0
    found = provenance()
    print(found.code_version + (f"\n{found.note}" if found.note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
