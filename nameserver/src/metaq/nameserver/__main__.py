"""``metaq-nameserver``: run one nameserver until SIGTERM or SIGINT.

Once serving it prints one line to stdout, which scripts and tests wait for::

    metaq-nameserver ready grpc=HOST:PORT [http=HOST:PORT] [raft=HOST:PORT]

with the ports actually bound (``raft`` when the controller has peers). Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop

from metaq.nameserver.config import config_from, parser
from metaq.nameserver.process import NameServer

log = logging.getLogger("metaq.nameserver")


def readiness_line(server: NameServer) -> str:
    line = f"metaq-nameserver ready grpc={server.grpc_address}"
    if server.http_address:
        line += f" http={server.http_address}"
    if server.controller.networked:
        line += f" raft={server.controller.address}"
    return line


async def serve(server: NameServer) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await server.start()
    try:
        print(readiness_line(server), flush=True)
        await stopping.wait()
        log.info("stopping")
    finally:
        await server.stop()
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = config_from(args)
    except (ValueError, OSError) as exc:
        print(f"metaq-nameserver: {exc}", file=sys.stderr)
        return 2
    if args.check_config is not None:
        print(f"metaq-nameserver: {args.check_config}: a valid nameserver config")
        return 0
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        server = NameServer(config)  # reads the secret and TLS files: a bad one stops us here
    except ValueError as exc:
        print(f"metaq-nameserver: {exc}", file=sys.stderr)
        return 2
    try:
        uvloop.run(serve(server))
    except OSError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
