"""The edge between the wire and the registry: bad requests are named."""

from __future__ import annotations

import pytest

from metaq.common.model import BrokerKey, Permission
from metaq.common.v1 import control_pb2 as pb
from metaq.nameserver import convert
from metaq.nameserver.convert import InvalidRequest


def good_state(**changes: object) -> pb.BrokerState:
    state = pb.BrokerState(
        cluster="c1",
        broker_name="broker-a",
        broker_id=1,
        role=pb.BROKER_ROLE_SLAVE,
        data_address="[::1]:10911",
        computer_room="hz",
        epoch=2,
        permission=pb.PERMISSION_WRITE_WIPE,
        replication_mode=pb.REPLICATION_MODE_SYNC,
    )
    for name, value in changes.items():
        setattr(state, name, value)
    return state


def test_a_broker_state_survives_the_round_trip_through_the_model() -> None:
    state = good_state()

    model = convert.broker_state(state)

    assert model.key == BrokerKey("broker-a", 1)
    assert model.permission is Permission.WRITE_WIPE
    assert model.to_proto() == state


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"broker_name": ""}, "broker_name must not be empty"),
        ({"cluster": ""}, "cluster must not be empty"),
        ({"role": pb.BROKER_ROLE_UNSPECIFIED}, "role must be"),
        ({"data_address": "localhost"}, "'localhost' is not host:port"),
        ({"data_address": "h:99999"}, "'h:99999' is not host:port"),
        ({"http_address": ":80"}, "':80' is not host:port"),
        ({"permission": pb.PERMISSION_UNSPECIFIED}, "permission 0 is not one of"),
    ],
)
def test_a_broken_broker_state_is_refused_with_the_reason(
    changes: dict[str, object], problem: str
) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        convert.broker_state(good_state(**changes))


def test_a_topic_table_refuses_duplicates_and_missing_permissions() -> None:
    key = BrokerKey("broker-a", 0)
    twice = pb.TopicTable(
        topics=[
            pb.TopicConfig(topic="t", read_queues=1, permission=pb.PERMISSION_READ_ONLY),
            pb.TopicConfig(topic="t", read_queues=1, permission=pb.PERMISSION_READ_ONLY),
        ]
    )
    unset = pb.TopicTable(topics=[pb.TopicConfig(topic="t", read_queues=1)])

    with pytest.raises(InvalidRequest, match="listed twice"):
        convert.topic_table(twice, key)
    with pytest.raises(InvalidRequest, match=r"topic 't': permission 0"):
        convert.topic_table(unset, key)


def test_topic_changes_are_checked_as_a_table_is() -> None:
    key = BrokerKey("broker-a", 0)
    put = pb.TopicConfig(
        topic="t", read_queues=2, write_queues=2, permission=pb.PERMISSION_READ_WRITE
    )

    changes = convert.topic_changes(pb.TopicChanges(put=[put], deleted=["gone"]), key)
    assert [t.name for t in changes.put] == ["t"] and changes.deleted == ("gone",)
    with pytest.raises(InvalidRequest, match="names a topic twice"):
        convert.topic_changes(pb.TopicChanges(put=[put], deleted=["t"]), key)
    with pytest.raises(InvalidRequest, match="illegal topic name"):
        convert.topic_changes(pb.TopicChanges(deleted=["a b"]), key)
    with pytest.raises(InvalidRequest, match=r"topic 't': permission 0"):
        convert.topic_changes(pb.TopicChanges(put=[pb.TopicConfig(topic="t", read_queues=1)]), key)


def test_previous_assignment_keeps_only_the_requested_topic() -> None:
    request = pb.GetAssignmentRequest(
        topic="orders",
        previous=[
            pb.MemberQueues(
                consumer_id="c1",
                queues=[
                    pb.MessageQueue(topic="orders", broker_name="a", queue_id=1),
                    pb.MessageQueue(topic="other", broker_name="a", queue_id=2),
                ],
            )
        ],
    )

    previous = convert.previous(request)

    assert previous is not None
    assert [(q.broker, q.queue_id) for q in previous["c1"]] == [("a", 1)]
    assert convert.previous(pb.GetAssignmentRequest(topic="orders")) is None
