"""The controller's replicated state machine: the transitions of a group's GroupControl.

Pure and deterministic: every nameserver applies the same Raft log entries through these
functions and so holds the same state. Each transition names the state it expects (no
state yet, or the epoch it was decided at), so a proposal made from a view that has since
changed — a stale leader's, a second proposal for the same failure, a switchover racing a
failover — is refused instead of applied on top of news it did not see.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from metaq.common.model import GroupControl


@dataclass(frozen=True, slots=True)
class Refused:
    """A transition that did not apply, and why (the state is unchanged)."""

    why: str


Outcome = GroupControl | Refused


def in_sync_set(ids: Iterable[int]) -> tuple[int, ...]:
    """The canonical form of an in-sync set: ascending, no repeats."""
    return tuple(sorted(set(ids)))


def bootstrap(
    current: GroupControl | None, broker_name: str, master_id: int, epoch: int, reason: str
) -> Outcome:
    """The controller's first decision for a group: ``master_id`` at ``epoch``, alone in sync."""
    if current is not None:
        return Refused(f"group {broker_name!r} already has a master (epoch {current.epoch})")
    if epoch < 1:
        return Refused(f"group {broker_name!r}: a bootstrap epoch must be at least 1, not {epoch}")
    return GroupControl(broker_name, epoch, master_id, (master_id,), reason)


def elect(
    current: GroupControl | None,
    broker_name: str,
    master_id: int,
    expected_epoch: int,
    in_sync_ids: Iterable[int],
    reason: str,
) -> Outcome:
    """A new master at the next epoch, if the group is still at ``expected_epoch``."""
    if current is None:
        return Refused(f"group {broker_name!r} has no controller state to elect from")
    if current.epoch != expected_epoch:
        return Refused(
            f"group {broker_name!r} is at epoch {current.epoch}, not {expected_epoch}: "
            "the election was decided on an older state"
        )
    if master_id == current.master_id:
        return Refused(f"broker {broker_name}/{master_id} is already the master")
    isr = in_sync_set(in_sync_ids)
    if master_id not in isr:
        return Refused(f"the new master {master_id} must be in its in-sync set {list(isr)}")
    if not set(isr) <= set(current.in_sync_ids):
        # A broker outside the committed set may lack acknowledged records: it must not
        # be electable, nor counted as a copy, before the new master has seen it caught up.
        return Refused(
            f"the new in-sync set {list(isr)} holds brokers outside the committed one "
            f"{list(current.in_sync_ids)}"
        )
    return GroupControl(broker_name, current.epoch + 1, master_id, isr, reason)


def set_isr(
    current: GroupControl | None,
    broker_name: str,
    epoch: int,
    in_sync_ids: Iterable[int],
    reason: str,
) -> Outcome:
    """Replace the in-sync set at ``epoch``; the master must stay a member."""
    if current is None:
        return Refused(f"group {broker_name!r} has no controller state")
    if current.epoch != epoch:
        return Refused(f"group {broker_name!r} is at epoch {current.epoch}, not {epoch}")
    isr = in_sync_set(in_sync_ids)
    if current.master_id not in isr:
        return Refused(f"the in-sync set {list(isr)} must hold the master {current.master_id}")
    if isr == current.in_sync_ids:
        return Refused(f"group {broker_name!r} already has in-sync set {list(isr)}")
    return GroupControl(broker_name, epoch, current.master_id, isr, reason)
