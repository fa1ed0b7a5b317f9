"""One client connection of the data plane: cut frames, dispatch them, coalesce answers.

Requests are pipelined: each frame of a read is dispatched in order, and a handler either
answers at once or later (a SYNC send waiting for its fsync, a parked long poll), so
answers may go out of order; the request id pairs them up. Everything answered while one
read is handled goes out in a single ``writelines``; answers that complete later are
gathered until the loop's next turn and written together too.

A frame the codec cannot make sense of (wrong version, bad length, unknown type) gets
one ERROR frame for the whole connection, which is then closed: framing cannot
resynchronise. Errors of a single request (unknown topic, bad records) get an ERROR
frame for that request and the connection goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Callable, Mapping
from typing import Final, Protocol, cast

from google.protobuf.message import DecodeError

from metaq.common.errors import ErrorCode, MetaqError, ProtocolError
from metaq.common.framing import Buffer, Frame, FrameDecoder, FrameType, encode_error

log = logging.getLogger(__name__)

_ids: Final = itertools.count(1)


class Responder(Protocol):
    """What a request handler sees of the connection its request came on."""

    @property
    def connection_id(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def respond(self, parts: list[Buffer]) -> None: ...


Handler = Callable[[Responder, Frame], None]
"""Handles one request frame: answers through the responder now or later, or raises a
MetaqError that the connection turns into an ERROR frame for that request."""


class ConnectionHooks(Protocol):
    def connection_made(self, connection: Connection) -> None: ...

    def connection_lost(self, connection: Connection) -> None: ...

    def answered(self, to_request: bool) -> None:
        """Answers were just written to a connection: ``to_request`` when answers to the
        read just handled, else answers that completed later."""


class Connection(asyncio.Protocol):
    """The broker's end of one data-plane connection."""

    def __init__(
        self,
        handlers: Mapping[FrameType, Handler],
        hooks: ConnectionHooks,
        max_frame_bytes: int,
    ) -> None:
        self.connection_id = next(_ids)
        self.peer = "?"
        self._handlers = handlers
        self._hooks = hooks
        self._decoder = FrameDecoder(max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._out: list[Buffer] = []
        self._in_read = False
        self._flush_scheduled = False
        self._closed = False
        self.lost = asyncio.get_running_loop().create_future()
        """Resolves once the transport is gone (for a bounded shutdown)."""

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Answers are coalesced already: Nagle would only hold them back.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self._hooks.connection_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._out = []
        self._transport = None
        self._hooks.connection_lost(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        # The peer does not read its answers: stop taking requests until it catches up.
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and not self._closed:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        self._in_read = True
        try:
            for frame in frames:
                if self._closed:
                    break
                self._dispatch(frame)
        finally:
            self._in_read = False
        self._flush(to_request=True)

    # --- Responder --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def respond(self, parts: list[Buffer]) -> None:
        """Queue an answer; it is written with the others of this read or loop turn."""
        if self._closed:
            return
        self._out += parts
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    # --- internals --------------------------------------------------------------------

    def _dispatch(self, frame: Frame) -> None:
        if frame.is_response:
            if frame.type is FrameType.CONNECTION:
                log.warning("%s: peer reported a connection error; closing", self.peer)
                self.close()
            else:
                log.warning(
                    "%s: dropped a %s response (id %d): the broker sent no such request",
                    self.peer,
                    frame.type.name,
                    frame.request_id,
                )
            return
        if frame.request_id == 0:
            self._fail(
                ProtocolError(
                    ErrorCode.MALFORMED_FRAME,
                    f"a {frame.type.name} request used request id 0, which is reserved "
                    "for connection errors",
                )
            )
            return
        handler = self._handlers.get(frame.type)
        if handler is None:
            self._fail(
                ProtocolError(
                    ErrorCode.UNKNOWN_FRAME_TYPE,
                    f"the broker takes no {frame.type.name} requests",
                )
            )
            return
        try:
            handler(self, frame)
        except MetaqError as exc:
            self._request_failed(frame, exc.code, str(exc), exc.retriable)
        except DecodeError as exc:
            self._request_failed(
                frame,
                ErrorCode.INVALID_MESSAGE,
                f"the {frame.type.name} header is not a valid protobuf message: {exc}",
                False,
            )
        except Exception as exc:
            log.exception("%s: %s request %d failed", self.peer, frame.type.name, frame.request_id)
            self._request_failed(frame, ErrorCode.INTERNAL, f"internal error: {exc!r}", True)

    def _request_failed(self, frame: Frame, code: ErrorCode, message: str, retry: bool) -> None:
        if frame.is_one_way:
            log.info("%s: one-way %s refused: %s", self.peer, frame.type.name, message)
            return
        self.respond(
            encode_error(
                code,
                message,
                request_id=frame.request_id,
                frame_type=frame.type,
                retriable=retry,
            )
        )

    def _fail(self, exc: ProtocolError) -> None:
        """A framing error: answers already due go out, then one connection error, close."""
        log.info("%s: closing after a protocol error: %s", self.peer, exc)
        self._out += encode_error(exc.code, str(exc))
        self._flush()
        self.close()

    def _flush(self, to_request: bool = False) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None:
            out, self._out = self._out, []
            self._transport.writelines(out)
            self._hooks.answered(to_request)

    def close(self) -> None:
        """Write what is queued, then close (the transport drains its buffer first)."""
        if self._closed:
            return
        self._flush()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()
