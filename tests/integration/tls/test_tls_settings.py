"""TLS settings are checked before anything listens, and say what is wrong."""

from __future__ import annotations

import pickle
import subprocess
from pathlib import Path

import pytest

from metaq.broker.config import ConfigError, load_config
from metaq.common.tls import TlsConfig, TlsError
from metaq.nameserver.config import load_config as load_nameserver_config
from metaq.spark.options import OptionError, parse_sink_options, parse_source_options
from metaq.testing.broker_process import broker_command
from metaq.testing.certs import Pki
from metaq.testing.nameserver_process import nameserver_command
from metaq.testing.waiting import secret_env


def test_a_certificate_without_its_key_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file go together"):
        load_config(["--tls-cert-file", "node.crt"])
    with pytest.raises(ValueError, match="tls_cert_file and tls_key_file go together"):
        load_nameserver_config(["--tls-key-file", "node.key"])


def test_verifying_clients_needs_a_ca(pki: Pki) -> None:
    flags = ["--tls-cert-file", pki.node.cert_file, "--tls-key-file", pki.node.key_file]
    with pytest.raises(ConfigError, match="tls_verify_client needs tls_ca_file"):
        load_config([*flags, "--tls-verify-client"])
    with pytest.raises(ValueError, match="tls_verify_client needs tls_ca_file"):
        load_nameserver_config([*flags, "--tls-verify-client"])


def test_tls_is_off_by_default() -> None:
    assert load_config([]).tls is None
    assert load_nameserver_config([]).tls is None


def test_a_missing_file_is_named(pki: Pki, tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.crt")
    with pytest.raises(TlsError, match=r"tls_cert_file .*nowhere.crt: no such file"):
        TlsConfig(missing, pki.node.key_file).server_context()
    with pytest.raises(TlsError, match=r"tls_ca_file .*nowhere.crt: no such file"):
        TlsConfig(ca_file=missing).client_context()


def test_a_key_of_another_certificate_is_refused(pki: Pki) -> None:
    with pytest.raises(TlsError, match="is not the private key of the certificate"):
        TlsConfig(pki.node.cert_file, pki.client.key_file).server_context()


def test_a_file_that_is_not_a_key_is_refused(pki: Pki) -> None:
    with pytest.raises(TlsError, match="not a PEM certificate and an unencrypted PEM private key"):
        TlsConfig(pki.node.cert_file, pki.ca_file).server_context()
    with pytest.raises(TlsError, match="no CA certificate in it could be read"):
        TlsConfig(ca_file=pki.node.key_file).client_context()


def test_a_broker_with_a_mismatched_key_exits_saying_so(pki: Pki, tmp_path: Path) -> None:
    argv = [
        *broker_command(), "--data-dir", str(tmp_path / "data"), "--data-port", "0",
        "--http-port", "0", "--nameserver", "127.0.0.1:1", "--set", "failover=false",
        "--tls-cert-file", pki.node.cert_file, "--tls-key-file", pki.client.key_file,
    ]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=secret_env(), check=False
    )
    assert done.returncode == 1
    assert "is not the private key of the certificate" in done.stderr
    assert "ready" not in done.stdout


def test_a_nameserver_with_a_missing_key_exits_saying_so(pki: Pki, tmp_path: Path) -> None:
    argv = [
        *nameserver_command(), "--grpc-port", "0",
        "--tls-cert-file", pki.node.cert_file, "--tls-key-file", str(tmp_path / "gone.key"),
    ]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=secret_env(), check=False
    )
    assert done.returncode == 2
    assert "gone.key: no such file" in done.stderr


def test_an_encrypted_key_is_refused_rather_than_prompted_for(pki: Pki, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", pki.node.key_file, "-aes256", "-passout", "pass:secret",
         "-out", str(encrypted)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    with pytest.raises(TlsError, match="is encrypted: give it unencrypted"):
        TlsConfig(pki.node.cert_file, str(encrypted)).server_context()


def test_spark_options_turn_tls_on_and_name_a_bad_file(pki: Pki, tmp_path: Path) -> None:
    base = {"nameservers": "127.0.0.1:9876", "topic": "orders"}
    assert parse_source_options(base, streaming=False).tls is None
    source = parse_source_options({**base, "tlsCaFile": pki.ca_file}, streaming=False)
    assert source.tls == TlsConfig(ca_file=pki.ca_file)
    assert pickle.loads(pickle.dumps(source)) == source  # options travel to executors
    sink = parse_sink_options(
        {**base, "tlsCertFile": pki.client.cert_file, "tlsKeyFile": pki.client.key_file}
    )
    assert sink.tls == TlsConfig(pki.client.cert_file, pki.client.key_file)
    assert parse_sink_options({**base, "tls": "true"}).tls == TlsConfig()
    with pytest.raises(OptionError, match=r"option 'tlsCaFile' .*gone.pem: no such file"):
        parse_source_options({**base, "tlsCaFile": str(tmp_path / "gone.pem")}, streaming=True)
