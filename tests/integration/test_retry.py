"""Consumption failures with real processes: retries on the delay schedule, then the
dead-letter queue; other groups untouched; the failing group's offsets move on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable

from metaq.client.consumer import FIRST, LATER, ConsumeResult, PushConsumer
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer
from metaq.client.retry import PROP_RETRY_TOPIC
from metaq.common.names import dlq_topic
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.waiting import run_async, wait_until_async

TOPIC = "jobs"


def test_a_failing_message_is_retried_on_schedule_then_dead_lettered(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder())
    nameservers = cluster.nameserver_addresses
    run_async(cluster.create_topic(TOPIC, queues=2))
    bodies = [b"ok-%d" % i for i in range(20)] + [b"poison"]
    calls: dict[str, dict[bytes, list[float]]] = {"failing": defaultdict(list),
                                                   "healthy": defaultdict(list)}  # fmt: skip
    seen_topics: set[str] = set()

    async def scenario() -> None:
        async def failing(message: Message) -> ConsumeResult | None:
            calls["failing"][message.body].append(time.monotonic())
            seen_topics.add(message.topic)
            if message.body == b"poison":
                if message.reconsume_times == 1:
                    return LATER  # "not now" counts like a failure
                raise ValueError("cannot handle poison")
            return None

        async def healthy(message: Message) -> None:
            calls["healthy"][message.body].append(time.monotonic())

        # Retries at the broker's levels 1 and 2 (1 s, 5 s), then the DLQ.
        bad = PushConsumer(nameservers, "failing", consume_from=FIRST,
                           first_retry_level=1, max_reconsume_times=2)  # fmt: skip
        bad.subscribe(TOPIC, failing)
        good = PushConsumer(nameservers, "healthy", consume_from=FIRST)
        good.subscribe(TOPIC, healthy)
        async with bad, good:
            async with Producer(nameservers) as producer:
                for body in bodies:
                    await producer.send(TOPIC, body)

            async def poison_sent_back_thrice() -> bool:
                return len(calls["failing"][b"poison"]) >= 3 and bad.stats.sent_back >= 3

            async def all_handled() -> bool:
                return len(calls["healthy"]) >= len(bodies)

            await wait_until_async(poison_sent_back_thrice, 30, "the poison is sent back 3 times")
            await wait_until_async(all_handled, 30, "the healthy group handled every message")
            dead = await read_dlq(nameservers)
            assert [m.body for m in dead] == [b"poison"]
            assert dead[0].properties[PROP_RETRY_TOPIC] == TOPIC
            assert dead[0].reconsume_times == 3

    run_async(scenario(), timeout_s=60)

    attempts = calls["failing"][b"poison"]
    assert len(attempts) == 3, "the first delivery and two retries"
    assert attempts[1] - attempts[0] >= 0.9  # level 1: 1 s
    assert attempts[2] - attempts[1] >= 4.9  # level 2: 5 s
    assert seen_topics == {TOPIC}, "retries reach the handler under the original topic"
    assert all(len(times) == 1 for body, times in calls["failing"].items() if body != b"poison")
    listed = subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", "dlq", "list", "--group", "failing",
         "-n", nameservers[0], "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    rows = json.loads(listed.stdout)
    assert [(r["topic"], r["tries"], r["body"]) for r in rows] == [(TOPIC, 3, "poison")]
    assert "cannot handle poison" in rows[0]["failure"]
    shown = subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", "dlq", "show", "--group", "failing",
         "-n", nameservers[0], "--msg-id", rows[0]["msg_id"], "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert json.loads(shown.stdout)["body"] == "poison"
    resent = subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", "dlq", "resend", "--group", "failing",
         "-n", nameservers[0], "--msg-id", rows[0]["msg_id"]],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert resent.returncode == 0, resent.stderr
    assert f"to {TOPIC}" in resent.stdout
    # The other group saw every message once and no retry.
    assert sorted(calls["healthy"]) == sorted(bodies)
    assert all(len(times) == 1 for times in calls["healthy"].values())


async def read_dlq(nameservers: list[str]) -> list[Message]:
    """The group's dead letters, read by a pull consumer."""
    async with PullConsumer(nameservers, "dlq-reader") as reader:
        route = await reader.routes.route(dlq_topic("failing"))
        found: list[Message] = []
        for queue in route.read_queues:
            result = await reader.pull(dlq_topic("failing"), queue, 0, 32, 0)
            found += result.messages
        return found
