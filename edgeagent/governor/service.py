"""The governor: sensors → state policy + duty controller → ServingLimits, once per interval.

The engine reads ``limits()`` before every batch; status, metrics and fleet reports read
``snapshot()``. Sensor reads run in a worker thread so a slow sysfs file or ``vcgencmd`` never
stalls the event loop that serves requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from prometheus_client import CollectorRegistry

from edgeagent.aio import spawn
from edgeagent.engine.busy_counter import LoadSource
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.governor.actions import active_actions, effective_duty, serving_limits
from edgeagent.governor.controller import DutyController
from edgeagent.governor.engine_load import EngineLoad
from edgeagent.governor.metrics import GovernorMetrics
from edgeagent.governor.policy import State, StatePolicy
from edgeagent.governor.sensors import Readings, SensorSet
from edgeagent.governor.settings import GovernorSettings
from edgeagent.governor.simulator import ThermalSimulator, simulated_zone
from edgeagent.hardware.profile import Profile

log = logging.getLogger(__name__)


class GovernorService:
    def __init__(
        self,
        settings: GovernorSettings,
        profile: Profile,
        root: Path,
        metrics_registry: CollectorRegistry,
        *,
        load: LoadSource,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``load`` is the engine's LoadSource (the daemon passes its LoadCounter): required,
        so that a governor wired without it cannot silently see an idle engine."""
        self.settings = settings
        self.profile = profile
        self.clock = clock
        self.simulator: ThermalSimulator | None = None
        self._sim_dir: Path | None = None
        if settings.simulate:
            self.simulator = self._make_simulator()
            self.sensors = SensorSet(self.simulator.root, settings, [self.simulator.limit])
        else:
            self.sensors = SensorSet.from_profile(root, settings, profile, clock)
        now = clock()
        self.policy = StatePolicy(settings.hysteresis_c, settings.min_dwell_s, now)
        self.thermal_loop = DutyController(
            settings.kp, settings.ki, settings.min_duty, settings.predict_periods
        )
        self.power_loop = DutyController(settings.power_kp, settings.power_ki, settings.min_duty)
        self.metrics = GovernorMetrics(metrics_registry)
        self._load = load
        self.engine_load = EngineLoad(load, clock)
        self.utilisation = 0.0
        self.duty = 1.0
        self.readings = Readings()
        self.power_save = False
        self.throttled_seconds = 0.0
        self.transitions = 0
        self._limits = UNTHROTTLED
        self._last_apply: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the event loop) whenever the state or power-save mode changes,
        e.g. to republish the fleet state report at once rather than at the next update."""
        self._listeners.append(callback)

    def _make_simulator(self) -> ThermalSimulator:
        s = self.settings
        root = s.sim_root
        if root is None:  # a private tree, removed again by stop()
            root = self._sim_dir = Path(tempfile.mkdtemp(prefix="edgeagent-thermal-sim-"))
        limit = simulated_zone(s.sim_warm_c, s.sim_hot_c, s.sim_critical_c)
        return ThermalSimulator(
            root,
            ambient_c=s.sim_ambient_c,
            heat_c=s.sim_heat_c,
            tau_s=s.sim_tau_s,
            noise_c=s.sim_noise_c,
            limit=limit,
        )

    # -- the engine's view --------------------------------------------------------------------

    def limits(self) -> ServingLimits:
        """The limits in force now (a cheap attribute read, safe before every batch)."""
        return self._limits

    # -- one control step ---------------------------------------------------------------------

    def apply(
        self,
        readings: Readings,
        now: float,
        utilisation: float | None = None,
    ) -> ServingLimits:
        """Decide from one round of readings; public so tests can drive it with fake clocks.

        ``utilisation`` (the engine's measured busy fraction) is where the loop throttles from.
        """
        if self._last_apply is not None and active_actions(self._limits, self.duty):
            elapsed = max(0.0, now - self._last_apply)
        else:
            elapsed = 0.0
        self._last_apply = now
        self.throttled_seconds += elapsed
        self.readings = readings
        floor, floor_reason = self._firmware_floor(readings)
        before = self.policy.state, self.power_save
        changed = self.policy.update(readings.zones, now, floor, floor_reason)
        if changed:
            self._log_transition(before[0])
        thermal_duty = self.thermal_loop.update(self._thermal_excess(readings), now, utilisation)
        power_duty = self.power_loop.update(self._power_excess(readings), now, utilisation)
        duty = min(thermal_duty, power_duty)
        throttle = readings.throttle
        supply = readings.supply
        self.power_save = bool(
            (supply is not None and supply.low) or (throttle is not None and throttle.under_voltage)
        )
        state = self.policy.state
        self.duty = effective_duty(self.settings, state, duty, self.power_save)
        reason = self.policy.reason
        if self.power_save:
            reason = "; ".join(r for r in (reason, self._power_save_reason()) if r)
        elif not reason and self.duty < 1.0:
            held = self._power_text() if power_duty < thermal_duty else self._hottest_text()
            reason = f"pacing to duty {self.duty:.2f} to hold {held}"
        self._limits = serving_limits(self.settings, state, self.duty, self.power_save, reason)
        actions = active_actions(self._limits, self.duty)
        self.metrics.observe(readings, state, self._limits, self.duty, actions, elapsed)
        if changed or self.power_save != before[1]:
            self._notify()
        return self._limits

    def _notify(self) -> None:
        for callback in self._listeners:
            try:
                callback()
            except Exception:  # a listener's failure must not stop the governor
                log.exception("governor listener %r failed", callback)

    def _log_transition(self, before: State) -> None:
        self.transitions += 1
        self.metrics.transitions.labels(self.policy.state.label).inc()
        level = logging.WARNING if self.policy.state > before else logging.INFO
        log.log(
            level,
            "governor %s → %s (%s)",
            before.label,
            self.policy.state.label,
            self.policy.reason or "cooled down",
        )

    @staticmethod
    def _firmware_floor(readings: Readings) -> tuple[State, str]:
        """Raspberry Pi firmware throttling: it is already at its limit, whatever sysfs says."""
        flags = readings.throttle
        if flags is None:
            return State.NORMAL, ""
        if flags.throttled or flags.soft_temperature_limit:
            return State.HOT, f"firmware throttling (throttled={flags.raw:#x})"
        if flags.frequency_capped:
            return State.WARM, f"firmware capped the Arm frequency (throttled={flags.raw:#x})"
        return State.NORMAL, ""

    def _thermal_excess(self, readings: Readings) -> float | None:
        margin = self.settings.setpoint_margin_c
        excess = [
            z.celsius - (z.limit.hot_c - margin) for z in readings.zones if z.celsius is not None
        ]
        return max(excess) if excess else None

    def _power_excess(self, readings: Readings) -> float | None:
        budget = self.profile.power_budget_w if self.simulator is None else None
        if budget is None or readings.total_power_w is None:
            return None
        return readings.total_power_w - budget

    def _power_save_reason(self) -> str:
        supply, flags = self.readings.supply, self.readings.throttle
        if flags is not None and flags.under_voltage:
            return "power-save: under-voltage"
        percent = supply.percent if supply is not None else None
        return f"power-save: battery {percent:.0f}%" if percent is not None else "power-save"

    def _power_text(self) -> str:
        return f"the power budget {self.profile.power_budget_w:g} W"

    def _hottest_text(self) -> str:
        online = [z for z in self.readings.zones if z.celsius is not None]
        if not online:
            return "the last safe duty (no thermal sensor online)"
        z = max(online, key=lambda z: z.celsius - z.limit.hot_c)  # type: ignore[operator]
        return f"{z.key} under {z.limit.hot_c - self.settings.setpoint_margin_c:.1f} °C"

    # -- life cycle -----------------------------------------------------------------------------

    async def tick(self) -> ServingLimits:
        readings = await asyncio.to_thread(self.sensors.read)
        self.utilisation = self.engine_load.sample()
        return self.apply(readings, self.clock(), self.utilisation)

    async def _step(self) -> None:
        try:
            await self.tick()
        except Exception:  # a governor bug must not stop serving; say so loudly
            log.exception("governor step failed; keeping the previous limits")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_s)
            await self._step()

    async def start(self) -> None:
        if not self.settings.enabled:
            log.info("governor disabled by [governor] enabled = false")
            return
        if self.simulator is not None:
            heat_source = EngineLoad(self._load).sample  # the engine's real busy fraction
            simulation = self.simulator.run(heat_source, self.settings.interval_s / 2)
            self._tasks.append(spawn(simulation, name="thermal-simulator"))
        await self._step()  # limits reflect the sensors before the first request is served
        self._log_sensors()
        self._tasks.append(spawn(self._loop(), name="governor"))

    def _log_sensors(self) -> None:
        """Say once at start what the governor can see, so a blind governor is no surprise."""
        readings = self.readings
        online = [z.key for z in readings.zones if z.celsius is not None]
        online += [key for key, watts in readings.power_w.items() if watts is not None]
        log.info(
            "governor: %s, sensors online: %s",
            self.policy.state.label,
            ", ".join(online) or "none",
        )
        for key, why in readings.errors.items():
            log.info("governor: sensor %s offline: %s", key, why)

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._sim_dir is not None:
            shutil.rmtree(self._sim_dir, ignore_errors=True)
            self._sim_dir = None

    # -- status -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        readings = self.readings
        now = self.clock()
        temperatures = [
            {
                "sensor": z.key,
                "celsius": None if z.celsius is None else round(z.celsius, 2),
                "online": z.celsius is not None,
                "error": readings.errors.get(z.key, ""),
                "warm_c": z.limit.warm_c,
                "hot_c": z.limit.hot_c,
                "critical_c": z.limit.critical_c,
                "trip_points": readings.trip_points.get(z.key, []),
            }
            for z in readings.zones
        ]
        snapshot: dict[str, object] = {
            "enabled": self.settings.enabled,
            "state": self.policy.state.label,
            "since_s": round(now - self.policy.since, 1),
            "reason": self._limits.reason,
            "actions": active_actions(self._limits, self.duty),
            "limits": asdict(self._limits),
            "duty_cycle": round(self.duty, 4),
            "utilisation": round(self.utilisation, 4),
            "power_save": self.power_save,
            "throttled_seconds": round(self.throttled_seconds, 1),
            "transitions": self.transitions,
            "temperatures": temperatures,
            "power": {
                "total_w": readings.total_power_w,
                "budget_w": self.profile.power_budget_w,
                "sensors": readings.power_w,
            },
            "battery": None if readings.supply is None else readings.supply.as_dict(),
            "firmware_throttle": None if readings.throttle is None else readings.throttle.as_dict(),
            "offline": dict(readings.errors),
        }
        if self.simulator is not None:
            snapshot["simulator"] = {
                "root": str(self.simulator.root),
                "temperature_c": round(self.simulator.temperature_c, 2),
                "ambient_c": self.simulator.ambient_c,
                "heat_c": self.simulator.heat_c,
                "tau_s": self.simulator.tau_s,
            }
        return snapshot
