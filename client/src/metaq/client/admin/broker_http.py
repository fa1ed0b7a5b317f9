"""Calls to the brokers' HTTP admin APIs: one aiohttp session, TLS, signing, timeouts.

A broker is named by its HTTP address (``host:port``, as it registers it) or by a base
URL (``https://host:port``). Every call is bounded by ``timeout_s``. A request is signed
with a user's credentials (brokers with ``auth_enabled`` check them against the ACL) or
with the cluster secret (what the nameservers' console proves: a cluster member), over
the path as it goes on the wire and the broker it is sent to (``host:port`` of the URL),
so that no other server takes it.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from metaq.client.errors import BrokerAdminError, BrokerAnswerUnreadable, BrokerUnreachable
from metaq.common import http
from metaq.common.auth import ClusterSecret
from metaq.common.http_auth import sign_headers
from metaq.common.server_names import http_target
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials

if TYPE_CHECKING:
    import aiohttp


class BrokerHttp:
    """The HTTP side of :class:`~metaq.client.admin.Admin`.

    Between :meth:`open` and :meth:`close` one session serves every call (opened on first
    use, importing aiohttp then, so clients that never call a broker's admin API do not
    pay for it); outside them each call opens and closes a session of its own, so a
    one-shot call needs no cleanup.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
        secret: ClusterSecret | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._tls = tls
        self._credentials = credentials
        self._secret = secret
        self._session: aiohttp.ClientSession | None = None
        self._kept = False

    def open(self) -> None:
        """Keep one session for every call until :meth:`close`."""
        self._kept = True

    def base_url(self, broker: str) -> str:
        """``broker``'s base URL: HTTPS when the admin speaks TLS."""
        if "://" in broker:
            return broker.rstrip("/")
        return f"{'https' if self._tls is not None else 'http'}://{broker}"

    async def request(
        self, broker: str, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """(status, JSON answer) of one call; ``path`` is percent-encoded already.

        BrokerUnreachable when no answer came within the timeout; BrokerAnswerUnreadable
        when the answer is not JSON. Statuses are the caller's to judge.
        """
        text_status, text = await self._send(broker, method, path, body)
        try:
            return text_status, json.loads(text) if text else None
        except ValueError:
            raise BrokerAnswerUnreadable(
                broker, text_status, f"answered something that is not JSON: {text[:200]!r}"
            ) from None

    async def text(self, broker: str, path: str) -> str:
        """The text answer of a GET (``/metrics``); BrokerAdminError unless 200."""
        status, text = await self._send(broker, "GET", path, None)
        if status != 200:
            raise BrokerAdminError(broker, status, text[:200])
        return text

    async def _send(self, broker: str, method: str, path: str, body: Any) -> tuple[int, str]:
        import aiohttp
        from yarl import URL

        url = URL(f"{self.base_url(broker)}{path}", encoded=True)
        sent = http.json_for(method, body)
        data = json.dumps(sent).encode() if sent is not None else b""
        headers = {"Content-Type": http.JSON_TYPE} if sent is not None else {}
        if url.host is None or url.port is None:
            raise BrokerUnreachable(broker, str(url), "the address names no host and port")
        headers.update(
            sign_headers(
                method, http_target(url.host, url.port), url.raw_path_qs, data,
                secret=self._secret, credentials=self._credentials,
            )
        )  # fmt: skip
        session = self._session
        if session is None:
            ssl = self._tls.client_context() if self._tls is not None else None
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl) if ssl is not None else None
            )
            if self._kept:
                self._session = session
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.request(
                    method, url, data=data or None, headers=headers
                ) as response:
                    return response.status, await response.text(errors="replace")
        except TimeoutError:
            raise BrokerUnreachable(broker, str(url), "TimeoutError", timed_out=True) from None
        except aiohttp.ClientError as exc:
            why = str(exc) or type(exc).__name__
            raise BrokerUnreachable(broker, str(url), why) from None
        finally:
            if session is not self._session:
                await session.close()

    async def close(self) -> None:
        self._kept = False
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
