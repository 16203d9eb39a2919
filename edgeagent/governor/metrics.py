"""The governor's Prometheus metrics, registered on the daemon's shared registry.

Named after Prometheus' conventions: base units (celsius, watts, seconds), ratios 0–1 (battery
charge, duty cycle), the state as one gauge per ``state`` label (1 for the one in force).
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge

from edgeagent.engine.limits import ServingLimits
from edgeagent.governor.actions import ACTIONS
from edgeagent.governor.policy import State
from edgeagent.governor.sensors import Readings


class GovernorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        self.temperature = gauge(
            "edgeagent_governor_temperature_celsius",
            "Temperature per sensor (NaN while offline)",
            ("sensor",),
        )
        self.sensor_up = gauge(
            "edgeagent_governor_sensor_up", "1 when the sensor answered its last read", ("sensor",)
        )
        self.power = gauge(
            "edgeagent_governor_power_watts", "Power per sensor (NaN while offline)", ("sensor",)
        )
        self.board_power = gauge(
            "edgeagent_governor_board_power_watts", "Whole-board power (NaN when unknown)"
        )
        self.battery = gauge(
            "edgeagent_governor_battery_ratio", "Battery charge, 0 to 1 (NaN when unknown)"
        )
        self.on_ac = gauge("edgeagent_governor_on_ac_power", "1 on mains, 0 on battery")
        self.state = gauge(
            "edgeagent_governor_state",
            "1 for the thermal state in force, 0 for the others",
            ("state",),
        )
        self.action = gauge(
            "edgeagent_governor_action_active", "1 while the action is in force", ("action",)
        )
        self.duty = gauge(
            "edgeagent_governor_duty_cycle", "Share of time inference may keep the device busy"
        )
        self.batch_cap = gauge(
            "edgeagent_governor_max_batch_size", "Batch size cap in force (0 = none)"
        )
        self.throttled = Counter(
            "edgeagent_governor_throttled_seconds",
            "Time spent with any throttling action in force",
            registry=registry,
        )
        self.transitions = Counter(
            "edgeagent_governor_transitions",
            "State changes, by the state entered",
            ("to",),
            registry=registry,
        )
        for action in ACTIONS:
            self.action.labels(action).set(0)
        self.duty.set(1.0)

    def observe(
        self,
        readings: Readings,
        state: State,
        limits: ServingLimits,
        duty: float,
        actions: list[str],
        throttled_s: float,
    ) -> None:
        for zone in readings.zones:
            celsius = zone.celsius
            self.temperature.labels(zone.key).set(math.nan if celsius is None else celsius)
            self.sensor_up.labels(zone.key).set(0 if celsius is None else 1)
        for key, watts in readings.power_w.items():
            self.power.labels(key).set(math.nan if watts is None else watts)
            self.sensor_up.labels(key).set(0 if watts is None else 1)
        total = readings.total_power_w
        self.board_power.set(math.nan if total is None else total)
        supply = readings.supply
        if supply is not None:
            self.battery.set(math.nan if supply.percent is None else supply.percent / 100)
            self.on_ac.set(math.nan if supply.on_ac is None else float(supply.on_ac))
        for each in State:
            self.state.labels(each.label).set(1 if each is state else 0)
        for action in ACTIONS:
            self.action.labels(action).set(1 if action in actions else 0)
        self.duty.set(duty)
        self.batch_cap.set(limits.max_batch_size or 0)
        if throttled_s > 0:
            self.throttled.inc(throttled_s)
