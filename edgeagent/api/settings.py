"""[server] listener keys: Unix socket, TCP listener, who may call it, and the limits per listener.

The engine's keys share the [server] table for compatibility and live in
``edgeagent.engine.settings``; ``edgeagent.config`` hands each class its own keys.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edgeagent.paths import default_socket_path
from edgeagent.sections import require


def is_loopback(host: str) -> bool:
    """True for names and addresses that never leave the machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _token_ok(token: str) -> bool:
    """Visible ASCII only: anything else cannot travel in an Authorization header reliably."""
    return all(33 <= ord(c) <= 126 for c in token)


@dataclass(frozen=True)
class ServerSettings:
    """[server] listener keys: where the API listens, who may call it, what a client may cost."""

    unix_socket: Path | None = field(default_factory=default_socket_path)
    socket_mode: int = 0o660
    tcp_host: str = "127.0.0.1"
    tcp_port: int = 8080  # 0 disables the TCP listener
    # "token": every TCP request needs Authorization: Bearer <token> (loopback included);
    # "none": inference and reads over TCP are open (repository load/unload never are).
    tcp_auth: Literal["token", "none"] = "token"
    token: str = ""  # bearer token for TCP requests; unset = TCP refuses everyone
    admin_token: str = ""  # bearer token for repository load/unload over TCP; unset = socket only
    allowed_hosts: list[str] = field(default_factory=list)  # extra Host names TCP answers to
    max_body_bytes: int = 16 * 1024 * 1024
    # What one listener accepts at once, and how long a client may take (slowloris).
    max_connections: int = 100  # per listener; more are answered 503 and closed
    header_timeout_s: float = 15.0  # a request head must be complete this long after the last
    body_timeout_s: float = 10.0  # grace before a body must arrive at body_min_bytes_per_s
    body_min_bytes_per_s: int = 64 * 1024
    send_timeout_s: float = 30.0  # a client that reads none of its answer this long is dropped
    # Bytes of request bodies being read and decoded at once per listener; JSON counts 4×.
    max_decoding_bytes: int = 64 * 1024 * 1024

    def validate(self) -> None:
        require(0 <= self.tcp_port <= 65535, "server", "tcp_port", "must be 0..65535")
        require(0 <= self.socket_mode <= 0o777, "server", "socket_mode", "must be 0..0o777")
        require(self.max_body_bytes > 0, "server", "max_body_bytes", "must be positive")
        for key in ("token", "admin_token"):
            require(
                _token_ok(getattr(self, key)), "server", key, "must be visible ASCII characters"
            )
        require(
            not self.token or self.token != self.admin_token,
            "server",
            "admin_token",
            "must differ from [server] token, or the two scopes are one",
        )
        require(
            self.tcp_port == 0 or self.tcp_auth == "token" or is_loopback(self.tcp_host),
            "server",
            "tcp_auth",
            f"'none' is only allowed on a loopback tcp_host, not {self.tcp_host!r}",
        )
        require(
            self.tcp_port == 0 or is_loopback(self.tcp_host) or bool(self.token),
            "server",
            "token",
            f"must be set when TCP listens on the non-loopback address {self.tcp_host!r}",
        )
        require(self.max_connections >= 1, "server", "max_connections", "must be at least 1")
        for key in ("header_timeout_s", "body_timeout_s", "send_timeout_s"):
            require(getattr(self, key) > 0, "server", key, "must be positive")
        require(self.body_min_bytes_per_s > 0, "server", "body_min_bytes_per_s", "must be positive")
        require(
            self.max_decoding_bytes >= self.max_body_bytes,
            "server",
            "max_decoding_bytes",
            "must be at least max_body_bytes (one largest request must fit)",
        )
