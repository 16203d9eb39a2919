"""The fleet simulator end to end, at test size: devices running the agent's real update
client in two worker processes, the ``hub server`` process signing each stage, artifacts from
``hub serve`` — and the same over two Mosquittos joined by a bridge. Correctness only (every
device counted, installed, answered; the failing release stopped in stage 1); the figures
belong to ``scripts/bench_fleet.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.fleet_scenario import ScenarioOptions, run_scenario

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]


def _check(result: dict, devices: int) -> None:
    assert result["sync"]["synced"], result["sync"]
    assert result["sync"]["devices_counted"] == devices
    fanout = result["fanout"]
    assert fanout["results"] == {"succeeded": devices}, fanout
    assert fanout["serving"] == {"1.0.0": devices}
    assert fanout["hub_devices_on_new_version"] == devices

    rollout = result["rollout"]
    assert rollout["state"] == "succeeded", rollout
    assert rollout["totals"]["succeeded"] == devices
    assert rollout["device_results"] == {"succeeded": devices}
    assert rollout["serving"] == {"2.0.0": devices}
    # every device's row says what it was sent; one signed envelope per stage batch
    assert rollout["sent_with_envelope_record"] == devices
    assert rollout["distinct_envelopes"] == len(rollout["stages"])

    abort = result["abort"]
    assert (abort["state"], abort["stage"]) == ("aborted", 1), abort
    first = abort["stages"][0]
    assert abort["devices_reached"] == first["devices"] == first["failed"]
    assert abort["totals"]["not_sent"] == devices - first["devices"]  # later stages: nothing
    assert abort["device_results"] == {"failed": first["devices"]}  # health check, rolled back
    assert abort["serving"] == {"2.0.0": devices}


async def test_simulated_fleet_installs_rolls_out_and_aborts(tmp_path: Path) -> None:
    options = ScenarioOptions(devices=30, workers=2, wait_s=120, query_rounds=2)
    result = await run_scenario(options, tmp_path)
    assert result["connect"]["worker_processes"] == 2
    _check(result, 30)


async def test_releases_and_reports_cross_a_bridge_between_two_brokers(tmp_path: Path) -> None:
    """Devices on broker B, the hub server on broker A: the retained state, the group release
    published on A, the server's per-device stage envelopes and every answer cross the
    bridge."""
    options = ScenarioOptions(devices=8, workers=1, bridge=True, wait_s=120, query_rounds=1)
    result = await run_scenario(options, tmp_path)
    assert result["brokers"] == "two Mosquittos joined by a bridge"
    _check(result, 8)
