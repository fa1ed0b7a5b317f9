"""What a sleeping server costs a client that sends one request at a time.

A loopback echo over uvloop: the server runs in a process of its own and answers each
request at once; the client sends 1 KiB, waits for it back, sends the next. Run twice
in the same run: the server sleeping in ``epoll_wait`` between requests (the baseline),
then polling after each answer with the broker's own :class:`IdlePoll` (200 µs, the
broker's default ``idle_poll_us``). Every round trip of the first kind waits for the
server's CPU to wake, which on a virtual machine costs tens of microseconds; the
difference is what idle polling buys the broker's one-at-a-time senders
(docs/broker.md). The last line is a JSON object of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time
from multiprocessing.connection import Connection
from typing import cast

import uvloop

from metaq.broker.idle_poll import IdlePoll

BODY = b"x" * 1024


class _Echo(asyncio.Protocol):
    def __init__(self, poll: IdlePoll) -> None:
        self._poll = poll
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)
        self._poll.answered(True)


def _serve(window_us: int, ready: Connection) -> None:
    async def main() -> None:
        poll = IdlePoll(window_us)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Echo(poll), "127.0.0.1", 0)
        ready.send(server.sockets[0].getsockname()[1])
        await asyncio.Future()  # until terminated

    uvloop.run(main())


async def _round_trips(port: int, seconds: float) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times: list[float] = []
    clock = time.perf_counter
    deadline = clock() + seconds
    try:
        while clock() < deadline:
            start = clock()
            writer.write(BODY)
            await reader.readexactly(len(BODY))
            times.append(clock() - start)
    finally:
        writer.close()
    return times


def measure(window_us: int, seconds: float) -> dict[str, float]:
    """Round trips against an echo server polling for ``window_us`` (0: sleeping)."""
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.Process(target=_serve, args=(window_us, child), daemon=True)
    server.start()
    try:
        if not parent.poll(30):
            raise RuntimeError("the echo server did not start in 30 s")
        port = parent.recv()
        uvloop.run(_round_trips(port, 0.5))  # warm-up
        times = sorted(uvloop.run(_round_trips(port, seconds)))
    finally:
        server.terminate()
        server.join(10)
    return {
        "round_trips_s": round(len(times) / sum(times)),
        "p50_us": round(times[len(times) // 2] * 1e6, 1),
        "p99_us": round(times[int(len(times) * 0.99)] * 1e6, 1),
        "p999_us": round(times[int(len(times) * 0.999)] * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds a server")
    parser.add_argument("--window-us", type=int, default=200, help="the polling server's window")
    args = parser.parse_args()
    sleeping = measure(0, args.seconds)
    polling = measure(args.window_us, args.seconds)
    print(f"{'server':<28} {'round trips/s':>14} {'p50 µs':>8} {'p99 µs':>8} {'p99.9 µs':>9}")
    for name, row in (("sleeps (baseline)", sleeping), (f"polls {args.window_us} µs", polling)):
        print(
            f"{name:<28} {row['round_trips_s']:>14,} {row['p50_us']:>8} "
            f"{row['p99_us']:>8} {row['p999_us']:>9}"
        )
    ratio = polling["round_trips_s"] / sleeping["round_trips_s"]
    print(f"polling ÷ sleeping: {ratio:.2f}x the round trips")
    print(
        json.dumps(
            {
                "echo_round_trips_s_sleeping": sleeping["round_trips_s"],
                "echo_round_trips_s_polling": polling["round_trips_s"],
                "echo_p50_us_sleeping": sleeping["p50_us"],
                "echo_p50_us_polling": polling["p50_us"],
                "polling_vs_sleeping_ratio": round(ratio, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
