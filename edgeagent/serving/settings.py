"""[server]: listeners and the limits that protect the device from its clients."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from edgeagent.settings import require


def default_socket_path() -> Path:
    """/run/edgeagent under systemd (RuntimeDirectory), else the user's runtime directory."""
    runtime = os.environ.get("RUNTIME_DIRECTORY") or os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime.split(":")[0]) / (
            "agent.sock" if "RUNTIME_DIRECTORY" in os.environ else "edgeagent/agent.sock"
        )
    return Path("/tmp") / f"edgeagent-{os.getuid()}" / "agent.sock"


@dataclass(frozen=True)
class ServerSettings:
    unix_socket: Path | None = field(default_factory=default_socket_path)
    socket_mode: int = 0o660
    tcp_host: str = "127.0.0.1"
    tcp_port: int = 8080  # 0 disables the TCP listener
    token: str = ""  # bearer token; required when tcp_host is not loopback
    max_body_bytes: int = 16 * 1024 * 1024
    max_queue: int = 64  # queued requests per model before 429
    request_timeout_s: float = 10.0
    drain_timeout_s: float = 10.0

    def validate(self) -> None:
        require(0 <= self.tcp_port <= 65535, "server", "tcp_port", "must be 0..65535")
        require(self.max_body_bytes > 0, "server", "max_body_bytes", "must be positive")
        require(self.max_queue > 0, "server", "max_queue", "must be positive")
        require(self.request_timeout_s > 0, "server", "request_timeout_s", "must be positive")
