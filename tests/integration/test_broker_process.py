"""The broker as a process: real sockets, the framing codec, SIGTERM and kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.common.auth import ENV_VAR
from metaq.common.errors import ErrorCode
from metaq.common.framing import PREFIX, FrameDecoder, FrameType, encode_frame
from metaq.common.record import HEADER_SIZE, STAMP_AT, decode, encode
from metaq.common.v1.data_pb2 import ErrorResponse, PullResponse, SendRequest, SendResponse
from metaq.testing import BrokerError, BrokerProcess, DataClient, run_async
from metaq.testing.waiting import deadline, wait_until_async

# ------------------------------------------------------------------------------------------
# helpers


async def connect(broker: BrokerProcess) -> DataClient:
    return await DataClient.connect(broker.data_host, broker.data_port)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, message: str) -> None:
    """Re-check an async condition until it holds; fail naming ``message`` at the deadline."""
    await wait_until_async(check, timeout_s, message)


def split(payload: bytes) -> list[bytes]:
    """Raw records of a PULL payload, by their size fields."""
    records, pos = [], 0
    while pos < len(payload):
        (size,) = struct.unpack_from("<I", payload, pos)
        records.append(payload[pos : pos + size])
        pos += size
    return records


async def pull_all(
    client: DataClient, topic: str, queue_id: int, count: int, *, start: int = 0
) -> list[bytes]:
    """``count`` records from ``start`` on, long-polling until the dispatcher shows them."""
    records: list[bytes] = []
    offset = start
    while len(records) < count:
        response, payload = await client.pull(
            topic, queue_id, offset, max_messages=256, long_poll_timeout_ms=5000
        )
        assert response.status in (PullResponse.FOUND, PullResponse.OFFSET_OVERFLOW_ONE), response
        records += split(payload)
        offset = response.next_offset
    return records


async def write_offset(broker: BrokerProcess) -> int:
    health = await Admin().health(broker.http_url)
    assert health.writable, health
    return health.commitlog_write_offset


async def parked_pulls(broker: BrokerProcess) -> float:
    return (await Admin().metrics(broker.http_url))[("metaq_long_polls_parked", ())]


# ------------------------------------------------------------------------------------------
# send and pull


def test_single_and_batch_sends_pull_back_byte_identical_records(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "RoundTrip", TopicSettings(read_queues=4, write_queues=4)
        )
        client = await connect(broker)
        try:
            single = encode("RoundTrip", b"hello", queue_id=1, keys=["k-0"], tags="a")
            first = await client.send("RoundTrip", 1, [single])
            assert first.status == SendResponse.OK
            assert list(first.queue_offsets) == [0]
            batch = [
                encode("RoundTrip", f"m{i}".encode() * 100, queue_id=1, tags="b", keys=[f"k-{i}"])
                for i in range(1, 11)
            ]
            second = await client.send("RoundTrip", 1, batch)
            assert second.status == SendResponse.OK
            assert list(second.queue_offsets) == list(range(1, 11))
            sent = [single, *batch]
            ids = [*first.msg_ids, *second.msg_ids]
            commitlog_offsets = [*first.commitlog_offsets, *second.commitlog_offsets]

            pulled = await pull_all(client, "RoundTrip", 1, len(sent))
        finally:
            await client.close()

        assert len(pulled) == len(sent)
        for n, (raw, original) in enumerate(zip(pulled, sent, strict=True)):
            record = decode(raw)  # checks the CRC the broker sealed
            assert record.msg_id == ids[n] == bytes(original[64:80])
            assert record.queue_offset == n
            assert record.commitlog_offset == commitlog_offsets[n]
            # Byte for byte what the producer built, except the broker's stamp and CRC.
            assert raw[:8] == original[:8]
            assert raw[12:STAMP_AT] == original[12:STAMP_AT]
            assert raw[STAMP_AT + 32 :] == original[STAMP_AT + 32 :]

    run_async(scenario())


def test_parked_long_poll_is_answered_as_soon_as_a_message_arrives(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "LongPoll", TopicSettings(read_queues=4, write_queues=4)
        )
        consumer, producer = await connect(broker), await connect(broker)
        try:
            loop = asyncio.get_running_loop()
            began = loop.time()
            # Parked far longer than the bound below: only the arrival can answer it in time.
            pull = asyncio.ensure_future(
                consumer.pull("LongPoll", 2, 0, long_poll_timeout_ms=30_000)
            )

            async def parked() -> bool:
                return await parked_pulls(broker) >= 1

            await eventually(parked, 5, "the pull is parked")
            assert not pull.done()
            await producer.send("LongPoll", 2, [encode("LongPoll", b"wake up", queue_id=2)])
            response, payload = await pull
            elapsed = loop.time() - began
        finally:
            await consumer.close()
            await producer.close()
        assert response.status == PullResponse.FOUND
        assert decode(payload).body == b"wake up"
        assert elapsed < deadline(1.0), f"the parked pull took {elapsed:.3f} s"

    run_async(scenario())


def test_long_poll_times_out_with_the_empty_status(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "Quiet", TopicSettings(read_queues=4, write_queues=4)
        )
        client = await connect(broker)
        try:
            loop = asyncio.get_running_loop()
            began = loop.time()
            response, payload = await client.pull("Quiet", 0, 0, long_poll_timeout_ms=300)
            elapsed = loop.time() - began
        finally:
            await client.close()
        assert response.status == PullResponse.NO_MESSAGE_IN_QUEUE
        assert payload == b""
        assert 0.25 <= elapsed < deadline(3.0)

    run_async(scenario())


# ------------------------------------------------------------------------------------------
# bad input: explicit errors, nothing stored


def _record_with_topic(topic: str, body: bytes = b"x", queue_id: int = 0) -> bytearray:
    """A record naming ``topic`` even if it is illegal (encode() refuses those)."""
    record = encode("t" * len(topic), body, queue_id=queue_id)
    record[HEADER_SIZE : HEADER_SIZE + len(topic)] = topic.encode()
    return record


SendCase = Callable[[DataClient], Awaitable[SendResponse]]

BAD_SENDS: dict[str, tuple[SendCase, ErrorCode, str]] = {
    "unknown topic": (
        lambda c: c.send("NoSuchTopic", 0, [encode("NoSuchTopic", b"x")]),
        ErrorCode.UNKNOWN_TOPIC,
        "auto_create_topics is off",
    ),
    "oversized message": (
        lambda c: c.send("Strict", 0, [encode("Strict", bytes(300 * 1024))]),
        ErrorCode.INVALID_MESSAGE,
        "the limit is 262144",
    ),
    "illegal topic name": (
        lambda c: c.send("bad/topic", 0, [_record_with_topic("bad/topic")]),
        ErrorCode.INVALID_MESSAGE,
        "illegal topic name",
    ),
    "queue id out of range": (
        lambda c: c.send("Strict", 4, [encode("Strict", b"x", queue_id=4)]),
        ErrorCode.INVALID_MESSAGE,
        "out of range",
    ),
    "one bad record in a batch": (
        lambda c: c.send(
            "Strict",
            0,
            [encode("Strict", b"good"), encode("Strict", bytes(300 * 1024)), encode("Strict", b"")],
        ),
        ErrorCode.INVALID_MESSAGE,
        "the limit is",
    ),
    "record count disagrees": (
        lambda c: c.request(
            FrameType.SEND,
            SendRequest(topic="Strict", queue_id=0, record_count=3),
            encode("Strict", b"x"),
        ),
        ErrorCode.INVALID_MESSAGE,
        "record_count says 3",
    ),
    "record for another queue": (
        lambda c: c.send("Strict", 0, [encode("Strict", b"x", queue_id=1)]),
        ErrorCode.INVALID_MESSAGE,
        "a batch goes to one queue",
    ),
    "record for another topic": (
        lambda c: c.send("Strict", 0, [encode("Other", b"x")]),
        ErrorCode.INVALID_MESSAGE,
        "a batch goes to one topic",
    ),
    "truncated record": (
        lambda c: c.send("Strict", 0, [encode("Strict", b"x" * 64)[:-10]]),
        ErrorCode.INVALID_MESSAGE,
        "claims",
    ),
    "garbage header": (
        lambda c: c.request(FrameType.SEND, b"\xff\xff\xff", encode("Strict", b"x")),
        ErrorCode.INVALID_MESSAGE,
        "not a valid protobuf",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SENDS))
def test_bad_sends_get_explicit_errors_and_store_nothing(broker: BrokerProcess, case: str) -> None:
    send, code, words = BAD_SENDS[case]

    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "Strict", TopicSettings(read_queues=4, write_queues=4)
        )
        client = await connect(broker)
        try:
            before = await write_offset(broker)
            with pytest.raises(BrokerError) as caught:
                await send(client)
            assert caught.value.code is code, caught.value
            assert words in caught.value.detail
            assert not caught.value.retriable
            assert await write_offset(broker) == before, "a refused send stored bytes"
            await client.heartbeat()  # the connection carries on
        finally:
            await client.close()
        assert "NoSuchTopic" not in await Admin().broker_topics(broker.http_url)

    run_async(scenario())


def test_wrong_pull_offsets_and_queues_get_explicit_answers(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "Offsets", TopicSettings(read_queues=2, write_queues=2)
        )
        client = await connect(broker)
        try:
            records = [encode("Offsets", b"m%d" % i) for i in range(3)]
            await client.send("Offsets", 0, records)
            await pull_all(client, "Offsets", 0, 3)

            badly, payload = await client.pull("Offsets", 0, 100)
            assert badly.status == PullResponse.OFFSET_OVERFLOW_BADLY
            assert (badly.next_offset, badly.min_offset, badly.max_offset) == (3, 0, 3)
            assert payload == b""
            at_end, _ = await client.pull("Offsets", 0, 3)
            assert at_end.status == PullResponse.OFFSET_OVERFLOW_ONE
            empty, _ = await client.pull("Offsets", 1, 5)
            assert empty.status == PullResponse.OFFSET_OVERFLOW_BADLY
            assert empty.next_offset == 0

            with pytest.raises(BrokerError) as out_of_range:
                await client.pull("Offsets", 2, 0)
            assert out_of_range.value.code is ErrorCode.INVALID_MESSAGE
            assert "2 read queues" in out_of_range.value.detail
            with pytest.raises(BrokerError) as unknown:
                await client.pull("NoSuchTopic", 0, 0)
            assert unknown.value.code is ErrorCode.UNKNOWN_TOPIC
        finally:
            await client.close()

    run_async(scenario())


def test_write_wiped_topic_refuses_sends_retriably_and_still_serves_pulls(
    broker: BrokerProcess,
) -> None:
    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "Draining", TopicSettings(read_queues=4, write_queues=4)
        )
        client = await connect(broker)
        try:
            await client.send("Draining", 0, [encode("Draining", b"before")])
            await Admin().put_topic(
                broker.http_url,
                "Draining",
                TopicSettings(read_queues=4, write_queues=4, perm="write-wipe"),
            )
            with pytest.raises(BrokerError) as caught:
                await client.send("Draining", 0, [encode("Draining", b"after")])
            assert caught.value.code is ErrorCode.NO_PERMISSION
            assert caught.value.retriable
            assert "write-wiped" in caught.value.detail
            [record] = await pull_all(client, "Draining", 0, 1)
            assert decode(record).body == b"before"
        finally:
            await client.close()

    run_async(scenario())


# ------------------------------------------------------------------------------------------
# broken peers


def _prefix(
    *, length: int = 12, version: int = 1, frame_type: int = 1, flags: int = 0, request_id: int = 1
) -> bytes:
    return PREFIX.pack(length, version, frame_type, flags, request_id, 0)


BROKEN_STREAMS = {
    "protocol version 2": (_prefix(version=2), ErrorCode.UNSUPPORTED_VERSION, "version 2"),
    "unknown frame type": (_prefix(frame_type=200), ErrorCode.UNKNOWN_FRAME_TYPE, "type 200"),
    "oversized frame": (
        _prefix(length=8 << 20),
        ErrorCode.FRAME_TOO_LARGE,
        "limit of 1048576 bytes (max_frame_bytes)",
    ),
    "illegal flags": (_prefix(flags=0x10), ErrorCode.MALFORMED_FRAME, "flags"),
    "request id 0": (_prefix(request_id=0), ErrorCode.MALFORMED_FRAME, "request id 0"),
}


@pytest.mark.parametrize("case", list(BROKEN_STREAMS))
def test_broken_stream_gets_a_connection_error_and_is_closed_while_others_go_on(
    broker: BrokerProcess, case: str
) -> None:
    data, code, words = BROKEN_STREAMS[case]

    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "Bystander", TopicSettings(read_queues=4, write_queues=4)
        )
        bystander = await connect(broker)
        reader, writer = await asyncio.open_connection(broker.data_host, broker.data_port)
        try:
            # A good request first, answered; then the bad bytes.
            writer.write(b"".join(encode_frame(FrameType.HEARTBEAT, 7)))
            answered = await reader.readexactly(PREFIX.size)
            writer.write(data)
            received = await reader.read()  # until the broker closes the connection
        finally:
            writer.close()
            await writer.wait_closed()
        frames = FrameDecoder().feed(answered + received)
        assert [(f.type, f.request_id, f.is_error) for f in frames] == [
            (FrameType.HEARTBEAT, 7, False),
            (FrameType.CONNECTION, 0, True),
        ]
        error = ErrorResponse.FromString(frames[1].header)
        assert error.code == code
        assert words in error.message
        try:
            await bystander.heartbeat()
            sent = await bystander.send("Bystander", 0, [encode("Bystander", b"still here")])
            assert sent.status == SendResponse.OK
        finally:
            await bystander.close()

    run_async(scenario())


# ------------------------------------------------------------------------------------------
# offsets and consumer groups


def test_committed_offsets_and_queue_bounds_are_queryable(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        await Admin().put_topic(
            broker.http_url, "Committed", TopicSettings(read_queues=4, write_queues=4)
        )
        client = await connect(broker)
        try:
            await client.send("Committed", 0, [encode("Committed", b"%d" % i) for i in range(5)])
            await pull_all(client, "Committed", 0, 5)
            await client.commit("readers", [("Committed", 0, 2)])
            query = await client.query_offset("Committed", 0, group="readers", timestamp_ms=0)
            assert query.HasField("committed_offset") and query.committed_offset == 2
            assert (query.min_offset, query.max_offset) == (0, 5)
            assert query.timestamp_offset == 0
            future = await client.query_offset("Committed", 0, timestamp_ms=2**62)
            assert future.timestamp_offset == 5
            assert not future.HasField("committed_offset")

            # Piggybacked on a pull.
            await client.pull("Committed", 0, 4, group="readers", commit_offset=4)
            query = await client.query_offset("Committed", 0, group="readers")
            assert query.committed_offset == 4
            assert not (await client.query_offset("Committed", 0, group="others")).HasField(
                "committed_offset"
            )
            with pytest.raises(BrokerError) as caught:
                await client.commit("readers", [("Committed", 1, 0), ("NoSuchTopic", 0, 1)])
            assert caught.value.code is ErrorCode.UNKNOWN_TOPIC
            untouched = await client.query_offset("Committed", 1, group="readers")
            assert not untouched.HasField("committed_offset"), "a refused commit stored half"
        finally:
            await client.close()
        samples = await Admin().metrics(broker.http_url)
        lag = (("group", "readers"), ("queue", "0"), ("topic", "Committed"))
        assert samples[("metaq_consumer_lag_messages", lag)] == 1
        # The one unconsumed message's age: stored during this test, so under a minute.
        assert 0 < samples[("metaq_consumer_lag_latency_seconds", lag)] < 60

    run_async(scenario())


def test_consumer_group_members_are_listed_sorted_and_leave_with_their_connection(
    broker: BrokerProcess,
) -> None:
    async def scenario() -> None:
        first, second = await connect(broker), await connect(broker)
        try:
            await second.consumer_heartbeat("group-m", "client-b", computer_room="room-2")
            answer = await first.consumer_heartbeat("group-m", "client-a", topics=["Topic"])
            assert [(m.client_id, m.computer_room) for m in answer.members] == [
                ("client-a", "room-a"),
                ("client-b", "room-2"),
            ]
            assert answer.member_timeout_ms == 30_000
            await second.close()

            async def only_first() -> bool:
                members = (await first.consumer_heartbeat("group-m", "client-a")).members
                return [m.client_id for m in members] == ["client-a"]

            await eventually(only_first, 5, "client-b is dropped with its connection")
            left = await first.consumer_heartbeat("group-m", "client-a", leaving=True)
            assert list(left.members) == []
        finally:
            await first.close()
            await second.close()

    run_async(scenario())


# ------------------------------------------------------------------------------------------
# health and metrics


def test_health_and_metrics_answer(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        health = await Admin().health(broker.http_url)
        assert health.writable and health.reason is None
        assert health.role == "master"
        assert health.uptime_s >= 0

        await Admin().put_topic(
            broker.http_url, "Metered", TopicSettings(read_queues=4, write_queues=4)
        )
        before = await Admin().metrics(broker.http_url)  # the broker is shared with other tests
        client = await connect(broker)
        try:
            records = [encode("Metered", b"x" * 100, queue_id=3) for _ in range(7)]
            await client.send("Metered", 3, records)
            await pull_all(client, "Metered", 3, 7)
            await client.send("%DLQ%payments", 0, [encode("%DLQ%payments", b"dead")] * 2)
            with pytest.raises(BrokerError) as caught:
                await client.send("Metered", 2, records[:1])  # the record says queue 3
            assert caught.value.code is ErrorCode.INVALID_MESSAGE
        finally:
            await client.close()
        samples = await Admin().metrics(broker.http_url)
        topic = (("topic", "Metered"),)
        assert samples[("metaq_messages_in_total", topic)] == 7
        assert samples[("metaq_throughput_in_bytes_total", topic)] == sum(len(r) for r in records)
        assert samples[("metaq_messages_out_total", topic)] == 7
        assert samples[("metaq_throughput_out_bytes_total", topic)] == sum(map(len, records))
        assert samples[("metaq_send_to_dlq_messages_total", (("group", "payments"),))] == 2
        rejected = (("reason", "invalid_message"),)
        refused = ("metaq_rejected_writes_total", rejected)
        assert samples[refused] - before.get(refused, 0) == 1
        # One histogram observation per request frame, refused ones included.
        sends = (("request_type", "SEND"),)
        count, inf = (
            ("metaq_rpc_latency_seconds_count", sends),
            (
                "metaq_rpc_latency_seconds_bucket",
                (("le", "+Inf"), *sends),
            ),
        )
        assert samples[count] - before.get(count, 0) == 3
        assert samples[inf] - before.get(inf, 0) == 3
        assert samples[("process_resident_memory_bytes", ())] > 0

        async def flushed() -> bool:  # the flusher's next round fsyncs the sends
            fsyncs = (await Admin().metrics(broker.http_url))[
                ("metaq_fsync_latency_seconds_count", ())
            ]
            return fsyncs > before[("metaq_fsync_latency_seconds_count", ())]

        await wait_until_async(flushed, 10, "the sends' fsync is in the fsync histogram")
        assert ("python_gc_collections_total", (("generation", "0"),)) in samples
        assert samples[("metaq_queue_max_offset", (("queue", "3"), ("topic", "Metered")))] == 7
        written = samples[("metaq_commitlog_write_offset", ())]
        assert written > 0
        # What the log holds, not the size its preallocated segment files take.
        assert samples[("metaq_storage_size_bytes", ())] == written
        assert samples[("metaq_storage_allocated_bytes", ())] > written
        assert samples[("metaq_dispatch_backlog_bytes", ())] >= 0
        assert 0 <= samples[("metaq_disk_used_ratio", ())] <= 1

    run_async(scenario())


def test_consume_rate_per_group_counts_what_each_group_pulled_and_acknowledged(
    broker: BrokerProcess,
) -> None:
    async def scenario() -> None:
        await Admin().put_topic(broker.http_url, "Tallied", TopicSettings(1, 1))
        client = await connect(broker)
        try:
            await client.send("Tallied", 0, [encode("Tallied", b"m%d" % i) for i in range(8)])
            assert len(await pull_all(client, "Tallied", 0, 8)) == 8  # as "test-group"
            response, _ = await client.pull("Tallied", 0, 0, group="tally", max_messages=5)
            assert response.record_count == 5
            await client.commit("tally", [("Tallied", 0, 2)])  # where it starts: no count
            await client.commit("tally", [("Tallied", 0, 5)])  # 3 acknowledged
            await client.pull("Tallied", 0, 5, group="tally", commit_offset=7)  # 2 more
        finally:
            await client.close()
        samples = await Admin().metrics(broker.http_url)

        def sample(name: str, group: str) -> float | None:
            return samples.get((name, (("group", group), ("topic", "Tallied"))))

        assert sample("metaq_consumer_pulled_messages_total", "test-group") == 8
        assert sample("metaq_consumer_pulled_messages_total", "tally") == 5 + 3
        assert sample("metaq_consumer_acked_messages_total", "tally") == 5
        assert sample("metaq_consumer_acked_messages_total", "test-group") is None

    run_async(scenario())


# ------------------------------------------------------------------------------------------
# shutdown and crash


def test_sigterm_answers_parked_pulls_exits_zero_and_the_data_reopens_clean(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker()

    async def before() -> None:
        await Admin().put_topic(
            broker.http_url, "Kept", TopicSettings(read_queues=4, write_queues=4)
        )
        client = await connect(broker)
        try:
            await client.send("Kept", 0, [encode("Kept", b"%d" % i) for i in range(5)])
            await pull_all(client, "Kept", 0, 5)
            await client.commit("keepers", [("Kept", 0, 3)])
            pull = asyncio.ensure_future(client.pull("Kept", 0, 5, long_poll_timeout_ms=30_000))

            async def parked() -> bool:
                return await parked_pulls(broker) >= 1

            await eventually(parked, 5, "the pull is parked")
            broker.proc.send_signal(signal.SIGTERM)
            response, _ = await pull
            assert response.status == PullResponse.OFFSET_OVERFLOW_ONE
            await asyncio.wait_for(client.closed, 10)
        finally:
            await client.close()

    run_async(before())
    assert broker.terminate() == 0, broker.output
    assert not broker.abort_marker.exists()
    assert "metaq-broker stopped" in broker.output

    again = start_broker(data_dir=broker.data_dir)

    async def after() -> None:
        client = await connect(again)
        try:
            records = await pull_all(client, "Kept", 0, 5)
            assert [decode(r).body for r in records] == [b"%d" % i for i in range(5)]
            query = await client.query_offset("Kept", 0, group="keepers")
            assert query.committed_offset == 3
        finally:
            await client.close()

    run_async(after())
    assert "crashed=False" in again.output
    assert again.terminate() == 0


def test_kill9_keeps_every_acknowledged_sync_send(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker("--flush-mode", "sync")
    acknowledged: list[bytes] = []

    async def produce_until_killed() -> None:
        await Admin().put_topic(
            broker.http_url, "Durable", TopicSettings(read_queues=2, write_queues=2)
        )
        client = await connect(broker)
        killed = False

        async def one_send(n: int) -> None:
            nonlocal killed
            queue_id = n % 2
            records = [encode("Durable", b"%d-%d" % (n, i), queue_id=queue_id) for i in range(4)]
            response = await client.send("Durable", queue_id, records)
            assert response.status == SendResponse.OK
            acknowledged.extend(response.msg_ids)
            if len(acknowledged) >= 400 and not killed:
                killed = True
                os.kill(broker.proc.pid, signal.SIGKILL)

        try:
            # 16 sends in flight at a time until the broker dies under them.
            n = 0
            while not client.closed.done():
                batch = [one_send(n + i) for i in range(16)]
                n += 16
                results = await asyncio.gather(*batch, return_exceptions=True)
                for result in results:
                    if isinstance(result, BaseException) and not isinstance(
                        result, ConnectionError
                    ):
                        raise result
        finally:
            await client.close()

    run_async(produce_until_killed())
    assert broker.wait(10) == -signal.SIGKILL
    assert broker.abort_marker.exists()

    again = start_broker(data_dir=broker.data_dir)

    async def read_back() -> set[bytes]:
        client = await connect(again)
        try:
            found: set[bytes] = set()
            for queue_id in (0, 1):
                query = await client.query_offset("Durable", queue_id)
                for raw in await pull_all(client, "Durable", queue_id, query.max_offset):
                    found.add(decode(raw).msg_id)
            return found
        finally:
            await client.close()

    found = run_async(read_back())
    assert "crashed=True" in again.output
    lost = set(acknowledged) - found
    assert len(acknowledged) >= 400
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged messages lost"


def test_a_broker_listening_beyond_loopback_refuses_to_start_without_a_secret(
    tmp_path: Path,
) -> None:
    try:
        started = BrokerProcess.start(
            tmp_path / "open", "--listen-host", "0.0.0.0", env={ENV_VAR: ""}
        )
    except AssertionError as exc:
        refusal = str(exc)
    else:
        started.kill()
        pytest.fail("the broker started on every interface without a cluster secret")

    assert "needs a cluster secret because listen_host '0.0.0.0'" in refusal
    assert "cluster_secret_file" in refusal


def _nice_of_threads(pid: int) -> list[int]:
    return sorted(
        os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a higher CPU priority needs root")
def test_the_broker_and_its_threads_run_at_the_configured_priority(
    broker: BrokerProcess, start_broker: Callable[..., BrokerProcess]
) -> None:
    # The default, -5, for every thread but the one making the next commitlog file,
    # which keeps to 0 (a higher priority, never a lower one).
    nices = _nice_of_threads(broker.proc.pid)
    assert nices.count(0) == 1 and set(nices) == {-5, 0}
    gentle = start_broker("--set", "nice=3")
    assert set(_nice_of_threads(gentle.proc.pid)) == {3}
