"""Locating the input files, and describing a header without echoing a data row.

Reading itself is :class:`phsafe.reader.SourceReader`'s, shared with the counting: the file is
not empty, is comma-separated with a header row, every row has the header's number of fields,
every value is UTF-8 text -- each problem a value-free failure naming the file, the column when
known, and the rule.
"""

from __future__ import annotations

import re
from pathlib import Path

from phsafe.errors import InputError
from phsafe.reader import InputFile as SourceFile  # one located input, as the engine sees it
from phsafe.reader import find_input
from phsafe.schema import FILES
from phsafe.validation._report import Failure

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def locate(data_dir: Path) -> tuple[dict[str, SourceFile], list[Failure]]:
    """Find each of persons, units, geo as ``.csv``, ``.parquet`` or a folder of Parquet files
    in ``data_dir`` (see :func:`phsafe.reader.find_input`)."""
    found: dict[str, SourceFile] = {}
    failures: list[Failure] = []
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return {}, [Failure(str(data_dir), (), "the data directory exists")]
    for stem in FILES:
        try:
            source, problem = find_input(data_dir, stem)
        except InputError as exc:  # a malformed folder input: names a file and a rule, no value
            failures.append(Failure(exc.file, (), exc.rule))
            continue
        if problem == "missing":
            failures.append(Failure(f"{stem}.csv", (), f"the data directory holds {stem}.csv or {stem}.parquet "
                                    f"(a file, or a folder of Parquet files: {stem}.parquet/ or {stem}/)"))
        elif problem is not None:
            failures.append(Failure(
                f"{stem}.csv", (), f"exactly one of {stem}.csv and {stem}.parquet is present (or a {stem}/ "
                f"folder of Parquet files); found {problem.removeprefix('ambiguous: ')}"))
        else:
            assert source is not None
            found[stem] = source
    return found, failures


def describe_header(names: list[str], expected: list[str]) -> str:
    """What is wrong with a header, naming only expected columns and identifier-like extras.

    A header row that is really a data row (a file without a header) must not be echoed:
    confidential values are all digits, so only names that look like identifiers are shown.
    """
    parts = []
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    if missing:
        parts.append("missing " + ", ".join(missing))
    if extra:
        shown = [n for n in extra if _IDENTIFIER.match(n)]
        hidden = len(extra) - len(shown)
        text = ", ".join(shown)
        if hidden:
            text += (", " if text else "") + f"{hidden} other column{'s' if hidden != 1 else ''}"
        parts.append("unexpected " + text)
    if not missing and not extra and names != expected:
        parts.append("columns out of order" if len(set(names)) == len(names) else "a column repeated")
    return "; ".join(parts)
