"""``metaq-broker`` / ``python -m metaq.broker``: run one broker until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Final

from metaq.broker.announce import nameserver_registrar
from metaq.broker.config import BrokerConfig, build_parser, config_from
from metaq.broker.limits import set_nice
from metaq.broker.process import Broker
from metaq.common.config import ConfigError
from metaq.common.errors import MetaqError

log = logging.getLogger("metaq.broker")

GIL_SWITCH_INTERVAL_S: Final = 0.0005


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; this is a fallback
        return asyncio.new_event_loop
    return uvloop.new_event_loop


async def run(config: BrokerConfig) -> int:
    """Start the broker, print the readiness line, serve until a stop signal; exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker = Broker(config, registrar_factory=nameserver_registrar if config.nameservers else None)
    try:
        await broker.start()
    except (OSError, MetaqError, ValueError) as exc:
        log.error("metaq-broker failed to start: %s", exc)
        await broker.stop()
        return 1
    # What start-up built (modules, protobuf and gRPC descriptors, the store's tables)
    # lives as long as the process: out of the collector's view, a full collection walks
    # only what serving creates, instead of pausing the loop for tens of milliseconds.
    gc.collect()
    gc.freeze()
    # The loop shares the GIL with the dispatcher, flusher and cold-read threads. At
    # CPython's default 5 ms switch interval, a thread that wants it from a busy loop
    # waits up to 5 ms, and the loop as long for a busy thread: while a backlog is
    # drained those waits become every other client's tail latency (docs/benchmarks.md,
    # "Figures behind design choices").
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    print(broker.ready_line, flush=True)
    await stop.wait()
    log.info("stop signal received; shutting down")
    await broker.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from(args)
    except ConfigError as exc:
        print(f"metaq-broker: {exc}", file=sys.stderr)
        return 2
    if args.check_config is not None:
        print(f"metaq-broker: {args.check_config}: a valid broker config")
        return 0
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    set_nice(config.nice)  # first: the threads started later take it
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
