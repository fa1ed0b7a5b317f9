"""What MetaqTlsCertificateExpiring watches: a TLS broker and nameserver export
``metaq_tls_cert_expiry_timestamp_seconds``, the end of the certificate their listeners
loaded at start, read from /metrics over HTTPS as Prometheus scrapes it; a plain server
exports no such series."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from metaq.testing import BrokerProcess
from metaq.testing.certs import Pki
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver

GAUGE = "metaq_tls_cert_expiry_timestamp_seconds"


def gauges(url: str, pki: Pki | None) -> dict[str, float]:
    context = pki.client_tls().client_context() if pki is not None else None
    with urllib.request.urlopen(f"{url}/metrics", timeout=5, context=context) as answer:
        text = answer.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def not_after(pki: Pki) -> float:
    cert = x509.load_pem_x509_certificate(Path(pki.node.cert_file).read_bytes())
    return cert.not_valid_after_utc.timestamp()


@pytest.fixture
def nameserver(pki: Pki, tmp_path: Path) -> Iterator[NameServerProcess]:
    server = start_nameserver(tmp_path / "ns", "--http-port", "0", *pki.server_flags())
    try:
        yield server
    finally:
        server.stop()


def test_a_tls_nameserver_and_broker_export_when_their_certificate_ends(
    pki: Pki, nameserver: NameServerProcess, tmp_path: Path
) -> None:
    expected = not_after(pki)
    assert gauges(f"https://{nameserver.http_address}", pki)[GAUGE] == expected
    with BrokerProcess.start(
        tmp_path / "broker", *pki.server_flags(), tls=pki.client_tls()
    ) as broker:
        assert broker.http_url.startswith("https://"), broker.http_url
        assert gauges(broker.http_url, pki)[GAUGE] == expected


def test_a_plain_broker_exports_no_certificate_expiry(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path / "broker") as broker:
        found = gauges(broker.http_url, None)
    assert "metaq_build_info" in found
    assert GAUGE not in found
