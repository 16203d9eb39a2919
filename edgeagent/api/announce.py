"""The daemon's side of ``[discovery]``: what this agent announces about its TCP listener, and
the announced agents it takes as peers at start.

Beside the listeners because an announcement describes one (its address, whether it speaks TLS,
its certificate's fingerprint); the mDNS work itself and the trust rules are
``hardware.discovery``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from edgeagent.api.settings import ServerSettings
from edgeagent.hardware.discovery import Announcement, DiscoverySettings, discover
from edgeagent.hardware.service import Accelerators
from edgeagent.tls import certificate_fingerprint

log = logging.getLogger(__name__)


def announcement(
    name: str,
    server: ServerSettings,
    *,
    tls: bool,
    cert_file: Path | None,
    models: Iterable[str],
) -> Announcement:
    """What ``[discovery] announce`` says about this agent: its TCP listener and models."""
    host = server.tcp_host
    return Announcement(
        name=name,
        addresses=[] if host in ("0.0.0.0", "") else [host],
        port=server.tcp_port,
        tls=tls,
        fingerprint=certificate_fingerprint(cert_file) if tls and cert_file else "",
        models=list(models),
    )


async def join_discovered(
    settings: DiscoverySettings, site_name: str, accelerators: Accelerators
) -> None:
    """``[discovery] browse``: the trusted agents announced on the site join the ``[[peer]]``s
    (each once: a peer already named by a table keeps its table)."""
    if not settings.browse:
        return
    found = await asyncio.to_thread(discover, settings, site_name)
    named = {peer.label for peer in accelerators.peers}
    fresh = tuple(peer for peer in found if peer.label not in named)
    accelerators.peers = (*accelerators.peers, *fresh)
    log.info("discovered %d peer(s): %s", len(fresh), ", ".join(p.url for p in fresh) or "-")
