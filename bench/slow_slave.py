"""One slow slave in a sync group: what it does to send latency (``make bench-failover``).

A nameserver and a group of three brokers (sync replication, ``min_in_sync_replicas =
2``), each in its own network namespace on a bridge (chaoslib's network), with the
benchmark's producer in the root namespace. ``senders`` coroutines send 1 KiB messages
for ``seconds`` with every replica at full speed, then the same again with one slave's
link throttled by a token bucket on the bridge side of its veth (``rate_kib_s``, 256
KiB/s as the loss run that found the problem used): every byte the master ships to it
waits in that queue. ``slow_slave_p99_ratio`` is the throttled cell's send p99 over the
unthrottled one's; the cells also count the sends answered FLUSH_SLAVE_TIMEOUT and those
that failed, and how often the slow slave left and rejoined the master's in-sync set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

from chaoslib.net import Network
from metaq_load import percentile_ms

from metaq.client.producer import Producer
from metaq.client.results import SendStatus
from metaq.testing.cluster import Cluster, ClusterBuilder, broker_node
from metaq.testing.waiting import wait_until

TOPIC: Final = "slow-slave"
BODY: Final = b"s" * 1024
GROUP: Final = "slow-g"
BUILDER: Final = ClusterBuilder(groups=(GROUP,), replicas=3, replication_mode="sync", min_in_sync=2)
"""The nameserver and the three brokers; :class:`SyncGroup` gives each a host."""
NODES: Final = ("ns0", *(broker_node(GROUP, i) for i in range(3)))
SLOW_ID: Final = 2
SLOW: Final = broker_node(GROUP, SLOW_ID)


class SyncGroup:
    """The nameserver and the three brokers, each on its own host."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.net = Network.create(NODES)
        if not self.net.namespaces:
            raise RuntimeError(f"network namespaces are needed: {self.net.why_loopback}")
        self.cluster: Cluster | None = None

    def start(self) -> None:
        self.cluster = dataclasses.replace(BUILDER, hosts=self.net).start(self.root)
        asyncio.run(self.cluster.create_topic(TOPIC, queues=8, timeout_s=60))
        wait_until(lambda: len(self.in_sync()) == 3, 60, "three brokers in sync")

    @property
    def nameserver_address(self) -> str:
        assert self.cluster is not None
        return self.cluster.nameserver_addresses[0]

    def in_sync(self) -> list[int]:
        assert self.cluster is not None
        state = self.cluster.master(GROUP, 60).health(timeout_s=2.0)
        return list(state["in_sync_ids"]) if state else []

    def throttle(self, rate_kib_s: int) -> None:
        """A token bucket on the bridge side of the slow slave's veth: what reaches it."""
        veth = self.net.veths[NODES.index(SLOW)]
        subprocess.run(
            ["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", f"{rate_kib_s * 8}kbit",
             "burst", "32kb", "latency", "2s"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.net.destroy()


async def _cell(group: SyncGroup, seconds: float, senders: int) -> dict[str, Any]:
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    flips = [0]
    deadline = time.perf_counter() + seconds
    async with Producer([group.nameserver_address], send_timeout_s=10.0) as producer:

        async def sender() -> None:
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                try:
                    result = await producer.send(TOPIC, BODY)
                except Exception as exc:
                    outcomes[type(exc).__name__] += 1
                    continue
                latencies.append(time.perf_counter() - began)
                outcomes[result.status.name] += 1

        async def watch() -> None:
            slow_id = SLOW_ID
            was = True
            while time.perf_counter() < deadline:
                now = slow_id in await asyncio.to_thread(group.in_sync)
                flips[0] += now != was
                was = now
                await asyncio.sleep(0.2)  # a sampling period, not a wait on state

        await asyncio.gather(watch(), *(sender() for _ in range(senders)))
    latencies.sort()
    return {
        "sends": len(latencies),
        "p50_ms": round(percentile_ms(latencies, 0.5), 2),
        "p99_ms": round(percentile_ms(latencies, 0.99), 2),
        "max_ms": round(latencies[-1] * 1000, 2) if latencies else float("nan"),
        "flush_slave_timeouts": outcomes[SendStatus.FLUSH_SLAVE_TIMEOUT.name],
        "failed": sum(n for k, n in outcomes.items() if k not in SendStatus.__members__),
        "in_sync_changes": flips[0],
    }


def slow_slave(root: Path, seconds: float, senders: int, rate_kib_s: int) -> dict[str, Any]:
    """The unthrottled and throttled cells and their p99 ratio."""
    group = SyncGroup(root / "slow-slave")
    try:
        group.start()
        fast = asyncio.run(_cell(group, seconds, senders))
        print(f"slow slave: every replica at full speed: {fast}", flush=True)
        group.throttle(rate_kib_s)
        slow = asyncio.run(_cell(group, seconds, senders))
        print(f"slow slave: {SLOW}'s link at {rate_kib_s} KiB/s: {slow}", flush=True)
    finally:
        group.stop()
    return {
        "slow_slave_p99_ratio": round(slow["p99_ms"] / fast["p99_ms"], 2),
        "slow_slave_rate_kib_s": rate_kib_s,
        **{f"slow_slave_unthrottled_{k}": v for k, v in fast.items()},
        **{f"slow_slave_throttled_{k}": v for k, v in slow.items()},
    }
