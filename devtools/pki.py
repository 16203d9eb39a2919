"""Test certificates made with ``cryptography``: a CA, a server certificate for 127.0.0.1 and
localhost, and a client certificate, all short-lived. Used by the Mosquitto broker's TLS
listener, the agent's and the hub's HTTPS/gRPC listeners and the TLS benchmark.

``make_pki(directory, name)`` makes a fresh CA each call, so two directories are two CAs that
do not trust each other (a forged client certificate, a renewed server certificate).
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return key


def _certificate(subject: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool, san=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path, name: str = "edgeagent test CA") -> Pki:
    """A CA called ``name``, a server certificate for 127.0.0.1/localhost and a client one."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _write_key(directory / "ca.key")
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca_cert = _certificate(name, ca_key, ca_name, ca_key, ca=True)
    pki = Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for subject, cert_path, key_path, names in (
        ("localhost", pki.server_cert, pki.server_key, san),
        ("dev-tls", pki.client_cert, pki.client_key, None),
    ):
        key = _write_key(key_path)
        cert = _certificate(subject, key, ca_name, ca_key, ca=False, san=names)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pki


def peer_certificate(
    port: int, ca: Path, client: Pki | None = None, alpn: str | None = None
) -> bytes:
    """The DER certificate a fresh TLS handshake with 127.0.0.1:``port`` is given, verified
    against ``ca`` (offering ``client``'s certificate, and ``alpn`` — gRPC wants ``h2``)."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.client_cert, client.client_key)
    if alpn:
        context.set_alpn_protocols([alpn])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(path: Path) -> bytes:
    """The DER form of the PEM certificate at ``path`` (what ``peer_certificate`` returns)."""
    return ssl.PEM_cert_to_DER_cert(path.read_text())
