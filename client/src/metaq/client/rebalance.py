"""Rebalance arithmetic for push consumers: merging membership answers, diffing assignments.

Pure functions, no I/O. A consumer heartbeats every broker serving its topics and each
broker answers with the group's members it knows; :func:`merge_members` turns those
answers into the one sorted member list the consumer asks the nameserver to assign
over, and :func:`merge_holdings` their reports of the queues each member runs (for the
sticky strategy). :func:`plan_rebalance` compares the queues a consumer runs with the
queues it was just assigned and says which loops to stop, which to start, and which keep
running with a new route (the queue's broker moved, say after a failover).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeAlias, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Member(NamedTuple):
    """One live consumer of a group, as brokers report it."""

    client_id: str
    computer_room: str


def merge_members(answers: Iterable[Iterable[Member]]) -> tuple[Member, ...]:
    """The union of several brokers' member lists, sorted by client id.

    A member one broker has not heard from yet (it just joined) is still a member: brokers
    learn of a new consumer one by one, and the union reaches the full group as soon as
    any of them has. A client id reported with two rooms (it was restarted elsewhere)
    keeps the greatest room label, so every consumer merging the same answers agrees.
    """
    rooms: dict[str, str] = {}
    for answer in answers:
        for member in answer:
            known = rooms.get(member.client_id)
            if known is None or member.computer_room > known:
                rooms[member.client_id] = member.computer_room
    return tuple(Member(client_id, rooms[client_id]) for client_id in sorted(rooms))


HeldQueue: TypeAlias = tuple[str, str, int]
"""(topic, broker group, queue id) of a queue a member runs."""


class Holdings(NamedTuple):
    """The queues one member reported running, as a broker answers it."""

    version: int
    """Raised by the member at each change; 0 when it reported none to that broker."""
    queues: tuple[HeldQueue, ...]


def merge_holdings(answers: Iterable[Mapping[str, Holdings]]) -> dict[str, Holdings]:
    """Each member's latest report of what it holds, out of several brokers' answers.

    A member reports to every broker in turn, so brokers can hold reports of different
    ages; the highest version is the latest. Equal versions with different queues (a
    restarted member counting again from 1 under the same id) resolve to the greatest
    queue tuple, so every consumer merging the same answers agrees.
    """
    merged: dict[str, Holdings] = {}
    for answer in answers:
        for client_id, holdings in answer.items():
            known = merged.get(client_id)
            if known is None or (holdings.version, holdings.queues) > known:
                merged[client_id] = holdings
    return merged


@dataclass(frozen=True, slots=True)
class RebalancePlan(Generic[K, V]):
    """What to change to go from the queues a consumer runs to the ones it was assigned."""

    added: dict[K, V]
    """Assigned now, not running: start a loop (from the committed offset)."""
    removed: tuple[K, ...]
    """Running, no longer assigned: commit, then stop the loop."""
    rerouted: dict[K, V]
    """Running and still assigned, but the route changed (another broker address)."""

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.rerouted)


def plan_rebalance(current: Mapping[K, V], target: Mapping[K, V]) -> RebalancePlan[K, V]:
    """Diff the running queues (``current``) against the assignment (``target``).

    Both map a queue's identity (topic, broker group, queue id) to its route. A queue in
    both with an equal route is left alone: rebalancing never restarts a loop it keeps.
    """
    added = {key: route for key, route in target.items() if key not in current}
    removed = tuple(key for key in current if key not in target)
    rerouted = {
        key: route for key, route in target.items() if key in current and current[key] != route
    }
    return RebalancePlan(added, removed, rerouted)
