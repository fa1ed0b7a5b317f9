"""A broker under resource pressure: dead background threads, too many or idle
connections, peers that never read their answers, file descriptors running out."""

from __future__ import annotations

from collections.abc import Callable

from metaq.broker.testing import BrokerError, BrokerProcess, DataClient, run_async, wait_until
from metaq.broker.testing.admin import put_topic
from metaq.common.errors import ErrorCode
from metaq.common.record import encode

StartBroker = Callable[..., BrokerProcess]


async def connect(broker: BrokerProcess) -> DataClient:
    return await DataClient.connect(broker.data_host, broker.data_port)


def not_writable(broker: BrokerProcess, needle: str) -> Callable[[], bool]:
    def check() -> bool:
        health = broker.health()
        return (
            health is not None
            and health["status"] == "not-writable"
            and needle in (health["reason"] or "")
        )

    return check


def refused_send(broker: BrokerProcess, topic: str) -> BrokerError:
    async def scenario() -> BrokerError:
        client = await connect(broker)
        try:
            await client.send(topic, 0, [encode(topic, b"after the death", queue_id=0)])
        except BrokerError as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("a send was answered OK by a broker whose background thread died")

    return run_async(scenario())


# ------------------------------------------------------------------------------------------
# background threads that die


def test_dead_dispatcher_takes_health_down_and_refuses_sends(start_broker: StartBroker) -> None:
    broker = start_broker("--set", "auto_create_topics=true")
    # The dispatcher creates a new queue's directory when the queue's first record comes;
    # a file in its place makes that fail, and the thread dies as on any I/O error.
    (broker.data_dir / "consumequeue").mkdir(exist_ok=True)
    (broker.data_dir / "consumequeue" / "Doomed").write_bytes(b"not a directory")

    async def first_send() -> None:
        await put_topic(broker.http_url, "Doomed", read_queues=1, write_queues=1)
        client = await connect(broker)
        try:
            await client.send("Doomed", 0, [encode("Doomed", b"never readable", queue_id=0)])
        finally:
            await client.close()

    run_async(first_send())
    wait_until(
        not_writable(broker, "dispatch"), 10.0, "/health reports the dead dispatcher", poll_s=0.05
    )
    error = refused_send(broker, "Doomed")
    assert error.code == ErrorCode.STORE_UNAVAILABLE, error
    assert "dispatch" in str(error), error
    assert "restart" in str(error), error


def test_dead_checkpointer_takes_health_down_and_refuses_sends(start_broker: StartBroker) -> None:
    broker = start_broker("--set", "store.checkpoint_interval_ms=50")
    run_async(put_topic(broker.http_url, "AfterCheckpoint", read_queues=1, write_queues=1))
    # The checkpoint is replaced through a temporary file: a directory there makes every
    # later checkpoint fail, and the thread that writes them dies.
    (broker.data_dir / "checkpoint.tmp").mkdir()
    wait_until(
        not_writable(broker, "checkpoint"),
        10.0,
        "/health reports the dead checkpointer",
        poll_s=0.05,
    )
    error = refused_send(broker, "AfterCheckpoint")
    assert error.code == ErrorCode.STORE_UNAVAILABLE, error
    assert "checkpoint" in str(error), error
