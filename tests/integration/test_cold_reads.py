"""A pull for records the broker handed back from the page cache is read in on a reader
thread before its answer, which goes out from the files by sendfile; one at the log's
head is answered straight away, from the mapping. Under ``cold_read_bytes_per_s`` cold
pulls wait their turn, and pulls at the head do not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from metaq.client.admin import Admin, TopicSettings
from metaq.common.record import encode, iter_records
from metaq.common.v1.data_pb2 import PullResponse
from metaq.testing import BrokerProcess, DataClient, run_async
from metaq.testing.waiting import wait_until_async

TOPIC = "Backlog"
BODY_BYTES = 4000
BATCH = 50
RECORDS = 5000
"""About 20 MiB: five 4 MiB segments, four of them behind a 4 MiB page-cache window."""


async def _read_in(broker: BrokerProcess) -> float:
    return (await Admin().metrics(broker.http_url)).get(("metaq_pulls_read_in_total", ()), 0.0)


async def _zero_copied(broker: BrokerProcess) -> float:
    return (await Admin().metrics(broker.http_url)).get(("metaq_zero_copy_bytes_total", ()), 0.0)


async def _cold_waited(broker: BrokerProcess) -> float:
    return (await Admin().metrics(broker.http_url)).get(
        ("metaq_cold_read_wait_seconds_total", ()), 0.0
    )


def _body(n: int) -> bytes:
    return n.to_bytes(4, "little") * (BODY_BYTES // 4)


async def _fill_behind_the_window(broker: BrokerProcess, client: DataClient) -> None:
    await Admin().put_topic(broker.http_url, TOPIC, TopicSettings(read_queues=1, write_queues=1))
    for first in range(0, RECORDS, BATCH):
        records = [encode(TOPIC, _body(n), queue_id=0) for n in range(first, first + BATCH)]
        await client.send(TOPIC, 0, records)

    async def released() -> bool:
        samples = await Admin().metrics(broker.http_url)
        return samples[("metaq_commitlog_page_cache_released_bytes_total", ())] > 0

    await wait_until_async(released, 20, "the flusher handed pages back")


def _bodies_from(payload: bytes, offset: int) -> int:
    """Check the records of ``payload`` are those from ``offset`` on; return the next."""
    for record in iter_records(payload):
        assert record.body == _body(offset)
        offset += 1
    return offset


WINDOW = ("--set", "store.commitlog_cache_bytes=4194304", "--set", "store.flush_interval_ms=20")


def test_a_lagging_pull_is_read_in_off_the_loop_and_a_tailing_one_is_not(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker(*WINDOW)

    async def scenario() -> None:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            await _fill_behind_the_window(broker, client)
            assert await _read_in(broker) == 0

            # At the head: inside the window, answered on the loop as before.
            response, payload = await client.pull(TOPIC, 0, RECORDS - 10, max_messages=10)
            assert response.status == PullResponse.FOUND
            assert await _read_in(broker) == 0
            assert await _zero_copied(broker) == 0

            # From the start: behind the window, read in first; the same bytes come back.
            offset = 0
            while offset < 600:
                response, payload = await client.pull(TOPIC, 0, offset, max_messages=256)
                assert response.status == PullResponse.FOUND, response
                offset = _bodies_from(payload, offset)
            assert await _read_in(broker) >= 3
            # ...and went out from the files by sendfile, not through the mapping.
            assert await _zero_copied(broker) >= 600 * BODY_BYTES * 0.9
        finally:
            await client.close()

    run_async(scenario())


def test_under_a_budget_cold_pulls_wait_their_turn_and_pulls_at_the_head_do_not(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker(*WINDOW, "--set", "cold_read_bytes_per_s=1048576")

    async def scenario() -> None:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        tailing = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            await _fill_behind_the_window(broker, client)
            began = time.monotonic()
            # 2 MiB: the budget's burst lets the first go at once; the second is due
            # about 1.9 s later at 1 MiB/s.
            response, payload = await client.pull(TOPIC, 0, 0, max_messages=512)
            assert response.status == PullResponse.FOUND, response
            offset = _bodies_from(payload, 0)
            second = asyncio.create_task(client.pull(TOPIC, 0, offset, max_messages=512))

            async def waiting() -> bool:
                return await _cold_waited(broker) > 0

            await wait_until_async(waiting, 10, "the second cold pull waits for its turn")
            response, _ = await tailing.pull(TOPIC, 0, RECORDS - 10, max_messages=10)
            assert response.status == PullResponse.FOUND
            assert not second.done(), "the pull at the head was held behind the cold one"

            response, payload = await second
            assert response.status == PullResponse.FOUND, response
            assert _bodies_from(payload, offset) > offset
            assert time.monotonic() - began >= 1.5
            assert await _cold_waited(broker) >= 1.5
            assert await _read_in(broker) == 2
        finally:
            await client.close()
            await tailing.close()

    run_async(scenario())
