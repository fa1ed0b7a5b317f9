"""How often a login may fail: a growing wait per user and per address after a few.

Pure bookkeeping with the clock passed in, so the policy is tested without sleeps. The
first :data:`FREE_FAILURES` failures of a user (or from an address) cost nothing; each
one after that makes the next attempt wait twice as long as the last, from
:data:`FIRST_WAIT_S` up to :data:`MAX_WAIT_S`. A success clears the user's and the
address's count; a count left alone for :data:`FORGET_AFTER_S` is forgotten. The table
is bounded: past :data:`MAX_ENTRIES` the oldest entries go first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

FREE_FAILURES: Final = 5
FIRST_WAIT_S: Final = 1.0
MAX_WAIT_S: Final = 60.0
FORGET_AFTER_S: Final = 15 * 60.0
MAX_ENTRIES: Final = 10_000


class _Count:
    __slots__ = ("failures", "last_s", "until_s")

    def __init__(self) -> None:
        self.failures = 0
        self.last_s = 0.0
        self.until_s = 0.0


class LoginGuard:
    """Failed logins per access key and per client address."""

    def __init__(self) -> None:
        self._counts: OrderedDict[str, _Count] = OrderedDict()

    def wait_s(self, access_key: str, address: str, now_s: float) -> float:
        """How long a login by ``access_key`` from ``address`` must wait; 0 when it may go."""
        waits = [self._wait(key, now_s) for key in _keys(access_key, address)]
        return max(waits)

    def failed(self, access_key: str, address: str, now_s: float) -> None:
        for key in _keys(access_key, address):
            count = self._counts.pop(key, None)
            if count is None or now_s - count.last_s > FORGET_AFTER_S:
                count = _Count()
            count.failures += 1
            count.last_s = now_s
            beyond = count.failures - FREE_FAILURES
            if beyond > 0:
                count.until_s = now_s + min(MAX_WAIT_S, FIRST_WAIT_S * 2 ** (beyond - 1))
            self._counts[key] = count
        while len(self._counts) > MAX_ENTRIES:
            self._counts.popitem(last=False)

    def succeeded(self, access_key: str, address: str) -> None:
        for key in _keys(access_key, address):
            self._counts.pop(key, None)

    def _wait(self, key: str, now_s: float) -> float:
        count = self._counts.get(key)
        if count is None or now_s - count.last_s > FORGET_AFTER_S:
            return 0.0
        return max(0.0, count.until_s - now_s)


def _keys(access_key: str, address: str) -> tuple[str, str]:
    return (f"user {access_key}", f"address {address}")
