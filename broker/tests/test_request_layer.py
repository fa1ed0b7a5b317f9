"""The broker's request layer in-process: SendHandler and PullHandler over a real store in
a temp dir, with a GroupRole carrying out role changes, and the frames they answer with
decoded as a client would. No processes, sockets or nameservers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message

from metaq.broker.config import BrokerConfig
from metaq.broker.metrics import BrokerMetrics
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.pull import PullHandler
from metaq.broker.replica_auth import ReplicaGate
from metaq.broker.replica_log import StoreLog
from metaq.broker.role import GroupRole
from metaq.broker.send import SendHandler
from metaq.broker.store import FlushMode, MessageStore, StoreConfig
from metaq.broker.store.flush import AsyncDurability
from metaq.broker.topics import TopicConfig, TopicTable
from metaq.broker.transactions import Transactions
from metaq.broker.zero_copy import FileRange
from metaq.common.errors import InvalidMessage, NotMaster, StoreUnavailable
from metaq.common.framing import Frame, FrameDecoder, FrameType, encode_frame
from metaq.common.model import Role
from metaq.common.record import encode, iter_records
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1.data_pb2 import PullRequest, PullResponse, SendRequest, SendResponse
from metaq.replication.channel import DataPlaneChannel
from metaq.replication.epochs import EpochHistory
from metaq.testing.waiting import run_async

TOPIC = "orders"
WAIT_S = 10.0
"""Deadline for an answer the loop gives in a turn or two; generous for a loaded host."""

# Small segments: a test's store stays a few MiB of sparse files.
SMALL_STORE: dict[str, Any] = {
    "commitlog_segment_bytes": 1 << 20,
    "max_message_bytes": 64 * 1024,
    "consume_queue_segment_entries": 256,
    "index_slots": 64,
    "index_entries": 1024,
}


class Client:
    """One connection's end: the answers the handlers give, decoded as frames."""

    def __init__(self, connection_id: int = 1) -> None:
        self.connection_id = connection_id
        self.peer = "127.0.0.1:50000"
        self.closed = False
        self._decoder = FrameDecoder()
        self._answers: asyncio.Queue[Frame] = asyncio.Queue()

    def respond(self, parts: Sequence[object]) -> None:
        data = bytearray()
        for part in parts:
            assert not isinstance(part, FileRange), "the test's records are all warm"
            assert isinstance(part, bytes | bytearray | memoryview)
            data += part
        for frame in self._decoder.feed(bytes(data)):
            self._answers.put_nowait(frame)

    async def answer(self) -> Frame:
        async with asyncio.timeout(WAIT_S):
            return await self._answers.get()

    @property
    def unanswered(self) -> bool:
        return self._answers.empty()


_ids = iter(range(1, 1 << 30))


def request(frame_type: FrameType, header: Message, payload: bytes = b"", flags: int = 0) -> Frame:
    """``header`` and ``payload`` as one request frame, cut as the connection cuts it."""
    data = b"".join(
        bytes(p) for p in encode_frame(frame_type, next(_ids), header.SerializeToString(),
                                       payload, flags)
    )  # fmt: skip
    (frame,) = FrameDecoder().feed(data)
    return frame


def send_frame(*bodies: bytes, queue_id: int = 0, flags: int = 0, topic: str = TOPIC) -> Frame:
    records = [encode(topic, body, queue_id=queue_id) for body in bodies]
    return send_records(records, queue_id=queue_id, flags=flags, topic=topic)


def send_records(
    records: Sequence[bytes | bytearray], *, queue_id: int = 0, flags: int = 0, topic: str = TOPIC
) -> Frame:
    header = SendRequest(
        topic=topic, queue_id=queue_id, record_count=len(records), flags=flags,
        producer_group="producers",
    )  # fmt: skip
    return request(FrameType.SEND, header, b"".join(records))


def pull_frame(offset: int, *, long_poll_ms: int = 0, **fields: Any) -> Frame:
    header = PullRequest(
        topic=TOPIC, queue_id=0, offset=offset, max_messages=32, long_poll_timeout_ms=long_poll_ms,
        **fields,
    )  # fmt: skip
    return request(FrameType.PULL, header)


def sent(frame: Frame) -> SendResponse:
    assert frame.type is FrameType.SEND and frame.is_response and not frame.is_error
    return SendResponse.FromString(frame.header)


def pulled(frame: Frame) -> tuple[PullResponse, list[bytes]]:
    assert frame.type is FrameType.PULL and frame.is_response and not frame.is_error
    return PullResponse.FromString(frame.header), [r.body for r in iter_records(frame.payload)]


async def refuse_to_dial(address: str) -> DataPlaneChannel:
    raise ConnectionRefusedError(f"no master to dial in this test ({address})")


@dataclasses.dataclass
class Layer:
    """The request layer of one broker, as Broker.start wires it, minus the network."""

    config: BrokerConfig
    store: MessageStore
    role: GroupRole
    offsets: ConsumerOffsets
    send: SendHandler
    pull: PullHandler

    async def send_ok(self, *bodies: bytes) -> SendResponse:
        client = Client()
        self.send.handle(client, send_frame(*bodies))
        return sent(await client.answer())

    def control(self, epoch: int, master_id: int, address: str = "") -> None:
        """The controller's word, as a nameserver's pushed news brings it."""
        news = pb.RegisterBrokerResponse(
            control=pb.GroupControl(epoch=epoch, master_id=master_id, master_data_address=address)
        )
        self.role.on_answer(news, None)


@asynccontextmanager
async def layer(data_dir: Path, **settings: Any) -> AsyncIterator[Layer]:
    settings = {"failover": False, **settings}
    config = BrokerConfig(
        data_dir=data_dir, store=StoreConfig(data_dir=data_dir, **SMALL_STORE), **settings
    )
    store = MessageStore(config.store)
    store.start()
    durability = AsyncDurability(asyncio.get_running_loop(), store.flusher)
    topics = TopicTable(data_dir)
    topics.put(TopicConfig(TOPIC, 4, 4))
    offsets = ConsumerOffsets(data_dir)
    metrics = BrokerMetrics()
    history = EpochHistory(data_dir / "epochs.json")
    role = GroupRole(
        config,
        store,
        StoreLog(store, durability),
        history,
        gate=ReplicaGate(None, config.broker_name, "127.0.0.1:10911"),
        connect=refuse_to_dial,
    )
    transactions = Transactions(
        store, lambda: role.takes_writes, check_after_ms=60_000, check_interval_ms=60_000,
        max_checks=1,
    )  # fmt: skip
    send = SendHandler(config, store, topics, metrics, durability, role, transactions)
    pull = PullHandler(config, store, topics, offsets, metrics, role)
    store.dispatcher.listeners.append(pull.long_polls.on_dispatch)
    await role.start()
    try:
        yield Layer(config, store, role, offsets, send, pull)
    finally:
        await role.stop()
        pull.long_polls.release_all()
        durability.close()
        store.close()


def run(tmp_path: Path, scenario: Callable[[Layer], Any], **settings: Any) -> None:
    async def main() -> None:
        async with layer(tmp_path, **settings) as broker:
            await scenario(broker)

    run_async(main())


# --- SEND -------------------------------------------------------------------------------


def test_a_send_to_the_master_is_stored_and_answered_with_where_each_record_went(
    tmp_path: Path,
) -> None:
    async def scenario(broker: Layer) -> None:
        first = await broker.send_ok(b"a", b"b")
        second = await broker.send_ok(b"c")
        assert first.status == SendResponse.OK
        assert list(first.queue_offsets) == [0, 1]
        assert list(second.queue_offsets) == [2]
        assert first.commitlog_offsets[0] == 0
        assert second.commitlog_offsets[0] > first.commitlog_offsets[1]
        assert len(first.msg_ids) == 2 and all(len(i) == 16 for i in first.msg_ids)
        broker.store.dispatcher.catch_up()
        assert broker.store.max_offset(TOPIC, 0) == 3

    run(tmp_path, scenario)


def test_each_answer_carries_its_own_send_only_though_the_handler_refills_one_message(
    tmp_path: Path,
) -> None:
    async def scenario(broker: Layer) -> None:
        client = Client()
        broker.send.handle(client, send_frame(b"a", b"b", b"c"))
        await client.answer()
        broker.send.handle(client, send_frame(b"d"))
        lone = await client.answer()
        answer = sent(lone)
        assert len(answer.queue_offsets) == len(answer.commitlog_offsets) == 1
        assert len(answer.msg_ids) == 1
        # Byte for byte what a message built for this answer alone encodes to.
        fresh = SendResponse(
            status=answer.status,
            queue_offsets=[3],
            commitlog_offsets=list(answer.commitlog_offsets),
            msg_ids=list(answer.msg_ids),
            store_timestamp_ms=answer.store_timestamp_ms,
        )
        assert lone.header == fresh.SerializeToString()

    run(tmp_path, scenario)


def test_under_sync_flush_a_send_is_answered_once_its_bytes_are_on_disk(tmp_path: Path) -> None:
    async def scenario(broker: Layer) -> None:
        answer = await broker.send_ok(b"durable")
        assert answer.status == SendResponse.OK
        end = answer.commitlog_offsets[0] + len(encode(TOPIC, b"durable"))
        assert broker.store.flusher.durable >= end

    run(tmp_path, scenario, flush_mode=FlushMode.SYNC)


def test_a_batch_with_a_record_for_another_topic_is_refused_and_stores_nothing(
    tmp_path: Path,
) -> None:
    async def scenario(broker: Layer) -> None:
        records = [encode(TOPIC, b"ok"), encode("payments", b"stray")]
        with pytest.raises(InvalidMessage, match="names another topic"):
            broker.send.handle(Client(), send_records(records))
        assert broker.store.commitlog.write_offset == 0

    run(tmp_path, scenario)


def test_a_retried_send_stores_only_the_records_not_stored_the_first_time(
    tmp_path: Path,
) -> None:
    async def scenario(broker: Layer) -> None:
        stored = encode(TOPIC, b"first")
        client = Client()
        broker.send.handle(client, send_records([stored]))
        first = sent(await client.answer())
        fresh = encode(TOPIC, b"second")
        broker.send.handle(client, send_records([stored, fresh], flags=SendRequest.FLAG_RETRY))
        retried = sent(await client.answer())
        assert retried.queue_offsets[0] == first.queue_offsets[0]
        assert retried.commitlog_offsets[0] == first.commitlog_offsets[0]
        assert retried.queue_offsets[1] == 1
        broker.store.dispatcher.catch_up()
        assert broker.store.max_offset(TOPIC, 0) == 2  # one copy of "first"

    run(tmp_path, scenario)


def test_a_slave_refuses_sends_naming_its_master_and_stores_nothing(tmp_path: Path) -> None:
    async def scenario(broker: Layer) -> None:
        assert broker.role.role is Role.SLAVE
        with pytest.raises(NotMaster, match="not the master of its group"):
            broker.send.handle(Client(), send_frame(b"x"))
        assert broker.store.commitlog.write_offset == 0

    run(tmp_path, scenario, broker_id=1)


def test_a_draining_broker_refuses_sends(tmp_path: Path) -> None:
    async def scenario(broker: Layer) -> None:
        broker.send.draining = True
        with pytest.raises(StoreUnavailable, match="shutting down"):
            broker.send.handle(Client(), send_frame(b"x"))

    run(tmp_path, scenario)


# --- PULL -------------------------------------------------------------------------------


def test_a_pull_reads_back_what_was_sent_in_order_and_says_where_to_go_on(
    tmp_path: Path,
) -> None:
    async def scenario(broker: Layer) -> None:
        await broker.send_ok(b"a", b"b", b"c")
        broker.store.dispatcher.catch_up()
        client = Client()
        broker.pull.handle(client, pull_frame(1))
        response, bodies = pulled(await client.answer())
        assert response.status == PullResponse.FOUND
        assert bodies == [b"b", b"c"]
        assert (response.next_offset, response.max_offset) == (3, 3)

    run(tmp_path, scenario)


def test_a_pull_of_an_empty_queue_without_long_poll_is_answered_at_once(tmp_path: Path) -> None:
    async def scenario(broker: Layer) -> None:
        client = Client()
        broker.pull.handle(client, pull_frame(0))
        response, bodies = pulled(await client.answer())
        assert bodies == []
        assert response.status == PullResponse.NO_MESSAGE_IN_QUEUE

    run(tmp_path, scenario)


def test_a_long_poll_at_the_queue_end_is_answered_when_a_send_arrives(tmp_path: Path) -> None:
    async def scenario(broker: Layer) -> None:
        consumer = Client(connection_id=2)
        broker.pull.handle(consumer, pull_frame(0, long_poll_ms=30_000))
        assert consumer.unanswered and broker.pull.long_polls.parked == 1
        await broker.send_ok(b"news")
        response, bodies = pulled(await consumer.answer())
        assert response.status == PullResponse.FOUND
        assert bodies == [b"news"]

    run(tmp_path, scenario)


def test_a_commit_carried_on_a_pull_is_stored_on_the_master(tmp_path: Path) -> None:
    async def scenario(broker: Layer) -> None:
        await broker.send_ok(b"a", b"b")
        broker.store.dispatcher.catch_up()
        client = Client()
        broker.pull.handle(client, pull_frame(2, consumer_group="g", commit_offset=2))
        pulled(await client.answer())
        assert broker.offsets.get("g", TOPIC, 0) == 2

    run(tmp_path, scenario)


# --- what a controlled broker's consumers may read, through a role change -------------------


def test_a_controlled_slave_serves_only_what_its_master_confirmed_and_wakes_parked_pulls(
    tmp_path: Path,
) -> None:
    async def scenario(broker: Layer) -> None:
        store = broker.store
        # Records copied from the master: in the log, only the first confirmed yet.
        first = store.append([encode(TOPIC, b"confirmed")])
        store.append([encode(TOPIC, b"not yet")])
        store.dispatcher.catch_up()
        broker.role.follower.learn_confirmed(first.end)
        client = Client()
        broker.pull.handle(client, pull_frame(0, long_poll_ms=30_000))
        _, bodies = pulled(await client.answer())
        assert bodies == [b"confirmed"]
        broker.pull.handle(client, pull_frame(1, long_poll_ms=30_000))
        assert client.unanswered  # parked until the master confirms more
        broker.role.follower.learn_confirmed(store.commitlog.write_offset)
        response, bodies = pulled(await client.answer())
        assert bodies == [b"not yet"]
        assert response.next_offset == 2

    run(tmp_path, scenario, broker_id=1, failover=True)


def test_an_elected_broker_takes_sends_and_once_demoted_serves_no_more_than_it_confirmed(
    tmp_path: Path,
) -> None:
    async def scenario(broker: Layer) -> None:
        role, store = broker.role, broker.store
        broker.control(1, broker.config.broker_id)
        await _until(lambda: role.takes_writes, "the elected broker takes writes")
        assert (role.role, role.epoch) == (Role.MASTER, 1)
        assert [(e.epoch, e.start_offset) for e in role.history.entries] == [(1, 0)]
        await broker.send_ok(b"acknowledged")
        confirmed = store.commitlog.write_offset

        broker.control(2, 2)  # another master elected; its address not known yet
        await _until(lambda: role.role is Role.SLAVE, "the old master steps down")
        assert not role.takes_writes and role.holds_commits
        with pytest.raises(NotMaster):
            broker.send.handle(Client(), send_frame(b"refused"))
        # A tail the new master may never hold: copied here, never confirmed to us.
        store.append([encode(TOPIC, b"unconfirmed tail")])
        store.dispatcher.catch_up()
        assert role.readable_end() == confirmed
        client = Client()
        broker.pull.handle(client, pull_frame(0))
        _, bodies = pulled(await client.answer())
        assert bodies == [b"acknowledged"]

    run(tmp_path, scenario, failover=True)


async def _until(predicate: Callable[[], bool], what: str) -> None:
    """Wait on the loop until ``predicate`` holds (the role applies changes in a task)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT_S} s waiting until {what}")
        await asyncio.sleep(0.005)
