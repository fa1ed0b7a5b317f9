"""What a send returns: where each message was stored and how durable it is."""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

from metaq.common.v1.data_pb2 import SendResponse


class SendStatus(enum.Enum):
    """The durability a send reached (RocketMQ's SendStatus).

    Every status but OK still means *stored on the master*: the message will be
    delivered unless that broker's disk is lost before the flush or replication it was
    waiting for catches up. Callers that need the stronger guarantee resend on the
    weaker statuses (and accept a possible duplicate).
    """

    OK = "OK"
    """Stored under every guarantee the broker is configured for (sync flush, sync slave)."""
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    """Stored; the sync flush did not confirm within the broker's flush timeout."""
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    """Stored on the master; the sync slave did not confirm in time."""
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    """Stored on the master; sync replication is configured but no slave is in sync."""


STATUS_OF: Final[dict[int, SendStatus]] = {
    SendResponse.OK: SendStatus.OK,
    SendResponse.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    SendResponse.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    SendResponse.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


class SendResult(NamedTuple):
    """One message's send outcome (a named tuple: cheap to build by the thousand).

    ``broker`` is the broker group (broker name) and ``queue_id`` the queue in it; with
    ``queue_offset`` they locate the message for consumers. ``msg_id`` (hex) finds it
    again with ``metaq query id``.
    """

    status: SendStatus
    msg_id: str
    topic: str
    broker: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int = -1
    store_timestamp_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.OK
