"""The chaos checker over hand-made histories: each rule flags what it names, and only that."""

from __future__ import annotations

from typing import Any

from chaoslib.checker import check


def _history(read: list[str], final_log: list[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"t": 0.0, "type": "scenario", "name": "hand-made"}]
    for n, message_id in enumerate(["m1", "m2", "m3"]):
        sent = {"id": message_id, "group": "a", "producer": "main-a", "topic": "chaos-a"}
        events.append({"t": n + 0.1, "type": "invoke", **sent})
        if message_id != "m3":  # m3's send failed: the master died with it
            events.append({"t": n + 0.2, "type": "ok", **sent})
        else:
            events.append({"t": n + 0.2, "type": "info", **sent, "error": "ConnectionLost"})
    events += [{"t": 5.0, "type": "read", "id": i, "consumer": "c"} for i in read]
    events += [
        {"t": 6.0, "type": "drain", "ok": True, "behind": {}},
        {"t": 7.0, "type": "final_master", "group": "a", "node": "a1"},
        {"t": 8.0, "type": "stored", "node": "a1", "group": "a", "when": "final",
         "ids": final_log},
        {"t": 8.0, "type": "stored", "node": "a0", "group": "a", "when": "final",
         "ids": ["m1", "m2", "m3"]},
    ]  # fmt: skip
    return events


def test_a_read_record_the_final_log_lacks_is_a_phantom_violation() -> None:
    # m3 was read from a replica's unconfirmed tail, then cut by the failover.
    result = check(_history(read=["m1", "m3", "m2"], final_log=["m1", "m2"]))
    assert result.phantom == ["m3"]
    assert any("absent from the final log" in v for v in result.violations)


def test_a_read_unacknowledged_record_the_final_log_holds_is_no_phantom() -> None:
    result = check(_history(read=["m1", "m2", "m3"], final_log=["m1", "m2", "m3"]))
    assert result.phantom == []
    assert result.recovered == 1
    assert result.violations == []


def test_a_drain_that_failed_says_why_beside_what_it_left_behind() -> None:
    events = _history(read=["m1"], final_log=["m1", "m2"])
    drain = next(e for e in events if e["type"] == "drain")
    drain.update(ok=False, behind={"unknown": 1}, error="MQClientException: No route info")
    result = check(events)
    assert any(
        "did not catch up: {'unknown': 1} (MQClientException: No route info)" in v
        for v in result.violations
    ), result.violations
