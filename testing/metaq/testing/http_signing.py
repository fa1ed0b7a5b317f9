"""Signed HTTP requests as a test makes them by hand: for a URL, whose host and port are
the server the signature is for (what :class:`metaq.client.admin.Admin` does for its
calls), so that a test can send one there, or copy it to another server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from metaq.common.auth import ClusterSecret
from metaq.common.http_auth import sign_headers
from metaq.common.server_names import http_target
from metaq.common.users import Credentials
from metaq.testing.waiting import cluster_secret_for_tests


def signed_for(
    url: str,
    method: str = "GET",
    body: bytes = b"",
    *,
    credentials: Credentials | None = None,
    secret: ClusterSecret | None = None,
) -> dict[str, str]:
    """Headers signing ``method url`` with ``body``: as the user of ``credentials`` when
    given, else as a cluster member with ``secret`` (by default the tests' own)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    path_qs = parts.path + (f"?{parts.query}" if parts.query else "")
    if credentials is None and secret is None:
        secret = cluster_secret_for_tests()
    return sign_headers(
        method, http_target(parts.hostname, parts.port), path_qs, body,
        secret=secret if credentials is None else None, credentials=credentials,
    )  # fmt: skip


def http_json(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, Any, dict[str, str]]:
    """(status, JSON answer, headers) of one request, also when it is refused."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}"), dict(response.headers)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)
