"""A process-less master without the cluster secret, for tests that take over a dead
master's address and check that a slave trusts nothing it says."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable

from metaq.common.framing import FLAG_RESPONSE, FrameDecoder, FrameType, encode_frame
from metaq.common.v1.data_pb2 import ReplicaAuthResponse

Answer = Callable[[FrameType, bytes], bytes | None]
"""What the impostor says to a frame other than the handshake (its header in, the
answer's header out); None leaves the frame unanswered."""


class Impostor:
    """Bluffs the REPLICA_AUTH handshake with a random nonce and proof, answers every
    other frame with ``answer``, and records the type of each frame it was sent."""

    def __init__(self, answer: Answer) -> None:
        self.seen: list[FrameType] = []
        self._answer = answer
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)

    async def close(self) -> None:
        """Stops listening and closes the connections it took: a server's close leaves
        them open, and a socket still open when the test's loop ends is a warning."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in list(self._writers):
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def asked(self) -> bool:
        """For ``wait_until_async``: some frame has arrived."""
        return bool(self.seen)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        decoder = FrameDecoder()
        try:
            while chunk := await reader.read(1 << 16):
                for frame in decoder.feed(chunk):
                    self.seen.append(frame.type)
                    answer = (
                        _bluff()
                        if frame.type is FrameType.REPLICA_AUTH
                        else self._answer(frame.type, frame.header)
                    )
                    if answer is not None:
                        writer.writelines(
                            encode_frame(frame.type, frame.request_id, answer, flags=FLAG_RESPONSE)
                        )
        except ConnectionError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


def _bluff() -> bytes:
    return ReplicaAuthResponse(
        master_nonce=secrets.token_bytes(16), master_proof=secrets.token_bytes(32)
    ).SerializeToString()
