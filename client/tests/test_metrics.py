"""The client's Prometheus collector: what each report it hears adds to its series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metaq.client.errors import ConnectionLost
from metaq.client.handlers import ReconsumeLater
from metaq.client.message import Message
from metaq.client.metrics import ClientMetrics
from metaq.client.results import SendResult, SendStatus
from metaq.client.retry import PROP_RETRY_TOPIC
from metaq.common.names import retry_topic


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_sends_retries_pulls_and_handler_calls_are_counted_and_timed() -> None:
    registry = CollectorRegistry()
    metrics = ClientMetrics(registry)
    ok = SendResult(SendStatus.OK, "ab" * 16, "orders", "broker-a", 0, 1)
    metrics.sent("P", "orders", [ok, ok], 1, 0.003)
    metrics.send_retried("P", "orders", ConnectionLost("a:1", "gone"))
    metrics.send_failed("P", "orders", ConnectionLost("a:1", "gone"), 1.5)
    metrics.pulled("G", "orders", "broker-a", 32, 0.02)
    metrics.pulled("G", "orders", "broker-a", 0, 15.0)
    first = Message("orders", b"x")
    retried = Message(retry_topic("G"), b"x", properties={PROP_RETRY_TOPIC: "orders"})
    metrics.consumed("G", "broker-a", first, ValueError("no"), 1, 0.001)
    metrics.consumed("G", "broker-a", retried, ReconsumeLater("later"), 1, 0.001)
    metrics.consumed("G", "broker-a", retried, None, 1, 0.001)
    metrics.sent_back("G", "broker-a", first, retry_topic("G"))
    got = _samples(registry)
    p, g = (("group", "P"), ("topic", "orders")), (("group", "G"), ("topic", "orders"))
    assert got[("metaq_client_sent_messages_total", p)] == 2
    assert got[("metaq_client_send_latency_seconds_count", p)] == 2  # the stored and the failed
    assert got[("metaq_client_send_latency_seconds_bucket", (*p[:1], ("le", "0.005"), *p[1:]))] == 1
    assert got[("metaq_client_send_retries_total", p)] == 1
    assert got[("metaq_client_send_failures_total", p)] == 1
    assert got[("metaq_client_pulled_messages_total", g)] == 32
    assert got[("metaq_client_pull_latency_seconds_count", g)] == 2
    assert got[("metaq_client_pull_latency_seconds_sum", g)] == 15.02
    for outcome in ("ok", "failed", "later"):  # a retry counts under its first topic
        assert got[("metaq_client_consumed_messages_total", (*g[:1], ("outcome", outcome),
                                                             *g[1:]))] == 1  # fmt: skip
    assert got[("metaq_client_sent_back_messages_total",
                (("group", "G"), ("target", retry_topic("G"))))] == 1  # fmt: skip
    assert not [name for name, _ in got if name.endswith("_created")]


def test_without_a_registry_it_registers_nowhere() -> None:
    metrics = ClientMetrics(None)
    registry = CollectorRegistry()
    assert b"metaq_client" not in generate_latest(registry)
    registry.register(metrics)
    assert b"metaq_client_send_latency_seconds" in generate_latest(registry)
