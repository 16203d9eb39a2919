"""Power sensors: Jetson INA3221 rails, hwmon power inputs, Intel RAPL counters, Pi 5 PMIC.

Every sensor reports watts. RAPL only offers an energy counter, so its power is the difference
of two samples, corrected for the counter's wrap at ``max_energy_range_uj``.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from edgeagent.governor.command import run_command
from edgeagent.governor.sysfs import SensorOffline, below, find_by_name, read_int, read_text
from edgeagent.hardware.profile import PowerSensor as PowerSensorSpec

INA3221_SUM_CHANNEL = 7  # the driver's "sum of shunt voltages" channel, not a rail


class PowerSensor(ABC):
    """One power source; ``read()`` returns watts or raises SensorOffline."""

    kind: str

    def __init__(self, name: str, total: bool) -> None:
        self.name = name
        self.total = total

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind

    @abstractmethod
    def read(self) -> float: ...


def _hwmon_devices(root: Path, name: str) -> list[Path]:
    """hwmon devices called ``name``, from /sys/class/hwmon and, for Jetson's INA3221 (whose
    hwmon node is reached through its I²C device), /sys/bus/i2c/devices/*/hwmon."""
    found = find_by_name(below(root, "/sys/class/hwmon"), "hwmon*", name)
    found += find_by_name(below(root, "/sys/bus/i2c/devices"), "*/hwmon/hwmon*", name)
    unique: dict[Path, Path] = {}
    for path in found:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


class Ina3221Rail(PowerSensor):
    """A Jetson rail by its label: ``in{N}_input`` (mV) × ``curr{N}_input`` (mA).

    With an empty name it reads the board total: the input rail (``VDD_IN`` / ``POM_5V_IN``)
    where the board has one, else the sum of every connected rail.
    """

    kind = "ina3221"
    INPUT_RAILS = ("VDD_IN", "POM_5V_IN")

    def __init__(self, root: Path, name: str, total: bool) -> None:
        super().__init__(name, total or not name)
        self.root = root

    def rails(self) -> dict[str, tuple[Path, str]]:
        """Connected rails by label, skipping "NC" channels and the driver's sum channel."""
        found: dict[str, tuple[Path, str]] = {}
        for device in _hwmon_devices(self.root, "ina3221"):
            for label_file in sorted(device.glob("in*_label")):
                channel = label_file.name[2 : -len("_label")]
                if not channel.isdigit() or int(channel) == INA3221_SUM_CHANNEL:
                    continue
                try:
                    label = read_text(label_file)
                except SensorOffline:
                    continue
                if label and "NC" not in label:
                    found.setdefault(label, (device, channel))
        return found

    @staticmethod
    def _watts(device: Path, channel: str) -> float:
        return (
            read_int(device / f"in{channel}_input")
            * read_int(device / f"curr{channel}_input")
            / 1e6
        )

    def read(self) -> float:
        rails = self.rails()
        if self.name:
            if self.name not in rails:
                raise SensorOffline(f"no INA3221 rail labelled {self.name!r}")
            return self._watts(*rails[self.name])
        for rail in self.INPUT_RAILS:
            if rail in rails:
                return self._watts(*rails[rail])
        if not rails:
            raise SensorOffline("no INA3221 rails found")
        return sum(self._watts(*where) for where in rails.values())

    @property
    def key(self) -> str:
        return f"ina3221:{self.name or 'total'}"


class HwmonPower(PowerSensor):
    """The first ``power*_input`` (µW) of the hwmon device called ``name``."""

    kind = "hwmon"

    def __init__(self, root: Path, name: str, total: bool) -> None:
        super().__init__(name, total)
        self.root = root

    def read(self) -> float:
        for device in _hwmon_devices(self.root, self.name):
            inputs = sorted(device.glob("power*_input"))
            if inputs:
                return read_int(inputs[0]) / 1e6
        raise SensorOffline(f"no hwmon {self.name!r} power input")


class RaplDomain(PowerSensor):
    """An Intel RAPL powercap domain (``package-0``, ``core``, ``psys`` … or ``intel-rapl:0``):
    average power between two reads of the wrapping ``energy_uj`` counter."""

    kind = "rapl"

    def __init__(
        self, root: Path, name: str, total: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(name, total)
        self.root = root
        self.clock = clock
        self._last: tuple[float, int] | None = None

    def _domain(self) -> Path:
        base = below(self.root, "/sys/class/powercap")
        direct = base / self.name
        if (direct / "energy_uj").exists():
            return direct
        for domain in find_by_name(base, "intel-rapl*", self.name):
            return domain
        raise SensorOffline(f"no RAPL domain {self.name!r}")

    def read(self) -> float:
        domain = self._domain()
        energy = read_int(domain / "energy_uj")
        now = self.clock()
        last, self._last = self._last, (now, energy)
        if last is None:
            raise SensorOffline(f"{domain.name}: measuring (power needs two samples)")
        elapsed = now - last[0]
        if elapsed <= 0:
            raise SensorOffline(f"{domain.name}: no time between samples")
        delta = energy - last[1]
        if delta < 0:  # the counter wrapped
            delta += read_int(domain / "max_energy_range_uj")
        return delta / 1e6 / elapsed


_PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=([-+0-9.eE]+)[AV]\s*$")


def parse_pmic(text: str) -> dict[str, float]:
    """Watts per rail from ``vcgencmd pmic_read_adc`` (rails that report both A and V)."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        match = _PMIC_LINE.match(line)
        if match:
            rail, unit, value = match.groups()
            (amps if unit == "A" else volts)[rail] = float(value)
    return {rail: amps[rail] * volts[rail] for rail in sorted(amps.keys() & volts.keys())}


class PmicPower(PowerSensor):
    """Raspberry Pi 5 PMIC: one rail by name, or (name "" or "all") the sum of all rails."""

    ALL = ("", "all")

    kind = "vcgencmd_pmic"

    def __init__(self, name: str, total: bool, command: str, timeout_s: float) -> None:
        super().__init__(name, total)
        self.command = command
        self.timeout_s = timeout_s

    def read(self) -> float:
        rails = parse_pmic(run_command(self.command, self.timeout_s))
        if not rails:
            raise SensorOffline(f"{self.command!r}: no rail readings in its output")
        if self.name in self.ALL:
            return sum(rails.values())
        if self.name not in rails:
            raise SensorOffline(f"{self.command!r}: no rail {self.name!r}")
        return rails[self.name]


def power_sensor(
    root: Path,
    spec: PowerSensorSpec,
    *,
    pmic_command: str,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> PowerSensor:
    """The sensor a profile's ``[[power.sensor]]`` entry names."""
    if spec.kind == "ina3221":
        return Ina3221Rail(root, spec.name, spec.total)
    if spec.kind == "hwmon":
        return HwmonPower(root, spec.name, spec.total)
    if spec.kind == "rapl":
        return RaplDomain(root, spec.name, spec.total, clock)
    if spec.kind == "vcgencmd_pmic":
        return PmicPower(spec.name, spec.total, pmic_command, timeout_s)
    raise ValueError(
        f"unknown power sensor kind {spec.kind!r} (ina3221, hwmon, rapl or vcgencmd_pmic)"
    )
