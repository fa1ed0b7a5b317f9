"""Offset commits that arrive together share one journal write: a master journals what
it took in one turn of its loop as one record, not a record per commit, and answers each
commit once that record is written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from metaq.client.admin import Admin, TopicSettings
from metaq.common.framing import FrameType
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import CommitOffsetRequest, QueueOffset
from metaq.testing import BrokerProcess, DataClient, run_async
from metaq.testing.waiting import wait_until_async

TOPIC = "Journaled"
GROUPS = 200


def write_offset(broker: BrokerProcess) -> int:
    health = broker.health()
    assert health is not None
    return int(health["commitlog_write_offset"])


def test_commits_sent_together_are_journaled_in_a_few_records_and_all_answered(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker()

    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, TOPIC, TopicSettings(read_queues=4, write_queues=4)
        )
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            for queue_id in range(4):
                await client.send(TOPIC, queue_id, [encode(TOPIC, b"m", queue_id=queue_id)] * 5)

            async def dispatched() -> bool:
                ends = [(await client.query_offset(TOPIC, q)).max_offset for q in range(4)]
                return min(ends) >= 5

            await wait_until_async(dispatched, 20, "5 messages in every queue")
            before = write_offset(broker)
            # One flush of the connection: the master reads them in one or a few turns.
            answers = [
                client.request(
                    FrameType.COMMIT_OFFSET,
                    CommitOffsetRequest(
                        consumer_group=f"group-{g:03d}",
                        offsets=[
                            QueueOffset(topic=TOPIC, queue_id=q, offset=1 + g % 5) for q in range(4)
                        ],
                    ),
                )
                for g in range(GROUPS)
            ]
            await asyncio.wait_for(asyncio.gather(*answers), 30)
            written = write_offset(broker) - before
            for g in (0, 77, GROUPS - 1):
                answer = await client.query_offset(TOPIC, 3, group=f"group-{g:03d}")
                assert answer.committed_offset == 1 + g % 5
        finally:
            await client.close()
        # A record per commit took about 300 bytes each (60 KB here); shared records
        # hold about 40 bytes a row, 160 a commit.
        assert written < GROUPS * 220, written

    run_async(scenario())
