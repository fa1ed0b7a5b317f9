"""Which server a signed request is for: the names a server answers to, the one spelling
of ``host:port`` that signers and servers compare, and what every signed request's proof
covers (:func:`signed_purpose`).

A signed request, an HTTP admin request (``metaq.common.http_auth``) or a gRPC call to a
nameserver (``metaq.common.auth``, ``metaq.common.users``), names the server it is
addressed to, ``host:port`` as the signer dialled it (HTTP header ``X-Metaq-Target``,
gRPC metadata :data:`TARGET_METADATA_KEY`), and its proof covers that name. A server
takes it only when the name is one of its own (:meth:`ServerNames.check`): the host the
listener listens on with the port it got, any loopback spelling of them when it listens
on loopback, and what the operator lists in ``http_names`` (a DNS name, a load
balancer's address, an SSH tunnel's ``localhost:PORT``; a name without a port stands for
every listener of the server). The request's ``Host`` header or ``:authority`` plays no
part: the sender chooses them. So a request signed for one nameserver is worthless at
another, and one signed for a master at its slave, even within the proofs' clock window.

Nothing here does I/O.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Final

from metaq.common.names import shown
from metaq.common.users import ProofError

TARGET_METADATA_KEY: Final = "x-metaq-target"
"""The gRPC metadata key naming the server a signed call is for (HTTP: X-Metaq-Target)."""
_LOOPBACK: Final = ("localhost", "127.0.0.1", "::1")
_WILDCARDS: Final = frozenset({"", "0.0.0.0", "::", "[::]"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, maybe bracketed) is this machine only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def signed_purpose(plane: str, method: str, target: str, *more: str) -> str:
    """What a signed request's proof covers besides its body and time, on either plane:
    the plane (``http``, ``grpc``), the method (``POST``, ``Switchover``), the server it is
    for (:func:`http_target`) and what else the plane names (HTTP: the request id, the
    path with its query as sent)."""
    return " ".join((plane, method, target, *more))


def http_target(host: str, port: int) -> str:
    """``host:port`` as signed requests name a server: the host in lower case, an IP
    address in its shortest form, an IPv6 one in brackets."""
    host = host.strip("[]").lower()
    with contextlib.suppress(ValueError):  # else a name, kept as it is
        host = str(ipaddress.ip_address(host))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def target_of(address: str) -> str:
    """:func:`http_target` of an address as dialled, ``host:port`` (IPv6 in brackets)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return http_target(host, int(port))


def split_name(entry: str) -> tuple[str, int | None]:
    """An ``http_names`` entry (``host`` or ``host:port``, IPv6 in brackets) as host and
    port (None: the server's own); ValueError saying what is wrong."""
    text = entry.strip()
    host, port = text, None
    if text.startswith("["):
        inside, _, rest = text[1:].partition("]")
        host = inside
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"http_names: {entry!r} is not HOST or HOST:PORT")
            port = _port(entry, rest[1:])
    elif text.count(":") == 1:
        host, _, digits = text.partition(":")
        port = _port(entry, digits)
    if not host or any(c.isspace() or c in "/@?#" for c in host):
        raise ValueError(f"http_names: {entry!r} is not HOST or HOST:PORT")
    return host, port


def _port(entry: str, digits: str) -> int:
    if not digits.isdigit() or not 0 < int(digits) < 65536:
        raise ValueError(f"http_names: {entry!r} has no port 1-65535 after the colon")
    return int(digits)


def name_problems(entries: Iterable[str]) -> list[str]:
    """What is wrong with a server's ``http_names``, for its config's checks."""
    problems = []
    for entry in entries:
        try:
            split_name(entry)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


class ServerNames:
    """The names this server takes signed requests for; none until :meth:`listening`."""

    def __init__(self, extra: Sequence[str] = ()) -> None:
        self._extra = [split_name(entry) for entry in extra]
        self._names: frozenset[str] = frozenset()
        self._wildcard = False

    def listening(self, port: int, *hosts: str) -> None:
        """The server listens on ``port`` at ``hosts`` (as configured, as bound)."""
        names = set()
        for host in hosts:
            if host in _WILDCARDS:
                # Every host's address: only the operator knows which of them tools use.
                self._wildcard = True
                continue
            names.add(http_target(host, port))
            if is_loopback(host):
                names.update(http_target(name, port) for name in _LOOPBACK)
        names.update(http_target(host, own or port) for host, own in self._extra)
        self._names = frozenset(names)

    def __contains__(self, target: object) -> bool:
        return target in self._names

    def check(self, target: str | None, key: str) -> str:
        """``target``, a signed request's named server (``key``: the header or metadata
        that carried it), when it is this server; else ProofError saying why."""
        if not target:
            raise ProofError(
                f"a signed request names the server it is for ({key}: host:port as "
                "dialled) under its proof; this one does not: sign it with a metaq client "
                "of this release",
                "unbound",
            )
        if target not in self._names:
            raise ProofError(self.refusal(shown(target)), "wrong_server")
        return target

    def describe(self) -> str:
        """The names, for an error message."""
        if not self._names:
            return "no name yet" if not self._wildcard else "no name (it listens on every address)"
        return ", ".join(sorted(self._names))

    def refusal(self, target: str) -> str:
        """Why a request signed for ``target``, not one of these, is refused."""
        advice = (
            "it listens on every address, so list the names tools reach it by in its http_names"
            if self._wildcard
            else "if that address does reach this server (a DNS name, a proxy, a tunnel), "
            "add it to this server's http_names"
        )
        return (
            f"this request was signed for server {target}, and this server is "
            f"{self.describe()}: a signed request is taken only by the server it was signed "
            f"for, never replayed to another. Sign it for the address you send it to; {advice}"
        )
