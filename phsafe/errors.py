"""Errors with messages that are safe to log.

Every error raised on the data path names *where* the problem is (file, column, config key) and
*which rule* failed, and never carries a raw value of a confidential record.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator


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


class AlreadyReleasedError(BudgetError):
    """The records are a content version that another run released (or is releasing): a
    content version is released once unless a re-release is declared with a reason."""


class PrivacyMapMismatchError(PHSafeError):
    """OpenDP's privacy map disagrees with the planned budget of a measurement."""


# --------------------------------------------------------------------------------------------
# Naming the operator's options in messages
# --------------------------------------------------------------------------------------------
# A refusal says what to do ("raise the cap with --lifetime-cap ..."). The same library runs
# behind the command line and behind the Prefect flows, whose operators set flow parameters, not
# flags: messages name an option through :func:`option`, and each front end declares itself with
# :func:`front_end`.

_FRONT_END: contextvars.ContextVar[str] = contextvars.ContextVar("phsafe_front_end", default="cli")

OPTIONS: dict[str, str] = {
    "ledger": "--ledger",
    "dataset": "--dataset",
    "new_version": "--new-version",
    "lifetime_cap": "--lifetime-cap",
    "cap_reason": "--cap-reason",
    "signing_key": "--signing-key",
    "public_key": "--public-key",
    "non_confidential": "--non-confidential",
    "truncation_key": "--truncation-key",
    "resume": "--resume",
    "resume_reason": "--resume-reason",
    "re_release": "--re-release",
    "no_validate": "--no-validate",
    "work_dir": "--work-dir",
    "output": "OUT",
}
"""Option -> how the command line spells it. Flows spell it as the parameter of that name."""

FLOW_PARAMETERS: dict[str, str] = {"resume": "resume_run_id", "no_validate": "validate_inputs=false",
                                   "new_version": "new_version_reason", "output": "output_root",
                                   "re_release": "re_release_reason"}
"""Options whose flow parameter is not named like the option."""


FLOW_ELSEWHERE: dict[str, str] = {
    "lifetime_cap": "`phsafe ledger raise-cap LEDGER --dataset NAME --to CAP --reason TEXT` (in the enclave; "
                    "then Retry this flow run)",
    "cap_reason": "raise-cap's --reason",
    "resume": "a Retry of this flow run",
    "resume_reason": "the Retry (its reason is recorded for you)",
    "dataset": "the config's \"dataset\" key",
    "no_validate": "the us or pr deployment's parameter validate_inputs=false",
    "work_dir": "the us or pr deployment's parameter work_dir",
}
"""How to do what an option does from a deployment that has no parameter for it (the release
deployment has no ``lifetime_cap``: a cap is raised with ``phsafe ledger raise-cap``)."""

_PARAMETERS: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("phsafe_flow_parameters",
                                                                                      default=None)


def option(name: str) -> str:
    """How the operator sets ``name`` here: ``--lifetime-cap`` (CLI), ``the flow parameter
    lifetime_cap`` (a flow that has it), or how else (a flow that has not)."""
    if _FRONT_END.get() == "flow":
        parameter = FLOW_PARAMETERS.get(name, name)
        known = _PARAMETERS.get()
        if known is not None and parameter.split("=")[0] not in known:
            return FLOW_ELSEWHERE.get(name, f"{parameter} (not a parameter of this deployment)")
        return f"the flow parameter {parameter}"
    return OPTIONS[name]


def flow_parameters() -> frozenset[str] | None:
    """The parameters of the deployment whose run this is (None: unknown, or the command line)."""
    return _PARAMETERS.get() if _FRONT_END.get() == "flow" else None


@contextlib.contextmanager
def front_end(kind: str, parameters: frozenset[str] | None = None) -> Iterator[None]:
    """Name options as ``kind`` (``cli`` or ``flow``) spells them inside the ``with`` block.

    Args:
        parameters: For a flow, the parameters its operator can set: an option without one is
            named by what to do instead (:data:`FLOW_ELSEWHERE`).
    """
    if kind not in ("cli", "flow"):
        raise ValueError(kind)
    token = _FRONT_END.set(kind)
    known = _PARAMETERS.set(parameters if kind == "flow" else None)
    try:
        yield
    finally:
        _PARAMETERS.reset(known)
        _FRONT_END.reset(token)
