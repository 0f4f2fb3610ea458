"""Errors with messages that are safe to log.

Every error raised on the data path names *where* the problem is (file, column, config key) and
*which rule* failed, and never carries a raw value of a confidential record.
"""

from __future__ import annotations


class PHSafeError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(PHSafeError):
    """The configuration violates a rule of spec §2.

    Args:
        key: Dotted path of the offending key, e.g. ``privacy_budget.PH2.usa_*``.
        rule: The rule in plain words.
        file: Name of the config file, when the config was read from one.
    """

    def __init__(self, key: str, rule: str, *, file: str | None = None) -> None:
        self.key = key
        self.rule = rule
        self.file = file
        where = f"{file}: " if file else ""
        super().__init__(f"{where}config key '{key}': {rule}")


class InputError(PHSafeError):
    """An input file violates a rule of spec §1 or §4.

    Args:
        file: File name, e.g. ``persons.csv``.
        column: Column or comma-separated columns involved (``""`` for file-level rules).
        rule: The rule in plain words.
        rows: Number of offending rows, when known. Never the rows themselves.
    """

    def __init__(self, file: str, column: str, rule: str, rows: int | None = None) -> None:
        self.file = file
        self.column = column
        self.rule = rule
        self.rows = rows
        where = f"{file}" + (f", column {column}" if column else "")
        count = f" ({rows} row{'s' if rows != 1 else ''})" if rows is not None else ""
        super().__init__(f"{where}: {rule}{count}")


class OutputExistsError(PHSafeError):
    """The output directory already exists; a run never overwrites a publication."""


class BudgetError(PHSafeError):
    """A run would spend more privacy-loss budget than it is allowed to."""


class PrivacyMapMismatchError(PHSafeError):
    """OpenDP's privacy map disagrees with the planned budget of a measurement."""
