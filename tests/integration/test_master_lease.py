"""The master's lease with every nameserver gone: an async master stops taking writes (a
slave may have been promoted), a sync master goes on while its slave keeps copying (no
send is acknowledged without the slave's copy, and a copying slave was not promoted)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metaq.common.errors import ErrorCode
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import SendResponse
from metaq.testing import DataClient
from metaq.testing.data_client import BrokerError
from metaq.testing.replica_group import TOPIC, start_group
from metaq.testing.waiting import run_async, wait_until

pytestmark = pytest.mark.slow
LEASE_MS = 1000


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_with_every_nameserver_down_only_a_sync_master_with_its_slave_keeps_writing(
    tmp_path: Path, mode: str
) -> None:
    group = start_group(
        tmp_path, brokers=2, mode=mode, min_in_sync=1,
        extra=("--set", f"master_lease_ms={LEASE_MS}", "--set", "replica_lag_max_ms=20000"),
    )  # fmt: skip
    try:
        master = group.brokers[group.master()]
        for nameserver in group.nameservers:
            nameserver.kill()
        gone = time.monotonic()
        # The lease ran out long ago by the time this holds.
        wait_until(lambda: time.monotonic() > gone + 3 * LEASE_MS / 1000, 10.0, "3 leases passed")

        async def send() -> SendResponse:
            client = await DataClient.connect(master.data_host, master.data_port)
            try:
                return await client.send(TOPIC, 0, [encode(TOPIC, b"after the lease", queue_id=0)])
            finally:
                await client.close()

        if mode == "sync":
            assert run_async(send()).status == SendResponse.OK
        else:
            with pytest.raises(BrokerError) as refused:
                run_async(send())
            assert refused.value.code is ErrorCode.NOT_MASTER
    finally:
        group.stop()
