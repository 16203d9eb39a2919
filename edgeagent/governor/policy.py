"""Thermal states with hysteresis and a minimum dwell, so noisy sensors cannot make it flap.

A state is entered as soon as any zone reaches its threshold (safety first) but is left only
when every zone has dropped ``hysteresis_c`` below the threshold that set it AND the state has
lasted ``min_dwell_s``. Readings that wobble around a limit therefore cause one transition, not
one per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from edgeagent.hardware.profile import ThermalLimit


class State(IntEnum):
    NORMAL = 0
    WARM = 1
    HOT = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()


def threshold(limit: ThermalLimit, state: State) -> float:
    """The temperature at which ``state`` begins for this zone."""
    return {
        State.WARM: limit.warm_c,
        State.HOT: limit.hot_c,
        State.CRITICAL: limit.critical_c,
    }[state]


@dataclass(frozen=True)
class ZoneTemperature:
    key: str
    celsius: float | None  # None: offline, ignored by the policy
    limit: ThermalLimit


def level(zone: ZoneTemperature) -> State:
    """The state this zone alone asks for, without hysteresis."""
    if zone.celsius is None:
        return State.NORMAL
    for state in (State.CRITICAL, State.HOT, State.WARM):
        if zone.celsius >= threshold(zone.limit, state):
            return state
    return State.NORMAL


class StatePolicy:
    def __init__(self, hysteresis_c: float, min_dwell_s: float, now: float) -> None:
        self.hysteresis_c = hysteresis_c
        self.min_dwell_s = min_dwell_s
        self.state = State.NORMAL
        self.since = now
        self.reason = ""

    def _target(self, zones: Sequence[ZoneTemperature]) -> State:
        online = [z for z in zones if z.celsius is not None]
        if not online:
            return self.state  # blind: no evidence it cooled, so hold (never read as 0 °C)
        raw = max(level(z) for z in online)
        if raw >= self.state:
            return raw
        target = self.state
        while target > raw and all(
            z.celsius is not None and z.celsius < threshold(z.limit, target) - self.hysteresis_c
            for z in online
        ):
            target = State(target - 1)
        return target

    def update(
        self,
        zones: Sequence[ZoneTemperature],
        now: float,
        floor: State = State.NORMAL,
        floor_reason: str = "",
    ) -> bool:
        """Advance the state from one round of readings; True when it changed.

        ``floor`` is a state other evidence demands regardless of temperatures (e.g. the Pi
        firmware reporting that it throttles).
        """
        target = max(self._target(zones), floor)
        changed = False
        if target > self.state or (target < self.state and now - self.since >= self.min_dwell_s):
            self.state, self.since, changed = target, now, True
        self.reason = self._explain(zones, floor, floor_reason)
        return changed

    def _explain(self, zones: Sequence[ZoneTemperature], floor: State, floor_reason: str) -> str:
        if self.state == State.NORMAL:
            return ""
        if floor >= self.state and floor_reason:
            return f"{self.state.label}: {floor_reason}"
        online = [z for z in zones if z.celsius is not None]
        if not online:
            return f"{self.state.label}: held, no thermal sensor online"
        hottest = max(online, key=lambda z: (level(z), z.celsius or 0.0))
        return f"{self.state.label}: {hottest.key} {hottest.celsius:.1f} °C"
