"""The client's data-plane connections: one pipelined TCP connection per broker.

Requests are written without waiting for earlier answers; answers come back in any order
and are paired with their requests by request id (``docs/protocol.md``). Everything
requested during one loop turn goes out in one ``writelines``. Timeouts cost no timer per
request: one timer per connection fires at the earliest deadline still pending.

Failures, as the caller sees them:

- an ERROR frame for the request → :class:`~metaq.client.errors.BrokerError` with the
  broker's code, message, ``retriable`` flag and (NOT_MASTER) master address;
- the connection drops, or could not be opened → :class:`ConnectionLost` (retriable; a
  send in flight may still have been stored);
- no answer in time → :class:`RequestTimeout`, a ``TimeoutError`` (retriable).

Over TLS (a :class:`~metaq.common.tls.TlsConfig` given to the pool) the same, and a
connection that cannot be made says why in words: the broker's certificate is not
trusted (pass its CA), the broker's port is plain, or (a plain connection closed before
any answer, and a TLS handshake there succeeds) the broker speaks TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Final, cast

from metaq.client.errors import BrokerError, ConnectionLost, RequestTimeout
from metaq.common import frame_auth
from metaq.common.errors import ErrorCode, ProtocolError
from metaq.common.framing import (
    FLAG_ONE_WAY,
    FLAG_SIGNED,
    Buffer,
    Frame,
    FrameDecoder,
    FrameType,
    encode_frame,
)
from metaq.common.log_limit import Repeated
from metaq.common.tls import TlsConfig, plain_peer_hint, speaks_tls, tls_peer_hint
from metaq.common.users import Credentials, prove
from metaq.common.v1.data_pb2 import AuthRequest, AuthResponse, ErrorResponse

log = logging.getLogger(__name__)

_U32_MAX: Final = 0xFFFFFFFF


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` → (host, port); ValueError naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"broker address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class BrokerConnection(asyncio.Protocol):
    """One TCP connection to one broker, pipelined and multiplexed by request id.

    Open with :meth:`open`. :meth:`request` awaits one answer; :meth:`request_future`
    is the same without a coroutine, for callers that keep many requests in flight
    (the producer's sender). Payload buffers are handed to the transport without a copy:
    the caller must not change them until the request is answered.
    """

    def __init__(self, address: str, tls: TlsConfig | None = None) -> None:
        self.address = address
        # The session key once AUTH proved a user here: every request is signed with it.
        self._session_key: bytes | None = None
        self._tls = tls
        self._answered = False
        """Any frame came from the broker: the connection was up end to end."""
        self._explaining: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None
        # Request id -> (future or callback, deadline).
        self._pending: dict[int, tuple[_Waiter, float]] = {}
        self._next_id = 1
        self._out: list[Buffer] = []
        self._flush_scheduled = False
        self._closed = False
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._timer: asyncio.TimerHandle | None = None
        self.on_request: RequestHook | None = None
        """Called with requests the broker sends this client (see ConnectionPool)."""
        self._timer_at = 0.0
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.connection_error: BrokerError | None = None
        """The CONNECTION error the broker sent before closing, if it sent one."""
        # An answer that arrives after its request timed out here is expected on an
        # overloaded broker, and then comes for every request: counted, not one line each.
        self.late_answers = Repeated(
            log, f"broker {address} answered requests that had timed out here; dropped"
        )

    @classmethod
    async def open(
        cls,
        address: str,
        *,
        connect_timeout_s: float = 3.0,
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> BrokerConnection:
        """Connect to a broker's data port, over TLS with ``tls`` (``ssl_context``, when
        given, is its client context made once); ConnectionLost if that fails or takes too
        long.

        With ``credentials``, prove them (AUTH) before returning; BrokerError
        NO_PERMISSION when the broker refuses them."""
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        if tls is not None and ssl_context is None:
            ssl_context = tls.client_context()
        try:
            async with asyncio.timeout(connect_timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: cls(address, tls), host, port, ssl=ssl_context
                )
        except TimeoutError:
            why = f"connect timed out after {connect_timeout_s} s"
            if tls is not None:
                why += " (no TLS handshake: is the broker's port plain, or TLS off there?)"
            raise ConnectionLost(address, why, never_sent=True) from None
        except ssl.SSLError as exc:
            why = tls_peer_hint(address, exc)
            raise ConnectionLost(address, why, never_sent=True) from None
        except OSError as exc:
            raise ConnectionLost(
                address, f"cannot connect: {exc.strerror or exc}", never_sent=True
            ) from None
        if credentials is not None:
            try:
                await protocol._authenticate(credentials, connect_timeout_s)
            except BaseException:
                await protocol.close()
                raise
        return protocol

    async def _authenticate(self, credentials: Credentials, timeout_s: float) -> None:
        """The AUTH handshake (``metaq.common.frame_auth``); then every request is signed."""
        nonce = frame_auth.new_nonce()
        first = AuthRequest(access_key=credentials.access_key, client_nonce=nonce)
        frame = await self.request(FrameType.AUTH, first.SerializeToString(), timeout_s=timeout_s)
        server_nonce = AuthResponse.FromString(frame.header).server_nonce
        if not server_nonce:
            log.debug("broker %s does not check credentials (auth_enabled is off)", self.address)
            return
        key = credentials.key()
        message = frame_auth.auth_message(credentials.access_key, nonce, server_nonce)
        second = AuthRequest(
            access_key=credentials.access_key, client_nonce=nonce, client_proof=prove(key, message)
        )
        frame = await self.request(FrameType.AUTH, second.SerializeToString(), timeout_s=timeout_s)
        signature = AuthResponse.FromString(frame.header).server_signature
        expected = hmac.new(credentials.server_key(), message, hashlib.sha256).digest()
        if not hmac.compare_digest(signature, expected):
            raise BrokerError(
                ErrorCode.NO_PERMISSION,
                f"broker {self.address} could not prove it holds user "
                f"{credentials.access_key}'s verifier: it is not this cluster's broker, or its "
                "ACL file is stale",
                retriable=False,
                broker=self.address,
            )
        self._session_key = frame_auth.session_key(key, credentials.access_key, nonce, server_nonce)

    def _take_id(self) -> int:
        request_id = self._next_id
        if request_id < _U32_MAX:
            self._next_id = request_id + 1
        else:
            self._next_id = 1
            if self._session_key is not None:
                # A broker checking signatures takes no id at or below the last one: the
                # connection is used up. Requests in flight fail ConnectionLost (retriable)
                # and the pool opens a new one.
                self._loop.call_soon(self._retire)
        return request_id

    def _retire(self) -> None:
        self.flush()
        if self._transport is not None:
            self._transport.close()

    def _encode(
        self,
        frame_type: FrameType,
        request_id: int,
        header: bytes,
        payload: Sequence[Buffer],
        flags: int = 0,
    ) -> list[Buffer]:
        key = self._session_key
        if key is None:
            return encode_frame(frame_type, request_id, header, payload, flags)
        flags |= FLAG_SIGNED
        parts = [payload] if isinstance(payload, bytes | bytearray | memoryview) else payload
        trailer = frame_auth.sign(
            key, frame_type, request_id, flags, header, parts, time.time_ns() // 1_000_000
        )
        return encode_frame(frame_type, request_id, header, [*parts, trailer], flags)

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Requests are coalesced already: Nagle would only hold them back.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            log.warning("broker %s broke the framing: %s; closing", self.address, exc)
            self._fail_all(ConnectionLost(self.address, f"protocol error: {exc}"))
            if self._transport is not None:
                self._transport.abort()
            return
        self._answered = True
        pending = self._pending
        for frame in frames:
            if not frame.is_response:
                # A request from the broker (CHECK_TRANSACTION): one-way, never answered.
                if self.on_request is not None:
                    self.on_request(self, frame)
                else:
                    log.info("broker %s sent a %s request no one here takes; dropped",
                             self.address, frame.type.name)  # fmt: skip
                continue
            entry = pending.pop(frame.request_id, None)
            if entry is None:
                if frame.type is FrameType.CONNECTION:
                    self._connection_failed(frame)
                else:
                    self.late_answers.happened(f"request {frame.request_id}")
                continue
            waiter = entry[0]
            if isinstance(waiter, asyncio.Future):
                if waiter.done():
                    continue
                if frame.flags & 0x4:  # FLAG_ERROR
                    waiter.set_exception(self._broker_error(frame))
                else:
                    waiter.set_result(frame)
            elif frame.flags & 0x4:
                _call(waiter, None, self._broker_error(frame))
            else:
                _call(waiter, frame, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None
        self._out = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.connection_error is not None:
            reason = f"the broker closed it: {self.connection_error}"
        elif exc is not None:
            reason = str(exc) or type(exc).__name__
        else:
            reason = "closed"
        if (
            self.connection_error is None
            and not self._answered
            and self._pending
            and (exc is None or isinstance(exc, ConnectionResetError | ssl.SSLError))
        ):
            # Closed before a single answer: a TLS listener does that to a plain client,
            # and one verifying clients to a TLS client without a certificate.
            pending, self._pending = self._pending, {}
            self._explaining = self._loop.create_task(
                self._explain_unanswered(pending, reason, exc)
            )
        else:
            self._fail_all(ConnectionLost(self.address, reason))
        self._can_write.set()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # --- requests ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def request_future(
        self,
        frame_type: FrameType,
        header: bytes,
        payload: Sequence[Buffer] = (),
        *,
        timeout_s: float,
    ) -> asyncio.Future[Frame]:
        """Queue a request; the future resolves with the response frame or fails.

        Raises at once (rather than through the future) only for a request that cannot be
        built: ProtocolError(FRAME_TOO_LARGE) for a frame over the limit.
        """
        future: asyncio.Future[Frame] = self._loop.create_future()
        if self._closed:
            future.set_exception(ConnectionLost(self.address, "the connection is closed"))
            return future
        self._queue(frame_type, header, payload, future, timeout_s)
        return future

    def request_callback(
        self,
        frame_type: FrameType,
        header: bytes,
        payload: Sequence[Buffer],
        callback: Callable[[Frame | None, BaseException | None], None],
        *,
        timeout_s: float,
        flush: bool = True,
    ) -> None:
        """Queue a request; ``callback(frame, None)`` or ``callback(None, error)`` runs once
        with the outcome, straight from the socket's read (no future, no extra loop turn).

        The callback must not raise. Raises at once only for a request that cannot be
        built (ProtocolError FRAME_TOO_LARGE); the callback is then never called.
        ``flush=False``: the caller calls :meth:`flush` itself before it returns to the
        loop (the producer's sender, once per drain), so no flush is scheduled.
        """
        if self._closed:
            callback(None, ConnectionLost(self.address, "the connection is closed"))
            return
        self._queue(frame_type, header, payload, callback, timeout_s, flush)

    def _queue(
        self,
        frame_type: FrameType,
        header: bytes,
        payload: Sequence[Buffer],
        waiter: _Waiter,
        timeout_s: float,
        flush: bool = True,
    ) -> None:
        """Encode a request into the write buffer, its ``waiter`` answered by the response
        or at its deadline; the buffer is flushed on the next loop turn (with ``flush``)."""
        request_id = self._take_id()
        self._out += self._encode(frame_type, request_id, header, payload)
        deadline = self._loop.time() + timeout_s
        self._pending[request_id] = (waiter, deadline)
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)
        if flush and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    async def request(
        self,
        frame_type: FrameType,
        header: bytes,
        payload: Sequence[Buffer] = (),
        *,
        timeout_s: float,
    ) -> Frame:
        """Send one request and return its response frame.

        The frame's payload is a view of the socket's chunk: take ``bytes()`` of it to
        keep it. Raises BrokerError, ConnectionLost or RequestTimeout (a TimeoutError).
        """
        return await self.request_future(frame_type, header, payload, timeout_s=timeout_s)

    def send_oneway(
        self, frame_type: FrameType, header: bytes, payload: Sequence[Buffer] = ()
    ) -> None:
        """Write a ONE_WAY request: never answered, not even with an error.

        Raises ConnectionLost when the connection is already closed.
        """
        if self._closed:
            raise ConnectionLost(self.address, "the connection is closed")
        # Id 0 is reserved for connection errors, so one-way requests take ids too.
        request_id = self._take_id()
        self._out += self._encode(frame_type, request_id, header, payload, FLAG_ONE_WAY)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        await self._can_write.wait()

    async def close(self) -> None:
        """Write what is queued, close, and fail requests still in flight (ConnectionLost)."""
        if not self._closed:
            self.flush()
            self._closed = True
            self._fail_all(ConnectionLost(self.address, "closed by the client"))
            if self._transport is not None:
                self._transport.close()
            else:
                self._lost.set_result(None)
        await self._lost
        if self._explaining is not None:
            await self._explaining  # what it tells waiters is theirs before close returns

    # --- internals --------------------------------------------------------------------

    def flush(self) -> None:
        """Write what was requested so far now rather than at the end of the loop turn."""
        self._flush_scheduled = False
        if self._out and self._transport is not None:
            out, self._out = self._out, []
            self._transport.writelines(out)

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """Fail requests past their deadline; re-arm for the earliest one left."""
        self._timer = None
        now = self._loop.time()
        earliest = 0.0
        expired: list[int] = []
        for request_id, (_, deadline) in self._pending.items():
            if deadline <= now:
                expired.append(request_id)
            elif not earliest or deadline < earliest:
                earliest = deadline
        for request_id in expired:
            waiter, _ = self._pending.pop(request_id)
            _fail(waiter, RequestTimeout(f"broker {self.address} did not answer in time"))
        if earliest:
            self._arm(earliest)

    def _broker_error(self, frame: Frame) -> BrokerError:
        error = ErrorResponse.FromString(frame.header)
        try:
            code = ErrorCode(error.code)
        except ValueError:
            code = ErrorCode.INTERNAL
        return BrokerError(
            code,
            error.message,
            retriable=error.retriable,
            master_address=error.master_address,
            broker=self.address,
        )

    def _connection_failed(self, frame: Frame) -> None:
        self.connection_error = self._broker_error(frame)
        log.warning("broker %s closes the connection: %s", self.address, self.connection_error)

    async def _explain_unanswered(
        self,
        pending: dict[int, tuple[_Waiter, float]],
        reason: str,
        exc: BaseException | None,
    ) -> None:
        reason = f"closed before answering anything ({reason})"
        if self._tls is None:
            host, port = split_address(self.address)
            if await speaks_tls(host, port):
                reason = plain_peer_hint(self.address)
        elif "CERTIFICATE_REQUIRED" in str(exc).upper():
            reason = (
                "the broker requires a client certificate (it verifies clients): pass "
                "--tls-cert and --tls-key, a certificate signed by its tls_ca_file"
            )
        elif not self._tls.cert_file:
            reason += (
                "; over TLS without a client certificate: if the broker verifies clients, "
                "pass --tls-cert and --tls-key, a certificate signed by its tls_ca_file"
            )
        elif isinstance(exc, ssl.SSLError):
            reason = tls_peer_hint(self.address, exc)
        error = ConnectionLost(self.address, reason)
        for waiter, _ in pending.values():
            _fail(waiter, error)

    def _fail_all(self, exc: Exception) -> None:
        pending, self._pending = self._pending, {}
        for waiter, _ in pending.values():
            _fail(waiter, exc)


_Waiter = asyncio.Future[Frame] | Callable[[Frame | None, BaseException | None], None]


def _call(
    callback: Callable[[Frame | None, BaseException | None], None],
    frame: Frame | None,
    exc: BaseException | None,
) -> None:
    try:
        callback(frame, exc)
    except Exception:  # a bug in the caller must not break the connection for others
        log.exception("request callback failed")


def _fail(waiter: _Waiter, exc: BaseException) -> None:
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            waiter.set_exception(exc)
    else:
        _call(waiter, None, exc)


RequestHook = Callable[["BrokerConnection", Frame], None]


class ConnectionPool:
    """One live connection per broker address, opened on first use and reopened after
    it closed. Concurrent ``get`` calls for an address share one connect attempt."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 3.0,
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.credentials = credentials
        """Proved on every connection opened (AUTH) when set."""
        self.tls = tls
        """Set: brokers are dialled over TLS (see :mod:`metaq.common.tls`)."""
        self._ssl = tls.client_context() if tls is not None else None
        self._on_request: RequestHook | None = None
        self.hello: bytes | None = None
        """A HEARTBEAT header (a producer's ``ClientHello``) sent one-way first on every
        connection opened, so the broker can say who is connected."""
        self._connections: dict[str, BrokerConnection] = {}
        self._opening: dict[str, asyncio.Future[BrokerConnection]] = {}
        self._closed = False

    @property
    def on_request(self) -> RequestHook | None:
        """Given to every connection: what to do with requests brokers send."""
        return self._on_request

    @on_request.setter
    def on_request(self, hook: RequestHook | None) -> None:
        # Connections opened before the hook was set take it too.
        self._on_request = hook
        for connection in self._connections.values():
            connection.on_request = hook

    def peek(self, address: str) -> BrokerConnection | None:
        """The open connection to ``address``, if there is one, without connecting."""
        connection = self._connections.get(address)
        return connection if connection is not None and not connection.closed else None

    async def get(self, address: str) -> BrokerConnection:
        """The open connection to ``address``; ConnectionLost if it cannot be opened."""
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        if self._closed:
            raise ConnectionLost(address, "the connection pool is closed")
        opening = self._opening.get(address)
        if opening is None:
            opening = asyncio.get_running_loop().create_future()
            self._opening[address] = opening
            try:
                connection = await BrokerConnection.open(
                    address,
                    connect_timeout_s=self.connect_timeout_s,
                    credentials=self.credentials,
                    tls=self.tls,
                    ssl_context=self._ssl,
                )
            except BaseException as exc:
                del self._opening[address]
                shared = exc if isinstance(exc, Exception) else ConnectionLost(address, "cancelled")
                opening.set_exception(shared)
                opening.exception()  # retrieved: the waiters (if any) re-raise it
                raise
            del self._opening[address]
            connection.on_request = self.on_request
            if self._closed:
                await connection.close()
                opening.set_exception(ConnectionLost(address, "the connection pool is closed"))
                opening.exception()
                raise ConnectionLost(address, "the connection pool is closed")
            if self.hello is not None:
                connection.send_oneway(FrameType.HEARTBEAT, self.hello)
            self._connections[address] = connection
            opening.set_result(connection)
            return connection
        return await asyncio.shield(opening)

    async def discard(self, address: str) -> None:
        """Close the connection to ``address`` (say, after it timed out); the next ``get``
        opens a new one."""
        connection = self._connections.pop(address, None)
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.close()
