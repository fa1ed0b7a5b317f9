"""Parked pulls: woken by the dispatcher's report, expired at their deadline, released at
shutdown, forgotten with their connection."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from metaq.broker.long_poll import LongPolls, PendingPull


class FakeResponder:
    def __init__(self, connection_id: int = 1) -> None:
        self.connection_id = connection_id
        self.closed = False

    def respond(self, parts: list[bytes | bytearray | memoryview]) -> None:
        raise AssertionError("LongPolls answers through its retry callback only")


def pull(
    loop: asyncio.AbstractEventLoop, timeout_s: float, queue_id: int = 0, conn: int = 1
) -> PendingPull:
    return PendingPull(
        FakeResponder(conn), 7, "t", queue_id, 0, 32, 1 << 20, None, loop.time() + timeout_s
    )


def run(scenario: Callable[[asyncio.AbstractEventLoop], Awaitable[None]]) -> None:
    async def main() -> None:
        await scenario(asyncio.get_running_loop())

    asyncio.run(main())


def test_a_report_from_the_dispatcher_thread_wakes_the_pulls_of_that_queue_only() -> None:
    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        woken: list[tuple[int, bool]] = []
        answered = asyncio.Event()

        def retry(p: PendingPull, final: bool) -> None:
            woken.append((p.queue_id, final))
            answered.set()

        polls = LongPolls(loop, retry)
        polls.park(pull(loop, 30, queue_id=1))
        polls.park(pull(loop, 30, queue_id=2))

        thread = threading.Thread(target=polls.on_dispatch, args=({(b"t", 1)},))
        thread.start()
        thread.join()
        await asyncio.wait_for(answered.wait(), 5)

        assert woken == [(1, False)]
        assert polls.parked == 1
        assert polls.woken == 1

    run(scenario)


def test_a_report_made_on_the_loop_answers_at_once() -> None:
    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        woken: list[int] = []
        polls = LongPolls(loop, lambda p, _final: woken.append(p.queue_id))
        polls.park(pull(loop, 30, queue_id=3))

        polls.on_dispatch({(b"t", 3)})  # the appender dispatched its own records

        assert woken == [3], "answered within the call, not a loop turn later"
        assert polls.parked == 0

    run(scenario)


def test_an_unanswered_pull_is_answered_finally_at_its_deadline() -> None:
    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        done: asyncio.Future[bool] = loop.create_future()
        polls = LongPolls(loop, lambda _p, final: done.set_result(final))
        began = loop.time()
        polls.park(pull(loop, 0.05))

        assert await asyncio.wait_for(done, 5) is True
        assert loop.time() - began >= 0.04
        assert polls.parked == 0

    run(scenario)


def test_pulls_of_a_closed_connection_are_dropped_and_never_answered() -> None:
    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        answered: list[int] = []
        polls = LongPolls(loop, lambda p, _final: answered.append(p.responder.connection_id))
        first, second = pull(loop, 30, conn=1), pull(loop, 30, conn=2)
        polls.park(first)
        polls.park(second)

        polls.drop_connection(1)
        assert polls.parked == 1
        assert first.timer is None, "the dropped pull's deadline timer still runs"
        assert polls.release_all() == 1

        assert answered == [2]
        assert second.timer is None

    run(scenario)


def test_nothing_crosses_threads_when_nothing_is_parked() -> None:
    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        class CountingLoop:
            calls = 0

            def call_soon_threadsafe(self, *_args: object) -> None:
                CountingLoop.calls += 1

        polls = LongPolls(loop, lambda _p, _f: None)
        polls._loop = CountingLoop()  # type: ignore[assignment]
        polls.on_dispatch({(b"t", 0)})
        assert CountingLoop.calls == 0

    run(scenario)
