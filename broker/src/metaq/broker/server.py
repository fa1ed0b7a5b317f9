"""The data-plane listener: accepts connections, tracks them, and closes them at shutdown.

It also keeps connections within bounds: at most ``max_connections`` (and never more
than the descriptor budget leaves beside the broker's own files and ``fd_reserve``:
:class:`~metaq.broker.limits.DescriptorBudget`), at most
``max_connections_per_address`` from one client address, none that has not sent a
whole request (with auth: an authenticated one) after ``handshake_timeout_s`` — and
when every slot is taken, a new connection takes the slot of the oldest such
connection, so sockets that connect and say nothing cannot keep clients out — none idle
for longer than ``idle_timeout_s``, incomplete request frames within one broker-wide
byte budget (part of it kept for small frames), and none whose incomplete frame arrives
slower than ``min_request_bytes_per_s`` while others wait for that budget, or stalls
for good (:func:`~metaq.broker.limits.too_slow`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from metaq.broker.connection import Connection, Gate, Handler
from metaq.broker.idle_poll import IdlePoll
from metaq.broker.limits import STALL_WINDOWS, DescriptorBudget, RequestBudget, too_slow
from metaq.broker.metrics import BrokerMetrics
from metaq.common.errors import ErrorCode
from metaq.common.framing import FrameType
from metaq.common.service import PeriodicService

log = logging.getLogger(__name__)


def _address(peer: str) -> str:
    """The client address of a ``host:port`` peer name."""
    return peer.rpartition(":")[0] or peer


_SWEEP_MAX_S = 2.0
# One warning per this many seconds about refused connections, however many there are.
_REFUSAL_LOG_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The broker settings of the same names (``BrokerConfig``)."""

    max_connections: int = 10_000
    idle_timeout_s: float = 120.0
    handshake_timeout_s: float = 10.0
    max_connections_per_address: int = 1000
    max_buffered_request_bytes: int = 256 * 1024 * 1024
    max_connection_write_bytes: int = 16 * 1024 * 1024
    small_request_reserve_bytes: int = 16 * 1024 * 1024
    small_request_max_bytes: int = 1024 * 1024
    min_request_bytes_per_s: int = 64 * 1024
    request_arrival_window_s: float = 5.0
    max_connection_inflight_requests: int = 4096


class DataServer:
    """Owns the listening socket and every open :class:`Connection`.

    Bind first (:meth:`bind`, which learns the real port when 0 was asked), start the
    store, then :meth:`serve`: no request is taken before the broker can answer it.
    """

    def __init__(
        self,
        handlers: Mapping[FrameType, Handler],
        max_frame_bytes: int,
        metrics: BrokerMetrics,
        on_connection_lost: Callable[[int], None],
        idle_poll: IdlePoll,
        limits: ConnectionLimits | None = None,
        gate: Gate | None = None,
        descriptors: DescriptorBudget | None = None,
    ) -> None:
        self._handlers = handlers
        self._gate = gate
        self._max_frame_bytes = max_frame_bytes
        self._metrics = metrics
        self._on_connection_lost = on_connection_lost
        self._idle_poll = idle_poll
        self.limits = limits or ConnectionLimits()
        limits = self.limits
        self.descriptors = descriptors or DescriptorBudget(nofile=1 << 20, fd_reserve=0)
        self.budget = RequestBudget(
            max(limits.max_buffered_request_bytes, max_frame_bytes),
            limits.small_request_reserve_bytes,
            limits.small_request_max_bytes,
        )
        self.room = self.limits.max_connections
        """Connections taken at once now: ``max_connections`` or fewer, as many as the
        descriptor budget leaves (recounted every sweep)."""
        self._server: asyncio.Server | None = None
        self._sweeper: _Sweeper | None = None
        self._refused_since_log = 0
        self._refusal_logged = 0.0
        self.connections: set[Connection] = set()
        # Connections that have not sent a whole request yet, oldest first.
        self._unsettled: dict[Connection, None] = {}
        self._per_address: Counter[str] = Counter()
        metrics.request_bytes_reserved.set_function(lambda: self.budget.used)
        metrics.connections_waiting_for_budget.set_function(lambda: self.budget.waiting)
        metrics.connections_at_inflight_cap.set_function(
            lambda: sum("inflight" in c.blocked for c in self.connections)
        )

    async def bind(
        self, host: str, port: int, tls: ssl.SSLContext | None = None
    ) -> tuple[str, int]:
        """Bind the data port, serving TLS with ``tls``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection,
            host,
            port,
            start_serving=False,
            reuse_address=True,
            backlog=1024,
            ssl=tls,
            # A peer that never finishes its handshake holds a descriptor, not memory
            # of the request budget: give it as long as an incomplete frame gets.
            ssl_handshake_timeout=self.limits.request_arrival_window_s if tls else None,
        )
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def serve(self) -> None:
        assert self._server is not None, "bind() first"
        self.descriptors.recount_now(len(self.connections))
        self._set_room()
        budget = self.descriptors
        if self.room <= 0:
            raise ValueError(
                f"the open-file limit of {budget.nofile} leaves no descriptors for "
                f"connections once fd_reserve={budget.fd_reserve} and the broker's own "
                f"files ({budget.held}) are set aside: raise the hard RLIMIT_NOFILE "
                "(LimitNOFILE= under systemd) or lower fd_reserve"
            )
        if self.room < self.limits.max_connections:
            log.warning(
                "only %d data-plane connections fit in the open-file limit of %d "
                "(max_connections=%d, fd_reserve=%d): raise the hard RLIMIT_NOFILE "
                "(LimitNOFILE= under systemd)",
                self.room,
                budget.nofile,
                self.limits.max_connections,
                budget.fd_reserve,
            )
        self._sweeper = _Sweeper(self)
        self._sweeper.start()
        await self._server.start_serving()

    def _new_connection(self) -> Connection:
        return Connection(
            self._handlers,
            self,
            self._max_frame_bytes,
            self.budget,
            self.limits.max_connection_write_bytes,
            self.limits.max_connection_inflight_requests,
            self._metrics.rpc_latency,
            self._gate,
        )

    async def recount(self) -> None:
        """Count descriptors again (off the loop) and set ``room`` from the budget."""
        await self.descriptors.recount(lambda: len(self.connections))
        self._set_room()

    def _set_room(self) -> None:
        self.room = max(0, min(self.limits.max_connections, self.descriptors.connection_slots()))

    def refusal(self) -> str | None:
        """Why no client can connect now, for /health (None while one can)."""
        if self.room > 0:
            return None
        budget = self.descriptors
        return (
            f"the broker takes no data-plane connection: its open-file limit of "
            f"{budget.nofile} leaves none once the broker's own files ({budget.held} "
            f"open) and fd_reserve={budget.fd_reserve} are counted; raise the hard "
            "RLIMIT_NOFILE (systemd LimitNOFILE=)"
        )

    # --- ConnectionHooks --------------------------------------------------------------

    def connection_made(self, connection: Connection) -> str | None:
        address = _address(connection.peer)
        cap = self.limits.max_connections_per_address
        if cap and self._per_address[address] >= cap:
            self._refused(connection)
            return (
                f"{address} holds {self._per_address[address]} connections to this broker, "
                f"all one address may (max_connections_per_address={cap}); close some or "
                "share them"
            )
        if len(self.connections) >= self.room and not self._make_room():
            self._refused(connection)
            return (
                f"the broker has {len(self.connections)} connections, all it takes now "
                f"(max_connections={self.limits.max_connections}, fd_reserve="
                f"{self.descriptors.fd_reserve}); retry later or use another broker"
            )
        self.connections.add(connection)
        self._unsettled[connection] = None
        self._per_address[address] += 1
        self._metrics.connections.inc()
        return None

    def _make_room(self) -> bool:
        """Close the oldest connection that has not sent a request yet, if there is one."""
        for oldest in self._unsettled:
            oldest.close_with_error(
                ErrorCode.BUSY,
                "the broker is full and this connection sent no request: its slot went to "
                "a new connection",
            )
            self._forget(oldest)
            self._metrics.connections_idle_closed.inc()
            return True
        return False

    def settled(self, connection: Connection) -> None:
        self._unsettled.pop(connection, None)

    def _refused(self, connection: Connection) -> None:
        self._metrics.connections_refused.inc()
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._refusal_logged >= _REFUSAL_LOG_EVERY_S:
            log.warning(
                "refused %d connections (the last from %s): %d open, the limit now %d "
                "(max_connections=%d)",
                self._refused_since_log,
                connection.peer,
                len(self.connections),
                self.room,
                self.limits.max_connections,
            )
            self._refused_since_log = 0
            self._refusal_logged = now

    def connection_lost(self, connection: Connection) -> None:
        self._forget(connection)
        self._on_connection_lost(connection.connection_id)

    def _forget(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.remove(connection)
            self._unsettled.pop(connection, None)
            address = _address(connection.peer)
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]
            self._metrics.connections.dec()

    def answered(self, to_request: bool) -> None:
        self._idle_poll.answered(to_request)

    def zero_copied(self, nbytes: int) -> None:
        self._metrics.zero_copy_bytes.inc(nbytes)

    # --- idle connections -------------------------------------------------------------

    def close_idle(self, now: float) -> int:
        """Close connections idle for ``idle_timeout_s`` or whose incomplete frame has
        taken that long (return how many), and those whose frame holds its memory too long
        (:meth:`_trickles`)."""
        timeout = self.limits.idle_timeout_s
        closed = self._close_unsettled(now)
        for connection in list(self.connections):
            if connection.closed:
                continue
            blocked = connection.blocked
            # While the broker itself does not read, the frame cannot arrive: the peer
            # is judged by whether it reads its answers (last_active) instead.
            if connection.frame_started and not blocked and self._trickles(connection, now):
                continue  # counted apart: metaq_connections_too_slow
            if not timeout:
                continue
            if (
                connection.frame_started
                and not blocked
                and now - connection.frame_started > timeout
            ):
                connection.close_with_error(
                    ErrorCode.MALFORMED_FRAME,
                    f"a frame of {connection.pending_frame_bytes} bytes did not arrive whole "
                    f"within idle_timeout_s={timeout:g}; closing",
                )
            elif (
                not connection.unanswered
                and "budget" not in blocked
                and now - connection.last_active > timeout
            ):
                connection.close()
            else:
                continue
            closed += 1
        if closed:
            self._metrics.connections_idle_closed.inc(closed)
            log.info("closed %d idle data-plane connections (idle_timeout_s=%g)", closed, timeout)
        return closed

    def _close_unsettled(self, now: float) -> int:
        """Close connections that sent no whole request within ``handshake_timeout_s``."""
        limit_s = self.limits.handshake_timeout_s
        late = [c for c in self._unsettled if now - c.opened_at > limit_s and not c.closed]
        for connection in late:
            connection.close_with_error(
                ErrorCode.MALFORMED_FRAME,
                f"no whole request (with auth: no authenticated one) within "
                f"handshake_timeout_s={limit_s:g}; closing",
            )
            self._forget(connection)
        return len(late)

    def _trickles(self, connection: Connection, now: float) -> bool:
        """Close ``connection`` if its incomplete frame holds its reservation of the
        request budget too long (:func:`~metaq.broker.limits.too_slow`): below
        ``min_request_bytes_per_s`` over the last arrival window while other frames wait
        for room, or with no byte for :data:`~metaq.broker.limits.STALL_WINDOWS` windows."""
        limits = self.limits
        arrived, window_s = connection.arrived_in_window(now)
        wanted = self.budget.waiting > 0
        stalled_s = connection.stalled_for(now)
        if not too_slow(
            arrived, window_s, limits.min_request_bytes_per_s, limits.request_arrival_window_s,
            wanted=wanted, stalled_s=stalled_s,
        ):  # fmt: skip
            if window_s >= limits.request_arrival_window_s:
                connection.next_window(now)
            return False
        self._metrics.connections_too_slow.inc()
        frame = f"a frame of {connection.pending_frame_bytes} bytes"
        why = (
            f"{frame} arrived at {arrived / window_s:.0f} bytes/s over the last "
            f"{window_s:.1f} s, below min_request_bytes_per_s="
            f"{limits.min_request_bytes_per_s}, while {self.budget.waiting} other frames "
            "wait for the memory it holds; closing (send whole frames promptly)"
            if wanted
            else f"{frame} got no byte for {stalled_s:.1f} s, over {STALL_WINDOWS} x "
            f"request_arrival_window_s={limits.request_arrival_window_s:g} (the stall "
            f"bound of min_request_bytes_per_s={limits.min_request_bytes_per_s}): its "
            "sender looks gone; closing (send whole frames promptly)"
        )
        log.info("%s: %s", connection.peer, why)
        connection.close_with_error(ErrorCode.MALFORMED_FRAME, why)
        return True

    # --- shutdown ---------------------------------------------------------------------

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close_connections(self, timeout_s: float) -> None:
        """Close every connection after writing what it has queued; abort stragglers
        whose peer does not read within ``timeout_s``."""
        if self._sweeper is not None:
            await self._sweeper.stop()
            self._sweeper = None
        open_connections = list(self.connections)
        for connection in open_connections:
            connection.close()
        lost = [c.lost for c in open_connections]
        if lost:
            _, pending = await asyncio.wait(lost, timeout=timeout_s)
            if pending:
                log.warning("aborting %d connections that did not drain in time", len(pending))
                for connection in open_connections:
                    if not connection.lost.done():
                        connection.abort()
                await asyncio.wait(lost, timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()


class _Sweeper(PeriodicService):
    """Closes idle connections and re-counts the descriptor budget."""

    name = "connection-sweep"

    def __init__(self, server: DataServer) -> None:
        limits = server.limits
        timeout = limits.idle_timeout_s
        every_s = min(timeout / 4, _SWEEP_MAX_S) if timeout else _SWEEP_MAX_S
        if limits.min_request_bytes_per_s:
            # A stalled frame is seen at most half a window late.
            every_s = min(every_s, limits.request_arrival_window_s / 2)
        super().__init__(every_s)
        self._server = server

    async def run_once(self) -> None:
        await self._server.recount()
        self._server.close_idle(asyncio.get_running_loop().time())
