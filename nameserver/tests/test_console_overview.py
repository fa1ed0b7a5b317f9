"""The overview's pure parts: the samples' rings and rates, the sparkline, and the colour
and reason of a broker group."""

from __future__ import annotations

import re

from metaq.client.admin import BrokerHealth
from metaq.common.model import BrokerKey, BrokerState, BrokerView, GroupControl, GroupView, Role
from metaq.nameserver.console.overview import group_status
from metaq.nameserver.console.samples import WINDOW_S, Samples
from metaq.nameserver.console.sparkline import sparkline


def test_a_ring_keeps_fifteen_minutes_and_rates_leave_a_gap_where_a_count_fell() -> None:
    samples = Samples(interval_s=30.0)
    assert samples.capacity == 31
    for i in range(40):
        samples.add("in:t", 100 * i, at=30.0 * i)
    assert len(samples.levels("in:t")) == 31
    assert samples.rates("in:t")[-1] == 100 / 30
    samples.add("in:t", 5, at=40 * 30.0)  # a topic made anew
    samples.add("in:t", 65, at=41 * 30.0)
    assert samples.rates("in:t")[-2:] == [None, 2.0]
    samples.forget_older_than(41 * 30.0 + 1)
    assert samples.keys("in:") == []
    assert Samples(interval_s=0.1).capacity == 240  # bounded whatever the interval
    assert WINDOW_S == 900


def test_a_sparkline_is_inline_svg_named_by_its_figures_with_gaps_for_unknowns() -> None:
    svg = sparkline([0.0, 5.0, None, 10.0, 2.5], "orders in", " msg/s")
    assert svg.startswith("<svg") and "<script" not in svg
    assert 'aria-label="orders in: now 2.5 msg/s, lowest 0 msg/s, highest 10 msg/s"' in svg
    lines = re.findall(r'<polyline points="([^"]+)"/>', svg)
    assert len(lines) == 2  # the unknown splits the line
    assert lines[0].split()[0] == "0.0,23.0"  # zero at the bottom
    assert "1.0" in lines[1].split()[0]  # the highest at the top
    assert "collecting" in sparkline([3.0], "one sample")


def _broker(broker_id: int, role: Role) -> BrokerView:
    state = BrokerState("c", BrokerKey("g", broker_id), role, f"h:{broker_id}", f"h:{broker_id}")
    return BrokerView(state, 0.5, True, 1)


def _health(used: float = 0.3, status: str = "ok", reason: str | None = None) -> BrokerHealth:
    return BrokerHealth(
        status, "g", "master", 1, reason, disk_used_ratio=used, disk_clean_ratio=0.75,
        disk_full_ratio=0.9,
    )  # fmt: skip


def test_a_group_is_green_amber_or_red_with_the_reason() -> None:
    master, slave = _broker(0, Role.MASTER), _broker(1, Role.SLAVE)
    group = GroupView("g", 1, "", (master, slave))
    both = GroupControl("g", 1, 0, (0, 1))
    healthy = {master.state.key: _health(), slave.state.key: _health()}
    assert group_status(group, both, master, healthy).level == "ok"
    alone = GroupControl("g", 1, 0, (0,))
    status = group_status(group, alone, master, healthy)
    assert (status.level, status.reason) == ("warn", "broker 1 is not in sync")
    status = group_status(GroupView("g", 1, "", (master,)), both, master, healthy)
    assert status.reason == "broker 1 is down (in sync, not registered)"
    full = {**healthy, slave.state.key: _health(used=0.8)}
    assert "disk 80.0 %" in group_status(group, both, master, full).reason
    silent = {**healthy, slave.state.key: None}
    assert "does not answer" in group_status(group, both, master, silent).reason
    assert group_status(group, both, None, healthy).level == "down"
    refusing = {**healthy, master.state.key: _health(status="refusing", reason="disk full")}
    status = group_status(group, both, master, refusing)
    assert (status.level, status.reason) == ("down", "master g/0 refuses writes: disk full")
    gone = {slave.state.key: _health()}
    assert group_status(group, both, master, gone).level == "down"
