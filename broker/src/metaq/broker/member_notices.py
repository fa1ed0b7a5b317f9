"""CONSUMER_IDS_CHANGED: tell a consumer group's members at once that its members changed.

Without it a member learns of a new or departed member only from its next heartbeat
answer, so for up to a heartbeat interval two members pull the same queues, or a
departed member's queues lie idle. A notice is a one-way frame with just the group's
name; the consumer heartbeats at once and rebalances (RocketMQ's
NOTIFY_CONSUMER_IDS_CHANGED).

Only connections whose consumer heartbeat asked for notices get them: an older client
would refuse the unknown frame type and drop its connection. Changes within
``window_s`` of a group's last notice are coalesced into one more notice at the end of
the window, so a group starting a hundred members does not get a hundred storms.
"""

from __future__ import annotations

import asyncio
from typing import Final

from metaq.broker.connection import Responder
from metaq.broker.consumers import ConsumerGroups
from metaq.common.framing import FLAG_ONE_WAY, FrameType, encode_frame
from metaq.common.v1.data_pb2 import ConsumerIdsChangedNotice

NOTICE_WINDOW_S: Final = 0.1
"""At most one notice per group this often: short beside any heartbeat interval, long
enough to fold a burst of joins into one rebalance."""

_NO_CAUSE: Final = 0


class MemberChangeNotices:
    """Sends each changed group's members one CONSUMER_IDS_CHANGED per window."""

    def __init__(self, groups: ConsumerGroups, window_s: float = NOTICE_WINDOW_S) -> None:
        self._groups = groups
        self._window_s = window_s
        self._loop = asyncio.get_running_loop()
        self._listeners: dict[int, Responder] = {}
        # group -> the connection whose heartbeat changed it (it knows already: skip it),
        # or _NO_CAUSE once changes from several places, or from none, are pending.
        self._pending: dict[str, int] = {}
        self._last_sent: dict[str, float] = {}
        self._scheduled: dict[str, asyncio.TimerHandle] = {}
        self.sent = 0
        """Notices written, for tests and metrics."""
        groups.on_change = self.changed

    def listen(self, responder: Responder) -> None:
        """The consumer heartbeating on ``responder`` takes notices."""
        self._listeners[responder.connection_id] = responder

    def connection_lost(self, connection_id: int) -> None:
        self._listeners.pop(connection_id, None)

    def changed(self, group: str, cause_connection_id: int = _NO_CAUSE) -> None:
        """``group``'s member set changed; ``cause_connection_id`` is the connection whose
        heartbeat did it (0: none, an expiry or a closed connection)."""
        before = self._pending.get(group)
        self._pending[group] = (
            cause_connection_id if before in (None, cause_connection_id) else _NO_CAUSE
        )
        if group in self._scheduled:
            return
        # Never synchronously: the change may be mid-way through the groups' bookkeeping,
        # and changes of the same loop turn fold into one notice anyway.
        at = max(self._loop.time(), self._last_sent.get(group, -self._window_s) + self._window_s)
        self._scheduled[group] = self._loop.call_at(at, self._send, group)

    def close(self) -> None:
        for handle in self._scheduled.values():
            handle.cancel()
        self._scheduled.clear()
        self._pending.clear()

    def _send(self, group: str) -> None:
        del self._scheduled[group]
        cause = self._pending.pop(group, _NO_CAUSE)
        header = ConsumerIdsChangedNotice(consumer_group=group).SerializeToString()
        written = 0
        for member in self._groups.members(group):
            if member.connection_id == cause:
                continue
            responder = self._listeners.get(member.connection_id)
            if responder is None or responder.closed:
                continue
            # Request ids of one-way frames from the broker are only for logs.
            responder.respond(
                encode_frame(FrameType.CONSUMER_IDS_CHANGED, 1, header, flags=FLAG_ONE_WAY)
            )
            written += 1
        self.sent += written
        # Only a notice written opens a window: the first member's join tells no one, and
        # the second's must not wait behind it while both pull the same queues.
        if written:
            self._last_sent[group] = self._loop.time()
        else:
            self._last_sent.pop(group, None)
