"""systemd's notify protocol: READY, STOPPING, WATCHDOG and STATUS as datagrams.

The protocol is a few lines (sd_notify(3)): one ``KEY=VALUE`` datagram per message to the
Unix socket named by ``$NOTIFY_SOCKET``; a name starting with '@' is an abstract socket (a
leading NUL byte). Without ``$NOTIFY_SOCKET`` (not under systemd) every call is a no-op, so the
daemon calls it unconditionally. ``WATCHDOG_USEC`` (only for ``WATCHDOG_PID`` = our pid) asks
for a ping at least that often; we ping at half of it, as systemd recommends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    """Sends notify messages to the service manager, if there is one."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = _address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_interval_s = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, **fields: object) -> bool:
        """Send ``KEY=value`` lines (keys upper-cased); False when there is no manager or it fails.

        A failed notification is logged, never raised: losing a STATUS line must not take the
        daemon down (systemd itself treats the protocol as best-effort).
        """
        if self.address is None:
            return False
        message = "\n".join(f"{key.upper()}={value}" for key, value in fields.items())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError as exc:
            log.warning("sd_notify to %r failed: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        fields: dict[str, object] = {"READY": 1, "MAINPID": os.getpid()}
        if status:
            fields["STATUS"] = status
        return self.notify(**fields)

    def stopping(self, status: str = "draining") -> bool:
        return self.notify(STOPPING=1, STATUS=status)

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    async def watchdog_loop(self) -> None:
        """Ping at half the watchdog interval until cancelled; returns at once without one.

        It runs on the event loop, so a blocked loop (the failure the watchdog exists for)
        stops the pings and systemd restarts the service.
        """
        if self.watchdog_interval_s is None or not self.enabled:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(self.watchdog_interval_s)


def _address(name: str) -> str | bytes | None:
    if not name:
        return None
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    if name.startswith("/"):
        return name
    log.warning("ignoring NOTIFY_SOCKET=%r: neither a path nor an abstract name", name)
    return None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC when the watchdog is meant for this process, else None."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec:
        return None
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not an integer", usec)
        return None
    return value / 2e6 if value > 0 else None
