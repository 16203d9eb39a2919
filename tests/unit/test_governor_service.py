"""GovernorService end to end on fake boards: the shipped device profiles read through fake
sysfs trees, one control step at a time on a fake clock, observed through limits(), snapshot()
and the Prometheus registry."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from devtools.waiting import until
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.governor.service import GovernorService
from edgeagent.governor.settings import GovernorSettings
from edgeagent.hardware.profile import Profile, load_profiles
from tests.fixtures.thermal.trees import board, write


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def profile(name: str, **changes: object) -> Profile:
    found = {p.name: p for p in load_profiles()}[name]
    return dataclasses.replace(found, **changes)  # type: ignore[arg-type]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def step(governor: GovernorService, clock: Clock, seconds: float = 1.0) -> None:
    clock.now += seconds
    await governor.tick()


@pytest.fixture
async def started() -> AsyncIterator[Callable[[GovernorService], Awaitable[None]]]:
    """Start a governor for the test and stop it afterwards even when an assertion fails
    (stop() is idempotent, so a test may still stop it itself to check what stopping does)."""
    running: list[GovernorService] = []

    async def start(governor: GovernorService) -> None:
        running.append(governor)
        await governor.start()

    yield start
    for governor in running:
        await governor.stop()


@pytest.fixture
def orin(tmp_path: Path) -> tuple[GovernorService, Path, Clock, CollectorRegistry]:
    root = board("jetson_orin", tmp_path)
    clock = Clock()
    registry = CollectorRegistry()
    settings = GovernorSettings(min_dwell_s=5.0)
    governor = GovernorService(
        settings, profile("jetson-orin"), root, registry, clock=clock, load=LoadCounter()
    )
    return governor, root, clock, registry


async def test_jetson_orin_normal_readings_and_offline_sensors(orin) -> None:  # type: ignore[no-untyped-def]
    governor, _root, clock, registry = orin
    await step(governor, clock)
    snap = governor.snapshot()
    assert snap["state"] == "normal" and snap["actions"] == [] and governor.limits().reason == ""
    temps = {t["sensor"]: t for t in snap["temperatures"]}  # type: ignore[union-attr]
    assert temps["zone:tj-thermal"]["celsius"] == 50.25
    assert temps["zone:gpu-thermal"]["online"] is False
    assert "-256" in temps["zone:gpu-thermal"]["error"]
    assert snap["power"]["total_w"] == pytest.approx(5.072 * 1.336)  # type: ignore[index]
    # rails of other Orin modules are absent on this one: offline, not 0 W
    assert snap["power"]["sensors"]["ina3221:VDD_GPU_SOC"] is None  # type: ignore[index]
    tj = {"sensor": "zone:tj-thermal"}
    assert sample(registry, "edgeagent_governor_temperature_celsius", **tj) == 50.25
    assert sample(registry, "edgeagent_governor_sensor_up", sensor="zone:gpu-thermal") == 0
    assert sample(registry, "edgeagent_governor_state", state="normal") == 1


async def test_heat_drives_states_actions_metrics_and_throttled_time(orin) -> None:  # type: ignore[no-untyped-def]
    governor, root, clock, registry = orin
    changes: list[str] = []
    governor.add_listener(lambda: changes.append(str(governor.snapshot()["state"])))
    tj_temp = "sys/class/thermal/thermal_zone4/temp"
    await step(governor, clock)
    write(root, tj_temp, 91500)
    await step(governor, clock)
    await step(governor, clock)
    assert changes == ["hot"]  # told once, on the change
    limits = governor.limits()
    assert governor.snapshot()["state"] == "hot"
    assert limits.shed_priority_from == 3 and limits.max_batch_size == 1
    assert limits.pause_downloads and limits.prefer_low_power
    assert limits.reason == "hot: zone:tj-thermal 91.5 °C"
    assert sample(registry, "edgeagent_governor_state", state="hot") == 1
    assert sample(registry, "edgeagent_governor_state", state="normal") == 0
    assert sample(registry, "edgeagent_governor_action_active", action="shedding") == 1
    assert sample(registry, "edgeagent_governor_max_batch_size") == 1
    assert sample(registry, "edgeagent_governor_transitions_total", to="hot") == 1
    # 91.5 °C is above the set-point (90 - 1.5): the loop paces below full duty
    assert governor.duty < 1.0
    for _ in range(3):
        await step(governor, clock, 2.0)
    assert governor.snapshot()["throttled_seconds"] == pytest.approx(7.0)
    assert sample(registry, "edgeagent_governor_throttled_seconds_total") == pytest.approx(7.0)
    write(root, tj_temp, 97500)
    await step(governor, clock)
    assert governor.limits().shed_priority_from == 0  # critical sheds everything
    write(root, tj_temp, 60000)
    await step(governor, clock)
    assert governor.snapshot()["state"] == "critical"  # dwell: not yet
    await step(governor, clock, 6.0)
    assert governor.snapshot()["state"] == "normal"
    assert changes == ["hot", "critical", "normal"]
    text = generate_latest(registry).decode()
    assert 'edgeagent_governor_temperature_celsius{sensor="zone:gpu-thermal"} NaN' in text


async def test_power_budget_paces_inference(tmp_path: Path) -> None:
    root = board("jetson_orin", tmp_path)
    clock = Clock()
    over = profile("jetson-orin", power_budget_w=5.0)  # the fixture draws 6.8 W
    governor = GovernorService(
        GovernorSettings(), over, root, CollectorRegistry(), clock=clock, load=LoadCounter()
    )
    duties = []
    for _ in range(5):  # the engine is busy 60 % of the time: the loop throttles from there
        clock.now += 1.0
        governor.apply(governor.sensors.read(), clock.now, utilisation=0.6)
        duties.append(governor.duty)
    assert duties[0] <= 0.6 and duties[-1] < duties[0]
    assert governor.snapshot()["state"] == "normal"
    assert "pacing" in governor.snapshot()["actions"]  # type: ignore[operator]
    assert governor.limits().duty_cycle == pytest.approx(governor.duty, abs=1e-6)
    assert governor.limits().reason.endswith("to hold the power budget 5 W")


async def test_raspberry_pi_firmware_throttling_and_under_voltage(tmp_path: Path) -> None:
    root = board("rpi5", tmp_path)
    clock = Clock()
    settings = GovernorSettings(
        throttle_command=f"{root}/vc/vcgencmd get_throttled",
        pmic_command=f"{root}/vc/vcgencmd pmic_read_adc",
    )
    registry = CollectorRegistry()
    governor = GovernorService(
        settings, profile("raspberry-pi-5"), root, registry, clock=clock, load=LoadCounter()
    )
    await step(governor, clock)
    snap = governor.snapshot()
    assert snap["state"] == "normal" and not snap["power_save"]
    assert snap["power"]["total_w"] > 0  # type: ignore[index]
    write(root, "vc/throttled", "throttled=0x50005")  # under-voltage + throttled, now and since
    await step(governor, clock)
    snap = governor.snapshot()
    assert snap["state"] == "hot"
    assert snap["power_save"] is True
    assert snap["firmware_throttle"]["now"] == ["under_voltage", "throttled"]  # type: ignore[index]
    reason = governor.limits().reason
    assert "firmware throttling (throttled=0x50005)" in reason
    assert "power-save: under-voltage" in reason


async def test_missing_vcgencmd_is_an_offline_sensor_not_a_crash(tmp_path: Path) -> None:
    root = board("rpi5", tmp_path)
    clock = Clock()
    settings = GovernorSettings(throttle_command=f"{root}/nowhere/vcgencmd get_throttled")
    governor = GovernorService(
        settings,
        profile("raspberry-pi-5"),
        root,
        CollectorRegistry(),
        clock=clock,
        load=LoadCounter(),
    )
    await step(governor, clock)
    offline = governor.snapshot()["offline"]
    assert "command not found" in offline["vcgencmd:get_throttled"]  # type: ignore[index]
    assert governor.snapshot()["state"] == "normal"


async def test_battery_low_enters_power_save_and_ac_leaves_it(tmp_path: Path) -> None:
    root = board("intel_laptop", tmp_path)
    clock = Clock()
    registry = CollectorRegistry()
    governor = GovernorService(
        GovernorSettings(), profile("intel-npu"), root, registry, clock=clock, load=LoadCounter()
    )
    await step(governor, clock)
    assert not governor.snapshot()["power_save"]
    assert sample(registry, "edgeagent_governor_battery_ratio") == 0.64
    assert sample(registry, "edgeagent_governor_on_ac_power") == 0
    write(root, "sys/class/power_supply/BAT0/capacity", 12)
    await step(governor, clock)
    limits = governor.limits()
    assert governor.snapshot()["power_save"]
    assert limits.prefer_low_power and limits.pause_downloads
    assert limits.reason == "power-save: battery 12%"
    assert governor.duty == GovernorSettings().power_save_duty
    write(root, "sys/class/power_supply/AC/online", 1)
    await step(governor, clock)
    assert not governor.snapshot()["power_save"] and not governor.limits().prefer_low_power
    # the threshold can be set in [governor] over the profile's
    low = GovernorSettings(battery_low_percent=70.0)
    write(root, "sys/class/power_supply/AC/online", 0)
    governor = GovernorService(
        low, profile("intel-npu"), root, CollectorRegistry(), clock=clock, load=LoadCounter()
    )
    write(root, "sys/class/power_supply/BAT0/capacity", 64)
    await step(governor, clock)
    assert governor.snapshot()["power_save"]


async def test_runs_on_its_own_loop_and_stops_cleanly(tmp_path: Path, started) -> None:
    root = board("jetson_orin", tmp_path)
    settings = GovernorSettings(interval_s=0.05)
    governor = GovernorService(
        settings, profile("jetson-orin"), root, CollectorRegistry(), load=LoadCounter()
    )
    await started(governor)
    assert governor.snapshot()["state"] == "normal"  # the first reading happens in start()
    write(root, "sys/class/thermal/thermal_zone4/temp", 92000)
    await until(lambda: governor.limits().shed_priority_from is not None)
    assert governor.snapshot()["state"] == "hot"
    await governor.stop()
    assert all(t.done() for t in asyncio.all_tasks() if t is not asyncio.current_task())


async def test_disabled_governor_never_throttles(tmp_path: Path, started) -> None:
    root = board("jetson_orin", tmp_path)
    write(root, "sys/class/thermal/thermal_zone4/temp", 99000)
    governor = GovernorService(
        GovernorSettings(enabled=False),
        profile("jetson-orin"),
        root,
        CollectorRegistry(),
        load=LoadCounter(),
    )
    await started(governor)
    assert governor.limits().shed_priority_from is None
    assert governor.snapshot()["enabled"] is False


async def test_simulate_mode_writes_and_removes_its_own_tree(tmp_path: Path, started) -> None:
    settings = GovernorSettings(simulate=True, interval_s=0.05)
    governor = GovernorService(
        settings, profile("generic-x86_64"), Path("/"), CollectorRegistry(), load=LoadCounter()
    )
    assert governor.simulator is not None
    sim_root = governor.simulator.root
    await started(governor)
    snap = governor.snapshot()
    assert [t["sensor"] for t in snap["temperatures"]] == ["zone:sim-thermal"]  # type: ignore[union-attr]
    assert snap["simulator"]["ambient_c"] == 40.0  # type: ignore[index]
    await governor.stop()
    assert not sim_root.exists()


async def test_a_failing_step_keeps_the_last_limits_and_the_loop_alive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, started
) -> None:
    root = board("jetson_orin", tmp_path)
    write(root, "sys/class/thermal/thermal_zone4/temp", 92000)
    settings = GovernorSettings(interval_s=0.05)
    governor = GovernorService(
        settings, profile("jetson-orin"), root, CollectorRegistry(), load=LoadCounter()
    )
    await started(governor)
    hot = governor.limits()
    assert hot.shed_priority_from is not None
    real_read, calls = governor.sensors.read, []

    def broken_read():  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("sensor driver bug")
        return real_read()

    governor.sensors.read = broken_read  # type: ignore[method-assign]
    write(root, "sys/class/thermal/thermal_zone4/temp", 40000)
    await until(lambda: len(calls) > 3)
    await governor.stop()
    assert "governor step failed; keeping the previous limits" in caplog.text
    assert len(calls) > 3  # the loop went on after the failures


async def test_state_changes_republish_the_fleet_state_report(orin) -> None:  # type: ignore[no-untyped-def]
    """What the daemon wires: the MQTT state report carries the governor and is republished
    when the state changes, not only when an update happens."""
    from edgeagent.updates.report import UpdateReporter

    governor, root, clock, _registry = orin
    reporter = UpdateReporter("dev-1", "lab", sources={"governor": governor.snapshot})
    published: list[dict] = []
    reporter.connect(published.append, lambda event: None)
    governor.add_listener(reporter.refresh)
    await step(governor, clock)
    before = len(published)  # connecting published the first report
    await step(governor, clock)
    assert len(published) == before  # nothing changed: nothing republished
    write(root, "sys/class/thermal/thermal_zone4/temp", 91000)
    await step(governor, clock)
    assert published[-1]["governor"]["state"] == "hot"
    assert "shedding" in published[-1]["governor"]["actions"]
