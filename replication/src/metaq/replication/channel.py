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
import contextlib
import itertools
import socket
import ssl as ssl_module
from dataclasses import dataclass

from metaq.common import auth
from metaq.common.auth import ClusterSecret
from metaq.common.errors import ErrorCode, MetaqError, NotAuthenticated
from metaq.common.framing import Buffer, Frame, FrameDecoder, FrameType, encode_frame
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


class DataPlaneChannel:
    """Sequential fetches on one connection; a slave needs no more."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder()
        self._ids = itertools.count(1)
        self.address = address
        self._answered = False

    @property
    def closed(self) -> bool:
        """The master closed the connection (or it failed) while nothing was asked."""
        return self._reader.at_eof() or self._writer.is_closing()

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
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=ssl)
        except ssl_module.SSLError as exc:
            raise ConnectionError(tls_peer_hint(address, exc, "master")) from None
        except TimeoutError:
            if ssl is None:
                raise
            raise TimeoutError(
                f"no TLS handshake with the master at {address} within {timeout_s} s: its "
                "port may be plain (is TLS on there?) or it is overloaded"
            ) from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel = cls(reader, writer, address)
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

    async def fetch(self, request: ReplicaFetchRequest) -> tuple[ReplicaFetchResponse, Buffer]:
        # The master holds a fetch for up to wait_ms; beyond that plus slack it is gone.
        frame = await self._exchange(FrameType.REPLICA_FETCH, request, request.wait_ms / 1e3 + 5.0)
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
        request_id = next(self._ids)
        self._writer.writelines(encode_frame(frame_type, request_id, header))
        async with asyncio.timeout(timeout_s):
            while True:
                chunk = await self._reader.read(1 << 20)
                if not chunk:
                    if not self._answered and self._writer.get_extra_info("sslcontext") is None:
                        raise ConnectionError(
                            f"master {self.address} closed the connection before answering "
                            "anything: if it serves TLS, give this broker the tls_* "
                            "settings too (tls_ca_file to trust it)"
                        )
                    raise ConnectionError(f"master {self.address} closed the connection")
                self._answered = True
                for frame in self._decoder.feed(chunk):
                    if frame.is_error:
                        error = ErrorResponse.FromString(frame.header)
                        raise FetchError(ErrorCode(error.code), error.message)
                    if frame.type is frame_type and frame.request_id == request_id:
                        return frame

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()
