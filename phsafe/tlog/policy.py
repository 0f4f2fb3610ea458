"""Witness policies: which witnesses a log's checkpoints need, and how many (pure; apart from the verifier).

:func:`~phsafe.tlog.checkpoint.verify_checkpoint` counts the cosignatures of whatever keys and
quorum it is given. Which keys and quorum are *acceptable* is a policy, decided here, once, for
the ledger's side (``ledger init``, ``ledger migrate``, the witness list a ledger reads) and the
outsider's (``audit public``, ``audit monitor``).

The rule: **any two quorums share a witness**. With N witnesses and a quorum of K, two quorums
of K witnesses each intersect exactly when K > N/2 (two disjoint sets of K need 2K <= N
witnesses). The trust assumption of the log is that *every quorum holds at least one honest
witness* -- one that keeps its state and never cosigns a checkpoint that does not extend the
last one it cosigned. Under K > N/2, if the log got two conflicting histories cosigned, the two
quorums share a witness that cosigned both, which an honest witness never does; so at most one
history of the log can be cosigned by a quorum, whoever asks for which. With K <= N/2 the
operator can point two copies of the enclave at two disjoint sets of witnesses and get both
histories cosigned by honest witnesses, each of which saw only one: the policy itself allows the
split view, so it is refused.

A policy without witnesses (N = 0, K = 0) is allowed where the caller allows it; it is the
explicit absence of the protection, said in words wherever it is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from phsafe.errors import QuorumPolicyError
from phsafe.tlog.note import Verifier

RULE = "any two quorums must share a witness (a quorum K > N/2 of the N witnesses)"
"""The rule, in the words every refusal uses."""


def smallest_quorum(count: int) -> int:
    """The smallest quorum of ``count`` witnesses that any other quorum intersects: N // 2 + 1."""
    return count // 2 + 1 if count else 0


def check_quorum(quorum: int, count: int) -> None:
    """Refuse a quorum of ``quorum`` out of ``count`` witnesses that cannot be met or need not
    intersect another quorum (see the module docstring).

    Raises:
        QuorumPolicyError: One line naming the rule.
    """
    if isinstance(quorum, bool) or not isinstance(quorum, int):
        raise QuorumPolicyError(f"a witness quorum is a whole number, not {quorum!r}")
    if count == 0:
        if quorum != 0:
            raise QuorumPolicyError(f"a witness quorum of {quorum} needs witnesses; there are none")
        return
    if not 1 <= quorum <= count:
        raise QuorumPolicyError(f"a witness quorum of {quorum} of {count} witnesses cannot be met")
    if 2 * quorum <= count:
        raise QuorumPolicyError(
            f"a witness quorum of {quorum} of {count} is refused: {RULE}, here at least {smallest_quorum(count)} of "
            f"{count}; otherwise two disjoint sets of {quorum} could each cosign a different history of the log")


@dataclass(frozen=True)
class WitnessPolicy:
    """The witnesses of a log and how many of them must cosign a checkpoint (K > N/2)."""

    witnesses: tuple[Verifier, ...]
    quorum: int

    @classmethod
    def of(cls, witnesses: Sequence[Verifier], quorum: int | None = None) -> "WitnessPolicy":
        """The policy of ``witnesses`` with ``quorum`` (default: all of them).

        Raises:
            QuorumPolicyError: A key is given twice, or the quorum breaks :data:`RULE`.
        """
        keys = [w.public_key for w in witnesses]
        if len(set(keys)) != len(keys):
            raise QuorumPolicyError("a witness key is given twice: one witness counts once")
        k = len(keys) if quorum is None else quorum
        check_quorum(k, len(keys))
        return cls(tuple(witnesses), k)

    def at_least(self, asked: int | None) -> int:
        """The quorum an outsider applies when asking for ``asked`` (None: the policy's own):
        more is allowed, never fewer; a policy made before the rule (K <= N/2) is raised to the
        smallest intersecting quorum.

        Raises:
            QuorumPolicyError: ``asked`` is below that floor, or above the number of witnesses.
        """
        floor = max(self.quorum, smallest_quorum(len(self.witnesses)))
        if asked is None:
            return floor
        if asked < floor:
            raise QuorumPolicyError(
                f"--witness-quorum {asked} is below the log's policy ({self.quorum} of {len(self.witnesses)}"
                + (f", raised to {floor} by the rule: {RULE}" if floor != self.quorum else "")
                + f"): an outsider may ask for more cosignatures, never fewer; --no-witness is the explicit "
                  "opt-out")
        if asked > len(self.witnesses):
            raise QuorumPolicyError(f"--witness-quorum {asked} cannot be met by the log's {len(self.witnesses)} "
                                    "witnesses")
        return asked
