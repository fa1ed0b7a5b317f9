"""The slave's data-plane channel against a loopback socket that plays the master."""

from __future__ import annotations

import asyncio

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
