"""The hot-path histograms render as Prometheus histograms: cumulative buckets, a value
on a bound counted in that bound's bucket, +Inf the count."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metaq.broker.latency import Latency, LatencyFamily, SingleLatency


def test_buckets_are_cumulative_and_a_value_on_a_bound_is_in_its_bucket() -> None:
    latency = Latency((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.002, 0.01, 5.0):
        latency.observe(seconds)
    assert latency.buckets() == [("0.001", 2), ("0.01", 4), ("0.1", 4), ("+Inf", 5)]
    assert latency.sum == 0.0005 + 0.001 + 0.002 + 0.01 + 5.0


def test_a_family_renders_one_histogram_per_label_value_seen() -> None:
    registry = CollectorRegistry(auto_describe=False)
    family = LatencyFamily("x_latency_seconds", "doc", "request_type", (0.1, 1.0))
    registry.register(family)
    single = SingleLatency("y_latency_seconds", "doc", (0.1,))
    registry.register(single)
    family.child("SEND").observe(0.05)
    family.child("SEND").observe(0.5)
    family.child("PULL").observe(2.0)
    single.latency.observe(0.2)

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    send = (("request_type", "SEND"),)
    assert samples[("x_latency_seconds_bucket", (("le", "0.1"), *send))] == 1
    assert samples[("x_latency_seconds_bucket", (("le", "+Inf"), *send))] == 2
    assert samples[("x_latency_seconds_count", send)] == 2
    assert samples[("x_latency_seconds_sum", send)] == 0.55
    assert samples[("x_latency_seconds_count", (("request_type", "PULL"),))] == 1
    assert samples[("y_latency_seconds_bucket", (("le", "0.1"),))] == 0
    assert samples[("y_latency_seconds_count", ())] == 1
