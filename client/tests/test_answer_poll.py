"""Answer polling: the loop polls from a send to its answer, within the window, and only
while answers keep coming back within it and the next send follows at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from metaq.client.answer_poll import AnswerPoll
from metaq.client.producer import ProducerConfig


async def turns_until(condition: Callable[[], bool], deadline_s: float = 2.0) -> int:
    """Let the loop run until ``condition`` holds; how many turns that took."""
    turns = 0
    deadline = time.perf_counter() + deadline_s
    while not condition():
        assert time.perf_counter() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0)
        turns += 1
    return turns


def spin(seconds: float) -> None:
    """Hold the loop's thread, as a slow answer would keep the producer waiting."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def test_the_loop_polls_from_a_send_until_its_answer() -> None:
    async def scenario() -> AnswerPoll:
        poll = AnswerPoll(window_us=1_000_000)
        poll.waiting()
        assert poll.polling
        for _ in range(10):  # still polling while the answer is out
            await asyncio.sleep(0)
            assert poll.polling
        poll.answered()
        await turns_until(lambda: not poll.polling)
        return poll

    poll = asyncio.run(scenario())
    assert poll.polled_s > 0


def test_polling_ends_at_the_window_without_an_answer() -> None:
    async def scenario() -> float:
        poll = AnswerPoll(window_us=2_000)
        began = time.perf_counter()
        poll.waiting()
        await turns_until(lambda: not poll.polling)
        return time.perf_counter() - began

    assert asyncio.run(scenario()) >= 0.002


def test_a_slow_answer_stops_polling_and_a_quick_one_restarts_it() -> None:
    async def scenario() -> list[bool]:
        poll = AnswerPoll(window_us=500)
        seen = []
        poll.waiting()
        spin(0.002)  # the answer takes four windows
        poll.answered()
        await turns_until(lambda: not poll.polling)
        poll.waiting()
        seen.append(poll.polling)  # out of rhythm: sleeps for this answer
        poll.answered()  # which came at once
        poll.waiting()
        seen.append(poll.polling)  # back in rhythm
        poll.answered()
        await turns_until(lambda: not poll.polling)
        return seen

    assert asyncio.run(scenario()) == [False, True]


def test_a_send_long_after_the_last_answer_does_not_poll() -> None:
    """A producer sending at a rate (the next send at its next tick, whatever the answer)
    waits on no answer: polling would only spin. One sending one message at a time sends
    again right after each answer, and is polled for."""

    async def scenario() -> list[bool]:
        poll = AnswerPoll(window_us=500)
        seen = []
        poll.waiting()
        poll.answered()  # quick: in rhythm
        await turns_until(lambda: not poll.polling)
        spin(0.002)  # the next tick comes four windows later
        poll.waiting()
        seen.append(poll.polling)
        poll.answered()
        poll.waiting()  # at once: the caller was waiting on that answer
        seen.append(poll.polling)
        poll.answered()
        await turns_until(lambda: not poll.polling)
        return seen

    assert asyncio.run(scenario()) == [False, True]


def test_a_send_at_a_tick_inside_a_long_window_does_not_poll() -> None:
    """The window bounds how long an answer is polled for, not how soon the caller must
    send again: a producer ticking every millisecond is not waiting on its answers even
    when they come back within a window of several."""

    async def scenario() -> list[bool]:
        poll = AnswerPoll(window_us=5_000)
        seen = []
        poll.waiting()
        poll.answered()
        await turns_until(lambda: not poll.polling)
        spin(0.001)  # the next tick
        poll.waiting()
        seen.append(poll.polling)
        poll.answered()
        poll.waiting()  # at once
        seen.append(poll.polling)
        poll.answered()
        await turns_until(lambda: not poll.polling)
        return seen

    assert asyncio.run(scenario()) == [False, True]


def test_a_window_of_zero_never_polls() -> None:
    async def scenario() -> AnswerPoll:
        poll = AnswerPoll(window_us=0)
        poll.waiting()
        await asyncio.sleep(0)
        assert not poll.polling
        poll.answered()
        return poll

    assert asyncio.run(scenario()).polled_s == 0


@pytest.mark.parametrize("window", [-1, 10_001])
def test_the_producer_refuses_a_window_out_of_range(window: int) -> None:
    with pytest.raises(ValueError, match="answer_poll_us must be 0-10000"):
        ProducerConfig(answer_poll_us=window).validate()
