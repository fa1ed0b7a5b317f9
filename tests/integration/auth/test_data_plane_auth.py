"""Users on the data plane (a real broker with auth_enabled): who may send and consume.

Before auth anyone who reached a broker's data port could send to any topic, consume any
group and commit its offsets. Now a connection must prove a user's key (AUTH), sign
every frame, and stay within its grants.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metaq.client.connection import BrokerConnection, ConnectionPool
from metaq.client.errors import BrokerError as ClientBrokerError
from metaq.client.errors import ConnectionLost
from metaq.common.errors import ErrorCode
from metaq.common.framing import FrameType
from metaq.common.record import encode
from metaq.common.users import Credentials
from metaq.common.v1.data_pb2 import PullRequest, PullResponse, SendRequest, SendResponse
from metaq.testing import BrokerError, BrokerProcess, DataClient
from metaq.testing.waiting import run_async, wait_until_async

APP_SECRET = "app1-secret-key-for-the-auth-tests"


def metaq_cli(*args: str) -> str:
    """Run the ``metaq`` CLI; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def acl_cli(acl_file: Path, *args: str) -> str:
    return metaq_cli("acl", *args, "--file", str(acl_file))


def read_credentials(text: str) -> Credentials:
    values = dict(
        (k.strip(), v.strip().strip('"'))
        for k, _, v in (line.partition("=") for line in text.splitlines())
        if k.strip() in ("access_key", "secret_key")
    )
    return Credentials(values["access_key"], values["secret_key"])


@pytest.fixture(scope="module")
def acl_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Credentials, Credentials]:
    """An ACL made with the CLI: admin, and app1 with pub on topic A, sub on group g1."""
    root = tmp_path_factory.mktemp("acl")
    acl_file = root / "acl.json"
    admin = read_credentials(acl_cli(acl_file, "init", "admin"))
    secret_file = root / "app1.secret"
    secret_file.write_text(APP_SECRET)
    acl_cli(acl_file, "add-user", "app1", "--secret-key-file", str(secret_file))
    acl_cli(acl_file, "grant", "app1", "pub", "topic:A")
    acl_cli(acl_file, "grant", "app1", "sub", "group:g1")
    acl_cli(acl_file, "grant", "app1", "sub", "topic:A")
    return acl_file, admin, Credentials("app1", APP_SECRET)


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, acl_setup: tuple[Path, Credentials, Credentials]
) -> Iterator[BrokerProcess]:
    acl_file = acl_setup[0]
    with BrokerProcess.start(
        tmp_path_factory.mktemp("broker"),
        "--set", "auth_enabled=true",
        "--set", f"auth_acl_file={acl_file}",
        "--auto-create-topics",
    ) as process:  # fmt: skip
        yield process


def _address(broker: BrokerProcess) -> str:
    return f"{broker.data_host}:{broker.data_port}"


def _send_header(topic: str) -> bytes:
    return SendRequest(topic=topic, queue_id=0, record_count=1).SerializeToString()


def test_a_connection_without_credentials_is_refused(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            with pytest.raises(BrokerError) as refused:
                await client.send("A", 0, [encode("A", b"anonymous")])
            assert refused.value.code is ErrorCode.NO_PERMISSION
            assert "requires authentication" in str(refused.value)
            with pytest.raises(BrokerError, match="requires authentication"):
                await client.pull("A", 0, 0)
        finally:
            await client.close()

    run_async(scenario())
    assert _denied(broker, "unauthenticated") >= 1


def _metrics(broker: BrokerProcess) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_a_wrong_secret_key_is_refused_at_the_handshake(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        with pytest.raises(ClientBrokerError) as refused:
            await BrokerConnection.open(
                _address(broker), credentials=Credentials("app1", APP_SECRET + "-wrong")
            )
        assert refused.value.code is ErrorCode.NO_PERMISSION
        assert "wrong secret key" in refused.value.detail
        with pytest.raises(ClientBrokerError, match="unknown user"):
            await BrokerConnection.open(
                _address(broker), credentials=Credentials("nobody", APP_SECRET)
            )

    run_async(scenario())


def test_a_producer_allowed_on_topic_a_is_refused_on_b(
    broker: BrokerProcess, acl_setup: tuple[Path, Credentials, Credentials]
) -> None:
    app1 = acl_setup[2]

    async def scenario() -> None:
        connection = await BrokerConnection.open(_address(broker), credentials=app1)
        try:
            frame = await connection.request(
                FrameType.SEND, _send_header("A"), [encode("A", b"allowed")], timeout_s=5
            )
            assert SendResponse.FromString(frame.header).status is SendResponse.OK
            with pytest.raises(ClientBrokerError) as refused:
                await connection.request(
                    FrameType.SEND, _send_header("B"), [encode("B", b"denied")], timeout_s=5
                )
            assert refused.value.detail == (
                "user app1 lacks pub on topic B; grant it with metaq acl grant app1 pub topic:B"
            )
            # The connection goes on after a refusal.
            pull = PullRequest(consumer_group="g1", topic="A", queue_id=0, offset=0, max_messages=8,
                               max_bytes=1 << 20)  # fmt: skip
            frame = await connection.request(FrameType.PULL, pull.SerializeToString(), timeout_s=5)
            assert PullResponse.FromString(frame.header).status is PullResponse.FOUND
        finally:
            await connection.close()

    run_async(scenario())
    assert _denied(broker, "permission") >= 1
    assert APP_SECRET not in broker.output


def test_a_consumer_is_refused_a_group_it_lacks(
    broker: BrokerProcess, acl_setup: tuple[Path, Credentials, Credentials]
) -> None:
    app1 = acl_setup[2]

    async def scenario() -> None:
        connection = await BrokerConnection.open(_address(broker), credentials=app1)
        try:
            pull = PullRequest(consumer_group="g2", topic="A", queue_id=0, offset=0,
                               max_messages=8, max_bytes=1 << 20)  # fmt: skip
            with pytest.raises(ClientBrokerError) as refused:
                await connection.request(FrameType.PULL, pull.SerializeToString(), timeout_s=5)
            assert refused.value.detail == (
                "user app1 lacks sub on group g2; grant it with metaq acl grant app1 sub group:g2"
            )
            # A read for no group (metaq read) needs sub on the topic alone.
            await connection.request(
                FrameType.SEND, _send_header("A"), [encode("A", b"read me")], timeout_s=5
            )
            groupless = PullRequest(topic="A", queue_id=0, offset=0, max_messages=1,
                                    max_bytes=1 << 20)  # fmt: skip
            frame = await connection.request(
                FrameType.PULL, groupless.SerializeToString(), timeout_s=5
            )
            assert (
                PullResponse.FromString(frame.header).status is not PullResponse.STATUS_UNSPECIFIED
            )
            groupless.topic = "B"
            with pytest.raises(ClientBrokerError, match="lacks sub on topic B"):
                await connection.request(FrameType.PULL, groupless.SerializeToString(), timeout_s=5)
        finally:
            await connection.close()

    run_async(scenario())


def _denied(broker: BrokerProcess, reason: str) -> float:
    """``metaq_auth_denied_total{reason}`` as the broker's /metrics has it now."""
    prefix = f'metaq_auth_denied_total{{reason="{reason}"}} '
    for line in _metrics(broker).splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


async def _queue_end(connection: BrokerConnection, topic: str) -> int:
    pull = PullRequest(consumer_group="g1", topic=topic, queue_id=0, offset=0, max_messages=1,
                       max_bytes=1 << 20)  # fmt: skip
    frame = await connection.request(FrameType.PULL, pull.SerializeToString(), timeout_s=5)
    return PullResponse.FromString(frame.header).max_offset


def test_a_captured_signed_frame_replayed_is_refused(
    broker: BrokerProcess, acl_setup: tuple[Path, Credentials, Credentials]
) -> None:
    app1 = acl_setup[2]

    async def scenario() -> None:
        connection = await BrokerConnection.open(_address(broker), credentials=app1)
        other = await BrokerConnection.open(_address(broker), credentials=app1)
        stranger = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            before = await _queue_end(connection, "A")
            # What a wiretap sees of one signed SEND: its bytes as written, id above
            # every id the connection used so far.
            captured = b"".join(
                bytes(part)
                for part in connection._encode(
                    FrameType.SEND, 1000, _send_header("A"), [encode("A", b"once")]
                )
            )
            connection._next_id = 1001
            assert connection._transport is not None and other._transport is not None
            replays, forged = _denied(broker, "replay"), _denied(broker, "bad_signature")
            unauthenticated = _denied(broker, "unauthenticated")
            connection._transport.write(captured)
            connection._transport.write(captured)  # the same frame again, same connection
            other._transport.write(captured)  # another connection: another session key
            stranger.write_raw(captured)  # a connection that never authenticated

            async def all_refused() -> bool:
                return (
                    _denied(broker, "replay") == replays + 1
                    and _denied(broker, "bad_signature") == forged + 1
                    and _denied(broker, "unauthenticated") == unauthenticated + 1
                )

            await wait_until_async(all_refused, 10, "the three replays are refused")
            assert await _queue_end(connection, "A") == before + 1, "stored more than once"
        finally:
            await connection.close()
            await other.close()
            await stranger.close()

    run_async(scenario())


def test_pub_on_a_prefix_and_retry_topics_follow_the_group(
    broker: BrokerProcess, acl_setup: tuple[Path, Credentials, Credentials]
) -> None:
    acl_file, _, app1 = acl_setup
    acl_cli(acl_file, "grant", "app1", "pub", "topic:orders*")

    async def scenario() -> None:
        connection = await BrokerConnection.open(_address(broker), credentials=app1)
        try:

            async def send(topic: str) -> None:
                await connection.request(
                    FrameType.SEND, _send_header(topic), [encode(topic, b"m")], timeout_s=5
                )

            async def granted() -> bool:
                try:
                    await send("orders-eu")
                except ClientBrokerError:
                    return False
                return True

            # The broker rereads the file within a second of the change.
            await wait_until_async(granted, 10, "the grant on orders* is in force")
            await send("%RETRY%g1")  # sub on group g1 covers its retry topic
            with pytest.raises(ClientBrokerError, match="lacks sub on group g2"):
                await send("%RETRY%g2")
        finally:
            await connection.close()

    run_async(scenario())


def test_a_user_limited_to_other_networks_is_refused_at_the_handshake(
    broker: BrokerProcess, acl_setup: tuple[Path, Credentials, Credentials]
) -> None:
    acl_file = acl_setup[0]
    secret_file = acl_file.parent / "remote.secret"
    secret_file.write_text(APP_SECRET)
    acl_cli(acl_file, "add-user", "remote", "--secret-key-file", str(secret_file))
    acl_cli(acl_file, "cidrs", "remote", "10.0.0.0/8")
    remote = Credentials("remote", APP_SECRET)

    async def scenario() -> None:
        refusal: list[str] = []

        async def refused_for_its_network() -> bool:
            try:
                connection = await BrokerConnection.open(_address(broker), credentials=remote)
            except ClientBrokerError as exc:
                refusal[:] = [exc.detail]
                return "may not connect from 127.0.0.1" in exc.detail
            await connection.close()
            return False

        # The broker rereads the file within a second of the change.
        await wait_until_async(refused_for_its_network, 10, "the allow-list is in force")
        assert "10.0.0.0/8" in refusal[0]

    run_async(scenario())
    assert _denied(broker, "address") >= 1


def test_a_connection_that_used_every_request_id_retires_and_a_new_one_works(
    broker: BrokerProcess, acl_setup: tuple[Path, Credentials, Credentials]
) -> None:
    app1 = acl_setup[2]

    async def scenario() -> None:
        pool = ConnectionPool(credentials=app1)
        try:
            connection = await pool.get(_address(broker))
            connection._next_id = 0xFFFFFFFF  # the last id there is
            with contextlib.suppress(ConnectionLost):
                await connection.request(
                    FrameType.SEND, _send_header("A"), [encode("A", b"last id")], timeout_s=5
                )

            async def retired() -> bool:
                return connection.closed

            await wait_until_async(retired, 5, "the used-up connection is closed")
            fresh = await pool.get(_address(broker))
            assert fresh is not connection
            frame = await fresh.request(
                FrameType.SEND, _send_header("A"), [encode("A", b"next")], timeout_s=5
            )
            assert SendResponse.FromString(frame.header).status is SendResponse.OK
        finally:
            await pool.close()

    run_async(scenario())
