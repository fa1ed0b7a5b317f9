"""The slave's data-plane channel against a loopback socket that plays the master."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from metaq.common.framing import FLAG_RESPONSE, Frame, FrameDecoder, FrameType, encode_frame
from metaq.common.v1.data_pb2 import ReplicaFetchRequest, ReplicaFetchResponse
from metaq.replication.channel import DataPlaneChannel
from metaq.testing.waiting import run_async, wait_until_async


def test_a_fetch_goes_out_before_the_caller_awaits_its_answer() -> None:
    """The fetch carries the slave's acknowledgement of what it just wrote, which a
    sync-replicated send waits for: it leaves at the call, not when the caller next
    yields to the loop (after whatever else it does first)."""

    async def scenario() -> None:
        received: list[Frame] = []
        writers: list[asyncio.StreamWriter] = []

        async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            decoder = FrameDecoder()
            while chunk := await reader.read(1 << 16):
                received.extend(decoder.feed(chunk))

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = await DataPlaneChannel.open(f"127.0.0.1:{port}")
        try:
            request = ReplicaFetchRequest(broker_id=1, epoch=3, offset=42, acked_offset=42)
            answer = channel.fetch(request)  # not awaited yet

            async def arrived() -> bool:
                await asyncio.sleep(0.001)  # poll interval of a deadline-bound wait
                return bool(received)

            await wait_until_async(arrived, 5.0, "the master received the fetch")
            (frame,) = received
            assert frame.type is FrameType.REPLICA_FETCH
            assert ReplicaFetchRequest.FromString(frame.header) == request

            reply = ReplicaFetchResponse(epoch=3, offset=42, master_end=50)
            writers[0].writelines(
                encode_frame(FrameType.REPLICA_FETCH, frame.request_id,
                             reply.SerializeToString(), b"12345678", FLAG_RESPONSE)
            )  # fmt: skip
            response, payload = await answer
            assert response == reply
            assert bytes(payload) == b"12345678"
        finally:
            await channel.close()
            for writer in writers:
                writer.close()
                await writer.wait_closed()
            server.close()
            await server.wait_closed()

    run_async(scenario())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_answers_larger_than_the_buffer_arrive_whole_one_after_another(loop_kind: str) -> None:
    """Each answer lands in the channel's one buffer, which grows to the largest; the
    broker runs on uvloop, whose transports are not asyncio's classes."""
    payloads = [bytes([n]) * size for n, size in enumerate([5_000_000, 10, 3_000_000, 5_000_000])]

    async def scenario() -> None:
        async def master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            decoder = FrameDecoder()
            sent = 0
            while chunk := await reader.read(1 << 16):
                for frame in decoder.feed(chunk):
                    reply = ReplicaFetchResponse(offset=sent).SerializeToString()
                    answer = encode_frame(FrameType.REPLICA_FETCH, frame.request_id, reply,
                                          payloads[sent], FLAG_RESPONSE)  # fmt: skip
                    writer.writelines(answer)
                    sent += 1
            writer.close()

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = await DataPlaneChannel.open(f"127.0.0.1:{port}")
        try:
            for n, expected in enumerate(payloads):
                response, payload = await channel.fetch(ReplicaFetchRequest(offset=n))
                assert response.offset == n
                assert payload == expected
        finally:
            await channel.close()
            server.close()
            await server.wait_closed()

    problems: list[dict[str, Any]] = []
    factory = asyncio.new_event_loop
    if loop_kind == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.get_loop().set_exception_handler(lambda _loop, context: problems.append(context))
        runner.run(asyncio.wait_for(scenario(), 30))
    assert problems == []
