"""BrokerConnection against an in-process fake broker: multiplexing, errors, timeouts."""

from __future__ import annotations

import asyncio
import logging

import pytest

from metaq.client.connection import BrokerConnection, ConnectionPool
from metaq.client.errors import BrokerError, ConnectionLost, RequestTimeout
from metaq.common import record
from metaq.common.errors import ErrorCode
from metaq.common.framing import FrameType
from metaq.common.v1.data_pb2 import SendRequest, SendResponse
from metaq.testing.client_fakes import Drop, Fail, FakeBroker, SendSeen, Silence
from metaq.testing.waiting import run_async, wait_until_async


def _send_header(queue_id: int = 0) -> bytes:
    return SendRequest(topic="t", queue_id=queue_id, record_count=1).SerializeToString()


def _record(body: bytes) -> bytes:
    return bytes(record.encode("t", body))


def test_pipelined_requests_are_each_answered_with_their_own_response() -> None:
    async def scenario() -> None:
        broker = await FakeBroker("b").start()
        connection = await BrokerConnection.open(broker.address)
        try:
            frames = await asyncio.gather(
                *(
                    connection.request(
                        FrameType.SEND, _send_header(q), [_record(b"%d" % q)], timeout_s=5
                    )
                    for q in range(20)
                )
            )
            offsets = [SendResponse.FromString(f.header).queue_offsets[0] for f in frames]
            assert offsets == [0] * 20  # each queue's first message
            assert [s.queue_id for s in broker.sends] == list(range(20))
            assert connection.in_flight == 0
        finally:
            await connection.close()
            await broker.stop()

    run_async(scenario())


def test_an_error_frame_raises_broker_error_with_the_brokers_fields() -> None:
    def script(_seen: SendSeen) -> Fail:
        return Fail(ErrorCode.NOT_MASTER, "I am a slave", retriable=True)

    async def scenario() -> None:
        broker = await FakeBroker("b", script).start()
        connection = await BrokerConnection.open(broker.address)
        try:
            with pytest.raises(BrokerError) as caught:
                await connection.request(
                    FrameType.SEND, _send_header(), [_record(b"x")], timeout_s=5
                )
            assert caught.value.code is ErrorCode.NOT_MASTER
            assert caught.value.retriable and caught.value.detail == "I am a slave"
            assert not connection.closed  # a request error leaves the connection usable
        finally:
            await connection.close()
            await broker.stop()

    run_async(scenario())


def test_an_unanswered_request_times_out() -> None:
    async def scenario() -> None:
        broker = await FakeBroker("b", lambda _seen: Silence()).start()
        connection = await BrokerConnection.open(broker.address)
        try:
            with pytest.raises(RequestTimeout) as caught:
                await connection.request(
                    FrameType.SEND, _send_header(), [_record(b"x")], timeout_s=0.05
                )
            assert isinstance(caught.value, TimeoutError) and caught.value.retriable
            assert connection.in_flight == 0
        finally:
            await connection.close()
            await broker.stop()

    run_async(scenario())


def test_answers_after_their_timeout_are_dropped_with_one_warning_not_one_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        broker = await FakeBroker("b", lambda _seen: Silence()).start()
        connection = await BrokerConnection.open(broker.address)
        try:
            for _ in range(3):
                with pytest.raises(RequestTimeout):
                    await connection.request(
                        FrameType.SEND, _send_header(), [_record(b"x")], timeout_s=0.05
                    )
            with caplog.at_level(logging.WARNING, logger="metaq.client.connection"):
                broker.answer_silenced()

                async def all_arrived() -> bool:
                    return connection.late_answers.total == 3

                await wait_until_async(all_arrived, 30, "the three late answers arrived")
            late = [r for r in caplog.records if "had timed out here" in r.getMessage()]
            assert len(late) == 1
            assert not connection.closed  # a late answer leaves the connection usable
        finally:
            await connection.close()
            await broker.stop()

    run_async(scenario())


def test_a_dropped_connection_fails_every_request_in_flight_as_retriable() -> None:
    async def scenario() -> None:
        broker = await FakeBroker("b", lambda _seen: Drop()).start()
        connection = await BrokerConnection.open(broker.address)
        try:
            outcomes = await asyncio.gather(
                *(
                    connection.request(FrameType.SEND, _send_header(), [_record(b"x")], timeout_s=5)
                    for _ in range(3)
                ),
                return_exceptions=True,
            )
            assert all(isinstance(o, ConnectionLost) and o.retriable for o in outcomes)
            assert connection.closed
        finally:
            await connection.close()
            await broker.stop()

    run_async(scenario())


def test_the_pool_reopens_a_closed_connection_and_reports_refused_connects() -> None:
    async def scenario() -> None:
        broker = await FakeBroker("b").start()
        pool = ConnectionPool(connect_timeout_s=2)
        try:
            first, same = await asyncio.gather(pool.get(broker.address), pool.get(broker.address))
            assert first is same
            await first.close()
            second = await pool.get(broker.address)
            assert second is not first and not second.closed

            address = broker.address
            await broker.stop()
            await second.close()
            with pytest.raises(ConnectionLost, match="cannot connect"):
                await pool.get(address)
        finally:
            await pool.close()
            await broker.stop()

    run_async(scenario())
