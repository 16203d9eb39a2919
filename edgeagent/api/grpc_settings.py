"""[grpc] keys: the KServe v2 gRPC listener (TCP and Unix socket), off unless enabled.

Kept apart from the server module so that the configuration loads (and is checked) on a device
without the optional ``[grpc]`` extra; only an enabled listener imports grpcio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgeagent.api.settings import is_loopback
from edgeagent.paths import default_socket_path
from edgeagent.sections import require


def _default_grpc_socket() -> Path:
    return default_socket_path().with_name("grpc.sock")


@dataclass(frozen=True)
class GrpcSettings:
    """[grpc]: where the gRPC listener is; the bearer token is [server] token (one rule)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 8001  # 0 disables the TCP listener
    unix_socket: Path | None = field(default_factory=_default_grpc_socket)
    socket_mode: int = 0o660
    # Largest message either way; a 224×224 FP32 batch of 8 is 4.8 MB.
    max_message_bytes: int = 16 * 1024 * 1024
    max_concurrent_rpcs: int = 256  # beyond this, calls are refused with RESOURCE_EXHAUSTED

    def validate(self) -> None:
        require(0 <= self.port <= 65535, "grpc", "port", "must be 0..65535")
        require(0 <= self.socket_mode <= 0o777, "grpc", "socket_mode", "must be 0..0o777")
        require(self.max_message_bytes > 0, "grpc", "max_message_bytes", "must be positive")
        require(self.max_concurrent_rpcs > 0, "grpc", "max_concurrent_rpcs", "must be positive")

    def tcp_needs_token(self) -> bool:
        """True when TCP calls must carry the token: the listener is not loopback-only."""
        return not is_loopback(self.host)
