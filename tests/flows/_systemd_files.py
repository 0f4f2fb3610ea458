"""Readers of the files in deployments/systemd, shared by the unit checks (test_services.py) and
the production stack that runs them (conftest.py): unit files and environment files, parsed as
systemd reads them, strictly enough that a line systemd would take differently fails."""

from __future__ import annotations

import re
from pathlib import Path


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (systemd allows a key more than once, e.g. EnvironmentFile)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{path.name}: {line!r} outside a section"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines (comments and blank lines skipped); no quoting or spaces, which systemd
    and a shell's ``source`` would read differently."""
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key) and not re.search(r"[\s'\"]", value), \
                f"{path.name}: a line systemd and a shell would read differently"
            pairs[key] = value
    return pairs
