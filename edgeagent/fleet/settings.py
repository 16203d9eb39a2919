"""[mqtt]: the broker connection, shared by the device's updater and the hub's tools."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.sections import require


@dataclass(frozen=True)
class MqttSettings:
    """[mqtt]: the broker link. Persistent session + QoS 1 so releases survive being offline."""

    host: str = "127.0.0.1"
    port: int = 1883
    topic_prefix: str = "edgeagent"
    client_id: str = ""  # default: "edgeagent-<device id>"; must be stable for the session
    username: str = ""
    password: str = ""
    tls: bool = False
    ca_file: Path | None = None  # CA that signed the broker's certificate
    cert_file: Path | None = None  # client certificate (mutual TLS)
    key_file: Path | None = None
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0  # TCP + TLS + CONNACK; then back off and try again
    session_expiry_s: int = 7 * 24 * 3600  # how long the broker keeps our queued QoS 1 messages
    reconnect_min_s: float = 1.0  # first back-off; doubles up to reconnect_max_s, with jitter
    reconnect_max_s: float = 60.0
    # The broker never delivers a bigger packet (MQTT 5 Maximum-Packet-Size in CONNECT), so an
    # oversized message costs the device nothing; a trust chain of many rotations may need more.
    max_message_bytes: int = MAX_ENVELOPE_BYTES

    def validate(self) -> None:
        require(0 < self.port <= 65535, "mqtt", "port", "must be 1..65535")
        require(
            bool(self.topic_prefix) and not any(c in self.topic_prefix for c in "+#"),
            "mqtt",
            "topic_prefix",
            "must be non-empty and contain no MQTT wildcards (+ #)",
        )
        require(
            (self.cert_file is None) == (self.key_file is None),
            "mqtt",
            "cert_file",
            "cert_file and key_file go together (client certificate and its key)",
        )
        require(self.keepalive_s >= 5, "mqtt", "keepalive_s", "must be at least 5")
        require(self.connect_timeout_s > 0, "mqtt", "connect_timeout_s", "must be positive")
        require(
            0 < self.reconnect_min_s <= self.reconnect_max_s,
            "mqtt",
            "reconnect_min_s",
            "must be positive and not above reconnect_max_s",
        )
        require(self.max_message_bytes > 0, "mqtt", "max_message_bytes", "must be positive")
