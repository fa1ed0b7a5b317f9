"""``metaq topic create|update|delete|list|route|stats``.

Topics live on brokers: create, update and delete call the admin API (HTTP) of each
chosen broker group's master, found through the nameserver's cluster info (``--brokers``
picks groups; default: every master of the cluster). Routes and queue offsets come from
the nameserver and the data plane, as clients see them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from typing import Any, Final

from metaq.client.cli.support import (
    CliError,
    add_command,
    add_group,
    choose_masters,
    credentials,
    http_json,
    http_session,
    http_url,
    print_json,
    route_cache,
    split_names,
    table,
    tls_settings,
    topic_name,
)
from metaq.client.connection import ConnectionPool
from metaq.client.errors import UnknownTopic
from metaq.client.routes import BrokerInfo, RouteCache, TopicRoute
from metaq.common.framing import FrameType
from metaq.common.v1.data_pb2 import QueryOffsetRequest, QueryOffsetResponse

PERMISSIONS: Final = ("read-write", "read", "write", "write-wipe")
_ROUTE_POLL_S: Final = 0.05


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "topic", help="create, change, remove and inspect topics")

    create = add_command(
        group,
        "create",
        create_topic,
        help="create a topic on broker masters",
        description="Create a topic on the master of each chosen broker group (default: "
        "every master of the cluster), then wait until the nameserver routes it.",
        epilog="example:\n  metaq topic create orders --queues 8 --brokers broker-a,broker-b",
    )
    _topic_settings(create, defaults=True)
    update = add_command(
        group,
        "update",
        update_topic,
        help="change queue counts, permission or ordering of a topic",
        description="Change a topic's settings on each chosen broker master; settings not "
        "given keep their current value. The topic must already exist there.",
        epilog="example:\n  metaq topic update orders --perm write-wipe --brokers broker-a",
    )
    _topic_settings(update, defaults=False)
    delete = add_command(
        group,
        "delete",
        delete_topic,
        help="delete a topic from broker masters",
        description="Delete a topic from each chosen broker master (default: every master). "
        "Stored messages stay until retention removes them.",
    )
    delete.add_argument("topic", type=topic_name, help="topic name")
    _brokers_option(delete)
    listing = add_command(group, "list", list_topics, help="list the topics of each broker master")
    _brokers_option(listing)
    route = add_command(
        group,
        "route",
        show_route,
        help="show where a topic's queues are",
        description="Show the route of a topic as the nameserver gives it to clients.",
    )
    route.add_argument("topic", type=topic_name, help="topic name")
    stats = add_command(
        group,
        "stats",
        topic_stats,
        help="show per-queue minimum and maximum offsets",
        description="Show each readable queue's [min, max) offsets, asked of its broker.",
    )
    stats.add_argument("topic", type=topic_name, help="topic name")


def _brokers_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-b",
        "--brokers",
        action="append",
        metavar="NAME[,NAME]",
        help="broker groups to act on; repeatable (default: every master of the cluster)",
    )
    parser.add_argument("--cluster", default="", help="only brokers of this cluster")


def _topic_settings(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    parser.add_argument(
        "topic", type=topic_name, help="topic name: letters, digits, '_', '-', '|', '%%'"
    )
    default = " (default: 8)" if defaults else ""
    parser.add_argument(
        "-q", "--queues", type=int, metavar="N", help=f"read and write queue count{default}"
    )
    parser.add_argument("--read-queues", type=int, metavar="N", help="read queue count")
    parser.add_argument("--write-queues", type=int, metavar="N", help="write queue count")
    parser.add_argument(
        "--perm",
        choices=PERMISSIONS,
        help="what clients may do" + (" (default: read-write)" if defaults else ""),
    )
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--ordered", action="store_true", default=None, help="keys keep their order")
    order.add_argument("--unordered", dest="ordered", action="store_false", help="not ordered")
    _brokers_option(parser)
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="do not wait until the nameserver routes the change",
    )


def _settings(args: argparse.Namespace, current: dict[str, Any]) -> dict[str, Any]:
    body = dict(current)
    if args.queues is not None:
        body["read_queues"] = body["write_queues"] = args.queues
    if args.read_queues is not None:
        body["read_queues"] = args.read_queues
    if args.write_queues is not None:
        body["write_queues"] = args.write_queues
    if args.perm is not None:
        body["perm"] = args.perm
    if args.ordered is not None:
        body["ordered"] = args.ordered
    for key in ("read_queues", "write_queues"):
        if not isinstance(body[key], int) or not 1 <= body[key] <= 1024:
            raise CliError(f"{key.replace('_', '-')} must be between 1 and 1024", code=2)
    return body


async def _broker_topics(
    session: Any, broker: BrokerInfo, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    status, body = await http_json(session, "GET", f"{http_url(broker, args)}/topics")
    if status != 200:
        raise CliError(f"broker {broker.broker_name} answered {status} to GET /topics: {body}")
    topics: dict[str, dict[str, Any]] = body.get("topics", {})
    return topics


async def _put(args: argparse.Namespace, *, create: bool) -> int:
    async with route_cache(args) as routes:
        view = await routes.cluster(args.cluster)
        masters = choose_masters(view, split_names(args.brokers))
        rows = []
        async with http_session(args) as session:
            plans = []
            for broker in masters:
                existing = (await _broker_topics(session, broker, args)).get(args.topic)
                if create and existing is not None:
                    raise CliError(
                        f"topic {args.topic} already exists on {broker.broker_name}; "
                        "use 'metaq topic update' to change it"
                    )
                if not create and existing is None:
                    raise CliError(
                        f"topic {args.topic} does not exist on {broker.broker_name}; "
                        "use 'metaq topic create'"
                    )
                base = existing or {
                    "read_queues": 8,
                    "write_queues": 8,
                    "perm": "read-write",
                    "ordered": False,
                }
                plans.append((broker, _settings(args, base)))
            for broker, body in plans:
                url = f"{http_url(broker, args)}/topics/{args.topic}"
                status, answer = await http_json(session, "PUT", url, body)
                if status != 200:
                    error = answer.get("error", answer) if isinstance(answer, dict) else answer
                    raise CliError(f"broker {broker.broker_name} refused the topic: {error}")
                rows.append((broker, answer.get(args.topic, body)))
        if args.wait:
            await _wait_routed(routes, args.topic, {b.broker_name: c for b, c in rows}, args)
    if args.json:
        print_json({b.broker_name: config for b, config in rows})
        return 0
    table(
        ["group", "broker", "read queues", "write queues", "perm", "ordered"],
        [
            [
                b.broker_name,
                b.data_address,
                c["read_queues"],
                c["write_queues"],
                c["perm"],
                c["ordered"],
            ]
            for b, c in rows
        ],
    )
    print(f"topic {args.topic} {'created' if create else 'updated'} on {len(rows)} broker(s)")
    return 0


async def _wait_routed(
    routes: RouteCache, topic: str, expected: dict[str, dict[str, Any]], args: argparse.Namespace
) -> None:
    """Poll the route until every broker group shows the queue counts just set."""
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            route = await routes.route(topic, refresh=True)
        except UnknownTopic:
            route = None
        if route is not None and _route_matches(route, expected):
            return
        if time.monotonic() > deadline:
            raise CliError(
                f"the brokers took the change, but the nameserver did not route it within "
                f"{args.timeout} s (are the brokers registered with this nameserver?)"
            )
        await asyncio.sleep(_ROUTE_POLL_S)  # poll interval of a deadline-bound wait


def _route_matches(route: TopicRoute, expected: dict[str, dict[str, Any]]) -> bool:
    for name, config in expected.items():
        group = route.group(name)
        if (
            group is None
            or group.read_queues != config["read_queues"]
            or group.write_queues != config["write_queues"]
        ):
            return False
    return True


async def create_topic(args: argparse.Namespace) -> int:
    return await _put(args, create=True)


async def update_topic(args: argparse.Namespace) -> int:
    return await _put(args, create=False)


async def delete_topic(args: argparse.Namespace) -> int:
    async with route_cache(args) as routes:
        view = await routes.cluster(args.cluster)
    masters = choose_masters(view, split_names(args.brokers))
    deleted = []
    async with http_session(args) as session:
        for broker in masters:
            url = f"{http_url(broker, args)}/topics/{args.topic}"
            status, answer = await http_json(session, "DELETE", url)
            if status == 200:
                deleted.append(broker.broker_name)
            elif status != 404:
                raise CliError(f"broker {broker.broker_name} refused to delete: {answer}")
    if not deleted:
        raise CliError(f"topic {args.topic} does not exist on any chosen broker")
    if args.json:
        print_json({"deleted": deleted})
    else:
        print(f"topic {args.topic} deleted from {', '.join(deleted)}")
    return 0


async def list_topics(args: argparse.Namespace) -> int:
    async with route_cache(args) as routes:
        view = await routes.cluster(args.cluster)
    masters = choose_masters(view, split_names(args.brokers))
    rows: list[list[object]] = []
    async with http_session(args) as session:
        for broker in masters:
            for name, config in sorted((await _broker_topics(session, broker, args)).items()):
                rows.append(
                    [
                        name,
                        broker.broker_name,
                        config["read_queues"],
                        config["write_queues"],
                        config["perm"],
                        config["ordered"],
                    ]
                )
    rows.sort(key=lambda row: (str(row[0]), str(row[1])))
    if args.json:
        keys = ["topic", "group", "read_queues", "write_queues", "perm", "ordered"]
        print_json([dict(zip(keys, row, strict=True)) for row in rows])
    elif rows:
        table(["topic", "group", "read queues", "write queues", "perm", "ordered"], rows)
    else:
        print("no topics")
    return 0


async def show_route(args: argparse.Namespace) -> int:
    async with route_cache(args) as routes:
        route = await routes.route(args.topic)
    if args.json:
        print_json(
            {
                "topic": route.topic,
                "groups": [dataclasses.asdict(g) for g in route.groups],
                "write_queues": [str(q) for q in route.write_queues],
                "read_queues": [str(q) for q in route.read_queues],
            }
        )
        return 0
    table(
        ["group", "cluster", "epoch", "room", "master", "brokers", "read", "write", "perm",
         "ordered"],
        [
            [g.broker_name, g.cluster, g.epoch, g.computer_room, g.master_address or "-",
             ",".join(g.addresses), g.read_queues, g.write_queues, g.permission_name, g.ordered]
            for g in route.groups
        ],
    )  # fmt: skip
    print(f"{len(route.write_queues)} writable, {len(route.read_queues)} readable queues")
    return 0


async def topic_stats(args: argparse.Namespace) -> int:
    async with route_cache(args) as routes:
        route = await routes.route(args.topic)
    pool = ConnectionPool(
        connect_timeout_s=args.timeout, credentials=credentials(args), tls=tls_settings(args)
    )
    try:
        answers = await asyncio.gather(
            *(_query_offsets(pool, args, q.address, q.queue_id) for q in route.read_queues)
        )
    finally:
        await pool.close()
    rows = [
        [q.broker_name, q.queue_id, a.min_offset, a.max_offset, a.max_offset - a.min_offset]
        for q, a in zip(route.read_queues, answers, strict=True)
    ]
    if args.json:
        keys = ["group", "queue_id", "min_offset", "max_offset", "messages"]
        print_json([dict(zip(keys, row, strict=True)) for row in rows])
        return 0
    table(["group", "queue", "min offset", "max offset", "messages"], rows)
    total = sum(int(str(row[4])) for row in rows)
    print(f"{total} messages in {len(rows)} queues")
    return 0


async def _query_offsets(
    pool: ConnectionPool, args: argparse.Namespace, address: str, queue_id: int
) -> QueryOffsetResponse:
    connection = await pool.get(address)
    header = QueryOffsetRequest(topic=args.topic, queue_id=queue_id).SerializeToString()
    frame = await connection.request(FrameType.QUERY_OFFSET, header, timeout_s=args.timeout)
    return QueryOffsetResponse.FromString(frame.header)
