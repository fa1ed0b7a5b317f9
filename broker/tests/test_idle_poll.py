"""IdlePoll: after an answer the loop keeps polling for its window, extended by later
answers, cut short by background work, and not at all with a window of 0."""

from __future__ import annotations

import asyncio
import time

from metaq.broker.idle_poll import IdlePoll
from metaq.common.testing import wait_until_async


def run(poll: IdlePoll, *answers_at_s: float) -> list[float]:
    """Call ``answered`` at each offset from now (on the loop); the episodes polled."""
    episodes: list[float] = []
    poll._on_polled = episodes.append

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        for at in answers_at_s:
            loop.call_later(at, poll.answered)

        async def done() -> bool:
            return len(episodes) >= 1 and not poll.polling

        await wait_until_async(done, 5.0, "the poll ended")

    asyncio.run(scenario())
    return episodes


def test_polls_for_the_window_after_an_answer() -> None:
    episodes = run(IdlePoll(20_000), 0.0)

    assert len(episodes) == 1
    assert episodes[0] >= 0.020


def test_an_answer_while_polling_extends_the_same_episode() -> None:
    poll = IdlePoll(50_000)
    turns = 0
    first_turn = poll._poll

    def counting() -> None:
        nonlocal turns
        turns += 1
        first_turn()

    poll._poll = counting  # type: ignore[method-assign]
    answered_at: list[float] = []
    answer = poll.answered

    def answered() -> None:
        answered_at.append(time.perf_counter())
        answer()

    poll.answered = answered  # type: ignore[method-assign]
    episodes = run(poll, 0.0, 0.030)

    assert len(episodes) == 1
    assert episodes[0] >= answered_at[1] - answered_at[0] + 0.050
    assert turns > 10  # the loop did go round, polling, rather than sleep


def test_background_work_stops_the_poll() -> None:
    poll = IdlePoll(10_000_000)  # ten seconds: only ``busy`` can end it in time
    began = time.perf_counter()
    flips = iter([False, False, True])
    poll.busy = lambda: next(flips)

    episodes = run(poll, 0.0)

    assert len(episodes) == 1
    assert time.perf_counter() - began < 5.0


def test_a_window_of_zero_never_polls() -> None:
    poll = IdlePoll(0)

    async def scenario() -> None:
        poll.answered()
        assert not poll.polling

    asyncio.run(scenario())
