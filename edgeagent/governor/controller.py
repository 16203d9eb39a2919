"""The closed loop: a PI controller that sets the inference duty cycle from the headroom.

Heat follows utilisation with a lag (first-order: the chip settles towards ambient + k·duty),
so switching inference fully on and off at a limit (bang-bang) makes the temperature saw-tooth
around it and wastes throughput. A PI controller instead finds the duty cycle whose steady
state sits just under the limit. Anti-windup by back-calculation: while the output is clamped,
the integral is re-seeded so that the output leaves the clamp as soon as the error asks for
it — without that the controller would react only after overshooting.
"""

from __future__ import annotations


class DutyController:
    """Keeps a measured value (°C, W) at or below a set-point by adjusting a duty in [min, 1]."""

    def __init__(self, kp: float, ki: float, min_duty: float) -> None:
        self.kp = kp
        self.ki = ki
        self.min_duty = min_duty
        self.duty = 1.0
        self._integral = 1.0
        self._last: float | None = None

    def update(self, excess: float | None, now: float, utilisation: float | None = None) -> float:
        """One step. ``excess`` = measured − set-point (positive: too hot); None when the
        sensors are offline, which holds the last duty rather than guessing.

        ``utilisation`` is the busy fraction actually measured. When the loop first has to
        throttle (it was at full duty and the set-point is crossed) a duty above that binds
        nothing, so it starts from what is really used instead of spending seconds winding
        down from 1.0 while the chip keeps heating. Only then: snapping to a noisy measurement
        at every step would ratchet the duty down below what the limit allows.
        """
        if excess is None:
            self._last = now
            return self.duty
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        error = -excess
        integral = self._integral + self.ki * error * dt
        duty = self.kp * error + integral
        if duty > 1.0:
            duty, integral = 1.0, 1.0 - self.kp * error
        elif duty < self.min_duty:
            duty, integral = self.min_duty, self.min_duty - self.kp * error
        engaging = self.duty >= 1.0 and error < 0
        if engaging and utilisation is not None and duty > max(utilisation, self.min_duty):
            duty = max(utilisation, self.min_duty)
            integral = duty - self.kp * error
        self._integral = integral
        self.duty = duty
        return duty
