"""REPLICA_FETCH over the data plane: one connection from a slave to its master.

With a cluster secret the connection starts with REPLICA_AUTH (docs/replication.md): the
master proves the secret before the slave sends a single fetch, so nothing the slave
writes or cuts ever comes from a master it could not authenticate, and the slave proves
it in turn before the master serves it. The master's proof names its own advertised data
address, checked against the address dialled here, so a process at another address
cannot pass a real master's proof through to the slave (a relay at a stale address).
What the handshake does not cover: the frames after it; a man in the middle on the
path itself can alter them, unless the connection runs over TLS (``ssl``: the broker's
``tls_*`` settings, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import socket
import ssl as ssl_module
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import cast

from metaq.common import auth
from metaq.common.auth import ClusterSecret
from metaq.common.errors import ErrorCode, MetaqError, NotAuthenticated, ProtocolError
from metaq.common.framing import Buffer, Frame, FrameReceiver, FrameType, encode_frame
from metaq.common.tls import tls_peer_hint
from metaq.common.v1.data_pb2 import (
    ErrorResponse,
    ReplicaAuthRequest,
    ReplicaAuthResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)

_AUTH_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class SlaveIdentity:
    """Who is connecting, and the secret it proves (None: the cluster runs without one)."""

    broker_name: str
    broker_id: int
    data_address: str
    """This slave's own advertised data address, which its proof names."""
    secret: ClusterSecret | None


class FetchError(MetaqError):
    """The master answered a fetch with an ERROR frame."""

    retriable = True

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Receiving(asyncio.BufferedProtocol):
    """The connection's receiving side: frames cut in its buffer, queued for ``_answer``."""

    def __init__(self) -> None:
        self.frames: collections.deque[Frame] = collections.deque()
        self.receiver = FrameReceiver()
        self.transport: asyncio.Transport | None = None
        self.ended = False
        self.error: BaseException | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but are ones.
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.receiver.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.frames.extend(self.receiver.received(nbytes))
        except ProtocolError as exc:
            self.error = exc
            assert self.transport is not None
            self.transport.abort()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        if exc is not None and self.error is None:
            self.error = exc
        if not self._closed.done():
            self._closed.set_result(None)
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def wait(self) -> None:
        """Until a frame arrives or the connection ends."""
        self._wakeup = asyncio.get_running_loop().create_future()
        await self._wakeup

    async def closed(self) -> None:
        await self._closed


class DataPlaneChannel:
    """Sequential fetches on one connection; a slave needs no more.

    Answers arrive in one reused buffer: a fetch's payload is valid until the next
    request on this channel is sent (the follower writes it before it fetches again).
    """

    def __init__(self, transport: asyncio.Transport, receiving: _Receiving, address: str) -> None:
        self._transport = transport
        self._receiving = receiving
        self._ids = itertools.count(1)
        self.address = address
        self._answered = False

    @property
    def closed(self) -> bool:
        """The master closed the connection (or it failed) while nothing was asked."""
        return self._receiving.ended or self._transport.is_closing()

    @classmethod
    async def open(
        cls,
        address: str,
        timeout_s: float = 3.0,
        *,
        identity: SlaveIdentity | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> DataPlaneChannel:
        """Connect to the master at ``address`` (over TLS with ``ssl``); with
        ``identity.secret``, authenticate both ways first (raises NotAuthenticated when
        the master cannot prove it)."""
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                transport, receiving = await loop.create_connection(
                    _Receiving, host.strip("[]"), int(port), ssl=ssl
                )
        except ssl_module.SSLError as exc:
            raise ConnectionError(tls_peer_hint(address, exc, "master")) from None
        except TimeoutError:
            if ssl is None:
                raise
            raise TimeoutError(
                f"no TLS handshake with the master at {address} within {timeout_s} s: its "
                "port may be plain (is TLS on there?) or it is overloaded"
            ) from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel = cls(transport, receiving, address)
        if identity is not None and identity.secret is not None:
            try:
                await channel._authenticate(identity, identity.secret)
            except BaseException:
                await channel.close()
                raise
        return channel

    async def _authenticate(self, identity: SlaveIdentity, secret: ClusterSecret) -> None:
        name, slave_id, mine = identity.broker_name, identity.broker_id, identity.data_address
        nonce = auth.new_nonce()
        hello = ReplicaAuthRequest(
            broker_name=name, broker_id=slave_id, slave_nonce=nonce, slave_data_address=mine
        )
        try:
            frame = await self._exchange(FrameType.REPLICA_AUTH, hello, _AUTH_TIMEOUT_S)
        except FetchError as exc:
            raise NotAuthenticated(
                f"master {self.address} did not take part in the cluster-secret handshake "
                f"({exc}); not replicating from it: nothing is written or cut"
            ) from None
        answer = ReplicaAuthResponse.FromString(frame.header)
        master_nonce = answer.master_nonce

        def proven_by(address: str) -> bool:
            expected = auth.replica_proof(
                secret, auth.MASTER, name, slave_id, nonce, master_nonce, address
            )
            return auth.check_proof(expected, answer.master_proof)

        if len(master_nonce) != auth.NONCE_BYTES:
            raise NotAuthenticated(f"master {self.address} answered the handshake malformed")
        if not proven_by(self.address):
            claimed = answer.master_data_address
            if claimed and claimed != self.address and proven_by(claimed):
                raise NotAuthenticated(
                    f"{self.address} answered with the proof of master {claimed}: something "
                    f"at {self.address} relays another broker (a stale or hijacked master "
                    "address?); not replicating from it: nothing is written or cut. Check "
                    "which master the nameservers route this group to"
                )
            raise NotAuthenticated(
                f"master {self.address} did not prove the cluster secret (it holds another "
                "one, or is not a broker of this cluster); not replicating from it: nothing "
                "is written or cut"
            )
        proof = auth.replica_proof(secret, auth.SLAVE, name, slave_id, nonce, master_nonce, mine)
        done = ReplicaAuthRequest(
            broker_name=name,
            broker_id=slave_id,
            slave_nonce=nonce,
            slave_proof=proof,
            slave_data_address=mine,
        )
        await self._exchange(FrameType.REPLICA_AUTH, done, _AUTH_TIMEOUT_S)

    def fetch(self, request: ReplicaFetchRequest) -> Awaitable[tuple[ReplicaFetchResponse, Buffer]]:
        """Send the fetch now, before the caller yields (it acknowledges what the slave
        wrote: a sync-replicated send waits for it); await the answer."""
        request_id = self._send(FrameType.REPLICA_FETCH, request.SerializeToString())
        # The master holds a fetch for up to wait_ms; beyond that plus slack it is gone.
        return self._fetched(request_id, request.wait_ms / 1e3 + 5.0)

    async def _fetched(
        self, request_id: int, timeout_s: float
    ) -> tuple[ReplicaFetchResponse, Buffer]:
        frame = await self._answer(FrameType.REPLICA_FETCH, request_id, timeout_s)
        return ReplicaFetchResponse.FromString(frame.header), frame.payload

    async def _exchange(
        self,
        frame_type: FrameType,
        request: ReplicaFetchRequest | ReplicaAuthRequest,
        timeout_s: float,
    ) -> Frame:
        """Send one request and return its answer frame; an ERROR frame raises FetchError."""
        return await self.request(frame_type, request.SerializeToString(), timeout_s)

    async def request(self, frame_type: FrameType, header: bytes, timeout_s: float) -> Frame:
        """Any other request on this connection, answered before the next one is sent (a
        slave forwarding its consumers' offset commits); an ERROR frame raises FetchError."""
        return await self._answer(frame_type, self._send(frame_type, header), timeout_s)

    def _send(self, frame_type: FrameType, header: bytes) -> int:
        request_id = next(self._ids)
        self._transport.writelines(encode_frame(frame_type, request_id, header))
        return request_id

    async def _answer(self, frame_type: FrameType, request_id: int, timeout_s: float) -> Frame:
        receiving = self._receiving
        async with asyncio.timeout(timeout_s):
            while True:
                while receiving.frames:
                    frame = receiving.frames.popleft()
                    self._answered = True
                    if frame.is_error:
                        error = ErrorResponse.FromString(frame.header)
                        raise FetchError(ErrorCode(error.code), error.message)
                    if frame.type is frame_type and frame.request_id == request_id:
                        return frame
                if receiving.error is not None:
                    if isinstance(receiving.error, ProtocolError):
                        raise receiving.error
                    raise ConnectionError(
                        f"connection to master {self.address} failed: {receiving.error}"
                    )
                if receiving.ended:
                    tls = self._transport.get_extra_info("sslcontext") is not None
                    if not self._answered and not tls:
                        raise ConnectionError(
                            f"master {self.address} closed the connection before answering "
                            "anything: if it serves TLS, give this broker the tls_* "
                            "settings too (tls_ca_file to trust it)"
                        )
                    raise ConnectionError(f"master {self.address} closed the connection")
                await receiving.wait()

    async def close(self) -> None:
        self._transport.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._receiving.closed()
