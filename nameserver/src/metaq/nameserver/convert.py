"""Between the wire (``metaq.v1`` protobuf) and the registry's values, checking requests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from metaq.common.errors import InvalidMessage
from metaq.common.model import (
    BrokerKey,
    BrokerState,
    BrokerView,
    ClusterInfo,
    Permission,
    ReplicationMode,
    Role,
    TopicChanges,
    TopicConfig,
)
from metaq.common.names import check_group, shown
from metaq.common.record import MAX_QUEUES_PER_TOPIC, check_topic
from metaq.common.v1 import control_pb2 as pb
from metaq.nameserver.assignment import Member, QueueRef


class InvalidRequest(ValueError):
    """A request the nameserver cannot act on as sent (answered INVALID_ARGUMENT)."""


MAX_TEXT_CHARS: Final = 255
"""Longest broker name, cluster, computer room, address or consumer id taken: the
registry keeps them and every route and answer repeats them."""


def check_text(value: str, field: str, *, required: bool = True) -> None:
    """A free-form name: not empty when ``required``, never longer than MAX_TEXT_CHARS."""
    if not value:
        if required:
            raise InvalidRequest(f"{field} must not be empty")
        return
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidRequest(
            f"{field} is {len(value)} characters ({shown(value)}); "
            f"at most {MAX_TEXT_CHARS} are accepted"
        )


def check_topic_name(topic: str, field: str = "topic") -> None:
    try:
        check_topic(topic)
    except InvalidMessage as exc:
        raise InvalidRequest(f"{field}: {exc}") from None


def check_group_name(group: str, field: str = "consumer_group") -> None:
    try:
        check_group(group)
    except InvalidMessage as exc:
        raise InvalidRequest(f"{field}: {exc}") from None


def _permission(value: pb.Permission.ValueType, where: str) -> Permission:
    try:
        return Permission.from_proto(value)
    except ValueError:
        known = ", ".join(pb.Permission.Name(p.to_proto()) for p in Permission)
        raise InvalidRequest(f"{where}: permission {value} is not one of {known}") from None


def check_address(address: str, where: str, *, required: bool = True) -> None:
    """``host:port`` (``[v6]:port`` for IPv6) with a port in 1-65535."""
    if not address and not required:
        return
    check_text(address, where)
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"{where}: {shown(address)} is not host:port")


def broker_key(broker_name: str, broker_id: int) -> BrokerKey:
    check_text(broker_name, "broker_name")
    return BrokerKey(broker_name, broker_id)


def broker_state(state: pb.BrokerState) -> BrokerState:
    """A broker's heartbeat state, each field checked; InvalidRequest names what is wrong."""
    key = broker_key(state.broker_name, state.broker_id)
    check_text(state.cluster, f"broker {key}: cluster")
    check_text(state.computer_room, f"broker {key}: computer_room", required=False)
    try:
        Role.from_proto(state.role)
    except ValueError:
        raise InvalidRequest(f"broker {key}: role must be BROKER_ROLE_MASTER or _SLAVE") from None
    check_address(state.data_address, f"broker {key} data_address")
    check_address(state.http_address, f"broker {key} http_address", required=False)
    try:
        ReplicationMode.from_proto(state.replication_mode)
    except ValueError:
        raise InvalidRequest(
            f"broker {key}: unknown replication_mode {state.replication_mode}"
        ) from None
    _permission(state.permission, f"broker {key}")
    return BrokerState.from_proto(state)


def topic_table(table: pb.TopicTable, key: BrokerKey) -> dict[str, TopicConfig]:
    topics: dict[str, TopicConfig] = {}
    for topic in table.topics:
        config = _topic(topic, key, "topic_table")
        if config.name in topics:
            raise InvalidRequest(f"broker {key} topic {config.name!r} is listed twice")
        topics[config.name] = config
    return topics


def topic_changes(changes: pb.TopicChanges, key: BrokerKey) -> TopicChanges:
    put = tuple(_topic(topic, key, "topic_changes") for topic in changes.put)
    for name in changes.deleted:
        check_topic_name(name, f"broker {key}: topic_changes")
    names = [t.name for t in put] + list(changes.deleted)
    if len(set(names)) != len(names):
        raise InvalidRequest(f"broker {key}: topic_changes names a topic twice")
    return TopicChanges(put, tuple(changes.deleted))


def _topic(topic: pb.TopicConfig, key: BrokerKey, field: str) -> TopicConfig:
    check_topic_name(topic.topic, f"broker {key}: {field}")
    where = f"broker {key} topic {topic.topic!r}"
    for queues in ("read_queues", "write_queues"):
        if getattr(topic, queues) > MAX_QUEUES_PER_TOPIC:
            raise InvalidRequest(
                f"{where}: {queues} is {getattr(topic, queues)}; "
                f"at most {MAX_QUEUES_PER_TOPIC} are accepted"
            )
    _permission(topic.permission, where)
    return TopicConfig.from_proto(topic)


def clusters_out(
    clusters: Iterable[ClusterInfo],
    control: Callable[[str], pb.GroupControl | None] = lambda _name: None,
    departed: Iterable[BrokerView] = (),
    cluster_name: str = "",
) -> list[pb.ClusterInfo]:
    """``control`` gives the controller's state of a group by name, None when unmanaged;
    ``departed`` brokers go with their group (one with no live broker is listed with
    them alone), those of cluster ``cluster_name`` only when it is not empty."""
    out = _live_clusters_out(clusters, control)
    by_name = {c.cluster: c for c in out}
    for gone in departed:
        state = gone.state
        if cluster_name and state.cluster != cluster_name:
            continue
        info = by_name.get(state.cluster)
        if info is None:
            info = by_name[state.cluster] = pb.ClusterInfo(cluster=state.cluster)
            out.append(info)
        group = next((g for g in info.groups if g.broker_name == state.key.broker_name), None)
        if group is None:
            group = info.groups.add(
                broker_name=state.key.broker_name,
                epoch=state.epoch,
                computer_room=state.computer_room,
            )
            managed = control(state.key.broker_name)
            if managed is not None:
                group.control.CopyFrom(managed)
        group.departed.append(gone.to_departed_proto())
    for info in out:
        info.groups.sort(key=lambda g: g.broker_name)
    out.sort(key=lambda c: c.cluster)
    return out


def _live_clusters_out(
    clusters: Iterable[ClusterInfo], control: Callable[[str], pb.GroupControl | None]
) -> list[pb.ClusterInfo]:
    return [
        pb.ClusterInfo(
            cluster=cluster.cluster,
            groups=[
                pb.BrokerGroupInfo(
                    broker_name=group.broker_name,
                    epoch=group.epoch,
                    computer_room=group.computer_room,
                    brokers=[broker.to_proto() for broker in group.brokers],
                    control=control(group.broker_name),
                )
                for group in cluster.groups
            ],
        )
        for cluster in clusters
    ]


def members(request: pb.GetAssignmentRequest) -> list[Member]:
    result = []
    for member in request.members:
        if not member.consumer_id:
            raise InvalidRequest("a member of the consumer group has an empty consumer_id")
        check_text(member.consumer_id, "members.consumer_id")
        check_text(member.computer_room, "members.computer_room", required=False)
        result.append(Member(consumer_id=member.consumer_id, room=member.computer_room))
    return result


def previous(request: pb.GetAssignmentRequest) -> dict[str, list[QueueRef]] | None:
    """The previous assignment of this topic; None when the request carries none."""
    if not request.previous:
        return None
    result: dict[str, list[QueueRef]] = {}
    for held in request.previous:
        result.setdefault(held.consumer_id, []).extend(
            QueueRef(broker=q.broker_name, queue_id=q.queue_id, room=q.computer_room)
            for q in held.queues
            if q.topic == request.topic
        )
    return result


def queues_out(topic: str, queues: Sequence[QueueRef]) -> list[pb.MessageQueue]:
    return [
        pb.MessageQueue(
            topic=topic, broker_name=q.broker, queue_id=q.queue_id, computer_room=q.room
        )
        for q in queues
    ]
