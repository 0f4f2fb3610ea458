"""The ledger's policy: caps, what runs charge against them, and their unit.

A ledger's policy (``LEDGER_INIT`` or ``LEDGER_MIGRATED``) fixes the unit every cap and charge is
counted in -- rho for zCDP, epsilon for pure DP -- and every dataset's lifetime cap. A pure-DP
spend of epsilon counts as epsilon^2/2 in a zCDP ledger; a zCDP spend has no pure-DP bound, so it
makes a pure-DP ledger's odometer infinite (see "Lifetime rule" in :mod:`phsafe.ledger.format`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from phsafe.accounting import RunPlan
from phsafe.amounts import INFINITE, Amount, add_amounts, is_infinite
from phsafe.config import PrivacyDefinition
from phsafe.errors import BudgetError, LedgerError
from phsafe.parameters import option
from phsafe.ledger.format import NAME


@dataclass(frozen=True)
class Policy:
    """What ``LEDGER_INIT`` (or ``LEDGER_MIGRATED``) fixed for the whole ledger.

    Attributes:
        ledger_id: Random id of the ledger (32 hex digits).
        privacy_defn: The unit of every cap and charge (rho for zCDP, epsilon for pure DP).
        lifetime_cap: Each dataset's cap until a ``CAP_RAISED`` raises it.
        reason: Why this policy (recorded at init).
        non_confidential: A throwaway ledger for synthetic or public data.
        key_id: Identifies the lineage key (``<ledger>.key``) without revealing it.
        seq: The entry that set the policy (0, or the ``LEDGER_MIGRATED`` entry).
        ledger_cap: The cap on all datasets' spends together, if ``ledger init`` set one.
    """

    ledger_id: str
    privacy_defn: PrivacyDefinition
    lifetime_cap: Amount
    reason: str
    non_confidential: bool
    key_id: str
    seq: int
    ledger_cap: Amount | None = None


def convert(budget: Amount, source: PrivacyDefinition, unit: PrivacyDefinition) -> Amount:
    """One measurement's budget in ``unit``: eps-DP is eps^2/2-zCDP; zCDP has no pure-DP bound."""
    if source is unit:
        return budget
    if is_infinite(budget):
        return INFINITE
    if source is PrivacyDefinition.PUREDP and unit is PrivacyDefinition.ZCDP:
        return Fraction(budget) ** 2 / 2
    return INFINITE if budget > 0 else Fraction(0)


def plan_charge(plan: RunPlan, unit: PrivacyDefinition) -> Amount:
    """What a plan reserves against its dataset, in a ledger's unit (before any re-spend)."""
    total: Amount = Fraction(0)
    for m in plan.measurements:
        total = add_amounts(total, convert(cap_amount(m.budget), plan.privacy_defn, unit))
    return total


def check_dataset_name(name: str) -> None:
    """Raise a LedgerError unless ``name`` can name a dataset (e.g. ``cef2020-us``)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise LedgerError(
            f"{name!r} is not a dataset name ({option('dataset')}): letters, digits, '.', '_' and '-', "
            "at most 128, starting with a letter or digit (e.g. cef2020-us)"
        )


def check_ledger_kind(policy: Policy, non_confidential: bool) -> None:
    """A confidential ledger takes only confidential runs; a throwaway one only non-confidential ones.

    Raises:
        LedgerError: Saying which ledger the run needs.
    """
    if policy.non_confidential and not non_confidential:
        raise LedgerError(
            "this ledger was created for non-confidential (synthetic) data; a run on confidential data "
            f"needs a ledger made with `phsafe ledger init` without --non-confidential ({option('ledger')})"
        )
    if non_confidential and not policy.non_confidential:
        raise LedgerError(
            "this ledger is for confidential data; a run declared non-confidential must use its own "
            f"throwaway ledger ({option('ledger')}), so that it cannot sidestep a production cap"
        )


def cap_amount(value: Any) -> Amount:
    """An exact amount (a cap, or a budget) from a Fraction, an int or a Decimal; never a float.

    Raises:
        BudgetError: A negative, NaN or inexact (float) value.
    """
    if isinstance(value, Decimal):
        if value.is_nan() or value < 0:
            raise BudgetError("the lifetime cap must be a non-negative number")
        return INFINITE if value.is_infinite() else Fraction(value)
    if isinstance(value, (Fraction, int)) and not isinstance(value, bool):
        if value < 0:
            raise BudgetError("the lifetime cap must be a non-negative number")
        return Fraction(value)
    raise BudgetError("the lifetime cap must be an exact number (Fraction or Decimal), not a float")


def unit_name(defn: PrivacyDefinition) -> str:
    """How messages name a ledger's unit: ``rho (zCDP)`` or ``epsilon (pure DP)``."""
    return "rho (zCDP)" if defn is PrivacyDefinition.ZCDP else "epsilon (pure DP)"
