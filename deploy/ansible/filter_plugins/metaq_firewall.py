"""``metaq_firewall_sources``: the addresses a firewalled host lets reach the cluster's
ports, split by family for nftables' typed sets, each checked first so a typo in
``metaq_client_networks`` stops the run with its name rather than as an nft syntax error
on a host (or worse, as a rule that admits what was not meant)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any


def metaq_firewall_sources(
    hosts: Iterable[str], hostvars: Mapping[str, Mapping[str, Any]], networks: Iterable[Any]
) -> dict[str, list[str]]:
    """``{"ipv4": [...], "ipv6": [...]}``: every host's ``ansible_host`` (an address: the
    rules match addresses, and a name could resolve differently on the host) and every
    entry of ``networks`` (``10.1.0.0/16``, ``192.0.2.7``, ``2001:db8::/32``), sorted,
    without duplicates."""
    found: dict[str, set[str]] = {"ipv4": set(), "ipv6": set()}
    for host in hosts:
        address = str(hostvars[host].get("ansible_host", host))
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(
                f"metaq_firewall: {host}'s ansible_host {address!r} is not an IP address; "
                "the firewall rules admit the cluster's hosts by address: give ansible_host "
                "as an address"
            ) from None
        found[f"ipv{parsed.version}"].add(str(parsed))
    if isinstance(networks, (str, bytes)) or not isinstance(networks, Iterable):
        raise ValueError(
            f"metaq_client_networks must be a list of networks (e.g. [10.1.0.0/16]), "
            f"not {networks!r}"
        )
    for entry in networks:
        try:
            network = ipaddress.ip_network(str(entry), strict=False)
        except ValueError:
            raise ValueError(
                f"metaq_client_networks: {entry!r} is not an address or network "
                "(give them as 10.1.0.0/16, 192.0.2.7 or 2001:db8::/32)"
            ) from None
        text = str(network.network_address) if network.num_addresses == 1 else str(network)
        found[f"ipv{network.version}"].add(text)
    return {family: sorted(addresses) for family, addresses in found.items()}


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"metaq_firewall_sources": metaq_firewall_sources}
