"""Raspberry Pi firmware throttling, from ``vcgencmd get_throttled``.

The Pi firmware caps the Arm clock on its own (progressively from 80 °C, and on under-voltage);
sysfs shows none of it, so the governor must ask the firmware.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgeagent.governor.command import run_command
from edgeagent.governor.sysfs import SensorOffline

_THROTTLED = re.compile(r"throttled=(0x[0-9a-fA-F]+|\d+)")

BITS = {
    0: "under_voltage",
    1: "arm_frequency_capped",
    2: "throttled",
    3: "soft_temperature_limit",
}
OCCURRED_SHIFT = 16  # bits 16..19: the same conditions, "has occurred since boot"


@dataclass(frozen=True)
class ThrottleFlags:
    raw: int

    def _bit(self, bit: int) -> bool:
        return bool(self.raw >> bit & 1)

    @property
    def under_voltage(self) -> bool:
        return self._bit(0)

    @property
    def frequency_capped(self) -> bool:
        return self._bit(1)

    @property
    def throttled(self) -> bool:
        return self._bit(2)

    @property
    def soft_temperature_limit(self) -> bool:
        return self._bit(3)

    def as_dict(self) -> dict[str, object]:
        return {
            "raw": f"0x{self.raw:x}",
            "now": [name for bit, name in BITS.items() if self._bit(bit)],
            "occurred": [name for bit, name in BITS.items() if self._bit(bit + OCCURRED_SHIFT)],
        }


def parse_throttled(text: str) -> ThrottleFlags:
    """``throttled=0x50005`` → flags; SensorOffline when the output has no such field."""
    match = _THROTTLED.search(text)
    if not match:
        raise SensorOffline(f"unexpected get_throttled output: {text.strip()[:60]!r}")
    return ThrottleFlags(int(match.group(1), 0))


class PiThrottle:
    def __init__(self, command: str, timeout_s: float) -> None:
        self.command = command
        self.timeout_s = timeout_s

    def read(self) -> ThrottleFlags:
        return parse_throttled(run_command(self.command, self.timeout_s))
