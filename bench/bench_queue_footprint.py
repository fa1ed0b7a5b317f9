"""What each queue costs a broker: descriptors, memory mappings, resident memory, disk.

One nameserver and one broker with the deployed store settings (1 GiB commitlog
segments, 300,000-entry consume-queue files). The broker's descriptors, mappings and
resident set, the process's own memory (anonymous) apart from the pages of files it maps
(``/proc``), and the blocks its data directory takes are read three times:
before a topic of ``--queues`` queues exists, once it exists with no message (idle
queues), and once every queue holds one small message that a pull has returned (the
consume-queue file is then open, mapped and touched). The per-queue figures are the
differences divided by the queue count. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from metaq.common.record import encode
from metaq.common.v1.data_pb2 import PullResponse
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.cluster import ClusterBuilder

TOPIC = "footprint"
GROUP = "footprint"


def _disk_bytes(root: Path) -> int:
    """Bytes the files under ``root`` take on disk (allocated blocks, as ``du``)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def _sample(broker: BrokerProcess, data_dir: Path) -> dict[str, int]:
    pid = broker.proc.pid
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )

    def kib(field: str) -> int:
        return int(status[field].split()[0]) * 1024

    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "mappings": len(Path(f"/proc/{pid}/maps").read_text().splitlines()),
        "rss_bytes": kib("VmRSS"),
        "rss_anon_bytes": kib("RssAnon"),
        "rss_file_bytes": kib("RssFile"),
        "consumequeue_disk_bytes": _disk_bytes(data_dir / "consumequeue"),
        "disk_bytes": _disk_bytes(data_dir),
    }


async def _one_message_each(broker: BrokerProcess, queues: int) -> None:
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        for queue in range(queues):
            await client.send(TOPIC, queue, [encode(TOPIC, b"x" * 100, queue_id=queue)])
        for queue in range(queues):  # returned by a pull: dispatched, its file mapped
            while True:
                answer, _ = await client.pull(TOPIC, queue, 0, group=GROUP, max_messages=1)
                if answer.status == PullResponse.FOUND:
                    break
                await asyncio.sleep(0.05)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=10_000, help="queues of the topic")
    args = parser.parse_args()
    builder = ClusterBuilder(groups=("footprint",), small_store=False, ready_timeout_s=120)
    with (
        tempfile.TemporaryDirectory(prefix="bench-queues-") as tmp,
        builder.start(Path(tmp)) as cluster,
    ):
        broker = cluster.broker("footprint")
        data_dir = cluster.data_dir("footprint")
        before = _sample(broker, data_dir)
        asyncio.run(cluster.create_topic(TOPIC, queues=args.queues, timeout_s=120))
        idle = _sample(broker, data_dir)
        asyncio.run(_one_message_each(broker, args.queues))
        written = _sample(broker, data_dir)

    def per_queue(after: dict[str, int], base: dict[str, int]) -> dict[str, float]:
        return {k: round((after[k] - base[k]) / args.queues, 2) for k in after}

    result = {
        "queues": args.queues,
        "before": before,
        "idle": idle,
        "one_message_each": written,
        "per_idle_queue": per_queue(idle, before),
        "per_queue_with_a_message": per_queue(written, before),
    }
    for name in ("per_idle_queue", "per_queue_with_a_message"):
        print(name, " ".join(f"{k}={v}" for k, v in result[name].items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
