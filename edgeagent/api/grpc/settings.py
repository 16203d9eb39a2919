"""[grpc] keys: the KServe v2 gRPC listener (TCP and Unix socket), off unless enabled.

Kept apart from the server module so that the configuration loads (and is checked) on a device
without the optional ``[grpc]`` extra; only an enabled listener imports grpcio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeagent.paths import default_socket_path
from edgeagent.sections import computed_setting, require, setting
from edgeagent.tls import TlsMode


def _default_grpc_socket() -> Path:
    return default_socket_path().with_name("grpc.sock")


@dataclass(frozen=True)
class GrpcSettings:
    """[grpc]: where the gRPC listener is; the bearer token is [server] token (one rule)."""

    enabled: bool = setting(False, "serve KServe v2 gRPC (needs the grpc extra)")
    host: str = setting("127.0.0.1", "gRPC TCP listen address")
    port: int = setting(8001, "gRPC TCP port; 0 disables the TCP listener")
    tls: TlsMode = setting(
        "auto",
        "auto: TLS with the [tls] certificate when one is set, else plain (refused on a "
        'non-loopback host); "off": plain wherever it listens',
    )
    unix_socket: Path | None = computed_setting(
        _default_grpc_socket, "gRPC Unix socket: grpc.sock beside the HTTP API's agent.sock"
    )
    socket_mode: int = setting(0o660, "permissions of the gRPC socket", "octal mode")
    max_message_bytes: int = setting(
        16 * 1024 * 1024,
        "largest gRPC message either way (a 224x224 FP32 batch of 8 is 4.8 MB)",
        "bytes",
    )
    max_concurrent_rpcs: int = setting(
        256, "calls in progress at once; more are refused with RESOURCE_EXHAUSTED"
    )

    def validate(self) -> None:
        require(0 <= self.port <= 65535, "grpc", "port", "must be 0..65535")
        require(0 <= self.socket_mode <= 0o777, "grpc", "socket_mode", "must be 0..0o777")
        require(self.max_message_bytes > 0, "grpc", "max_message_bytes", "must be positive")
        require(self.max_concurrent_rpcs > 0, "grpc", "max_concurrent_rpcs", "must be positive")
