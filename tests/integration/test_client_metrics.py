"""The client's Prometheus collector with real processes: scraped over HTTP after real
sends and deliveries, its counts match what the application saw."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from metaq.client import Producer
from metaq.client.consumer import FIRST, PushConsumer
from metaq.client.message import Message
from metaq.client.metrics import ClientMetrics
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.waiting import deadline, run_async, wait_until_async

TOPIC = "observed"
SENT = 50


def test_a_scrape_after_real_sends_and_deliveries_counts_them(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder())
    nameservers = cluster.nameserver_addresses
    run_async(cluster.create_topic(TOPIC, queues=2))
    registry = CollectorRegistry()
    metrics = ClientMetrics(registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    handled: list[Message] = []

    async def handle(message: Message) -> None:
        handled.append(message)

    async def scenario() -> None:
        consumer = PushConsumer(nameservers, "watched", consume_from=FIRST, observers=[metrics])
        consumer.subscribe(TOPIC, handle)
        async with consumer:
            async with Producer(nameservers, group="watcher", observers=[metrics]) as producer:
                for n in range(SENT // 2):
                    await producer.send(TOPIC, b"one-%d" % n)
                await producer.send_batch(TOPIC, [b"batch-%d" % n for n in range(SENT // 2)])

            async def all_handled() -> bool:
                return len(handled) == SENT

            await wait_until_async(all_handled, 30, "every message is handled")

    try:
        run_async(scenario(), timeout_s=90)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=deadline(10)) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(deadline(10))
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    producer = (("group", "watcher"), ("topic", TOPIC))
    consumer = (("group", "watched"), ("topic", TOPIC))
    assert got[("metaq_client_sent_messages_total", producer)] == SENT
    # One observation per call: 25 sends and one batch.
    assert got[("metaq_client_send_latency_seconds_count", producer)] == SENT // 2 + 1
    assert 0 < got[("metaq_client_send_latency_seconds_sum", producer)] < 30
    assert got[("metaq_client_pulled_messages_total", consumer)] == SENT
    assert got[("metaq_client_pull_latency_seconds_count", consumer)] >= 1
    ok = (("group", "watched"), ("outcome", "ok"), ("topic", TOPIC))
    assert got[("metaq_client_consumed_messages_total", ok)] == SENT
    assert got[("metaq_client_consume_latency_seconds_count", consumer)] == SENT
    assert not [name for name, _ in got if name.endswith("_created")]
