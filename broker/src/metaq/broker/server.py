"""The data-plane listener: accepts connections, tracks them, and closes them at shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from metaq.broker.connection import Connection, Handler
from metaq.broker.idle_poll import IdlePoll
from metaq.broker.metrics import BrokerMetrics
from metaq.common.framing import FrameType

log = logging.getLogger(__name__)


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
    ) -> None:
        self._handlers = handlers
        self._max_frame_bytes = max_frame_bytes
        self._metrics = metrics
        self._on_connection_lost = on_connection_lost
        self._idle_poll = idle_poll
        self._server: asyncio.Server | None = None
        self.connections: set[Connection] = set()

    async def bind(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection,
            host,
            port,
            start_serving=False,
            reuse_address=True,
            backlog=1024,
        )
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def serve(self) -> None:
        assert self._server is not None, "bind() first"
        await self._server.start_serving()

    def _new_connection(self) -> Connection:
        return Connection(self._handlers, self, self._max_frame_bytes)

    # --- ConnectionHooks --------------------------------------------------------------

    def connection_made(self, connection: Connection) -> None:
        self.connections.add(connection)
        self._metrics.connections.inc()

    def connection_lost(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.remove(connection)
            self._metrics.connections.dec()
        self._on_connection_lost(connection.connection_id)

    def answered(self, to_request: bool) -> None:
        self._idle_poll.answered(to_request)

    # --- shutdown ---------------------------------------------------------------------

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close_connections(self, timeout_s: float) -> None:
        """Close every connection after writing what it has queued; abort stragglers
        whose peer does not read within ``timeout_s``."""
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
