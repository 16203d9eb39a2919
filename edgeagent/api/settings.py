"""[server] listener keys: Unix socket, TCP listener, token, body limit.

The engine's keys share the [server] table for compatibility and live in
``edgeagent.engine.settings``; ``edgeagent.config`` hands each class its own keys.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from edgeagent.paths import default_socket_path
from edgeagent.sections import computed_setting, require, setting


def is_loopback(host: str) -> bool:
    """True for names and addresses that never leave the machine (no token needed there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    """[server] listener keys: where the API listens and who may call it."""

    unix_socket: Path | None = computed_setting(
        default_socket_path,
        "Unix socket of the API: $RUNTIME_DIRECTORY/agent.sock under systemd, else "
        "$XDG_RUNTIME_DIR/edgeagent/agent.sock, else /tmp/edgeagent-$UID/agent.sock",
    )
    socket_mode: int = setting(
        0o660, "permissions of the socket (group edgeagent may connect)", "octal mode"
    )
    tcp_host: str = setting("127.0.0.1", "TCP listen address; a non-loopback address needs a token")
    tcp_port: int = setting(8080, "TCP port; 0 disables the TCP listener")
    token: str = setting(
        "", "bearer token clients must send; required when tcp_host is not loopback"
    )
    max_body_bytes: int = setting(
        16 * 1024 * 1024, "largest request body accepted (413 above)", "bytes"
    )

    def validate(self) -> None:
        require(0 <= self.tcp_port <= 65535, "server", "tcp_port", "must be 0..65535")
        require(0 <= self.socket_mode <= 0o777, "server", "socket_mode", "must be 0..0o777")
        require(self.max_body_bytes > 0, "server", "max_body_bytes", "must be positive")
        require(
            self.tcp_port == 0 or is_loopback(self.tcp_host) or bool(self.token),
            "server",
            "token",
            f"must be set when TCP listens on the non-loopback address {self.tcp_host!r}",
        )
