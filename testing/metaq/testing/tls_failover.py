"""The produce / catch up / kill the master / produce / read-all path the TLS tests walk,
with or without a user's credentials."""

from __future__ import annotations

from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer, PullStatus
from metaq.client.results import SendStatus
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials
from metaq.testing import BrokerProcess
from metaq.testing.waiting import run_async, wait_until


def role(broker: BrokerProcess) -> str | None:
    state = broker.health()
    return None if state is None else str(state["role"])


async def send_all(
    nameservers: list[str], topic: str, tls: TlsConfig, bodies: list[bytes],
    credentials: Credentials | None = None,
) -> None:  # fmt: skip
    async with Producer(
        nameservers, tls=tls, credentials=credentials, send_timeout_s=3.0, retries=5
    ) as producer:
        for body in bodies:
            result = await producer.send(topic, body)
            assert result.status is SendStatus.OK, result


async def read_all(
    nameservers: list[str], topic: str, group: str, tls: TlsConfig,
    credentials: Credentials | None = None,
) -> list[bytes]:  # fmt: skip
    bodies: list[bytes] = []
    async with PullConsumer(nameservers, group, tls=tls, credentials=credentials) as consumer:
        for queue in await consumer.queues(topic, refresh=True):
            offset = 0
            while True:
                found = await consumer.pull(topic, queue, offset, max_messages=256)
                if found.status is not PullStatus.FOUND:
                    break
                bodies += [bytes(m.body) for m in found.messages]
                offset = found.next_offset
    return bodies


def produce_fail_over_and_read(
    nameservers: list[str], topic: str, group: str, tls: TlsConfig,
    master: BrokerProcess, slave: BrokerProcess, before: int, after: int,
    credentials: Credentials | None = None,
) -> None:  # fmt: skip
    """``before`` sends, the slave catching up (it fetches the log over TLS), every one
    read; kill -9 of the master, the slave promoted, ``after`` more sends, every one of
    both read."""
    first = [b"before-%04d" % n for n in range(before)]
    run_async(send_all(nameservers, topic, tls, first, credentials))
    wait_until(
        lambda: (slave.health() or {}).get("commitlog_write_offset")
        == (master.health() or {}).get("commitlog_write_offset"),
        20, "the slave caught up with the master", poll_s=0.1,
    )  # fmt: skip
    assert sorted(run_async(read_all(nameservers, topic, group, tls, credentials))) == first

    master.kill()
    wait_until(lambda: role(slave) == "master", 30, "the slave was promoted", poll_s=0.2)
    second = [b"after-%04d" % n for n in range(after)]
    run_async(send_all(nameservers, topic, tls, second, credentials), timeout_s=60)
    read = run_async(read_all(nameservers, topic, group, tls, credentials))
    assert sorted(read) == sorted(first + second)
