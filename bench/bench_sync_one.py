"""One-at-a-time sends to a sync-replicated pair, with the CPU each process spends per send.

``bench-compare``'s (a) cell of ``metaq_sync_replicated`` alone, repeated: the pair of
``metaq_system.replicated_pair`` (sync replication, ASYNC flush, the controller on a
nameserver), the producer of ``metaq_load``, 1 KiB bodies (``--body-bytes 128`` for the
other size). Each round prints msgs/s, the send's p50/p99, and the user and system CPU
per send of the master, the slave and this client (from ``/proc``), so that a change to
the hops is judged by what it costs per send even when the machine is shared and msgs/s
moves with the load; and the slave's fetches the master answered per send (from its
``metaq_rpc_latency_seconds``), 1.0 when each send's bytes go out on the fetch the last
one's acknowledgement parked, more when answers without bytes come between (a fetch's
``wait_ms`` running out, a confirmed-offset notice); and the share of the round the
producer's loop spent polling for answers (``metaq.client.answer_poll``: it stops after a
wait longer than its window, and a sleeping client makes the next wait longer, so a
round can settle in either state). ``--one-broker`` runs the one-broker
row instead (``metaq_system.single_broker``), the ratio's denominator.

The last line is one JSON object with every round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from metaq_load import Budget, one_at_a_time, percentile_ms, ready_producer
from metaq_system import PAIR, QUEUES, TOPIC, system

from metaq.client.admin import Admin

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


async def _fetches_answered(master_http: str) -> float:
    """REPLICA_FETCH requests the master has answered so far."""
    async with Admin() as admin:
        samples = await admin.metrics(master_http)
    key = ("metaq_rpc_latency_seconds_count", (("request_type", "REPLICA_FETCH"),))
    return samples.get(key, 0.0)


def _cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) * _TICK_S, int(fields[12]) * _TICK_S


async def _rounds(
    nameserver: str,
    pids: dict[str, int],
    seconds: float,
    rounds: int,
    body_bytes: int,
    master_http: str | None,
) -> list[dict[str, Any]]:
    producer = await ready_producer(nameserver, TOPIC)
    body = os.urandom(body_bytes)
    results: list[dict[str, Any]] = []
    try:
        await one_at_a_time(producer, TOPIC, body, Budget(1.0))  # warm-up, unmeasured
        for _ in range(rounds):
            fetches = await _fetches_answered(master_http) if master_http else 0.0
            before = {name: _cpu_s(pid) for name, pid in pids.items()}
            mine = resource.getrusage(resource.RUSAGE_SELF)
            polled, began = producer.sender.answer_poll.polled_s, time.perf_counter()
            rate, latencies = await one_at_a_time(producer, TOPIC, body, Budget(seconds))
            mine_after = resource.getrusage(resource.RUSAGE_SELF)
            polled = (producer.sender.answer_poll.polled_s - polled) / (time.perf_counter() - began)
            sends = len(latencies)
            if master_http:
                fetches = await _fetches_answered(master_http) - fetches
            result: dict[str, Any] = {
                "msgs_s": round(rate),
                "p50_us": round(percentile_ms(latencies, 0.5) * 1000),
                "p99_us": round(percentile_ms(latencies, 0.99) * 1000),
            }
            for name, pid in pids.items():
                user, system = _cpu_s(pid)
                result[f"{name}_user_us"] = round((user - before[name][0]) / sends * 1e6)
                result[f"{name}_sys_us"] = round((system - before[name][1]) / sends * 1e6)
            result["client_user_us"] = round((mine_after.ru_utime - mine.ru_utime) / sends * 1e6)
            result["client_sys_us"] = round((mine_after.ru_stime - mine.ru_stime) / sends * 1e6)
            result["client_polled_pct"] = round(100 * polled)
            if master_http:
                result["fetches_per_send"] = round(fetches / sends, 3)
            print(" ".join(f"{k}={v}" for k, v in result.items()), flush=True)
            results.append(result)
    finally:
        await producer.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body-bytes", type=int, default=1024, help="message body size")
    parser.add_argument("--one-broker", action="store_true", help="one broker, no slave")
    args = parser.parse_args()
    builder = system(groups=("bench-one",)) if args.one_broker else PAIR
    (group,) = builder.groups
    with (
        tempfile.TemporaryDirectory(prefix="bench-sync-one-") as tmp,
        builder.start(Path(tmp)) as cluster,
    ):
        asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, timeout_s=60))
        master_id = cluster.master_id(group, 60)
        master_http = None
        if args.one_broker:
            pids = {"broker": cluster.broker(group).proc.pid}
        else:
            cluster.wait_in_sync(group, [0, 1], 60)
            slave = cluster.broker(group, 1 - master_id)
            master = cluster.broker(group, master_id)
            pids = {"master": master.proc.pid, "slave": slave.proc.pid}
            master_http = master.http_url
        nameserver = cluster.nameserver_addresses[0]
        results = asyncio.run(
            _rounds(nameserver, pids, args.seconds, args.rounds, args.body_bytes, master_http)
        )
    summary = {"one_broker": args.one_broker, "body_bytes": args.body_bytes, "rounds": results}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
