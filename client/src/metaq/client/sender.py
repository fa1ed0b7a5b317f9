"""The producer's sender: takes batches from the accumulator and owns the connections.

Runs on callbacks rather than a task per batch or per message: a send schedules one
drain for the end of the loop turn, the drain writes every batch the accumulator lets go
(one SEND frame each, pipelined on the broker's single connection), and the answer —
delivered by the connection straight from its socket read, without a future — resolves
the waiters of the batch's records (or the batch's one future, for ``send_batch``) and
schedules the next drain. A timer wakes the drain when a lingering batch comes due. The
only tasks are connects, one per broker address at a time, owned here and cancelled on
close.

On an answer the sender also feeds :class:`~metaq.client.selection.BrokerHealth`
(failures and slow answers isolate a broker for a while). A coalesced batch that the
broker refuses as INVALID_MESSAGE (nothing of it was stored) is split and its records
sent one by one, so one bad message fails only its own send. Retrying on another broker
is the producer's business, not the sender's: it needs the route and the retry policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterable

from metaq.client.accumulator import Accumulator, Batch
from metaq.client.answer_poll import AnswerPoll
from metaq.client.connection import BrokerConnection, ConnectionPool
from metaq.client.errors import BrokerError, ConnectionLost, ProducerClosed
from metaq.client.results import STATUS_OF, SendResult, SendStatus
from metaq.client.selection import BrokerHealth
from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.framing import Buffer, Frame, FrameType
from metaq.common.model import QueueRoute
from metaq.common.record import UNPLACED, msg_id_prefix_hex
from metaq.common.v1.data_pb2 import SendRequest, SendResponse

log = logging.getLogger(__name__)

_HEADER_CACHE = 4096

BatchOutcome = list[SendResult]
"""What a submitted batch's future resolves with: every record's result, in order."""


class Sender:
    """Writes the accumulator's batches to the brokers and resolves their futures."""

    def __init__(
        self,
        accumulator: Accumulator,
        pool: ConnectionPool,
        health: BrokerHealth,
        *,
        producer_group: str,
        timeout_s: float,
        wait_store: bool = True,
        answer_poll_us: int = 0,
    ) -> None:
        self.accumulator = accumulator
        self.pool = pool
        self.health = health
        self.producer_group = producer_group
        self.timeout_s = timeout_s
        self.flags = 0 if wait_store else SendRequest.FLAG_NO_WAIT_STORE
        self._loop = asyncio.get_running_loop()
        self._drain_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._parked: dict[str, list[Batch]] = {}
        self._connects: dict[str, asyncio.Task[None]] = {}
        self._in_flight = 0
        self.answer_poll = AnswerPoll(answer_poll_us)
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._flushing = False
        self.batches_sent = 0
        self.records_sent = 0
        self._headers: dict[tuple[str, int, int, int], bytes] = {}
        """Encoded SendRequest headers: a producer repeats a few (topic, queue, flags,
        count) combinations over and over."""

    # --- what the producer calls ------------------------------------------------------

    def append(
        self, topic: str, queue: QueueRoute, record: Buffer, *, one_way: bool = False
    ) -> asyncio.Future[SendResult] | None:
        """Add a record to its queue's batch; return the future of its own result (None
        for a one-way record)."""
        if self._closed:
            raise ProducerClosed("the producer is closed")
        waiter = None if one_way else self._loop.create_future()
        self.accumulator.append(
            topic, queue, record, self._loop.time(), one_way=one_way, waiter=waiter
        )
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)
        return waiter

    def submit(self, batch: Batch) -> asyncio.Future[BatchOutcome]:
        """Queue a batch built by the caller (``send_batch``, a retry) to go as it is; the
        future resolves with every record's result, in order, or fails as a whole."""
        if self._closed:
            raise ProducerClosed("the producer is closed")
        future: asyncio.Future[BatchOutcome] = self._loop.create_future()
        batch.future = future
        self.accumulator.add_batch(batch)
        self._schedule()
        return future

    async def flush(self) -> None:
        """Send everything now, linger or not, and wait until every batch is answered."""
        self._flushing = True
        try:
            while True:
                self._drain()
                if self._is_idle():
                    return
                self._idle.clear()
                await self._idle.wait()
        finally:
            self._flushing = False

    async def close(self, timeout_s: float) -> None:
        """Flush (at most ``timeout_s``), then fail what is left and close the connections."""
        if not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self.flush()
            self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gone = ProducerClosed("the producer closed before the message was sent")
        self._fail(self.accumulator.drain_all(), gone)
        for parked in self._parked.values():
            self._fail(parked, gone)
        self._parked.clear()
        connects = list(self._connects.values())
        for task in connects:
            task.cancel()
        for task in connects:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pool.close()

    # --- the drain --------------------------------------------------------------------

    def _is_idle(self) -> bool:
        return (
            not self._in_flight
            and not self.accumulator.pending_records
            and not self._parked
            and not self._connects
        )

    def _schedule(self) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        try:
            self._drain_once()
        except Exception as exc:
            # Nothing may hang: every batch not yet answered gets the error.
            log.exception("producer sender failed; failing the pending sends")
            self._fail(self.accumulator.drain_all(), exc)
        if self._flushing and self._is_idle():
            self._idle.set()

    def _drain_once(self) -> None:
        now = self._loop.time()
        written: set[BrokerConnection] = set()
        for batch in self.accumulator.ready(now, flush=self._flushing or self._closed):
            address = batch.queue.address
            connection = self.pool.peek(address)
            if connection is None:
                self._park(batch)
                continue
            self._write(batch, connection)
            written.add(connection)
        for connection in written:
            connection.flush()
        deadline = self.accumulator.next_deadline()
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._drain()

    def _header(self, batch: Batch) -> bytes:
        flags = self.flags | SendRequest.FLAG_RETRY if batch.retry else self.flags
        key = (batch.topic, batch.queue.queue_id, flags, batch.count)
        header = self._headers.get(key)
        if header is None:
            if len(self._headers) >= _HEADER_CACHE:
                self._headers.clear()
            header = self._headers[key] = SendRequest(
                topic=batch.topic,
                queue_id=batch.queue.queue_id,
                producer_group=self.producer_group,
                flags=flags,
                record_count=batch.count,
            ).SerializeToString()
        return header

    def _write(self, batch: Batch, connection: BrokerConnection) -> None:
        header = self._header(batch)
        self.batches_sent += 1
        self.records_sent += batch.count
        if batch.one_way:
            try:
                connection.send_oneway(FrameType.SEND, header, batch.records)
            except MetaqError as exc:
                log.info("one-way send to %s dropped: %s", batch.queue, exc)
            except Exception:
                log.exception(
                    "one-way send to %s dropped: its frame could not be written", batch.queue
                )
            return
        batch.sent_s = self._loop.time()
        try:
            connection.request_callback(
                FrameType.SEND,
                header,
                batch.records,
                functools.partial(self._answered, batch),
                timeout_s=self.timeout_s,
                flush=False,  # every caller of _write flushes the connection after it
            )
        except MetaqError as exc:  # a frame over the limit: nothing was written
            self.accumulator.done(batch)
            self._settle_failure(batch, exc)
            return
        except Exception as exc:
            # A frame that cannot be encoded or signed is a bug, but its sender must
            # hear of it: raised from here it would end the drain or the connect task
            # and leave this batch's waiters hanging forever.
            log.exception("a send to %s could not be written", batch.queue)
            self.accumulator.done(batch)
            self._settle_failure(batch, exc)
            return
        self._in_flight += 1
        if self._in_flight == 1:
            self.answer_poll.waiting()

    # --- connections ------------------------------------------------------------------

    def _park(self, batch: Batch) -> None:
        address = batch.queue.address
        self._parked.setdefault(address, []).append(batch)
        if address not in self._connects:
            self._connects[address] = self._loop.create_task(
                self._connect(address), name=f"metaq-connect-{address}"
            )

    async def _connect(self, address: str) -> None:
        try:
            connection = await self.pool.get(address)
        except MetaqError as exc:
            del self._connects[address]
            batches = self._parked.pop(address, [])
            for batch in batches:
                self.accumulator.done(batch)
                self._settle_failure(batch, exc)
        else:
            del self._connects[address]
            for batch in self._parked.pop(address, []):
                self._write(batch, connection)
            connection.flush()
        self._schedule()
        if self._is_idle():
            self._idle.set()

    # --- answers ----------------------------------------------------------------------

    def _answered(self, batch: Batch, frame: Frame | None, exc: BaseException | None) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self.answer_poll.answered()
        self.accumulator.done(batch)
        if not self._drain_scheduled and self.accumulator.pending_records:
            # Records held back while this batch was in flight may go now.
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)
        if frame is not None:
            self._settle(batch, frame)
        else:
            self._settle_failure(batch, exc or ConnectionLost(batch.queue.address, "no answer"))
        if self._flushing and self._is_idle():
            self._idle.set()

    def _settle(self, batch: Batch, frame: Frame) -> None:
        broker = batch.queue.broker_name
        self.health.answered(broker, self._loop.time() - batch.sent_s)
        response = SendResponse.FromString(frame.header)
        status = STATUS_OF.get(response.status, SendStatus.OK)
        topic, queue_id = batch.topic, batch.queue.queue_id
        stamp = response.store_timestamp_ms
        # tuple.__new__ builds the named tuples without their Python-level __new__: this
        # runs once per message sent.
        new = tuple.__new__
        if batch.count == 1 and len(response.queue_offsets) == 1:
            # A lone send, the one-at-a-time case: its result without a batch's lists.
            q_off = response.queue_offsets[0]
            cl_off = response.commitlog_offsets[0]
            if q_off == UNPLACED:  # a re-sent sequence stored before, place forgotten
                q_off = -1
                cl_off = -1 if cl_off == UNPLACED else cl_off
            if batch.first_id >= 0:
                msg_id = f"{msg_id_prefix_hex()}{batch.first_id:016x}"
            else:
                msg_id = response.msg_ids[0].hex()
            fields = (status, msg_id, topic, broker, queue_id, q_off, cl_off, stamp)
            result = new(SendResult, fields)
            for waiter in batch.waiters:
                if waiter is not None and not waiter.done():
                    waiter.set_result(result)
            future = batch.future
            if future is not None and not future.done():
                future.set_result([result])
            return
        queue_offsets = list(response.queue_offsets)
        if len(queue_offsets) != batch.count:
            error = BrokerError(
                ErrorCode.INTERNAL,
                f"the broker answered {len(queue_offsets)} results for {batch.count} records",
                retriable=False,
                broker=batch.queue.address,
            )
            self._settle_failure(batch, error)
            return
        if batch.first_id >= 0:
            # Consecutive ids of our own making: no need to read 16-byte ids back.
            prefix = msg_id_prefix_hex()
            msg_ids = [
                f"{prefix}{n:016x}" for n in range(batch.first_id, batch.first_id + batch.count)
            ]
        else:
            msg_ids = [raw.hex() for raw in response.msg_ids]
        commitlog_offsets = list(response.commitlog_offsets)
        if UNPLACED in queue_offsets:  # re-sent sequences stored before, place forgotten
            queue_offsets = [-1 if q == UNPLACED else q for q in queue_offsets]
            commitlog_offsets = [-1 if c == UNPLACED else c for c in commitlog_offsets]
        results = [
            new(SendResult, (status, msg_id, topic, broker, queue_id, q_off, cl_off, stamp))
            for msg_id, q_off, cl_off in zip(
                msg_ids, queue_offsets, commitlog_offsets, strict=False
            )
        ]
        for waiter, result in zip(batch.waiters, results, strict=False):
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        future = batch.future
        if future is not None and not future.done():
            future.set_result(results)

    def _settle_failure(self, batch: Batch, exc: BaseException) -> None:
        if isinstance(exc, MetaqError) and exc.retriable:
            self.health.failed(batch.queue.broker_name, batch.queue.address)
        if (
            isinstance(exc, BrokerError)
            and exc.code is ErrorCode.INVALID_MESSAGE
            and batch.coalesced
            and batch.count > 1
        ):
            self._split(batch)
            return
        self._fail((batch,), exc)

    def _split(self, batch: Batch) -> None:
        """Resend a refused coalesced batch record by record, each with its own waiter."""
        now = self._loop.time()
        for record, waiter in zip(batch.records, batch.waiters, strict=True):
            single = Batch.whole(batch.topic, batch.queue, [record], 1, now)
            single.waiters.append(waiter)
            self.accumulator.add_batch(single)
        self._schedule()

    def _fail(self, batches: Iterable[Batch], exc: BaseException) -> None:
        for batch in batches:
            for waiter in batch.waiters:
                if waiter is not None and not waiter.done():
                    waiter.set_exception(exc)
            future = batch.future
            if future is not None and not future.done():
                future.set_exception(exc)
