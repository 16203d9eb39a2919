"""How busy the inference engine really is, from the engine's own load totals.

The engine counts the seconds its runtimes compute and the batches it runs (``LoadSource``).
Their rates give the device's real duty cycle (what heats it; the simulator's input) and the
mean batch time, which turns the governor's duty cycle into the engine's pacing knob: batches
that take t seconds, started t/d apart, keep the device busy a fraction d.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edgeagent.engine.busy_counter import LoadSource


class EngineLoad:
    """Rates of a LoadSource between two samples."""

    def __init__(self, source: LoadSource, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.clock = clock
        self.batch_seconds: float | None = None  # mean batch time, last known
        self._last = self._read()

    def _read(self) -> tuple[float, float, int]:
        return (self.clock(), *self.source.totals())

    def sample(self) -> float:
        """Utilisation (busy seconds per second, clipped to [0, 1]) since the last sample; also
        updates ``batch_seconds`` when batches ran."""
        now = self._read()
        (t0, busy0, batches0), self._last = self._last, now
        busy, batches = now[1] - busy0, now[2] - batches0
        if batches > 0:
            self.batch_seconds = busy / batches
        elapsed = now[0] - t0
        return 0.0 if elapsed <= 0 else max(0.0, min(1.0, busy / elapsed))
