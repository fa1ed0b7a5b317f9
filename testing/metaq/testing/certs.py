"""A throwaway CA and the certificates the TLS tests need, made with ``cryptography``.

Every node certificate names 127.0.0.1 and localhost and is good for both ends of a
connection (serverAuth and clientAuth), as the Ansible roles make them: a broker shows
the same certificate to its clients and to the master or nameserver it dials.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from metaq.common.tls import TlsConfig

_DAY = datetime.timedelta(days=1)
_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)
_BOTH_ENDS = x509.ExtendedKeyUsage(
    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
)


@dataclass(frozen=True)
class Pair:
    cert_file: str
    key_file: str


@dataclass(frozen=True)
class Pki:
    ca_file: str
    node: Pair
    """The servers' certificate (and the brokers' as clients)."""
    client: Pair
    """A client certificate signed by the same CA."""
    stranger: Pair
    """A self-signed certificate no one trusts."""
    other_ca_file: str
    """A CA that signed none of the above."""

    def server(self, *, verify_client: bool = False) -> TlsConfig:
        return TlsConfig(self.node.cert_file, self.node.key_file, self.ca_file, verify_client)

    def server_flags(self, *, verify_client: bool = False) -> list[str]:
        flags = [
            "--tls-cert-file", self.node.cert_file,
            "--tls-key-file", self.node.key_file,
            "--tls-ca-file", self.ca_file,
        ]  # fmt: skip
        return [*flags, "--tls-verify-client"] if verify_client else flags

    def client_tls(self, *, with_cert: bool = False) -> TlsConfig:
        if with_cert:
            return TlsConfig(self.client.cert_file, self.client.key_file, self.ca_file)
        return TlsConfig(ca_file=self.ca_file)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> str:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return str(path)


def _write_cert(cert: x509.Certificate, path: Path) -> str:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    directory: Path,
    stem: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
) -> Pair:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    issuer_name = issuer[0].subject if issuer else _name(stem)
    signing_key = issuer[1] if issuer else key
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(stem))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(signing_key, hashes.SHA256())
    )
    return Pair(
        _write_cert(cert, directory / f"{stem}.crt"), _write_key(key, directory / f"{stem}.key")
    )


def make_pki(directory: Path) -> Pki:
    """A CA, a node and a client certificate signed by it, and two strangers, as PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("metaq test CA")
    other = _ca("another CA")
    return Pki(
        ca_file=_write_cert(ca[0], directory / "ca.crt"),
        node=_leaf(directory, "node", ca),
        client=_leaf(directory, "client", ca),
        stranger=_leaf(directory, "stranger", None),
        other_ca_file=_write_cert(other[0], directory / "other-ca.crt"),
    )
