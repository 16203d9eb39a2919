"""The closed loop: a PI controller that sets the inference duty cycle from the headroom.

Heat follows utilisation with a lag (first-order: the chip settles towards ambient + k·duty),
so switching inference fully on and off at a limit (bang-bang) makes the temperature saw-tooth
around it and wastes throughput. A PI controller instead finds the duty cycle whose steady
state sits just under the limit. Anti-windup by back-calculation: while the output is clamped,
the integral is re-seeded so that the output leaves the clamp as soon as the error asks for
it — without that the controller would react only after overshooting.

A duty decided now shows in the readings only after the loop's next period or two, and a loop
that runs late on a busy machine sees the chip later still. So the thermal loop acts on the
temperature it expects ``predict_periods`` of its real (measured, not nominal) periods ahead,
from the smoothed rate of rise: the later the loop, the further ahead it looks. Only a rise is
extrapolated; a falling reading is taken as it is, so the loop never relaxes on a forecast.
"""

from __future__ import annotations


class DutyController:
    """Keeps a measured value (°C, W) at or below a set-point by adjusting a duty in [min, 1]."""

    RISE_SMOOTHING = 0.5  # weight of the newest rate in the smoothed rate of rise

    def __init__(self, kp: float, ki: float, min_duty: float, predict_periods: float = 0.0) -> None:
        self.kp = kp
        self.ki = ki
        self.min_duty = min_duty
        self.predict_periods = predict_periods
        self.duty = 1.0
        self._integral = 1.0
        self._last: float | None = None
        self._excess: float | None = None  # the last acted-on excess, to see a crossing
        self._measured: tuple[float, float] | None = None  # (time, excess) last measured
        self._rise = 0.0  # smoothed rate of rise of the excess, per second

    def _predicted(self, excess: float, now: float) -> float:
        """``excess`` as expected ``predict_periods`` real periods from now."""
        last, self._measured = self._measured, (now, excess)
        if last is None or now <= last[0] or not self.predict_periods:
            return excess
        period = now - last[0]
        rate = (excess - last[1]) / period
        self._rise += self.RISE_SMOOTHING * (rate - self._rise)
        return excess + max(0.0, self._rise) * period * self.predict_periods

    def update(self, excess: float | None, now: float, utilisation: float | None = None) -> float:
        """One step. ``excess`` = measured − set-point (positive: too hot); None when the
        sensors are offline, which holds the last duty rather than guessing.

        ``utilisation`` is the busy fraction actually measured. When the measured value
        crosses the set-point from below, a duty above that binds nothing (the proportional
        term lowers the duty on the way up, but not below what a demand-limited engine uses),
        so the loop starts from what is really used instead of spending seconds winding down
        while the chip keeps heating — the busier the machine, the later a non-binding duty
        would bite. Only at the crossing: snapping to a noisy measurement at every step would
        ratchet the duty down below what the limit allows.
        """
        if excess is None:
            self._last = now
            self._measured = None  # a gap: the rate across it would mean nothing
            return self.duty
        excess = self._predicted(excess, now)
        crossing = excess > 0 and (self._excess is None or self._excess <= 0)
        self._excess = excess
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        error = -excess
        integral = self._integral + self.ki * error * dt
        duty = self.kp * error + integral
        if duty > 1.0:
            duty, integral = 1.0, 1.0 - self.kp * error
        elif duty < self.min_duty:
            duty, integral = self.min_duty, self.min_duty - self.kp * error
        if crossing and utilisation is not None and duty > max(utilisation, self.min_duty):
            duty = max(utilisation, self.min_duty)
            integral = duty - self.kp * error
        self._integral = integral
        self.duty = duty
        return duty
