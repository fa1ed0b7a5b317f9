"""Hosts for the chaos suite: one network namespace per node on a private bridge, with
faults made by packet filters inside the namespaces.

    net = Network.create(["ns0", "ns1", "a0", "client"])
    try:
        net.hosts["a0"].address      # 10.213.N.k
        net.command("a0", argv)      # ["ip", "netns", "exec", "mq..-a0", *argv]
        net.partition({"a0"}, {"ns0", "ns1"})
        net.heal()
    finally:
        net.destroy()

Layout: a bridge ``mqbr<run>`` in the root namespace holds 10.213.N.1/24 (the observer:
the test process polls health and controller state from there, out of band, and no
fault ever touches it); each node is a namespace ``mq<run>-<node>`` with a veth into the
bridge and 10.213.N.k. Everything stays on that bridge: no route leaves it.

Partitions are nftables rules (``table inet metaq_chaos``) inside the nodes' namespaces
that drop packets to and from the cut-off peers' addresses, in both directions; no RST
is sent, so a partition looks like a pulled cable, not a dead process. Packet loss on a
link is the same table with ``numgen random``. Delay needs ``sch_netem``, which this
kernel may lack; :attr:`Network.can_delay` says.

When namespaces cannot be made (not root, no ``ip``), :class:`Network` falls back to
loopback: every host is 127.0.0.1 and faults that need a network (partitions, loss) raise
:class:`Unsupported`; the caller says so and skips them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

log = logging.getLogger(__name__)

SUBNET_PREFIX: Final = "10.213"
TABLE: Final = "metaq_chaos"


class Unsupported(RuntimeError):
    """The fault needs something this machine does not have (namespaces, nft, netem)."""


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    namespace: str  # empty on loopback


def _run(argv: Sequence[str], *, check: bool = True, input_text: str | None = None) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, input=input_text, timeout=30, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> int:
    """A third octet N such that 10.213.N.0/24 overlaps no route on this machine."""
    routes = _run(["ip", "-4", "route", "show", "table", "all"], check=False)
    taken = []
    for line in routes.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("local", "broadcast", "unicast") and len(line.split()) > 1:
            word = line.split()[1]
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.ip_network(word if word != "default" else "0.0.0.0/0"))
    for _ in range(64):
        third = 1 + secrets.randbelow(250)
        net = ipaddress.ip_network(f"{SUBNET_PREFIX}.{third}.0/24")
        if not any(net.overlaps(t) and t.prefixlen > 0 for t in taken):
            return third
    raise RuntimeError("no free 10.213.N.0/24 subnet for the chaos bridge")


@dataclass
class Network:
    hosts: dict[str, Host]
    namespaces: bool
    observer: str
    run_id: str = ""
    bridge: str = ""
    veths: list[str] = field(default_factory=list)
    why_loopback: str = ""
    can_filter: bool = False
    can_delay: bool = False
    _cuts: set[frozenset[str]] = field(default_factory=set)
    _loss: dict[frozenset[str], int] = field(default_factory=dict)

    # --- making and unmaking ------------------------------------------------------------

    @classmethod
    def create(cls, nodes: Sequence[str], *, loopback: bool = False) -> Network:
        """Namespaces for ``nodes`` on a fresh bridge, or loopback when that fails."""
        why = "asked for loopback" if loopback else _namespace_trouble()
        if why:
            return cls._loopback(nodes, why)
        net = cls(hosts={}, namespaces=True, observer="", run_id=secrets.token_hex(2))
        try:
            net._build(nodes)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            net.destroy()
            return cls._loopback(nodes, f"making namespaces failed: {exc}")
        return net

    @classmethod
    def _loopback(cls, nodes: Sequence[str], why: str) -> Network:
        log.warning("chaos network: falling back to loopback (%s)", why)
        hosts = {name: Host(name, "127.0.0.1", "") for name in nodes}
        return cls(hosts=hosts, namespaces=False, observer="127.0.0.1", why_loopback=why)

    def _build(self, nodes: Sequence[str]) -> None:
        third = _free_subnet()
        self.bridge = f"mqbr{self.run_id}"
        self.observer = f"{SUBNET_PREFIX}.{third}.1"
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.observer}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for index, name in enumerate(nodes):
            namespace = f"mq{self.run_id}-{name}"
            address = f"{SUBNET_PREFIX}.{third}.{index + 2}"
            veth = f"mq{self.run_id}v{index}"
            _run(["ip", "netns", "add", namespace])
            self.hosts[name] = Host(name, address, namespace)
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                  "netns", namespace])  # fmt: skip
            self.veths.append(veth)
            _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            _run(["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0"])
            _run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
            _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        self.can_filter = shutil.which("nft") is not None
        first = next(iter(self.hosts.values())).namespace
        done = subprocess.run(
            ["tc", "-n", first, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms"],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        self.can_delay = done.returncode == 0
        if self.can_delay:
            _run(["tc", "-n", first, "qdisc", "del", "dev", "eth0", "root"], check=False)

    def destroy(self) -> None:
        """Remove every namespace, veth and the bridge this network made; never raises."""
        for host in self.hosts.values():
            if host.namespace:
                _run(["ip", "netns", "del", host.namespace], check=False)
        for veth in self.veths:  # gone with their namespace's end; this catches half-made ones
            _run(["ip", "link", "del", veth], check=False)
        if self.bridge:
            _run(["ip", "link", "del", self.bridge], check=False)
        self.hosts = {name: h for name, h in self.hosts.items() if not h.namespace}
        self.veths.clear()
        self.bridge = ""

    # --- running things on a host -------------------------------------------------------

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``node`` (``ip netns exec`` execs it: signals reach it)."""
        host = self.hosts[node]
        if not host.namespace:
            return list(argv)
        return ["ip", "netns", "exec", host.namespace, *argv]

    def address(self, node: str) -> str:
        return self.hosts[node].address

    # --- faults -------------------------------------------------------------------------

    def _need_filter(self) -> None:
        if not self.namespaces:
            raise Unsupported(f"network faults need namespaces; {self.why_loopback}")
        if not self.can_filter:
            raise Unsupported("network faults need nft (apt-get install nftables)")

    def partition(self, side: Iterable[str], other: Iterable[str]) -> None:
        """Cut every link between a node of ``side`` and a node of ``other``."""
        self._need_filter()
        side, other = set(side), set(other)
        for a in side:
            for b in other:
                if a != b:
                    self._cuts.add(frozenset((a, b)))
        self._apply(side | other)

    def isolate(self, node: str) -> None:
        """Cut ``node`` off from every other node (the observer still reaches it)."""
        self.partition({node}, set(self.hosts) - {node})

    def lose(self, a: str, b: str, percent: int) -> None:
        """Drop ``percent`` % of the packets on the link a-b, each way."""
        self._need_filter()
        self._loss[frozenset((a, b))] = percent
        self._apply({a, b})

    def heal(self) -> None:
        """Every link whole again, no loss."""
        touched = {n for pair in self._cuts | set(self._loss) for n in pair}
        self._cuts.clear()
        self._loss.clear()
        if touched:
            self._apply(touched)

    def _apply(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            cut = sorted(self.hosts[p].address for pair in self._cuts if node in pair
                         for p in pair if p != node)  # fmt: skip
            lossy = [(self.hosts[p].address, pct) for pair, pct in self._loss.items()
                     if node in pair for p in pair if p != node]  # fmt: skip
            rules_in, rules_out = [], []
            if cut:
                addresses = ", ".join(cut)
                rules_in.append(f"ip saddr {{ {addresses} }} drop")
                rules_out.append(f"ip daddr {{ {addresses} }} drop")
            for address, pct in lossy:
                rules_in.append(f"ip saddr {address} numgen random mod 100 < {pct} drop")
                rules_out.append(f"ip daddr {address} numgen random mod 100 < {pct} drop")
            script = f"table inet {TABLE}\ndelete table inet {TABLE}\n"
            if rules_in:
                script += (
                    f"table inet {TABLE} {{\n"
                    "  chain input { type filter hook input priority 0; policy accept;\n    "
                    + "\n    ".join(rules_in)
                    + "\n  }\n"
                    "  chain output { type filter hook output priority 0; policy accept;\n    "
                    + "\n    ".join(rules_out)
                    + "\n  }\n}\n"
                )
            _run(["ip", "netns", "exec", self.hosts[node].namespace, "nft", "-f", "-"],
                 input_text=script)  # fmt: skip


def _namespace_trouble() -> str:
    """Why namespaces cannot be used here, or empty."""
    if os.geteuid() != 0:
        return "not running as root"
    if shutil.which("ip") is None:
        return "no ip command (apt-get install iproute2)"
    probe = f"mqprobe{secrets.token_hex(2)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, check=False)
    return ""
