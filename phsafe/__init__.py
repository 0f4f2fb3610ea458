"""PHSafe: the 2020 Census S-DHC tables under differential privacy.

The public API (names are loaded on first use, so ``import phsafe`` stays cheap)::

    import phsafe

    report = phsafe.validate("config.json", "data/")                 # spends nothing
    phsafe.init_ledger("enclave/ledger.jsonl", lifetime_cap="2.6", reason="2020 S-DHC policy")
    result = phsafe.run_private("config.json", "data/", "release/", ledger="enclave/ledger.jsonl",
                                dataset="cef2020-us", new_version="the production extract")
    tables = phsafe.read_release("release/")                          # table -> DataFrame, labelled
    phsafe.postprocess_release("release/", "estimates/")              # model-based estimates
    estimates = phsafe.read_estimates("estimates/")                   # PH1 ... PH8, labelled
    phsafe.verify_ledger("enclave/ledger.jsonl", outputs="release/")  # the auditor's check

Runs and ledgers: :func:`validate`, :func:`init_ledger`, :func:`run_private`,
:func:`run_nonprivate`, :func:`verify_ledger`, :func:`audit_public` (an outsider's check of a
release against the public privacy-loss log) (:mod:`phsafe.api`); the signing key pair:
:func:`generate_signing_key` (:mod:`phsafe.signing`). Releases: :func:`read_release`,
:func:`read_tables` (:mod:`phsafe.release`), :func:`postprocess_release`, :func:`read_estimates`.
Planning and accuracy: :func:`plan`, :func:`run_accuracy`, :func:`synthesize` (synthetic inputs of
any size). Progress: :class:`Progress` (:mod:`phsafe.progress`). Errors: :class:`PHSafeError` and
its kinds.

The library is Prefect-free and organised by pipeline stage (``config``, ``reader``,
``preprocess``, ``truncation``, ``tabulate``, ``counting``, ``noise``, ``outputs``, ``engine``,
``ledger``, ``audit``, ``validation``, ...); the command line (:mod:`phsafe.cli`) and the Prefect
flows (``flows/`` in the repository) are thin layers over it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, str]] = {
    # runs and ledgers
    "validate": ("phsafe.api", "validate"),
    "init_ledger": ("phsafe.api", "init_ledger"),
    "run_private": ("phsafe.api", "run_private"),
    "run_nonprivate": ("phsafe.api", "run_nonprivate"),
    "verify_ledger": ("phsafe.api", "verify_ledger"),
    "audit_public": ("phsafe.api", "audit_public"),
    "generate_signing_key": ("phsafe.signing", "generate_signing_key"),
    # releases
    "read_release": ("phsafe.release", "read_release"),
    "read_tables": ("phsafe.release", "read_tables"),
    "read_estimates": ("phsafe.api", "read_estimates"),
    "postprocess_release": ("phsafe.postprocess", "postprocess"),  # phsafe.postprocess is the package
    "write_datapackage": ("phsafe.datapackage", "write_datapackage"),
    # planning, accuracy, synthetic data
    "plan": ("phsafe.planner", "plan"),
    "run_accuracy": ("phsafe.accuracy", "run_accuracy"),
    "synthesize": ("phsafe.synthetic", "synthesize"),
    # progress
    "Progress": ("phsafe.progress", "Progress"),
    # errors
    "PHSafeError": ("phsafe.errors", "PHSafeError"),
    "ConfigError": ("phsafe.errors", "ConfigError"),
    "InputError": ("phsafe.errors", "InputError"),
    "BudgetError": ("phsafe.errors", "BudgetError"),
    "AlreadyReleasedError": ("phsafe.errors", "AlreadyReleasedError"),
    "LedgerError": ("phsafe.errors", "LedgerError"),
    "ValidationFailed": ("phsafe.errors", "ValidationFailed"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'phsafe' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return list(__all__)
