"""[zmq] keys: Frigate's ``zmq`` detector protocol on an IPC or TCP endpoint, off unless enabled.

Kept apart from the listener so the configuration loads (and is checked) on a device without
pyzmq (the ``zmq`` extra); only an enabled listener imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from edgeagent.netaddr import is_loopback
from edgeagent.paths import default_socket_path
from edgeagent.sections import require, setting

SCHEMES = ("ipc", "tcp")


def default_endpoint() -> str:
    """``ipc://`` beside the HTTP API's agent.sock (the runtime directory)."""
    return f"ipc://{default_socket_path().with_name('zmq_detector')}"


@dataclass(frozen=True)
class ZmqSettings:
    """[zmq]: where Frigate's zmq detector reaches the agent, and what it may ask of it."""

    enabled: bool = setting(False, "answer Frigate's zmq detector (needs the zmq extra)")
    endpoint: str = setting(
        "",
        "ipc://PATH or tcp://127.0.0.1:PORT (Frigate's detector endpoint); empty = "
        "ipc://…/zmq_detector beside the HTTP API's agent.sock",
    )
    model: str = setting("", "detection package that answers; empty = [server] deepstack_model")
    min_score: float = setting(
        0.4, "detections below this score are left out (Frigate's own detectors' cut-off)"
    )
    max_pixels: int = setting(
        4_000_000, "largest frame (width × height) accepted; bigger ones get no detections",
        "pixels",
    )  # fmt: skip
    max_in_flight: int = setting(
        4, "frames decoded and detected at once; more wait in the socket's queue"
    )
    socket_mode: int = setting(0o660, "permissions of an ipc:// endpoint's socket", "octal mode")

    def validate(self) -> None:
        endpoint = self.endpoint or default_endpoint()
        parts = urlsplit(endpoint)
        require(
            parts.scheme in SCHEMES and bool(parts.netloc or parts.path),
            "zmq",
            "endpoint",
            f"must be ipc://PATH or tcp://HOST:PORT, not {endpoint!r}",
        )
        if parts.scheme == "tcp":
            require(
                is_loopback(parts.hostname or ""),
                "zmq",
                "endpoint",
                "Frigate's protocol has no authentication or encryption: listen on ipc:// or "
                f"loopback tcp only, not {parts.hostname!r} (another host: DeepStack or v2 "
                "over TLS)",
            )
            require(parts.port is not None, "zmq", "endpoint", "a tcp:// endpoint needs a port")
        require(0 < self.min_score <= 1, "zmq", "min_score", "must be in (0, 1]")
        require(self.max_pixels > 0, "zmq", "max_pixels", "must be positive")
        require(1 <= self.max_in_flight <= 64, "zmq", "max_in_flight", "must be 1..64")
        require(0 <= self.socket_mode <= 0o777, "zmq", "socket_mode", "must be 0..0o777")

    @property
    def address(self) -> str:
        return self.endpoint or default_endpoint()
