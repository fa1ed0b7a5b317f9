"""Message trace with real processes: a traced message's send, store, each group's
deliveries and its retry hop, shown by ``metaq trace``; untraced clients write nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from metaq.client import Admin, Producer
from metaq.client.consumer import FIRST, PushConsumer
from metaq.client.message import Message
from metaq.common.names import TRACE_TOPIC, retry_topic
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.waiting import deadline, run_async, wait_until_async

TOPIC = "traced"


async def _metaq(cluster: Cluster, *args: str) -> tuple[int, str, str]:
    script = Path(sys.executable).with_name("metaq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "metaq.client.cli"]
    env = {**os.environ, "METAQ_NAMESERVERS": ",".join(cluster.nameserver_addresses)}
    process = await asyncio.create_subprocess_exec(
        *command, *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(deadline(60)):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def test_trace_shows_send_store_each_groups_deliveries_and_the_retry_hop(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder(nameserver_args=("--http-port", "0")))
    nameservers = cluster.nameserver_addresses
    run_async(cluster.create_topic(TOPIC, queues=2))
    handled: dict[str, list[Message]] = {"plain": [], "steady": [], "flaky": []}

    def handler(group: str, fail_first: bool = False) -> Callable[[Message], object]:
        async def handle(message: Message) -> None:
            handled[group].append(message)
            if fail_first and message.reconsume_times == 0:
                raise ValueError("first delivery fails")

        return handle

    async def untraced() -> str:
        """Trace off everywhere: a send and a delivery, and no trace topic anywhere."""
        plain = PushConsumer(nameservers, "plain", consume_from=FIRST)
        plain.subscribe(TOPIC, handler("plain"))  # type: ignore[arg-type]
        async with plain:
            async with Producer(nameservers) as producer:
                sent = await producer.send(TOPIC, b"quiet")

            async def delivered() -> bool:
                return len(handled["plain"]) == 1

            await wait_until_async(delivered, 30, "the untraced message is delivered")
        async with Admin(nameservers, timeout_s=10) as admin:
            topics = {row.topic for row in await admin.list_topics()}
        assert TRACE_TOPIC not in topics, "trace off wrote to the trace topic"
        return sent.msg_id

    async def traced() -> tuple[str, str, dict[str, object]]:
        steady = PushConsumer(nameservers, "steady", consume_from=FIRST, trace=True)
        steady.subscribe(TOPIC, handler("steady"))  # type: ignore[arg-type]
        flaky = PushConsumer(nameservers, "flaky", consume_from=FIRST, trace=True,
                             first_retry_level=1)  # fmt: skip
        flaky.subscribe(TOPIC, handler("flaky", fail_first=True))  # type: ignore[arg-type]
        async with steady, flaky:
            async with Producer(nameservers, trace=True) as producer:
                sent = await producer.send(TOPIC, b"loud")

            async def all_delivered() -> bool:
                loud = [m for m in handled["flaky"] if m.body == b"loud"]
                return len(loud) == 2 and any(m.body == b"loud" for m in handled["steady"])

            await wait_until_async(all_delivered, 60, "both groups handle it, flaky twice")
        async with Admin(nameservers, timeout_s=10) as admin:

            async def all_traced() -> bool:
                trace = await admin.message_trace(sent.msg_id)
                return len(trace.events) >= 5

            await wait_until_async(all_traced, 30, "every step of the message is traced")
        store = (sent.broker, sent.queue_id, sent.queue_offset)
        return (
            sent.msg_id,
            f"{store}",
            {
                "producer_client": producer.client_id,
                "steady": steady.client_id,
                "flaky": flaky.client_id,
            },
        )

    quiet_id = run_async(untraced(), timeout_s=60)
    loud_id, _, clients = run_async(traced(), timeout_s=120)

    code, out, err = run_async(_metaq(cluster, "trace", loud_id, "--json"))
    assert code == 0, err
    shown = json.loads(out)
    message = shown["message"]
    assert message["topic"] == TOPIC and message["body"] == "loud"
    steps = [(e["kind"], e["group"], e.get("attempt", 0), e.get("status", ""),
              e.get("via", "")) for e in shown["events"]]  # fmt: skip
    send = [e for e in shown["events"] if e["kind"] == "send"]
    assert len(send) == 1
    assert send[0]["client_id"] == clients["producer_client"]
    assert (send[0]["broker"], send[0]["queue_id"], send[0]["queue_offset"]) == (
        message["broker_name"],
        message["queue_id"],
        message["queue_offset"],
    )
    assert send[0]["store_ms"] == message["store_timestamp_ms"]
    assert ("consume", "steady", 1, "ok", TOPIC) in steps
    assert ("consume", "flaky", 1, "failed", TOPIC) in steps
    assert ("retry", "flaky", 1, "", retry_topic("flaky")) in steps
    assert ("consume", "flaky", 2, "ok", retry_topic("flaky")) in steps
    kinds = [s[0] for s in steps]
    assert kinds[0] == "send" and len(steps) == 5, steps
    flaky_steps = [s[:2] for s in steps if s[1] == "flaky"]
    assert flaky_steps == [("consume", "flaky"), ("retry", "flaky"), ("consume", "flaky")]
    by_client = {e["group"]: e["client_id"] for e in shown["events"] if e["kind"] == "consume"}
    assert by_client == {"steady": clients["steady"], "flaky": clients["flaky"]}

    code, out, err = run_async(_metaq(cluster, "trace", loud_id))
    assert code == 0, err
    assert "retry" in out and f"to {retry_topic('flaky')}" in out and "steady" in out

    # The message of the untraced producer: no send step; only the traced groups' steps.
    code, out, err = run_async(_metaq(cluster, "trace", quiet_id, "--json"))
    assert code == 0, err
    quiet = json.loads(out)["events"]
    assert {e["group"] for e in quiet} == {"steady", "flaky"}
    assert all(e["kind"] != "send" for e in quiet)

    # The console's message page shows the same trace.
    console = f"http://{cluster.nameservers[0].http_address}/console/messages?msg_id={loud_id}"
    with urllib.request.urlopen(console, timeout=deadline(30)) as answer:
        page = answer.read().decode()
    assert "<caption>Trace</caption>" in page
    trace_part = page[page.index("<caption>Trace</caption>") :]
    for text in (clients["producer_client"], clients["steady"], clients["flaky"],
                 f"to {retry_topic('flaky')}", f"via {retry_topic('flaky')}"):  # fmt: skip
        assert text in trace_part, text
