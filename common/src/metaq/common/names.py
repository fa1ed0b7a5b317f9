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

SHOWN_CHARS: Final = 64
"""At most this many characters of a refused value are quoted back in an error."""


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
