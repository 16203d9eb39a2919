"""[governor]: the power and thermal governor.

Every threshold the governor acts on comes from the device profile (zone limits, power budget,
battery spec); this section holds how it reacts: sampling, hysteresis, dwell, controller gains
and what each state does to serving. Defaults suit a passively cooled board whose temperature
settles in tens of seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeagent.sections import require

LowPowerFrom = Literal["warm", "hot", "critical", "never"]


@dataclass(frozen=True)
class GovernorSettings:
    enabled: bool = True
    interval_s: float = 1.0  # sensor sampling period
    hysteresis_c: float = 3.0  # a state is left only this far below the threshold that set it
    min_dwell_s: float = 10.0  # least time in a state before stepping down (no flapping)
    # Closed loop: a PI controller sets the inference duty cycle so the hottest zone settles at
    # hot_c - setpoint_margin_c instead of oscillating around hot_c.
    setpoint_margin_c: float = 1.5
    kp: float = 0.05  # duty per °C of error
    ki: float = 0.01  # duty per °C·s of accumulated error
    min_duty: float = 0.05  # never pace below this (critical sheds instead)
    power_kp: float = 0.05  # duty per W over the profile's power budget
    power_ki: float = 0.02
    # Actions per state.
    warm_max_batch_size: int = 4
    warm_max_concurrency: int = 2
    hot_max_batch_size: int = 1
    hot_max_concurrency: int = 1
    shed_priority_from: int = 3  # in hot: shed priority >= this (1 most urgent; default 2)
    retry_after_s: int = 10  # Retry-After sent with shed requests
    low_power_from: LowPowerFrom = "hot"  # state from which the low-power candidate is preferred
    # Power-save mode (battery low, or Raspberry Pi under-voltage).
    battery_low_percent: float | None = None  # None: the profile's [battery] low_percent
    battery_hysteresis_percent: float = 5.0  # leave power-save only this far above the threshold
    power_save_duty: float = 0.5
    power_save_max_batch_size: int = 4
    # Sensors.
    throttle_command: str = ""  # overrides the profile's, e.g. "/opt/vc/bin/vcgencmd get_throttled"
    pmic_command: str = "vcgencmd pmic_read_adc"
    command_timeout_s: float = 2.0
    # Simulator (tests, demos, benchmark): replaces the profile's zones with one simulated zone.
    simulate: bool = False
    sim_root: Path | None = None  # where the fake sysfs tree is written; default <state>/sim
    sim_ambient_c: float = 40.0
    sim_heat_c: float = 60.0  # °C above ambient at full utilisation (steady state)
    sim_tau_s: float = 10.0  # thermal time constant
    sim_noise_c: float = 0.2
    sim_warm_c: float = 60.0
    sim_hot_c: float = 70.0
    sim_critical_c: float = 80.0

    def validate(self) -> None:
        g = "governor"
        require(self.interval_s >= 0.05, g, "interval_s", "must be at least 0.05")
        require(self.hysteresis_c >= 0, g, "hysteresis_c", "must not be negative")
        require(self.min_dwell_s >= 0, g, "min_dwell_s", "must not be negative")
        require(self.setpoint_margin_c >= 0, g, "setpoint_margin_c", "must not be negative")
        for key in ("kp", "ki", "power_kp", "power_ki"):
            require(getattr(self, key) >= 0, g, key, "must not be negative")
        require(0 < self.min_duty <= 1, g, "min_duty", "must be in (0, 1]")
        require(0 < self.power_save_duty <= 1, g, "power_save_duty", "must be in (0, 1]")
        for key in (
            "warm_max_batch_size",
            "warm_max_concurrency",
            "hot_max_batch_size",
            "hot_max_concurrency",
            "power_save_max_batch_size",
        ):
            require(getattr(self, key) >= 1, g, key, "must be at least 1")
        require(self.shed_priority_from >= 1, g, "shed_priority_from", "must be at least 1")
        require(self.retry_after_s >= 1, g, "retry_after_s", "must be at least 1 second")
        if self.battery_low_percent is not None:
            require(
                0 <= self.battery_low_percent <= 100, g, "battery_low_percent", "must be 0..100"
            )
        require(
            self.battery_hysteresis_percent >= 0,
            g,
            "battery_hysteresis_percent",
            "must not be negative",
        )
        require(self.command_timeout_s > 0, g, "command_timeout_s", "must be positive")
        require(self.sim_tau_s > 0, g, "sim_tau_s", "must be positive")
        require(self.sim_noise_c >= 0, g, "sim_noise_c", "must not be negative")
        require(
            self.sim_warm_c < self.sim_hot_c < self.sim_critical_c,
            g,
            "sim_warm_c",
            "sim_warm_c < sim_hot_c < sim_critical_c must hold",
        )
