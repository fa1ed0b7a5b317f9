"""The failover comparison's figures (``make bench-failover-compare``) over hand-made
histories: kill to the next acknowledged send, loss as the checker counts it, the ratios."""

from __future__ import annotations

from typing import Any

import pytest
from chaoslib.checker import check
from chaoslib.compare import failover_figures, table


def _sends(*sends: tuple[float, float, str], lost: str = "") -> list[dict[str, Any]]:
    """A history of one producer's sends (invoked, answered, ok/info), each read back but
    ``lost``; one kill of the master at t = 10."""
    events: list[dict[str, Any]] = [{"t": 0.0, "type": "scenario", "name": "hand-made"}]
    for n, (invoked, answered, kind) in enumerate(sends):
        sent = {"id": f"m{n}", "group": "a", "producer": "main-a", "topic": "chaos-a"}
        events.append({"t": invoked, "type": "invoke", **sent})
        events.append({"t": answered, "type": kind, **sent})
    events.append({"t": 10.0, "type": "fault", "phase": "start", "fault": "kill",
                   "node": "a0", "group": "a", "failover": True})  # fmt: skip
    events.sort(key=lambda e: e["t"])
    events += [{"t": 50.0, "type": "read", "id": f"m{n}", "consumer": "c"}
               for n in range(len(sends)) if f"m{n}" != lost]  # fmt: skip
    events.append({"t": 51.0, "type": "drain", "ok": True, "behind": {}})
    return events


def test_kill_to_next_ack_counts_the_first_send_begun_after_the_kill() -> None:
    # m1's answer was on its way when the kill came: it says nothing about the new master.
    result = check(_sends((9.0, 9.1, "ok"), (9.99, 10.01, "ok"), (10.02, 12.02, "info"),
                          (12.03, 13.5, "ok"), (13.6, 13.7, "ok")))  # fmt: skip
    assert result.failover_resumes == [3.5]


def test_a_kill_no_send_recovered_from_has_no_resume_time() -> None:
    result = check(_sends((9.0, 9.1, "ok"), (10.5, 12.5, "info")))
    assert result.failover_resumes == []
    assert failover_figures({"metaq": result})["failover_p50_s_metaq"] is None
    assert failover_figures({"metaq": result})["kills_metaq"] == 1


def test_figures_give_each_system_its_p50_max_loss_and_metaq_p50_over_each_peer() -> None:
    metaq = check(_sends((9.0, 9.1, "ok"), (10.1, 10.5, "ok")))
    kafka = check(_sends((9.0, 9.1, "ok"), (10.1, 20.0, "ok")))
    rocketmq = check(_sends((9.0, 9.1, "ok"), (10.1, 30.0, "ok"), lost="m0"))
    figures = failover_figures({"metaq": metaq, "rocketmq": rocketmq, "kafka": kafka})
    assert figures["failover_p50_s_metaq"] == 0.5
    assert figures["failover_max_s_kafka"] == 10.0
    assert figures["failover_p50_vs_kafka_ratio"] == 0.05
    assert figures["failover_p50_vs_rocketmq_ratio"] == 0.025
    assert (figures["lost_acked_metaq"], figures["lost_acked_kafka"],
            figures["lost_acked_rocketmq"]) == (0, 0, 1)  # fmt: skip
    assert figures["violations_rocketmq"] == 1
    assert figures["completed_rocketmq"] is True
    assert "| rocketmq | 1 | 20.00 | 20.00 | 2 | 1 | 1 |" in table({"rocketmq": rocketmq})


def test_a_ratio_needs_both_sides() -> None:
    figures = failover_figures({"kafka": check(_sends((10.1, 12.0, "ok")))})
    assert figures["failover_p50_vs_kafka_ratio"] is None
    assert figures["failover_p50_vs_rocketmq_ratio"] is None


def test_an_unknown_system_is_named() -> None:
    with pytest.raises(ValueError, match="unknown system 'nats'"):
        failover_figures({"nats": check(_sends((10.1, 12.0, "ok")))})


def test_a_run_that_broke_off_reports_no_loss_count() -> None:
    events = _sends((9.0, 9.1, "ok"), (10.1, 10.5, "ok"), lost="m1")
    events.append({"t": 52.0, "type": "check", "name": "scenario-completed", "ok": False,
                   "detail": "RuntimeError: kafka-storage format failed"})  # fmt: skip
    figures = failover_figures({"kafka": check(events)})
    assert figures["completed_kafka"] is False
    assert figures["lost_acked_kafka"] is None
    assert "| kafka | 1 | 0.50 | 0.50 | 2 | - | 2 |" in table({"kafka": check(events)})
