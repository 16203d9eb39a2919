"""The governor inside the real daemon: a fake Jetson Orin's sysfs heats up and the daemon's
HTTP API sheds, caps and reports it; the config keys reach the governor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from tests.fixtures.thermal.trees import board, write
from tests.support.helpers import write_tiny_package

TJ = "sys/class/thermal/thermal_zone4/temp"


@pytest.fixture
async def orin_daemon(tmp_path: Path) -> AsyncIterator[tuple[Daemon, Path]]:
    root = board("jetson_orin", tmp_path)
    write_tiny_package(tmp_path / "models" / "tiny")
    config = parse_config(
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
        f"[hardware]\nroot = '{root}'\nprofile = 'jetson-orin'\n"
        "[governor]\ninterval_s = 0.05\nmin_dwell_s = 0.3\nretry_after_s = 7\n"
    )
    daemon = Daemon(config)
    await daemon.start()
    try:
        yield daemon, root
    finally:
        await daemon.stop()


async def governor_state(http: aiohttp.ClientSession, want: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        async with http.get("/v1/status") as response:
            status = await response.json()
        if status["governor"]["state"] == want or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.05)


def body(priority: int) -> dict:
    x = np.zeros((1, 3, 8, 8), np.float32)
    inputs = [
        {"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": x.ravel().tolist()}
    ]
    return {"inputs": inputs, "parameters": {"priority": priority}}


async def test_daemon_governs_from_the_profiles_sensors(orin_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon, root = orin_daemon
    connector = aiohttp.UnixConnector(path=str(daemon.config.server.unix_socket))
    async with aiohttp.ClientSession(connector=connector, base_url="http://agent") as http:
        status = await governor_state(http, "normal")
        assert status["profile"]["profile"] == "jetson-orin"
        governor = status["governor"]
        assert governor["state"] == "normal"
        sensors = {t["sensor"]: t for t in governor["temperatures"]}
        assert sensors["zone:tj-thermal"]["hot_c"] == 90.0  # the profile's limits
        assert sensors["zone:gpu-thermal"]["online"] is False
        assert governor["power"]["total_w"] > 6

        write(root, TJ, 93000)
        status = await governor_state(http, "hot")
        assert status["governor"]["state"] == "hot"
        async with http.post("/v2/models/tiny/infer", json=body(priority=5)) as response:
            assert response.status == 503 and response.headers["Retry-After"] == "7"
        async with http.post("/v2/models/tiny/infer", json=body(priority=1)) as response:
            assert response.status == 200
        async with http.get("/metrics") as response:
            text = await response.text()
        assert 'edgeagent_governor_state{state="hot"} 1.0' in text
        assert 'edgeagent_inference_errors_total{kind="throttled",model="tiny"} 1.0' in text

        write(root, TJ, 50000)
        status = await governor_state(http, "normal")
        assert status["governor"]["state"] == "normal"
        assert status["governor"]["transitions"] == 2
