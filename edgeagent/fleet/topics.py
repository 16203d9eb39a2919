"""The MQTT topic layout, spelled once for the device and the hub alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topics:
    """Every topic one device uses, derived from the prefix, its group and its id."""

    prefix: str
    group: str
    device_id: str

    @property
    def group_release(self) -> str:
        return f"{self.prefix}/group/{self.group}/release"

    @property
    def group_trust(self) -> str:
        return f"{self.prefix}/group/{self.group}/trust"

    @property
    def device_release(self) -> str:
        return f"{self.prefix}/device/{self.device_id}/release"

    @property
    def availability(self) -> str:
        return f"{self.prefix}/device/{self.device_id}/availability"

    @property
    def state(self) -> str:
        return f"{self.prefix}/device/{self.device_id}/state"

    @property
    def events(self) -> str:
        return f"{self.prefix}/device/{self.device_id}/events"

    @property
    def subscriptions(self) -> tuple[str, ...]:
        return (self.group_release, self.group_trust, self.device_release)
