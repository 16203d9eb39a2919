"""A client session on wherever a server under measurement listens: a Unix socket or a port.

Benchmarks address the agent and its peers alike by an ``Endpoint`` so one driver measures
every transport; request URLs are then plain paths (``/v2/...``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp


@dataclass(frozen=True)
class TlsPort:
    """An HTTPS port on 127.0.0.1, and the client context that trusts its certificate."""

    port: int
    context: ssl.SSLContext


# Where a server listens for HTTP: its Unix socket, a TCP port on 127.0.0.1, or an HTTPS one.
Endpoint = Path | int | TlsPort


def http_client(endpoint: Endpoint, limit: int = 100) -> aiohttp.ClientSession:
    """A client session on the endpoint; request URLs are paths (``/v2/...``)."""
    if isinstance(endpoint, Path):
        connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=str(endpoint), limit=limit)
        return aiohttp.ClientSession("http://agent", connector=connector)
    if isinstance(endpoint, TlsPort):
        connector = aiohttp.TCPConnector(limit=limit, ssl=endpoint.context)
        return aiohttp.ClientSession(f"https://127.0.0.1:{endpoint.port}", connector=connector)
    connector = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(f"http://127.0.0.1:{endpoint}", connector=connector)
