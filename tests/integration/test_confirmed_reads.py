"""A master serves consumers only what its electable slaves hold: a record a failover
may cut is never delivered, so its queue offset cannot be reused under a consumer's feet
(found by the chaos suite: a consumer read an isolated master's uncopied record, and
skipped the acknowledged message the new master stored at the same queue offset)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from replica_group import TOPIC, start_group

from metaq.broker.testing import DataClient
from metaq.broker.testing.admin import scrape
from metaq.common.record import encode, iter_records
from metaq.common.testing import run_async, wait_until_async
from metaq.common.v1.data_pb2 import PullResponse, SendResponse

pytestmark = pytest.mark.slow


def test_a_record_is_readable_only_once_the_in_sync_slave_holds_it(tmp_path: Path) -> None:
    group = start_group(
        tmp_path, brokers=2, mode="sync", min_in_sync=1,
        # The paused slave stays in sync and the send keeps waiting for it.
        extra=("--set", "replica_lag_max_ms=60000", "--set", "replication_timeout_ms=60000"),
    )  # fmt: skip
    try:
        master_id = group.master()
        master, slave = group.brokers[master_id], group.brokers[1 - master_id]

        async def scenario() -> None:
            client = await DataClient.connect(master.data_host, master.data_port)
            try:
                sent = await client.send(TOPIC, 0, [encode(TOPIC, b"copied", queue_id=0)])
                assert sent.status == SendResponse.OK
                slave.pause()
                waiting = asyncio.ensure_future(
                    client.send(TOPIC, 0, [encode(TOPIC, b"not copied yet", queue_id=0)])
                )

                async def dispatched() -> bool:  # stored and dispatched on the master
                    return (await client.query_offset(TOPIC, 0)).max_offset >= 2

                await wait_until_async(dispatched, 10, "the second record is dispatched")
                now, _ = await client.pull(TOPIC, 0, 1)
                assert now.status == PullResponse.OFFSET_OVERFLOW_ONE
                assert now.next_offset == 1
                parked = asyncio.ensure_future(
                    client.pull(TOPIC, 0, 1, long_poll_timeout_ms=20_000)
                )

                async def is_parked() -> bool:
                    metrics = await scrape(master.http_url)
                    return metrics.get(("metaq_long_polls_parked", ()), 0) >= 1

                await wait_until_async(is_parked, 10, "the master parks the pull")
                assert not parked.done()
                slave.resume()
                later, payload = await asyncio.wait_for(parked, 20)
                assert later.status == PullResponse.FOUND
                assert [r.body for r in iter_records(payload)] == [b"not copied yet"]
                assert (await asyncio.wait_for(waiting, 20)).status == SendResponse.OK
            finally:
                slave.resume()
                await client.close()

        run_async(scenario(), timeout_s=60)
    finally:
        group.stop()
