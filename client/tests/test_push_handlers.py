"""Handler execution: bounded concurrency, bounded retries, offsets finished or not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from metaq.client.handlers import ConsumeStats, HandlerPool
from metaq.client.message import Message
from metaq.client.process_queue import ProcessQueue


def _queue(max_messages: int = 100, max_bytes: int = 1 << 20) -> ProcessQueue[str]:
    queue: ProcessQueue[str] = ProcessQueue(
        "t", "a:0", 0, max_messages=max_messages, max_bytes=max_bytes
    )
    queue.started = True
    return queue


def _messages(queue: ProcessQueue[str], count: int, size: int = 10) -> list[Message]:
    start = queue.offsets.position
    messages = [
        Message("t", b"x", queue_offset=start + n, msg_id=f"m{start + n}", size=size)
        for n in range(count)
    ]
    queue.deliver([(m.queue_offset, m.size) for m in messages], start + count)
    return messages


def test_a_failing_handler_is_retried_then_skipped_and_the_offset_moves_on() -> None:
    async def scenario() -> None:
        stats = ConsumeStats()
        pool = HandlerPool(4, max_attempts=3, retry_backoff_s=0.001, stats=stats)
        queue = _queue()
        (message,) = _messages(queue, 1)
        calls = 0

        async def always_fails() -> None:
            nonlocal calls
            calls += 1
            raise RuntimeError("boom")

        pool.submit(queue, [message], always_fails)
        assert await pool.drain(5) == 0
        assert calls == 3
        assert (stats.failed_attempts, stats.skipped, stats.handled) == (3, 1, 0)
        assert queue.commit_due() == 1

    asyncio.run(scenario())


def test_a_handler_that_recovers_is_counted_as_handled_once() -> None:
    async def scenario() -> None:
        stats = ConsumeStats()
        pool = HandlerPool(4, max_attempts=3, retry_backoff_s=0.001, stats=stats)
        queue = _queue()
        (message,) = _messages(queue, 1)
        outcomes = [RuntimeError("first"), None]

        async def flaky() -> None:
            outcome = outcomes.pop(0)
            if outcome is not None:
                raise outcome

        pool.submit(queue, [message], flaky)
        await pool.drain(5)
        assert (stats.failed_attempts, stats.handled, stats.skipped) == (1, 1, 0)
        assert queue.offsets.commit_offset == 1

    asyncio.run(scenario())


def test_no_more_handlers_run_at_once_than_the_concurrency() -> None:
    async def scenario() -> None:
        pool = HandlerPool(3, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue()
        running = peak = 0
        release = asyncio.Event()

        async def handler() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await release.wait()
            running -= 1

        for message in _messages(queue, 10):
            pool.submit(queue, [message], handler)
        while running < 3:
            await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)  # let any task that could start do so
        assert (running, peak) == (3, 3)
        release.set()
        await pool.drain(5)
        assert peak == 3
        assert queue.offsets.commit_offset == 10

    asyncio.run(scenario())


def test_a_slow_message_holds_the_commit_while_later_ones_finish() -> None:
    async def scenario() -> None:
        pool = HandlerPool(8, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue()
        slow = asyncio.Event()
        messages = _messages(queue, 5)

        async def wait_for_slow() -> None:
            await slow.wait()

        async def quick() -> None:
            return None

        pool.submit(queue, messages[:1], wait_for_slow)
        for message in messages[1:]:
            pool.submit(queue, [message], quick)
        while queue.offsets.count > 1:
            await asyncio.sleep(0)
        assert queue.commit_due() == 0, "message 0 still runs: nothing may be committed"
        slow.set()
        await pool.drain(5)
        assert queue.commit_due() == 5

    asyncio.run(scenario())


def test_handlers_cancelled_at_close_leave_their_messages_uncommitted() -> None:
    async def scenario() -> None:
        pool = HandlerPool(2, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue()
        never = asyncio.Event()
        messages = _messages(queue, 2)

        async def hangs() -> None:
            await never.wait()

        async def quick() -> None:
            return None

        pool.submit(queue, messages[:1], hangs)
        pool.submit(queue, messages[1:], quick)
        assert await pool.drain(0.05) == 1
        assert queue.offsets.commit_offset == 0

    asyncio.run(scenario())


def test_a_full_queue_blocks_pulling_until_a_message_finishes() -> None:
    async def scenario() -> None:
        queue = _queue(max_messages=2)
        first, _ = _messages(queue, 2)
        assert queue.full
        waiter = asyncio.ensure_future(queue.wait_for_room())
        await asyncio.sleep(0)
        assert not waiter.done()
        queue.finish(first.queue_offset)
        await asyncio.wait_for(waiter, 1)

    asyncio.run(scenario())


def test_the_byte_budget_blocks_pulling_too() -> None:
    queue = _queue(max_messages=100, max_bytes=25)
    _messages(queue, 2, size=10)
    assert not queue.full
    _messages(queue, 1, size=10)
    assert queue.full


@contextmanager
def counting_tasks() -> Iterator[list[int]]:
    """Counts the tasks the running loop creates meanwhile, in the list's one item."""
    loop = asyncio.get_running_loop()
    created = [0]

    def counting_factory(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        created[0] += 1
        return asyncio.Task(coro, loop=loop)

    loop.set_task_factory(counting_factory)
    try:
        yield created
    finally:
        loop.set_task_factory(None)


def test_a_backlog_runs_on_at_most_concurrency_tasks_not_one_per_message() -> None:
    async def scenario() -> None:
        pool = HandlerPool(4, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue(max_messages=2000)
        handled = 0

        async def handler() -> None:
            nonlocal handled
            handled += 1

        with counting_tasks() as created:
            for message in _messages(queue, 1000):
                pool.submit(queue, [message], handler)
            await pool.drain(5)
        assert handled == 1000
        assert created[0] <= 4, f"{created[0]} tasks for 1,000 messages"
        assert queue.offsets.commit_offset == 1000

    asyncio.run(scenario())


def test_a_tailing_consumers_pulls_start_no_task_each_and_close_leaves_none() -> None:
    """A consumer at the head of its queues gets a few messages a pull: one worker waits
    for the next pull's instead of ending, and a handler that never waits is run by that
    one worker, not by a task started for each message queued."""

    async def scenario() -> None:
        pool = HandlerPool(16, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue(max_messages=2000)
        handled = 0

        async def handler(message: Message) -> None:
            nonlocal handled
            handled += 1

        with counting_tasks() as created:
            for _ in range(200):
                pool.submit_each(queue, _messages(queue, 3), handler)
                for _turn in range(3):  # the pull loop waits for its next answer
                    await asyncio.sleep(0)
        assert handled == 600
        assert created[0] == 1, f"{created[0]} tasks for 200 pulls"
        assert await pool.drain(5) == 0
        await asyncio.sleep(0)
        assert asyncio.all_tasks() == {asyncio.current_task()}, "close left a worker behind"

    asyncio.run(scenario())


def test_a_call_submitted_as_the_last_worker_ends_is_still_run() -> None:
    async def scenario() -> None:
        pool = HandlerPool(1, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue()
        first, second = _messages(queue, 2)
        done: list[int] = []

        async def record_first() -> None:
            done.append(first.queue_offset)

        async def record_second() -> None:
            done.append(second.queue_offset)

        pool.submit(queue, [first], record_first)
        await pool.drain(5)  # the worker took the call and ended: the FIFO was empty
        pool.submit(queue, [second], record_second)
        await pool.drain(5)
        assert done == [0, 1]
        assert queue.offsets.commit_offset == 2

    asyncio.run(scenario())


def test_a_pulls_messages_run_concurrently_and_a_failing_one_is_retried_alone() -> None:
    """submit_each: one run per pull, yet each message is its own handler call."""

    async def scenario() -> None:
        stats = ConsumeStats()
        pool = HandlerPool(4, max_attempts=3, retry_backoff_s=0.001, stats=stats)
        queue = _queue()
        messages = _messages(queue, 10)
        release = asyncio.Event()
        running = peak = 0
        calls: list[int] = []

        async def handler(message: Message) -> None:
            nonlocal running, peak
            calls.append(message.queue_offset)
            running += 1
            peak = max(peak, running)
            try:
                await release.wait()
                if message.queue_offset == 3 and calls.count(3) < 3:
                    raise RuntimeError("flaky")
            finally:
                running -= 1

        pool.submit_each(queue, messages, handler)
        assert pool.running == 10
        while running < 4:
            await asyncio.sleep(0)
        assert peak == 4, "the pool's concurrency bounds a run's messages too"
        assert queue.commit_due() == 0, "nothing finished yet: the commit stays at 0"
        release.set()
        assert await pool.drain(5) == 0
        assert sorted(set(calls)) == list(range(10))
        assert calls.count(3) == 3 and len(calls) == 12
        assert (stats.handled, stats.failed_attempts, stats.skipped) == (10, 2, 0)
        assert queue.commit_due() == 10

    asyncio.run(scenario())


def test_a_run_cancelled_at_close_leaves_its_untaken_messages_uncommitted() -> None:
    async def scenario() -> None:
        pool = HandlerPool(1, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue()
        messages = _messages(queue, 3)
        never = asyncio.Event()

        async def handler(message: Message) -> None:
            if message.queue_offset == 1:
                await never.wait()

        pool.submit_each(queue, messages, handler)
        assert await pool.drain(0.05) == 2, "the hung call and the one never started"
        assert queue.offsets.commit_offset == 1
        assert pool.running == 0

    asyncio.run(scenario())


def test_calls_after_the_waiting_worker_was_cancelled_still_run() -> None:
    async def scenario() -> None:
        pool = HandlerPool(4, max_attempts=1, retry_backoff_s=0, stats=ConsumeStats())
        queue = _queue()
        done: list[int] = []

        async def handler(message: Message) -> None:
            done.append(message.queue_offset)

        pool.submit_each(queue, _messages(queue, 2), handler)
        while len(done) < 2 or not pool._standby:
            await asyncio.sleep(0)
        (waiting,) = pool._workers
        waiting.cancel()  # as a loop shutting down cancels every task
        await asyncio.gather(waiting, return_exceptions=True)

        pool.submit_each(queue, _messages(queue, 2), handler)
        assert await pool.drain(5) == 0
        assert done == [0, 1, 2, 3]

    asyncio.run(scenario())


def test_no_call_of_a_dropped_queue_starts_and_its_messages_stay_unfinished() -> None:
    """A handler that drops its queue (the consumer stopping delivery at a count) is the
    last one called: the rest of the pull is never handed out, and drain waits for
    nothing (no "outlived the close timeout")."""

    async def scenario() -> None:
        stats = ConsumeStats()
        sent_back: list[int] = []

        async def send_back(_queue: Any, message: Message, _failure: Exception) -> bool:
            sent_back.append(message.queue_offset)
            return True

        pool = HandlerPool(1, max_attempts=3, retry_backoff_s=0.001, stats=stats,
                           send_back=send_back)  # fmt: skip
        queue, other = _queue(), _queue()
        seen: list[int] = []

        async def handle(message: Message) -> None:
            seen.append(message.queue_offset)
            if message.queue_offset == 2:
                queue.dropped = True

        async def fails() -> None:
            other.dropped = True
            raise RuntimeError("stopped mid-way")

        pool.submit_each(queue, _messages(queue, 6), handle)
        (failing,) = _messages(other, 1)
        pool.submit(other, [failing], fails)
        assert await pool.drain(5) == 0
        assert seen == [0, 1, 2]
        assert queue.commit_due() == 3  # 3-5 were never handed out
        # A failure of a dropped queue is not sent back: its next owner has it again.
        assert sent_back == [] and other.commit_due() == 0
        assert stats.handled == 3

    asyncio.run(scenario())
