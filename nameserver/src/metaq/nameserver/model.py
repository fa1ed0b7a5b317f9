"""What the nameserver knows about brokers, as plain values (no protobuf, no I/O).

Brokers' keys and states, topics and routes are the shared ones of
:mod:`metaq.common.model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metaq.common.model import BrokerKey, BrokerState, GroupControl

__all__ = [
    "BrokerView",
    "ClusterView",
    "DepartedBroker",
    "GroupControl",
    "GroupView",
    "Registered",
]


@dataclass(frozen=True, slots=True)
class BrokerView:
    """One registered broker for admin tools."""

    state: BrokerState
    last_heartbeat_age_s: float
    session_open: bool
    topic_count: int


@dataclass(frozen=True, slots=True)
class DepartedBroker:
    """A broker that left the registry within the last ``FORGET_DEPARTED_AFTER_S``, as
    it last registered, for admin views to show down."""

    state: BrokerState
    left_age_s: float


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
