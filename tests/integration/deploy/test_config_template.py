"""The roles' config template renders every key the programs take, in a form their own
loaders read back to the same settings (docs/deploy.md, "One source of truth").

Rendered with Jinja2 as Ansible does (``trim_blocks``), without hosts: pure logic.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import jinja2
import pytest
from lab import PLAYBOOKS

from metaq.broker.config import BrokerConfig
from metaq.broker.config import load_config as load_broker_config
from metaq.broker.store.config import FlushMode, StoreConfig
from metaq.common.scrape_auth import MetricsAuth
from metaq.nameserver.config import NameServerConfig
from metaq.nameserver.config import load_config as load_nameserver_config

TEMPLATE = PLAYBOOKS / "roles" / "metaq_common" / "templates" / "config.toml.j2"
# Set from the broker's own keys, never in [store] (metaq.broker.config._STORE_OWNED).
STORE_OWNED = {"data_dir", "flush_mode", "store_host", "keep_damaged_records"}


def render(service: str, settings: dict[str, Any], path: Path) -> Path:
    environment = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    text = environment.from_string(TEMPLATE.read_text()).render(
        ansible_managed="Ansible managed", metaq_service=service, metaq_service_settings=settings
    )
    path.write_text(text)
    return path


def toml_value(value: Any) -> Any:
    """A setting as group_vars hold it: YAML strings, numbers, booleans and lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def test_every_broker_key_renders_and_loads_back(tmp_path: Path) -> None:
    # Every key set to something other than its default, so a key the template dropped
    # would come back as the default and show.
    expected = BrokerConfig(
        broker_name="broker-x", broker_id=2, computer_room="room-9",
        data_dir=Path("/data/metaq"), listen_host="10.0.0.5", nameservers=("a:1", "b:2"),
        flush_mode=FlushMode.SYNC, auto_create_topics=True,
        idle_timeout_s=7.5, cluster_secret_file="/etc/metaq/cluster-secret",
        auth_enabled=True, auth_acl_file="/etc/metaq/acl.json",
        tls_cert_file="/etc/metaq/tls/node.crt", tls_key_file="/etc/metaq/tls/node.key",
        tls_ca_file="/etc/metaq/tls/ca.crt", tls_verify_client=True,
        http_names=("broker-x.example", "localhost:19912"), metrics_auth=MetricsAuth.BASIC,
        metrics_auth_file="/etc/metaq/metrics-secret", metrics_auth_user="scraper",
        store=StoreConfig(data_dir=Path("."), commitlog_segment_bytes=8 << 20,
                          retention_hours=12.5, prefault_segments=False),
    )  # fmt: skip
    top = {f.name: toml_value(getattr(expected, f.name))
           for f in dataclasses.fields(BrokerConfig) if f.name != "store"}  # fmt: skip
    store = {f.name: toml_value(getattr(expected.store, f.name))
             for f in dataclasses.fields(StoreConfig) if f.name not in STORE_OWNED}  # fmt: skip
    path = render("broker", {**top, "store": store}, tmp_path / "broker.toml")
    assert load_broker_config(["--config", str(path)]) == expected


def test_every_nameserver_key_renders_and_loads_back(tmp_path: Path) -> None:
    expected = NameServerConfig(
        listen_host="10.0.0.7", grpc_port=9999, http_port=9998, broker_expiry_s=12.0,
        controller_address="10.0.0.7:9877", controller_peers=("10.0.0.8:9877", "10.0.0.9:9877"),
        controller_dir="/var/lib/metaq/nameserver", cluster_secret_file="/etc/metaq/s",
        master_detection_ms=4000, log_level="DEBUG", auth_enabled=True,
        auth_acl_file="/etc/metaq/acl.json",
        tls_cert_file="/etc/metaq/tls/node.crt", tls_key_file="/etc/metaq/tls/node.key",
        tls_ca_file="/etc/metaq/tls/ca.crt", tls_verify_client=True,
        http_names=("ns-7.example",), metrics_auth=MetricsAuth.BEARER,
        metrics_auth_file="/etc/metaq/metrics-secret",
    )  # fmt: skip
    settings = {f.name: toml_value(getattr(expected, f.name))
                for f in dataclasses.fields(NameServerConfig)}  # fmt: skip
    path = render("nameserver", settings, tmp_path / "nameserver.toml")
    assert load_nameserver_config(["--config", str(path)]) == expected


@pytest.mark.parametrize("text", ['back\\slash "quoted"', "plain"])
def test_strings_are_escaped_as_toml_wants(tmp_path: Path, text: str) -> None:
    path = render("nameserver", {"controller_dir": text}, tmp_path / "n.toml")
    assert load_nameserver_config(["--config", str(path)]).controller_dir == text
