"""Peers found on the site by mDNS/DNS-SD (``zeroconf``), and this agent announced the same way.

An agent with ``[discovery] announce`` registers ``<name>._edgeagent._tcp.local.`` for its TCP
listener, its TXT record saying whether it speaks TLS, the SHA-256 fingerprint of its
certificate and the models it serves. An agent with ``[discovery] browse`` listens for such
announcements for ``browse_s`` when it starts and takes each one it can trust as a
``[[peer]]`` (``hardware.peers``): a lane of every model it may take, scheduled like any peer.

An announcement is only a claim — anyone on the LAN can make one — so it is never the
identity: a discovered peer must speak TLS and either have its certificate's fingerprint in
``fingerprints`` (then that pin is what the connection checks, so a forged announcement that
copies a listed fingerprint still fails at the handshake) or a certificate the site's CA
(``ca_file``) signed for the address it announced. Anything else is logged and left out.

Peers are found at start, like ``[[peer]]`` tables are read at start: a board that joins later
is taken at the agent's next restart.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.hardware.peers import PeerSettings
from edgeagent.runtimes.remote import normal_fingerprint
from edgeagent.sections import computed_setting, require, setting

log = logging.getLogger(__name__)

SERVICE = "_edgeagent._tcp.local."
TXT_MODELS_BYTES = 200  # a TXT string holds 255 bytes; the model list is a hint, cut short


@dataclass(frozen=True)
class DiscoverySettings:
    """[discovery]: announce this agent, and take peers announced on the site (both off)."""

    announce: bool = setting(
        False, "announce the TCP listener by mDNS/DNS-SD (needs the zeroconf extra)"
    )
    browse: bool = setting(
        False, "take agents announced on the site as peers, when they can be trusted (at start)"
    )
    name: str = setting("", "this agent's instance name; empty = [agent] device_id or host name")
    browse_s: float = setting(3.0, "how long to listen for announcements at start", "s")
    interfaces: list[str] = computed_setting(
        list, "addresses to announce and listen on; empty = every interface"
    )
    ca_file: Path | None = setting(
        None, "the site's CA: a discovered peer whose certificate it signed may be used"
    )
    fingerprints: list[str] = computed_setting(
        list, "SHA-256 fingerprints of certificates of discovered peers that may be used"
    )
    token: str = setting("", "bearer token sent to discovered peers", secret=True)
    max_peers: int = setting(8, "discovered peers taken at most")

    def validate(self) -> None:
        require(
            not self.browse or self.ca_file is not None or bool(self.fingerprints),
            "discovery",
            "browse",
            "needs ca_file or fingerprints: an announcement alone is no identity",
        )
        for pin in self.fingerprints:
            digits = normal_fingerprint(pin)
            require(
                len(digits) == 64 and all(c in "0123456789abcdef" for c in digits),
                "discovery",
                "fingerprints",
                f"{pin!r} is not a SHA-256 digest (64 hex digits, colons allowed)",
            )
        require(self.browse_s > 0, "discovery", "browse_s", "must be positive")
        require(1 <= self.max_peers <= 64, "discovery", "max_peers", "must be 1..64")
        require(
            self.ca_file is None or self.ca_file.is_file(),
            "discovery",
            "ca_file",
            f"{self.ca_file} is not a file",
        )


@dataclass(frozen=True)
class Announcement:
    """What an agent says about itself on the site."""

    name: str
    addresses: Sequence[str]  # IPv4 addresses its TCP listener answers on
    port: int
    tls: bool
    fingerprint: str = ""  # SHA-256 of its certificate (hex), with tls
    models: Sequence[str] = ()

    def properties(self) -> dict[str, str]:
        models = ",".join(self.models).encode()[:TXT_MODELS_BYTES].decode("utf-8", "ignore")
        return {
            "tls": "1" if self.tls else "0",
            "fp": normal_fingerprint(self.fingerprint),
            "models": models,
        }


def _zeroconf(interfaces: Sequence[str]) -> Any:
    from zeroconf import InterfaceChoice, IPVersion, Zeroconf

    chosen: Any = list(interfaces) if interfaces else InterfaceChoice.All
    return Zeroconf(interfaces=chosen, ip_version=IPVersion.V4Only)


class Announcer:
    """Registers this agent's service while it runs (a daemon service: start and stop)."""

    def __init__(self, settings: DiscoverySettings, about: Callable[[], Announcement]) -> None:
        self.settings = settings
        self._about = about
        self._zeroconf: Any = None
        self._info: Any = None

    async def start(self) -> None:
        from zeroconf import ServiceInfo
        from zeroconf.asyncio import AsyncZeroconf

        about = self._about()
        addresses = list(about.addresses) or _own_addresses(self.settings.interfaces)
        self._info = ServiceInfo(
            SERVICE,
            f"{about.name}.{SERVICE}",
            addresses=[socket.inet_aton(a) for a in addresses],
            port=about.port,
            properties=about.properties(),
            server=f"{about.name}.local.",
        )
        self._zeroconf = AsyncZeroconf(zc=_zeroconf(self.settings.interfaces))
        await self._zeroconf.async_register_service(self._info)
        log.info("announced as %s on %s port %d", about.name, ", ".join(addresses), about.port)

    async def stop(self) -> None:
        if self._zeroconf is not None:
            await self._zeroconf.async_unregister_service(self._info)
            await self._zeroconf.async_close()
            self._zeroconf = None


def _own_addresses(interfaces: Sequence[str]) -> list[str]:
    if interfaces:
        return list(interfaces)
    from zeroconf import get_all_addresses

    return [a for a in get_all_addresses() if not a.startswith("127.")]


def discover(
    settings: DiscoverySettings, own_name: str, enough: int | None = None
) -> list[PeerSettings]:
    """The trusted peers announced on the site within ``browse_s`` (sooner once ``enough``
    trusted ones are found). Blocking: call it in a worker thread."""
    from zeroconf import ServiceBrowser

    names: list[str] = []
    changed = threading.Condition()

    def seen(zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        with changed:
            if name not in names:
                names.append(name)
                changed.notify_all()

    zeroconf = _zeroconf(settings.interfaces)
    browser = ServiceBrowser(zeroconf, SERVICE, handlers=[seen])
    peers: dict[str, PeerSettings] = {}
    resolved: set[str] = set()
    until = time.monotonic() + settings.browse_s
    try:
        while (left := until - time.monotonic()) > 0 and len(peers) < settings.max_peers:
            with changed:
                changed.wait_for(lambda: len(names) > len(resolved), left)
                fresh = [n for n in names if n not in resolved]
            for name in fresh:
                resolved.add(name)
                peer = _peer(zeroconf, name, own_name, settings)
                if peer is not None:
                    peers[name] = peer
            if enough is not None and len(peers) >= enough:
                break
    finally:
        browser.cancel()
        zeroconf.close()
    return list(peers.values())[: settings.max_peers]


def _peer(zeroconf: Any, name: str, own: str, settings: DiscoverySettings) -> PeerSettings | None:
    """The peer an announcement names if it can be trusted, else None (logged)."""
    instance = name.removesuffix(f".{SERVICE}")
    if instance == own:
        return None
    info = zeroconf.get_service_info(SERVICE, name, timeout=int(settings.browse_s * 1000))
    if info is None or not info.parsed_addresses() or not info.port:
        log.warning("discovered %s: it did not answer with an address", instance)
        return None
    txt = {k.decode(): (v or b"").decode("utf-8", "replace") for k, v in info.properties.items()}
    url = f"https://{info.parsed_addresses()[0]}:{info.port}"
    pins = {normal_fingerprint(pin) for pin in settings.fingerprints}
    if txt.get("tls") != "1":
        log.warning("discovered %s at %s: no TLS, so no identity; not used", instance, url)
        return None
    if txt.get("fp") in pins:
        return PeerSettings(url=url, name=instance, token=settings.token, fingerprint=txt["fp"])
    if settings.ca_file is not None:
        return PeerSettings(url=url, name=instance, token=settings.token, ca_file=settings.ca_file)
    log.warning("discovered %s at %s: its certificate is not pinned; not used", instance, url)
    return None
