"""A thermal simulator: a fake sysfs thermal zone heated by the agent's real utilisation.

The zone is written exactly as the kernel presents one (``thermal_zone0/type``, ``temp`` in
m°C, ``trip_point_N_type``/``_temp``), so the governor reads it through its ordinary sensor code.
Its temperature follows the first-order model of a chip on a heatsink:

    dT/dt = (ambient + heat_c · u − T) / tau

where u ∈ [0, 1] is the utilisation actually measured (the engine's busy seconds per second,
governor/engine_load.py) — so throttling inference really cools it down.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

from edgeagent.fsutil import write_text_atomic
from edgeagent.hardware.profile import ThermalLimit

ZONE_TYPE = "sim-thermal"


def simulated_zone(warm_c: float, hot_c: float, critical_c: float) -> ThermalLimit:
    """The simulated zone as a profile ``[[thermal.zone]]`` entry."""
    return ThermalLimit("zone", ZONE_TYPE, "", warm_c, hot_c, critical_c)


class ThermalSimulator:
    def __init__(
        self,
        root: Path,
        *,
        ambient_c: float = 40.0,
        heat_c: float = 60.0,
        tau_s: float = 10.0,
        noise_c: float = 0.0,
        limit: ThermalLimit | None = None,
        seed: int | None = None,
    ) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be positive")
        self.root = root
        self.ambient_c = ambient_c
        self.heat_c = heat_c
        self.tau_s = tau_s
        self.noise_c = noise_c
        self.limit = limit or simulated_zone(60.0, 70.0, 80.0)
        self.temperature_c = ambient_c
        self._random = random.Random(seed)
        self.zone_dir = root / "sys" / "class" / "thermal" / "thermal_zone0"
        self._write_tree()

    def _write_tree(self) -> None:
        self.zone_dir.mkdir(parents=True, exist_ok=True)
        _write(self.zone_dir / "type", ZONE_TYPE)
        _write(self.zone_dir / "mode", "enabled")
        trips = (("passive", self.limit.hot_c), ("critical", self.limit.critical_c))
        for index, (kind, celsius) in enumerate(trips):
            _write(self.zone_dir / f"trip_point_{index}_type", kind)
            _write(self.zone_dir / f"trip_point_{index}_temp", str(round(celsius * 1000)))
        self._write_temp()

    def _write_temp(self) -> None:
        noise = self._random.gauss(0.0, self.noise_c) if self.noise_c else 0.0
        _write(self.zone_dir / "temp", str(round((self.temperature_c + noise) * 1000)))

    def steady_state_c(self, utilisation: float) -> float:
        return self.ambient_c + self.heat_c * utilisation

    def sustainable_utilisation(self, limit_c: float) -> float:
        """The highest constant utilisation whose steady state stays at or under ``limit_c``."""
        return max(0.0, min(1.0, (limit_c - self.ambient_c) / self.heat_c))

    def step(self, dt: float, utilisation: float) -> float:
        """Advance the model by ``dt`` seconds at ``utilisation`` (exact for constant load)."""
        utilisation = max(0.0, min(1.0, utilisation))
        target = self.steady_state_c(utilisation)
        self.temperature_c = target + (self.temperature_c - target) * math.exp(-dt / self.tau_s)
        self._write_temp()
        return self.temperature_c

    async def run(self, load: Callable[[], float], interval_s: float) -> None:
        """Follow ``load()`` (utilisation since the previous call) until cancelled."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            self.step(now - last, load())
            last = now


def _write(path: Path, text: str) -> None:
    """Replace the file in one step, so a reader never sees a half-written number."""
    write_text_atomic(path, text + "\n")
