"""Peers found by mDNS/DNS-SD with real zeroconf on loopback: the daemon takes an announced
agent whose certificate is pinned as a peer and serves through it, leaves out one it cannot
trust (no TLS, or a fingerprint nobody pinned), and announces itself."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import aiohttp
import pytest

from devtools.pki import make_pki
from devtools.ports import free_port
from devtools.simulated_runtime import install_simulated
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.hardware.discovery import SERVICE, Announcement, Announcer, DiscoverySettings
from edgeagent.sections import ConfigError
from edgeagent.tls import certificate_fingerprint
from tests.integration.test_peers_tls import server_tls
from tests.support.hardware import FIXTURES, write_profile
from tests.support.helpers import write_tiny_package
from tests.support.http_agent import direct_run
from tests.support.peers import HostilePeer, infer_frames, serving

LOOPBACK = DiscoverySettings(interfaces=["127.0.0.1"])


def _config(tmp_path: Path, pin: str, port: int) -> str:
    return (
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = {port}\n"
        f"[hardware]\nroot = '{FIXTURES / 'generic-x86_64'}'\n"
        f"profiles_dir = '{tmp_path / 'profiles'}'\nprofile = 'test'\n"
        "[discovery]\nannounce = true\nbrowse = true\nname = 'board-a'\nbrowse_s = 2\n"
        f"interfaces = ['127.0.0.1']\nfingerprints = ['{pin}']\n"
    )


async def test_a_pinned_agent_announced_on_the_site_becomes_a_peer(tmp_path, monkeypatch):
    # The announced peer is far faster: 1 s a batch locally, so even a peer measured on a
    # loaded CI box (its TLS handshake and first answer took over 0.2 s there) wins the work.
    install_simulated(monkeypatch, {"SIM0": 1.0})
    write_profile(tmp_path / "profiles", "test", ["onnxruntime:SIM0:fp32"])
    root = write_tiny_package(tmp_path / "models" / "tiny")
    serving(root, plan="fixed", instances=1, max_batch_size=1)
    pki, stranger = make_pki(tmp_path / "pki"), make_pki(tmp_path / "stranger")
    pin = certificate_fingerprint(pki.server_cert)
    with direct_run(root) as reference, HostilePeer(reference, server_tls(pki, clients=False)) as b:
        announced = [
            Announcement("board-b", ["127.0.0.1"], b.port, True, pin, ["tiny"]),
            Announcement("board-c", ["127.0.0.1"], b.port, False),  # plain: no identity
            Announcement(  # TLS, but a certificate nobody pinned
                "board-d", ["127.0.0.1"], b.port, True, certificate_fingerprint(stranger.ca)
            ),
        ]
        announcers = [Announcer(LOOPBACK, lambda a=a: a) for a in announced]
        for announcer in announcers:
            await announcer.start()
        daemon = Daemon(parse_config(_config(tmp_path, pin, free_port())))
        try:
            await daemon.start()
            assert [p.name for p in daemon.accelerators.peers] == ["board-b"]
            assert daemon.accelerators.peers[0].url == f"https://127.0.0.1:{b.port}"
            connector = aiohttp.UnixConnector(path=str(tmp_path / "agent.sock"))
            async with aiohttp.ClientSession(connector=connector, base_url="http://a") as http:
                await infer_frames(http, 4)
                async with http.get("/v1/status") as response:
                    status = await response.json()
            shown = status["models"]["tiny"]["versions"]["1"]["session"]["instances"]
            assert [s["device"] for s in shown] == ["SIM0", *["peer:board-b"] * 2]  # concurrency
            assert sum(s["batches"] for s in shown[1:]) >= 1 and b.requests["good"] >= 2
            seen = await asyncio.to_thread(_announced, "board-a")  # the daemon announces itself
            assert seen == {"tls": "0", "fp": "", "models": "tiny"}
        finally:
            await daemon.stop()
            for announcer in announcers:
                await announcer.stop()


def _announced(name: str) -> dict[str, str]:
    """The TXT record of ``name`` as another agent on the site resolves it."""
    from zeroconf import IPVersion, ServiceBrowser, Zeroconf

    zeroconf = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    found = threading.Event()
    full = f"{name}.{SERVICE}"
    browser = ServiceBrowser(
        zeroconf, SERVICE, handlers=[lambda name, **_: found.set() if name == full else None]
    )
    try:
        assert found.wait(10), f"{name} was not announced"
        info = zeroconf.get_service_info(SERVICE, full, timeout=5000)
        assert info is not None
        return {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
    finally:
        browser.cancel()
        zeroconf.close()


def test_browsing_needs_a_ca_or_pins_and_announcing_a_tcp_port() -> None:
    with pytest.raises(ConfigError, match="an announcement alone is no identity"):
        parse_config("[discovery]\nbrowse = true\n")
    with pytest.raises(ConfigError, match="set \\[server\\] tcp_port"):
        parse_config("[server]\ntcp_port = 0\n[discovery]\nannounce = true\n")
    with pytest.raises(ConfigError, match="not a SHA-256 digest"):
        parse_config("[discovery]\nbrowse = true\nfingerprints = ['abc']\n")
