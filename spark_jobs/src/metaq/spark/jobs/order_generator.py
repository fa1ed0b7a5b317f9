"""Orders for the Double-11 live room: JSON bodies at a steady rate, through the producer.

``python -m metaq.spark.jobs.order_generator --rate 500 --seconds 60`` sends to ``orders``
(keys: the order id; tags: the category) until the time is up or ``--count`` are sent.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Final

from metaq.client.producer import Producer
from metaq.spark.jobs.common import parser

CATEGORIES: Final = {
    "phones": (999.0, 8999.0),
    "laptops": (2999.0, 19999.0),
    "apparel": (39.0, 899.0),
    "beauty": (29.0, 1299.0),
    "grocery": (5.0, 199.0),
    "home": (49.0, 2999.0),
}


@dataclass(frozen=True)
class Order:
    order_id: str
    item: str
    category: str
    amount: float
    event_time_ms: int

    def body(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def orders(seed: int, start_ms: int, step_ms: float) -> Iterator[Order]:
    """An endless, reproducible run of orders, ``step_ms`` apart in event time."""
    rng = random.Random(seed)
    names = sorted(CATEGORIES)
    n = 0
    while True:
        category = rng.choice(names)
        low, high = CATEGORIES[category]
        yield Order(
            order_id=f"{seed}-{n}",
            item=f"{category}-{rng.randrange(1000):03d}",
            category=category,
            amount=round(rng.uniform(low, high), 2),
            event_time_ms=start_ms + int(n * step_ms),
        )
        n += 1


async def generate(
    nameservers: list[str],
    topic: str,
    rate: float,
    *,
    seconds: float = 0.0,
    count: int = 0,
    seed: int = 1,
    start_ms: int | None = None,
    event_step_ms: float | None = None,
) -> list[Order]:
    """Send orders at ``rate`` per second; returns what was acknowledged. Event times run
    from now (or ``start_ms``), ``event_step_ms`` apart (default: as sent, 1/rate)."""
    sent: list[Order] = []
    first_ms = start_ms if start_ms is not None else int(time.time() * 1000)
    source = orders(seed, first_ms, event_step_ms or 1000 / rate)
    begin = time.monotonic()
    async with Producer(nameservers) as producer:
        while (not count or len(sent) < count) and (
            not seconds or time.monotonic() - begin < seconds
        ):
            due = int((time.monotonic() - begin) * rate) + 1 - len(sent)
            chunk = [next(source) for _ in range(max(min(due, 500), 0))]
            if count:
                chunk = chunk[: count - len(sent)]
            if not chunk:
                await asyncio.sleep(1 / rate)  # pacing: the next order is not due yet
                continue
            await asyncio.gather(
                *(
                    producer.send(topic, o.body(), keys=(o.order_id,), tags=o.category)
                    for o in chunk
                )
            )
            sent += chunk
    return sent


def main(argv: list[str] | None = None) -> int:
    p = parser("Send Double-11 orders (JSON) to a metaq topic at a steady rate.")
    p.add_argument("--topic", default="orders")
    p.add_argument("--rate", type=float, default=200.0, help="orders per second")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: never)")
    p.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.rate <= 0:
        p.error("--rate must be positive")
    sent = asyncio.run(
        generate(
            args.nameservers.split(","),
            args.topic,
            args.rate,
            seconds=args.seconds,
            count=args.count,
            seed=args.seed,
        )
    )
    print(f"sent {len(sent)} orders to {args.topic}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
