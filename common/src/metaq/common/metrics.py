"""What every server's Prometheus registry has: the process, platform and GC collectors,
``metaq_build_info{component, version}``, and no ``*_created`` series; for a server with
TLS listeners, ``metaq_tls_cert_expiry_timestamp_seconds``.

prometheus_client exports a ``<counter>_created`` sample beside every counter, histogram
and summary by default; Prometheus ignores it (it reads no created timestamps in the
text format) and it doubles the series a scrape stores, so it is turned off for the
whole process, as the library documents. The servers (broker and nameserver) depend on
prometheus_client; this module is not imported by clients (extra ``metrics``).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from metaq.common.tls import TlsConfig
from metaq.common.version import installed_version


def standard_collectors(registry: CollectorRegistry, component: str) -> None:
    """process_* (CPU, memory, open fds), python_info, python_gc_* and
    ``metaq_build_info`` (1, labelled with the ``component``'s installed version) on
    ``registry``; ``*_created`` series off."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = Gauge(
        "metaq_build_info",
        "Always 1; its labels say which version of which metaq component runs here",
        ["component", "version"],
        registry=registry,
    )
    info.labels(component, installed_version(f"metaq-{component}")).set(1)


def certificate_expiry(registry: CollectorRegistry, tls: TlsConfig | None) -> None:
    """``metaq_tls_cert_expiry_timestamp_seconds``: when the certificate the listeners
    loaded at start stops being valid (the alert MetaqTlsCertificateExpiring watches it).
    The certificate read at start, not the file now: a renewed file the process has not
    restarted onto is not what its clients are shown. Nothing without TLS listeners."""
    if tls is None or not tls.serves:
        return
    Gauge(
        "metaq_tls_cert_expiry_timestamp_seconds",
        "When the certificate this server's listeners present stops being valid "
        "(seconds since the epoch)",
        registry=registry,
    ).set(tls.certificate_expiry())
