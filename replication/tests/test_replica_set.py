"""The master's and slave's state machines against in-memory logs, wired directly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from metaq.common.errors import EpochMismatch, InvalidMessage, NotEnoughReplicas
from metaq.common.framing import Buffer
from metaq.common.v1.data_pb2 import EpochEntry, ReplicaFetchRequest, ReplicaFetchResponse
from metaq.replication.epochs import Epoch, EpochHistory
from metaq.replication.follower import FetchChannel, Follower
from metaq.replication.master import CONFIRMED_NOTICE_S, ReplicaSet
from metaq.testing.memory_log import MemoryLog
from metaq.testing.waiting import run_async, wait_until_async


async def until(condition: Callable[[], bool], what: str = "the condition holds") -> None:
    async def check() -> bool:
        return condition()

    await wait_until_async(check, 5.0, what)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Direct:
    """A channel straight into a ReplicaSet: what the data plane does, minus sockets."""

    def __init__(self, master: ReplicaSet) -> None:
        self.master = master

    async def fetch(self, request: ReplicaFetchRequest) -> tuple[ReplicaFetchResponse, Buffer]:
        request = ReplicaFetchRequest.FromString(request.SerializeToString())
        return await self.master.fetch(request)

    async def close(self) -> None:
        pass


def pair(
    master_log: MemoryLog,
    slave_log: MemoryLog,
    *,
    epoch: int = 1,
    clock: Clock | None = None,
    controlled: bool = False,
) -> tuple[ReplicaSet, Follower]:
    history = EpochHistory(entries=[Epoch(epoch, 0)])
    master = ReplicaSet(
        master_log, history, self_id=0, epoch=epoch, min_in_sync=2, clock=clock or Clock(),
        controlled=controlled,
    )  # fmt: skip

    async def connect(address: str) -> FetchChannel:
        return Direct(master)

    follower = Follower(
        slave_log, EpochHistory(), connect, broker_name="g", broker_id=1, epoch=epoch,
        max_bytes=64, wait_ms=200,
    )  # fmt: skip
    follower.follow("master", epoch)
    return master, follower


def test_a_slave_copies_the_log_byte_for_byte_across_segments() -> None:
    async def scenario() -> None:
        master_log, slave_log = MemoryLog(segment_bytes=100), MemoryLog(segment_bytes=100)
        for i in range(30):
            master_log.append(b"message-%02d" % i)
        master, follower = pair(master_log, slave_log)
        follower.start()
        try:
            await until(lambda: slave_log.end_offset == master_log.end_offset)
            assert bytes(slave_log.data) == bytes(master_log.data)
            # Live appends reach a parked fetch too.
            master_log.append(b"late")
            master.appended()
            await until(lambda: slave_log.end_offset == master_log.end_offset)
            assert bytes(slave_log.data) == bytes(master_log.data)
            assert follower.history.entries == [Epoch(1, 0)]
        finally:
            await follower.stop()

    run_async(scenario())


def test_a_follower_creates_no_task_per_fetch() -> None:
    async def scenario() -> None:
        master_log, slave_log = MemoryLog(), MemoryLog()
        master, follower = pair(master_log, slave_log)
        fetches = 0
        fetch = master.fetch

        async def counted(
            request: ReplicaFetchRequest, connection: int = 0
        ) -> tuple[ReplicaFetchResponse, Buffer]:
            nonlocal fetches
            fetches += 1
            return await fetch(request, connection)

        master.fetch = counted  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        tasks: list[str] = []

        def factory(
            loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
        ) -> asyncio.Task[Any]:
            tasks.append(coro.__qualname__)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        follower.start()
        try:
            for i in range(20):  # one at a time, as sync sends come
                master_log.append(b"message-%02d" % i)
                master.appended()
                await until(lambda: slave_log.end_offset == master_log.end_offset)
        finally:
            await follower.stop()
            loop.set_task_factory(None)
        # The slave's fetch per message is a sync send's path: a task per fetch costs
        # it a loop turn each time. One for the follower, one for the session.
        assert fetches >= 20
        assert tasks == ["Follower._run", "Follower._session"]

    run_async(scenario())


def test_sync_waits_for_the_slaves_copy_and_refuses_without_enough_replicas() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log, slave_log = MemoryLog(), MemoryLog()
        master, follower = pair(master_log, slave_log, clock=clock)
        with pytest.raises(NotEnoughReplicas, match="needs 2 in-sync copies"):
            master.check_writable()
        follower.start()
        try:
            await until(lambda: master.in_sync() == {0, 1})
            master.check_writable()
            master_log.append(b"x" * 10)
            master.appended()
            assert await master.wait_replicated(master_log.end_offset, 5.0)
            assert slave_log.held_offset == master_log.end_offset
        finally:
            await follower.stop()
        # The slave is gone: it falls out of sync once its lag passes the limit.
        master_log.append(b"y")
        clock.now += master.max_lag_s + 1
        assert master.in_sync() == {0}
        with pytest.raises(NotEnoughReplicas):
            master.check_writable()

    run_async(scenario())


def test_a_dropped_slave_is_waited_for_until_the_controller_agrees() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log = MemoryLog()
        master = ReplicaSet(master_log, EpochHistory(), self_id=0, epoch=1, clock=clock)
        master.commit({0, 1})  # the controller still counts slave 1 as electable
        master_log.append(b"acked only if slave 1 has it")

        assert not await master.wait_replicated(master_log.end_offset, 0.05)
        waiting = asyncio.ensure_future(master.wait_replicated(master_log.end_offset, 5.0))
        await asyncio.sleep(0)
        master.commit({0})
        assert await waiting

    run_async(scenario())


def test_a_waiting_send_is_not_confirmed_by_its_only_slave_dropping_out() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log, slave_log = MemoryLog(), MemoryLog()
        master, follower = pair(master_log, slave_log, clock=clock)  # min_in_sync=2
        follower.start()
        await until(lambda: master.in_sync() == {0, 1})
        master.commit({0, 1})
        master.check_writable()  # admitted while the slave is in sync...
        await follower.stop()  # ...which then dies before copying it
        master_log.append(b"admitted with two copies in sync")
        waiting = asyncio.ensure_future(master.wait_replicated(master_log.end_offset, 0.3))
        await asyncio.sleep(0)
        # Both views drop the slave: nobody left to wait for, but only one copy exists.
        clock.now += master.max_lag_s + 1
        master.commit({0})
        assert master.in_sync() == {0}
        assert not await waiting

    run_async(scenario())


def test_the_master_is_followed_while_every_electable_slave_fetches() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log, slave_log = MemoryLog(), MemoryLog()
        master, follower = pair(master_log, slave_log, clock=clock)
        assert not master.followed_within(2.0)  # nobody could replace it: nothing to say
        follower.start()
        await until(lambda: master.in_sync() == {0, 1})
        master.commit({0, 1})
        assert master.followed_within(2.0)
        await follower.stop()  # promoted elsewhere, say: it stops copying at once
        clock.now += 2.5
        assert not master.followed_within(2.0)

    run_async(scenario())


def test_consumers_may_read_only_what_every_electable_slave_holds() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log, slave_log = MemoryLog(), MemoryLog()
        confirmed: list[int] = []
        master, follower = pair(master_log, slave_log, clock=clock)
        master._on_confirmed = lambda: confirmed.append(master.confirmed_offset())
        master_log.append(b"alone")
        assert master.confirmed_offset() == master_log.end_offset  # nobody to wait for
        follower.start()
        try:
            await until(lambda: master.in_sync() == {0, 1})
            master.commit({0, 1})
            held = master_log.end_offset
            await follower.stop()
            master_log.append(b"not copied yet")
            master.appended()
            assert master.confirmed_offset() == held
            follower.start()
            await until(lambda: master.confirmed_offset() == master_log.end_offset)
            assert confirmed[-1] == master_log.end_offset
        finally:
            await follower.stop()

    run_async(scenario())


def test_a_slave_learns_what_the_master_confirmed_and_no_more() -> None:
    async def scenario() -> None:
        master_log, slave_log = MemoryLog(), MemoryLog()
        clock = Clock()
        master, follower = pair(master_log, slave_log, clock=clock)
        follower.wait_ms = 60_000  # only the confirmed notice, not a fetch's wait, tells it
        master.commit({0, 1, 2})  # slave 2 could be elected and holds nothing yet
        master_log.append(b"held by slave 1 only")
        follower.start()
        try:
            await until(lambda: slave_log.end_offset == master_log.end_offset)
            assert master.confirmed_offset() == 0
            assert follower.confirmed == 0
            master.commit({0, 1})  # the controller agrees slave 2 is out of sync
            clock.now += CONFIRMED_NOTICE_S  # the slave's last answer is that old
            await until(lambda: follower.confirmed == master_log.end_offset,
                        "the parked slave hears of the confirmed offset")  # fmt: skip
        finally:
            await follower.stop()

    run_async(scenario())


@pytest.mark.parametrize("controlled", [True, False])
def test_a_slave_seen_in_sync_is_electable_until_the_controller_commits(controlled: bool) -> None:
    """The controller may have committed the slave in while that commit has not reached
    the master, which then pauses: on waking it finds the slave lagging, and must not
    let consumers read (or itself skip the lease) as if no one could have replaced it."""

    async def scenario() -> None:
        clock = Clock()
        master_log, slave_log = MemoryLog(), MemoryLog()
        master, follower = pair(master_log, slave_log, clock=clock, controlled=controlled)
        master.commit({0})  # the controller's last word here: no slave yet
        follower.start()
        await until(lambda: master.in_sync() == {0, 1})
        held = master_log.end_offset
        await follower.stop()  # promoted elsewhere while this master was paused
        clock.now += master.max_lag_s + 1
        master_log.append(b"taken after waking")
        master.appended()
        assert master.in_sync() == {0}
        if controlled:
            assert master.electable() == {0, 1}
            assert master.confirmed_offset() == held
            master.commit({0})  # the controller agrees it is gone
        assert master.electable() == {0}
        assert master.confirmed_offset() == master_log.end_offset

    run_async(scenario())


def test_a_slave_holding_an_old_masters_tail_truncates_then_follows() -> None:
    async def scenario() -> None:
        # The old master (now our slave) wrote 3 records in epoch 1; only the first two
        # reached the new master, which took over in epoch 2 and wrote one more.
        old = MemoryLog()
        new = MemoryLog()
        for payload in (b"one", b"two"):
            old.append(payload)
            new.append(payload)
        old.append(b"never acknowledged")
        takeover = new.end_offset
        new.append(b"three")
        history = EpochHistory(entries=[Epoch(1, 0), Epoch(2, takeover)])
        master = ReplicaSet(new, history, self_id=1, epoch=2)

        async def connect(address: str) -> FetchChannel:
            return Direct(master)

        follower = Follower(
            old, EpochHistory(entries=[Epoch(1, 0)]), connect, broker_name="g", broker_id=0,
            epoch=2, wait_ms=100,
        )  # fmt: skip
        follower.follow("new", 2)
        follower.start()
        try:
            await until(lambda: bytes(old.data) == bytes(new.data))
            assert follower.history.entries == [Epoch(1, 0), Epoch(2, takeover)]
        finally:
            await follower.stop()

    run_async(scenario())


def test_a_slave_agrees_with_the_new_master_only_once_its_old_tail_is_cut() -> None:
    async def scenario() -> None:
        old, new = MemoryLog(), MemoryLog()
        old.append(b"one")
        new.append(b"one")
        old.append(b"taken by the old master alone")
        takeover = new.end_offset
        new.append(b"two")
        master = ReplicaSet(
            new, EpochHistory(entries=[Epoch(1, 0), Epoch(2, takeover)]), self_id=1, epoch=2
        )

        async def connect(address: str) -> FetchChannel:
            return Direct(master)

        follower = Follower(
            old, EpochHistory(entries=[Epoch(1, 0)]), connect, broker_name="g", broker_id=0,
            epoch=2,
        )  # fmt: skip
        assert follower.agreed_epoch == 0
        follower.apply(*await master.fetch(follower.request()))
        assert old.end_offset == takeover  # the tail was cut...
        assert follower.agreed_epoch == 0  # ...but agreement is only known on the next answer
        follower.apply(*await master.fetch(follower.request()))
        assert follower.agreed_epoch == 2
        assert bytes(old.data) == bytes(new.data)

    run_async(scenario())


def test_a_replaced_master_is_refused_both_ways() -> None:
    async def scenario() -> None:
        master_log = MemoryLog()
        master = ReplicaSet(master_log, EpochHistory(), self_id=0, epoch=1)
        newer = ReplicaFetchRequest(broker_id=1, epoch=2, segment_bytes=master_log.segment_bytes)
        with pytest.raises(EpochMismatch, match="was replaced"):
            await master.fetch(newer)
        # And a slave that knows epoch 2 takes nothing from an epoch-1 answer.
        follower = Follower(
            MemoryLog(), EpochHistory(), Direct(master).fetch,  # type: ignore[arg-type]
            broker_name="g", broker_id=1, epoch=2,
        )  # fmt: skip
        stale = ReplicaFetchResponse(epoch=1, offset=0, master_end=10)
        with pytest.raises(EpochMismatch, match="not taking its data"):
            follower.apply(stale, b"\x0a\x00\x00\x00garbage!")
        assert follower.log.end_offset == 0

    run_async(scenario())


def test_mismatched_segment_sizes_are_refused_with_advice() -> None:
    async def scenario() -> None:
        master = ReplicaSet(MemoryLog(segment_bytes=1000), EpochHistory(), self_id=0, epoch=1)
        with pytest.raises(InvalidMessage, match="commitlog_segment_bytes alike"):
            await master.fetch(ReplicaFetchRequest(broker_id=1, epoch=1, segment_bytes=2000))

    run_async(scenario())


def test_a_new_slave_starts_at_the_masters_oldest_data() -> None:
    async def scenario() -> None:
        master_log = MemoryLog(segment_bytes=100)
        master_log.min_offset = 500  # retention removed the first five segments
        master_log.append(b"kept")
        slave_log = MemoryLog(segment_bytes=100)
        _, follower = pair(master_log, slave_log)
        follower.start()
        try:
            await until(lambda: slave_log.end_offset == master_log.end_offset)
            assert slave_log.min_offset == 500
            assert bytes(slave_log.data) == bytes(master_log.data)
        finally:
            await follower.stop()

    run_async(scenario())


def test_a_slave_back_on_a_new_connection_is_out_of_sync_until_it_caught_up() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log = MemoryLog()
        master = ReplicaSet(master_log, EpochHistory(), self_id=0, epoch=1, clock=clock)
        master_log.append(b"one")
        request = ReplicaFetchRequest(
            broker_id=1, epoch=1, offset=master_log.end_offset,
            acked_offset=master_log.end_offset, segment_bytes=master_log.segment_bytes,
        )  # fmt: skip
        await master.fetch(request, connection=7)
        assert master.in_sync() == {0, 1}

        master_log.append(b"two, written while slave 1 restarted")
        request.offset = request.acked_offset = 0  # it lost what it had not flushed
        await master.fetch(request, connection=8)

        assert master.in_sync() == {0}

    run_async(scenario())


def test_a_repair_copy_is_the_masters_record_where_the_histories_agree() -> None:
    async def scenario() -> None:
        master_log = MemoryLog(segment_bytes=1000)
        offsets = [master_log.append(b"record-%02d" % i) for i in range(10)]
        size = offsets[1] - offsets[0]
        history = EpochHistory(entries=[Epoch(1, 0), Epoch(3, offsets[6])])
        master = ReplicaSet(master_log, history, self_id=0, epoch=3)

        def repair(offset: int, *epochs: Epoch) -> ReplicaFetchRequest:
            return ReplicaFetchRequest(
                broker_id=1, epoch=2, offset=offset, max_bytes=size, repair=True,
                segment_bytes=master_log.segment_bytes,
                epochs=[EpochEntry(epoch=e.epoch, start_offset=e.start_offset) for e in epochs],
            )  # fmt: skip

        # The slave wrote epoch 2 from record 4 on, which this master never had.
        slave_history = (Epoch(1, 0), Epoch(2, offsets[4]))
        response, payload = await master.fetch(repair(offsets[2], *slave_history))
        assert bytes(payload) == bytes(master_log.read(offsets[2], size))
        assert response.offset == offsets[2] and response.epoch == 3
        _, payload = await master.fetch(repair(offsets[5], *slave_history))
        assert bytes(payload) == b""  # past where the logs part: another record there
        _, payload = await master.fetch(repair(offsets[3] + 10_000, Epoch(1, 0)))
        assert bytes(payload) == b""  # past the master's end
        assert master.slaves == {}  # a repair is not a slave's progress

    run_async(scenario())


def test_a_new_term_starts_with_the_controllers_in_sync_slaves_in_sync() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log = MemoryLog()
        master_log.append(b"held by both when the old master died")
        held = master_log.end_offset
        master_log.append(b"a tail only the new master had, never acknowledged")
        start = master_log.end_offset
        master = ReplicaSet(
            master_log, EpochHistory(entries=[Epoch(1, 0), Epoch(2, start)]), self_id=0,
            epoch=2, min_in_sync=2, clock=clock, controlled=True, in_sync=[0, 1],
        )  # fmt: skip

        # Sends needing two copies are taken before slave 1 has fetched at all...
        master.check_writable()
        assert master.in_sync() == master.electable() == {0, 1}
        assert master.lag() == {}  # not heard from yet: no figure to give
        master_log.append(b"a send of the new term")
        end = master_log.end_offset
        # ...but confirmed only with its copy, and consumers read no further than it holds.
        assert not await master.wait_replicated(end, 0.05)
        assert master.confirmed_offset() == 0

        request = ReplicaFetchRequest(
            broker_id=1, epoch=2, offset=held, acked_offset=held,
            segment_bytes=master_log.segment_bytes, epochs=[EpochEntry(epoch=1, start_offset=0)],
        )  # fmt: skip
        await master.fetch(request, connection=7)
        assert master.in_sync() == {0, 1}  # behind by the tail, yet in sync as of the term
        request.offset = request.acked_offset = end  # it copied the rest, and the epoch
        request.epochs.append(EpochEntry(epoch=2, start_offset=start))
        await master.fetch(request, connection=7)
        assert await master.wait_replicated(end, 0.05)
        assert master.confirmed_offset() == end

        # From here on the usual rules: back on a new connection, out until caught up.
        master_log.append(b"more")
        del request.epochs[:]
        request.offset = request.acked_offset = 0  # it restarted and lost its log
        await master.fetch(request, connection=8)
        assert master.in_sync() == {0}

    run_async(scenario())


def test_a_slave_in_sync_at_the_term_start_that_never_fetches_drops_out_after_the_lag() -> None:
    clock = Clock()
    master = ReplicaSet(
        MemoryLog(), EpochHistory(), self_id=0, epoch=2, min_in_sync=2, clock=clock,
        controlled=True, in_sync=[0, 1, 2],
    )  # fmt: skip
    clock.now += master.max_lag_s
    assert master.in_sync() == {0, 1, 2}

    clock.now += 0.1

    assert master.in_sync() == {0}
    with pytest.raises(NotEnoughReplicas):
        master.check_writable()


def test_a_send_waiting_for_copies_is_answered_while_the_acknowledging_fetch_is_handled() -> None:
    async def scenario() -> None:
        master_log = MemoryLog()
        master = ReplicaSet(
            master_log, EpochHistory(), self_id=0, epoch=1, min_in_sync=2, clock=Clock()
        )
        caught_up = ReplicaFetchRequest(
            broker_id=1, epoch=1, segment_bytes=master_log.segment_bytes,
        )  # fmt: skip
        await master.fetch(caught_up)
        master_log.append(b"sync-replicated")
        answers: list[bool] = []
        master.when_replicated(master_log.end_offset, 5.0, answers.append)
        assert answers == []  # the slave does not hold it yet

        ack = ReplicaFetchRequest(
            broker_id=1, epoch=1, offset=master_log.end_offset,
            acked_offset=master_log.end_offset, segment_bytes=master_log.segment_bytes,
        )  # fmt: skip
        handling = asyncio.ensure_future(master.fetch(ack))
        await asyncio.sleep(0)  # one loop turn: the fetch is handled and parks

        # Answered by the fetch's own handling, before it parked: no task of the send's
        # needed another turn, and its timeout no longer fires.
        assert answers == [True]
        master.close()
        await handling
        assert answers == [True]

        master_log.append(b"never copied")
        master.when_replicated(master_log.end_offset, 0.01, answers.append)
        await until(lambda: len(answers) == 2, "the wait timed out")
        assert answers == [True, False]

    run_async(scenario())


def test_a_parked_fetch_is_answered_with_the_new_bytes_inside_the_append() -> None:
    async def scenario() -> None:
        master_log = MemoryLog()
        master_log.append(b"held by both")
        master = ReplicaSet(
            master_log, EpochHistory(), self_id=0, epoch=1, min_in_sync=2, clock=Clock()
        )
        answers: list[tuple[ReplicaFetchResponse, bytes]] = []

        def answer(response: ReplicaFetchResponse, payload: Buffer) -> None:
            answers.append((response, bytes(payload)))

        at_end = ReplicaFetchRequest(
            broker_id=1, epoch=1, offset=master_log.end_offset, wait_ms=60_000,
            segment_bytes=master_log.segment_bytes,
        )  # fmt: skip
        master.serve_fetch(at_end, answer)
        assert answers == []  # nothing new: parked

        offset = master_log.end_offset
        master_log.append(b"sync-replicated")
        master.appended()
        # Answered before appended() returned: the push leaves in the send's own loop
        # turn, with no task of the fetch's to be scheduled first.
        assert len(answers) == 1
        response, payload = answers[0]
        assert response.offset == offset
        assert payload == bytes(master_log.read(offset, 1 << 20))

        master.appended()  # nothing parked now: nothing answered twice
        assert len(answers) == 1

        master.serve_fetch(ReplicaFetchRequest(
            broker_id=1, epoch=1, offset=master_log.end_offset, wait_ms=10,
            segment_bytes=master_log.segment_bytes,
        ), answer)  # fmt: skip
        await until(lambda: len(answers) == 2, "the parked fetch timed out")
        assert answers[1][1] == b""  # its wait_ms ran out with nothing new
        master.close()

    run_async(scenario())


def test_a_slave_answered_just_now_hears_the_confirmed_offset_later_not_in_an_empty_answer() -> (
    None
):
    """Sends one at a time: each answer carries the offset the send before confirmed. An
    empty answer in between, to tell the slave sooner, would leave the link busy with its
    round trip when the next send's bytes are due; it is told once it has had no answer
    for CONFIRMED_NOTICE_S (the clock here moves only when the test moves it)."""

    async def scenario() -> None:
        clock = Clock()
        master_log = MemoryLog()
        master = ReplicaSet(
            master_log, EpochHistory(), self_id=0, epoch=1, min_in_sync=2, clock=clock
        )
        answers: list[ReplicaFetchResponse] = []

        def answer(response: ReplicaFetchResponse, payload: Buffer) -> None:
            answers.append(response)

        def fetch(acked: int) -> None:
            master.serve_fetch(ReplicaFetchRequest(
                broker_id=1, epoch=1, offset=master_log.end_offset, acked_offset=acked,
                wait_ms=60_000, segment_bytes=master_log.segment_bytes,
            ), answer)  # fmt: skip

        fetch(0)  # parked: nothing to copy yet
        for n in range(3):
            master_log.append(b"send %d" % n)
            master.appended()  # the bytes go out at once, with the confirmed offset so far
            assert len(answers) == n + 1
            assert answers[-1].confirmed_offset == master.confirmed_offset()
            fetch(master_log.end_offset)  # the slave's copy: confirmed moves; parked again
            assert master.confirmed_offset() == master_log.end_offset
            notice = master._notice
            assert notice is not None
            # The notice's time passes (the loop's clock) while the slave's last answer
            # is as recent as ever (the master's): it is put off, nothing is answered.
            await until(lambda n=notice: master._notice is not n, "the notice came due")
            assert len(answers) == n + 1
            assert master.slaves[1].parked is not None

        clock.now += CONFIRMED_NOTICE_S  # no answer for that long: now it is told
        await until(lambda: len(answers) == 4, "the parked slave hears of the confirmed offset")
        assert answers[-1].confirmed_offset == master_log.end_offset
        master.close()

    run_async(scenario())


def test_a_confirmed_offset_reaches_a_slave_whose_fetch_was_on_its_way_at_the_notice() -> None:
    """The notice finds slave 1's fetch on the wire, not parked: once it parks, holding
    nothing new that would move the confirmed offset, it is told all the same."""

    async def scenario() -> None:
        clock = Clock()
        master_log = MemoryLog()
        master = ReplicaSet(
            master_log, EpochHistory(), self_id=0, epoch=1, min_in_sync=2, clock=clock
        )
        answers: dict[int, list[ReplicaFetchResponse]] = {1: [], 2: []}

        def fetch(broker_id: int, offset: int, acked: int) -> None:
            def answer(response: ReplicaFetchResponse, payload: Buffer) -> None:
                answers[broker_id].append(response)

            master.serve_fetch(ReplicaFetchRequest(
                broker_id=broker_id, epoch=1, offset=offset, acked_offset=acked,
                wait_ms=60_000, segment_bytes=master_log.segment_bytes,
            ), answer)  # fmt: skip

        fetch(1, 0, 0)
        fetch(2, 0, 0)
        master_log.append(b"first")
        master.appended()
        first = master_log.end_offset
        fetch(1, first, first)  # parked: slave 2 does not hold it yet
        master_log.append(b"second")
        master.appended()  # slave 1's fetch is answered: it is on its way again
        second = master_log.end_offset
        fetch(2, first, first)  # both hold the first: confirmed moves
        assert master.confirmed_offset() == first
        assert answers[2][-1].confirmed_offset == first  # answered at once, with it
        fetch(2, second, second)  # parked: slave 1 does not hold the second yet
        assert [a.confirmed_offset for a in answers[1]] == [0, 0]
        clock.now += CONFIRMED_NOTICE_S
        notice = master._notice
        await until(lambda: master._notice is not notice, "the notice came due")
        assert len(answers[1]) == 2  # nothing of slave 1's was parked
        # Slave 1 wrote the second but does not hold it yet (a SYNC flush under way):
        # its fetch moves nothing, and parks.
        fetch(1, second, first)
        assert master.confirmed_offset() == first
        await until(lambda: len(answers[1]) == 3, "slave 1 hears of the confirmed offset")
        assert answers[1][-1].confirmed_offset == first
        master.close()

    run_async(scenario())


def test_a_failing_answer_to_one_slave_neither_fails_the_append_nor_skips_another_slave(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        master_log = MemoryLog()
        master = ReplicaSet(
            master_log, EpochHistory(), self_id=0, epoch=1, min_in_sync=2, clock=Clock()
        )
        answered: list[int] = []

        def broken(response: ReplicaFetchResponse, payload: Buffer) -> None:
            raise OSError("connection reset")

        def fine(response: ReplicaFetchResponse, payload: Buffer) -> None:
            answered.append(len(payload))

        for broker_id, answer in ((1, broken), (2, fine)):
            master.serve_fetch(ReplicaFetchRequest(
                broker_id=broker_id, epoch=1, wait_ms=60_000,
                segment_bytes=master_log.segment_bytes,
            ), answer)  # fmt: skip
        master_log.append(b"stored")
        master.appended()  # the send that appended is answered as usual: no raise here
        assert answered == [master_log.end_offset]
        assert "answering slave 1's fetch failed" in caplog.text
        master.close()

    run_async(scenario())


def test_lag_in_seconds_counts_from_when_the_slave_last_held_the_whole_log() -> None:
    async def scenario() -> None:
        clock = Clock()
        master_log = MemoryLog()
        master_log.append(b"first")
        master = ReplicaSet(
            master_log, EpochHistory(entries=[Epoch(1, 0)]), self_id=0, epoch=1, clock=clock
        )
        assert master.lag_seconds() == {}  # no slave heard from yet
        request = ReplicaFetchRequest(
            broker_id=1, epoch=1, offset=master_log.end_offset,
            acked_offset=master_log.end_offset, segment_bytes=master_log.segment_bytes,
            epochs=[EpochEntry(epoch=1, start_offset=0)],
        )  # fmt: skip
        await master.fetch(request, connection=1)
        assert master.lag_seconds() == {1: 0.0}
        clock.now += 5
        master_log.append(b"second, not copied yet")
        clock.now += 2
        assert master.lag_seconds() == {1: pytest.approx(7.0)}
        request.offset = request.acked_offset = master_log.end_offset
        await master.fetch(request, connection=1)
        assert master.lag_seconds() == {1: 0.0}

    run_async(scenario())


def _fetch_at(broker_id: int, offset: int, log: MemoryLog) -> ReplicaFetchRequest:
    return ReplicaFetchRequest(
        broker_id=broker_id, epoch=1, offset=offset, acked_offset=offset,
        segment_bytes=log.segment_bytes, epochs=[EpochEntry(epoch=1, start_offset=0)],
    )  # fmt: skip


def test_a_slave_holding_back_sends_a_quorum_held_leaves_the_in_sync_set_and_rejoins_later() -> (
    None
):
    async def scenario() -> None:
        clock = Clock()
        changes: list[frozenset[int]] = []
        log = MemoryLog()
        master = ReplicaSet(
            log, EpochHistory(entries=[Epoch(1, 0)]), self_id=0, epoch=1, min_in_sync=2,
            clock=clock, controlled=True, in_sync=[1, 2], slow_s=0.5, rejoin_s=5.0,
        )  # fmt: skip
        master._on_in_sync_change = lambda: changes.append(master.in_sync())
        log.append(b"a send")
        end = log.end_offset
        answered: list[bool] = []
        master.when_replicated(end, 60, answered.append)
        await master.fetch(_fetch_at(1, end, log), connection=1)  # the fast slave holds it
        await master.fetch(_fetch_at(2, 0, log), connection=2)  # the slow one does not
        assert not answered  # two copies, but slave 2 is in sync and waited for
        clock.now += 0.6
        await until(lambda: bool(changes), "the slow slave leaves the in-sync set")
        assert changes[-1] == {0, 1}
        # The controller still counts it in sync until it has agreed: still waited for.
        assert not answered
        master.commit({0, 1})
        assert answered == [True]

        # Caught up at every fetch for rejoin_s: in sync again; one fetch behind restarts it.
        async def both_fetch(slow_at: int, step_s: float) -> None:
            clock.now += step_s
            await master.fetch(_fetch_at(1, log.end_offset, log), connection=1)
            await master.fetch(_fetch_at(2, slow_at, log), connection=2)

        for step in (1.0, 2.0, 1.5):
            await both_fetch(end, step)
        assert 2 not in master.in_sync()
        log.append(b"another send")
        await both_fetch(end, 0.1)  # behind again
        await both_fetch(log.end_offset, 2.0)
        assert 2 not in master.in_sync()
        await both_fetch(log.end_offset, 2.5)
        await both_fetch(log.end_offset, 2.5)
        assert master.in_sync() == {0, 1, 2}
        assert changes[-1] == {0, 1, 2}

    run_async(scenario())
