"""Consumer-group queue assignment: which member of a group consumes which queue.

Every nameserver works the assignment out on its own, with no coordination (no ZooKeeper
lock, no leader), so each strategy is a deterministic pure function of its inputs: the member
list, the queue list and, for the sticky strategies, the previous assignment. Inputs are sorted
first and treated as sets, so the order in which a nameserver happened to learn about members
or queues never changes the answer, and hashing uses blake2b, never ``hash()``, which Python
salts per process.

Four strategies follow RocketMQ's rebalance strategies; ``balanced_hash`` is a stateless
one that moves few queues, and ``sticky`` (the client's default) moves only a joining or
leaving member's share, given the queues each member holds:

``average`` (AllocateMessageQueueAveragely)
    Queues and members sorted; member *i* takes a contiguous block. Block sizes differ by at
    most one and the first ``len(queues) % len(members)`` members take the larger blocks.

``round_robin`` (AllocateMessageQueueAveragelyByCircle)
    Sorted queue *i* goes to sorted member *i* mod *n*. Counts differ by at most one.

``consistent_hash`` (AllocateMessageQueueConsistentHash)
    A blake2b hash ring with ``VIRTUAL_NODES`` points per member; a queue belongs to the first
    point at or after its own hash. When one member joins, the only queues that move are the
    ones it takes; when one leaves, the only queues that move are the ones it held. How many
    that is depends on the hash: ``q / n`` on average for q queues and n members counting the
    one that changed; the tests hold it under ``2q/n + 5*sqrt(q/n) + 5``.

``computer_room_first`` (AllocateMachineRoomNearby, made sticky)
    Queues are split into pools. A computer room that has both queues and members is its own
    pool, open only to the members in that room. The queues of every room with no member at
    all form one orphan pool, open to every member. Rooms are compared as plain labels, so
    ``""`` is a room like any other. Within each pool:

    * Balance (always holds): every eligible member gets ``len(pool) // k`` or that plus one
      of the pool's queues, ``k`` being the number of eligible members. Only per-pool counts
      are balanced; a member's total is the sum over its room pool and the orphan pool, so
      totals in different rooms can differ by much more than one.
    * Stickiness (within that balance): a queue stays with its previous owner if the owner is
      still a member and eligible for the queue's pool now, unless the owner holds more than
      its quota. The ``len(pool) % k`` quotas of one more go to the members that kept the most
      queues, which keeps as many queues in place as any balanced assignment can: the number
      of moved queues is the minimum over all assignments that satisfy the balance rule.
      Balance wins when the two conflict: a member that is over quota (say because the
      previous assignment came from another strategy) gives up its highest-sorting surplus
      queues.
    * Everything else (new queues, queues whose owner left or is no longer eligible, surplus)
      goes, in sorted order, to the members below quota, in sorted member order.

    Ties among members that kept equally many queues are broken, for the orphan pool, in
    favour of members with fewer queues from their own room (to even out totals a little) and
    then by consumer id; for a room pool, by consumer id.

    Consequences when the previous assignment is this strategy's own output for the same
    queues: with nothing changed, nothing moves. When one member leaves, exactly the queues
    it held move. When one member joins a room that already had members, or a room with no
    queues, it takes ``len(pool) // (k + 1)`` queues of each pool it joins and nothing else
    moves. When a member joins a room whose queues were orphaned, those queues all move to
    that room (they must), and the orphan pool rebalances with the least movement possible.

``balanced_hash`` (Maglev's table fill, per room pool)
    The pools of ``computer_room_first`` (a staffed room's queues to its own members, the
    orphaned rooms' queues to every member). Within a pool, the queues are ordered by
    their blake2b hash and each member has its own permutation of them (an offset and a
    step over a prime at least the pool's size, from the hash of its consumer id); the
    members, in consumer-id order, take turns claiming the next queue of their
    permutation not yet claimed. Every member of a pool gets ``len(pool) // k`` or one
    more, as in ``average``; but as a member's choices do not depend on who else is in
    the group, one joining or leaving moves few queues besides its own share: a few
    times that share (docs/benchmarks.md), where ``average`` moves most of the topic once
    the newcomer's id does not sort last. It needs no previous assignment, so members
    asking on their own agree; only the sticky strategies fed the group's running
    assignment move exactly the joining or leaving member's share.

``sticky`` (Kafka's CooperativeSticky, without its second round)
    ``computer_room_first``'s pools, and its stickiness within the balance, meant to be fed
    the group's running assignment as every member can read it: the push consumer reports
    the queues it runs in its heartbeats, the brokers answer every member's report, and
    those holdings are the previous assignment. Each member keeps the queues it holds up to
    its quota, giving up its highest-sorting surplus; the surplus and the queues nobody
    holds go, in sorted order, to the members below quota, in consumer-id order. The one
    difference from ``computer_room_first``: in every pool the quotas of one more go to the
    first ``len(pool) % k`` eligible members by consumer id, whatever anyone holds. The
    quotas then depend on the members and queues alone, which buys two things:

    * Members that read different snapshots of the holdings still agree. If the previous
      assignment was a partition and some members already run their new share while
      others still run their old one, the answer is the same as from the old holdings.
      Members learn each other's reports one heartbeat apart, so this is the common case
      during a rebalance, and it is where a holdings-ranked quota would disagree.
    * One member joining or leaving moves only its own share: joining, every incumbent's
      quota in every pool stays or shrinks (it gives up only surplus, all of which goes to
      the newcomer); leaving, every quota stays or grows (only the leaver's queues move).
      A member joining a room whose queues were orphaned is the exception, as above.

    The price: fed an arbitrary previous assignment (another strategy's), it may move a
    few more queues than the least possible, where ``computer_room_first`` ranks quotas by
    what members hold. With no holdings at all (a new group) it hands out sorted blocks
    by consumer id, room by room.

Previous ownership is keyed by (broker, queue id), so a broker group relabelled with a new
room keeps its consumers where the pool rules allow. A queue claimed by several previous
members counts for the lowest consumer id among them that is eligible now; claims by
non-members and for queues that no longer exist are ignored.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    """One queue of a topic: the broker group serving it, its id there, and that group's room."""

    broker: str
    queue_id: int
    room: str = ""


@dataclass(frozen=True, slots=True, order=True)
class Member:
    """One consumer of a consumer group and the computer room it runs in."""

    consumer_id: str
    room: str = ""


Assignment: TypeAlias = dict[str, list[QueueRef]]
Previous: TypeAlias = Mapping[str, Sequence[QueueRef]]


class Strategy(Protocol):
    """Members, queues and (for stickiness) the previous assignment to an assignment."""

    def __call__(
        self,
        members: Iterable[Member],
        queues: Iterable[QueueRef],
        previous: Previous | None = None,
    ) -> Assignment: ...


# RocketMQ defaults to 10 points per member, which leaves shares uneven by tens of percent;
# with 100 a member's share of the ring is within about 10% of 1/n (one standard deviation).
VIRTUAL_NODES: Final = 100

_QueueKey: TypeAlias = tuple[str, int]


def _prepare(
    members: Iterable[Member], queues: Iterable[QueueRef]
) -> tuple[list[Member], list[QueueRef]]:
    """Sort and de-duplicate; reject a consumer or a broker group placed in two rooms."""
    member_list = sorted(set(members))
    queue_list = sorted(set(queues))
    for first, second in itertools.pairwise(member_list):
        if first.consumer_id == second.consumer_id:
            raise ValueError(
                f"consumer {first.consumer_id!r} is listed in rooms {first.room!r} "
                f"and {second.room!r}"
            )
    rooms: dict[str, str] = {}
    for queue in queue_list:
        room = rooms.setdefault(queue.broker, queue.room)
        if room != queue.room:
            raise ValueError(
                f"broker group {queue.broker!r} is listed in rooms {room!r} and {queue.room!r}"
            )
    return member_list, queue_list


def _empty(members: Sequence[Member]) -> Assignment:
    # Every member appears, so a consumer told [] knows it was considered and given nothing.
    return {member.consumer_id: [] for member in members}


def _strategy(
    body: Callable[[list[Member], list[QueueRef], Previous | None], Assignment],
) -> Strategy:
    """A strategy whose ``body`` takes the members (at least one) and the queues sorted,
    de-duplicated and checked by :func:`_prepare`; with no member, nobody gets anything."""

    @functools.wraps(body)
    def strategy(
        members: Iterable[Member], queues: Iterable[QueueRef], previous: Previous | None = None
    ) -> Assignment:
        member_list, queue_list = _prepare(members, queues)
        return body(member_list, queue_list, previous) if member_list else {}

    return strategy


@_strategy
def average(
    member_list: list[Member], queue_list: list[QueueRef], previous: Previous | None
) -> Assignment:
    """Contiguous blocks in sorted order, the larger blocks first (RocketMQ averagely)."""
    result = _empty(member_list)
    base, extra = divmod(len(queue_list), len(member_list))
    start = 0
    for index, member in enumerate(member_list):
        size = base + (1 if index < extra else 0)
        result[member.consumer_id] = queue_list[start : start + size]
        start += size
    return result


@_strategy
def round_robin(
    member_list: list[Member], queue_list: list[QueueRef], previous: Previous | None
) -> Assignment:
    """Sorted queue i to sorted member i mod n (RocketMQ averagely by circle)."""
    result = _empty(member_list)
    for index, queue in enumerate(queue_list):
        result[member_list[index % len(member_list)].consumer_id].append(queue)
    return result


def _ring_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def _queue_ring_key(queue: QueueRef) -> str:
    # The id goes first: it holds no ':', so no two (broker, id) pairs share a key.
    return f"{queue.queue_id}:{queue.broker}"


@_strategy
def consistent_hash(
    member_list: list[Member], queue_list: list[QueueRef], previous: Previous | None
) -> Assignment:
    """Each queue to the member owning the next point clockwise on a blake2b hash ring."""
    result = _empty(member_list)
    # The replica number follows the last '#', so "a#1" replica 0 never collides with "a"
    # replica 10. Ties on the 64-bit hash, however unlikely, are broken by consumer id.
    ring = sorted(
        (_ring_hash(f"{member.consumer_id}#{replica}"), member.consumer_id)
        for member in member_list
        for replica in range(VIRTUAL_NODES)
    )
    points = [point for point, _ in ring]
    for queue in queue_list:
        at = bisect.bisect_left(points, _ring_hash(_queue_ring_key(queue)))
        result[ring[at % len(ring)][1]].append(queue)
    return result


def _previous_owners(previous: Previous | None) -> dict[_QueueKey, list[str]]:
    """Who claimed each queue last time, lowest consumer id first."""
    owners: dict[_QueueKey, list[str]] = {}
    if previous is None:
        return owners
    for consumer_id in sorted(previous):
        for queue in set(previous[consumer_id]):
            claimants = owners.setdefault((queue.broker, queue.queue_id), [])
            if consumer_id not in claimants:
                claimants.append(consumer_id)
    return owners


def _sticky_pool(
    eligible: Sequence[str],
    pool: Sequence[QueueRef],
    owners: Mapping[_QueueKey, Sequence[str]],
    tiebreak: Mapping[str, int],
    *,
    quotas_by_id: bool = False,
) -> Assignment:
    """Balance ``pool`` over ``eligible`` (sorted ids), keeping as many queues in place as can.

    The quotas of one more go to the members that hold the most, or with ``quotas_by_id``
    to the first members by consumer id, whatever they hold.
    """
    allowed = set(eligible)
    held: Assignment = {consumer_id: [] for consumer_id in eligible}
    loose: list[QueueRef] = []
    for queue in pool:
        claimants = owners.get((queue.broker, queue.queue_id), ())
        owner = next((c for c in claimants if c in allowed), None)
        if owner is None:
            loose.append(queue)
        else:
            held[owner].append(queue)
    base, extra = divmod(len(pool), len(eligible))
    # A quota of base+1 keeps one more queue in place only for a member already holding more
    # than base, so handing those quotas to the biggest holders maximises what stays put.
    if quotas_by_id:
        ranked = list(eligible)
    else:
        ranked = sorted(eligible, key=lambda c: (-len(held[c]), tiebreak.get(c, 0), c))
    quota = {c: base + (1 if rank < extra else 0) for rank, c in enumerate(ranked)}
    for consumer_id in eligible:
        kept = held[consumer_id]
        loose.extend(kept[quota[consumer_id] :])
        del kept[quota[consumer_id] :]
    loose.sort()
    handed = 0
    for consumer_id in eligible:
        need = quota[consumer_id] - len(held[consumer_id])
        held[consumer_id].extend(loose[handed : handed + need])
        handed += need
    return held


@_strategy
def computer_room_first(
    member_list: list[Member], queue_list: list[QueueRef], previous: Previous | None
) -> Assignment:
    """Same-room queues to same-room members, orphaned rooms to everyone; sticky and balanced."""
    return _room_pools_sticky(member_list, queue_list, previous, quotas_by_id=False)


@_strategy
def sticky(
    member_list: list[Member], queue_list: list[QueueRef], previous: Previous | None
) -> Assignment:
    """computer_room_first's pools and stickiness, fed the holdings members report."""
    return _room_pools_sticky(member_list, queue_list, previous, quotas_by_id=True)


def _room_pools(
    member_list: list[Member], queue_list: list[QueueRef]
) -> tuple[list[tuple[list[str], list[QueueRef]]], list[QueueRef]]:
    """Each staffed room's members and queues, in room order, and the queues of the rooms
    no member is in (everyone's to share)."""
    staffed = {member.room for member in member_list}
    pools = [
        (
            [member.consumer_id for member in member_list if member.room == room],
            [queue for queue in queue_list if queue.room == room],
        )
        for room in sorted({queue.room for queue in queue_list} & staffed)
    ]
    return pools, [queue for queue in queue_list if queue.room not in staffed]


def _room_pools_sticky(
    member_list: list[Member],
    queue_list: list[QueueRef],
    previous: Previous | None,
    *,
    quotas_by_id: bool,
) -> Assignment:
    result = _empty(member_list)
    owners = _previous_owners(previous)
    pools, orphans = _room_pools(member_list, queue_list)
    own_room_load: dict[str, int] = {}
    for eligible, pool in pools:
        shares = _sticky_pool(eligible, pool, owners, {}, quotas_by_id=quotas_by_id)
        for consumer_id, share in shares.items():
            result[consumer_id].extend(share)
            own_room_load[consumer_id] = len(share)
    if orphans:
        everyone = [member.consumer_id for member in member_list]
        shares = _sticky_pool(everyone, orphans, owners, own_room_load, quotas_by_id=quotas_by_id)
        for consumer_id, share in shares.items():
            result[consumer_id].extend(share)
    for share in result.values():
        share.sort()
    return result


def _prime_at_least(n: int) -> int:
    candidate = max(n, 2)
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate


def _maglev_pool(eligible: Sequence[str], pool: Sequence[QueueRef]) -> Assignment:
    """``pool`` over ``eligible`` (sorted ids): turns of claiming each one's next free queue."""
    held: Assignment = {consumer_id: [] for consumer_id in eligible}
    size = len(pool)
    if size == 0:
        return held
    slots = sorted(pool, key=lambda queue: (_ring_hash(_queue_ring_key(queue)), queue))
    prime = _prime_at_least(size)
    walks: list[tuple[list[QueueRef], int, int]] = []
    for consumer_id in eligible:
        digest = hashlib.blake2b(consumer_id.encode(), digest_size=16).digest()
        offset = int.from_bytes(digest[:8], "big") % prime
        step = int.from_bytes(digest[8:], "big") % (prime - 1) + 1
        walks.append((held[consumer_id], offset, step))
    taken = [False] * size
    position = [walk[1] for walk in walks]
    left = size
    while left:
        for index, (share, _, step) in enumerate(walks):
            # The step is below the prime, so the walk visits every slot before repeating.
            slot = position[index]
            while slot >= size or taken[slot]:
                slot = (slot + step) % prime
            taken[slot] = True
            share.append(slots[slot])
            position[index] = (slot + step) % prime
            left -= 1
            if not left:
                break
    return held


@_strategy
def balanced_hash(
    member_list: list[Member], queue_list: list[QueueRef], previous: Previous | None
) -> Assignment:
    """Room pools as computer_room_first; within each, Maglev's balanced, stable fill."""
    result = _empty(member_list)
    pools, orphans = _room_pools(member_list, queue_list)
    if orphans:
        pools.append(([member.consumer_id for member in member_list], orphans))
    for eligible, pool in pools:
        for consumer_id, share in _maglev_pool(eligible, pool).items():
            result[consumer_id].extend(share)
    for share in result.values():
        share.sort()
    return result


# Named once more in metaq.common.model.ASSIGNMENT_STRATEGIES, which clients check against.
STRATEGIES: Final[Mapping[str, Strategy]] = {
    "average": average,
    "round_robin": round_robin,
    "consistent_hash": consistent_hash,
    "computer_room_first": computer_room_first,
    "balanced_hash": balanced_hash,
    "sticky": sticky,
}


def assign(
    strategy_name: str,
    members: Iterable[Member],
    queues: Iterable[QueueRef],
    previous: Previous | None = None,
) -> Assignment:
    """Run the strategy registered as ``strategy_name``; ValueError names the known ones."""
    strategy = STRATEGIES.get(strategy_name)
    if strategy is None:
        known = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown assignment strategy {strategy_name!r}; known: {known}")
    return strategy(members, queues, previous)
