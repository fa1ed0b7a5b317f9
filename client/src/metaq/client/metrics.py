"""Prometheus metrics of an application's producers and push consumers: an optional
collector (prometheus_client, a dependency of the client already).

::

    metrics = ClientMetrics()               # registers with prometheus_client's REGISTRY
    producer = Producer(nameservers, observers=[metrics])
    consumer = PushConsumer(nameservers, "billing", observers=[metrics])
    prometheus_client.start_http_server(9100)   # or the application's own /metrics

One collector serves any number of clients; series are labelled by producer or
consumer group and topic:

- ``metaq_client_send_latency_seconds`` (histogram): a send from call to the broker's
  answer, retries included; ``metaq_client_sent_messages_total`` counts what it stored;
- ``metaq_client_send_retries_total``, ``metaq_client_send_failures_total``: tries again
  after a retriable error, and sends that failed after their retries;
- ``metaq_client_pull_latency_seconds`` (histogram): one pull, a long poll's wait
  included (an idle queue's pulls last the long-poll timeout);
- ``metaq_client_pulled_messages_total``; ``metaq_client_consumed_messages_total`` by
  ``outcome`` (``ok``, ``failed``, ``later``) and ``metaq_client_consume_latency_seconds``
  (histogram) for handler calls;
- ``metaq_client_sent_back_messages_total`` by ``target`` (the group's retry or
  dead-letter topic).

No ``*_created`` series (as the servers export none), without changing that setting for
the rest of the application's metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from metaq.client.handlers import ReconsumeLater
from metaq.client.message import Message
from metaq.client.observe import Observer
from metaq.client.results import SendResult
from metaq.client.retry import PROP_RETRY_TOPIC

__all__ = ["ClientMetrics"]

_SEND_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_PULL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0)


class ClientMetrics(Observer, Collector):
    """Give it to clients as an observer; it registers itself with ``registry``
    (prometheus_client's default; None: register it yourself)."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        own = self._own = CollectorRegistry(auto_describe=True)
        by = ["group", "topic"]
        self.send_latency = Histogram(
            "metaq_client_send_latency_seconds",
            "Send from call to answer, retries included, by producer group and topic",
            by, buckets=_SEND_BUCKETS, registry=own,
        )  # fmt: skip
        self.sent_messages = Counter(
            "metaq_client_sent_messages", "Messages stored by sends", by, registry=own
        )
        self.retries = Counter(
            "metaq_client_send_retries",
            "Sends tried again after a retriable error",
            by,
            registry=own,
        )
        self.failures = Counter(
            "metaq_client_send_failures", "Sends that failed after their retries", by, registry=own
        )
        self.pull_latency = Histogram(
            "metaq_client_pull_latency_seconds",
            "One pull, a long poll's wait included, by consumer group and topic",
            by, buckets=_PULL_BUCKETS, registry=own,
        )  # fmt: skip
        self.pulled_messages = Counter(
            "metaq_client_pulled_messages", "Messages pulled", by, registry=own
        )
        self.consumed_messages = Counter(
            "metaq_client_consumed_messages",
            "Handler calls per message, by outcome (ok, failed, later)",
            [*by, "outcome"],
            registry=own,
        )
        self.consume_latency = Histogram(
            "metaq_client_consume_latency_seconds",
            "Handler calls, by consumer group and topic",
            by, buckets=_SEND_BUCKETS, registry=own,
        )  # fmt: skip
        self.sent_back_messages = Counter(
            "metaq_client_sent_back_messages",
            "Messages whose handler failed, sent to the group's retry or dead-letter topic",
            ["group", "target"],
            registry=own,
        )
        if registry is not None:
            registry.register(self)

    # --- Collector ----------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        for family in self._own.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family

    # --- Observer -----------------------------------------------------------------------

    def sent(
        self, group: str, topic: str, results: Sequence[SendResult], started_ms: int, seconds: float
    ) -> None:
        self.send_latency.labels(group, topic).observe(seconds)
        self.sent_messages.labels(group, topic).inc(len(results))

    def send_failed(self, group: str, topic: str, error: BaseException, seconds: float) -> None:
        self.send_latency.labels(group, topic).observe(seconds)
        self.failures.labels(group, topic).inc()

    def send_retried(self, group: str, topic: str, error: BaseException) -> None:
        self.retries.labels(group, topic).inc()

    def pulled(self, group: str, topic: str, broker: str, count: int, seconds: float) -> None:
        self.pull_latency.labels(group, topic).observe(seconds)
        if count:
            self.pulled_messages.labels(group, topic).inc(count)

    def consumed(
        self,
        group: str,
        broker: str,
        message: Message,
        error: BaseException | None,
        started_ms: int,
        seconds: float,
    ) -> None:
        topic = message.properties.get(PROP_RETRY_TOPIC) or message.topic
        if error is None:
            outcome = "ok"
        else:
            outcome = "later" if isinstance(error, ReconsumeLater) else "failed"
        self.consumed_messages.labels(group, topic, outcome).inc()
        self.consume_latency.labels(group, topic).observe(seconds)

    def sent_back(self, group: str, broker: str, message: Message, target: str) -> None:
        self.sent_back_messages.labels(group, target).inc()
