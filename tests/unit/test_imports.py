"""The library's imports, read from its source: no circle, and no private name borrowed.

Every ``import`` of every module of ``phsafe/`` counts -- at module level, inside functions, and
under ``if TYPE_CHECKING:`` -- because each is a dependency a reader has to follow. A package's
own ``__init__`` is not counted as a dependency of its submodules (Python runs it first; it is
the package's front, and may import them all).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "phsafe"


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: dict[str, int] = field(default_factory=dict)  # imported phsafe module -> first line
    borrowed: list[str] = field(default_factory=list)  # "line N: module._name"


def _modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest prefix of the dotted ``name`` that is a module of the package."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_module(importer: str, target: str) -> bool:
    """A private module (``phsafe.validation._gx``) used inside the package that holds it."""
    parent, _, leaf = target.rpartition(".")
    return _private(leaf) and (importer == parent or importer.startswith(parent + "."))


def _read(module: Module) -> None:
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    aliases: dict[str, str] = {}  # local name -> phsafe module it is bound to
    attributes: list[ast.Attribute] = []  # checked once every alias is known (one walk of the tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            attributes.append(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target:
                    module.imports.setdefault(target, node.lineno)
                    aliases[alias.asname or alias.name.split(".")[0]] = target if alias.asname else "phsafe"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in MODULES else _resolve(source)
                if target is None:
                    continue
                module.imports.setdefault(target, node.lineno)
                if target == submodule:
                    aliases[alias.asname or alias.name] = target
                    if _private(alias.name) and not _own_private_module(module.name, target):
                        module.borrowed.append(f"line {node.lineno}: private module {target}")
                elif _private(alias.name) and target != module.name:
                    module.borrowed.append(f"line {node.lineno}: {target}.{alias.name}")
    for node in attributes:
        if isinstance(node.value, ast.Name) and _private(node.attr) and node.value.id in aliases:
            target = aliases[node.value.id]
            if f"{target}.{node.attr}" not in MODULES and target != module.name:
                module.borrowed.append(f"line {node.lineno}: {target}.{node.attr}")


for _module in MODULES.values():
    _read(_module)


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, module in MODULES.items():
        deps = set(module.imports) - {name}
        # A package's own __init__ runs before its submodules: not a dependency of theirs.
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle through each strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for component in components:
        members = set(component)
        start = component[0]
        # breadth-first from start back to start, inside the component
        paths = {w: [start, w] for w in graph[start] if w in members}
        queue = list(paths)
        while queue and start not in paths:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w in members and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        circles.append(paths.get(start, component))
    return circles


def _edge_line(a: str, b: str) -> str:
    return f"{a} -> {b} ({MODULES[a].path.relative_to(REPO)}:{MODULES[a].imports[b]})"


def test_the_walk_sees_function_level_and_type_checking_imports() -> None:
    """The reader finds imports wherever they are (else the circle test below could not fail)."""
    engine = MODULES["phsafe.engine"].imports
    assert "phsafe.ledger" in engine  # imported inside functions only
    assert "phsafe.progress" in engine  # imported at module level and under TYPE_CHECKING
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_circle_in_the_library() -> None:
    circles = _cycles(_graph())
    report = "\n".join(
        "circle: " + " -> ".join(c) + "\n  " + "\n  ".join(_edge_line(a, b) for a, b in zip(c, c[1:]))
        for c in circles
    )
    assert not circles, report


def test_no_private_name_is_imported_from_another_module() -> None:
    borrowed = {str(m.path.relative_to(REPO)): m.borrowed for m in MODULES.values() if m.borrowed}
    assert not borrowed, "\n".join(f"{path}: {', '.join(items)}" for path, items in borrowed.items())


def _private_path(target: str) -> str | None:
    """The package whose private module ``target`` is (``phsafe.validation`` for
    ``phsafe.validation._inputs``), or None when no part of it is private."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            return ".".join(parts[:i])
    return None


def test_no_public_name_is_taken_from_another_packages_private_module() -> None:
    """``from phsafe.validation._inputs import InputValidation`` outside ``phsafe.validation``: the
    package's front (its ``__init__``) is what others may use."""
    found = []
    for module in MODULES.values():
        for target, line in module.imports.items():
            owner = _private_path(target)
            if owner is not None and module.name != owner and not module.name.startswith(owner + "."):
                found.append(f"{module.path.relative_to(REPO)}:{line}: {target}")
    assert not found, "\n".join(found)


def _unit(name: str) -> str | None:
    """The top-level part of the library a module belongs to: its package (``phsafe.ledger``) or
    itself (``phsafe.engine``); None for the root package's front."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else None


def test_no_import_circle_between_packages() -> None:
    """Packages (and top-level modules) form no circle either: ``phsafe.ledger`` never imports
    ``phsafe.publog`` back (the log follows the ledger, registered as a follower)."""
    graph: dict[str, set[str]] = {}
    for name, module in MODULES.items():
        unit = _unit(name)
        if unit is None:
            continue
        graph.setdefault(unit, set())
        for target in module.imports:
            other = _unit(target)
            if other is not None and other != unit:
                graph[unit].add(other)
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    circles = _cycles(graph)
    report = []
    for circle in circles:
        edges = []
        for a, b in zip(circle, circle[1:]):
            where = next(f"{m.path.relative_to(REPO)}:{line}" for n, m in MODULES.items() if _unit(n) == a
                         for t, line in m.imports.items() if _unit(t) == b)
            edges.append(f"{a} -> {b} ({where})")
        report.append("circle: " + " -> ".join(circle) + "\n  " + "\n  ".join(edges))
    assert not circles, "\n".join(report)


OUTSIDE = [p for folder in ("flows", "tasks", "deployments", "demo") for p in sorted((REPO / folder).rglob("*.py"))]


def test_no_private_name_of_the_library_is_used_outside_it() -> None:
    """The Prefect project (flows, tasks, deployments) and the demo use the library's public names only."""
    found = []
    for path in OUTSIDE:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "phsafe":
                        if _private_path(alias.name) is not None:
                            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name}")
                        aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "phsafe"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "phsafe":
                assert node.module is not None
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _private_path(node.module) is not None or _private(alias.name):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}: {full}")
                    if full in MODULES:
                        aliases[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
                    and node.value.id in aliases):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    assert OUTSIDE and not found, "\n".join(found)
