"""The leader's decision rounds pass over settled groups, and still fail a silent master over.

A controller of one (its own Raft leader) on a fake clock: the rounds run on their own
every 100 ms, and the test runs one more itself wherever it needs a round to have seen
what it just registered.
"""

from __future__ import annotations

import dataclasses

from metaq.common.model import BrokerKey, BrokerState, BrokerView, Role, TopicConfig
from metaq.nameserver.controller import Controller, ControllerSettings
from metaq.nameserver.registry import Registry
from metaq.testing.waiting import run_async, wait_until_async

GROUP = "broker-a"
EXPIRY_S = 10.0
TIMEOUT_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LookedAt(Registry):
    """A registry that notes every group whose brokers a round looked at."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(EXPIRY_S, clock)
        self.looked_at: list[str] = []

    def members(self, broker_name: str) -> list[BrokerView]:
        self.looked_at.append(broker_name)
        return super().members(broker_name)


def broker(broker_id: int) -> BrokerState:
    return BrokerState(
        cluster="c1",
        key=BrokerKey(GROUP, broker_id),
        role=Role.SLAVE,
        data_address=f"h:{broker_id}",
        controlled=True,
        configured_master=broker_id == 0,
    )


def test_a_settled_group_is_passed_over_until_its_master_goes_silent() -> None:
    clock = FakeClock()
    registry = LookedAt(clock)
    controller = Controller(registry, ControllerSettings(), clock)
    topics = {"t": TopicConfig("t", 4, 4)}
    slave = broker(1)

    async def scenario() -> None:
        controller.start()
        try:

            async def committed(master_id: int, in_sync: tuple[int, ...]) -> bool:
                await controller.run_once()
                control = controller.control(GROUP)
                return control is not None and (control.master_id, control.in_sync_ids) == (
                    master_id,
                    in_sync,
                )

            registry.register(broker(0), topics)
            registry.register(slave, topics)
            await wait_until_async(
                lambda: committed(0, (0,)), TIMEOUT_S, "the configured master is bootstrapped"
            )
            control = controller.control(GROUP)
            assert control is not None
            # It takes over and reports its slave in sync: committed, then nothing to do.
            master = dataclasses.replace(
                broker(0), role=Role.MASTER, epoch=control.epoch, in_sync_ids=(0, 1)
            )
            registry.register(master, topics)
            await wait_until_async(
                lambda: committed(0, (0, 1)), TIMEOUT_S, "the master's in-sync set is committed"
            )
            await controller.run_once()  # the round that finds it settled
            settled = controller.control(GROUP)

            # Both keep beating (the session hands the registry the same state each time).
            for _ in range(8):
                clock.now += 0.5
                registry.looked_at.clear()
                registry.register(master, topics)
                registry.register(slave, topics)
                await controller.run_once()
                assert GROUP not in registry.looked_at
            assert controller.control(GROUP) is settled

            # The master goes silent: past master_detection_s its slave is elected.
            for _ in range(7):
                clock.now += 0.5
                registry.register(slave, topics)
            await wait_until_async(
                lambda: committed(1, (1,)), TIMEOUT_S, "the slave is elected in its place"
            )
            assert GROUP in registry.looked_at
        finally:
            await controller.stop()

    run_async(scenario(), timeout_s=60)
