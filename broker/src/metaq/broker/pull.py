"""The PULL handler: consume-queue reads answered with raw commitlog slices, or parked.

A pull that finds records answers with a PullResponse header and, as payload, the
records exactly as stored: memoryviews of the mapped commitlog handed to
``writelines``, so no body is decoded or copied in Python. A pull that finds nothing new
(the queue's end, or an empty queue) and asks for a long poll is parked in
:class:`LongPolls` until the dispatcher adds entries to that queue or its time is up;
once ``max_parked_pulls`` are parked, such a pull is answered at once instead.

A pull for records the broker no longer keeps in the page cache (a group catching up
on a backlog) is read in from disk on a reader thread before it is answered
(:mod:`metaq.broker.cold_reads`), so its page faults never stop the loop that serves
sends and the other pulls.

A pull whose ``reset_generation`` predates the group's last reset of the topic's offsets
(:meth:`ConsumerOffsets.reset`) stores no piggybacked commit and is answered
OFFSET_RESET with the group's new offset; a reset wakes the pulls parked on the topic's
queues, so a member waiting at a queue's end hears of it at once too.

A master serves records only up to what every slave that could be elected holds
(:meth:`GroupRole.readable_end`): a record past that may be cut by a failover and its
queue offset reused by another message, which a consumer that had read the first would
never see. Pulls held back by that are parked too, and read again when the slaves'
copies move on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Final

from metaq.broker import zero_copy
from metaq.broker.cold_reads import ColdReads, ReadBudget
from metaq.broker.config import BrokerConfig
from metaq.broker.connection import Responder
from metaq.broker.consumers import ConsumerGroups
from metaq.broker.long_poll import LongPolls, PendingPull, QueueKey
from metaq.broker.metrics import BrokerMetrics
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.role import GroupRole
from metaq.broker.store import GetResult, GetStatus, MessageStore
from metaq.broker.topics import TopicTable
from metaq.broker.zero_copy import FileRange, Part
from metaq.common.errors import InvalidMessage
from metaq.common.framing import FLAG_RESPONSE, Buffer, Frame, FrameType, encode_frame
from metaq.common.v1.data_pb2 import PullRequest, PullResponse

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGES: Final = 32
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
_STATUS: Final = {s: PullResponse.Status.Value(s.name) for s in GetStatus}
# Nothing to read yet: the states a long poll waits in.
_WAITING: Final = frozenset({GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE})
# Entries were read (and maybe skipped by tag): what the confirmed offset may cut.
_READ: Final = frozenset({GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE})
_REFUSED_GROUPS_REMEMBERED: Final = 1024


class PullHandler:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicTable,
        offsets: ConsumerOffsets,
        metrics: BrokerMetrics,
        role: GroupRole | None = None,
        groups: ConsumerGroups | None = None,
    ) -> None:
        self._config = config
        self._groups = groups
        self._store = store
        self._topics = topics
        self._offsets = offsets
        self._metrics = metrics
        self._role = role
        self._loop = asyncio.get_running_loop()
        self.long_polls = LongPolls(self._loop, self._serve)
        self._held: set[QueueKey] = set()
        """Queues with pulls parked because their records were not confirmed yet."""
        if role is not None:
            role.on_confirmed = self._confirmed
        offsets.on_reset = self._offsets_reset
        self.draining = False
        """Set at shutdown: pulls are answered at once, never parked."""
        self._refused_groups: set[str] = set()
        """Groups whose piggybacked commits were refused and logged (counted always)."""
        # With no window (commitlog_cache_bytes = 0) the kernel alone decides what stays
        # cached: nothing is known cold.
        window = store.page_cache
        budget = config.cold_read_bytes_per_s
        self.cold_reads = ColdReads(
            store.commitlog.segments,
            lambda: window.released if window.keep_bytes else 0,
            ReadBudget(budget) if budget else None,
            metrics.cold_read_waited.inc,
        )

    def handle(self, responder: Responder, frame: Frame) -> None:
        request = PullRequest.FromString(frame.header)
        self._topics.resolve_pull(request.topic, request.queue_id)
        if self._groups is not None and request.consumer_group:
            # Which member reads the queue, for admin views (one dict entry per queue).
            self._groups.pulled(
                request.consumer_group, request.topic, request.queue_id, responder.connection_id
            )
        generation = (
            request.reset_generation
            if request.HasField("reset_generation") and request.consumer_group
            else None
        )
        if (
            request.HasField("commit_offset")
            and request.consumer_group
            # From a position the group's offsets were reset past: it would undo the reset.
            and (
                generation is None
                or not self._offsets.stale(request.consumer_group, request.topic, generation)
            )
            # Past the queue's end it cannot be what the consumer read here (a slave still
            # copying, say): not stored, and the pull is served all the same.
            and request.commit_offset <= self._store.max_offset(request.topic, request.queue_id)
        ):
            try:
                self._offsets.commit(
                    request.consumer_group,
                    request.topic,
                    request.queue_id,
                    request.commit_offset,
                    held=self._role is not None and self._role.holds_commits,
                )
            except InvalidMessage as exc:
                # A piggybacked commit never costs the consumer its records (a new group
                # past max_consumer_groups): the pull goes on; its COMMIT_OFFSET would get
                # the refusal.
                self._metrics.piggybacked_commits_refused.inc()
                if request.consumer_group not in self._refused_groups:  # once a group
                    if len(self._refused_groups) >= _REFUSED_GROUPS_REMEMBERED:
                        self._refused_groups.clear()
                    self._refused_groups.add(request.consumer_group)
                    log.warning("commits carried on pulls are not stored: %s", exc)
        if frame.is_one_way:
            return  # nobody waits for records: at most the piggybacked commit was wanted
        timeout_ms = min(request.long_poll_timeout_ms, self._config.long_poll_max_ms)
        pull = PendingPull(
            responder,
            frame.request_id,
            request.topic,
            request.queue_id,
            request.offset,
            min(request.max_messages or DEFAULT_MAX_MESSAGES, self._config.max_pull_messages),
            min(request.max_bytes or DEFAULT_MAX_BYTES, self._config.max_pull_bytes),
            frozenset(request.tag_codes) if request.tag_codes else None,
            self._loop.time() + timeout_ms / 1e3,
            request.consumer_group,
            generation,
        )
        self._serve(pull, timeout_ms == 0)

    def _serve(self, pull: PendingPull, final: bool) -> None:
        if pull.reset_generation is not None and self._offsets.stale(
            pull.group, pull.topic, pull.reset_generation
        ):
            self._answer_reset(pull)
            return
        limit = self._limit()
        result = self._read(pull, limit)
        if final or self.draining or result.status not in _WAITING:
            self._answer(pull, result)
            return
        if pull.deadline <= self._loop.time():
            self._answer(pull, result)
            return
        if self.long_polls.parked >= self._config.max_parked_pulls:
            # Each parked pull holds memory and a timer and answers nothing, so no other
            # limit sees them pile up: past the cap the consumer is told "nothing yet"
            # now and asks again.
            self._metrics.pulls_not_parked.inc()
            self._answer(pull, result)
            return
        self.long_polls.park(pull)
        if limit is not None:
            self._held.add(pull.key)
        # The dispatcher may have added an entry (or the slaves confirmed more) after our
        # read and looked for parked pulls before we parked: look once more now that we
        # are visible.
        moved = self._visible_end(pull) != result.max_offset or self._limit() != limit
        if moved and self.long_polls.unpark(pull):
            self._answer(pull, self._read(pull, self._limit()))

    def _visible_end(self, pull: PendingPull) -> int:
        return self._store.max_offset(pull.topic, pull.queue_id)

    def _limit(self) -> int | None:
        """The commitlog offset reads stop at, or None when everything written may be read."""
        if self._role is None:
            return None
        limit = self._role.readable_end()
        if limit is None or limit >= self._store.commitlog.write_offset:
            return None
        return limit

    def _offsets_reset(self, topic: str, queue_ids: Iterable[int]) -> None:
        """A group's offsets on ``topic`` were reset: the pulls parked on its queues
        look again, and those of the group's members are told."""
        self.long_polls.wake({(topic.encode(), q) for q in queue_ids})

    def _answer_reset(self, pull: PendingPull) -> None:
        """OFFSET_RESET: go on from the group's committed offset, under its generation."""
        offsets, store = self._offsets, self._store
        committed = offsets.get(pull.group, pull.topic, pull.queue_id)
        header = PullResponse(
            status=PullResponse.OFFSET_RESET,
            next_offset=pull.offset if committed is None else committed,
            min_offset=store.min_offset(pull.topic, pull.queue_id),
            max_offset=store.max_offset(pull.topic, pull.queue_id),
            reset_generation=offsets.reset_generation(pull.group, pull.topic),
        ).SerializeToString()
        self._metrics.pulled(pull.topic, "offset_reset", 0, 0)
        pull.responder.respond(
            encode_frame(FrameType.PULL, pull.request_id, header, flags=FLAG_RESPONSE)
        )

    def _confirmed(self) -> None:
        """The slaves' copies moved on: read the held-back pulls again."""
        if self._held:
            held, self._held = self._held, set()
            self.long_polls.wake(held)

    def _read(self, pull: PendingPull, limit: int | None) -> GetResult:
        result = self._store.get(
            pull.topic,
            pull.queue_id,
            pull.offset,
            max_messages=pull.max_messages,
            max_bytes=pull.max_bytes,
            tag_codes=pull.tag_codes,
        )
        if limit is not None and result.status in _READ:
            self._hold_back(pull, result, limit)
        return result

    def _hold_back(self, pull: PendingPull, result: GetResult, limit: int) -> None:
        """Serve nothing of ``result`` from the first entry (read, or skipped by tag)
        whose record ends past commitlog offset ``limit``."""
        queue = self._store.queues.get(*pull.key)
        if queue is None:
            return
        # Within a queue, commitlog offsets grow with queue offsets: bisect the entries
        # this read covered for the first one past the limit.
        lo, hi = pull.offset, result.next_offset
        while lo < hi:
            mid = (lo + hi) // 2
            start, size, _ = queue.entry(mid)
            if start + size > limit:
                hi = mid
            else:
                lo = mid + 1
        if lo >= result.next_offset:
            return
        result.keep_below(queue.entry(lo)[0])
        result.next_offset = lo
        if not result.count:
            # Entries skipped by tag below the limit still move the consumer on; with
            # none, it waits for the slaves' copies like a pull at the queue's end.
            moved_on = lo > pull.offset
            result.status = (
                GetStatus.NO_MATCHED_MESSAGE if moved_on else GetStatus.OFFSET_OVERFLOW_ONE
            )

    def _answer(self, pull: PendingPull, result: GetResult) -> None:
        if result.count and self.cold_reads.is_cold(result.log_start):
            self._metrics.pulls_read_in.inc()
            self.cold_reads.read_then(
                result.log_start,
                result.log_end,
                sum(map(len, result.spans)),
                lambda: self._respond(pull, result, True),
            )
            return
        self._respond(pull, result)

    def _respond(self, pull: PendingPull, result: GetResult, read_in: bool = False) -> None:
        """Answer ``pull``. Records just ``read_in`` from disk go out by ``sendfile``
        (:mod:`metaq.broker.zero_copy`): written from the mapping, each of their pages
        would fault on the loop, and those faults and the copy nearly doubled the
        broker's system time while a group drained a cold backlog. Warm records gain
        nothing by it here: it raised the broker's CPU a message in warm drains
        (docs/benchmarks.md)."""
        spans = result.spans
        header = PullResponse(
            status=_STATUS[result.status],
            next_offset=result.next_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
            record_count=result.count,
        ).SerializeToString()
        self._metrics.pulled(
            pull.topic, result.status.value, result.count, sum(map(len, spans)), pull.group
        )
        frame = encode_frame(
            FrameType.PULL,
            pull.request_id,
            header,
            spans,
            FLAG_RESPONSE,
            max_frame_bytes=self._config.max_frame_bytes,
        )
        pull.responder.respond(self._from_files(frame, result) if read_in else frame)

    def _from_files(self, frame: list[Buffer], result: GetResult) -> list[Part]:
        """``frame`` (prefix, then ``result``'s spans) with its larger spans to be sent
        from the commitlog's files."""
        parts: list[Part] = list(frame)
        segments = self._store.commitlog.segments
        for index, (span, start) in enumerate(
            zip(result.spans, result.span_starts, strict=True), 1
        ):
            if len(span) >= zero_copy.MIN_BYTES:
                segment = segments.find(start)
                if segment is not None and segment.fd is not None:
                    parts[index] = FileRange(segment.fd, start - segment.start, span)
        return parts
