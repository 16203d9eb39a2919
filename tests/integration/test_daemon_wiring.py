"""The daemon in-process: its parts wired together, seen through the HTTP API it serves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from devtools.waiting import until
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.engine.limits import ServingLimits
from edgeagent.fleet.messages import Traffic
from edgeagent.updates.report import UpdateReporter
from tests.support.helpers import write_tiny_package


def infer_body(x: np.ndarray, **parameters) -> dict:
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return body


@pytest.fixture
async def daemon(tmp_path: Path):
    write_tiny_package(tmp_path / "models" / "tiny", seed=1)
    config = parse_config(
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\nmax_queue = 500\n"
    )
    daemon = Daemon(config)
    await daemon.start()
    yield daemon
    await daemon.stop()


@pytest.fixture
async def client(daemon):
    connector = aiohttp.UnixConnector(path=str(daemon.config.server.unix_socket))
    async with aiohttp.ClientSession(connector=connector, base_url="http://agent") as session:
        yield session


async def test_status_merges_every_provider_and_metrics_show_the_engine(daemon, client):
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    async with client.post("/v2/models/tiny/infer", json=infer_body(x)) as response:
        assert response.status == 200
    async with client.get("/v1/status") as response:
        status = await response.json()
    assert {"agent", "profile", "models"} <= set(status)
    assert status["models"]["tiny"]["state"] == "READY"
    assert status["profile"]["profile"].startswith("generic")
    assert status["agent"]["listening"] == [str(daemon.config.server.unix_socket)]
    async with client.get("/metrics") as response:
        text = await response.text()
    for metric in (
        'edgeagent_inference_requests_total{backend="onnxruntime:',
        'edgeagent_batch_size_bucket{backend="onnxruntime:',
        "edgeagent_inference_latency_seconds_bucket",
        'edgeagent_queue_depth{model="tiny"} 0.0',
        "edgeagent_inference_busy_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert metric in text, metric


async def test_governor_limits_reach_the_engine(daemon, client):
    """The limits the governor holds reach the engine: low priority is shed with Retry-After."""
    daemon.governor._limits = ServingLimits(
        shed_priority_from=2, retry_after_s=9, reason="hot: test zone 95 °C"
    )
    x = np.zeros((1, 3, 8, 8), np.float32)
    async with client.post("/v2/models/tiny/infer", json=infer_body(x)) as response:
        assert response.status == 503 and response.headers["Retry-After"] == "9"
        assert "hot: test zone 95 °C" in (await response.json())["error"]
    async with client.post("/v2/models/tiny/infer", json=infer_body(x, priority=1)) as response:
        assert response.status == 200
    async with client.get("/metrics") as response:
        assert 'edgeagent_inference_errors_total{kind="throttled",model="tiny"} 1.0' in (
            await response.text()
        )


async def test_status_and_the_state_report_count_what_the_model_served(daemon, client):
    """Answers and failures (here: shed by the governor) reach /v1/status and, through the
    daemon's own status providers, the traffic of the state report the hub charts."""
    x = np.zeros((1, 3, 8, 8), np.float32)
    for _ in range(3):
        async with client.post("/v2/models/tiny/infer", json=infer_body(x)) as response:
            assert response.status == 200
    daemon.governor._limits = ServingLimits(shed_priority_from=2, retry_after_s=1, reason="hot")
    async with client.post("/v2/models/tiny/infer", json=infer_body(x)) as response:
        assert response.status == 503
    async with client.get("/v1/status") as response:
        tiny = (await response.json())["models"]["tiny"]
    traffic = tiny["versions"][tiny["active_version"]]["traffic"]
    assert (traffic["requests"], traffic["errors"]) == (4, 1)
    assert 0 < traffic["p50_ms"] <= traffic["p95_ms"]
    report = UpdateReporter("d", "lab", sources=daemon.status_providers).report()
    assert report.models["tiny"].traffic == Traffic(**traffic)


async def test_hot_swap_over_http_fails_no_request(daemon, client, tmp_path: Path):
    v2 = write_tiny_package(tmp_path / "v2" / "tiny", version="2", seed=2)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(6)]
    stop = asyncio.Event()
    seen: list[tuple[int, str]] = []

    async def hammer(x: np.ndarray) -> None:
        while not stop.is_set():
            async with client.post("/v2/models/tiny/infer", json=infer_body(x)) as response:
                body = await response.json()
                seen.append((response.status, body.get("model_version", body.get("error"))))

    clients = [asyncio.create_task(hammer(x)) for x in inputs]
    await until(lambda: len(seen) >= len(inputs))  # version 1 is answering
    await daemon.registry.activate(v2)
    await until(lambda: [version for _, version in seen].count("2") >= len(inputs))
    stop.set()
    await asyncio.gather(*clients)
    assert {status for status, _ in seen} == {200}, [s for s in seen if s[0] != 200][:3]
    versions = [version for _, version in seen]
    assert versions[0] == "1" and versions[-1] == "2"
    async with client.post("/v2/repository/index") as response:
        assert [(m["name"], m["version"]) for m in await response.json()] == [("tiny", "2")]


async def test_governor_reads_the_load_the_engine_counts(daemon, client):
    x = np.ones((1, 3, 8, 8), np.float32)
    async with client.post("/v2/models/tiny/infer", json=infer_body(x)) as response:
        assert response.status == 200
    busy, batches = daemon.engine_load.totals()
    assert batches >= 1 and busy > 0  # the warm-up runs outside the batcher: not counted
    await daemon.governor.tick()
    assert daemon.governor.engine_load.batch_seconds is not None


async def test_a_fresh_start_serves_before_its_plan_is_measured_then_swaps_it_in(daemon, client):
    """Nothing cached in a fresh state: the daemon was ready with the model on the probe's
    session (the plan pending) or, if the search already ended, on the searched plan; once
    the search settles the same version runs on its measured plan and answers."""
    async with client.get("/v1/status") as response:
        first = (await response.json())["models"]["tiny"]["versions"]["1"]["plan"]
    assert first["source"] in ("pending", "search"), first
    await daemon.registry.plans_settled()
    async with client.get("/v1/status") as response:
        settled = (await response.json())["models"]["tiny"]["versions"]["1"]["plan"]
    assert settled["source"] == "search" and settled["figures"], settled
    x = np.zeros((1, 3, 8, 8), np.float32)
    async with client.post("/v2/models/tiny/infer", json=infer_body(x)) as response:
        assert response.status == 200
