"""The producers connected to this broker, as each said who it is (a HEARTBEAT carrying
a ``ClientHello``), for admin views (``GET /producers``, ``metaq connections``).

One entry per connection, forgotten when the connection closes: a producer says hello
once on each connection it opens, so nothing needs to expire. A producer of an older
version sends no hello and is not listed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from metaq.common.errors import InvalidMessage
from metaq.common.names import check_group

MAX_PRODUCERS: Final = 100_000
"""Hellos kept at most; one per connection, so the connection limit binds first."""


@dataclass(frozen=True, slots=True)
class ProducerConnection:
    client_id: str
    group: str
    host: str
    computer_room: str
    client_version: str
    language: str
    since_ms: int


class ProducerConnections:
    """Producers by connection id."""

    def __init__(self) -> None:
        self._by_connection: dict[int, ProducerConnection] = {}

    def hello(
        self,
        connection_id: int,
        *,
        client_id: str,
        group: str,
        host: str,
        computer_room: str = "",
        client_version: str = "",
        language: str = "",
    ) -> None:
        """Record who the producer on ``connection_id`` is (replacing what it said before)."""
        if not client_id or len(client_id) > 255:
            raise InvalidMessage("a producer's hello needs a client id of 1-255 characters")
        check_group(group)
        if connection_id not in self._by_connection and len(self._by_connection) >= MAX_PRODUCERS:
            return
        self._by_connection[connection_id] = ProducerConnection(
            client_id, group, host, computer_room[:255], client_version[:64], language[:32],
            time.time_ns() // 1_000_000,
        )  # fmt: skip

    def connection_lost(self, connection_id: int) -> None:
        self._by_connection.pop(connection_id, None)

    def all(self) -> list[ProducerConnection]:
        """Every connected producer that said hello, by (group, client id)."""
        return sorted(self._by_connection.values(), key=lambda p: (p.group, p.client_id))
