"""``metaq broker status`` and ``metaq broker config get|set``: one broker's health and
the settings it may change while it runs.

    metaq broker status [BROKER]
    metaq broker config get BROKER [NAME]
    metaq broker config set BROKER NAME VALUE

BROKER is ``GROUP/ID`` or ``GROUP`` (its master). ``status`` without one lists every
broker (down ones too). The settings a running broker takes are its retention, disk
thresholds, async flush interval, cold-read budget and log level; a change is kept in its
data directory across restarts (``live_settings.json``), and any other setting is
refused: change it in the broker's config file and restart it.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import msgspec

from metaq.client.admin import BrokerHealth
from metaq.client.cli.support import (
    CliError,
    add_command,
    add_group,
    admin,
    key_values,
    print_json,
    table,
)
from metaq.common.errors import MetaqError

_BROKER_HELP = "GROUP/ID, or GROUP for its master"


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "broker", help="one broker's status and live settings")
    parser = add_command(
        group,
        "status",
        status,
        help="health of every broker, or all of one",
        description="Without BROKER, one line per broker: role, whether it takes writes, "
        "epoch, disk use, log end, uptime and version (down brokers too). With BROKER, "
        "everything its /health says.",
    )
    parser.add_argument("broker", nargs="?", help=_BROKER_HELP)
    config = add_group(group, "config", help="the settings a running broker may change")
    parser = add_command(
        config,
        "get",
        config_get,
        help="a broker's live settings and their values",
        description="The settings a running broker may change, with their values; those "
        "changed live are marked (they are kept across its restarts).",
    )
    parser.add_argument("broker", help=_BROKER_HELP)
    parser.add_argument("name", nargs="?", help="only this setting")
    parser = add_command(
        config, "set", config_set, help="change a live setting", description=__doc__
    )
    parser.add_argument("broker", help=_BROKER_HELP)
    parser.add_argument("name", help="the setting, as in the config file (store.retention_hours)")
    parser.add_argument("value", help="its new value")


async def status(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        if args.broker:
            found = await client.health(await client.broker(args.broker))
            if args.json:
                print_json(_health_json(found))
            else:
                key_values(list(_health_json(found).items()))
            return 0
        view = await client.cluster()
        brokers = view.brokers(down=True)
        live = [b for b in brokers if not b.down]
        answers = await asyncio.gather(*(client.health(b) for b in live), return_exceptions=True)
    health: dict[tuple[str, int], BrokerHealth | str] = {}
    for b, answer in zip(live, answers, strict=True):
        if isinstance(answer, BaseException) and not isinstance(answer, MetaqError):
            raise answer
        health[(b.broker_name, b.broker_id)] = (
            answer if isinstance(answer, BrokerHealth) else f"unreachable: {answer}"
        )
    rows = []
    for b in brokers:
        h = health.get((b.broker_name, b.broker_id))
        if isinstance(h, BrokerHealth):
            state = "ok" if h.writable else f"not writable: {h.reason}"
            rows.append([f"{b.broker_name}/{b.broker_id}", h.role, state, h.epoch,
                         f"{h.disk_used_ratio:.0%}", h.commitlog_write_offset,
                         f"{h.uptime_s:.0f}s", h.version or None])  # fmt: skip
        else:
            state = "down" if b.down else (h or "unknown")
            rows.append([f"{b.broker_name}/{b.broker_id}", b.state.role, state, b.state.epoch,
                         None, b.state.commitlog_max_offset, None, None])  # fmt: skip
    if args.json:
        keys = ["broker", "role", "status", "epoch", "disk", "commitlog", "uptime", "version"]
        print_json([dict(zip(keys, row, strict=True)) for row in rows])
        return 0
    table(["broker", "role", "status", "epoch", "disk", "commitlog", "uptime", "version"], rows)
    return 0


def _health_json(found: BrokerHealth) -> dict[str, Any]:
    shown: dict[str, Any] = msgspec.structs.asdict(found)
    return shown


async def config_get(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        found = await client.broker_config(await client.broker(args.broker))
    settings = found.settings
    if args.name:
        if args.name not in settings:
            raise CliError(
                f"{args.name} is not a setting a running broker changes; live settings: "
                f"{', '.join(settings)}"
            )
        settings = {args.name: settings[args.name]}
    if args.json:
        print_json(
            {
                "broker_name": found.broker_name,
                "settings": settings,
                "changed_live": found.changed_live,
            }
        )
        return 0
    table(
        ["setting", "value", "changed live"],
        [[name, value, name in found.changed_live] for name, value in settings.items()],
    )
    return 0


async def config_set(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        broker = await client.broker(args.broker)
        value = await client.set_broker_config(broker, args.name, args.value)
    if args.json:
        print_json({"broker": f"{broker.broker_name}/{broker.broker_id}", args.name: value})
    else:
        print(f"{broker.broker_name}/{broker.broker_id}: {args.name} = {value} (kept across "
              "restarts)")  # fmt: skip
    return 0
