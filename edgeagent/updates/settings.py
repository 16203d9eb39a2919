"""[updates] and [mqtt]: signed model updates and the broker connection."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateSettings:
    enabled: bool = False


@dataclass(frozen=True)
class MqttSettings:
    host: str = "127.0.0.1"
    port: int = 1883
