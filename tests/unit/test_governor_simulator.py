"""The thermal simulator's sysfs tree and model, and the engine-load probe that drives it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.governor.engine_load import EngineLoad
from edgeagent.governor.simulator import ZONE_TYPE, ThermalSimulator
from edgeagent.governor.thermal import ThermalZone


def test_tree_reads_like_a_kernel_thermal_zone(tmp_path: Path) -> None:
    sim = ThermalSimulator(tmp_path, ambient_c=35.0)
    zone = ThermalZone(tmp_path, ZONE_TYPE)
    assert zone.read() == 35.0
    assert (sim.zone_dir / "temp").read_text() == "35000\n"  # m°C, like the kernel
    assert zone.trip_points() == [
        {"type": "passive", "celsius": 70.0},
        {"type": "critical", "celsius": 80.0},
    ]


def test_first_order_model_is_exact_for_constant_load(tmp_path: Path) -> None:
    sim = ThermalSimulator(tmp_path, ambient_c=40.0, heat_c=60.0, tau_s=10.0)
    for _ in range(10):
        sim.step(1.0, 1.0)
    expected = 100.0 + (40.0 - 100.0) * math.exp(-1.0)  # one time constant at full load
    assert sim.temperature_c == pytest.approx(expected)
    assert ThermalZone(tmp_path, ZONE_TYPE).read() == pytest.approx(expected, abs=1e-3)
    for _ in range(200):
        sim.step(1.0, 0.0)  # idle: back to ambient
    assert sim.temperature_c == pytest.approx(40.0, abs=1e-6)
    assert sim.sustainable_utilisation(70.0) == 0.5
    assert sim.steady_state_c(0.5) == 70.0


def test_noise_is_on_the_reading_not_the_model(tmp_path: Path) -> None:
    sim = ThermalSimulator(tmp_path, noise_c=0.5, seed=3)
    zone = ThermalZone(tmp_path, ZONE_TYPE)
    readings = []
    for _ in range(50):
        sim.step(1.0, 0.0)
        readings.append(zone.read())
    assert sim.temperature_c == 40.0
    assert len(set(readings)) > 10 and abs(sum(readings) / len(readings) - 40.0) < 0.3


def test_engine_load_from_the_engines_counters() -> None:
    counter = LoadCounter()
    now = [0.0]
    load = EngineLoad(counter, clock=lambda: now[0])
    assert load.sample() == 0.0 and load.batch_seconds is None
    # two models' batchers: 0.3 s + 0.2 s busy in 4 batches over 1 s
    for seconds in (0.1, 0.2, 0.1, 0.1):
        counter.record_batch(seconds)
    now[0] = 1.0
    assert load.sample() == pytest.approx(0.5)
    assert load.batch_seconds == pytest.approx(0.125)
    now[0] = 2.0
    assert load.sample() == 0.0  # idle second: utilisation 0, batch time remembered
    assert load.batch_seconds == pytest.approx(0.125)
