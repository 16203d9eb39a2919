"""The hub server's listener serves HTTPS from the same TLS settings as the agent's."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from devtools.broker import Broker
from devtools.hub_fleet import hub_server
from devtools.pki import der, make_pki, peer_certificate
from devtools.ports import free_port
from edgeagent.tls import TlsSettings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


async def test_hub_server_over_https_with_a_client_certificate(
    broker: Broker, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = TlsSettings(pki.server_cert, pki.server_key, pki.ca)
    database = f"sqlite:///{tmp_path / 'hub.db'}"
    async with hub_server(database, broker.settings(), tls=tls) as url:
        assert url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        trusted.load_cert_chain(pki.client_cert, pki.client_key)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/api/v1/devices", ssl=trusted) as answer:
                assert answer.status == 200
            anonymous = ssl.create_default_context(cafile=str(pki.ca))  # no client cert
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"{url}/api/v1/devices", ssl=anonymous) as answer:
                    await answer.read()
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url.replace("https", "http") + "/api/v1/devices") as a:
                    await a.read()


def test_hub_server_cli_reloads_its_certificate_on_sighup(tmp_path: Path) -> None:
    """``hub server --tls-cert/--tls-key``: HTTPS from the start, a renewed certificate served
    to new handshakes after SIGHUP, without a restart (no broker needed for the listener)."""
    first, renewed = make_pki(tmp_path / "first"), make_pki(tmp_path / "renewed", "renewed CA")
    cert, key = tmp_path / "hub.pem", tmp_path / "hub.key"
    shutil.copyfile(first.server_cert, cert)
    shutil.copyfile(first.server_key, key)
    process = subprocess.Popen(
        [sys.executable, "-m", "edgeagent.cli", "hub", "server", "--port", "0",
         "--db", f"sqlite:///{tmp_path / 'hub.db'}", "--state-dir", str(tmp_path / "state"),
         "--broker", f"127.0.0.1:{free_port()}", "--tls-cert", str(cert), "--tls-key", str(key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        listening = process.stdout.readline()
        assert listening.startswith("hub server listening on https://127.0.0.1:"), listening
        port = int(listening.rsplit(":", 1)[1])
        assert peer_certificate(port, first.ca) == der(first.server_cert)
        shutil.copyfile(renewed.server_cert, cert)
        shutil.copyfile(renewed.server_key, key)
        process.send_signal(signal.SIGHUP)
        for line in process.stderr:  # the sync point: the reload's own log line
            if "TLS: new connections get the certificate" in line:
                break
        else:
            raise AssertionError(f"the hub server exited {process.wait()} without reloading")
        assert peer_certificate(port, renewed.ca) == der(renewed.server_cert)
    finally:
        process.terminate()
        process.wait(60)
