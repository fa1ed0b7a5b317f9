"""Redis streams driven by redis-py (asyncio): XADD answered by the server, XREAD BLOCK
to consume. Each cell writes a stream of its own and deletes it after, since Redis keeps
every entry in memory."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any, Final

import redis.asyncio as aioredis
from compare_harness import IN_FLIGHT, EndToEnd, OpenLoop, windowed
from metaq_load import Budget

FIELD: Final = b"d"
WINDOWS: Final = 4


class RedisStreams:
    key = "redis"
    label = "Redis streams"
    durability = (
        "in memory, 1 copy: answered once in memory and the append-only file's buffer; "
        "fsync every second (appendfsync everysec)"
    )
    in_flight_how = f"{WINDOWS} pipelines × {IN_FLIGHT // WINDOWS} XADD"

    def __init__(self, port: int) -> None:
        self.port = port
        self._redis: Any = None
        self._names = (f"bench-{n}" for n in itertools.count())

    async def open(self) -> None:
        self._redis = aioredis.Redis(host="127.0.0.1", port=self.port)
        await self._redis.ping()

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    @contextlib.asynccontextmanager
    async def _stream(self) -> Any:
        name = next(self._names)
        try:
            yield name
        finally:
            await self._redis.delete(name)

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        latencies: list[float] = []
        clock = time.perf_counter
        async with self._stream() as stream:
            while budget.going():
                start = clock()
                await self._redis.xadd(stream, {FIELD: body})
                latencies.append(clock() - start)
                budget.sent += 1
        return latencies

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        async with self._stream() as stream:

            async def send(count: int) -> None:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for _ in range(count):
                        pipe.xadd(stream, {FIELD: body})
                    await pipe.execute()

            await windowed(budget, send, IN_FLIGHT // WINDOWS, WINDOWS)

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        run = OpenLoop(rate, seconds, size)
        reader: Any = aioredis.Redis(host="127.0.0.1", port=self.port)
        backlog: list[bytes] = []
        wake = asyncio.Event()
        stopping = asyncio.Event()
        async with self._stream() as stream:
            # Read from a known entry on: no race with the first XREAD, unlike "$".
            start_id = await self._redis.xadd(stream, {FIELD: b""})

            async def consume() -> None:
                last = start_id
                while not stopping.is_set():
                    answer = await reader.xread({stream: last}, count=1000, block=100)
                    for _name, entries in answer or ():
                        for entry_id, fields in entries:
                            run.on_message(fields[FIELD])
                            last = entry_id

            async def write() -> None:
                # One pipeline at a time of whatever came due meanwhile: what a client
                # does best without opening a connection per tick.
                while backlog or not stopping.is_set():
                    await wake.wait()
                    wake.clear()
                    while backlog:
                        pipe = self._redis.pipeline(transaction=False)
                        for body in backlog:
                            pipe.xadd(stream, {FIELD: body})
                        backlog.clear()
                        await pipe.execute()

            async def send(bodies: list[bytes]) -> None:
                backlog.extend(bodies)
                wake.set()

            tasks = [asyncio.create_task(consume()), asyncio.create_task(write())]
            try:
                return await run.run(send)
            finally:
                # Cancelling a blocked XREAD can leave redis-py's connection hanging;
                # the read returns within its block time and sees the flag instead.
                stopping.set()
                wake.set()
                await asyncio.gather(*tasks)
                await reader.aclose()
