"""HTTP helpers for tests: the broker's admin API, health and metrics through aiohttp."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from metaq.common import http
from metaq.common.http_auth import HEADER, signed_purpose
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials, sign_request


async def http_json(
    method: str,
    url: str,
    body: Any = None,
    credentials: Credentials | None = None,
    *,
    tls: TlsConfig | None = None,
) -> tuple[int, Any]:
    """(status, parsed JSON body) of one request (HTTPS trusting ``tls``'s CA when given);
    the session is closed before returning. With ``credentials`` the request is signed (a
    broker with auth_enabled needs it)."""
    sent = http.json_for(method, body)
    data = json.dumps(sent).encode() if sent is not None else b""
    headers = {"Content-Type": http.JSON_TYPE} if sent is not None else {}
    if credentials is not None:
        path = URL(url).path_qs
        headers[HEADER] = sign_request(credentials, signed_purpose(method, path), data, time.time())
    ssl = tls.client_context() if tls is not None else True
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, data=data or None, headers=headers, ssl=ssl) as response,
    ):
        return response.status, await response.json()


async def put_topic(
    http_url: str,
    name: str,
    *,
    read_queues: int = 4,
    write_queues: int = 4,
    perm: str = "read-write",
    credentials: Credentials | None = None,
    tls: TlsConfig | None = None,
) -> None:
    status, body = await http_json(
        "PUT",
        f"{http_url}/topics/{name}",
        {"read_queues": read_queues, "write_queues": write_queues, "perm": perm},
        credentials,
        tls=tls,
    )
    if status != 200:
        raise AssertionError(f"creating topic {name} failed: {status} {body}")


async def scrape(http_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    async with aiohttp.ClientSession() as session, session.get(f"{http_url}/metrics") as response:
        if response.status != 200:
            raise AssertionError(f"/metrics answered {response.status}")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples
