"""Hooks into the producer's and the push consumer's work, for tracing and metrics.

An :class:`Observer` hears of every send, retry, pull and handler call of the clients it
is given to (``Producer(observers=...)``, ``PushConsumer(observers=...)``): message
trace (:mod:`metaq.client.trace`) and the Prometheus collector
(:mod:`metaq.client.metrics`) are observers. A client with none pays one falsy check per
operation. Observers run on the client's event loop, inside the send or handler path:
each call must be quick and must not raise (what it needs to do slowly, it queues).
"""

from __future__ import annotations

from collections.abc import Sequence

from metaq.client.message import Message
from metaq.client.results import SendResult


class Observer:
    """What a client reports; every method does nothing unless overridden."""

    def sent(
        self, group: str, topic: str, results: Sequence[SendResult], started_ms: int, seconds: float
    ) -> None:
        """Producer group ``group`` stored ``results`` in ``topic``: the send began at
        ``started_ms`` (wall clock) and took ``seconds`` (retries included)."""

    def send_failed(self, group: str, topic: str, error: BaseException, seconds: float) -> None:
        """A send of ``group`` to ``topic`` failed after its retries."""

    def send_retried(self, group: str, topic: str, error: BaseException) -> None:
        """A send of ``group`` to ``topic`` is being tried again after ``error``."""

    def pulled(self, group: str, topic: str, broker: str, count: int, seconds: float) -> None:
        """Consumer group ``group`` pulled ``count`` messages of ``topic`` from broker
        group ``broker`` in ``seconds`` (a long poll that waited counts its wait)."""

    def consumed(
        self,
        group: str,
        broker: str,
        message: Message,
        error: BaseException | None,
        started_ms: int,
        seconds: float,
    ) -> None:
        """A handler of ``group`` was called for ``message`` (pulled from broker group
        ``broker``) at ``started_ms`` and took ``seconds``; ``error`` is what it raised
        (or ReconsumeLater), None when it succeeded."""

    def sent_back(self, group: str, broker: str, message: Message, target: str) -> None:
        """``message``, whose handler failed, is stored in ``target`` (the group's retry
        or dead-letter topic) on broker group ``broker``."""

    async def close(self) -> None:
        """The client it observes closes: finish what is queued."""
