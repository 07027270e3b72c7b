"""Certificates made by the tests themselves (a CA and one certificate for 127.0.0.1), for a
TLS etcd: nothing is checked in, nothing is fetched; and such an etcd, secured as an operator
would run it (`secured_etcd`)."""

from __future__ import annotations

import datetime
import ipaddress
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from danube_core.embedded_etcd import EmbeddedEtcd


@dataclass(frozen=True)
class TestCertificates:
    ca_cert: str
    cert: str  # for 127.0.0.1, server and client use
    key: str


def make_certificates(directory: Path) -> TestCertificates:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "danube-spark test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    paths = TestCertificates(str(directory / "ca.pem"), str(directory / "cert.pem"), str(directory / "key.pem"))
    Path(paths.ca_cert).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    Path(paths.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(paths.key).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return paths


@contextmanager
def secured_etcd(directory: Path, root_password: str) -> Iterator[tuple["EmbeddedEtcd", TestCertificates]]:
    """A real etcd serving TLS only, asking for client certificates signed by the test CA, with
    authentication on (user `root`, `root_password`); certificates made in `directory`, and
    (server, certificates) yielded. Stopped on exit."""
    from danube_core.embedded_etcd import EmbeddedEtcd, EtcdSecurity

    certs = make_certificates(directory)
    server = EmbeddedEtcd(security=EtcdSecurity(certs.cert, certs.key, certs.ca_cert, root_password))
    try:
        yield server, certs
    finally:
        server.stop()
