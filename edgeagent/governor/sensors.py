"""Every sensor a profile names, read in one pass into a Readings value.

Reading sysfs and running ``vcgencmd`` can block, so the governor calls ``read()`` in a worker
thread. A sensor that fails is recorded with its reason and left out of every decision: an
offline sensor is never treated as a reading of zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgeagent.governor.policy import ZoneTemperature
from edgeagent.governor.power import PowerSensor, power_sensor
from edgeagent.governor.settings import GovernorSettings
from edgeagent.governor.supply import SupplyMonitor, SupplyState
from edgeagent.governor.sysfs import SensorOffline
from edgeagent.governor.thermal import TemperatureSensor, temperature_sensor
from edgeagent.governor.throttled import PiThrottle, ThrottleFlags
from edgeagent.hardware.profile import BatterySpec, Profile, ThermalLimit
from edgeagent.hardware.profile import PowerSensor as PowerSensorSpec


@dataclass
class Readings:
    zones: list[ZoneTemperature] = field(default_factory=list)
    power_w: dict[str, float | None] = field(default_factory=dict)
    total_power_w: float | None = None
    supply: SupplyState | None = None
    throttle: ThrottleFlags | None = None
    errors: dict[str, str] = field(default_factory=dict)  # sensor key → why it is offline
    trip_points: dict[str, list[dict[str, object]]] = field(default_factory=dict)


class SensorSet:
    def __init__(
        self,
        root: Path,
        settings: GovernorSettings,
        thermal: Sequence[ThermalLimit],
        power: Sequence[PowerSensorSpec] = (),
        battery: BatterySpec | None = None,
        throttle_command: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.zones: list[tuple[TemperatureSensor, ThermalLimit]] = [
            (temperature_sensor(root, limit), limit) for limit in thermal
        ]
        self.power: list[PowerSensor] = [
            power_sensor(
                root,
                spec,
                pmic_command=settings.pmic_command,
                timeout_s=settings.command_timeout_s,
                clock=clock,
            )
            for spec in power
        ]
        self.supply = None
        if battery is not None:
            low = settings.battery_low_percent
            self.supply = SupplyMonitor(
                root,
                battery,
                battery.low_percent if low is None else low,
                settings.battery_hysteresis_percent,
            )
        command = settings.throttle_command or throttle_command
        self.throttle = PiThrottle(command, settings.command_timeout_s) if command else None

    @classmethod
    def from_profile(
        cls,
        root: Path,
        settings: GovernorSettings,
        profile: Profile,
        clock: Callable[[], float] = time.monotonic,
    ) -> SensorSet:
        return cls(
            root,
            settings,
            profile.thermal,
            profile.power_sensors,
            profile.battery,
            profile.throttle_command,
            clock,
        )

    def read(self) -> Readings:
        out = Readings()
        for sensor, limit in self.zones:
            try:
                celsius: float | None = sensor.read()
            except SensorOffline as exc:
                celsius = None
                out.errors[sensor.key] = str(exc)
            out.zones.append(ZoneTemperature(sensor.key, celsius, limit))
            out.trip_points[sensor.key] = sensor.trip_points()
        totals: list[float] = []
        for psensor in self.power:
            try:
                watts: float | None = psensor.read()
            except SensorOffline as exc:
                watts = None
                out.errors[psensor.key] = str(exc)
            out.power_w[psensor.key] = watts
            if psensor.total and watts is not None:
                totals.append(watts)
        if totals:
            out.total_power_w = totals[0]
        elif self.power and not any(p.total for p in self.power):
            # no board-total sensor: the sum of the rails, but only when every rail answered
            values = list(out.power_w.values())
            if all(w is not None for w in values):
                out.total_power_w = sum(w for w in values if w is not None)
        if self.supply is not None:
            out.supply = self.supply.read()
        if self.throttle is not None:
            try:
                out.throttle = self.throttle.read()
            except SensorOffline as exc:
                out.errors["vcgencmd:get_throttled"] = str(exc)
        return out


def power_reader(
    root: Path, settings: GovernorSettings, profile: Profile
) -> Callable[[], float | None] | None:
    """The board's total power in watts (None while unreadable), for the hardware chooser's
    power budget; None when the profile names no power sensor.

    It reads its own sensor objects, not the governor's: a RAPL average covers the time since
    *that object's* previous read, so sharing one with the governor's loop would cut the
    chooser's measuring window short.
    """
    if not profile.power_sensors:
        return None
    sensors = SensorSet(root, settings, (), profile.power_sensors)
    return lambda: sensors.read().total_power_w
