"""Whom the Kafka and RocketMQ systems kill: the leader (master) they name after a look
that failed, never the failed look's placeholder, and without ending the run."""

from __future__ import annotations

from typing import Any

import pytest
from chaoslib import kafka, rocketmq


def _answers(*said: Any) -> Any:
    """A look that gives ``said`` in turn, then the last of them again."""
    left = list(said)

    def look(_: object) -> Any:
        return left.pop(0) if len(left) > 1 else left[0]

    return look


def test_rocketmq_asks_again_when_a_look_at_the_controller_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (None, 0): the look's JVM failed or timed out; the controller still has its master.
    monkeypatch.setattr(rocketmq, "_master", _answers((None, 0), (None, 0), ("n2", 3)))
    assert rocketmq._master_to_kill(object()) == "n2"  # type: ignore[arg-type]


def test_kafka_asks_again_rather_than_kill_node_minus_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # -1 is a failed metadata look; as a node number it would kill node 2 of 3 (index -2).
    monkeypatch.setattr(kafka, "_leader", _answers((-1, 0), (3, 3)))
    assert kafka._leader_to_kill(object()) == 3  # type: ignore[arg-type]
