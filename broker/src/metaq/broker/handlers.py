"""The small request handlers (heartbeat, offsets, consumer membership) and the table
that maps every frame type to its handler."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, NamedTuple

from metaq.broker.connection import Handler, Responder
from metaq.broker.consumers import Changes, ConsumerGroups
from metaq.broker.held_offsets import takes_forwarded
from metaq.broker.journal import Journal
from metaq.broker.member_notices import MemberChangeNotices
from metaq.broker.offset_forward import OffsetForwarder
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.producers import ProducerConnections
from metaq.broker.pull import PullHandler
from metaq.broker.role import GroupRole
from metaq.broker.send import SendHandler
from metaq.broker.store import MessageStore
from metaq.broker.topics import TopicTable, UnknownTopic
from metaq.broker.transactions import Transactions
from metaq.common.errors import ErrorCode, InvalidMessage, MetaqError, NotMaster
from metaq.common.framing import FLAG_RESPONSE, Frame, FrameType, encode_error, encode_frame
from metaq.common.model import ConsumeMode
from metaq.common.names import check_group
from metaq.common.record import check_topic
from metaq.common.service import spawn
from metaq.common.v1.data_pb2 import (
    ClientHello,
    CommitOffsetRequest,
    CommitOffsetResponse,
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    ConsumerMember,
    EndTransactionRequest,
    EndTransactionResponse,
    HeldQueue,
    LockQueuesRequest,
    LockQueuesResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    QueueOffset,
    QueueRef,
)

log = logging.getLogger(__name__)

_EMPTY_COMMIT_RESPONSE = CommitOffsetResponse().SerializeToString()


class _Unanswered(NamedTuple):
    """A commit stored and waiting for its journal write to be answered."""

    responder: Responder
    type: FrameType
    request_id: int
    one_way: bool
    response: bytes


class Handlers:
    """Routes frames to handlers; the connection turns their errors into ERROR frames."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicTable,
        offsets: ConsumerOffsets,
        groups: ConsumerGroups,
        send: SendHandler,
        pull: PullHandler,
        role: GroupRole,
        journal: Journal,
        transactions: Transactions,
        forwarder: OffsetForwarder,
        notices: MemberChangeNotices | None = None,
        producers: ProducerConnections | None = None,
    ) -> None:
        self._store = store
        self._topics = topics
        self._offsets = offsets
        self._groups = groups
        self.send = send
        self.pull = pull
        self.role = role
        self._journal = journal
        self._transactions = transactions
        self.forwarder = forwarder
        self._notices = notices
        self._producers = producers
        self._tasks: set[asyncio.Task[None]] = set()
        self._unjournaled: list[_Unanswered] = []

    def table(self) -> dict[FrameType, Handler]:
        """A handler for every frame type a client may send (CONNECTION is never a request)."""
        table: dict[FrameType, Handler] = {
            FrameType.HEARTBEAT: self.heartbeat,
            FrameType.SEND: self.send.handle,
            FrameType.PULL: self.pull.handle,
            FrameType.COMMIT_OFFSET: self.commit_offset,
            FrameType.QUERY_OFFSET: self.query_offset,
            FrameType.CONSUMER_HEARTBEAT: self.consumer_heartbeat,
            FrameType.REPLICA_FETCH: self.role.handle_fetch,
            FrameType.REPLICA_AUTH: self.role.gate.handle,
            FrameType.LOCK_QUEUES: self.lock_queues,
            FrameType.END_TRANSACTION: self.end_transaction,
        }
        # CONNECTION is never a request; CHECK_TRANSACTION and CONSUMER_IDS_CHANGED go
        # from brokers to clients; AUTH is the user gate's (user_auth), which the broker
        # adds itself.
        missing = set(FrameType) - set(table)
        missing -= {FrameType.CONNECTION, FrameType.AUTH}
        missing -= {FrameType.CHECK_TRANSACTION, FrameType.CONSUMER_IDS_CHANGED}
        if missing:
            raise RuntimeError(f"frame types without a handler: {sorted(missing)}")
        return table

    def heartbeat(self, responder: Responder, frame: Frame) -> None:
        if frame.header and self._producers is not None:
            hello = ClientHello.FromString(frame.header)
            if hello.client_id:
                self._producers.hello(
                    responder.connection_id,
                    client_id=hello.client_id,
                    group=hello.producer_group,
                    host=_host(responder),
                    computer_room=hello.computer_room,
                    client_version=hello.client_version,
                    language=hello.language,
                )
        if not frame.is_one_way:
            responder.respond(encode_frame(frame.type, frame.request_id, flags=FLAG_RESPONSE))

    def commit_offset(self, responder: Responder, frame: Frame) -> None:
        """Store a group's offsets, all or none: every entry is checked first.

        A master journals them; a slave holds them on its disk and forwards them to its
        master (see metaq.broker.held_offsets), answering once they are on its disk.
        An entry from a position the group's offsets were reset past (its
        ``reset_generation``) is left out: it would undo the reset."""
        request = CommitOffsetRequest.FromString(frame.header)
        check_group(request.consumer_group)
        if request.forwarded:
            self._commit_forwarded(responder, frame, request)
            return
        for entry in request.offsets:
            self._check_commit(entry)
        held = self.role.holds_commits
        group, offsets = request.consumer_group, self._offsets
        for entry in request.offsets:
            if entry.HasField("reset_generation") and offsets.stale(
                group, entry.topic, entry.reset_generation
            ):
                continue
            offsets.commit(group, entry.topic, entry.queue_id, entry.offset, held=held)
        if held:
            self.forwarder.wakeup()
            spawn(
                self._tasks,
                self._answer_when(
                    responder, frame, _EMPTY_COMMIT_RESPONSE, self._offsets.held.persist()
                ),
            )
            return
        self._answer_journaled(responder, frame, _EMPTY_COMMIT_RESPONSE)

    def _commit_forwarded(
        self, responder: Responder, frame: Frame, request: CommitOffsetRequest
    ) -> None:
        """Commits a slave held: taken where the master's offset is still the one the
        slave knew, or where they move it forward; the answer has the resulting offsets.

        Only from a slave that proved the cluster secret on this connection. All or none:
        every entry is decided before any is stored, and none is refused for the group
        limit, as the slave answered its consumer OK long ago."""
        self.role.gate.check_forwarded(responder.connection_id)
        if not self.role.takes_writes:
            raise NotMaster(
                f"broker {self.role.config.broker_name} (id {self.role.config.broker_id}) "
                "takes no forwarded offset commits: it is not the master now",
                self.role.master_address,
            )
        group = request.consumer_group
        taken: list[QueueOffset] = []
        for entry in request.offsets:
            try:
                self._check_commit(entry)
            except MetaqError as exc:
                # Not storable here (a topic gone, a queue cut by an async failover): the
                # slave drops it, as the master never had it.
                log.warning("a forwarded commit of group %r is dropped: %s", group, exc)
                continue
            current = self._offsets.get(group, entry.topic, entry.queue_id)
            expected = entry.expected_offset if entry.HasField("expected_offset") else None
            if takes_forwarded(current, expected, entry.offset):
                taken.append(entry)
        for entry in taken:
            self._offsets.commit(group, entry.topic, entry.queue_id, entry.offset, forwarded=True)
        response = CommitOffsetResponse()
        for entry in request.offsets:
            now = self._offsets.get(group, entry.topic, entry.queue_id)
            if now is not None:
                response.offsets.add(topic=entry.topic, queue_id=entry.queue_id, offset=now)
        self._answer_journaled(responder, frame, response.SerializeToString())

    def _answer_journaled(self, responder: Responder, frame: Frame, response: bytes) -> None:
        # The commits that arrive in one turn of the loop share one journal write, made
        # at the next turn: a record per commit cost the master more than the commit
        # itself, and capped it near 10,000 commits a second (docs/benchmarks.md).
        self._unjournaled.append(
            _Unanswered(responder, frame.type, frame.request_id, frame.is_one_way, response)
        )
        if len(self._unjournaled) == 1:
            asyncio.get_running_loop().call_soon(self._journal_and_answer)

    def _journal_and_answer(self) -> None:
        waiting, self._unjournaled = self._unjournaled, []
        try:
            journaled = self._journal.write_offsets()
        except MetaqError as exc:
            # Stored in memory but not journaled (disk full, say): the next tick journals
            # them; the consumers are told, as an error of the commit itself would.
            for commit in waiting:
                if not commit.one_way:
                    commit.responder.respond(
                        encode_error(
                            exc.code,
                            str(exc),
                            request_id=commit.request_id,
                            frame_type=commit.type,
                            retriable=exc.retriable,
                        )
                    )
            return
        answers = [commit for commit in waiting if not commit.one_way]
        if journaled is None or not self.role.sync:
            for commit in answers:
                commit.responder.respond(
                    encode_frame(
                        commit.type, commit.request_id, commit.response, flags=FLAG_RESPONSE
                    )
                )
            return
        # Under sync replication a commit is answered once a promoted slave would have it.
        if answers:
            spawn(self._tasks, self._answer_replicated(answers, journaled.end))

    async def _answer_replicated(self, answers: list[_Unanswered], end: int) -> None:
        await self.role.wait_replicated(end)
        for commit in answers:
            commit.responder.respond(
                encode_frame(commit.type, commit.request_id, commit.response, flags=FLAG_RESPONSE)
            )

    async def _answer_when(
        self,
        responder: Responder,
        frame: Frame,
        response: bytes,
        done: Coroutine[Any, Any, object],
    ) -> None:
        try:
            await done
        except OSError as exc:
            # A slave could not put the commit on its disk: it is still held in memory
            # and forwarded, but not answered OK.
            log.error("keeping offset commits on disk failed: %s", exc)
            if not frame.is_one_way:
                responder.respond(
                    encode_error(
                        ErrorCode.STORE_UNAVAILABLE,
                        f"the broker could not write the commit to its disk ({exc}); retry",
                        request_id=frame.request_id,
                        frame_type=frame.type,
                        retriable=True,
                    )
                )
            return
        if not frame.is_one_way:
            responder.respond(
                encode_frame(frame.type, frame.request_id, response, flags=FLAG_RESPONSE)
            )

    def end_transaction(self, responder: Responder, frame: Frame) -> None:
        request = EndTransactionRequest.FromString(frame.header)
        self.role.check_writable()
        self._transactions.producer_seen(request.producer_group, responder)
        action = self._transactions.end(request)
        if not frame.is_one_way:
            response = EndTransactionResponse(action=EndTransactionRequest.Action.ValueType(action))
            responder.respond(
                encode_frame(
                    frame.type, frame.request_id, response.SerializeToString(), flags=FLAG_RESPONSE
                )
            )

    def lock_queues(self, responder: Responder, frame: Frame) -> None:
        request = LockQueuesRequest.FromString(frame.header)
        check_group(request.consumer_group)
        if not request.client_id:
            raise InvalidMessage("a queue lock needs the consumer's client_id")
        if not request.unlock:
            self.role.check_writable()  # only the master hands out locks
        queues = [(q.topic, q.queue_id) for q in request.queues]
        for topic, _ in queues:
            self._known_topic(topic)
        locks = self.role.queue_locks
        response = LockQueuesResponse(lock_ttl_ms=round(locks.ttl_s * 1000))
        if request.unlock:
            locks.unlock(request.consumer_group, request.client_id, queues)
        else:
            granted = locks.lock(
                request.consumer_group, request.client_id, queues, held=request.held
            )
            response.locked.extend(QueueRef(topic=t, queue_id=q) for t, q in granted)
        if not frame.is_one_way:
            responder.respond(
                encode_frame(
                    frame.type, frame.request_id, response.SerializeToString(), flags=FLAG_RESPONSE
                )
            )

    def query_offset(self, responder: Responder, frame: Frame) -> None:
        request = QueryOffsetRequest.FromString(frame.header)
        self._known_topic(request.topic)
        store = self._store
        response = QueryOffsetResponse(
            min_offset=store.min_offset(request.topic, request.queue_id),
            max_offset=store.max_offset(request.topic, request.queue_id),
        )
        if request.consumer_group:
            group, offsets = request.consumer_group, self._offsets
            committed = offsets.get(group, request.topic, request.queue_id)
            if committed is not None:
                response.committed_offset = committed
            response.reset_generation = offsets.reset_generation(group, request.topic)
        if request.HasField("timestamp_ms"):
            response.timestamp_offset = store.offset_for_timestamp(
                request.topic, request.queue_id, request.timestamp_ms
            )
        responder.respond(
            encode_frame(
                frame.type, frame.request_id, response.SerializeToString(), flags=FLAG_RESPONSE
            )
        )

    def consumer_heartbeat(self, responder: Responder, frame: Frame) -> None:
        request = ConsumerHeartbeatRequest.FromString(frame.header)
        try:
            mode = ConsumeMode.from_proto(request.mode)
        except ValueError:
            raise InvalidMessage(f"unknown consume mode {request.mode}") from None
        if request.notify_member_changes and self._notices is not None and not request.leaving:
            self._notices.listen(responder)
        self._groups.heartbeat(
            request.consumer_group,
            request.client_id,
            computer_room=request.computer_room,
            mode=mode,
            subscriptions=[(s.topic, s.tag_expression) for s in request.subscriptions],
            connection_id=responder.connection_id,
            leaving=request.leaving,
            host=_host(responder),
            client_version=request.client_version,
            language=request.language,
            held=[(q.topic, q.broker_name, q.queue_id) for q in request.held]
            if request.report_holdings
            else (),
            holdings_version=request.holdings_version if request.report_holdings else 0,
        )
        if frame.is_one_way:
            return
        # Only what the member's copy of the list lacks: a large group's whole list, with
        # every member's report, is megabytes, and each member asks every few seconds.
        changes = self._groups.changes(
            request.consumer_group, request.known_epoch, request.known_seq
        )
        response = heartbeat_answer(
            changes, self._groups.timeout_s, with_holdings=request.report_holdings
        )
        responder.respond(
            encode_frame(
                frame.type, frame.request_id, response.SerializeToString(), flags=FLAG_RESPONSE
            )
        )

    def _check_commit(self, entry: QueueOffset) -> None:
        """A commit names an existing topic, one of its read queues, and an offset within
        the queue (its end at most: the stored offset is the next to consume)."""
        self._known_topic(entry.topic)
        config = self._topics.get(entry.topic)
        assert config is not None
        if entry.queue_id >= config.read_queues:
            raise InvalidMessage(
                f"queue id {entry.queue_id} is out of range: topic {entry.topic!r} has "
                f"{config.read_queues} read queues (0-{config.read_queues - 1})"
            )
        end = self._store.max_offset(entry.topic, entry.queue_id)
        if entry.offset > end:
            raise InvalidMessage(
                f"offset {entry.offset} is past the end of queue {entry.topic!r}/"
                f"{entry.queue_id} (max offset {end} on this broker): commit the next offset "
                "to consume, at most the queue's max offset; nothing was stored"
            )

    def _known_topic(self, topic: str) -> None:
        if self._topics.get(topic) is None:
            check_topic(topic)
            raise UnknownTopic(f"topic {topic!r} does not exist on this broker")


def heartbeat_answer(
    changes: Changes, member_timeout_s: float, *, with_holdings: bool
) -> ConsumerHeartbeatResponse:
    """The CONSUMER_HEARTBEAT answer listing ``changes``; each member's report of its
    queues only ``with_holdings`` (the consumers that assign by holdings ask for them)."""
    return ConsumerHeartbeatResponse(
        members=[
            ConsumerMember(
                client_id=m.client_id,
                computer_room=m.computer_room,
                holdings_version=m.holdings_version if with_holdings else 0,
                held=[HeldQueue(topic=t, broker_name=b, queue_id=q) for t, b, q in m.held]
                if with_holdings
                else (),
            )
            for m in changes.members
        ],
        member_timeout_ms=int(member_timeout_s * 1000),
        epoch=changes.epoch,
        seq=changes.seq,
        changes_only=not changes.whole,
        departed=changes.departed,
    )


def _host(responder: Responder) -> str:
    """The client's address as this broker sees it, without the port."""
    return responder.peer.rpartition(":")[0].strip("[]")
