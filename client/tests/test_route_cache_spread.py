"""Which nameserver a RouteCache asks first."""

from __future__ import annotations

from metaq.client.routes import RouteCache

NAMESERVERS = ("127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003")


def test_clients_listing_nameservers_in_one_order_start_at_each_of_them() -> None:
    firsts = {RouteCache(NAMESERVERS).preferred_nameserver for _ in range(200)}
    assert firsts == set(NAMESERVERS)


def test_an_operators_tool_asks_the_nameservers_in_the_order_given() -> None:
    firsts = {RouteCache(NAMESERVERS, spread=False).preferred_nameserver for _ in range(50)}
    assert firsts == {NAMESERVERS[0]}
