"""The one apply: a line checked against every rule, then added to the state.

The same :func:`apply` builds the state when a ledger is opened, checks every entry before it is
appended (:meth:`phsafe.ledger.store.LedgerFile.append_entries`), and verifies a ledger for the
auditors (:func:`phsafe.ledger.store.read_ledger`, ``phsafe audit verify``): a ledger is valid
exactly when replaying it from the first line succeeds. It works on bytes in memory; reading the
file is :mod:`phsafe.ledger.store`'s.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from phsafe.errors import LedgerError, LedgerRuleViolation, TornTailError
from phsafe.ledger.first_format import FIRST_FORMAT_RULES
from phsafe.ledger.format import EntryKind, parse_line
from phsafe.ledger.rules import RULES, Commit
from phsafe.ledger.state import LedgerState


def parse(state: LedgerState, line: bytes) -> dict[str, Any]:
    """Decode ``line`` as the next entry of ``state``'s ledger and check its encoding and chain.

    Raises:
        LedgerError: naming the entry and what is wrong with it.
    """
    return parse_line(line, seq=state.size, prev=state.head_hash, format=state.format)


def check(state: LedgerState, entry: Mapping[str, Any]) -> Commit:
    """Check a parsed entry against the rules of its kind; return the update that applies it.

    The rules are those of :data:`~phsafe.ledger.rules.RULES`, or of the first format
    (:data:`~phsafe.ledger.first_format.FIRST_FORMAT_RULES`) while the ledger has no policy.

    Raises:
        LedgerError: naming the entry and the rule it breaks.
    """
    kind = EntryKind(entry["kind"])
    rules = RULES if state.policy is not None else FIRST_FORMAT_RULES
    try:
        # A ledger of the first format starts with its first RUN_STARTED.
        if state.size == 0 and kind not in (EntryKind.LEDGER_INIT, EntryKind.RUN_STARTED):
            raise LedgerRuleViolation("a ledger starts with LEDGER_INIT")
        return rules[kind](state, entry)
    except LedgerRuleViolation as exc:
        raise LedgerError(str(exc), seq=entry["seq"], kind=kind.value, violation=exc) from None


def apply(state: LedgerState, line: bytes) -> dict[str, Any]:
    """Check ``line`` (no trailing newline) as the next entry and add it to ``state``.

    Returns:
        The entry.

    Raises:
        LedgerError: naming the entry and the rule it breaks; ``state`` is unchanged then.
    """
    entry = parse(state, line)
    commit = check(state, entry)
    commit()
    state.entries.append(entry)
    state.lines.append(line)
    state.head_hash = entry["hash"]
    return entry


def apply_all(state: LedgerState, data: bytes, on_line: Callable[[bytes], None] | None = None) -> None:
    """Apply every complete line of ``data`` to ``state``; then, if ``data`` ends in an incomplete
    line, raise :class:`~phsafe.errors.TornTailError`. A broken complete entry is reported first: a
    torn tail is repairable, a broken entry is not.

    Args:
        on_line: Called with each line once it is applied.
    """
    cut = data.rfind(b"\n") + 1
    if cut:
        for line in data[: cut - 1].split(b"\n"):
            apply(state, line)
            if on_line is not None:
                on_line(line)
    if cut < len(data):
        raise TornTailError(
            f"the ledger ends in an incomplete entry ({len(data) - cut} bytes of an interrupted write, e.g. on "
            "a full disk or a killed process); nothing was drawn for it. Repair it with "
            "`phsafe ledger repair LEDGER`, which drops the incomplete bytes and records that it did",
            seq=state.size,
        )


def replay(data: bytes) -> LedgerState:
    """The verified state of a whole ledger given as bytes (every line, each ending in a newline).

    Raises:
        LedgerError: naming the first entry that breaks a rule (a
            :class:`~phsafe.errors.TornTailError` if the last line is incomplete).
    """
    state = LedgerState()
    apply_all(state, data)
    return state
