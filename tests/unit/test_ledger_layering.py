"""The ledger, its public log and the two audits read apart (issue 27), by their imports.

* ``phsafe.ledger`` imports nothing of ``phsafe.publog`` (nor of the audits): the log registers
  itself with the ledger as its follower, and the ledger knows it by a protocol only;
* ``phsafe.publog`` imports nothing of ``phsafe.audit``, and the outsider's audit
  (``phsafe.audit.public``) and the confidential one (``phsafe.audit.verify``) do not import
  each other: what both check of the released tables is ``phsafe.audit.tables``;
* ``phsafe.tlog`` imports nothing of the ledger, the log beside it or the audits.

Every import counts, at module level or inside a function (read from the source).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "phsafe"


def imports_of(module: Path) -> set[str]:
    tree = ast.parse(module.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def importers(package: str, forbidden: tuple[str, ...]) -> list[str]:
    root = PACKAGE / package.removeprefix("phsafe.").replace(".", "/")
    files = [root.with_suffix(".py")] if root.with_suffix(".py").exists() else sorted(root.rglob("*.py"))
    bad = []
    for path in files:
        for name in imports_of(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    return bad


def test_the_ledger_never_imports_its_public_log_nor_the_audits() -> None:
    assert not importers("phsafe.ledger", ("phsafe.publog", "phsafe.audit", "phsafe.engine"))


def test_the_log_never_imports_the_audits_and_the_audits_not_each_other() -> None:
    assert not importers("phsafe.publog", ("phsafe.audit",))
    assert not importers("phsafe.audit.public", ("phsafe.audit.verify",))
    assert not importers("phsafe.audit.verify", ("phsafe.audit.public",))


def test_the_transparency_log_knows_nothing_of_ledgers() -> None:
    assert not importers("phsafe.tlog", ("phsafe.ledger", "phsafe.publog", "phsafe.audit"))


def test_the_walk_sees_imports_inside_functions() -> None:
    """(Else the tests above could not fail: private_run imports the log inside a function.)"""
    assert "phsafe.publog" in imports_of(PACKAGE / "private_run.py")
