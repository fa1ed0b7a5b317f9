"""Consumption failures: send a message back for a later retry, and in the end to the
dead-letter queue (RocketMQ's design, per consumer group).

A push consumer (clustering) whose handler fails for a message sends it back to its
broker group's master as a new record in the group's retry topic ``%RETRY%<group>``,
with ``reconsume_times`` one higher and delayed by the broker's delay levels (the
``first_retry_level``-th level for the first retry, the next for the second, …; by
default 10 s, 30 s, 1 min, 2 min, …). The consumer subscribes to its retry topic too and
hands those messages to the original topic's handler, under the original topic's name.
After ``max_reconsume_times`` retries the message goes to ``%DLQ%<group>`` instead,
where ``metaq dlq`` lists, shows and re-sends it. The original message counts as
consumed once the copy is stored, so a failing message never holds its queue's offset
back beyond its retry schedule; and since retries live in per-group topics, other
groups reading the same topic never see them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from msgspec.structs import replace

from metaq.client.connection import ConnectionPool
from metaq.client.message import Message
from metaq.client.observe import Observer
from metaq.client.routes import RouteCache
from metaq.common import record
from metaq.common.framing import FrameType
from metaq.common.names import DLQ_PREFIX, dlq_topic, retry_topic
from metaq.common.v1.data_pb2 import SendRequest, SendResponse

log = logging.getLogger(__name__)

PROP_RETRY_TOPIC: Final = "RETRY_TOPIC"
"""The topic a retried or dead-lettered message was first sent to."""
PROP_ORIGIN_MSG_ID: Final = "ORIGIN_MSG_ID"
PROP_FAILURE: Final = "LAST_FAILURE"
# Properties of the broker's delay machinery, never carried into a retry copy.
_DELAY_PROPS: Final = frozenset(
    {record.PROP_DELAY_LEVEL, record.PROP_DELIVER_AT, record.PROP_REAL_TOPIC,
     record.PROP_REAL_QUEUE, "DUE_MS", "TIER_SINCE", "DELAY_SOURCE"}
)  # fmt: skip


def as_original(message: Message) -> Message:
    """A message from a retry topic as the handler should see it: under its first topic."""
    origin = message.properties.get(PROP_RETRY_TOPIC)
    return replace(message, topic=origin) if origin else message


def retry_record(
    message: Message,
    group: str,
    failure: BaseException,
    *,
    max_reconsume_times: int,
    first_retry_level: int,
    delay_levels: int,
    dead: bool = False,
) -> tuple[str, bytearray]:
    """The copy to send back for ``message``: (topic, record); with ``dead``, straight
    to the dead-letter topic."""
    times = message.reconsume_times + 1
    props: dict[str, str] = {k: v for k, v in message.properties.items() if k not in _DELAY_PROPS}
    props.setdefault(PROP_RETRY_TOPIC, message.topic)
    props.setdefault(PROP_ORIGIN_MSG_ID, message.msg_id)
    props[PROP_FAILURE] = repr(failure)[:200]
    flags = message.flags & ~(record.FLAG_COMPRESSED | record.FLAG_DELAYED)
    if dead or times > max_reconsume_times:
        topic = dlq_topic(group)
    else:
        topic = retry_topic(group)
        props[record.PROP_DELAY_LEVEL] = str(min(first_retry_level + times - 1, delay_levels))
        flags |= record.FLAG_DELAYED
    raw = record.encode(
        topic,
        message.body,
        tags=message.tags,
        keys=message.keys,
        properties=props,
        flags=flags,
        born_timestamp_ms=message.born_timestamp_ms,
        reconsume_times=times,
    )
    return topic, raw


class SendBack:
    """Sends failed messages back to the master of the broker group they came from."""

    def __init__(
        self,
        routes: RouteCache,
        connections: ConnectionPool,
        group: str,
        *,
        max_reconsume_times: int,
        first_retry_level: int,
        delay_levels: int,
        timeout_s: float,
        observers: Sequence[Observer] = (),
    ) -> None:
        self._routes = routes
        self._observers = observers
        self._connections = connections
        self._group = group
        self._max = max_reconsume_times
        self._first = first_retry_level
        self._levels = delay_levels
        self._timeout_s = timeout_s
        self.sent_back = 0
        self.dead_lettered = 0

    async def __call__(
        self,
        topic: str,
        broker_name: str,
        message: Message,
        failure: BaseException,
        *,
        dead: bool = False,
    ) -> bool:
        """True once the copy is stored (the original may then count as consumed)."""
        try:
            route = await self._routes.route(topic)
            group = route.group(broker_name)
            address = group.master_address if group is not None else ""
            if not address:
                return False  # no master right now: retry locally and try again later
            target, raw = retry_record(
                message, self._group, failure, max_reconsume_times=self._max,
                first_retry_level=self._first, delay_levels=self._levels, dead=dead,
            )  # fmt: skip
            connection = await self._connections.get(address)
            header = SendRequest(topic=target, queue_id=0, record_count=1).SerializeToString()
            reply = await connection.request(
                FrameType.SEND, header, [raw], timeout_s=self._timeout_s
            )
        except Exception as exc:
            log.warning("sending message %s back for a retry failed: %s", message.msg_id, exc)
            return False
        if SendResponse.FromString(reply.header).status != SendResponse.OK:
            return False
        for observer in self._observers:
            observer.sent_back(self._group, broker_name, message, target)
        if target.startswith(DLQ_PREFIX):
            self.dead_lettered += 1
            log.error(
                "message %s of %s failed %d times; moved to %s: %r",
                message.msg_id, topic, message.reconsume_times + 1, target, failure,
            )  # fmt: skip
        else:
            self.sent_back += 1
        return True
