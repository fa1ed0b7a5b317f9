"""COMMIT_OFFSET refuses what no consumer could have read, and strangers cannot grow the
offsets table without bound: each refusal says what was wrong and stores nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.common.errors import ErrorCode
from metaq.common.framing import FrameType
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import CommitOffsetRequest, PullResponse, QueueOffset
from metaq.testing import BrokerError, BrokerProcess, DataClient, run_async
from metaq.testing.waiting import wait_until_async

TOPIC = "Bounded"


async def dispatched(client: DataClient, count: int) -> None:
    async def there() -> bool:
        return (await client.query_offset(TOPIC, 0)).max_offset >= count

    await wait_until_async(there, 10, f"{count} messages are in queue 0")


@pytest.mark.parametrize(
    ("group", "entry", "says"),
    [
        ("readers", (TOPIC, 0, 6), "past the end of queue 'Bounded'/0 (max offset 5"),
        ("readers", (TOPIC, 0, 2**63), "past the end"),
        ("readers", (TOPIC, 2, 0), "queue id 2 is out of range: topic 'Bounded' has 2 read"),
        ("readers", (TOPIC, 4_000_000_000, 0), "queue id 4000000000 is out of range"),
        ("g" * 256, (TOPIC, 0, 1), "use 1-255 characters"),
        ("readers", ("t" * 128, 0, 1), "illegal topic name"),
        ("g" * 3_000_000, (TOPIC, 0, 1), "... (3000000 characters in all): use 1-255"),
        ("a-fourth-group", (TOPIC, 0, 1), "holds offsets of 3 consumer groups, its limit"),
    ],
)
def test_a_commit_beyond_the_queue_the_topic_or_the_group_limit_is_refused(
    start_broker: Callable[..., BrokerProcess],
    group: str,
    entry: tuple[str, int, int],
    says: str,
) -> None:
    broker = start_broker("--set", "max_consumer_groups=3")

    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, TOPIC, TopicSettings(read_queues=2, write_queues=2)
        )
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            await client.send(TOPIC, 0, [encode(TOPIC, b"%d" % i) for i in range(5)])
            await dispatched(client, 5)
            for known in ("readers", "writers", "auditors"):
                await client.commit(known, [(TOPIC, 0, 5)])
            with pytest.raises(BrokerError) as refused:
                await client.commit(group, [(TOPIC, 1, 0), entry])
            assert refused.value.code in (ErrorCode.INVALID_MESSAGE, ErrorCode.UNKNOWN_TOPIC)
            assert says in refused.value.detail
            assert len(refused.value.detail) < 1000, "the answer does not echo huge input"
            for queue_id in (0, 1):
                query = await client.query_offset(TOPIC, queue_id, group=group)
                stored = query.committed_offset if query.HasField("committed_offset") else None
                assert stored == (5 if group == "readers" and queue_id == 0 else None), (
                    "a refused commit stored nothing"
                )
        finally:
            await client.close()

    run_async(scenario())


def test_a_commit_piggybacked_past_the_queues_end_is_not_stored_but_the_pull_is_served(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker()

    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, TOPIC, TopicSettings(read_queues=2, write_queues=2)
        )
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            await client.send(TOPIC, 0, [encode(TOPIC, b"%d" % i) for i in range(5)])
            await dispatched(client, 5)
            answer, _ = await client.pull(TOPIC, 0, 0, group="readers", commit_offset=99)
            assert answer.status == PullResponse.FOUND
            query = await client.query_offset(TOPIC, 0, group="readers")
            assert not query.HasField("committed_offset")
        finally:
            await client.close()

    run_async(scenario())


def test_a_commit_piggybacked_for_a_group_past_the_limit_is_not_stored_but_the_pull_is_served(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker("--set", "max_consumer_groups=1")

    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, TOPIC, TopicSettings(read_queues=1, write_queues=1)
        )
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            await client.send(TOPIC, 0, [encode(TOPIC, b"%d" % i) for i in range(5)])
            await dispatched(client, 5)
            await client.commit("readers", [(TOPIC, 0, 1)])
            answer, _ = await client.pull(TOPIC, 0, 2, group="latecomers", commit_offset=2)
            assert answer.status == PullResponse.FOUND
            assert answer.next_offset == 5
            query = await client.query_offset(TOPIC, 0, group="latecomers")
            assert not query.HasField("committed_offset")
            refused = (await Admin().metrics(broker.http_url))[
                ("metaq_piggybacked_commits_refused_total", ())
            ]
            assert refused == 1
        finally:
            await client.close()

    run_async(scenario())


def test_a_forwarded_commit_on_a_connection_no_slave_proved_is_refused(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    # A forwarded commit is taken even where it moves an offset back (a reset a consumer
    # made at the slave): from a stranger it would rewind any group at will.
    broker = start_broker()

    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, TOPIC, TopicSettings(read_queues=1, write_queues=1)
        )
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            await client.send(TOPIC, 0, [encode(TOPIC, b"%d" % i) for i in range(5)])
            await dispatched(client, 5)
            await client.commit("readers", [(TOPIC, 0, 5)])
            rewind = CommitOffsetRequest(
                consumer_group="readers",
                forwarded=True,
                offsets=[QueueOffset(topic=TOPIC, queue_id=0, offset=0, expected_offset=5)],
            )
            with pytest.raises(BrokerError) as refused:
                await client.request(FrameType.COMMIT_OFFSET, rewind)
            assert refused.value.code == ErrorCode.NO_PERMISSION
            assert "proved the cluster secret" in refused.value.detail
            query = await client.query_offset(TOPIC, 0, group="readers")
            assert query.committed_offset == 5, "the refused commit stored nothing"
        finally:
            await client.close()

    run_async(scenario())
