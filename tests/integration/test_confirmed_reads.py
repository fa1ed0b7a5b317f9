"""A master serves consumers only what its electable slaves hold: a record a failover
may cut is never delivered, so its queue offset cannot be reused under a consumer's feet
(found by the chaos suite: a consumer read an isolated master's uncopied record, and
skipped the acknowledged message the new master stored at the same queue offset)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metaq.client.admin import Admin
from metaq.common.record import encode, iter_records
from metaq.common.v1.data_pb2 import PullResponse, SendResponse
from metaq.testing import DataClient
from metaq.testing.data_client import BrokerError
from metaq.testing.replica_group import TOPIC, start_group
from metaq.testing.waiting import run_async, wait_until_async

pytestmark = pytest.mark.slow


def test_a_record_is_readable_only_once_the_in_sync_slave_holds_it(tmp_path: Path) -> None:
    group = start_group(
        tmp_path, brokers=2, mode="sync", min_in_sync=1,
        # The paused slave stays in sync and the send keeps waiting for it.
        extra=("--set", "replica_lag_max_ms=60000", "--set", "replication_timeout_ms=60000",
               "--set", "replica_slow_ms=60000"),
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
                    metrics = await Admin().metrics(master.http_url)
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


def test_a_slave_serves_no_record_its_master_has_not_confirmed(tmp_path: Path) -> None:
    # Three replicas: a record one slave holds and the other lacks may be cut when the
    # other is elected, so the slave holding it must not hand it out, also while the group
    # has no master (found by a loss run: a consumer read such a record at a slave during
    # a failover and skipped the acknowledged message stored at its queue offset).
    group = start_group(
        tmp_path, brokers=3, mode="sync", min_in_sync=2,
        # The paused slave stays in sync and the send keeps waiting for it.
        extra=("--set", "replica_lag_max_ms=60000", "--set", "replication_timeout_ms=60000",
               "--set", "replica_slow_ms=60000"),
    )  # fmt: skip
    try:
        master_id = group.master()
        holder_id, lacking_id = sorted(set(group.brokers) - {master_id})
        master, holder = group.brokers[master_id], group.brokers[holder_id]
        lacking = group.brokers[lacking_id]

        async def scenario() -> None:
            client = await DataClient.connect(master.data_host, master.data_port)
            reader = await DataClient.connect(holder.data_host, holder.data_port)
            try:
                sent = await client.send(TOPIC, 0, [encode(TOPIC, b"confirmed", queue_id=0)])
                assert sent.status == SendResponse.OK

                async def served_at_holder() -> bool:
                    try:
                        response, _ = await reader.pull(TOPIC, 0, 0)
                    except BrokerError:  # the topic has not reached the slave yet
                        return False
                    return response.status == PullResponse.FOUND

                await wait_until_async(served_at_holder, 10, "the holder serves record 0")
                lacking.pause()
                waiting = asyncio.ensure_future(
                    client.send(TOPIC, 0, [encode(TOPIC, b"one slave has it", queue_id=0)])
                )

                async def holder_has_it() -> bool:
                    return (await reader.query_offset(TOPIC, 0)).max_offset >= 2

                await wait_until_async(holder_has_it, 10, "the holder stores the second record")
                now, _ = await reader.pull(TOPIC, 0, 1)
                assert now.status != PullResponse.FOUND, "the holder served an unconfirmed record"
                parked = asyncio.ensure_future(
                    reader.pull(TOPIC, 0, 1, long_poll_timeout_ms=20_000)
                )
                lacking.resume()
                assert (await asyncio.wait_for(waiting, 20)).status == SendResponse.OK
                later, payload = await asyncio.wait_for(parked, 20)
                assert later.status == PullResponse.FOUND
                assert [r.body for r in iter_records(payload)] == [b"one slave has it"]
            finally:
                lacking.resume()
                await client.close()
                await reader.close()

        run_async(scenario(), timeout_s=60)
    finally:
        group.stop()
