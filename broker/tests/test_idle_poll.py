"""IdlePoll: the loop polls after an answer while requests come back within the window,
extended by later answers, cut short by background work, and not at all when requests
come further apart or the window is 0."""

from __future__ import annotations

import asyncio
import time

from metaq.broker.idle_poll import IdlePoll
from metaq.testing.waiting import wait_until_async


def run(poll: IdlePoll, *gaps_s: float) -> list[float]:
    """Answer a request after each gap (each counted from the answer before, on the
    loop); the episodes polled."""
    episodes: list[float] = []
    poll._on_polled = episodes.append

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def answer(rest: tuple[float, ...]) -> None:
            poll.answered(True)
            if rest:
                loop.call_later(rest[0], answer, rest[1:])
            else:
                done.set_result(None)

        loop.call_later(gaps_s[0], answer, gaps_s[1:])
        await done

        async def settled() -> bool:
            return not poll.polling

        await wait_until_async(settled, 5.0, "the poll ended")

    asyncio.run(scenario())
    return episodes


def test_a_request_answered_soon_after_the_last_answer_starts_a_poll() -> None:
    episodes = run(IdlePoll(200_000), 0.0, 0.001)

    assert len(episodes) == 1
    assert episodes[0] >= 0.200


def test_requests_further_apart_than_the_window_never_start_one() -> None:
    assert run(IdlePoll(2_000), 0.0, 0.050, 0.050) == []


def test_an_answer_while_polling_extends_the_same_episode() -> None:
    # A window long enough that the third answer, due 59 ms after the second, still lands
    # inside it when a loaded machine runs the loop late.
    poll = IdlePoll(1_000_000)
    turns = 0
    first_turn = poll._looper._poll

    def counting() -> None:
        nonlocal turns
        turns += 1
        first_turn()

    poll._looper._poll = counting  # type: ignore[method-assign]
    answered_at: list[float] = []
    answer = poll.answered

    def answered(to_request: bool) -> None:
        answered_at.append(time.perf_counter())
        answer(to_request)

    poll.answered = answered  # type: ignore[method-assign]
    episodes = run(poll, 0.0, 0.001, 0.059)

    assert len(episodes) == 1
    assert episodes[0] >= answered_at[2] - answered_at[1] + 1.000
    assert turns > 10  # the loop did go round, polling, rather than sleep


def test_background_work_stops_the_poll() -> None:
    poll = IdlePoll(10_000_000)  # ten seconds: only ``busy`` can end it in time
    flips = iter([False, False, True])
    poll.busy = lambda: next(flips)

    episodes = run(poll, 0.0, 0.001)

    assert len(episodes) == 1
    # ``busy`` said yes on its third call and was not asked again: had the poll gone on,
    # its next turn would have raised StopIteration and left it polling.
    assert next(flips, None) is None


def test_a_window_of_zero_never_polls() -> None:
    assert run(IdlePoll(0), 0.0, 0.0001, 0.0001) == []
