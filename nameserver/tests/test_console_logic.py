"""The console's pure parts: rates from samples, times people type, how bodies show."""

from __future__ import annotations

import base64

import pytest
from aiohttp import web

from metaq.client.admin import Admin, MessagesStored, StoredMessage
from metaq.common.model import BrokerKey, BrokerState, BrokerView, Role
from metaq.nameserver.console.context import (
    Brokers,
    ConsoleContext,
    Rates,
    durability_warning,
)
from metaq.nameserver.console.messages import _body
from metaq.nameserver.console.page import Html, esc, table
from metaq.nameserver.console.page import parse_time_ms as _parse_time
from metaq.nameserver.console.samples import Samples
from metaq.nameserver.registry import FORGET_DEPARTED_AFTER_S, Registry
from metaq.testing.waiting import run_async


def test_a_rate_needs_two_samples_and_restarts_after_a_count_goes_down() -> None:
    rates = Rates()
    assert rates.rate("t", 100, now=10.0) is None
    assert rates.rate("t", 160, now=12.0) == pytest.approx(30.0)
    # A broker restarted or left: the count fell, so no rate rather than a negative one.
    assert rates.rate("t", 20, now=13.0) is None
    assert rates.rate("t", 30, now=14.0) == pytest.approx(10.0)


def test_times_are_utc_iso_8601_or_epoch_milliseconds() -> None:
    assert _parse_time("1700000000000") == 1_700_000_000_000
    assert _parse_time("2023-11-14T22:13:20") == 1_700_000_000_000
    assert _parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(ValueError):
        _parse_time("yesterday")


def _message(body: str, encoding: str = "text") -> StoredMessage:
    return StoredMessage(
        "g", "t", 0, 0, 0, "00" * 16, 0, 0, "", [], {}, 0, False, len(body), body, encoding
    )


def test_bodies_show_as_text_pretty_json_or_hex() -> None:
    assert _body(_message("plain words")) == "plain words"
    assert _body(_message('{"a":[1,2]}')) == 'JSON:\n{\n  "a": [\n    1,\n    2\n  ]\n}'
    raw = base64.b64encode(b"\x00\xffA").decode()
    assert _body(_message(raw, "base64")) == "hex: 00 ff 41"


def test_table_cells_are_escaped_unless_built_as_markup() -> None:
    html = table(["a", "b"], [["<script>", Html("<b>ok</b>")]])
    assert "&lt;script&gt;" in html and "<b>ok</b>" in html
    assert esc('"x"') == "&quot;x&quot;"


def test_a_broker_seen_live_and_then_gone_is_named_until_it_is_back_or_forgotten() -> None:
    now = [1000.0]
    registry = Registry(broker_expiry_s=10, clock=lambda: now[0])
    key = BrokerKey("g", 1)
    state = BrokerState("c", key, Role.SLAVE, "127.0.0.1:1", "127.0.0.1:2")
    registry.register(state, {})
    console = ConsoleContext(registry, None, Brokers(1.0), Samples(30.0))  # type: ignore[arg-type]
    assert console.gone() == {}
    registry.unregister(key)  # its process died: the session ended
    now[0] += 30
    line = console.gone()[key]
    assert "broker g/1 (data 127.0.0.1:1, http 127.0.0.1:2)" in line
    assert "last seen live 30 s ago" in line
    registry.register(state, {})
    assert console.gone() == {}
    registry.unregister(key)
    now[0] += FORGET_DEPARTED_AFTER_S + 1
    assert console.gone() == {}


def test_a_store_short_of_its_durability_says_which_part() -> None:
    assert durability_warning(MessagesStored([], durable=True, replicated=True)) == ""
    flushed_late = MessagesStored([], durable=False, replicated=True)
    assert "flush timeout" in durability_warning(flushed_late)
    both = durability_warning(MessagesStored([], durable=False, replicated=False))
    assert "on disk" in both and "confirmed by a slave" in both


def test_a_broker_call_that_fails_is_said_in_plain_words_naming_the_broker() -> None:
    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response({"error": "not its group's master"}, status=409)

    async def not_json(_request: web.Request) -> web.Response:
        return web.Response(text="<html>a proxy</html>", status=200)

    async def other_shape(_request: web.Request) -> web.Response:
        return web.json_response([1, 2])

    async def scenario() -> list[str]:
        app = web.Application()
        app.add_routes(
            [
                web.get("/topics", not_json),
                web.get("/consumers", other_shape),
                web.post("/replication/resume", refuse),
            ]
        )
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        brokers = Brokers(2.0)
        try:
            here = _view(f"127.0.0.1:{port}")
            answers = [
                await brokers.ask(here, Admin.resume_writes),
                await brokers.ask(here, Admin.broker_topics),
                await brokers.ask(here, Admin.consumers),
                await brokers.ask(_view(""), Admin.health),
                await brokers.ask(_view("127.0.0.1:1"), Admin.health),
            ]
            assert all(a.value is None and not a.ok for a in answers)
            return [a.error for a in answers]
        finally:
            await brokers.close()
            await runner.cleanup()

    refused, not_json_, other, no_address, closed = run_async(scenario())
    assert refused.startswith("broker g/1 at 127.0.0.1:") and refused.endswith(
        ": not its group's master"
    ), refused
    assert not_json_.endswith("answered something that is not JSON"), not_json_
    assert other.endswith("answered JSON of another shape"), other
    assert no_address == (
        "broker g/1 at 127.0.0.1:5 has no HTTP address registered (started without one)"
    )
    assert closed.startswith("broker g/1 at 127.0.0.1:1 is unreachable ("), closed


def _view(http_address: str) -> BrokerView:
    registry = Registry(broker_expiry_s=10)
    registry.register(
        BrokerState("c", BrokerKey("g", 1), Role.MASTER, "127.0.0.1:5", http_address), {}
    )
    [view] = registry.members("g")
    return view
