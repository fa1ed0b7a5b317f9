"""A real broker announces itself and its topics to real nameservers, and leaves them."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1.control_pb2_grpc import NameServerStub
from metaq.testing import BrokerProcess, run_async
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.waiting import deadline


def registered(
    cluster_factory: Callable[[ClusterBuilder], Cluster], group: str
) -> tuple[str, BrokerProcess]:
    """A nameserver whose expiry is far off and a broker of ``group`` registered there: its
    address and the broker."""
    cluster = cluster_factory(
        ClusterBuilder(groups=(group,), nameserver_args=("--broker-expiry-s", "30"))
    )
    return cluster.nameserver_addresses[0], cluster.broker(group)


def _route(address: str, topic: str) -> pb.TopicRoute | None:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = NameServerStub(channel).GetRoute(pb.GetRouteRequest(topic=topic), timeout=5)
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return reply.route


def _wait_for_route(address: str, topic: str, present: bool, timeout_s: float) -> float:
    """Poll the route until the topic is (or is no longer) routed; return seconds taken."""
    began = time.monotonic()
    while (_route(address, topic) is not None) != present:
        if time.monotonic() - began > timeout_s:
            state = "appear" if present else "disappear"
            pytest.fail(f"route of {topic!r} did not {state} within {timeout_s} s")
        time.sleep(0.02)  # poll interval of a deadline-bounded wait
    return time.monotonic() - began


def test_a_topic_created_on_a_broker_is_routed_by_the_nameserver(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    nameserver, broker = registered(cluster_factory, "broker-a")
    run_async(
        Admin().put_topic(broker.http_url, "orders", TopicSettings(read_queues=4, write_queues=4))
    )

    _wait_for_route(nameserver, "orders", present=True, timeout_s=10)
    route = _route(nameserver, "orders")

    assert route is not None
    assert route.SerializeToString()  # a real, non-empty answer
    text = str(route)
    assert "broker-a" in text and f"{broker.data_host}:{broker.data_port}" in text


def test_a_killed_broker_leaves_the_routes_at_once(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    nameserver, broker = registered(cluster_factory, "broker-k")
    run_async(
        Admin().put_topic(broker.http_url, "payments", TopicSettings(read_queues=4, write_queues=4))
    )
    _wait_for_route(nameserver, "payments", present=True, timeout_s=10)

    broker.kill()

    # Expiry is 30 s; the dropped session must take it out long before that.
    _wait_for_route(nameserver, "payments", False, timeout_s=deadline(5))


def test_a_broker_that_stops_cleanly_unregisters(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    nameserver, broker = registered(cluster_factory, "broker-s")
    run_async(
        Admin().put_topic(broker.http_url, "audit", TopicSettings(read_queues=4, write_queues=4))
    )
    _wait_for_route(nameserver, "audit", present=True, timeout_s=10)

    assert broker.terminate() == 0

    _wait_for_route(nameserver, "audit", present=False, timeout_s=5)
