"""The firewall's pieces without the lab (the lab scenario, test_lab_operations.py, applies
them on its hosts): the ``metaq_firewall_sources`` filter, and the role's nftables file
rendered by ansible-playbook and loaded twice into a network namespace of its own
(``unshare --net``: this machine's rules are not touched), where it holds the ports,
sets and drop rules it was given, IPv6 sets left empty."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from lab import PLAYBOOKS, run_playbook

NFT = shutil.which("nft") or "/usr/sbin/nft"


@pytest.fixture(scope="module")
def filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "metaq_firewall_filter", PLAYBOOKS / "filter_plugins" / "metaq_firewall.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOSTVARS = {"ns1": {"ansible_host": "10.0.1.11"}, "b0": {"ansible_host": "10.0.1.21"},
            "v6": {"ansible_host": "2001:db8::5"}}  # fmt: skip


def test_hosts_and_networks_are_split_by_family(filters: ModuleType) -> None:
    found = filters.metaq_firewall_sources(
        ["ns1", "b0", "v6", "b0"], HOSTVARS, ["10.20.0.0/16", "192.0.2.7", "10.20.0.1/16"]
    )
    assert found == {"ipv4": ["10.0.1.11", "10.0.1.21", "10.20.0.0/16", "192.0.2.7"],
                     "ipv6": ["2001:db8::5"]}  # fmt: skip


@pytest.mark.parametrize(
    ("hostvars", "networks", "says"),
    [
        ({"ns1": {"ansible_host": "ns1.example"}}, [], "ns1's ansible_host 'ns1.example' is not"),
        ({"ns1": {"ansible_host": "10.0.1.11"}}, ["10.20.0.0/33"], "'10.20.0.0/33' is not an"),
        ({"ns1": {"ansible_host": "10.0.1.11"}}, "10.20.0.0/16", "must be a list of networks"),
    ],
)
def test_what_cannot_be_an_address_is_refused_by_name(
    filters: ModuleType, hostvars: dict[str, dict[str, str]], networks: object, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        filters.metaq_firewall_sources(["ns1"], hostvars, networks)


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path(NFT).exists() or not shutil.which("unshare"),
    reason="needs root, nft and unshare (make ci-deps installs nftables)",
)
def test_the_rules_file_loads_and_reloads_in_a_namespace_of_its_own(tmp_path: Path) -> None:
    rules = tmp_path / "firewall.nft"
    task = {"name": "Render the rules", "ansible.builtin.template": {
        "src": str(PLAYBOOKS / "roles/metaq_firewall/templates/firewall.nft.j2"),
        "dest": str(rules), "mode": "0644"}}  # fmt: skip
    run = run_playbook(
        tmp_path, [task],
        metaq_firewall_cluster={"ipv4": ["10.0.1.11", "10.20.0.0/16"], "ipv6": []},
        metaq_firewall_peers={"ipv4": ["10.0.1.11"], "ipv6": []},
        metaq_firewall_ports=[9876, 9880], metaq_firewall_peer_ports=[9877],
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    # Loaded twice: the second replaces the first whole (the table is declared, deleted
    # and made again in one transaction), as a run with changed rules does.
    script = f"{NFT} -f {rules} && {NFT} -f {rules} && {NFT} list table inet metaq"
    done = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = done.stdout
    assert "10.20.0.0/16" in listed and "10.0.1.11" in listed, listed
    assert "tcp dport { 9876, 9880 } ip saddr @cluster_ipv4 accept" in listed, listed
    assert "tcp dport { 9876, 9880 } drop" in listed, listed
    assert "tcp dport 9877 ip saddr @peers_ipv4 accept" in listed, listed
    assert listed.count("table inet metaq") == 1, listed
