"""What the nameserver knows about brokers, as plain values (no protobuf, no I/O).

Topics and routes are the shared ones of :mod:`metaq.common.model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metaq.common.model import Permission, ReplicationMode, Role


@dataclass(frozen=True, slots=True, order=True)
class BrokerKey:
    """A broker's identity: its group (RocketMQ's brokerName) and its id within the group."""

    broker_name: str
    broker_id: int

    def __str__(self) -> str:
        return f"{self.broker_name}/{self.broker_id}"


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
    replication_mode: ReplicationMode | None = None
    """None: the broker did not say."""
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
