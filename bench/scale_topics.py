"""Topic metadata: creating 10,000 topics on a real cluster, and the route a client
downloads for one of them.

One nameserver and one broker (the deployed store settings) run as processes. Topics of
8 queues are created one after another through the broker's admin API, as ``metaq
topic create`` does, each timed. At checkpoints (the first topic, then every quarter of
the way) the figures are taken: the median create time of the topics since the last
checkpoint, the time until the nameserver routes the newest topic, the size of the
``GetRoute`` answer a client downloads for one topic (the client asks per topic it uses,
never for the whole table), the broker's topic file and the processes' RSS.
The run stops creating after ``budget_s`` and says how far it got.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from scale_groups import rss_mib

TOPICS: Final = 10_000
QUICK_TOPICS: Final = 400
QUEUES: Final = 8


def _checkpoints(total: int) -> list[int]:
    return [1, total // 4, total // 2, 3 * total // 4, total]


def _topic_files_kib(data_dir: Path) -> float:
    """The broker's topic table on disk: the snapshot and the change log after it."""
    files = (data_dir / "topics.json", data_dir / "topics.log")
    return round(sum(f.stat().st_size for f in files if f.exists()) / 1024, 1)


def topic_name(index: int) -> str:
    return f"ScaleTopic{index:06d}"


async def _route(address: str, topic: str, timeout_s: float) -> tuple[int, float, float]:
    """(answer bytes, seconds until routed, seconds of the last GetRoute)."""
    import grpc

    from metaq.common.v1 import control_pb2 as pb
    from metaq.common.v1.control_pb2_grpc import NameServerStub

    began = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = NameServerStub(channel)
        while True:
            asked = time.perf_counter()
            try:
                reply = await stub.GetRoute(pb.GetRouteRequest(topic=topic), timeout=10)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.NOT_FOUND:
                    raise
                if time.perf_counter() - began > timeout_s:
                    raise TimeoutError(f"{topic} not routed after {timeout_s:.0f} s") from None
                await asyncio.sleep(0.02)
                continue
            answered = time.perf_counter()
            return reply.ByteSize(), answered - began, answered - asked


async def _create(cluster: Any, total: int, budget_s: float) -> dict[str, Any]:
    from metaq.client.admin import Admin, TopicSettings

    broker = cluster.broker("topics")
    nameserver = cluster.nameservers[0]
    address = cluster.nameserver_addresses[0]
    settings = TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
    checkpoints = set(_checkpoints(total))
    rows: list[dict[str, Any]] = []
    each: list[float] = []
    since = 0
    stopped = None
    began = time.perf_counter()
    async with Admin() as admin:
        for index in range(1, total + 1):
            started = time.perf_counter()
            await admin.put_topic(broker.http_url, topic_name(index), settings)
            each.append(time.perf_counter() - started)
            if time.perf_counter() - began > budget_s:
                stopped = f"budget of {budget_s:.0f} s spent after {index:,} topics"
            if index in checkpoints or stopped:
                size, routed_s, get_s = await _route(address, topic_name(index), 60)
                window = each[since:]
                since = index
                rows.append(
                    {
                        "topics": index,
                        "create_ms_median": round(statistics.median(window) * 1e3, 2),
                        "create_ms_max": round(max(window) * 1e3, 2),
                        "routed_after_s": round(routed_s, 3),
                        "route_bytes": size,
                        "get_route_ms": round(get_s * 1e3, 2),
                        "broker_rss_mib": rss_mib(broker.proc.pid),
                        "nameserver_rss_mib": rss_mib(nameserver.process.pid),
                        "topic_file_kib": _topic_files_kib(cluster.data_dir("topics")),
                    }
                )
            if stopped:
                break
    tenth = max(1, min(1_000, len(each) // 10))
    return {
        "topics_rows": rows,
        "topics_created": len(each),
        "topics_stopped": stopped,
        "topics_create_s": round(sum(each), 1),
        "topic_create_window": tenth,
        "topic_create_ms_median_first": round(statistics.median(each[:tenth]) * 1e3, 2),
        "topic_create_ms_median_last": round(statistics.median(each[-tenth:]) * 1e3, 2),
    }


def measure(total: int, budget_s: float) -> dict[str, Any]:
    from metaq.testing.cluster import ClusterBuilder

    builder = ClusterBuilder(groups=("topics",), small_store=False, ready_timeout_s=120)
    work = Path(tempfile.mkdtemp(prefix="metaq-bench-topics-"))
    out: dict[str, Any] = {}
    try:
        with builder.start(work) as cluster:
            out = asyncio.run(_create(cluster, total, budget_s))
    except Exception as exc:  # the result says what failed
        out["topics_failed"] = f"{type(exc).__name__}: {exc}"[:1500]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def figures(result: dict[str, Any]) -> dict[str, Any]:
    out = dict(result)
    rows = result.get("topics_rows", [])
    if rows and "topic_create_ms_median_first" in result:
        out["topic_create_slowdown_last_vs_first"] = round(
            result["topic_create_ms_median_last"] / result["topic_create_ms_median_first"], 2
        )
        out["route_bytes_one_topic_at_1_topic"] = rows[0]["route_bytes"]
        out["route_bytes_one_topic_at_largest"] = rows[-1]["route_bytes"]
        out["route_largest_topics"] = rows[-1]["topics"]
    return out


def print_table(result: dict[str, Any]) -> None:
    keys = ("create_ms_median", "create_ms_max", "routed_after_s", "route_bytes",
            "get_route_ms", "broker_rss_mib", "nameserver_rss_mib", "topic_file_kib")  # fmt: skip
    print(
        "| topics | create ms (median since last) | create ms (max) | routed after s "
        "| route bytes | GetRoute ms | broker RSS MiB | nameserver RSS MiB | topic files KiB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in result.get("topics_rows", []):
        print(f"| {row['topics']:,} | " + " | ".join(f"{row[k]:,}" for k in keys) + " |")
    if "topics_failed" in result:
        print(f"failed: {result['topics_failed'][:300]}")


def chart(result: dict[str, Any], before: dict[str, Any], path: Path) -> None:
    from scale_chart import draw

    panels = (
        ("create_ms_median", "create, ms (median since last point)"),
        ("routed_after_s", "routed by the nameserver after, s"),
        ("route_bytes", "one topic's route, bytes"),
        ("topic_file_kib", "broker's topic files, KiB"),
        ("broker_rss_mib", "broker RSS, MiB"),
        ("nameserver_rss_mib", "nameserver RSS, MiB"),
    )
    draw(result.get("topics_rows", []), before.get("topics_rows", []), "topics", panels,
         "Creating topics one by one on one broker (8 queues each, 2 cores)", path,
         columns=3)  # fmt: skip
