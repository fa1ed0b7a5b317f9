"""A stand-in broker process: only a NameServerRegistrar, so tests can kill -9 or SIGSTOP it.

    python registrar_child.py --nameserver HOST:PORT [--nameserver ...] --broker-name NAME
        [--broker-id N] [--room ROOM] [--topic NAME] [--queues N] [--interval-s S]

Runs until SIGTERM (then stops the registrar cleanly) or until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from metaq.broker.registration import BrokerDescription, FixedTopics, NameServerRegistrar
from metaq.common.auth import load_secret
from metaq.common.model import BrokerKey, BrokerState, ReplicationMode, Role, TopicConfig


async def run(args: argparse.Namespace) -> None:
    state = BrokerState(
        cluster="c1",
        key=BrokerKey(args.broker_name, args.broker_id),
        role=Role.MASTER if args.broker_id == 0 else Role.SLAVE,
        data_address=f"127.0.0.1:{10000 + args.broker_id}",
        computer_room=args.room,
        replication_mode=ReplicationMode.ASYNC,
    )
    topics = FixedTopics((TopicConfig(args.topic, args.queues, args.queues),))
    description = BrokerDescription(state, topics)
    registrar = NameServerRegistrar(
        args.nameserver,
        lambda: description,
        args.interval_s,
        max_backoff_s=0.5,
        secret=load_secret(""),  # METAQ_CLUSTER_SECRET, as the test set it
    )
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await registrar.start()
    await stopping.wait()
    await registrar.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nameserver", action="append", required=True)
    parser.add_argument("--broker-name", required=True)
    parser.add_argument("--broker-id", type=int, default=0)
    parser.add_argument("--room", default="")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--interval-s", type=float, default=0.2)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
