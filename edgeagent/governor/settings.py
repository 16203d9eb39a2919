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

from edgeagent.sections import require, setting

LowPowerFrom = Literal["warm", "hot", "critical", "never"]


@dataclass(frozen=True)
class GovernorSettings:
    enabled: bool = setting(True, "run the thermal and power governor")
    interval_s: float = setting(1.0, "sensor sampling period", "s")
    hysteresis_c: float = setting(
        3.0, "a state is left only this far below the threshold that set it", "°C"
    )
    min_dwell_s: float = setting(
        10.0, "least time in a state before stepping down (no flapping)", "s"
    )
    setpoint_margin_c: float = setting(
        1.5, "the PI controller holds the hottest zone at hot_c minus this (no oscillation)", "°C"
    )
    kp: float = setting(0.05, "proportional gain: duty per °C of error", "1/°C")
    ki: float = setting(0.01, "integral gain: duty per °C·s of accumulated error", "1/(°C·s)")
    predict_periods: float = setting(
        2.0,
        "the thermal loop acts on the temperature expected this many of its real periods ahead "
        "(a rise only; 0 = on the reading)",
        "periods",
    )
    min_duty: float = setting(
        0.05, "never pace below this duty cycle (critical sheds instead)", "ratio"
    )
    power_kp: float = setting(
        0.05, "proportional gain: duty per W over the profile's power budget", "1/W"
    )
    power_ki: float = setting(0.02, "integral gain: duty per W·s over the power budget", "1/(W·s)")
    # Actions per state.
    warm_max_batch_size: int = setting(4, "largest batch while warm")
    warm_max_concurrency: int = setting(2, "batches running at once while warm")
    hot_max_batch_size: int = setting(1, "largest batch while hot")
    hot_max_concurrency: int = setting(1, "batches running at once while hot")
    shed_priority_from: int = setting(3, "in hot: shed priority >= this (1 most urgent; default 2)")
    retry_after_s: int = setting(10, "Retry-After sent with shed requests", "s")
    low_power_from: LowPowerFrom = setting(
        "hot", "state from which the low-power candidate is preferred"
    )
    # Power-save mode (battery low, or Raspberry Pi under-voltage).
    battery_low_percent: float | None = setting(
        None,
        "battery level that starts power-save; unset = the profile's [battery] low_percent",
        "%",
    )
    battery_hysteresis_percent: float = setting(
        5.0, "leave power-save only this far above the threshold", "%"
    )
    power_save_duty: float = setting(
        0.5, "duty cycle in power-save (battery low, Raspberry Pi under-voltage)", "ratio"
    )
    power_save_max_batch_size: int = setting(4, "largest batch in power-save")
    # Sensors.
    throttle_command: str = setting(
        "", 'throttle sensor command; overrides the profile\'s, e.g. "vcgencmd get_throttled"'
    )
    pmic_command: str = setting("vcgencmd pmic_read_adc", "Raspberry Pi 5 power sensor command")
    command_timeout_s: float = setting(2.0, "longest run of a sensor command", "s")
    # Simulator (tests, demos, benchmark).
    simulate: bool = setting(
        False, "replace the profile's zones with one simulated zone (tests, demos, benchmarks)"
    )
    sim_root: Path | None = setting(
        None, "simulator: where the fake sysfs tree is written; default <state_dir>/sim"
    )
    sim_ambient_c: float = setting(40.0, "simulator: ambient temperature", "°C")
    sim_heat_c: float = setting(
        60.0, "simulator: rise above ambient at full utilisation (steady state)", "°C"
    )
    sim_tau_s: float = setting(10.0, "simulator: thermal time constant", "s")
    sim_noise_c: float = setting(0.2, "simulator: sensor noise", "°C")
    sim_warm_c: float = setting(60.0, "simulator: the zone's warm limit", "°C")
    sim_hot_c: float = setting(70.0, "simulator: the zone's hot limit", "°C")
    sim_critical_c: float = setting(80.0, "simulator: the zone's critical limit", "°C")

    def validate(self) -> None:
        g = "governor"
        require(self.interval_s >= 0.05, g, "interval_s", "must be at least 0.05")
        require(self.hysteresis_c >= 0, g, "hysteresis_c", "must not be negative")
        require(self.min_dwell_s >= 0, g, "min_dwell_s", "must not be negative")
        require(self.setpoint_margin_c >= 0, g, "setpoint_margin_c", "must not be negative")
        for key in ("kp", "ki", "predict_periods", "power_kp", "power_ki"):
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
