"""The client's errors; each carries ``retriable`` so retry loops read policy, not types."""

from __future__ import annotations

from collections.abc import Sequence

from metaq.common.errors import ErrorCode, MetaqError


class BrokerError(MetaqError):
    """A broker answered a request with an ERROR frame.

    ``code``, ``retriable`` and ``master_address`` are the broker's (``ErrorResponse``);
    ``detail`` is its message alone, ``str(exc)`` adds the code and the broker's address.
    """

    def __init__(
        self,
        code: ErrorCode,
        detail: str,
        *,
        retriable: bool,
        master_address: str = "",
        broker: str = "",
    ) -> None:
        where = f" (broker {broker})" if broker else ""
        super().__init__(f"{code.name}: {detail}{where}")
        self.code = code
        self.detail = detail
        self.retriable = retriable
        self.master_address = master_address
        self.broker = broker


class ConnectionLost(MetaqError):
    """The connection to a broker could not be opened or dropped with requests in flight.

    Retriable: the request may succeed on a new connection or another broker. A send in
    flight when the connection dropped may nevertheless have been stored (at least once).
    """

    retriable = True
    code = ErrorCode.INTERNAL

    def __init__(self, address: str, reason: str, *, never_sent: bool = False) -> None:
        super().__init__(f"connection to broker {address} lost: {reason}")
        self.address = address
        self.reason = reason
        self.never_sent = never_sent
        """The connection could not even be opened: the request surely took no effect."""


class RequestTimeout(MetaqError, TimeoutError):
    """No answer within the request's timeout; the request may still have taken effect."""

    retriable = True
    code = ErrorCode.INTERNAL


class UnknownTopic(MetaqError):
    """No live broker serves the topic (and the broker does not create it on a send)."""

    retriable = False
    code = ErrorCode.UNKNOWN_TOPIC

    def __init__(self, topic: str, detail: str = "") -> None:
        text = f"unknown topic {topic!r}: no live broker serves it"
        super().__init__(f"{text} ({detail})" if detail else text)
        self.topic = topic


class NoNameServer(MetaqError):
    """No nameserver answered; says which addresses were tried and why each failed."""

    retriable = True
    code = ErrorCode.INTERNAL

    def __init__(self, tried: Sequence[tuple[str, str]]) -> None:
        if tried:
            detail = "; ".join(f"{address}: {why}" for address, why in tried)
            text = f"no nameserver answered (tried {len(tried)}): {detail}"
        else:
            text = "no nameserver addresses were given"
        super().__init__(text)
        self.tried = tuple(tried)


class NoWritableQueue(MetaqError):
    """The topic is routed, but no broker group takes writes for it right now."""

    retriable = True
    code = ErrorCode.NO_PERMISSION

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"topic {topic!r} has no writable queue: no master broker serves it with write "
            "permission right now"
        )
        self.topic = topic


class ProducerClosed(MetaqError):
    """The producer was closed (or never started); the message was not sent."""

    retriable = False
    code = ErrorCode.INTERNAL


class AdminError(MetaqError):
    """An admin operation could not be done as asked (:class:`metaq.client.admin.Admin`);
    the message says why in words an operator can act on."""

    retriable = False
    code = ErrorCode.INTERNAL


class BrokerAdminError(AdminError):
    """A broker's HTTP admin API refused a request, or answered what is not JSON.

    ``status`` is the HTTP status; ``detail`` the broker's ``error`` text (or what it
    answered instead); ``body`` its whole JSON answer, when there was one.
    """

    def __init__(
        self, broker: str, status: int, detail: str, body: object = None, *, message: str = ""
    ) -> None:
        super().__init__(message or f"broker {broker} answered HTTP {status}: {detail}")
        self.broker = broker
        self.status = status
        self.detail = detail
        self.body = body
        self.retriable = status in (503, 507)  # busy, or no space for now


class BrokerAnswerUnreadable(BrokerAdminError):
    """A broker's HTTP admin API answered what is not JSON, or JSON of another shape than
    the call expects (a broker of another version, or not a broker at all).

    ``body`` is the JSON answer when there was one, None when it was not JSON.
    """


class BrokerUnreachable(BrokerAdminError):
    """A broker's HTTP admin API could not be reached or did not answer in time.

    Retriable; a change may nevertheless have taken effect when the answer was lost.
    """

    def __init__(self, broker: str, url: str, reason: str, *, timed_out: bool = False) -> None:
        AdminError.__init__(self, f"cannot reach broker admin API at {url}: {reason}")
        self.broker = broker
        self.status = 0
        self.detail = reason
        self.body = None
        self.url = url
        self.timed_out = timed_out
        self.retriable = True
