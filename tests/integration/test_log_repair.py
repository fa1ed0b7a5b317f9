"""A bit rotted in a slave's commitlog while it was down: found by the slave's log check,
never served, never elected while damaged, and repaired from the master.

The master is down too when the slave comes back, so the damage cannot be repaired at
once: the slave must then neither serve the record nor be elected in the master's place.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from metaq.client.producer import Producer
from metaq.client.results import SendStatus
from metaq.common.record import InvalidRecord, decode
from metaq.common.v1.data_pb2 import PullResponse
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.data_client import BrokerError
from metaq.testing.replica_group import (
    QUEUES,
    TOPIC,
    commitlog_bytes,
    health,
    read_all,
    start_group,
)
from metaq.testing.waiting import deadline, holds_for, wait_until

pytestmark = pytest.mark.slow

FAST = ("--set", "replica_lag_max_ms=2000", "--set", "replication_timeout_ms=1000")
MESSAGES = 300


async def send_all(nameservers: list[str]) -> list[bytes]:
    bodies = [b"rot-%05d " % n + bytes(200) for n in range(MESSAGES)]
    async with Producer(nameservers, send_timeout_s=5.0) as producer:
        for body in bodies:
            assert (await producer.send(TOPIC, body)).status is SendStatus.OK
    return bodies


def flip_a_body_bit(broker: BrokerProcess) -> tuple[int, bytes]:
    """Flip the last body bit of a record in the middle of the log; its offset and body."""
    segments = sorted((broker.data_dir / "commitlog").iterdir())
    assert len(segments) == 1, "the test's log fits one segment"
    data = segments[0].read_bytes()
    offsets, at = [], 0
    while at + 4 <= len(data) and (size := int.from_bytes(data[at : at + 4], "little")):
        offsets.append(at)
        at += size
    victim = offsets[len(offsets) // 2]
    record = decode(data, victim)
    last = victim + int.from_bytes(data[victim : victim + 4], "little") - 1
    with segments[0].open("r+b") as file:
        file.seek(last)
        file.write(bytes([data[last] ^ 0x01]))
    return victim, record.body


async def pull_from(broker: BrokerProcess, wanted: bytes) -> str:
    """ "ok" if ``wanted`` is served intact, "corrupt" if served damaged, else what came."""
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                try:
                    response, payload = await client.pull(TOPIC, queue_id, offset)
                except BrokerError as exc:
                    return f"refused: {exc}"
                if response.status != PullResponse.FOUND:
                    break
                at = 0
                while at < len(payload):
                    size = int.from_bytes(payload[at : at + 4], "little")
                    try:
                        body = decode(payload, at).body
                    except InvalidRecord:
                        return "corrupt"
                    if body == wanted:
                        return "ok"
                    at += size
                offset = response.next_offset
        return "absent"
    finally:
        await client.close()


def test_a_rotted_record_on_a_slave_is_never_served_or_elected_and_is_repaired(
    tmp_path: Path,
) -> None:
    group = start_group(tmp_path, brokers=2, mode="sync", min_in_sync=1, extra=FAST)
    try:
        master_id = group.master()
        slave_id = 1 - master_id
        bodies = asyncio.run(send_all(group.nameserver_addresses))
        group.wait_caught_up(slave_id)
        end = health(group.brokers[master_id])["commitlog_write_offset"]
        group.brokers[slave_id].terminate()
        group.brokers[master_id].kill()
        victim, body = flip_a_body_bit(group.brokers[slave_id])

        slave = group.start_broker(slave_id)
        line = slave.wait_for_line(re.compile(r"damaged record .* at commitlog offset (\d+)"), 20)
        assert int(line.group(1)) == victim
        # The controller hears the slave (unverified) and has no one it may elect: over
        # twenty of its decision rounds the dead master stays the group's master.
        slave.wait_for_line("registered with nameserver", 20)
        before = group.controller().groups[0]
        assert before.master_id == master_id

        def nobody_elected() -> bool:
            now = group.controller().groups[0]
            return (now.master_id, now.epoch) == (master_id, before.epoch)

        holds_for(nobody_elected, 2.0, "the controller elects no one")
        state = health(slave)
        assert (state["role"], state["verified"]) == ("slave", False)
        assert state["log_check"]["damaged_records"] == 1
        served = asyncio.run(pull_from(slave, body))
        assert served.startswith("refused") and "damaged" in served, served

        group.start_broker(master_id)
        assert group.master() == master_id
        repaired = f"repaired the record at commitlog offset {victim}"
        slave.wait_for_line(repaired, deadline(20))
        wait_until(lambda: health(slave)["verified"], 20, "the slave is verified")
        assert commitlog_bytes(slave, end) == commitlog_bytes(group.brokers[master_id], end)
        assert asyncio.run(pull_from(slave, body)) == "ok"
        assert sorted(asyncio.run(read_all(group.brokers[master_id]))) == sorted(bodies)
    finally:
        group.stop()
