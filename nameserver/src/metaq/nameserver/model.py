"""What the nameserver knows about brokers and topics, as plain values (no protobuf, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Permission(enum.Enum):
    """What clients may do with a topic's queues on a broker group, or with a whole broker.

    Mirrors ``metaq.v1.Permission`` name for name (less UNSPECIFIED, which is refused at the
    edge). ``WRITE_WIPE`` reads like ``READ_ONLY`` but records that an operator took the
    writes away, so it survives a restriction by anything that keeps reads.
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


class Role(enum.Enum):
    MASTER = "master"
    SLAVE = "slave"


class ReplicationMode(enum.Enum):
    """How a master answers producers; carried for admin views, not used for routing."""

    UNSPECIFIED = "unspecified"
    ASYNC = "async"
    SYNC = "sync"


@dataclass(frozen=True, slots=True, order=True)
class BrokerKey:
    """A broker's identity: its group (RocketMQ's brokerName) and its id within the group."""

    broker_name: str
    broker_id: int

    def __str__(self) -> str:
        return f"{self.broker_name}/{self.broker_id}"


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic as one broker serves it."""

    topic: str
    read_queues: int
    write_queues: int
    permission: Permission = Permission.READ_WRITE
    ordered: bool = False


@dataclass(frozen=True, slots=True)
class BrokerState:
    """Who a broker is and where to reach it, as it last told us."""

    cluster: str
    key: BrokerKey
    role: Role
    data_address: str
    http_address: str = ""
    computer_room: str = ""
    epoch: int = 0
    permission: Permission = Permission.READ_WRITE
    replication_mode: ReplicationMode = ReplicationMode.UNSPECIFIED
    commitlog_max_offset: int = 0
    # The failover controller decides this broker's role (see GroupControl).
    controlled: bool = False
    # Deployed as its group's master: the controller's first choice for a new group.
    configured_master: bool = False
    # Master only: the ids it sees in sync with its log (itself included), ascending.
    in_sync_ids: tuple[int, ...] = ()
    # Controlled brokers: its log is not checked (or not repaired) since it started.
    unverified: bool = False


@dataclass(frozen=True, slots=True)
class GroupControl:
    """The failover controller's committed decision for one broker group.

    Agreed by the nameservers through Raft. ``epoch`` only grows (each election adds one);
    ``in_sync_ids`` is ascending and always holds ``master_id``. ``reason`` says why the
    last change was made, for logs and admin views; it is not on the wire.
    """

    broker_name: str
    epoch: int
    master_id: int
    in_sync_ids: tuple[int, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """One broker of a group as a route shows it."""

    broker_id: int
    role: Role
    data_address: str
    http_address: str
    computer_room: str


@dataclass(frozen=True, slots=True)
class GroupRoute:
    """A topic's queues on one broker group."""

    cluster: str
    broker_name: str
    epoch: int
    computer_room: str
    brokers: tuple[BrokerAddress, ...]
    read_queues: int
    write_queues: int
    permission: Permission
    ordered: bool


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    groups: tuple[GroupRoute, ...]


@dataclass(frozen=True, slots=True)
class BrokerView:
    """One registered broker for admin tools."""

    state: BrokerState
    last_heartbeat_age_s: float
    session_open: bool
    topic_count: int


@dataclass(frozen=True, slots=True)
class GroupView:
    broker_name: str
    epoch: int
    computer_room: str
    brokers: tuple[BrokerView, ...]


@dataclass(frozen=True, slots=True)
class ClusterView:
    cluster: str
    groups: tuple[GroupView, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Registered:
    """What a registration answers: the group as the routes now see it."""

    master_data_address: str
    epoch: int
    # Brokers this registration pushed out of the routes (lower-epoch masters).
    fenced: tuple[BrokerKey, ...] = ()
