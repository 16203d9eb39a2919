"""[server]: listeners, the serving engine's knobs, and the limits that protect the device."""

from __future__ import annotations

import ipaddress
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
    unix_socket: Path | None = field(default_factory=default_socket_path)
    socket_mode: int = 0o660
    tcp_host: str = "127.0.0.1"
    tcp_port: int = 8080  # 0 disables the TCP listener
    token: str = ""  # bearer token; required when tcp_host is not loopback
    max_body_bytes: int = 16 * 1024 * 1024
    max_queue: int = 64  # queued requests per model before 429
    request_timeout_s: float = 10.0  # per-request deadline when the client sets none
    drain_timeout_s: float = 10.0  # on shutdown/hot swap: longest wait for in-flight requests
    # --- serving engine; None = the model package's [serving] value ---
    max_batch_size: int | None = None  # rows merged into one batch
    max_queue_delay_ms: float | None = None  # longest wait for a batch to fill
    # Wait for a batch to fill only after a batch that served several requests (a lone client
    # is never delayed); false = always wait max_queue_delay_ms, like Triton.
    adaptive_batching: bool = True
    cache_size: int | None = None  # result-cache entries per model (0 disables)
    worker_threads: int = 4  # inference threads shared by all models (one batch per model)
    default_priority: int = 2  # priority of requests that give none (1 = most urgent)
    warmup: bool = True  # run one inference before a model (version) takes traffic
    # Canary (ModelRegistry.canary): judged after this many answered requests; rolled back when
    # its server-side failure rate or its mean latency against the stable version is above.
    canary_min_requests: int = 50
    canary_max_error_rate: float = 0.02
    canary_max_latency_ratio: float = 1.5

    def validate(self) -> None:
        require(0 <= self.tcp_port <= 65535, "server", "tcp_port", "must be 0..65535")
        require(0 <= self.socket_mode <= 0o777, "server", "socket_mode", "must be 0..0o777")
        require(self.max_body_bytes > 0, "server", "max_body_bytes", "must be positive")
        require(self.max_queue > 0, "server", "max_queue", "must be positive")
        require(self.request_timeout_s > 0, "server", "request_timeout_s", "must be positive")
        require(self.drain_timeout_s >= 0, "server", "drain_timeout_s", "must not be negative")
        require(
            self.max_batch_size is None or self.max_batch_size >= 1,
            "server",
            "max_batch_size",
            "must be at least 1",
        )
        require(
            self.max_queue_delay_ms is None or self.max_queue_delay_ms >= 0,
            "server",
            "max_queue_delay_ms",
            "must not be negative",
        )
        require(
            self.cache_size is None or self.cache_size >= 0,
            "server",
            "cache_size",
            "must not be negative",
        )
        require(self.worker_threads >= 1, "server", "worker_threads", "must be at least 1")
        require(self.default_priority >= 1, "server", "default_priority", "must be at least 1")
        require(
            self.canary_min_requests >= 1, "server", "canary_min_requests", "must be at least 1"
        )
        require(
            0 <= self.canary_max_error_rate <= 1,
            "server",
            "canary_max_error_rate",
            "must be between 0 and 1",
        )
        require(
            self.canary_max_latency_ratio >= 1,
            "server",
            "canary_max_latency_ratio",
            "must be at least 1",
        )
        require(
            self.tcp_port == 0 or is_loopback(self.tcp_host) or bool(self.token),
            "server",
            "token",
            f"must be set when TCP listens on the non-loopback address {self.tcp_host!r}",
        )
