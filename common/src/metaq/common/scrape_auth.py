"""The credentials ``/metrics`` and ``/health`` may require (``metrics_auth``).

Both pages are open by default, as scrapers and load balancers expect, but they show
topic names, Raft and replica addresses and commitlog positions. A broker or nameserver
with ``metrics_auth = "bearer"`` or ``"basic"`` (the two schemes Prometheus sends:
``authorization`` / ``basic_auth`` in its scrape config) reads a secret from
``metrics_auth_file`` at start-up (the token, or the password of user
``metrics_auth_user``) and then (``metaq.common.http_auth.scrape_guard``):

- ``GET /metrics`` answers only a request that carries the credentials; any other gets
  401 with ``WWW-Authenticate`` naming the scheme;
- ``GET /health`` without credentials says only whether the server is well (its status
  code and ``{"status": ...}``), with them everything it says today.

A request signed by a cluster member or an admin user counts as credentials too: the
nameservers' console reads brokers' health that way. The secret is compared in constant
time and never logged, shown or kept in a ``repr``.

Apart from :func:`load_scrape_credentials` reading one file, nothing here does I/O.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import logging
import stat
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

MIN_SECRET_CHARS: Final = 16
"""A scraper's secret is a machine's, not typed by a person: shorter ones are refused."""
MAX_SECRET_CHARS: Final = 4096
REALM: Final = "metaq metrics"


class MetricsAuth(enum.Enum):
    """What ``/metrics`` and ``/health`` require (``metrics_auth``)."""

    NONE = "none"
    """Open to anyone (the default)."""
    BEARER = "bearer"
    """``Authorization: Bearer TOKEN``: Prometheus' ``authorization.credentials_file``."""
    BASIC = "basic"
    """``Authorization: Basic``: Prometheus' ``basic_auth`` (``username``, ``password_file``)."""


class MetricsAuthError(ValueError):
    """``metrics_auth`` is set but its secret cannot be used; the message says which key."""


def config_problems(scheme: MetricsAuth, file: str, user: str) -> list[str]:
    """What is wrong with a server's ``metrics_auth*`` settings, for its config's checks."""
    if scheme is MetricsAuth.NONE:
        return []
    problems = []
    if not file:
        what = "token" if scheme is MetricsAuth.BEARER else f"password of {user or 'the user'}"
        problems.append(
            f'metrics_auth = "{scheme.value}" needs metrics_auth_file: a file holding the '
            f"{what} (e.g. made with `head -c 32 /dev/urandom | base64 > FILE`)"
        )
    if scheme is MetricsAuth.BASIC and (not user or ":" in user or not user.isprintable()):
        problems.append('metrics_auth = "basic" needs metrics_auth_user, a name without ":"')
    return problems


class ScrapeCredentials:
    """The credentials a server requires of its scrapers; the secret is not shown."""

    __slots__ = ("_expected", "scheme", "source", "user")

    def __init__(self, scheme: MetricsAuth, secret: str, user: str, source: str) -> None:
        if scheme is MetricsAuth.NONE:
            raise ValueError("no credentials for metrics_auth = none")
        if not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
            raise MetricsAuthError(
                f"the metrics secret from {source} is {len(secret)} characters; it needs "
                f"{MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} (use e.g. 32 random bytes in base64)"
            )
        if not secret.isprintable() or (scheme is MetricsAuth.BEARER and " " in secret):
            raise MetricsAuthError(
                f"the metrics secret from {source} holds spaces or control characters, which "
                "an Authorization header cannot carry: use e.g. 32 random bytes in base64"
            )
        self.scheme = scheme
        self.user = user
        self.source = source
        self._expected = (secret if scheme is MetricsAuth.BEARER else f"{user}:{secret}").encode()

    def __repr__(self) -> str:
        return f"ScrapeCredentials({self.scheme.value} from {self.source})"

    @property
    def challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401: what to send."""
        if self.scheme is MetricsAuth.BEARER:
            return f'Bearer realm="{REALM}"'
        return f'Basic realm="{REALM}", charset="UTF-8"'

    def admits(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries these credentials."""
        if not authorization:
            return False
        scheme, _, value = authorization.strip().partition(" ")
        value = value.strip()
        if scheme.lower() != self.scheme.value:
            return False
        if self.scheme is MetricsAuth.BEARER:
            given = value.encode()
        else:
            try:
                given = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return False
        return hmac.compare_digest(given, self._expected)


def load_scrape_credentials(scheme: MetricsAuth, file: str, user: str) -> ScrapeCredentials | None:
    """The credentials ``metrics_auth`` asks for, from ``file`` (surrounding whitespace,
    a trailing newline, is not part of the secret); None when it asks for none. A file
    others than its owner may read is used, with a warning."""
    if scheme is MetricsAuth.NONE:
        return None
    path = Path(file)
    try:
        mode = path.stat().st_mode
        secret = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise MetricsAuthError(
            f"metrics_auth_file {file}: cannot read it ({why}); it holds the secret scrapers "
            f'send under metrics_auth = "{scheme.value}"'
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "metrics_auth_file %s can be read by other users (mode %o): anyone who reads "
            "it can read the metrics; chmod 600 it",
            file,
            stat.S_IMODE(mode),
        )
    credentials = ScrapeCredentials(scheme, secret, user, f"metrics_auth_file {file}")
    log.info("/metrics and the detail of /health need %s credentials", scheme.value)
    return credentials
