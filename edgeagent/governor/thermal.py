"""Temperature sensors: thermal zones by type, hwmon inputs by name and label, Coral apex chips.

Each profile ``[[thermal.zone]]`` becomes one sensor. The sensor re-finds its file when a read
fails, because a zone or hwmon device that disappears (driver reload, module powered down) may
come back under another index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from edgeagent.governor.sysfs import SensorOffline, below, find_by_name, read_int, read_text
from edgeagent.hardware.profile import ThermalLimit

OFFLINE_CELSIUS = -255.0  # Jetson zones read -256 °C while their block is powered down


def millicelsius(path: Path) -> float:
    """A m°C attribute in °C; the Jetson "-256 °C" powered-down marker is offline, not cold."""
    celsius = read_int(path) / 1000.0
    if celsius <= OFFLINE_CELSIUS:
        raise SensorOffline(f"{path}: reads {celsius:g} °C (sensor powered down)")
    return celsius


class TemperatureSensor(ABC):
    """One temperature source; ``read()`` returns °C or raises SensorOffline."""

    kind: str

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = name
        self._path: Path | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"

    def read(self) -> float:
        if self._path is not None:
            try:
                return millicelsius(self._path)
            except SensorOffline:
                if self._path.exists():
                    raise  # the file is there: the sensor itself is offline
        self._path = self.locate()  # first read, or the device was renumbered
        return millicelsius(self._path)

    @abstractmethod
    def locate(self) -> Path:
        """The m°C file to read; SensorOffline when no such sensor exists now."""

    def trip_points(self) -> list[dict[str, object]]:
        """Kernel trip points (only thermal zones have them)."""
        return []


class ThermalZone(TemperatureSensor):
    """``/sys/class/thermal/thermal_zone*`` whose ``type`` is the profile's name."""

    kind = "zone"

    def _zone(self) -> Path:
        zones = find_by_name(
            below(self.root, "/sys/class/thermal"), "thermal_zone*", self.name, "type"
        )
        if not zones:
            raise SensorOffline(f"no thermal zone of type {self.name!r}")
        return zones[0]

    def locate(self) -> Path:
        return self._zone() / "temp"

    def trip_points(self) -> list[dict[str, object]]:
        try:
            zone = self._zone()
        except SensorOffline:
            return []
        points: list[dict[str, object]] = []
        for type_file in sorted(zone.glob("trip_point_*_type")):
            index = type_file.name[len("trip_point_") : -len("_type")]
            try:
                celsius = read_int(zone / f"trip_point_{index}_temp") / 1000.0
                points.append({"type": read_text(type_file), "celsius": celsius})
            except SensorOffline:
                continue
        return points


class HwmonTemperature(TemperatureSensor):
    """``/sys/class/hwmon/hwmon*`` named ``name``: the ``temp*_input`` whose label matches
    (``label`` empty: the first temperature input)."""

    kind = "hwmon"

    def __init__(self, root: Path, name: str, label: str) -> None:
        super().__init__(root, name)
        self.label = label

    @property
    def key(self) -> str:
        return f"hwmon:{self.name}" + (f"/{self.label}" if self.label else "")

    def locate(self) -> Path:
        for device in find_by_name(below(self.root, "/sys/class/hwmon"), "hwmon*", self.name):
            inputs = sorted(device.glob("temp*_input"), key=lambda p: int(p.name[4:-6] or 0))
            for path in inputs:
                if not self.label:
                    return path
                label_file = path.with_name(path.name.replace("_input", "_label"))
                try:
                    if read_text(label_file) == self.label:
                        return path
                except SensorOffline:
                    continue
        wanted = f" label {self.label!r}" if self.label else ""
        raise SensorOffline(f"no hwmon {self.name!r} temperature{wanted}")


class ApexTemperature(TemperatureSensor):
    """A Coral PCIe Edge TPU: ``/sys/class/apex/<name>/temp`` in m°C."""

    kind = "apex"

    def locate(self) -> Path:
        path = below(self.root, "/sys/class/apex") / self.name / "temp"
        if not path.exists():
            raise SensorOffline(f"no apex device {self.name!r}")
        return path


def temperature_sensor(root: Path, limit: ThermalLimit) -> TemperatureSensor:
    """The sensor a profile's ``[[thermal.zone]]`` entry names."""
    if limit.sensor == "zone":
        return ThermalZone(root, limit.name)
    if limit.sensor == "hwmon":
        return HwmonTemperature(root, limit.name, limit.label)
    if limit.sensor == "apex":
        return ApexTemperature(root, limit.name)
    raise ValueError(f"unknown thermal sensor kind {limit.sensor!r} (zone, hwmon or apex)")
