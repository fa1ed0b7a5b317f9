"""Names that clients choose (consumer and producer groups) and how any input is quoted back.

Topic names are checked by :func:`metaq.common.record.check_topic` (RocketMQ's rule:
1-127 characters from ``[%|a-zA-Z0-9_-]``); group names here. Both are checked wherever
a name enters the system (data plane, gRPC, HTTP, CLI), so no one can store, route or
be answered with a name of megabytes.

Errors quote what they refused through :func:`shown`, never whole: a refused 3 MiB name
echoed back would itself be the problem (gRPC drops a status whose details exceed its
16 KiB metadata limit, and a frame or an HTTP body of megabytes is an amplifier).
"""

from __future__ import annotations

import re
from typing import Final

from metaq.common.errors import InvalidMessage

MAX_GROUP_CHARS: Final = 255
GROUP_PATTERN: Final = re.compile(r"[A-Za-z0-9_|%.@:-]{1,255}")

RETRY_PREFIX: Final = "%RETRY%"
"""``%RETRY%G``: where consumer group G's failed messages wait for their next attempt."""
DLQ_PREFIX: Final = "%DLQ%"
"""``%DLQ%G``: where consumer group G's messages go after their last retry failed."""
GROUP_TOPIC_PREFIXES: Final = (RETRY_PREFIX, DLQ_PREFIX)
"""The prefixes of the topics that belong to a consumer group rather than a producer."""
TRACE_TOPIC: Final = "%TRACE%"
"""Where clients with tracing on write the trace of each message they send or consume
(:mod:`metaq.client.trace`), keyed by message id; made by a broker on first use."""
SYSTEM_PREFIX: Final = "%SYS%"
"""The broker's own topics (delayed messages, half messages, journals): no client's."""

SHOWN_CHARS: Final = 64
"""At most this many characters of a refused value are quoted back in an error."""


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def group_of(topic: str) -> str | None:
    """The consumer group whose retry or dead-letter topic ``topic`` is, else None."""
    for prefix in GROUP_TOPIC_PREFIXES:
        if topic.startswith(prefix):
            return topic[len(prefix) :]
    return None


def topic_kind(topic: str) -> str:
    """What a topic is for, in a word: ``system`` (the broker's own, and the trace
    topic), ``retry`` or ``dlq`` (a consumer group's), else ``user``."""
    if topic.startswith(SYSTEM_PREFIX) or topic == TRACE_TOPIC:
        return "system"
    if topic.startswith(RETRY_PREFIX):
        return "retry"
    if topic.startswith(DLQ_PREFIX):
        return "dlq"
    return "user"


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters with the
    full length said, so what was wrong stays recognisable and the message stays small."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} {_unit(value)} in all)"
    text = repr(value)
    return text if len(text) <= limit + 2 else f"{text[:limit]}... ({len(text)} characters)"


def _unit(value: str | bytes) -> str:
    return "characters" if isinstance(value, str) else "bytes"


def check_group(group: str, what: str = "consumer group") -> None:
    """Raise InvalidMessage unless ``group`` is a legal consumer or producer group name."""
    if not GROUP_PATTERN.fullmatch(group):
        raise InvalidMessage(
            f"illegal {what} {shown(group)}: use 1-{MAX_GROUP_CHARS} characters from "
            "letters, digits and '_|%.@:-'"
        )
