"""The push consumer: long-polling pull loops that call the application's handlers.

Guarantees first:

- **At least once.** A message's offset is committed only after its handler finished (or
  was given up on, below): the committed offset of a queue is the lowest offset whose
  handler has not finished, or the pull position when none is running
  (:mod:`metaq.client.inflight`). A crash, a close that had to cancel handlers, or a
  rebalance moving a queue while its handlers run makes the next owner repeat those
  messages; nothing is skipped. Offsets are committed every ``commit_interval_s``,
  piggybacked on pulls, when a queue is given away, and at close.
- **Exactly once in a steady group** (clustering): while membership and routes stay the
  same, every queue is consumed by exactly one member.
- **No order** across the messages of a queue: up to ``concurrency`` handlers run at once.
- **A failing handler** is called up to ``max_handler_attempts`` times with a doubling
  back-off, then the message is logged at ERROR and skipped (see
  :mod:`metaq.client.handlers`; a retry topic and a dead-letter queue will take over from
  the skip). It never stalls other queues, nor other messages of its own queue.
- **Back-pressure:** a queue is not pulled while ``max_inflight_messages`` of its
  messages, or ``max_inflight_bytes`` of their records, are pulled but unfinished.

Clustering: the consumer heartbeats every broker of its topics; the brokers' answers are
the group's members, and the nameserver's ``GetAssignment`` over those members says which
queues are this member's (every member asks with the same inputs, so their shares are
disjoint and cover the topic). Under the default ``sticky`` strategy each heartbeat also
reports the queues this member runs, the brokers' answers carry every member's report,
and those holdings go with the request as the previous assignment, so a member joining
or leaving moves only its own share of the queues (see ``_target``, and
docs/consumer.md for what happens while members read different reports). It rebalances
every ``rebalance_interval_s``, and at once when the member list or a route changes. A
queue given away stops its loop, waits up to ``drop_grace_s`` for its handlers and
commits; a queue taken starts from the group's committed offset, or from
``consume_from`` when the group has none (and commits that start at once, so a later
owner continues from the same place).

Broadcasting: every member consumes every readable queue; offsets live in a local file
(:mod:`metaq.client.offset_store`), never on the broker.

Wrong offsets correct themselves: OFFSET_TOO_SMALL and OFFSET_MOVED jump to the
broker's ``next_offset``, OFFSET_OVERFLOW_BADLY resets to the queue's end; each is
logged and counted in ``stats.offset_corrections``. An operator's reset of the group's
offsets (``metaq reset-offsets``) reaches a running member as OFFSET_RESET at its next
pull of each queue: the queue is dropped (what is in flight counts for nothing and is
not committed, calls not started are not made) and started again from the group's new
offset, counted in ``stats.offset_resets``. Its pulls and commits carry the reset
generation its position comes from, and the broker refuses commits from before the
reset, so nothing this member had in flight undoes it. Errors back off (full-jitter
exponential, up to 5 s) and refresh the topic's route before the next try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TypeAlias

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_random_exponential,
)

from metaq.client.admin import Admin
from metaq.client.connection import ConnectionPool
from metaq.client.consume_options import ConsumeFrom, PushConsumerConfig
from metaq.client.errors import ConnectionLost, UnknownTopic
from metaq.client.handlers import LATER, ConsumeResult, ConsumeStats, HandlerPool, ReconsumeLater
from metaq.client.identity import new_client_id
from metaq.client.membership import GroupMembership
from metaq.client.message import Message
from metaq.client.observe import Observer
from metaq.client.offset_store import LocalOffsetStore
from metaq.client.process_queue import ProcessQueue
from metaq.client.pull_consumer import PullConsumer, PullResult, PullStatus
from metaq.client.rebalance import plan_rebalance
from metaq.client.retry import SendBack, as_original
from metaq.client.routes import RouteCache
from metaq.client.tags import TagFilter
from metaq.client.trace import TraceDispatcher
from metaq.common.model import ConsumeMode, QueueRoute, TopicRoute
from metaq.common.names import retry_topic
from metaq.common.service import PeriodicService
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials

log = logging.getLogger(__name__)

MessageHandler: TypeAlias = Callable[[Message], Awaitable[ConsumeResult | None]]
"""Returns None when done; raises, or returns ``LATER``, to have the message again later."""
BatchHandler: TypeAlias = Callable[[list[Message]], Awaitable[ConsumeResult | None]]
QueueKey: TypeAlias = tuple[str, str, int]
"""(topic, broker group, queue id)."""

_RETRY_MAX_S = 5.0


@dataclass(frozen=True, slots=True)
class _Subscription:
    topic: str
    tags: TagFilter
    handler: MessageHandler | None
    batch_handler: BatchHandler | None
    ordered: bool = False


@dataclass(slots=True)
class _Running:
    queue: ProcessQueue[QueueRoute]
    subscription: _Subscription
    task: asyncio.Task[None]


class _Periodic(PeriodicService):
    def __init__(self, name: str, interval_s: float, work: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        super().__init__(interval_s)
        self._work = work

    async def run_once(self) -> None:
        await self._work()


class PushConsumer:
    """Consume topics for consumer group ``group`` by calling handlers; see the module doc.

    ``subscribe`` (one message per call) or ``subscribe_batch`` (a list) before
    :meth:`start`; :meth:`close` stops pulling, lets running handlers finish (at most
    ``close_timeout_s``; messages pulled and not handed to a handler yet are left for
    the group to have again), commits and leaves the group. Keyword arguments are the
    fields of :class:`~metaq.client.consume_options.PushConsumerConfig`.
    """

    def __init__(
        self,
        nameservers: Sequence[str],
        group: str,
        *,
        routes: RouteCache | None = None,
        connections: ConnectionPool | None = None,
        access_key: str = "",
        secret_key: str = "",
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
        observers: Sequence[Observer] = (),
        **options: Any,
    ) -> None:
        self.config = PushConsumerConfig(group=group, **options)
        if not self.config.client_id:
            self.config = replace(self.config, client_id=new_client_id())
        self.client_id = self.config.client_id
        self.stats = ConsumeStats()
        self._puller = PullConsumer(
            nameservers,
            group,
            routes=routes,
            connections=connections,
            request_timeout_s=self.config.request_timeout_s,
            access_key=access_key,
            secret_key=secret_key,
            credentials=credentials,
            tls=tls,
        )
        self._routes = self._puller.routes
        # The nameservers' assignment is an admin call, over the same route cache.
        self._admin = Admin(routes=self._routes, credentials=self._puller.connections.credentials)
        self._subscriptions: dict[str, _Subscription] = {}
        self._running: dict[QueueKey, _Running] = {}
        self._assignments: dict[str, dict[str, list[QueueRoute]]] = {}
        """Per topic, the whole group's assignment as this member last computed it."""
        self._local: LocalOffsetStore | None = None
        self.trace: TraceDispatcher | None = (
            TraceDispatcher(self._routes, self.client_id) if self.config.trace else None
        )
        """Writes the trace of each message handled, with ``trace`` on."""
        self._observers: tuple[Observer, ...] = (
            (*observers, self.trace) if self.trace is not None else tuple(observers)
        )
        """Told of every pull, handler call and send-back (none given, none paid)."""
        self._send_back: SendBack | None = None
        if self.config.mode is ConsumeMode.CLUSTERING:
            self._send_back = SendBack(
                self._routes,
                self._puller.connections,
                group,
                max_reconsume_times=self.config.max_reconsume_times,
                first_retry_level=self.config.first_retry_level,
                delay_levels=self.config.delay_levels,
                timeout_s=self.config.request_timeout_s,
                observers=self._observers,
            )
        self._handlers = HandlerPool(
            self.config.concurrency,
            self.config.max_handler_attempts,
            self.config.handler_retry_backoff_ms / 1000,
            self.stats,
            self._send_failed_back if self._send_back is not None else None,
        )
        self._membership: GroupMembership | None = None
        self._rebalancer: _Periodic | None = None
        self._committer: _Periodic | None = None
        self._rebalance_lock = asyncio.Lock()
        self._started = False
        self._delivering = True
        self._closed = False

    # --- subscriptions ----------------------------------------------------------------

    def subscribe(
        self, topic: str, handler: MessageHandler, *, tags: str | Sequence[str] | None = None
    ) -> None:
        """Call ``await handler(message)`` for each message of ``topic`` (with one of
        ``tags``, when given: ``"a || b"`` or a list; ``"*"`` for all)."""
        self._add(_Subscription(topic, TagFilter.parse(tags), handler, None))

    def subscribe_batch(
        self, topic: str, handler: BatchHandler, *, tags: str | Sequence[str] | None = None
    ) -> None:
        """Call ``await handler(messages)`` with up to ``consume_batch_size`` messages of
        one queue at a time; a failure repeats the whole batch."""
        self._add(_Subscription(topic, TagFilter.parse(tags), None, handler))

    def subscribe_ordered(
        self, topic: str, handler: MessageHandler, *, tags: str | Sequence[str] | None = None
    ) -> None:
        """Call ``await handler(message)`` for each message of ``topic`` strictly in the
        order of its queue, one at a time per queue, holding the queue's lock on its
        broker so that no other member of the group processes it meanwhile (see
        ``_run_ordered``). Messages of one sharding key share a queue, so they are
        handled in send order."""
        if self.config.mode is ConsumeMode.BROADCASTING:
            raise ValueError("ordered consumption is for clustering groups (broadcasting "
                             "members each consume every queue anyway)")  # fmt: skip
        self._add(_Subscription(topic, TagFilter.parse(tags), handler, None, ordered=True))

    def _add(self, subscription: _Subscription) -> None:
        if self._started:
            raise RuntimeError("subscribe before start()")
        if subscription.topic in self._subscriptions:
            raise ValueError(f"topic {subscription.topic!r} is already subscribed")
        self._subscriptions[subscription.topic] = subscription

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group, take this member's queues and start consuming them.

        Returns after the first heartbeat and rebalance; when brokers or nameservers
        cannot be reached yet, that is logged and retried in the background.
        """
        if self._started:
            raise RuntimeError("the consumer is already started")
        if not self._subscriptions:
            raise RuntimeError("subscribe to at least one topic before start()")
        self._started = True
        config = self.config
        if config.mode is ConsumeMode.BROADCASTING:
            self._local = LocalOffsetStore(config.local_offset_path())
        else:
            # The group's retries come back through its retry topic, to the handler of
            # the topic each message was first sent to.
            topic = retry_topic(config.group)
            self._subscriptions[topic] = _Subscription(
                topic, TagFilter.parse(None), self._handle_retry, None
            )
        await self._puller.start()
        self._rebalancer = _Periodic(
            "metaq-consumer-rebalance", config.rebalance_interval_s, self._rebalance
        )
        self._membership = GroupMembership(
            group=config.group,
            client_id=self.client_id,
            computer_room=config.computer_room,
            mode=config.mode,
            routes=self._routes,
            connections=self._puller.connections,
            interval_s=config.heartbeat_interval_s,
            request_timeout_s=config.request_timeout_s,
            on_change=self._rebalancer.wakeup,
            held=self._held if config.reports_holdings else None,
        )
        self._membership.subscriptions = {t: s.tags for t, s in self._subscriptions.items()}
        self._committer = _Periodic("metaq-consumer-commit", config.commit_interval_s, self.commit)
        self._routes.add_listener(self._route_changed)
        try:
            await self._membership.heartbeat()
        except Exception as exc:
            log.warning("first consumer heartbeat failed, will retry: %s", exc)
        try:
            await self._rebalance()
        except Exception as exc:
            log.warning("first rebalance failed, will retry: %s", exc)
        self._membership.start()
        self._rebalancer.start()
        self._committer.start()

    def stop_delivery(self) -> None:
        """Hand no further message to a handler, from now on: pulling stops, and messages
        pulled but not handed out yet stay uncommitted (whoever runs their queues next
        has them). Handlers running finish. For an application that has had enough
        before :meth:`close` (``metaq consume --count``): a handler may call it for the
        last message it wants, and no call follows that one."""
        self._delivering = False
        for run in self._running.values():
            run.queue.dropped = True
            run.task.cancel()

    async def close(self) -> None:
        """Stop pulling, let running handlers finish, commit, leave the group, close
        connections."""
        if self._closed:
            return
        self._closed = True
        self.stop_delivery()
        running = list(self._running.values())
        for service in (self._rebalancer, self._membership):
            if service is not None:
                await service.stop()
        await asyncio.gather(*(r.task for r in running), return_exceptions=True)
        await self._handlers.drain(self.config.close_timeout_s)
        if self._committer is not None:
            await self._committer.stop()
        try:
            await self._commit_queues([r.queue for r in running])
        except Exception as exc:
            log.warning("final offset commit failed (the messages since will repeat): %s", exc)
        self._running.clear()
        ordered = [r.queue for r in running if r.subscription.ordered]
        for queue in ordered:  # the next holder need not wait for the locks to lapse
            with contextlib.suppress(Exception):
                await self._puller.lock(
                    queue.route.address, self.client_id, [(queue.topic, queue.route.queue_id)],
                    unlock=True,
                )  # fmt: skip
        if self._membership is not None:
            try:
                await self._membership.leave()
            except Exception as exc:
                log.warning("could not tell the brokers this consumer leaves: %s", exc)
        if self.trace is not None:
            await self.trace.close()
        await self._puller.close()

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # --- views ------------------------------------------------------------------------

    @property
    def assigned_queues(self) -> list[QueueKey]:
        """(topic, broker group, queue id) of every queue this consumer runs, sorted."""
        return sorted(self._running)

    @property
    def members(self) -> list[str]:
        """Client ids of the group's members as this consumer last learnt them."""
        return [m.client_id for m in self._membership.members] if self._membership else []

    def _held(self) -> list[QueueKey]:
        return list(self._running)

    def queue_state(self, key: QueueKey) -> ProcessQueue[QueueRoute] | None:
        run = self._running.get(key)
        return run.queue if run is not None else None

    # --- retries ----------------------------------------------------------------------

    async def _handle_retry(self, message: Message) -> ConsumeResult | None:
        original = as_original(message)
        sub = self._subscriptions.get(original.topic)
        if sub is None:
            raise LookupError(f"no subscription for {original.topic!r} takes its retries")
        if sub.handler is not None:
            return await sub.handler(original)
        assert sub.batch_handler is not None
        return await sub.batch_handler([original])

    async def _send_failed_back(
        self, queue: ProcessQueue[Any], message: Message, failure: Exception
    ) -> bool:
        assert self._send_back is not None
        route: QueueRoute = queue.route
        first = self._send_back.sent_back + self._send_back.dead_lettered == 0
        stored = await self._send_back(queue.topic, route.broker_name, message, failure)
        if stored and first and self._rebalancer is not None:
            # The retry topic may have just been created: route it well before its
            # first delay is up rather than at the next periodic rebalance.
            asyncio.get_running_loop().call_later(1.0, self._rebalancer.wakeup)
        return stored

    # --- rebalancing ------------------------------------------------------------------

    def _rebalancer_wakeup(self) -> None:
        if self._rebalancer is not None and not self._closed:
            self._rebalancer.wakeup()

    def _route_changed(self, topic: str, _route: TopicRoute) -> None:
        if topic in self._subscriptions and self._rebalancer is not None:
            self._rebalancer.wakeup()

    async def _rebalance(self) -> None:
        async with self._rebalance_lock:
            if self._closed:
                return
            failures = []
            for topic in self._subscriptions:
                try:
                    await self._rebalance_topic(topic)
                except Exception as exc:  # one topic's trouble must not hold up the others
                    failures.append(exc)
                    log.warning("rebalance of %s failed, keeping its queues: %s", topic, exc)
            if failures:
                raise failures[0]

    async def _target(self, topic: str) -> dict[QueueKey, QueueRoute] | None:
        """The queues this member should run for ``topic``; None: keep what runs."""
        try:
            route = await self._routes.route(topic)
        except UnknownTopic:
            return {}
        if self.config.mode is ConsumeMode.BROADCASTING:
            return {(topic, q.broker_name, q.queue_id): q for q in route.read_queues}
        assert self._membership is not None
        members = self._membership.members
        if not any(m.client_id == self.client_id for m in members):
            return None  # no broker has confirmed this member yet
        # Each member asks on its own, and members only agree (disjoint queues covering
        # the topic) when they pass identical inputs. A member's own last answer is not
        # the group's (a newcomer has none, and one that missed a membership change
        # holds another), so the only ``previous`` sent is the group's holdings as every
        # member reads them back from the brokers (``sticky``); the other strategies
        # compute from the members and queues alone.
        previous = None
        if self.config.reports_holdings:
            previous = {
                client_id: [(b, q) for t, b, q in holdings.queues if t == topic]
                for client_id, holdings in self._membership.holdings.items()
            }
        assignment = await self._admin.assignment(
            self.config.group,
            topic,
            self.config.strategy,
            [(m.client_id, m.computer_room) for m in members],
            previous,
        )
        self._assignments[topic] = assignment
        return {
            (topic, q.broker_name, q.queue_id): q
            for q in assignment.get(self.client_id, [])
            if q.address  # routed by the nameserver but not in our route yet: next round
        }

    async def _rebalance_topic(self, topic: str) -> None:
        target = await self._target(topic)
        if target is None:
            return
        current = {k: r.queue.route for k, r in self._running.items() if k[0] == topic}
        plan = plan_rebalance(current, target)
        if plan.unchanged:
            return
        self.stats.rebalances += 1
        log.info(
            "consumer %s rebalanced %s: +%s -%s",
            self.client_id,
            topic,
            sorted(f"{b}:{q}" for _, b, q in plan.added) or "[]",
            sorted(f"{b}:{q}" for _, b, q in plan.removed) or "[]",
        )
        for key, route in plan.rerouted.items():
            self._running[key].queue.route = route
        await asyncio.gather(*(self._drop(key) for key in plan.removed))
        for key, route in plan.added.items():
            self._begin(key, route)
        if self._membership is not None and self.config.reports_holdings:
            self._membership.wakeup()  # the others' next assignment starts from these
            # Once more when every member has reported what it runs now: members that
            # computed from reports of different ages and disagree settle then, not at
            # the next periodic rebalance (with nothing to change, nothing follows).
            asyncio.get_running_loop().call_later(
                2 * self.config.heartbeat_interval_s, self._rebalancer_wakeup
            )

    def _begin(self, key: QueueKey, route: QueueRoute) -> None:
        if not self._delivering:
            return
        subscription = self._subscriptions[key[0]]
        # The start offset is resolved inside the loop (it takes a round trip); until
        # then the queue sits at offset 0 with nothing in flight and is not committed.
        queue = ProcessQueue(
            key[0],
            route,
            0,
            max_messages=self.config.max_inflight_messages,
            max_bytes=self.config.max_inflight_bytes,
        )
        task = asyncio.get_running_loop().create_task(
            self._run_queue(queue, subscription), name=f"metaq-pull-{key[0]}-{route}"
        )
        self._running[key] = _Running(queue, subscription, task)

    async def _drop(self, key: QueueKey) -> None:
        run = self._running.pop(key)
        run.queue.dropped = True
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.drop_grace_s):
                await run.queue.wait_idle()
        try:
            await self._commit_queues([run.queue])
        except Exception as exc:
            log.warning("commit of %s/%s on giving it away failed: %s", key[0], key[1:], exc)
        if run.subscription.ordered:
            # Committed first: the next holder starts where this one stopped.
            with contextlib.suppress(Exception):
                await self._puller.lock(
                    run.queue.route.address, self.client_id, [(key[0], key[2])], unlock=True
                )

    # --- offsets ----------------------------------------------------------------------

    async def commit(self) -> None:
        """Commit every running queue's offset that moved since its last commit."""
        await self._commit_queues([r.queue for r in self._running.values()])

    async def _commit_queues(self, queues: Sequence[ProcessQueue[QueueRoute]]) -> None:
        due = [(q, offset) for q in queues if q.started and (offset := q.commit_due()) is not None]
        if not due:
            return
        if self._local is not None:
            for queue, offset in due:
                route = queue.route
                self._local.update(queue.topic, route.broker_name, route.queue_id, offset)
                queue.committed = offset
            self._local.save()
            return
        by_broker: dict[str, list[tuple[ProcessQueue[QueueRoute], int]]] = {}
        for queue, offset in due:
            by_broker.setdefault(queue.route.address, []).append((queue, offset))
        results = await asyncio.gather(
            *(self._commit_to(address, entries) for address, entries in by_broker.items()),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            raise failures[0]

    async def _commit_to(
        self, address: str, entries: Sequence[tuple[ProcessQueue[QueueRoute], int]]
    ) -> None:
        await self._puller.commit_many(
            address,
            [(q.topic, q.route.queue_id, offset) for q, offset in entries],
            reset_generations={
                (q.topic, q.route.queue_id): q.reset_generation
                for q, _ in entries
                if q.reset_generation is not None
            },
        )
        for queue, offset in entries:
            queue.committed = offset

    async def _start_offset(self, queue: ProcessQueue[QueueRoute]) -> int:
        """The group's committed offset, else the one ``consume_from`` says."""
        route = queue.route
        local = self._local
        stored = local.get(queue.topic, route.broker_name, route.queue_id) if local else None
        if stored is not None:
            queue.committed = stored
            return stored
        answer = await self._puller.query(
            queue.topic,
            route,
            timestamp_ms=_timestamp(self.config.consume_from),
            with_committed=local is None,
        )
        queue.reset_generation = None if local is not None else answer.reset_generation
        if answer.committed is not None:
            queue.committed = answer.committed
            return answer.committed
        where = self.config.consume_from
        if where.kind == "first":
            offset = answer.min_offset
        elif where.kind == "last":
            offset = answer.max_offset
        else:
            assert answer.timestamp_offset is not None
            offset = answer.timestamp_offset
        log.info(
            "group %s has no offset for %s queue %s; starting from %s: offset %d",
            self.config.group,
            queue.topic,
            route,
            where,
            offset,
        )
        return offset

    # --- the pull loop of one queue ---------------------------------------------------

    async def _run_queue(self, queue: ProcessQueue[QueueRoute], sub: _Subscription) -> None:
        if sub.ordered:
            await self._run_ordered(queue, sub)
            return
        start = await self._retrying(queue, lambda: self._start_offset(queue))
        queue.reposition(start)
        queue.started = True
        if queue.committed is None:
            # Fix the group's position now, so whoever runs the queue next starts here.
            await self._retrying(queue, lambda: self._commit_queues([queue]))
        long_poll_s = self.config.long_poll_timeout_ms / 1000
        while not queue.dropped:
            await queue.wait_for_room()
            result = await self._retrying(queue, lambda: self._pull(queue, sub, long_poll_s))
            self._apply(queue, sub, result)
            if result.messages and result.next_offset >= result.max_offset:
                # Caught up: the next pull will only park, so let the handlers just
                # submitted start first. Behind, it asks at once, and the broker reads
                # the next batch while they run.
                await asyncio.sleep(0)

    # --- ordered queues ---------------------------------------------------------------

    async def _run_ordered(self, queue: ProcessQueue[QueueRoute], sub: _Subscription) -> None:
        """One queue, strictly in order, only while this member holds its lock.

        The lock is taken on the queue's master before anything else, then renewed every
        third of its time to live; a member processes only within the time to live of
        its last granted request (counted from when it sent it, less a margin), so when
        renewals fail it stops before the broker could hand the queue to anyone else.
        The start offset is read after the lock is granted: the previous holder commits
        before it lets go.
        """
        assert sub.handler is not None
        lease = _Lease()
        while not queue.dropped:
            if not await self._renew(queue, lease):
                await asyncio.sleep(self.config.lock_retry_ms / 1000)
                continue
            if not queue.started:
                queue.reposition(await self._retrying(queue, lambda: self._start_offset(queue)))
                queue.started = True
            long_poll_s = min(self.config.long_poll_timeout_ms / 1000, lease.left() / 2)
            try:
                result = await self._pull(queue, sub, max(long_poll_s, 0.0))
            except Exception as exc:
                log.warning("ordered pull of %s %s failed: %s", queue.topic, queue.route, exc)
                await self._reroute(queue)  # its master may have moved (a failover)
                await asyncio.sleep(self.config.lock_retry_ms / 1000)
                continue
            status = result.status
            if status is not PullStatus.FOUND and status is not PullStatus.NO_MATCHED_MESSAGE:
                self._apply(queue, sub, result)
                continue
            queue.deliver([(m.queue_offset, m.size) for m in result.messages], result.next_offset)
            self.stats.pulled += len(result.messages)
            for message in result.messages:
                if not lease.valid() and not await self._renew(queue, lease):
                    # The lock may be someone else's by now: hand the rest back.
                    queue.reposition(message.queue_offset)
                    break
                await self._consume_in_order(queue, sub.handler, message)
                queue.finish(message.queue_offset)

    async def _renew(self, queue: ProcessQueue[QueueRoute], lease: _Lease) -> bool:
        if lease.fresh(self.config.lock_renew_fraction):
            return True
        sent = time.monotonic()
        key = (queue.topic, queue.route.queue_id)
        try:
            held, ttl_s = await self._puller.lock(
                queue.route.address, self.client_id, [key], held=lease.valid()
            )
        except Exception as exc:
            log.info("locking %s %s failed: %s", queue.topic, queue.route, exc)
            await self._reroute(queue)
            return lease.valid()
        if key in held:
            lease.granted(sent, ttl_s)
            return True
        lease.lost()
        return False

    async def _consume_in_order(
        self, queue: ProcessQueue[QueueRoute], handler: MessageHandler, message: Message
    ) -> None:
        """Call the handler until it succeeds, at most ``max_reconsume_times`` + 1 times,
        in place (the queue waits); then park the message in the dead-letter topic and
        go on: one bad message must not block its queue for good."""
        attempt = 0
        while True:
            attempt += 1
            try:
                if await handler(message) is not LATER:
                    self.stats.handled += 1
                    return
                failure: Exception = ReconsumeLater("the handler asked to see it later")
            except Exception as exc:
                self.stats.failed_attempts += 1
                failure = exc
            if attempt > self.config.max_reconsume_times:
                break
            await asyncio.sleep(min(0.1 * 2 ** (attempt - 1), 1.0))
        assert self._send_back is not None
        while not await self._send_back(
            queue.topic, queue.route.broker_name, message, failure, dead=True
        ):
            await asyncio.sleep(self.config.lock_retry_ms / 1000)
        self.stats.parked += 1
        log.error(
            "ordered message %s (%s %s offset %d) failed %d times; parked in the dead-letter "
            "topic, the queue goes on: %r",
            message.msg_id, queue.topic, queue.route, message.queue_offset, attempt, failure,
        )  # fmt: skip

    async def _pull(
        self, queue: ProcessQueue[QueueRoute], sub: _Subscription, long_poll_s: float
    ) -> PullResult:
        commit = queue.commit_due() if self._local is None else None
        began = time.perf_counter()
        result = await self._puller.pull(
            queue.topic,
            queue.route,
            queue.offsets.position,
            self.config.pull_batch_size,
            long_poll_s,
            tags=sub.tags,
            max_bytes=self.config.pull_batch_bytes,
            commit_offset=commit,
            reset_generation=queue.reset_generation,
        )
        if commit is not None:
            queue.committed = commit
        if self._observers:
            seconds = time.perf_counter() - began
            for observer in self._observers:
                observer.pulled(
                    self.config.group, queue.topic, queue.route.broker_name,
                    len(result.messages), seconds,
                )  # fmt: skip
        return result

    def _apply(
        self, queue: ProcessQueue[QueueRoute], sub: _Subscription, result: PullResult
    ) -> None:
        status = result.status
        if status is PullStatus.FOUND or status is PullStatus.NO_MATCHED_MESSAGE:
            messages = result.messages
            queue.deliver([(m.queue_offset, m.size) for m in messages], result.next_offset)
            self.stats.pulled += len(messages)
            if messages:
                self._dispatch(queue, sub, messages)
        elif status in (PullStatus.OFFSET_TOO_SMALL, PullStatus.OFFSET_MOVED):
            self._correct(queue, result, "is no longer stored")
        elif status is PullStatus.OFFSET_OVERFLOW_BADLY:
            self._correct(queue, result, "is past the queue's end")
        elif status is PullStatus.OFFSET_RESET:
            self._restart(queue, result)
        # NO_MESSAGE_IN_QUEUE, OFFSET_OVERFLOW_ONE: the long poll ended with nothing new.

    def _restart(self, queue: ProcessQueue[QueueRoute], result: PullResult) -> None:
        """The group's offsets on the queue's topic were reset: drop the queue as it is
        (its loop ends, its messages in flight are neither committed nor, if not started
        yet, handled) and run it afresh from the group's committed offset."""
        route = queue.route
        key = (queue.topic, route.broker_name, route.queue_id)
        log.warning(
            "the offsets of group %s on %s were reset (generation %d): queue %s drops %d "
            "messages in flight and continues from offset %d",
            self.config.group, queue.topic, result.reset_generation, route,
            queue.offsets.count, result.next_offset,
        )  # fmt: skip
        self.stats.offset_resets += 1
        queue.dropped = True
        run = self._running.get(key)
        if run is not None and run.queue is queue:
            self._begin(key, route)

    def _correct(self, queue: ProcessQueue[QueueRoute], result: PullResult, why: str) -> None:
        log.warning(
            "offset %d of %s queue %s %s (%s; queue holds [%d, %d)); continuing at %d",
            queue.offsets.position,
            queue.topic,
            queue.route,
            why,
            result.status.name,
            result.min_offset,
            result.max_offset,
            result.next_offset,
        )
        self.stats.offset_corrections += 1
        queue.reposition(result.next_offset)

    def _dispatch(
        self, queue: ProcessQueue[QueueRoute], sub: _Subscription, messages: list[Message]
    ) -> None:
        handler, batch_handler = sub.handler, sub.batch_handler
        if self._observers:
            broker = queue.route.broker_name
            if handler is not None:
                handler = _observed(handler, self._observers, self.config.group, broker)
            else:
                assert batch_handler is not None
                batch_handler = _observed_batch(
                    batch_handler, self._observers, self.config.group, broker
                )
        if handler is not None:
            self._handlers.submit_each(queue, messages, handler)
            return
        assert batch_handler is not None
        size = self.config.consume_batch_size
        for at in range(0, len(messages), size):
            batch = messages[at : at + size]
            self._handlers.submit(queue, batch, _bind(batch_handler, batch))

    async def _retrying(
        self, queue: ProcessQueue[QueueRoute], call: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Run ``call`` until it succeeds, backing off and refreshing routes between tries.

        The first try runs bare: building a retrying state per pull costs more than the
        pull's own Python work. After a failure the route is refreshed and the call tried
        again at once, then with full-jitter exponential back-off (tenacity).
        """
        try:
            return await call()
        except Exception as exc:
            self._log_failure(queue, exc, 1)
            if isinstance(exc, ConnectionLost) and self._membership is not None:
                # A broker forgets the members whose connection closed: announce this
                # one again now rather than at the next heartbeat round.
                self._membership.wakeup()
        await self._reroute(queue)

        async def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            self._log_failure(queue, exc, state.attempt_number + 1)
            await self._reroute(queue)

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_random_exponential(multiplier=0.05, max=_RETRY_MAX_S),
            before_sleep=before_sleep,
            reraise=True,
        ):
            with attempt:
                return await call()
        raise AssertionError("tenacity stopped retrying without stop condition")

    def _log_failure(
        self, queue: ProcessQueue[QueueRoute], exc: BaseException | None, attempt: int
    ) -> None:
        retriable = getattr(exc, "retriable", True)
        level = logging.WARNING if attempt in (1, 10) else logging.DEBUG
        if not retriable:
            level = logging.ERROR
        log.log(
            level,
            "%s queue %s: %s (attempt %d, retriable=%s); retrying",
            queue.topic,
            queue.route,
            exc,
            attempt,
            retriable,
        )

    async def _reroute(self, queue: ProcessQueue[QueueRoute]) -> None:
        """Refresh the topic's route and follow the queue if its broker moved."""
        try:
            route = await self._routes.route(queue.topic, refresh=True)
        except Exception as exc:
            log.debug("route refresh of %s failed: %s", queue.topic, exc)
            return
        moved = _find(route.read_queues, queue.route)
        if moved is not None and moved != queue.route:
            log.info("queue %s of %s moved to %s", queue.route, queue.topic, moved.address)
            queue.route = moved


class _Lease:
    """How long this member may process an ordered queue: the lock's time to live,
    counted from when the granted request was sent, less a margin."""

    _MARGIN: Final = 0.8

    def __init__(self) -> None:
        self._sent = 0.0
        self._ttl_s = 0.0

    def granted(self, sent: float, ttl_s: float) -> None:
        self._sent, self._ttl_s = sent, ttl_s

    def lost(self) -> None:
        self._ttl_s = 0.0

    def left(self) -> float:
        return self._sent + self._ttl_s * self._MARGIN - time.monotonic()

    def valid(self) -> bool:
        return self.left() > 0

    def fresh(self, fraction: float) -> bool:
        """Granted less than ``fraction`` of the time to live ago: no renewal needed."""
        return time.monotonic() - self._sent < self._ttl_s * fraction


def _observed(
    handler: MessageHandler, observers: Sequence[Observer], group: str, broker: str
) -> MessageHandler:
    """``handler``, each call reported to ``observers``."""

    async def call(message: Message) -> ConsumeResult | None:
        return await _reported(lambda: handler(message), [message], observers, group, broker)

    return call


def _observed_batch(
    handler: BatchHandler, observers: Sequence[Observer], group: str, broker: str
) -> BatchHandler:
    """``handler``, each call reported to ``observers`` for each message of its batch."""

    async def call(messages: list[Message]) -> ConsumeResult | None:
        return await _reported(lambda: handler(messages), messages, observers, group, broker)

    return call


async def _reported(
    handle: Callable[[], Awaitable[ConsumeResult | None]],
    messages: Sequence[Message],
    observers: Sequence[Observer],
    group: str,
    broker: str,
) -> ConsumeResult | None:
    """Await a handler's call on ``messages`` and tell ``observers`` how each went (a
    cancelled call is not reported: the message was not handled)."""
    started_ms = int(time.time() * 1000)
    began = time.perf_counter()
    error: BaseException | None = None
    try:
        result = await handle()
        if result is LATER:
            error = ReconsumeLater("the handler asked to see the message later")
        return result
    except BaseException as exc:
        error = exc
        raise
    finally:
        seconds = time.perf_counter() - began
        for observer in observers if not isinstance(error, asyncio.CancelledError) else ():
            for message in messages:
                observer.consumed(group, broker, message, error, started_ms, seconds)


def _bind(
    handler: Callable[[Any], Awaitable[object]], argument: Any
) -> Callable[[], Awaitable[object]]:
    return lambda: handler(argument)


def _timestamp(where: ConsumeFrom) -> int | None:
    return where.timestamp_ms if where.kind == "timestamp" else None


def _find(queues: Sequence[QueueRoute], wanted: QueueRoute) -> QueueRoute | None:
    for queue in queues:
        if queue.broker_name == wanted.broker_name and queue.queue_id == wanted.queue_id:
            return queue
    return None


__all__ = ["BatchHandler", "MessageHandler", "PushConsumer", "QueueKey", "new_client_id"]
