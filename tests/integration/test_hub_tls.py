"""The hub server's listener serves HTTPS from the same TLS settings as the agent's."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest

from devtools.broker import Broker
from devtools.hub_fleet import hub_server
from devtools.pki import make_pki
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
