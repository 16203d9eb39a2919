"""A peer's identity: mTLS with the site's CA, or its certificate pinned by fingerprint; a peer
with a forged certificate (another key under the same name) is never sent a request, and the
model serves locally."""

from __future__ import annotations

import hashlib
import ssl
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devtools.pki import Pki, make_pki
from devtools.simulated_runtime import install_simulated
from edgeagent.hardware.peers import PeerSettings
from tests.support.helpers import write_tiny_package
from tests.support.http_agent import direct_run
from tests.support.peers import HostilePeer, frames, lanes, served


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


def server_tls(pki: Pki, *, clients: bool) -> ssl.SSLContext:
    """The peer's TLS: its certificate, and with ``clients`` a client certificate required."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if clients:
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def fingerprint(pki: Pki) -> str:
    der = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).public_bytes(
        serialization.Encoding.DER
    )
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


async def serve_some(tmp_path, executor, root, peer: PeerSettings) -> tuple[int, bool]:
    """Serve a few requests with ``peer``; (batches the peer ran, whether it is in rotation)."""
    async with served(tmp_path, executor, root, [peer]) as model:
        for x in frames(6):
            await model.infer({"input": x})
        _, remote = lanes(model)
        return sum(i.batches for i in remote), remote[0].session.state.up


@pytest.mark.parametrize("client_cert", [True, False])
async def test_mtls_with_the_sites_ca(tmp_path, executor, monkeypatch, client_cert) -> None:
    install_simulated(monkeypatch, {"SIM0": 0.2})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    pki = make_pki(tmp_path / "pki")
    with direct_run(root) as reference, HostilePeer(reference, server_tls(pki, clients=True)) as p:
        keys = {"cert_file": pki.client_cert, "key_file": pki.client_key} if client_cert else {}
        peer = PeerSettings(url=p.url, name="b", ca_file=pki.ca, **keys)  # type: ignore[arg-type]
        batches, up = await serve_some(tmp_path, executor, root, peer)
    if client_cert:  # it joined: its warm-up came through the handshake (whether the
        # scheduler then sends it work depends on how fast each lane measured, not on TLS)
        assert up and p.requests["good"] == batches + 1
    else:  # the peer refuses the handshake: it never joins, every request is served here
        assert (batches, up, p.requests["good"]) == (0, False, 0)


@pytest.mark.parametrize("forged", [False, True])
async def test_a_pinned_peer_and_a_forged_one(tmp_path, executor, monkeypatch, forged) -> None:
    install_simulated(monkeypatch, {"SIM0": 0.2})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    pinned = make_pki(tmp_path / "pinned")
    # A forger has a certificate for the same name from a CA of its own, not the pinned key.
    shown = make_pki(tmp_path / "forger") if forged else pinned
    with (
        direct_run(root) as reference,
        HostilePeer(reference, server_tls(shown, clients=False)) as p,
    ):
        peer = PeerSettings(url=p.url, name="b", fingerprint=fingerprint(pinned))
        batches, up = await serve_some(tmp_path, executor, root, peer)
    if forged:
        assert (batches, up, p.requests["good"]) == (0, False, 0)  # not even the warm-up
    else:  # the pinned key: it joined, its warm-up through the handshake
        assert up and p.requests["good"] == batches + 1
