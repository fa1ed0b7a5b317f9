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

Flow control: a peer that does not read its answers stops being read once
``max_connection_write_bytes`` of them wait in the transport (frames already read wait
undispatched), as does one with ``max_connection_inflight_requests`` requests awaiting
an answer (parked long polls answer nothing for a long time, so the write limit alone
would never stop them); and a frame that arrives in pieces first reserves its whole size
from the broker-wide :class:`~metaq.broker.limits.RequestBudget`; until it gets it, the
connection is not read either. So neither pipelining nor announced-but-unsent frames
let one peer hold more than a bounded share of the broker's memory.

Nor of its time: one read's frames are handled for at most ``TURN_S`` of the loop's
turn; the rest wait, the connection unread, for the next turn, so a read of thousands of
pipelined PULLs (each a commitlog slice to cut) cannot stall every other connection and
the HTTP health check behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol, cast

from google.protobuf.message import DecodeError

from metaq.broker import zero_copy
from metaq.broker.latency import Latency, LatencyFamily
from metaq.broker.limits import RequestBudget
from metaq.broker.zero_copy import FileRange, Part
from metaq.common.errors import ErrorCode, MetaqError, ProtocolError
from metaq.common.framing import (
    FLAG_RESPONSE,
    Buffer,
    Frame,
    FrameDecoder,
    FrameType,
    encode_error,
)

log = logging.getLogger(__name__)

_ids: Final = itertools.count(1)
# A frame's request id, after its length, version, type and flags (see framing.PREFIX).
_REQUEST_ID: Final = struct.Struct("<I")
TURN_S: Final = 0.005
"""How long one connection's frames may be handled before the loop serves the others.
Sends and small requests never reach it (a read of them takes well under a
millisecond); a burst of large pulls does."""


class Responder(Protocol):
    """What a request handler sees of the connection its request came on."""

    @property
    def connection_id(self) -> int: ...

    @property
    def peer(self) -> str:
        """The client's address (``host:port``), for logs and admin views."""
        ...

    @property
    def closed(self) -> bool: ...

    def respond(self, parts: Sequence[Part]) -> None:
        """Queue an answer: its first part holds the frame's prefix; a
        :class:`~metaq.broker.zero_copy.FileRange` part may go out by ``sendfile``."""
        ...


Handler = Callable[[Responder, Frame], None]
"""Handles one request frame: answers through the responder now or later, or raises a
MetaqError that the connection turns into an ERROR frame for that request."""


class Gate(Protocol):
    """Checks each request before its handler sees it (``user_auth.UserGate``)."""

    def admit(self, responder: Responder, frame: Frame) -> Frame:
        """The frame to handle, or raise a MetaqError that refuses the request."""

    def proven(self, connection_id: int) -> bool:
        """Whether the connection authenticated (a user, or a slave's cluster secret)."""


class ConnectionHooks(Protocol):
    def connection_made(self, connection: Connection) -> str | None:
        """Take the connection, or return why it is refused (it is then told and closed)."""

    def connection_lost(self, connection: Connection) -> None: ...

    def settled(self, connection: Connection) -> None:
        """The connection's first request (with auth: its first authenticated one) was
        taken: it is a client, not a socket that connected and said nothing."""

    def answered(self, to_request: bool) -> None:
        """Answers were just written to a connection: ``to_request`` when answers to the
        read just handled, else answers that completed later."""

    def zero_copied(self, nbytes: int) -> None:
        """``nbytes`` of answers just went out by ``sendfile``."""


class Connection(asyncio.Protocol):
    """The broker's end of one data-plane connection."""

    def __init__(
        self,
        handlers: Mapping[FrameType, Handler],
        hooks: ConnectionHooks,
        max_frame_bytes: int,
        budget: RequestBudget,
        max_write_bytes: int,
        max_inflight: int,
        latency: LatencyFamily | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.connection_id = next(_ids)
        self._gate = gate
        self.peer = "?"
        self._handlers = handlers
        self._hooks = hooks
        self._decoder = FrameDecoder(max_frame_bytes)
        self._budget = budget
        self._max_write_bytes = max_write_bytes
        self._max_inflight = max_inflight
        self._resume_scheduled = False
        self._transport: asyncio.Transport | None = None
        self._out: list[Part] = []
        self._out_bytes = 0
        self._out_files = False
        """Whether ``_out`` holds a FileRange (else it goes out in one ``writelines``)."""
        self._sendfile_fd: int | None = None
        self._in_read = False
        self._flush_scheduled = False
        self._closed = False
        self._loop = asyncio.get_running_loop()
        # Why reading is paused: "writes" (the peer does not read), "budget" (waiting to
        # reserve the incomplete frame), "inflight" (max_inflight requests await
        # answers), "turn" (frames of a read wait for the next turn); read again once
        # there is no reason left.
        self._blocked: set[str] = set()
        self._writing_paused = False
        # Frames read but not dispatched while the peer does not read its answers or has
        # max_inflight requests awaiting answers.
        self._stash: list[Frame] = []
        self._reserved = 0
        self._wanted = 0
        self.unanswered = 0
        """Requests taken that await an answer (a parked long poll, a fsync): while any
        does, the connection is not idle."""
        self.last_active = self._loop.time()
        """Loop time the peer last sent bytes or read some of its answers, or its last
        awaited answer went out."""
        self.opened_at = self.last_active
        self.settled = False
        """A request of this connection passed the gate (see ConnectionHooks.settled)."""
        self.frame_started = 0.0
        """Loop time the incomplete frame got its reservation (0: none)."""
        self.received_at = self.last_active
        """Loop time the peer last sent bytes."""
        self.window_started = 0.0
        self.window_bytes = 0
        """Since when, and from how many buffered bytes on, the incomplete frame's arrival
        rate is being judged (see :meth:`arrived_in_window`)."""
        self.lost = self._loop.create_future()
        """Resolves once the transport is gone (for a bounded shutdown)."""
        self._latency_family = latency
        self._latency: dict[FrameType, Latency] = {}
        # Request id -> its type's histogram and when it was read, until it is answered.
        self._started: dict[int, tuple[Latency, float]] = {}

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._sendfile_fd = zero_copy.socket_fd(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Answers are coalesced already: Nagle would only hold them back.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        # Past this the transport calls pause_writing, and requests wait.
        self._transport.set_write_buffer_limits(
            high=self._max_write_bytes, low=self._max_write_bytes // 4
        )
        refused = self._hooks.connection_made(self)
        if refused is not None:
            self._closed = True
            self._transport.write(b"".join(encode_error(ErrorCode.BUSY, refused)))
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._out = []
        self._out_files = False
        self._sendfile_fd = None
        self._stash = []
        self._started = {}
        self._transport = None
        if self._reserved:
            self._budget.release(self._reserved)
            self._reserved = 0
        if self._wanted:
            self._budget.forget(self)
            self._wanted = 0
        self._hooks.connection_lost(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        # The peer does not read its answers: stop taking requests until it catches up.
        self._writing_paused = True
        self._block("writes")

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.last_active = self._loop.time()
        self._resume("writes")

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self.last_active = self.received_at = self._loop.time()
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        self._reserve_partial(new_frame=bool(frames))
        if self._stash:
            # Already read by the transport when reading was paused: in order, later.
            self._stash += frames
            return
        self._handle(frames)

    # --- flow control -----------------------------------------------------------------

    @property
    def blocked(self) -> frozenset[str]:
        return frozenset(self._blocked)

    @property
    def pending_frame_bytes(self) -> int:
        return self._decoder.pending_frame_bytes

    def _block(self, reason: str) -> None:
        if not self._blocked and self._transport is not None:
            self._transport.pause_reading()
        self._blocked.add(reason)

    def _unblock(self, reason: str) -> None:
        self._blocked.discard(reason)
        if not self._blocked and self._transport is not None and not self._closed:
            self._transport.resume_reading()
            if self._reserved:
                # Time spent unread is not the peer's: its frame's clock starts again.
                self._frame_clock_starts()

    def _reserve_partial(self, new_frame: bool) -> None:
        """Hold a reservation for exactly the incomplete frame, if any; ``new_frame``
        when the read completed frames, so an incomplete one is another frame even if it
        has the same size (its time to arrive starts now)."""
        if self._wanted:
            return  # not read while it waits: the frame is the one it waits for
        need = self._decoder.pending_frame_bytes
        if need == self._reserved and not new_frame:
            return
        if self._reserved:
            self._budget.release(self._reserved)
            self._reserved = 0
        if need:
            if self._budget.reserve(self, need):
                self._reserved = need
                self._frame_clock_starts()
            else:
                self._wanted = need
                self._block("budget")
        else:
            self.frame_started = 0.0

    def granted(self) -> None:
        """The budget reserved the incomplete frame: read its rest."""
        self._reserved, self._wanted = self._wanted, 0
        self._frame_clock_starts()
        self._unblock("budget")

    def _frame_clock_starts(self) -> None:
        self.frame_started = self.window_started = self._loop.time()
        self.window_bytes = self._decoder.buffered

    def arrived_in_window(self, now: float) -> tuple[int, float]:
        """Bytes of the incomplete frame that arrived since its arrival window started,
        and the window's length so far; the caller judges them, then the window starts
        again at ``now`` by :meth:`next_window`."""
        return self._decoder.buffered - self.window_bytes, now - self.window_started

    def stalled_for(self, now: float) -> float:
        """Seconds the incomplete frame has got no byte (since its reservation at most)."""
        return now - max(self.frame_started, self.received_at)

    def next_window(self, now: float) -> None:
        self.window_started = now
        self.window_bytes = self._decoder.buffered

    def _handle(self, frames: list[Frame]) -> None:
        self._in_read = True
        # time.monotonic, not the loop's clock: uvloop's stands still within a turn.
        deadline = time.monotonic() + TURN_S
        try:
            for at, frame in enumerate(frames):
                if self._closed:
                    break
                if self._out_bytes >= self._max_write_bytes:
                    self._flush(to_request=True)
                if self._writing_paused:
                    self._stash = frames[at:]
                    break
                if self.unanswered >= self._max_inflight:
                    # Parked answers may take a minute: read no more until some go out.
                    self._stash = frames[at:]
                    self._block("inflight")
                    break
                if at and time.monotonic() > deadline:
                    self._stash = frames[at:]
                    self._block("turn")
                    self._loop.call_soon(self._resume, "turn")
                    break
                self._dispatch(frame)
        finally:
            self._in_read = False
        self._flush(to_request=True)

    def _resume(self, reason: str) -> None:
        """``reason`` to stop reading is gone: handle what was read meanwhile (unless the
        peer still does not read its answers)."""
        if self._closed:
            return
        self._unblock(reason)
        if self._stash and not self._writing_paused:
            frames, self._stash = self._stash, []
            self._handle(frames)

    # --- Responder --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def respond(self, parts: Sequence[Part]) -> None:
        """Queue an answer; it is written with the others of this read or loop turn."""
        if self._closed:
            return
        prefix = cast(Buffer, parts[0])
        if prefix[6] & FLAG_RESPONSE and self.unanswered:
            self.unanswered -= 1
            started = self._started.pop(_REQUEST_ID.unpack_from(prefix, 8)[0], None)
            if started is not None:
                started[0].observe(time.perf_counter() - started[1])
            if not self.unanswered:
                # Idle time counts from the last answer too: a long poll answered after
                # more than idle_timeout_s leaves its peer time for the next request.
                self.last_active = self._loop.time()
            if (
                "inflight" in self._blocked
                and self.unanswered < self._max_inflight
                and not self._resume_scheduled
            ):
                # Not from inside respond: the handler answering may be mid-way.
                self._resume_scheduled = True
                self._loop.call_soon(self._resume_inflight)
        self._out += parts
        self._out_bytes += sum(map(len, parts))
        if len(parts) > 1 and not self._out_files:
            self._out_files = any(isinstance(part, FileRange) for part in parts)
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _resume_inflight(self) -> None:
        self._resume_scheduled = False
        self._resume("inflight")

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
        if not frame.is_one_way:
            self.unanswered += 1
            if self._latency_family is not None:
                latency = self._latency.get(frame.type)
                if latency is None:  # a histogram only for the request types seen
                    latency = self._latency[frame.type] = self._latency_family.child(
                        frame.type.name
                    )
                self._started[frame.request_id] = (latency, time.perf_counter())
        try:
            if self._gate is not None:
                frame = self._gate.admit(self, frame)
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
        if not self.settled and (self._gate is None or self._gate.proven(self.connection_id)):
            self.settled = True
            self._hooks.settled(self)

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
        self.close_with_error(exc.code, str(exc))

    def close_with_error(self, code: ErrorCode, message: str) -> None:
        """Answers already due go out, then one connection error saying why, then close."""
        self._out += encode_error(code, message)
        self._flush()
        self.close()

    def _flush(self, to_request: bool = False) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None:
            out, self._out = self._out, []
            self._out_bytes = 0
            if self._out_files:
                self._out_files = False
                zero_copied = zero_copy.write(self._transport, self._sendfile_fd, out)
                if zero_copied:
                    self._hooks.zero_copied(zero_copied)
            else:
                self._transport.writelines(cast(list[Buffer], out))
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
