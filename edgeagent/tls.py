"""TLS for every TCP listener: the agent's HTTP and gRPC ports and the hub server's, in one place.

One ``TlsSettings`` (the agent's ``[tls]`` table, the hub server's ``--tls-*`` flags) names a
certificate chain, its key and, for client-certificate authentication (mTLS, beside the bearer
tokens, not instead of them), the CA that signs client certificates. ``ServerTls`` turns them
into what a listener needs:

- an ``ssl.SSLContext`` for asyncio/aiohttp listeners that accepts TLS 1.2 and 1.3 only;
- the PEM bytes gRPC's dynamic credentials take (``api.grpc.server``);
- ``reload()`` (SIGHUP): the files are read again and *new* handshakes use them, while
  connections already open keep the certificate they agreed on. The listening context never
  changes; its ``sni_callback`` (which OpenSSL calls for every ClientHello, with or without a
  server name) moves each new connection onto the newest context, so no listener restarts.
  A reload that cannot read or pair the files keeps the previous certificate and says why.

``plain_listener_problem`` is the one rule every listener shares: plain TCP is allowed on
loopback, and elsewhere only when the operator wrote ``tls = "off"`` (a TLS-terminating proxy
or service mesh in front), because a bearer token and camera frames would cross the network in
clear.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeagent.netaddr import is_loopback
from edgeagent.sections import require, setting

log = logging.getLogger(__name__)

TlsMode = Literal["auto", "off"]
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True)
class TlsSettings:
    """[tls]: the certificate every TCP listener of the agent serves (HTTP and gRPC)."""

    cert_file: Path | None = setting(
        None,
        "PEM certificate chain (leaf first) served on every TCP listener whose tls is "
        '"auto"; re-read on SIGHUP; unset = plain TCP, loopback only',
    )
    key_file: Path | None = setting(
        None, "PEM private key of cert_file (readable by the agent only); re-read on SIGHUP"
    )
    client_ca_file: Path | None = setting(
        None,
        "PEM CA certificate(s): a TCP client must present a certificate they sign (mTLS), "
        "besides its bearer token; unset = no client certificate asked",
    )

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    def validate(self, section: str = "tls") -> None:
        require(
            (self.cert_file is None) == (self.key_file is None),
            section,
            "key_file" if self.key_file is None else "cert_file",
            "cert_file and key_file go together",
        )
        require(
            self.client_ca_file is None or self.cert_file is not None,
            section,
            "client_ca_file",
            "needs cert_file and key_file: client certificates are asked for only over TLS",
        )
        for key in ("cert_file", "key_file", "client_ca_file"):
            path: Path | None = getattr(self, key)
            require(path is None or path.is_file(), section, key, f"{path} is not a file")


def plain_listener_problem(host: str, mode: TlsMode, tls: TlsSettings) -> str | None:
    """Why a TCP listener on ``host`` may not serve plain TCP, or None when it may."""
    if mode == "off" or tls.enabled or is_loopback(host):
        return None
    return (
        f"plain TCP on the non-loopback address {host!r} would carry tokens and data in clear: "
        'set [tls] cert_file and key_file, or say tls = "off" for this listener (a '
        "TLS-terminating proxy in front)"
    )


class TlsError(ValueError):
    """The certificate, key or client CA cannot be used; the message names the file."""


@dataclass(frozen=True)
class Pem:
    """What one reading of the files held: gRPC takes these bytes, asyncio a context."""

    cert: bytes
    key: bytes
    client_ca: bytes | None


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the TLS {what} {path}: {exc.strerror}") from exc


def _context(settings: TlsSettings) -> tuple[ssl.SSLContext, Pem]:
    """A TLS 1.2+ server context from the files, and the bytes it was built from."""
    assert settings.cert_file is not None and settings.key_file is not None
    pem = Pem(
        _read(settings.cert_file, "certificate"),
        _read(settings.key_file, "key"),
        _read(settings.client_ca_file, "client CA") if settings.client_ca_file else None,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file)
    except ssl.SSLError as exc:
        raise TlsError(
            f"TLS certificate {settings.cert_file} with key {settings.key_file}: {exc.reason} "
            "(a PEM chain, leaf first, and the key that belongs to it)"
        ) from exc
    if pem.client_ca is not None:
        try:
            context.load_verify_locations(cadata=pem.client_ca.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise TlsError(f"TLS client CA {settings.client_ca_file}: {exc.reason}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context, pem


class ServerTls:
    """The served certificate of one process's listeners, swapped for new handshakes on reload."""

    def __init__(self, settings: TlsSettings) -> None:
        if not settings.enabled:
            raise TlsError("TLS needs a certificate and key ([tls] cert_file, key_file)")
        self.settings = settings
        self._lock = threading.Lock()  # gRPC asks for the certificate from its own threads
        self._current, self.pem = _context(settings)
        self.generation = 0  # bumped by each reload, so gRPC knows when to fetch again
        self._listening = self._build_listening()

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by the client CA."""
        return self.settings.client_ca_file is not None

    def _build_listening(self) -> ssl.SSLContext:
        context, _ = _context(self.settings)
        context.sni_callback = self._swap
        return context

    def _swap(self, connection: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        """Every ClientHello: hand the connection the newest certificate (and client CA)."""
        with self._lock:
            current = self._current
        connection.context = current

    @property
    def context(self) -> ssl.SSLContext:
        """The context to give an asyncio/aiohttp listener (once; it follows reloads)."""
        return self._listening

    def reload(self) -> bool:
        """Read the files again; True when new handshakes now get them. A failure is logged
        and the certificate served so far stays."""
        try:
            context, pem = _context(self.settings)
        except TlsError as exc:
            log.error("TLS reload refused, still serving the previous certificate: %s", exc)
            return False
        with self._lock:
            self._current, self.pem = context, pem
            self.generation += 1
        log.info("TLS: new connections get the certificate in %s", self.settings.cert_file)
        return True

    def snapshot(self) -> tuple[int, Pem]:
        """The generation and the bytes it was read from, read together (for gRPC's fetcher)."""
        with self._lock:
            return self.generation, self.pem


def certificate_fingerprint(path: Path) -> str:
    """SHA-256 (hex) of the leaf, the first certificate of a PEM chain: what a peer pins."""
    text = _read(path, "certificate").decode("ascii", "replace")
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    first = text.find(begin)
    last = text.find(end, first)
    if first < 0 or last < 0:
        raise TlsError(f"{path} holds no PEM certificate")
    der = ssl.PEM_cert_to_DER_cert(text[first : last + len(end)])
    return hashlib.sha256(der).hexdigest()
