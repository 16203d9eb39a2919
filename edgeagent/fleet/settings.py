"""[mqtt]: the broker connection, shared by the device's updater and the hub's tools."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.sections import require, setting


@dataclass(frozen=True)
class MqttSettings:
    """[mqtt]: the broker link. Persistent session + QoS 1 so releases survive being offline."""

    host: str = setting("127.0.0.1", "MQTT broker host name or address")
    port: int = setting(1883, "MQTT broker port (8883 is usual with tls = true)")
    topic_prefix: str = setting("edgeagent", "first level of every topic (no + or #)")
    client_id: str = setting(
        "", 'MQTT client id; default "edgeagent-<device id>"; must be stable for the session'
    )
    username: str = setting("", "broker user name (empty: anonymous)")
    password: str = setting("", "broker password", secret=True)
    tls: bool = setting(False, "connect with TLS")
    ca_file: Path | None = setting(None, "CA that signed the broker's certificate")
    cert_file: Path | None = setting(None, "client certificate (mutual TLS)")
    key_file: Path | None = setting(None, "private key of cert_file (mutual TLS)")
    keepalive_s: int = setting(30, "MQTT keep-alive interval", "s")
    connect_timeout_s: float = setting(
        10.0, "TCP + TLS + CONNACK; then back off and try again", "s"
    )
    session_expiry_s: int = setting(
        7 * 24 * 3600, "how long the broker keeps our queued QoS 1 messages", "s"
    )
    reconnect_min_s: float = setting(
        1.0, "first back-off; doubles up to reconnect_max_s, with jitter", "s"
    )
    reconnect_max_s: float = setting(60.0, "longest back-off between reconnects", "s")
    # The broker never delivers a bigger packet (MQTT 5 Maximum-Packet-Size in CONNECT), so an
    # oversized message costs the device nothing; a trust chain of many rotations may need more.
    max_message_bytes: int = setting(
        MAX_ENVELOPE_BYTES, "largest MQTT packet the broker may deliver to us", "bytes"
    )

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
