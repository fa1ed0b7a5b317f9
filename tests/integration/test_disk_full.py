"""A broker on a small filesystem of its own: it refuses writes before the kernel runs out
of space, takes them again by itself once room returns, and under disk pressure deletes
nothing a consumer group has not consumed unless told to.

The filesystem is a tmpfs of FS_MIB: there a store into a mapped page past the size
limit is SIGBUS, not ENOSPC, so any write the broker does not see coming kills it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from metaq.client.admin import Admin, BrokerHealth, TopicSettings
from metaq.client.errors import BrokerAdminError
from metaq.common.errors import ErrorCode
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import SendResponse
from metaq.testing import BrokerError, BrokerProcess, DataClient, run_async
from metaq.testing.waiting import holds_for, wait_until

FS_MIB: Final = 64
MIB: Final = 1024 * 1024
BODY: Final = 60 * 1024  # SMALL_STORE's max_message_bytes is 256 KiB
PER_SEND: Final = 8
# Signs of the kernel refusing space, or of a store dying for it.
TROUBLE: Final = re.compile(r"No space left|Errno 28|ENOSPC|I/O error|Bus error|SIGBUS| died")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A FS_MIB tmpfs mounted for the test, unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "fs"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_MIB}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        # Lazy: a broker killed a moment ago may still hold its files open.
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


def start(fs: Path, *flags: str) -> BrokerProcess:
    settings = ["--set", "store.disk_reserve_bytes=8388608", *flags]
    return BrokerProcess.start(fs / "data", *settings)


def ballast(fs: Path, leave_free_bytes: int) -> Path:
    """A file taking the filesystem's free space down to ``leave_free_bytes``."""
    stats = os.statvfs(fs)
    path = fs / "ballast"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, stats.f_bavail * stats.f_frsize - leave_free_bytes)
    finally:
        os.close(fd)
    return path


def records(topic: str, first: int) -> list[bytes]:
    return [encode(topic, bytes(BODY), keys=[f"m{first + n}"]) for n in range(PER_SEND)]


async def send_until_refused(
    broker: BrokerProcess, topic: str, limit: int
) -> tuple[list[str], str]:
    """Send batches until the broker refuses one; return the acknowledged keys and the
    refusal. Every refusal must be the store's retriable STORE_UNAVAILABLE."""
    client = await DataClient.connect(broker.data_host, broker.data_port)
    acked: list[str] = []
    try:
        for _ in range(limit):
            try:
                response = await client.send(topic, 0, records(topic, len(acked)))
            except BrokerError as exc:
                assert exc.code == ErrorCode.STORE_UNAVAILABLE, exc
                assert exc.retriable, exc
                return acked, str(exc)
            assert response.status == SendResponse.OK, response
            acked += [f"m{len(acked) + n}" for n in range(PER_SEND)]
    finally:
        await client.close()
    raise AssertionError(f"{limit} sends of {PER_SEND * BODY} bytes all accepted on {FS_MIB} MiB")


async def try_send(broker: BrokerProcess, topic: str, first: int) -> bool:
    """Whether one batch is accepted; a refusal must be the retriable STORE_UNAVAILABLE."""
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        response = await client.send(topic, 0, records(topic, first))
    except BrokerError as exc:
        assert exc.code == ErrorCode.STORE_UNAVAILABLE and exc.retriable, exc
        return False
    finally:
        await client.close()
    assert response.status == SendResponse.OK, response
    return True


async def read_keys(broker: BrokerProcess, topic: str) -> list[str]:
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        return [record.keys[0] for record in await client.read_queue(topic, 0)]
    finally:
        await client.close()


def health(broker: BrokerProcess) -> BrokerHealth:
    return run_async(Admin().health(broker.http_url))


def metric(broker: BrokerProcess, name: str, **labels: str) -> float:
    samples = run_async(Admin().metrics(broker.http_url))
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def assert_no_trouble(broker: BrokerProcess) -> None:
    assert broker.proc.poll() is None, f"the broker exited:\n{broker.output}"
    found = [line for line in broker.output.splitlines() if TROUBLE.search(line)]
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------------------


def test_sends_are_refused_for_the_full_disk_before_the_kernel_runs_out_of_space(
    small_fs: Path,
) -> None:
    with start(small_fs) as broker:
        run_async(
            Admin().put_topic(broker.http_url, "Fill", TopicSettings(read_queues=1, write_queues=1))
        )

        acked, refusal = run_async(send_until_refused(broker, "Fill", limit=400), 60.0)

        assert "disk" in refusal, refusal
        assert_no_trouble(broker)
        state = health(broker)
        assert state.status == "not-writable", state
        assert "disk" in str(state.reason), state
        # Both limits, in the refusal, /health and the metrics: the used ratio as df
        # counts it and the free bytes beside the absolute reserve.
        for told in (refusal, str(state.reason)):
            assert "store.disk_full_ratio" in told and "store.disk_reserve_bytes" in told, told
        stats = os.statvfs(small_fs)
        used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
        available = stats.f_bavail * stats.f_frsize
        assert state.disk_used_ratio == pytest.approx(used / (used + available), abs=0.02)
        assert state.disk_used_bytes == pytest.approx(used, abs=2 * MIB)
        assert state.disk_available_bytes == pytest.approx(available, abs=2 * MIB)
        assert state.disk_reserve_bytes == 8 * MIB
        assert metric(broker, "metaq_disk_reserve_bytes") == 8 * MIB
        # Reads go on, and every acknowledged message is there.
        assert run_async(read_keys(broker, "Fill"), 60.0) == acked
        assert_no_trouble(broker)


def test_sends_are_taken_again_without_a_restart_once_space_is_freed(small_fs: Path) -> None:
    with start(small_fs) as broker:
        run_async(
            Admin().put_topic(
                broker.http_url, "Refill", TopicSettings(read_queues=1, write_queues=1)
            )
        )
        filler = ballast(small_fs, leave_free_bytes=24 * MIB)
        acked, refusal = run_async(send_until_refused(broker, "Refill", limit=400), 60.0)
        assert "disk" in refusal, refusal

        filler.unlink()

        def accepted() -> bool:
            return run_async(try_send(broker, "Refill", first=len(acked)))

        wait_until(accepted, 5.0, "a send is accepted after the ballast is deleted", poll_s=0.1)
        assert_no_trouble(broker)
        assert health(broker).status == "ok"
        keys = run_async(read_keys(broker, "Refill"), 60.0)
        assert keys[: len(acked)] == acked
        assert len(keys) == len(acked) + PER_SEND


def test_a_topic_change_on_a_full_disk_is_refused_with_507_and_the_reason(
    small_fs: Path,
) -> None:
    with start(small_fs) as broker:
        admin = Admin()
        run_async(admin.put_topic(broker.http_url, "Full", TopicSettings(1, 1)))
        run_async(send_until_refused(broker, "Full", limit=400), 60.0)

        with pytest.raises(BrokerAdminError) as refused:
            run_async(admin.put_topic(broker.http_url, "Another", TopicSettings(1, 1)))

        assert refused.value.status == 507 and refused.value.retriable
        assert "stores nothing now" in refused.value.detail and "disk" in refused.value.detail
        assert "Another" not in run_async(admin.broker_topics(broker.http_url))

        assert_no_trouble(broker)


FORCE_CLEAN: Final = (
    "--set", "store.clean_interval_s=0.1",
    "--set", "store.disk_clean_ratio=0.3",
    "--set", "store.disk_force_clean_ratio=0.4",
    "--set", "store.disk_full_ratio=0.95",
)  # fmt: skip
SEGMENT_MIB: Final = 4  # SMALL_STORE's commitlog_segment_bytes


async def send_segments(broker: BrokerProcess, topic: str, count: int) -> list[str]:
    """Acknowledged keys of sends filling ``count`` commitlog segments."""
    client = await DataClient.connect(broker.data_host, broker.data_port)
    acked: list[str] = []
    try:
        while len(acked) * BODY < count * SEGMENT_MIB * MIB:
            response = await client.send(topic, 0, records(topic, len(acked)))
            assert response.status == SendResponse.OK, response
            acked += [f"m{len(acked) + n}" for n in range(PER_SEND)]
    finally:
        await client.close()
    return acked


def pressure(broker: BrokerProcess, fs: Path) -> None:
    """Ballast to about 60 % full: past the force-clean ratio, short of the full one."""
    stats = os.statvfs(fs)
    ballast(fs, leave_free_bytes=int(0.4 * stats.f_blocks * stats.f_frsize))
    wait_until(lambda: health(broker).disk_used_ratio >= 0.5, 5.0,
               "the broker sees the disk past the force-clean ratio", poll_s=0.1)  # fmt: skip


def test_force_clean_deletes_no_unconsumed_message_and_then_what_every_group_consumed(
    small_fs: Path,
) -> None:
    with start(small_fs, *FORCE_CLEAN) as broker:
        run_async(
            Admin().put_topic(broker.http_url, "Keep", TopicSettings(read_queues=1, write_queues=1))
        )
        acked = run_async(send_segments(broker, "Keep", 5), 60.0)
        pressure(broker, small_fs)

        # Ten cleaner rounds a second: two seconds is twenty chances to delete.
        holds_for(lambda: metric(broker, "metaq_commitlog_min_offset") == 0, 2.0,
                  "no segment is deleted while no group has consumed it", poll_s=0.2)  # fmt: skip
        assert run_async(read_keys(broker, "Keep"), 60.0) == acked
        assert metric(broker, "metaq_commitlog_segments_deleted_total", reason="unconsumed") == 0

        async def commit_all() -> None:
            client = await DataClient.connect(broker.data_host, broker.data_port)
            try:
                await client.commit("readers", [("Keep", 0, len(acked))])
            finally:
                await client.close()

        run_async(commit_all())
        # The counter moves after the log's start does (same cleaner round): wait on it.
        wait_until(
            lambda: (
                metric(broker, "metaq_commitlog_segments_deleted_total", reason="consumed") >= 1
            ),
            10.0,
            "segments every group consumed are deleted",
            poll_s=0.2,
        )
        assert metric(broker, "metaq_commitlog_min_offset") > 0
        assert_no_trouble(broker)


def test_force_clean_unconsumed_deletes_unconsumed_segments_logs_and_counts_them(
    small_fs: Path,
) -> None:
    flags = (*FORCE_CLEAN, "--set", "store.force_clean_unconsumed=true")
    with start(small_fs, *flags) as broker:
        run_async(
            Admin().put_topic(broker.http_url, "Drop", TopicSettings(read_queues=1, write_queues=1))
        )
        run_async(send_segments(broker, "Drop", 5), 60.0)
        pressure(broker, small_fs)

        wait_until(
            lambda: (
                metric(broker, "metaq_commitlog_segments_deleted_total", reason="unconsumed") >= 1
            ),
            10.0,
            "an unconsumed segment is force-cleaned and counted",
            poll_s=0.2,
        )
        assert metric(broker, "metaq_commitlog_min_offset") > 0
        broker.wait_for_line(r"WARNING.*force_clean_unconsumed.*0{20}", 5.0)
        assert_no_trouble(broker)
