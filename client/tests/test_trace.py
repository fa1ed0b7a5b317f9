"""Message trace events: their records, reading them back, and a dispatcher that never
holds up or fails the client it traces."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from metaq.client.errors import UnknownTopic
from metaq.client.handlers import ReconsumeLater
from metaq.client.message import Message, decode_message
from metaq.client.results import SendResult, SendStatus
from metaq.client.retry import PROP_ORIGIN_MSG_ID, PROP_RETRY_TOPIC
from metaq.client.trace import (
    CONSUME,
    EVENTS_PER_RECORD,
    RETRY,
    SEND,
    TraceDispatcher,
    TraceEvent,
    decode_events,
    trace_records,
)
from metaq.common.names import TRACE_TOPIC, retry_topic
from metaq.common.record import MAX_KEYS_BYTES

ID = "ab" * 16


class _NoRoutes:
    """A route cache that knows no topic: every trace write has nowhere to go."""

    credentials = None
    tls = None

    def cached(self, topic: str) -> None:
        return None

    async def route(self, topic: str, **_: Any) -> None:
        raise UnknownTopic(f"no route for {topic}")


def _dispatcher(**options: Any) -> TraceDispatcher:
    return TraceDispatcher(_NoRoutes(), "me@1@x", **options)  # type: ignore[arg-type]


def test_trace_records_pack_events_keyed_by_as_many_message_ids_as_keys_hold() -> None:
    ids = [f"{n:032x}" for n in range(EVENTS_PER_RECORD + 1)]
    events = [TraceEvent(SEND, i, "t", "P", "me", "host", 5, status="OK") for i in ids]
    events.append(TraceEvent(CONSUME, ids[0], "t", "G", "c", "host", 6, attempt=1))
    records = trace_records(events)
    stored = [decode_message(bytes(r), verify=False) for r in records]  # the broker seals
    assert [m.topic for m in stored] == [TRACE_TOPIC, TRACE_TOPIC]
    assert stored[0].keys == tuple(ids[:-1])
    assert stored[1].keys == (ids[-1], ids[0])
    assert len(" ".join(stored[0].keys)) <= MAX_KEYS_BYTES
    assert decode_events(ids[0], [m.body for m in stored]) == [events[0], events[-1]]


def test_events_read_back_are_the_messages_own_in_order_and_garbage_is_skipped() -> None:
    def encode(event: TraceEvent) -> bytes:
        return msgspec.json.encode([event])

    later = TraceEvent(CONSUME, ID, "t", "G", "c", "h", 20, attempt=1)
    send = TraceEvent(SEND, ID, "t", "P", "p", "h", 10)
    retry = TraceEvent(RETRY, ID, "t", "G", "c", "h", 20, via=retry_topic("G"))
    other = TraceEvent(SEND, "cd" * 16, "t", "P", "p", "h", 1)
    bodies = [encode(later), b"not json", encode(other), encode(retry), encode(send)]
    # Same millisecond: a delivery comes before the retry it caused.
    assert decode_events(ID, bodies) == [send, later, retry]


def test_a_retried_copy_is_traced_under_its_original_id_and_topic() -> None:
    async def scenario() -> list[TraceEvent]:
        dispatcher = _dispatcher()
        copy = Message(
            retry_topic("G"), b"x", msg_id="ef" * 16, reconsume_times=1,
            properties={PROP_ORIGIN_MSG_ID: ID, PROP_RETRY_TOPIC: "orders"},
        )  # fmt: skip
        dispatcher.consumed("G", "broker-a", copy, ReconsumeLater("no"), 7, 0.002)
        events = [e for e, _, _ in dispatcher._pending]
        await dispatcher.close()
        return events

    [event] = asyncio.run(scenario())
    assert (event.msg_id, event.topic, event.via) == (ID, "orders", retry_topic("G"))
    assert (event.attempt, event.status, event.cost_ms) == (2, "later", 2.0)


def test_a_full_queue_drops_the_oldest_and_failed_writes_are_counted_not_raised() -> None:
    async def scenario() -> tuple[TraceDispatcher, list[str]]:
        dispatcher = _dispatcher(max_pending=3, interval_s=60)
        results = [SendResult(SendStatus.OK, f"{n:032x}", "t", "broker-a", 0, n) for n in range(5)]
        dispatcher.sent("P", "t", results, 1, 0.001)
        kept = [e.msg_id for e, _, _ in dispatcher._pending]
        await dispatcher.close()  # nowhere to write: each event lost, counted
        return dispatcher, kept

    dispatcher, kept = asyncio.run(scenario())
    assert kept == [f"{n:032x}" for n in (2, 3, 4)]
    assert (dispatcher.dropped, dispatcher.written) == (5, 0)


def test_the_trace_topic_itself_is_never_traced() -> None:
    async def scenario() -> int:
        dispatcher = _dispatcher()
        result = SendResult(SendStatus.OK, ID, TRACE_TOPIC, "broker-a", 0, 0)
        dispatcher.sent("P", TRACE_TOPIC, [result], 1, 0.001)
        dispatcher.consumed("G", "broker-a", Message(TRACE_TOPIC, b"{}"), None, 1, 0.0)
        queued = len(dispatcher._pending)
        await dispatcher.close()
        return queued

    assert asyncio.run(scenario()) == 0
