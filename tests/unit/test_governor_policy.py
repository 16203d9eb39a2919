"""State policy (hysteresis, dwell), the duty controller and the actions each state takes."""

from __future__ import annotations

import random

import pytest

from edgeagent.governor.actions import active_actions, effective_duty, serving_limits
from edgeagent.governor.controller import DutyController
from edgeagent.governor.policy import State, StatePolicy, ZoneTemperature
from edgeagent.governor.settings import GovernorSettings
from edgeagent.sections import ConfigError, load_section
from tests.fixtures.thermal.trees import zone

TJ = zone("tj-thermal", warm=80, hot=90, critical=97)
CPU = zone("cpu-thermal", warm=70, hot=85, critical=95)


def temps(tj: float | None, cpu: float | None = 40.0) -> list[ZoneTemperature]:
    return [ZoneTemperature("zone:tj", tj, TJ), ZoneTemperature("zone:cpu", cpu, CPU)]


def test_escalates_at_once_and_steps_down_only_below_hysteresis_after_dwell() -> None:
    policy = StatePolicy(hysteresis_c=3.0, min_dwell_s=10.0, now=0.0)
    assert policy.update(temps(91.0), 1.0)
    assert policy.state == State.HOT and policy.reason == "hot: zone:tj 91.0 °C"
    # below hot_c but inside the hysteresis band: stays hot however long it lasts
    for t in range(2, 40):
        policy.update(temps(88.0), float(t))
    assert policy.state == State.HOT
    # below hot_c - hysteresis, but the state has not lasted min_dwell_s: stays
    policy = StatePolicy(hysteresis_c=3.0, min_dwell_s=10.0, now=0.0)
    policy.update(temps(91.0), 1.0)
    assert not policy.update(temps(86.0), 5.0)
    assert policy.state == State.HOT
    assert policy.update(temps(86.0), 11.0)
    assert policy.state == State.WARM
    # far below everything: straight down to normal once warm has dwelt
    assert not policy.update(temps(50.0), 12.0)
    assert policy.update(temps(50.0), 21.0)
    assert policy.state == State.NORMAL and policy.reason == ""


def test_noisy_readings_around_a_limit_do_not_flap() -> None:
    rng = random.Random(7)
    policy = StatePolicy(hysteresis_c=3.0, min_dwell_s=5.0, now=0.0)
    states = []
    for step in range(600):  # 10 minutes at 1 Hz, wobbling ±1.5 °C around hot_c
        policy.update(temps(90.0 + rng.uniform(-1.5, 1.5)), float(step))
        states.append(policy.state)
    first_hot = states.index(State.HOT)
    assert first_hot < 5
    assert set(states[first_hot:]) == {State.HOT}  # entered once, never left while wobbling


def test_without_hysteresis_the_same_noise_would_flap() -> None:
    """The control experiment for the test above: proves the noise really crosses the limit."""
    rng = random.Random(7)
    policy = StatePolicy(hysteresis_c=0.0, min_dwell_s=0.0, now=0.0)
    transitions = sum(
        policy.update(temps(90.0 + rng.uniform(-1.5, 1.5)), float(step)) for step in range(600)
    )
    assert transitions > 50


def test_hottest_zone_relative_to_its_own_limits_decides() -> None:
    policy = StatePolicy(3.0, 0.0, 0.0)
    policy.update(temps(75.0, cpu=86.0), 1.0)  # tj merely warm-ish, cpu past its hot_c
    assert policy.state == State.HOT and "zone:cpu" in policy.reason
    policy.update(temps(75.0, cpu=96.0), 2.0)
    assert policy.state == State.CRITICAL


def test_offline_zone_is_ignored_not_read_as_zero() -> None:
    policy = StatePolicy(3.0, 0.0, 0.0)
    policy.update(temps(92.0, cpu=None), 1.0)
    assert policy.state == State.HOT
    # every zone goes offline: no evidence it cooled, so the state holds (not "0 °C")...
    policy.update(temps(None, cpu=None), 20.0)
    assert policy.state == State.HOT and policy.reason == "hot: held, no thermal sensor online"
    # ...and a zone that is offline never blocks the others from stepping down
    policy = StatePolicy(3.0, 0.0, 0.0)
    policy.update(temps(92.0, cpu=40.0), 1.0)
    policy.update(temps(60.0, cpu=None), 2.0)
    assert policy.state == State.NORMAL


def test_floor_from_other_evidence() -> None:
    policy = StatePolicy(3.0, 10.0, 0.0)
    policy.update(temps(50.0), 1.0, floor=State.HOT, floor_reason="firmware throttling")
    assert policy.state == State.HOT and policy.reason == "hot: firmware throttling"
    policy.update(temps(50.0), 5.0)  # flag cleared, but dwell not over
    assert policy.state == State.HOT
    policy.update(temps(50.0), 12.0)
    assert policy.state == State.NORMAL


def test_controller_saturates_then_settles_plant_at_setpoint() -> None:
    """Against the first-order thermal model the PI loop settles at the set-point with no
    steady error and a small overshoot, where bang-bang would oscillate."""
    controller = DutyController(kp=0.05, ki=0.01, min_duty=0.05)
    temperature, ambient, heat, tau, setpoint = 40.0, 40.0, 60.0, 10.0, 68.5
    history = []
    for step in range(300):
        duty = controller.update(temperature - setpoint, float(step))
        target = ambient + heat * duty
        temperature += (target - temperature) * (1 / tau)
        history.append((temperature, duty))
    assert history[0][1] == 1.0  # cold: no pacing at all
    assert max(t for t, _ in history) < setpoint + 1.5
    settled = history[200:]
    assert all(abs(t - setpoint) < 0.2 for t, _ in settled)
    assert sum(d for _, d in settled) / len(settled) == pytest.approx(28.5 / 60, abs=0.01)


def test_controller_holds_when_blind_and_respects_minimum() -> None:
    controller = DutyController(kp=0.05, ki=0.01, min_duty=0.1)
    assert controller.update(50.0, 0.0) == 0.1  # far too hot: clamped at the minimum
    assert controller.update(None, 1.0) == 0.1  # offline: hold, do not guess
    # the clamp did not wind the integral up: the output leaves it as soon as it is cool
    assert controller.update(-5.0, 2.0) > 0.1


def test_actions_per_state() -> None:
    s = GovernorSettings()
    normal = serving_limits(s, State.NORMAL, 1.0, False, "")
    assert active_actions(normal, 1.0) == []
    warm = serving_limits(s, State.WARM, 0.8, False, "warm: x")
    assert warm.max_batch_size == 4 and warm.max_concurrency == 2
    assert warm.duty_cycle == 0.8 and normal.duty_cycle == 1.0  # the gate paces by busy time
    assert active_actions(warm, 0.8) == ["batch_cap", "concurrency_cap", "pacing"]
    hot = serving_limits(s, State.HOT, 1.0, False, "hot: x")
    assert hot.max_batch_size == 1 and hot.shed_priority_from == 3
    assert hot.pause_downloads and hot.prefer_low_power and hot.retry_after_s == 10
    critical = serving_limits(s, State.CRITICAL, 0.05, False, "critical: x")
    assert critical.shed_priority_from == 0  # every request
    assert effective_duty(s, State.CRITICAL, 0.9, False) == s.min_duty


def test_power_save_mode() -> None:
    s = GovernorSettings()
    assert effective_duty(s, State.NORMAL, 1.0, True) == s.power_save_duty
    limits = serving_limits(s, State.NORMAL, 0.5, True, "power-save: battery 12%")
    assert limits.prefer_low_power and limits.pause_downloads
    assert limits.max_batch_size == s.power_save_max_batch_size
    assert limits.shed_priority_from is None


def test_low_power_from_setting() -> None:
    warm = serving_limits(GovernorSettings(low_power_from="warm"), State.WARM, 1.0, False, "")
    assert warm.prefer_low_power
    never = serving_limits(GovernorSettings(low_power_from="never"), State.CRITICAL, 1, False, "")
    assert not never.prefer_low_power


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"interval_s": 0}, r"\[governor\] interval_s: must be at least 0.05"),
        ({"min_duty": 0}, r"\[governor\] min_duty"),
        ({"shed_priority_from": 0}, r"\[governor\] shed_priority_from"),
        ({"battery_low_percent": 120.0}, r"\[governor\] battery_low_percent: must be 0..100"),
        ({"low_power_from": "lukewarm"}, r"\[governor\] low_power_from: must be one of"),
        ({"sim_hot_c": 90.0}, r"\[governor\] sim_warm_c"),
        ({"kp": "fast"}, r"\[governor\] kp: must be a number"),
    ],
)
def test_settings_are_validated(table: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_section(GovernorSettings, table, "governor")


def test_controller_starts_throttling_from_the_measured_utilisation() -> None:
    """Above the set-point a duty above what the engine really uses binds nothing: the loop
    starts from the measured busy fraction instead of winding down from 1.0."""
    controller = DutyController(kp=0.05, ki=0.01, min_duty=0.05)
    assert controller.update(-1.0, 0.0, utilisation=0.4) == 1.0  # below: no cap at all
    assert controller.update(0.5, 1.0, utilisation=0.4) == pytest.approx(0.4)
    slow = DutyController(kp=0.05, ki=0.01, min_duty=0.05)
    slow.update(-1.0, 0.0)
    assert slow.update(0.5, 1.0) > 0.9  # without the measurement it would still be near 1


def test_controller_starts_from_the_measured_utilisation_at_any_crossing() -> None:
    """On the way up the proportional term lowers the duty before the set-point, but not below
    what a demand-limited engine uses: the crossing still starts from the measured value."""
    controller = DutyController(kp=0.05, ki=0.01, min_duty=0.05)
    for step, excess in enumerate((-10.0, -6.0, -3.0, -1.0)):
        controller.update(excess, float(step), utilisation=0.5)
    assert 0.5 < controller.duty < 1.0  # lowered on the way up, still binding nothing
    assert controller.update(0.2, 4.0, utilisation=0.5) == pytest.approx(0.5)
    # still above the set-point: no second snap to a (noisy) measurement, the PI goes on
    assert 0.4 < controller.update(0.3, 5.0, utilisation=0.2) < 0.5


def test_controller_looks_ahead_over_its_real_period() -> None:
    """With ``predict_periods`` the loop acts on where a rising reading will be when its
    decision shows; a loop that ran late looks further ahead; a fall is taken as it is."""

    def duties(predict: float, times: list[float], excesses: list[float]) -> list[float]:
        controller = DutyController(kp=0.05, ki=0.0, min_duty=0.05, predict_periods=predict)
        return [controller.update(e, t) for t, e in zip(times, excesses, strict=True)]

    rising = [-4.0, -3.0, -2.0, -1.0]  # 2 °C/s at a 0.5 s period...
    on_time = [0.0, 0.5, 1.0, 1.5]
    late = [0.0, 1.0, 2.0, 3.0]  # ...and 1 °C/s read by a loop running twice as slow
    gain_on_time = duties(0.0, on_time, rising)[-1] - duties(2.0, on_time, rising)[-1]
    assert gain_on_time > 0  # throttles before the rise arrives
    slow_rise = [-4.0, -3.0, -2.0, -1.0]
    gain_late = duties(0.0, late, slow_rise)[-1] - duties(2.0, late, slow_rise)[-1]
    assert gain_late == pytest.approx(gain_on_time)  # half the rate, twice the look-ahead
    falling = [4.0, 3.0, 2.0, 1.0]
    assert duties(2.0, on_time, falling)[-1] == pytest.approx(duties(0.0, on_time, falling)[-1])
