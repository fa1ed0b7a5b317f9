"""The broker table: registrations, liveness by heartbeat age, and the routes that follow.

Pure: no I/O and no awaits. Time comes from an injectable monotonic clock, so tests drive
expiry with a fake one. A broker counts as live while its last heartbeat is at most
``broker_expiry_s`` old; every query looks at live brokers only, so a silent broker leaves
the answers the moment it expires, whether or not :meth:`Registry.expire` has swept it
from memory yet.

Sessions: a registration may name the session (a nameserver-local number for one open
``Session`` stream) it arrived on. The newest session to register a broker owns it;
:meth:`Registry.end_session` removes the broker only for its owner, so a stale stream
closing late never removes a broker that has reconnected. Unary registrations keep the
owner they find.

Collisions: while a broker is live, a registration of the same (group, id) from another
data address is refused, whoever sends it: it is a second process configured with the
same identity, or someone taking the broker's place in the routes. The broker itself
re-registers from its own address (a new session after a reconnect, or a restart on the
same port); one that moved waits until the old entry's session ends or it expires.

Masters and epochs: at most one live master per group. A master registering a higher
epoch than a live master of its group fences that master out (it is removed); a master
registering an epoch no higher than another live master's is refused. Slaves are never
refused for their epoch: they learn a new one after the fact.

Controlled groups: once the failover controller has committed a :class:`GroupControl` for
a group (:meth:`Registry.set_control`), it alone says who the master is. A controlled
broker reporting MASTER counts as master in routes only if it is the controller's master
at the controller's epoch, or reports a higher epoch than this nameserver's controller
knows (only the controller makes masters, so this nameserver is the one behind: cut off
from the Raft majority that elected it); any other is shown as a slave, so a stale or
isolated old master never gets producers through routes. Controlled brokers are neither refused nor
fenced for their role or epoch: an old master must stay registered to hear, in the answer
to its heartbeat, that it was replaced.

Ordering is deterministic (groups by name, the master then slaves by id), so every
nameserver told the same things answers the same.

Cost: a route looks only at the groups that serve its topic (an index kept as brokers
register and leave), not at every group: clients ask for routes in proportion to their
number, so a route that cost one step per group would make the nameserver's work grow
with clients times groups. And a topic's route is built once and kept until something it
shows changes: every change to what a group's routes show (a broker arriving, leaving or
coming back, its role, epoch, addresses, room, permission or topics, a controller commit)
moves that group's generation; a kept route holds while the groups serving its topic are
the same, at the generations it was built at, and every broker it looked at is live. A
heartbeat that changes nothing a route shows (the steady state: only a broker's
commit-log offset and in-sync ids move) keeps every route.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from metaq.common.model import (
    BrokerAddress,
    BrokerKey,
    BrokerState,
    BrokerView,
    ClusterInfo,
    GroupControl,
    GroupRoute,
    GroupView,
    Role,
    TopicConfig,
    TopicRoute,
)
from metaq.nameserver.assignment import QueueRef

Clock = Callable[[], float]

FORGET_DEPARTED_AFTER_S: Final = 3600.0
"""How long a broker that left is still shown (down): long enough for an operator to
notice, short enough that one taken out of service on purpose stops being shown."""


@dataclass(frozen=True, slots=True)
class Registered:
    """What a registration answers: the group as the routes now see it."""

    master_data_address: str
    epoch: int
    # Brokers this registration pushed out of the routes (lower-epoch masters).
    fenced: tuple[BrokerKey, ...] = ()


class RegistrationRefused(Exception):
    """The registration contradicts the live brokers of its group (epoch, master, cluster).

    Retrying the same registration fails the same way until the group changes (the other
    master leaves or the broker learns the new epoch).
    """


# eq=False: entries compare by identity ("is this the master?"), never by their tables.
@dataclass(slots=True, eq=False)
class _Entry:
    state: BrokerState
    topics: Mapping[str, TopicConfig]
    last_heartbeat: float
    session: int | None


class Registry:
    """Brokers by group, with what each serves and when it last spoke."""

    def __init__(self, broker_expiry_s: float, clock: Clock = time.monotonic) -> None:
        if broker_expiry_s <= 0:
            raise ValueError("broker_expiry_s must be positive")
        self.broker_expiry_s = broker_expiry_s
        self._clock = clock
        self._groups: dict[str, dict[int, _Entry]] = {}
        self._controls: dict[str, GroupControl] = {}
        self._departed: dict[BrokerKey, tuple[BrokerState, float]] = {}
        """Brokers that left, with when (see :meth:`departed`)."""
        self._serving: dict[str, set[str]] = {}
        """Topic -> the groups with a registered broker (live or not yet swept) that
        serves it: where :meth:`route` looks."""
        self._generations: dict[str, int] = {}
        """Group -> a number that moves with every change its routes could show (see the
        module docstring); kept after the group leaves, so one that comes back moves on."""
        self._routes: dict[str, _KeptRoute] = {}

    # --- changes ----------------------------------------------------------------------

    def register(
        self,
        state: BrokerState,
        topics: Mapping[str, TopicConfig],
        *,
        session: int | None = None,
        changed: Iterable[str] = (),
    ) -> Registered:
        """Record (or refresh) a broker and its whole topic table; counts as a heartbeat.

        ``topics`` is kept as given (not copied): pass a mapping nobody mutates later,
        except the caller of the next registration, which names the topics it put or
        removed since in ``changed``; only those are indexed again (a session's table
        changed by one topic costs one topic's work, not the table's).
        Raises :class:`RegistrationRefused` when the group's live brokers contradict it.
        """
        now = self._clock()
        key = state.key
        group = self._groups.get(key.broker_name, {})
        peers = [
            e
            for broker_id, e in group.items()
            if broker_id != key.broker_id and self._alive(e, now)
        ]
        for peer in peers:
            if peer.state.cluster != state.cluster:
                raise RegistrationRefused(
                    f"broker {key} registers in cluster {state.cluster!r}, but group "
                    f"{key.broker_name!r} is in cluster {peer.state.cluster!r} "
                    f"(broker {peer.state.key}); a group belongs to one cluster"
                )
        existing = group.get(key.broker_id)
        if (
            existing is not None
            and self._alive(existing, now)
            and existing.state.data_address != state.data_address
        ):
            age_s = max(0.0, now - existing.last_heartbeat)
            raise RegistrationRefused(
                f"broker {key} is registered and live at {existing.state.data_address} "
                f"(heard from {age_s:.1f} s ago); a registration of the same broker from "
                f"{state.data_address} is refused until that one's session ends or it is "
                f"silent for {self.broker_expiry_s:g} s. Two brokers configured with the "
                "same broker_name and broker_id? Give each its own broker_id"
            )
        fenced: list[BrokerKey] = []
        if state.role is Role.MASTER and not state.controlled:
            for peer in peers:
                if peer.state.role is not Role.MASTER:
                    continue
                if peer.state.epoch >= state.epoch:
                    raise RegistrationRefused(
                        f"broker {key} claims master of {key.broker_name!r} at epoch "
                        f"{state.epoch}, but broker {peer.state.key} is its master at epoch "
                        f"{peer.state.epoch}; a new master needs a higher epoch, an old one "
                        "must rejoin as a slave"
                    )
                fenced.append(peer.state.key)
        if (
            fenced
            or existing is None
            or not self._alive(existing, now)
            or existing.topics is not topics
            or changed
            or _route_facts(existing.state) != _route_facts(state)
        ):
            self._moved(key.broker_name)
        for fenced_key in fenced:
            self._unindex(key.broker_name, group.pop(fenced_key.broker_id).topics, group)
        owner = session if session is not None else (existing.session if existing else None)
        group[key.broker_id] = _Entry(state, topics, now, owner)
        self._groups[key.broker_name] = group
        if existing is None or existing.topics is not topics:
            if existing is not None:
                self._unindex(key.broker_name, existing.topics, group)
            for topic in topics:
                self._serving.setdefault(topic, set()).add(key.broker_name)
        else:
            for topic in changed:
                if topic in topics:
                    self._serving.setdefault(topic, set()).add(key.broker_name)
                else:
                    self._unindex(key.broker_name, (topic,), group)
        self._departed.pop(key, None)
        live = self._live(group, now)
        master = self._master(key.broker_name, live)
        return Registered(
            master_data_address=master.state.data_address if master else "",
            epoch=max(e.state.epoch for e in live),
            fenced=tuple(fenced),
        )

    def unregister(self, key: BrokerKey) -> bool:
        """Remove a broker at once; True if it was registered (live or not yet swept)."""
        group = self._groups.get(key.broker_name)
        if group is None or key.broker_id not in group:
            return False
        entry = group.pop(key.broker_id)
        self._moved(key.broker_name)
        self._departed[key] = (entry.state, self._clock())
        self._unindex(key.broker_name, entry.topics, group)
        if not group:
            del self._groups[key.broker_name]
        return True

    def set_control(self, control: GroupControl) -> None:
        """The controller committed ``control`` for its group: routes follow it from now on."""
        self._controls[control.broker_name] = control
        self._moved(control.broker_name)

    def end_session(self, key: BrokerKey, session: int) -> bool:
        """A session stream ended: remove its broker if that session still owns it."""
        entry = self._groups.get(key.broker_name, {}).get(key.broker_id)
        if entry is None or entry.session != session:
            return False
        return self.unregister(key)

    def expire(self) -> list[BrokerKey]:
        """Forget brokers silent for longer than the expiry; return them, sorted."""
        now = self._clock()
        gone = sorted(
            entry.state.key
            for group in self._groups.values()
            for entry in group.values()
            if not self._alive(entry, now)
        )
        for key in gone:
            self.unregister(key)
        return gone

    # --- queries ------------------------------------------------------------------------

    def heard(self, broker_name: str, broker_id: int) -> tuple[BrokerState, float] | None:
        """A live broker's state as it last registered, and how long ago that was (s);
        None when it is not registered or not live. A lookup, for every group at once."""
        entry = self._groups.get(broker_name, {}).get(broker_id)
        now = self._clock()
        if entry is None or not self._alive(entry, now):
            return None
        return entry.state, max(0.0, now - entry.last_heartbeat)

    def is_live(self, key: BrokerKey) -> bool:
        entry = self._groups.get(key.broker_name, {}).get(key.broker_id)
        return entry is not None and self._alive(entry, self._clock())

    def control(self, broker_name: str) -> GroupControl | None:
        """The controller's last committed state of the group, if it manages it."""
        return self._controls.get(broker_name)

    def data_address(self, key: BrokerKey) -> str:
        """The broker's data address while it is live, else empty."""
        entry = self._groups.get(key.broker_name, {}).get(key.broker_id)
        if entry is None or not self._alive(entry, self._clock()):
            return ""
        return entry.state.data_address

    def group_names(self) -> list[str]:
        """Every group with a registered broker (live or not yet swept), sorted."""
        return sorted(self._groups)

    def has_master(self, broker_name: str) -> bool:
        """Whether the group's routes have a master to write to now (see ``_master``)."""
        group = self._groups.get(broker_name)
        if not group:
            return False
        return self._master(broker_name, self._live(group, self._clock())) is not None

    def members(self, broker_name: str) -> list[BrokerView]:
        """The group's live brokers by id, with how long ago each was heard from."""
        now = self._clock()
        return [self._view(e, now) for e in self._live(self._groups.get(broker_name, {}), now)]

    def route(self, topic: str) -> TopicRoute | None:
        """The live groups serving ``topic``, by name; None when there are none. The same
        object as the last answer while nothing it shows has changed (callers may keep
        what they derive from it by identity)."""
        now = self._clock()
        kept = self._routes.get(topic)
        if kept is not None and self._holds(kept, topic, now):
            return kept.route
        route = self.built_route(topic, now)
        if len(self._routes) >= MAX_KEPT_ROUTES:
            self._routes.clear()
        serving = self._serving.get(topic, set())
        self._routes[topic] = _KeptRoute(
            route,
            frozenset(serving),
            tuple((name, self._generations.get(name, 0)) for name in serving),
            tuple(
                (group, broker_id)
                for group in (self._groups[name] for name in serving)
                for broker_id, entry in group.items()
                if self._alive(entry, now)
            ),
        )
        return route

    def built_route(self, topic: str, now: float) -> TopicRoute | None:
        """``topic``'s route built afresh (what :meth:`route` keeps)."""
        groups: list[GroupRoute] = []
        for name in sorted(self._serving.get(topic, ())):
            live = self._live(self._groups[name], now)
            holders = [e for e in live if topic in e.topics]
            if holders:
                groups.append(self._group_route(name, topic, live, holders))
        if not groups:
            return None
        return TopicRoute(topic=topic, groups=tuple(groups))

    def topics(self) -> list[str]:
        """Every topic some live broker serves, sorted."""
        now = self._clock()
        names: set[str] = set()
        for group in self._groups.values():
            for entry in self._live(group, now):
                names.update(entry.topics)
        return sorted(names)

    def departed(self) -> list[BrokerView]:
        """Brokers that left (their session ended, they went silent past the expiry or
        unregistered) within the last ``FORGET_DEPARTED_AFTER_S`` and have not come
        back, by key, as they last registered (``down``, aged since they left): admin views
        show them down rather than not at all."""
        now = self._clock()
        old = [k for k, (_, at) in self._departed.items() if now - at > FORGET_DEPARTED_AFTER_S]
        for key in old:
            del self._departed[key]
        return [
            BrokerView(state, max(0.0, now - at), down=True)
            for _, (state, at) in sorted(self._departed.items())
        ]

    def cluster_info(self, cluster: str = "") -> list[ClusterInfo]:
        """Live brokers by cluster, group and id; only ``cluster`` when it is not empty."""
        now = self._clock()
        by_cluster: dict[str, list[GroupView]] = {}
        for name in sorted(self._groups):
            live = self._live(self._groups[name], now)
            if not live:
                continue
            head = self._head(name, live)
            if cluster and head.state.cluster != cluster:
                continue
            views = tuple(self._view(e, now) for e in live)
            by_cluster.setdefault(head.state.cluster, []).append(
                GroupView(
                    broker_name=name,
                    epoch=max(e.state.epoch for e in live),
                    computer_room=head.state.computer_room,
                    brokers=views,
                )
            )
        return [ClusterInfo(cluster=c, groups=tuple(by_cluster[c])) for c in sorted(by_cluster)]

    # --- helpers ------------------------------------------------------------------------

    def _unindex(self, name: str, topics: Iterable[str], group: Mapping[int, _Entry]) -> None:
        """``topics`` left group ``name`` (whose entries are now ``group``) unless
        another of its brokers serves them."""
        for topic in topics:
            if any(topic in e.topics for e in group.values()):
                continue
            serving = self._serving.get(topic)
            if serving is not None:
                serving.discard(name)
                if not serving:
                    del self._serving[topic]

    def _moved(self, name: str) -> None:
        self._generations[name] = self._generations.get(name, 0) + 1

    def _holds(self, kept: _KeptRoute, topic: str, now: float) -> bool:
        """Whether a kept route is still what :meth:`built_route` would build."""
        serving = self._serving.get(topic, set())
        if serving != kept.serving:
            return False
        generations = self._generations
        if any(generations.get(name, 0) != generation for name, generation in kept.generations):
            return False
        # Unchanged groups have the same entries; one kept live may have gone silent
        # (one that was not live can only come back by registering, which moves).
        for group, broker_id in kept.watched:
            entry = group.get(broker_id)
            if entry is None or not self._alive(entry, now):
                return False
        return True

    def _alive(self, entry: _Entry, now: float) -> bool:
        return now - entry.last_heartbeat <= self.broker_expiry_s

    def _live(self, group: Mapping[int, _Entry], now: float) -> list[_Entry]:
        return [group[i] for i in sorted(group) if self._alive(group[i], now)]

    @staticmethod
    def _view(entry: _Entry, now: float) -> BrokerView:
        return BrokerView(
            state=entry.state,
            last_heartbeat_age_s=max(0.0, now - entry.last_heartbeat),
            session_open=entry.session is not None,
            topic_count=len(entry.topics),
        )

    def _master(self, name: str, live: Iterable[_Entry]) -> _Entry | None:
        control = self._controls.get(name)
        masters = [
            e
            for e in live
            if e.state.role is Role.MASTER
            and (
                control is None
                or not e.state.controlled
                or (e.state.key.broker_id, e.state.epoch) == (control.master_id, control.epoch)
                # Only the controller makes masters: one at a higher epoch than this
                # nameserver knows was elected by a majority it has not heard from (it
                # is cut off from the Raft leader, or behind).
                or e.state.epoch > control.epoch
            )
        ]
        if not masters:
            return None
        return min(masters, key=lambda e: (-e.state.epoch, e.state.key.broker_id))

    def _head(self, name: str, live: list[_Entry]) -> _Entry:
        """The broker that speaks for the group: its master, else its lowest id."""
        return self._master(name, live) or live[0]

    def _group_route(
        self, name: str, topic: str, live: list[_Entry], holders: list[_Entry]
    ) -> GroupRoute:
        master = self._master(name, live)
        writer = master if master is not None and master in holders else None
        source = writer or holders[0]
        config = source.topics[topic]
        permission = config.permission.restrict(source.state.permission)
        if writer is None:
            permission = permission.without_writes()
        ordered = sorted(holders, key=lambda e: (e is not writer, e.state.key.broker_id))
        head = self._head(name, live)
        return GroupRoute(
            cluster=head.state.cluster,
            broker_name=name,
            epoch=max(e.state.epoch for e in live),
            computer_room=head.state.computer_room,
            brokers=tuple(
                BrokerAddress(
                    broker_id=e.state.key.broker_id,
                    # A master the routes do not take (see the module docstring) is shown
                    # as what it is to clients: a copy to read from, not to write to.
                    role=Role.MASTER if e is master else Role.SLAVE,
                    data_address=e.state.data_address,
                    http_address=e.state.http_address,
                    computer_room=e.state.computer_room,
                )
                for e in ordered
            ),
            read_queues=config.read_queues,
            write_queues=config.write_queues,
            permission=permission,
            ordered=config.ordered,
        )


@dataclass(frozen=True, slots=True)
class _KeptRoute:
    route: TopicRoute | None
    serving: frozenset[str]
    generations: tuple[tuple[str, int], ...]
    """Each serving group's generation when it was built."""
    watched: tuple[tuple[Mapping[int, _Entry], int], ...]
    """The brokers live when it was built: (their group's entries, id)."""


MAX_KEPT_ROUTES: Final = 100_000
"""Routes kept at most (one per topic asked for): a bound on memory against clients
asking for ever new topic names; past it the kept routes start again from none."""


def _route_facts(state: BrokerState) -> tuple[object, ...]:
    """What of a broker's state its group's routes show (see ``_group_route``, ``_master``
    and ``_head``): a heartbeat that changes none of it keeps every route."""
    return (
        state.cluster,
        state.role,
        state.epoch,
        state.controlled,
        state.permission,
        state.data_address,
        state.http_address,
        state.computer_room,
    )


def readable_queues(route: TopicRoute) -> list[QueueRef]:
    """The queues consumers share out: every read queue of every readable group, sorted."""
    return sorted(
        QueueRef(broker=group.broker_name, queue_id=queue_id, room=group.computer_room)
        for group in route.groups
        if group.permission.readable
        for queue_id in range(group.read_queues)
    )
