"""TLS on the agent's TCP listeners, proved by clients we did not write.

A real ``edgeagent run`` serves the tiny model over HTTPS and gRPC-with-TLS from one ``[tls]``
table; tritonclient (HTTP and gRPC, ``ssl=True`` with our CA), curl ``--cacert`` and Python's
own ``ssl`` module talk to it. Certificates are made here with ``cryptography``
(``devtools.pki``): each ``make_pki`` is a CA of its own, so a second one stands for a
renewed certificate or a forger's.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from devtools.agent_process import Agent
from devtools.pki import Pki, der, make_pki, peer_certificate
from devtools.ports import free_port
from devtools.tiny import write_tiny_package
from tests.support.http_agent import BearerToken

pytestmark = pytest.mark.timeout(180)

TOKEN = "tls-test-token"
AUTH = f"Authorization: Bearer {TOKEN}"


class TlsAgent:
    """The agent on HTTPS ``https_port`` and gRPC-over-TLS ``grpc_port``, from ``pki``."""

    def __init__(self, root: Path, pki: Pki, *, mutual: bool) -> None:
        models = write_tiny_package(root / "models" / "tiny").parent
        self.pki = pki
        self.https_port, self.grpc_port = free_port(), free_port()
        client_ca = f"client_ca_file = '{pki.ca}'\n" if mutual else ""
        config = root / "agent.toml"
        config.write_text(
            f"[agent]\nmodels_dir = '{models}'\n"
            f"[server]\ntoken = '{TOKEN}'\n"
            f"[grpc]\nenabled = true\nport = {self.grpc_port}\n"
            f"unix_socket = '{root / 'grpc.sock'}'\n"
            f"[tls]\ncert_file = '{pki.server_cert}'\nkey_file = '{pki.server_key}'\n{client_ca}"
        )
        self.agent = Agent(root, config, port=self.https_port)

    def stop(self) -> None:
        assert self.agent.stop() == 0


def _serve(factory: pytest.TempPathFactory, *, mutual: bool) -> Iterator[TlsAgent]:
    root = factory.mktemp("mtls" if mutual else "tls")
    agent = TlsAgent(root, make_pki(root / "pki"), mutual=mutual)
    yield agent
    agent.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsAgent]:
    yield from _serve(tmp_path_factory, mutual=False)


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsAgent]:
    yield from _serve(tmp_path_factory, mutual=True)


def _batch() -> np.ndarray:
    return np.random.default_rng(3).random((2, 3, 8, 8), dtype=np.float32)


def http_infer(port: int, ssl_options: dict[str, str]) -> np.ndarray:
    """One v2 binary inference with the stock tritonclient.http over HTTPS."""
    client = triton_http.InferenceServerClient(
        f"127.0.0.1:{port}", ssl=True, ssl_options=ssl_options, connection_timeout=10
    )
    client.register_plugin(BearerToken(TOKEN))
    try:
        tensor = triton_http.InferInput("input", [2, 3, 8, 8], "FP32")
        tensor.set_data_from_numpy(_batch(), binary_data=True)
        return client.infer("tiny", [tensor]).as_numpy("logits")
    finally:
        client.close()


def grpc_infer(port: int, pki: Pki, cert: Pki | None = None) -> np.ndarray:
    """One inference with the stock tritonclient.grpc, TLS with ``pki``'s CA (and a client
    certificate from ``cert``)."""
    client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{port}",
        ssl=True,
        root_certificates=str(pki.ca),
        private_key=str(cert.client_key) if cert else None,
        certificate_chain=str(cert.client_cert) if cert else None,
    )
    try:
        tensor = triton_grpc.InferInput("input", [2, 3, 8, 8], "FP32")
        tensor.set_data_from_numpy(_batch())
        result = client.infer(
            "tiny", [tensor], headers={"authorization": f"Bearer {TOKEN}"}, client_timeout=30
        )
        return result.as_numpy("logits")
    finally:
        client.close()


def served_certificate(port: int, pki: Pki, *, alpn: str | None = None) -> bytes:
    """The certificate a fresh handshake gets, offering ``pki``'s client certificate (for
    listeners that ask for one)."""
    return peer_certificate(port, pki.ca, client=pki, alpn=alpn)


# ---- TLS with a CA: the stock clients --------------------------------------------------------


def test_tritonclient_http_and_grpc_with_ssl_and_our_ca(served: TlsAgent) -> None:
    over_http = http_infer(served.https_port, {"ca_certs": str(served.pki.ca)})
    over_grpc = grpc_infer(served.grpc_port, served.pki)
    assert over_http.shape == (2, 4)
    np.testing.assert_allclose(over_http, over_grpc, rtol=1e-6)


def test_a_client_that_does_not_trust_the_ca_is_refused_the_handshake(
    served: TlsAgent, tmp_path: Path
) -> None:
    stranger = make_pki(tmp_path / "stranger", "another CA")
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        http_infer(served.https_port, {"ca_certs": str(stranger.ca)})


def test_plain_http_is_not_answered_on_the_tls_port(served: TlsAgent) -> None:
    with socket.create_connection(("127.0.0.1", served.https_port), timeout=10) as raw:
        raw.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = raw.recv(4096)
    assert not answer.startswith(b"HTTP/1.1 200"), answer


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_with_cacert(served: TlsAgent) -> None:
    url = f"https://127.0.0.1:{served.https_port}/v2/health/ready"
    done = subprocess.run(
        ["curl", "-sS", "--fail", "--cacert", str(served.pki.ca), "-H", AUTH, "-o", "/dev/null",
         "-w", "%{http_code} %{ssl_verify_result}", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "200 0"
    untrusted = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", url], capture_output=True, text=True, timeout=60
    )
    assert untrusted.returncode == 60, untrusted.stderr  # peer certificate cannot be verified


def _old_protocol_context(ca: Path, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that offers ``version`` at most, with OpenSSL's own floor lowered so the
    refusal, if any, is the server's."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():  # TLS 1.1 is deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        context.maximum_version = version
    return context


def test_tls_1_1_is_refused_and_1_2_accepted(served: TlsAgent) -> None:
    for port in (served.https_port, served.grpc_port):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            context = _old_protocol_context(served.pki.ca, ssl.TLSVersion.TLSv1_2)
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.version() == "TLSv1.2"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            context = _old_protocol_context(served.pki.ca, ssl.TLSVersion.TLSv1_1)
            # the HTTPS listener answers with a protocol_version alert; grpc-core hangs up
            refused = "PROTOCOL_VERSION|UNSUPPORTED_PROTOCOL|UNEXPECTED_EOF"
            with pytest.raises(ssl.SSLError, match=refused):
                context.wrap_socket(raw, server_hostname="127.0.0.1")


# ---- mTLS: a client certificate beside the token ---------------------------------------------


def test_mtls_accepts_a_client_certificate_from_the_client_ca(mutual: TlsAgent) -> None:
    pki = mutual.pki
    options = {
        "ca_certs": str(pki.ca),
        "certfile": str(pki.client_cert),
        "keyfile": str(pki.client_key),
    }
    assert http_infer(mutual.https_port, options).shape == (2, 4)
    assert grpc_infer(mutual.grpc_port, pki, cert=pki).shape == (2, 4)


def test_mtls_refuses_a_client_without_a_certificate(mutual: TlsAgent) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the alert surfaces as the client's own error
        http_infer(mutual.https_port, {"ca_certs": str(mutual.pki.ca)})
    with pytest.raises(InferenceServerException, match="StatusCode.UNAVAILABLE"):
        grpc_infer(mutual.grpc_port, mutual.pki)


def test_mtls_refuses_a_certificate_from_another_ca(mutual: TlsAgent, tmp_path: Path) -> None:
    forger = make_pki(tmp_path / "forger", "a forger's CA")
    options = {
        "ca_certs": str(mutual.pki.ca),
        "certfile": str(forger.client_cert),
        "keyfile": str(forger.client_key),
    }
    with pytest.raises(Exception):  # noqa: B017 - the alert surfaces as the client's own error
        http_infer(mutual.https_port, options)
    with pytest.raises(InferenceServerException, match="StatusCode.UNAVAILABLE"):
        grpc_infer(mutual.grpc_port, mutual.pki, cert=forger)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_with_and_without_a_client_certificate(mutual: TlsAgent) -> None:
    pki = mutual.pki
    url = f"https://127.0.0.1:{mutual.https_port}/v2/health/ready"
    base = ["curl", "-sS", "--fail", "--cacert", str(pki.ca), "-H", AUTH, "-o", "/dev/null"]
    without = subprocess.run([*base, url], capture_output=True, text=True, timeout=60)
    assert without.returncode != 0
    with_cert = subprocess.run(
        [*base, "--cert", str(pki.client_cert), "--key", str(pki.client_key), url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert with_cert.returncode == 0, with_cert.stderr


# ---- SIGHUP: a renewed certificate reaches new handshakes --------------------------------------


def test_sighup_swaps_the_served_certificate_on_both_listeners(
    mutual: TlsAgent, tmp_path: Path
) -> None:
    """Runs last on ``mutual``: its certificate files are replaced by another CA's."""
    old = mutual.pki
    assert served_certificate(mutual.https_port, old) == der(old.server_cert)
    assert served_certificate(mutual.grpc_port, old, alpn="h2") == der(old.server_cert)
    renewed = make_pki(tmp_path / "renewed", "the renewed CA")
    shutil.copyfile(renewed.server_cert, old.server_cert)
    shutil.copyfile(renewed.server_key, old.server_key)
    shutil.copyfile(renewed.ca, old.ca)  # clients of the new CA, too
    mutual.agent.hup_and_wait_for("TLS: new connections get the certificate")
    new = der(renewed.server_cert)
    assert served_certificate(mutual.https_port, renewed) == new
    assert served_certificate(mutual.grpc_port, renewed, alpn="h2") == new
    assert grpc_infer(mutual.grpc_port, renewed, cert=renewed).shape == (2, 4)


def test_a_reload_with_a_broken_key_keeps_serving_the_previous_certificate(
    served: TlsAgent,
) -> None:
    before = served_certificate(served.https_port, served.pki)
    original = served.pki.server_key.read_bytes()
    served.pki.server_key.write_text("not a key\n")
    try:
        served.agent.hup_and_wait_for("TLS reload refused")
    finally:
        served.pki.server_key.write_bytes(original)
    assert served_certificate(served.https_port, served.pki) == before
