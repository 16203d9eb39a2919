"""A client session on wherever a server under measurement listens: a Unix socket or a port.

Benchmarks address the agent and its peers alike by an ``Endpoint`` so one driver measures
every transport; request URLs are then plain paths (``/v2/...``).
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

# Where a server listens for HTTP: its Unix socket, or a TCP port on 127.0.0.1.
Endpoint = Path | int


def http_client(endpoint: Endpoint, limit: int = 100) -> aiohttp.ClientSession:
    """A client session on the endpoint; request URLs are paths (``/v2/...``)."""
    if isinstance(endpoint, Path):
        connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=str(endpoint), limit=limit)
        return aiohttp.ClientSession("http://agent", connector=connector)
    connector = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(f"http://127.0.0.1:{endpoint}", connector=connector)
