"""Transactional sends (Notify / MetaQ 3.0): a message delivered only if a local
transaction commits, with the broker checking back when the outcome never arrived.

    async def book(result: SendResult) -> TransactionState:
        ...  # the local transaction, e.g. a database write naming result.msg_id
        return TransactionState.COMMIT

    async def check(message: Message) -> TransactionState:
        ...  # did the local transaction of this message commit? (after a crash, say)

    async with TransactionProducer(nameservers, "orders-producer", check) as producer:
        result, state = await producer.send("orders", body, book)

``send`` stores a half message (invisible to consumers), runs ``local``, and then commits
or rolls the half message back; ``local`` answering UNKNOWN (or raising) leaves the
outcome to a later check. The broker asks some live producer of the same group — any
process of it, after a restart too — through ``check``: COMMIT and ROLLBACK end the half
message, UNKNOWN leaves it for the next check (by default every 6 s, 15 times, then the
broker discards it). Committing twice, or after a check already did, changes nothing.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from msgspec.structs import replace

from metaq.client.connection import BrokerConnection
from metaq.client.message import Message, decode_message
from metaq.client.producer import Producer
from metaq.client.results import SendResult
from metaq.common.errors import MetaqError
from metaq.common.framing import Frame, FrameType
from metaq.common.record import PROP_REAL_QUEUE, PROP_REAL_TOPIC, PROP_TRANSACTION
from metaq.common.service import spawn
from metaq.common.v1.data_pb2 import (
    CheckTransactionRequest,
    EndTransactionRequest,
    EndTransactionResponse,
)

log = logging.getLogger(__name__)


class TransactionState(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"


_ACTIONS = {
    TransactionState.COMMIT: EndTransactionRequest.COMMIT,
    TransactionState.ROLLBACK: EndTransactionRequest.ROLLBACK,
}
LocalTransaction = Callable[[SendResult], Awaitable[TransactionState]]
Checker = Callable[[Message], Awaitable[TransactionState]]


class TransactionProducer:
    """A producer for group ``group`` whose sends are transactions; options as
    :class:`~metaq.client.producer.Producer`'s."""

    def __init__(
        self, nameservers: Sequence[str] | str, group: str, check: Checker, **options: Any
    ) -> None:
        if not group:
            raise ValueError("a transactional producer needs its group: brokers check back by it")
        self.producer = Producer(nameservers, group=group, **options)
        self.group = group
        self._check = check
        self._checks: set[asyncio.Task[None]] = set()
        self.checks_answered = 0

    async def start(self) -> None:
        await self.producer.start()
        self.producer.sender.pool.on_request = self._on_request

    async def close(self) -> None:
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        await self.producer.close()

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def send(
        self,
        topic: str,
        body: bytes,
        local: LocalTransaction,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | bytes | None = None,
    ) -> tuple[SendResult, TransactionState]:
        """Store the half message, run ``local``, end the half message as it says."""
        props = dict(properties or {})
        props[PROP_TRANSACTION] = "true"  # the encoder flags the record as a half message
        result = await self.producer.send(
            topic, body, tags=tags, keys=keys, properties=props, sharding_key=sharding_key
        )
        try:
            state = await local(result)
        except Exception:
            log.exception("local transaction of %s failed; the broker will check back",
                          result.msg_id)  # fmt: skip
            state = TransactionState.UNKNOWN
        if state is not TransactionState.UNKNOWN:
            try:
                await self.end(result, state)
            except MetaqError as exc:
                # The half message stays; the broker's check settles it.
                log.warning("ending transaction %s failed (%s); the broker will check back",
                            result.msg_id, exc)  # fmt: skip
        return result, state

    async def end(self, result: SendResult, state: TransactionState) -> TransactionState:
        """Commit or roll back the half message ``result`` names; returns how it ended."""
        route = await self.producer.routes.route(result.topic)
        group = route.group(result.broker)
        if group is None or not group.master_address:
            raise MetaqError(f"broker group {result.broker} has no master to end {result.msg_id}")
        connection = await self.producer.sender.pool.get(group.master_address)
        request = EndTransactionRequest(
            producer_group=self.group,
            commitlog_offset=result.commitlog_offset,
            msg_id=bytes.fromhex(result.msg_id),
            action=_ACTIONS[state],
        )
        reply = await connection.request(
            FrameType.END_TRANSACTION,
            request.SerializeToString(),
            timeout_s=self.producer.config.send_timeout_s,
        )
        ended = EndTransactionResponse.FromString(reply.header).action
        return (
            TransactionState.COMMIT
            if ended == EndTransactionRequest.COMMIT
            else (TransactionState.ROLLBACK)
        )

    # --- checks from brokers --------------------------------------------------------------

    def _on_request(self, connection: BrokerConnection, frame: Frame) -> None:
        if frame.type is not FrameType.CHECK_TRANSACTION:
            return
        request = CheckTransactionRequest.FromString(frame.header)
        spawn(self._checks, self._answer_check(connection, request, bytes(frame.payload)))

    async def _answer_check(
        self, connection: BrokerConnection, request: CheckTransactionRequest, half: bytes
    ) -> None:
        message = decode_message(half)
        real = message.properties.get(PROP_REAL_TOPIC, message.topic)
        try:
            state = await self._check(_as_sent(message, real))
        except Exception:
            log.exception("checking transaction %s failed", message.msg_id)
            return
        if state is TransactionState.UNKNOWN:
            return
        request_end = EndTransactionRequest(
            producer_group=self.group,
            commitlog_offset=request.commitlog_offset,
            msg_id=request.msg_id,
            action=_ACTIONS[state],
            from_check=True,
        )
        try:
            connection.send_oneway(FrameType.END_TRANSACTION, request_end.SerializeToString())
            self.checks_answered += 1
        except MetaqError as exc:
            log.info("answering a transaction check failed: %s", exc)


def _as_sent(message: Message, topic: str) -> Message:
    """The half message as its producer sent it: its real topic, no broker properties."""
    hidden = {PROP_REAL_TOPIC, PROP_REAL_QUEUE, "PRODUCER_GROUP"}
    props = {k: v for k, v in message.properties.items() if k not in hidden}
    return replace(message, topic=topic, properties=props)
