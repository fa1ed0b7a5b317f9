"""What the nameserver knows about brokers, as plain values (no protobuf, no I/O).

Brokers' keys and states, topics and routes are the shared ones of
:mod:`metaq.common.model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metaq.common.model import BrokerKey, BrokerState


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
