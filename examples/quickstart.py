"""The README's example: send three messages, then consume them back with a push consumer.

Run it against ``make run`` after ``metaq topic create demo``. METAQ_NAMESERVERS (comma
separated) overrides the nameserver address.
"""

import asyncio
import os

from metaq.client.consumer import FIRST, Message, PushConsumer
from metaq.client.producer import Producer

NAMESERVERS = os.environ.get("METAQ_NAMESERVERS", "127.0.0.1:9876").split(",")


async def main() -> None:
    async with Producer(NAMESERVERS) as producer:
        for n in range(3):
            sent = await producer.send("demo", f"hello {n}".encode(), keys=[f"order-{n}"])
            print("sent", sent.msg_id, sent.status.name)

    received: asyncio.Queue[Message] = asyncio.Queue()
    consumer = PushConsumer(NAMESERVERS, "quickstart", consume_from=FIRST)
    consumer.subscribe("demo", received.put)
    async with consumer:
        for _ in range(3):
            message = await asyncio.wait_for(received.get(), timeout=30)
            print("got", message.msg_id, message.body.decode())


asyncio.run(main())
