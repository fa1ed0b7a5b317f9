"""The broker's HTTP side, for people and scrapers: health, metrics and a small admin API.

- ``GET /health`` — 200 ``{"status": "ok", ...}`` while the store takes writes, 503
  ``{"status": "not-writable", "reason": ...}`` while it refuses them (disk full, I/O
  errors, a background thread died, shutting down; reads go on). With ``metrics_auth``,
  a request without credentials gets the status code and ``{"status": ...}`` only.
- ``GET /metrics`` — Prometheus text format; with ``metrics_auth`` only with credentials
  (:mod:`metaq.common.scrape_auth`).
- ``GET /topics``, ``PUT /topics/{name}`` (JSON: read_queues, write_queues, perm,
  ordered; creates or replaces), ``DELETE /topics/{name}``.
- ``GET /consumers`` — live members per consumer group; ``GET /producers`` — the
  connected producers that said who they are; ``GET /offsets`` — committed consumer
  offsets with their lag.
- ``GET /config`` — the settings a running broker may change, with their values and
  which were changed live; ``PUT /config/{name}`` ``{"value": v}`` — change one, kept
  across restarts (:mod:`metaq.broker.live_settings`); 400 for any other setting or a
  wrong value. Any broker takes it, master or slave: settings are per broker.
- ``GET /messages/{msg_id}`` (32 hex digits) — one stored message, 404 if this broker
  has none; ``GET /messages?topic=T&key=K[&limit=N]`` — messages carrying a key, newest
  first. Bodies come inflated, as text when they are UTF-8, else base64.
- Per queue and per consumer group, for the nameservers' console: see
  :mod:`metaq.broker.http_queues`.
"""

from __future__ import annotations

import base64
import dataclasses
import ssl
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from metaq.broker.config import BrokerConfig
from metaq.broker.consumers import ConsumerGroups
from metaq.broker.live_settings import LIVE, LiveSettings, SettingRefused, current
from metaq.broker.log_check import LogCheck
from metaq.broker.metrics import BrokerMetrics
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.producers import ProducerConnections
from metaq.broker.role import GroupRole
from metaq.broker.stats import StatsWindow
from metaq.broker.store import MessageStore
from metaq.broker.topics import TopicTable
from metaq.common import http
from metaq.common.errors import InvalidMessage, MetaqError, StoreUnavailable
from metaq.common.http_auth import HttpAuth, SignedRequests, scrape_guard, shows_detail
from metaq.common.model import TOPIC_PERMISSIONS, Permission, TopicConfig
from metaq.common.names import shown
from metaq.common.record import FLAG_COMPRESSED, Record
from metaq.common.scrape_auth import ScrapeCredentials
from metaq.common.version import installed_version


@dataclass(frozen=True, slots=True)
class HttpContext:
    broker_name: str
    role: GroupRole
    store: MessageStore
    topics: TopicTable
    offsets: ConsumerOffsets
    groups: ConsumerGroups
    metrics: BrokerMetrics
    started_monotonic: float
    stopping: Callable[[], bool]
    signed: SignedRequests
    """Requests signed for this broker; its names are set once the port is bound."""
    auth: HttpAuth | None = None
    """With auth_enabled: who may use the admin API (``metaq.common.http_auth``)."""
    serving_refusal: Callable[[], str | None] = lambda: None
    """Why the data plane takes no connection now (None: it does)."""
    scrape: ScrapeCredentials | None = None
    """With metrics_auth: what /metrics and the detail of /health need."""
    count: Callable[[str], None] = lambda _reason: None
    """Counts a refusal by reason (``metaq_auth_denied_total``)."""
    producers: ProducerConnections = field(default_factory=ProducerConnections)
    """The connected producers that said who they are."""
    settings: LiveSettings | None = None
    """The settings that may change live (``GET /config``, ``PUT /config/{name}``)."""
    config: Callable[[], BrokerConfig] | None = None
    """The broker's settings now."""
    reconfigure: Callable[[BrokerConfig], None] = lambda _config: None
    """Puts a changed config into effect."""
    stats: StatsWindow | None = None
    """In and out rates over the last minute (``GET /stats``)."""
    scheduled: Callable[[], dict[str, Any]] = lambda: {"delayed": None, "transactions": None}
    """Delayed messages and transactions waiting (``GET /scheduled``)."""


@web.middleware
async def _store_unavailable(request: web.Request, handler: http.Handler) -> web.StreamResponse:
    """A change the store cannot write now (the disk at its reserve, I/O errors) is 507
    with the store's reason, as a SEND is refused with STORE_UNAVAILABLE; nothing of it
    is kept (a topic change is rolled back)."""
    try:
        return await handler(request)
    except StoreUnavailable as exc:
        what = f"{request.method} {shown(request.path)}"
        return web.json_response(
            {"error": f"{what}: the broker stores nothing now: {exc}"}, status=507
        )


class HttpServer:
    """An aiohttp app on its own port; :meth:`start` returns the bound address."""

    def __init__(self, context: HttpContext) -> None:
        self._context = context
        app = http.application(context.auth)
        if context.scrape is not None:
            app.middlewares.append(scrape_guard(context.scrape, context.signed, context.count))
        app.middlewares.append(_store_unavailable)
        app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/metrics", self.metrics),
                web.get("/stats", self.stats),
                web.get("/topics", self.list_topics),
                web.put("/topics/{name}", self.put_topic),
                web.delete("/topics/{name}", self.delete_topic),
                web.get("/consumers", self.consumers),
                web.get("/producers", self.producers),
                web.get("/scheduled", self.scheduled),
                web.get("/config", self.get_config),
                web.put("/config/{name}", self.set_config),
                web.get("/offsets", self.offsets),
                web.get("/messages/{msg_id}", self.message_by_id),
                web.get("/messages", self.messages_by_key),
                web.post("/replication/handover", self.handover),
                web.post("/replication/resume", self.resume_writes),
            ]
        )
        # Imported here: that module builds on this one's context and message_json.
        from metaq.broker import http_queues

        http_queues.add_routes(app, context)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)

    async def start(
        self, host: str, port: int, tls: ssl.SSLContext | None = None
    ) -> tuple[str, int]:
        """Serve HTTP, or HTTPS with ``tls``."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True, ssl_context=tls)
        await site.start()
        bound = self._runner.addresses[0]
        self._context.signed.names.listening(int(bound[1]), host, str(bound[0]))
        return str(bound[0]), int(bound[1])

    async def stop(self) -> None:
        await self._runner.cleanup()

    # --- handlers ---------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        c = self._context
        reason = c.store.refusal or c.serving_refusal()
        if c.stopping():
            reason = "the broker is shutting down"
        status = 200 if reason is None else 503
        if not shows_detail(request):
            return web.json_response({"status": "ok" if reason is None else "not-writable"},
                                     status=status)  # fmt: skip
        body = {
            "status": "ok" if reason is None else "not-writable",
            "reason": reason,
            "broker_name": c.broker_name,
            "version": installed_version("metaq-broker"),
            "role": c.role.role.value,
            "epoch": c.role.epoch,
            "master_address": c.role.master_address,
            "in_sync_ids": list(c.role.in_sync_ids()),
            "electable_ids": list(c.role.electable_ids()),
            "replica_lag_bytes": {str(k): v for k, v in c.role.lag_bytes().items()},
            "replica_lag_s": {str(k): round(v, 3) for k, v in c.role.lag_seconds().items()},
            "held_offsets": len(c.offsets.held),
            "verified": c.role.verified,
            "log_check": _log_check(c.role.check, c.store),
            "uptime_s": round(time.monotonic() - c.started_monotonic, 3),
            "commitlog_write_offset": c.store.commitlog.write_offset,
            "commitlog_durable_offset": c.store.flusher.durable,
            # Use as df counts it, and the bytes it is made of; writes stop at
            # disk_full_ratio, or when the available bytes reach disk_reserve_bytes.
            "disk_used_ratio": round(c.store.guard.disk_ratio, 4),
            "disk_used_bytes": c.store.guard.used_bytes,
            "disk_available_bytes": c.store.guard.available_bytes,
            # The thresholds and modes the console shows beside the figures.
            "disk_clean_ratio": c.store.config.disk_clean_ratio,
            "disk_full_ratio": c.store.config.disk_full_ratio,
            "disk_reserve_bytes": c.store.config.disk_reserve_bytes,
            "flush_mode": c.store.config.flush_mode.value,
            "replication_mode": c.role.config.replication_mode.value,
            "retention_hours": c.store.config.retention_hours,
        }
        return web.json_response(body, status=status)

    async def metrics(self, _request: web.Request) -> web.Response:
        response = web.Response(body=self._context.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def stats(self, _request: web.Request) -> web.Response:
        """Per topic and per consumer group: messages in and out so far, and per second
        over the last minute (:mod:`metaq.broker.stats`)."""
        stats = self._context.stats
        if stats is None:
            return web.json_response({"error": "this broker keeps no stats"}, status=404)
        return web.json_response(stats.report())

    async def list_topics(self, _request: web.Request) -> web.Response:
        topics = self._context.topics
        return web.json_response(
            {"version": topics.version, "topics": {t.name: t.to_json() for t in topics.all()}}
        )

    async def put_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await http.json_object(request)
        try:
            config = _topic_from_json(name, body, self._context.topics.default_queue_count)
        except (ValueError, InvalidMessage) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        refused = self._refuse_on_slave()
        if refused is not None:
            return refused
        self._context.topics.put(config)
        return web.json_response({name: config.to_json()})

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        refused = self._refuse_on_slave()
        if refused is not None:
            return refused
        if not self._context.topics.delete(name):
            return web.json_response({"error": f"no topic {shown(name)}"}, status=404)
        return web.json_response({"deleted": name})

    async def handover(self, request: web.Request) -> web.Response:
        """Planned switchover, step one (``metaq cluster switchover`` drives it): stop
        taking writes until slave ``to`` holds the whole log. Body: ``{"to": id,
        "timeout_ms": n, "fence_ms": n}``; writes resume by themselves after fence_ms."""
        body = await http.json_object(request)
        try:
            target = int(body["to"])
            timeout_s = int(body.get("timeout_ms", 5000)) / 1e3
            fence_s = int(body.get("fence_ms", 10000)) / 1e3
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response(
                {"error": f'expected {{"to": broker id, "timeout_ms": n}}: {exc!r}'}, status=400
            )
        try:
            end = await self._context.role.handover(target, timeout_s, fence_s)
        except MetaqError as exc:
            return web.json_response({"error": str(exc)}, status=409)
        return web.json_response({"end": end, "to": target})

    async def resume_writes(self, _request: web.Request) -> web.Response:
        self._context.role.resume()
        return web.json_response({"resumed": True})

    def _refuse_on_slave(self) -> web.Response | None:
        """Topics reach slaves through the master's journal; a change here would be lost."""
        role = self._context.role
        if role.replicas is not None:
            return None
        master = f" ({role.master_address})" if role.master_address else ""
        return web.json_response(
            {
                "error": f"broker is not its group's master; change topics on the master"
                f"{master}: slaves take them from it"
            },
            status=409,
        )

    async def get_config(self, _request: web.Request) -> web.Response:
        c = self._context
        if c.settings is None or c.config is None:
            return web.json_response({"error": "this broker changes no setting live"}, status=404)
        config = c.config()
        return web.json_response(
            {
                "broker_name": c.broker_name,
                "settings": {name: current(config, name) for name in LIVE},
                "changed_live": c.settings.overrides,
            }
        )

    async def set_config(self, request: web.Request) -> web.Response:
        c = self._context
        if c.settings is None or c.config is None:
            return web.json_response({"error": "this broker changes no setting live"}, status=404)
        name = request.match_info["name"]
        body = await http.json_object(request)
        if set(body) != {"value"}:
            return web.json_response({"error": 'expected {"value": the new value}'}, status=400)
        try:
            new = c.settings.set(c.config(), name, body["value"], c.reconfigure)
        except SettingRefused as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"name": name, "value": current(new, name), "kept": True})

    async def consumers(self, _request: web.Request) -> web.Response:
        groups = self._context.groups.groups()
        return web.json_response(
            {
                group: [
                    {
                        "client_id": m.client_id,
                        "computer_room": m.computer_room,
                        "host": m.host,
                        "mode": m.mode.value,
                        "subscriptions": [list(s) for s in m.subscriptions],
                        "client_version": m.client_version,
                        "language": m.language,
                    }
                    for m in members
                ]
                for group, members in groups.items()
            }
        )

    async def producers(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"producers": [dataclasses.asdict(p) for p in self._context.producers.all()]}
        )

    async def scheduled(self, _request: web.Request) -> web.Response:
        return web.json_response(self._context.scheduled())

    async def offsets(self, _request: web.Request) -> web.Response:
        store = self._context.store
        rows = [
            {
                "group": group,
                "topic": topic,
                "queue_id": queue_id,
                "offset": offset,
                "lag": max(store.max_offset(topic, queue_id) - offset, 0),
            }
            for (group, topic, queue_id), offset in self._context.offsets.items()
        ]
        return web.json_response(rows)

    async def message_by_id(self, request: web.Request) -> web.Response:
        raw = request.match_info["msg_id"]
        try:
            msg_id = bytes.fromhex(raw)
        except ValueError:
            msg_id = b""
        if len(msg_id) != 16:
            return web.json_response(
                {"error": f"a message id is 32 hex digits, not {shown(raw)}"}, status=400
            )
        found = self._context.store.lookup_id(msg_id)
        if found is None:
            return web.json_response(
                {"error": f"no message {raw} on broker {self._context.broker_name}"}, status=404
            )
        return web.json_response(message_json(found, self._context.broker_name))

    async def messages_by_key(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        key = request.query.get("key", "")
        try:
            limit = int(request.query.get("limit", "32"))
        except ValueError:
            limit = 0
        if not topic or not key or not 0 < limit <= 1000:
            return web.json_response(
                {"error": "give topic, key and optionally limit (1-1000)"}, status=400
            )
        found = self._context.store.lookup_key(topic, key, limit=limit)
        name = self._context.broker_name
        return web.json_response({"messages": [message_json(r, name) for r in found]})


def message_json(found: Record, broker_name: str) -> dict[str, Any]:
    """A stored message for people: body inflated, as text if it is UTF-8, else base64."""
    body = found.body
    compressed = bool(found.flags & FLAG_COMPRESSED)
    if compressed:
        try:
            body = zlib.decompress(body)
        except zlib.error:
            compressed = False  # shown as stored
    try:
        text, encoding = body.decode(), "text"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode(), "base64"
    return {
        "broker_name": broker_name,
        "topic": found.topic,
        "queue_id": found.queue_id,
        "queue_offset": found.queue_offset,
        "commitlog_offset": found.commitlog_offset,
        "msg_id": found.msg_id.hex(),
        "born_timestamp_ms": found.born_timestamp_ms,
        "store_timestamp_ms": found.store_timestamp_ms,
        "tags": found.tags,
        "keys": list(found.keys),
        "properties": dict(found.properties),
        "flags": found.flags,
        "compressed": compressed,
        "size": found.size,
        "body": text,
        "body_encoding": encoding,
    }


_TOPIC_KEYS = {"read_queues", "write_queues", "perm", "ordered"}


def _topic_from_json(name: str, body: dict[str, Any], default_queues: int) -> TopicConfig:
    unknown = set(body) - _TOPIC_KEYS
    if unknown:
        raise InvalidMessage(f"unknown keys {sorted(unknown)}; known: {sorted(_TOPIC_KEYS)}")
    queues = {}
    for key in ("read_queues", "write_queues"):
        value = body.get(key, default_queues)
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidMessage(f"{key} must be an integer")
        queues[key] = value
    ordered = body.get("ordered", False)
    if not isinstance(ordered, bool):
        raise InvalidMessage("ordered must be true or false")
    try:
        permission = Permission.from_text(body.get("perm", Permission.READ_WRITE.topic_text))
    except (TypeError, ValueError):
        permission = Permission.NONE  # refused below, as is NONE itself
    if permission not in TOPIC_PERMISSIONS:
        known = ", ".join(p.topic_text for p in TOPIC_PERMISSIONS)
        raise InvalidMessage(f"perm must be one of {known}")
    return TopicConfig(name, queues["read_queues"], queues["write_queues"], permission, ordered)


def _log_check(check: LogCheck | None, store: MessageStore) -> dict[str, object] | None:
    if check is None:
        return None
    return {
        "checked_to": check.checked_to,
        "done": check.done,
        "damaged_records": len(store.commitlog.damaged),
        "problem": check.problem or None,
    }
