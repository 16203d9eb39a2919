"""The gRPC listener's half of ``edgeagent.tls``: the same certificate as HTTPS, reloadable.

grpcio's secure port takes its credentials once, so a new certificate would need a restart;
its *dynamic* server credentials instead ask a fetcher on every new handshake whether the
certificate changed. The fetcher answers from ``ServerTls``, which SIGHUP reloads for every
listener at once: connections already open keep theirs, new ones get the new files.
grpc-core accepts TLS 1.2 and 1.3 only by default; client certificates are required
when ``[tls] client_ca_file`` is set, as on HTTPS.
"""

from __future__ import annotations

import grpc

from edgeagent.tls import Pem, ServerTls


def _configuration(pem: Pem) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(pem.key, pem.cert)], root_certificates=pem.client_ca
    )


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials that serve ``tls``'s certificate and follow its reloads."""
    served, pem = tls.snapshot()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        """Called by grpc-core on its own thread for each new handshake: None = unchanged."""
        nonlocal served
        generation, latest = tls.snapshot()
        if generation == served:
            return None
        served = generation
        return _configuration(latest)

    return grpc.dynamic_ssl_server_credentials(
        _configuration(pem), fetch, require_client_authentication=tls.mutual
    )
