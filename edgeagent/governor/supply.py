"""Battery and mains state from ``/sys/class/power_supply``: the input to power-save mode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from edgeagent.governor.sysfs import SensorOffline, below, read_int, read_text
from edgeagent.hardware.profile import BatterySpec

CHARGER_STATES = ("Charging", "Full", "Not charging")
T = TypeVar("T")


@dataclass(frozen=True)
class SupplyState:
    on_ac: bool | None  # None: neither the AC supply nor the battery status could be read
    percent: float | None
    status: str | None  # the battery's own status: Charging, Discharging, Full …
    low: bool  # on battery and below the threshold: power-save
    errors: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "on_ac": self.on_ac,
            "percent": self.percent,
            "status": self.status,
            "low": self.low,
            "errors": list(self.errors),
        }


class SupplyMonitor:
    """Reads the profile's battery and AC supplies; an unreadable file leaves its field None."""

    def __init__(
        self, root: Path, spec: BatterySpec, low_percent: float, hysteresis_percent: float = 0.0
    ) -> None:
        self.base = below(root, "/sys/class/power_supply")
        self.spec = spec
        self.low_percent = low_percent
        self.hysteresis_percent = hysteresis_percent
        self._low = False

    def read(self) -> SupplyState:
        errors: list[str] = []

        def attempt(read: Callable[[Path], T], path: Path) -> T | None:
            try:
                return read(path)
            except SensorOffline as exc:
                errors.append(str(exc))
                return None

        battery = self.base / self.spec.supply
        if not battery.is_dir() and not (self.spec.ac and (self.base / self.spec.ac).is_dir()):
            missing = f"no power supply {self.spec.supply!r} or {self.spec.ac!r} in {self.base}"
            return SupplyState(None, None, None, False, (missing,))
        percent_raw = attempt(read_int, battery / "capacity")
        status = attempt(read_text, battery / "status")
        online = attempt(read_int, self.base / self.spec.ac / "online") if self.spec.ac else None
        if online is not None:
            on_ac: bool | None = online == 1
        elif status is not None:
            on_ac = status in CHARGER_STATES
        else:
            on_ac = None
        percent = None if percent_raw is None else float(percent_raw)
        # once low, the battery must recharge past low + hysteresis (or mains return) to leave
        threshold = self.low_percent + (self.hysteresis_percent if self._low else 0.0)
        self._low = on_ac is False and percent is not None and percent < threshold
        return SupplyState(on_ac, percent, status, self._low, tuple(errors))
