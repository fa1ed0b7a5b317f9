"""The shared vocabulary: permissions, roles, modes, topic configs, brokers and routes, and
their wire forms.

Every member uses these types; the converters to and from the ``metaq.v1`` protobuf
messages, and to and from the broker's persisted JSON, sit beside them and nowhere else.

The enums are ``StrEnum``s whose values are the spellings every view shows (the route
JSON, the consoles, the CLI). Topic permissions have one more spelling: the broker's
``topics.json``, its replicated topic journal and its topic admin API have always said
``read`` and ``write`` for read-only and write-only; :meth:`Permission.from_text` reads
both spellings and :attr:`Permission.topic_text` writes the old one, so files and
journals stay readable by older brokers.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final, TypeVar

from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1.data_pb2 import ConsumerHeartbeatRequest

_E = TypeVar("_E")


class Permission(enum.StrEnum):
    """What clients may do with a topic's queues on a broker group, or with a whole broker.

    Mirrors ``metaq.v1.Permission`` name for name (less UNSPECIFIED, which is no
    permission at all). ``WRITE_WIPE`` reads like ``READ_ONLY`` but records that an
    operator took the writes away (the topic is being drained off a broker for
    maintenance), so it survives a restriction by anything that keeps reads.
    """

    READ_ONLY = "read-only"
    WRITE_ONLY = "write-only"
    READ_WRITE = "read-write"
    WRITE_WIPE = "write-wipe"
    NONE = "none"

    @property
    def readable(self) -> bool:
        return self in (Permission.READ_ONLY, Permission.READ_WRITE, Permission.WRITE_WIPE)

    @property
    def writable(self) -> bool:
        return self in (Permission.WRITE_ONLY, Permission.READ_WRITE)

    @property
    def wiped(self) -> bool:
        return self is Permission.WRITE_WIPE

    def restrict(self, other: Permission) -> Permission:
        """What both allow: reads if both read, writes if both write; a wipe sticks to reads."""
        return _from_flags(
            readable=self.readable and other.readable,
            writable=self.writable and other.writable,
            wiped=self.wiped or other.wiped,
        )

    def without_writes(self) -> Permission:
        """The permission of a group whose master is missing: nobody can take writes."""
        return _from_flags(readable=self.readable, writable=False, wiped=self.wiped)

    @property
    def topic_text(self) -> str:
        """The spelling of a topic's ``perm`` in the broker's files, journal and admin API."""
        return _TOPIC_TEXT.get(self, self.value)

    @classmethod
    def from_text(cls, text: str) -> Permission:
        """Either spelling (``read`` or ``read-only``); ValueError for anything else."""
        return _FROM_TOPIC_TEXT.get(text) or cls(text)

    def to_proto(self) -> pb.Permission.ValueType:
        return _PERMISSIONS_OUT[self]

    @classmethod
    def from_proto(cls, value: int) -> Permission:
        """ValueError for UNSPECIFIED and for values this version does not know."""
        return _lookup(_PERMISSIONS, value, "permission")


def _from_flags(*, readable: bool, writable: bool, wiped: bool) -> Permission:
    if readable and wiped:
        return Permission.WRITE_WIPE
    if readable and writable:
        return Permission.READ_WRITE
    if readable:
        return Permission.READ_ONLY
    if writable:
        return Permission.WRITE_ONLY
    return Permission.NONE


TOPIC_PERMISSIONS: Final = (
    Permission.READ_WRITE,
    Permission.READ_ONLY,
    Permission.WRITE_ONLY,
    Permission.WRITE_WIPE,
)
"""What a topic on a broker may be set to (a topic nobody may use is deleted instead)."""

_TOPIC_TEXT: Final = {Permission.READ_ONLY: "read", Permission.WRITE_ONLY: "write"}
_FROM_TOPIC_TEXT: Final = {text: permission for permission, text in _TOPIC_TEXT.items()}


class Role(enum.StrEnum):
    """A broker's place in its group (``metaq.v1.BrokerRole``)."""

    MASTER = "master"
    SLAVE = "slave"

    def to_proto(self) -> pb.BrokerRole.ValueType:
        return _ROLES_OUT[self]

    @classmethod
    def from_proto(cls, value: int) -> Role:
        """ValueError for UNSPECIFIED and for values this version does not know."""
        return _lookup(_ROLES, value, "broker role")


class ReplicationMode(enum.StrEnum):
    """How a master answers producers (``metaq.v1.ReplicationMode``).

    A broker that does not say (UNSPECIFIED on the wire) has no mode: ``None`` where a
    mode is optional.
    """

    ASYNC = "async"
    """A send is answered once the master holds it; slaves copy it soon after."""
    SYNC = "sync"
    """A send is answered once ``min_in_sync_replicas`` copies hold it (double write)."""

    def to_proto(self) -> pb.ReplicationMode.ValueType:
        return _MODES_OUT[self]

    @classmethod
    def from_proto(cls, value: int) -> ReplicationMode | None:
        """None for UNSPECIFIED; ValueError for values this version does not know."""
        if value == pb.REPLICATION_MODE_UNSPECIFIED:
            return None
        return _lookup(_MODES, value, "replication mode")


_PERMISSIONS: Final[Mapping[int, Permission]] = {
    pb.PERMISSION_READ_ONLY: Permission.READ_ONLY,
    pb.PERMISSION_WRITE_ONLY: Permission.WRITE_ONLY,
    pb.PERMISSION_READ_WRITE: Permission.READ_WRITE,
    pb.PERMISSION_WRITE_WIPE: Permission.WRITE_WIPE,
    pb.PERMISSION_NONE: Permission.NONE,
}
_PERMISSIONS_OUT: Final[Mapping[Permission, pb.Permission.ValueType]] = {
    Permission.READ_ONLY: pb.PERMISSION_READ_ONLY,
    Permission.WRITE_ONLY: pb.PERMISSION_WRITE_ONLY,
    Permission.READ_WRITE: pb.PERMISSION_READ_WRITE,
    Permission.WRITE_WIPE: pb.PERMISSION_WRITE_WIPE,
    Permission.NONE: pb.PERMISSION_NONE,
}
_ROLES: Final[Mapping[int, Role]] = {
    pb.BROKER_ROLE_MASTER: Role.MASTER,
    pb.BROKER_ROLE_SLAVE: Role.SLAVE,
}
_ROLES_OUT: Final[Mapping[Role, pb.BrokerRole.ValueType]] = {
    Role.MASTER: pb.BROKER_ROLE_MASTER,
    Role.SLAVE: pb.BROKER_ROLE_SLAVE,
}
_MODES: Final[Mapping[int, ReplicationMode]] = {
    pb.REPLICATION_MODE_ASYNC: ReplicationMode.ASYNC,
    pb.REPLICATION_MODE_SYNC: ReplicationMode.SYNC,
}
_MODES_OUT: Final[Mapping[ReplicationMode, pb.ReplicationMode.ValueType]] = {
    ReplicationMode.ASYNC: pb.REPLICATION_MODE_ASYNC,
    ReplicationMode.SYNC: pb.REPLICATION_MODE_SYNC,
}


def _lookup(table: Mapping[int, _E], value: int, what: str) -> _E:
    found = table.get(value)
    if found is None:
        raise ValueError(f"{what} {value} is not one of {sorted(table)}")
    return found


def _or(convert: Callable[[int], _E], value: int, default: _E) -> _E:
    try:
        return convert(value)
    except ValueError:
        return default


class ConsumeMode(enum.StrEnum):
    """How a consumer group's members share a topic (``ConsumerHeartbeatRequest.Mode``)."""

    CLUSTERING = "clustering"
    """The group's members share the queues: each message goes to one member. Offsets
    are committed to the brokers."""
    BROADCASTING = "broadcasting"
    """Every member consumes every queue. Offsets are kept in a local file per member."""

    def to_proto(self) -> ConsumerHeartbeatRequest.Mode.ValueType:
        return _CONSUME_MODES_OUT[self]

    @classmethod
    def from_proto(cls, value: int) -> ConsumeMode:
        """Clients that do not say are clustering; ValueError for values this version
        does not know."""
        if value == ConsumerHeartbeatRequest.MODE_UNSPECIFIED:
            return ConsumeMode.CLUSTERING
        return _lookup(_CONSUME_MODES, value, "consume mode")


_CONSUME_MODES: Final[Mapping[int, ConsumeMode]] = {
    ConsumerHeartbeatRequest.CLUSTERING: ConsumeMode.CLUSTERING,
    ConsumerHeartbeatRequest.BROADCASTING: ConsumeMode.BROADCASTING,
}
_CONSUME_MODES_OUT: Final[Mapping[ConsumeMode, ConsumerHeartbeatRequest.Mode.ValueType]] = {
    ConsumeMode.CLUSTERING: ConsumerHeartbeatRequest.CLUSTERING,
    ConsumeMode.BROADCASTING: ConsumerHeartbeatRequest.BROADCASTING,
}

ASSIGNMENT_STRATEGIES: Final = (
    "sticky",
    "balanced_hash",
    "average",
    "round_robin",
    "consistent_hash",
    "computer_room_first",
)
"""The names of the nameserver's queue assignment strategies, the default first
(``docs/nameserver.md``); clients check a name against these before asking."""

HOLDINGS_STRATEGIES: Final = frozenset({"sticky"})
"""The strategies a push consumer feeds the group's holdings (the queues each member
reports running in its heartbeats) as the previous assignment."""


# --- topics -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic as one broker serves it.

    A plain value: the broker checks what it accepts (names, queue counts) where configs
    come in, the nameserver checks what brokers announce.
    """

    name: str
    read_queues: int
    """Consumers read queues [0, read_queues)."""
    write_queues: int
    """Producers write queues [0, write_queues)."""
    permission: Permission = Permission.READ_WRITE
    ordered: bool = False

    def to_json(self) -> dict[str, Any]:
        """The broker's persisted form (``topics.json`` and the topic journal), by name."""
        return {
            "read_queues": self.read_queues,
            "write_queues": self.write_queues,
            "perm": self.permission.topic_text,
            "ordered": self.ordered,
        }

    @classmethod
    def from_json(cls, name: str, entry: Mapping[str, Any]) -> TopicConfig:
        """Read :meth:`to_json`'s form; KeyError or ValueError when it is not."""
        return cls(
            name=name,
            read_queues=int(entry["read_queues"]),
            write_queues=int(entry["write_queues"]),
            permission=Permission.from_text(entry["perm"]),
            ordered=bool(entry.get("ordered", False)),
        )

    def to_proto(self) -> pb.TopicConfig:
        return pb.TopicConfig(
            topic=self.name,
            read_queues=self.read_queues,
            write_queues=self.write_queues,
            permission=self.permission.to_proto(),
            ordered=self.ordered,
        )

    @classmethod
    def from_proto(cls, message: pb.TopicConfig) -> TopicConfig:
        """ValueError for a permission this version does not take."""
        return cls(
            name=message.topic,
            read_queues=message.read_queues,
            write_queues=message.write_queues,
            permission=Permission.from_proto(message.permission),
            ordered=message.ordered,
        )


@dataclass(frozen=True, slots=True)
class TopicChanges:
    """What changed in a broker's topic table since some version of it: the topics
    created or updated, with their settings now, and the names deleted."""

    put: tuple[TopicConfig, ...] = ()
    deleted: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.put or self.deleted)

    def to_proto(self) -> pb.TopicChanges:
        return pb.TopicChanges(put=[t.to_proto() for t in self.put], deleted=self.deleted)


# --- brokers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class BrokerKey:
    """A broker's identity: its group (RocketMQ's brokerName) and its id within the group."""

    broker_name: str
    broker_id: int

    def __str__(self) -> str:
        return f"{self.broker_name}/{self.broker_id}"


@dataclass(frozen=True, slots=True)
class BrokerState:
    """Who a broker is, where to reach it and how it stands (``metaq.v1.BrokerState``):
    what a broker tells the nameservers at every heartbeat, and what they keep of it.

    ``key`` names the broker's group (shared by a master and its slaves) and its id in
    the group (0 for the master as deployed).
    """

    cluster: str
    key: BrokerKey
    role: Role
    data_address: str
    http_address: str = ""
    computer_room: str = ""
    epoch: int = 0
    permission: Permission = Permission.READ_WRITE
    replication_mode: ReplicationMode | None = None
    """None: the broker does not say (UNSPECIFIED on the wire)."""
    commitlog_max_offset: int = 0
    controlled: bool = False
    """The failover controller decides this broker's role."""
    configured_master: bool = False
    """Deployed as its group's master: the controller's first choice for a new group."""
    in_sync_ids: tuple[int, ...] = ()
    """Master only: the ids it sees in sync with its log (itself included), ascending."""
    unverified: bool = False
    """Controlled brokers: its log is not checked (or not repaired) since it started."""

    @property
    def broker_name(self) -> str:
        return self.key.broker_name

    @property
    def broker_id(self) -> int:
        return self.key.broker_id

    def to_proto(self) -> pb.BrokerState:
        return pb.BrokerState(
            cluster=self.cluster,
            broker_name=self.key.broker_name,
            broker_id=self.key.broker_id,
            role=self.role.to_proto(),
            data_address=self.data_address,
            http_address=self.http_address,
            computer_room=self.computer_room,
            epoch=self.epoch,
            permission=self.permission.to_proto(),
            replication_mode=(
                pb.REPLICATION_MODE_UNSPECIFIED
                if self.replication_mode is None
                else self.replication_mode.to_proto()
            ),
            commitlog_max_offset=self.commitlog_max_offset,
            controlled=self.controlled,
            configured_master=self.configured_master,
            in_sync_ids=self.in_sync_ids,
            unverified=self.unverified,
        )

    @classmethod
    def from_proto(cls, message: pb.BrokerState) -> BrokerState:
        """ValueError for a role, permission or replication mode this version does not
        take; the in-sync ids come out ascending, each once."""
        return cls(
            cluster=message.cluster,
            key=BrokerKey(message.broker_name, message.broker_id),
            role=Role.from_proto(message.role),
            data_address=message.data_address,
            http_address=message.http_address,
            computer_room=message.computer_room,
            epoch=message.epoch,
            permission=Permission.from_proto(message.permission),
            replication_mode=ReplicationMode.from_proto(message.replication_mode),
            commitlog_max_offset=message.commitlog_max_offset,
            controlled=message.controlled,
            configured_master=message.configured_master,
            in_sync_ids=tuple(sorted(set(message.in_sync_ids))),
            unverified=message.unverified,
        )


# --- routes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupControl:
    """The failover controller's committed decision for one broker group.

    Agreed by the nameservers through Raft. ``epoch`` only grows (each election adds one);
    ``in_sync_ids`` is ascending and always holds ``master_id``. ``reason`` says why the
    last change was made, for logs; it is not on the wire. ``master_data_address`` is
    where the answering nameserver has the master registered (empty when it has not);
    it is the wire's, not part of the decision.
    """

    broker_name: str
    epoch: int
    master_id: int
    in_sync_ids: tuple[int, ...]
    reason: str = ""
    master_data_address: str = ""

    def to_proto(self, master_data_address: str = "") -> pb.GroupControl:
        return pb.GroupControl(
            broker_name=self.broker_name,
            epoch=self.epoch,
            master_id=self.master_id,
            in_sync_ids=self.in_sync_ids,
            master_data_address=master_data_address or self.master_data_address,
        )

    @classmethod
    def from_proto(cls, message: pb.GroupControl) -> GroupControl:
        return cls(
            message.broker_name,
            message.epoch,
            message.master_id,
            tuple(message.in_sync_ids),
            master_data_address=message.master_data_address,
        )


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """One broker of a group as a route shows it."""

    broker_id: int
    role: Role
    data_address: str
    http_address: str
    computer_room: str

    def to_proto(self) -> pb.BrokerAddress:
        return pb.BrokerAddress(
            broker_id=self.broker_id,
            role=self.role.to_proto(),
            data_address=self.data_address,
            http_address=self.http_address,
            computer_room=self.computer_room,
        )

    @classmethod
    def from_proto(cls, message: pb.BrokerAddress) -> BrokerAddress:
        # A role this version does not know is no master to write to.
        return cls(
            broker_id=message.broker_id,
            role=_or(Role.from_proto, message.role, Role.SLAVE),
            data_address=message.data_address,
            http_address=message.http_address,
            computer_room=message.computer_room,
        )


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """One queue of a topic: which broker group holds it and where to reach that group."""

    broker_name: str
    address: str
    queue_id: int
    computer_room: str

    def __str__(self) -> str:
        return f"{self.broker_name}:{self.queue_id}"


@dataclass(frozen=True, slots=True)
class GroupRoute:
    """A topic's queues on one broker group, as the nameserver routes it.

    ``brokers`` lists the group's brokers serving the topic, the routed master first,
    then the others by id.
    """

    cluster: str
    broker_name: str
    epoch: int
    computer_room: str
    brokers: tuple[BrokerAddress, ...]
    read_queues: int
    write_queues: int
    permission: Permission
    ordered: bool

    @property
    def master_address(self) -> str:
        """Data-plane address of the group's master; empty while the group has none."""
        return next((b.data_address for b in self.brokers if b.role is Role.MASTER), "")

    @property
    def addresses(self) -> tuple[str, ...]:
        """Data-plane address of every broker in ``brokers``, in that order."""
        return tuple(b.data_address for b in self.brokers)

    @property
    def http_addresses(self) -> tuple[str, ...]:
        return tuple(b.http_address for b in self.brokers)

    @property
    def writable(self) -> bool:
        return bool(self.master_address) and self.permission.writable

    @property
    def readable(self) -> bool:
        return bool(self.brokers) and self.permission.readable

    def to_proto(self) -> pb.GroupRoute:
        return pb.GroupRoute(
            cluster=self.cluster,
            broker_name=self.broker_name,
            epoch=self.epoch,
            computer_room=self.computer_room,
            brokers=[b.to_proto() for b in self.brokers],
            read_queues=self.read_queues,
            write_queues=self.write_queues,
            permission=self.permission.to_proto(),
            ordered=self.ordered,
        )

    @classmethod
    def from_proto(cls, message: pb.GroupRoute) -> GroupRoute:
        # A permission this version does not know grants nothing.
        return cls(
            cluster=message.cluster,
            broker_name=message.broker_name,
            epoch=message.epoch,
            computer_room=message.computer_room,
            brokers=tuple(BrokerAddress.from_proto(b) for b in message.brokers),
            read_queues=message.read_queues,
            write_queues=message.write_queues,
            permission=_or(Permission.from_proto, message.permission, Permission.NONE),
            ordered=message.ordered,
        )


@dataclass(frozen=True)
class TopicRoute:
    """A topic's queues, by broker group.

    ``write_queues`` come from masters only (a group without a master takes no writes);
    ``read_queues`` are read from the master, or from another broker while the group has
    no master. Both are sorted by (broker name, queue id) when ``groups`` are sorted by
    name, as :meth:`from_proto` sorts them.
    """

    topic: str
    groups: tuple[GroupRoute, ...]

    @cached_property
    def write_queues(self) -> tuple[QueueRoute, ...]:
        return tuple(
            QueueRoute(g.broker_name, g.master_address, q, g.computer_room)
            for g in self.groups
            if g.writable
            for q in range(g.write_queues)
        )

    @cached_property
    def read_queues(self) -> tuple[QueueRoute, ...]:
        return tuple(
            QueueRoute(g.broker_name, g.master_address or g.addresses[0], q, g.computer_room)
            for g in self.groups
            if g.readable
            for q in range(g.read_queues)
        )

    @property
    def ordered(self) -> bool:
        return any(group.ordered for group in self.groups)

    @cached_property
    def masterless(self) -> bool:
        """Whether a group that takes writes has no master in this route: a failover is
        under way, and the new master may be routed by the time anyone asks again."""
        return any(g.permission.writable and not g.master_address for g in self.groups)

    def group(self, broker_name: str) -> GroupRoute | None:
        for group in self.groups:
            if group.broker_name == broker_name:
                return group
        return None

    def to_proto(self) -> pb.TopicRoute:
        return pb.TopicRoute(topic=self.topic, groups=[g.to_proto() for g in self.groups])

    @classmethod
    def from_proto(cls, message: pb.TopicRoute) -> TopicRoute:
        """A ``GetRoute`` answer, its groups sorted by name."""
        groups = sorted(message.groups, key=lambda g: g.broker_name)
        return cls(message.topic, tuple(GroupRoute.from_proto(g) for g in groups))


# --- cluster info -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerView:
    """One broker as a nameserver knows it (``metaq.v1.BrokerInfo``): its state as it
    last registered, and how its registration stands.

    A broker that is down (``metaq.v1.DepartedBroker``: it left the nameserver's registry
    within the last hour, its session ended or it went silent) has ``down`` set, and
    ``last_heartbeat_age_s`` is how long ago it left; it is only in :attr:`GroupView.down`.
    """

    state: BrokerState
    last_heartbeat_age_s: float
    """How long ago the nameserver last heard from it (for one that is down: since it left)."""
    session_open: bool = False
    """It holds a Session stream open to the nameserver."""
    topic_count: int = 0
    in_sync: bool | None = None
    """In the controller's in-sync set (electable); None when no controller manages it.
    Not on the wire: a reader takes it from the group's ``control``."""
    lag_bytes: int = 0
    """How far its commitlog is behind its group's master's (0 for the master). Not on
    the wire: a reader takes it from the group's master."""
    down: bool = False

    @property
    def broker_name(self) -> str:
        return self.state.key.broker_name

    @property
    def broker_id(self) -> int:
        return self.state.key.broker_id

    @property
    def is_master(self) -> bool:
        return self.state.role is Role.MASTER

    def to_proto(self) -> pb.BrokerInfo:
        return pb.BrokerInfo(
            state=self.state.to_proto(),
            last_heartbeat_age_ms=round(self.last_heartbeat_age_s * 1000),
            session_open=self.session_open,
            topic_count=self.topic_count,
        )

    def to_departed_proto(self) -> pb.DepartedBroker:
        return pb.DepartedBroker(
            state=self.state.to_proto(), left_age_ms=round(self.last_heartbeat_age_s * 1000)
        )

    def to_json(self) -> dict[str, Any]:
        """The flat form ``metaq cluster list --json`` prints and the deploy roles read."""
        state = self.state
        mode = state.replication_mode
        return {
            "cluster": state.cluster,
            "broker_name": self.broker_name,
            "broker_id": self.broker_id,
            "role": state.role.value,
            "data_address": state.data_address,
            "http_address": state.http_address,
            "computer_room": state.computer_room,
            "epoch": state.epoch,
            "permission": state.permission.value,
            "replication_mode": None if mode is None else mode.value,
            "commitlog_max_offset": state.commitlog_max_offset,
            "last_heartbeat_age_ms": round(self.last_heartbeat_age_s * 1000),
            "session_open": self.session_open,
            "topic_count": self.topic_count,
            "in_sync": self.in_sync,
            "lag_bytes": self.lag_bytes,
            "down": self.down,
        }


@dataclass(frozen=True, slots=True)
class GroupView:
    """One broker group as a nameserver knows it (``metaq.v1.BrokerGroupInfo``)."""

    broker_name: str
    epoch: int
    computer_room: str
    brokers: tuple[BrokerView, ...]
    """Its live brokers, by id."""
    in_sync_ids: tuple[int, ...] | None = None
    """The controller's in-sync set; None when no controller manages the group."""
    down: tuple[BrokerView, ...] = ()
    """Its brokers that are down (see :attr:`BrokerView.down`); never in ``brokers``."""

    @property
    def master(self) -> BrokerView | None:
        return next((b for b in self.brokers if b.is_master), None)

    @classmethod
    def from_proto(cls, message: pb.BrokerGroupInfo) -> GroupView:
        """ValueError for a role, permission or replication mode this version does not
        take."""
        in_sync = set(message.control.in_sync_ids) if message.HasField("control") else None
        states = [(BrokerState.from_proto(b.state), b) for b in message.brokers]
        master_end = max(
            (s.commitlog_max_offset for s, _ in states if s.role is Role.MASTER), default=0
        )
        return cls(
            broker_name=message.broker_name,
            epoch=message.epoch,
            computer_room=message.computer_room,
            brokers=tuple(
                BrokerView(
                    state=state,
                    last_heartbeat_age_s=b.last_heartbeat_age_ms / 1000,
                    session_open=b.session_open,
                    topic_count=b.topic_count,
                    in_sync=None if in_sync is None else state.broker_id in in_sync,
                    lag_bytes=max(0, master_end - state.commitlog_max_offset),
                )
                for state, b in states
            ),
            in_sync_ids=None if in_sync is None else tuple(sorted(in_sync)),
            down=tuple(_down(d, in_sync) for d in message.departed),
        )


def _down(message: pb.DepartedBroker, in_sync: set[int] | None) -> BrokerView:
    state = BrokerState.from_proto(message.state)
    return BrokerView(
        state=state,
        last_heartbeat_age_s=message.left_age_ms / 1000,
        in_sync=None if in_sync is None else state.broker_id in in_sync,
        down=True,
    )


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """One cluster's broker groups as a nameserver knows them (``metaq.v1.ClusterInfo``),
    by name."""

    cluster: str
    groups: tuple[GroupView, ...] = ()

    @classmethod
    def from_proto(cls, message: pb.ClusterInfo) -> ClusterInfo:
        return cls(message.cluster, tuple(GroupView.from_proto(g) for g in message.groups))
