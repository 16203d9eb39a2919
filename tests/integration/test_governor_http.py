"""The governor seen from outside: every action through the real HTTP API over a real socket,
and the closed loop holding a simulated chip under its limit while real inference runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from devtools.package import rehash_files
from devtools.waiting import until
from edgeagent.governor.engine_load import EngineLoad
from edgeagent.governor.service import GovernorService
from edgeagent.governor.settings import GovernorSettings
from edgeagent.hardware.profile import load_profiles
from tests.fixtures.thermal.trees import board, write
from tests.support.helpers import write_tiny_package
from tests.support.http_agent import AgentServer, unix_session

TJ = "sys/class/thermal/thermal_zone4/temp"


class GovernedAgent(AgentServer):
    """The test agent with a real GovernorService as its limits and status provider."""

    def __init__(
        self, tmp_path: Path, packages: list[Path], settings: GovernorSettings, root: Path
    ):
        super().__init__(tmp_path, packages, max_queue_delay_ms=5.0)
        orin = {p.name: p for p in load_profiles()}["jetson-orin"]
        self.governor = GovernorService(settings, orin, root, self.metrics, load=self.engine_load)

    @property  # type: ignore[override]
    def limits(self):  # type: ignore[no-untyped-def]
        return self.governor.limits()

    @limits.setter
    def limits(self, value: Any) -> None:
        """The governor decides; the base class's initial assignment is ignored."""

    @property  # type: ignore[override]
    def status_extra(self) -> dict:
        return {"governor": self.governor.snapshot()}

    @status_extra.setter
    def status_extra(self, value: Any) -> None:
        """Status comes from the governor."""

    def start(self) -> GovernedAgent:
        super().start()
        self.run(self.governor.start)
        return self

    def stop(self) -> None:
        self.run(self.governor.stop)
        super().stop()


def infer_body(priority: int | None = None, rows: int = 1) -> dict:
    data = np.random.default_rng(rows).random((rows, 3, 8, 8), dtype=np.float32)
    body: dict = {
        "inputs": [
            {"name": "input", "shape": list(data.shape), "datatype": "FP32", "data": data.tolist()}
        ]
    }
    if priority is not None:
        body["parameters"] = {"priority": priority}
    return body


async def wait_for_state(http: aiohttp.ClientSession, state: str, timeout: float = 10.0) -> dict:
    """The governor's status once it reports ``state`` (AssertionError after ``timeout``)."""
    governor: dict = {}

    async def reached() -> bool:
        async with http.get("/v1/status") as response:
            governor.update((await response.json())["governor"])
        return governor["state"] == state

    await until(reached, timeout)
    return governor


@pytest.fixture
def orin_agent(tmp_path: Path) -> Iterator[tuple[GovernedAgent, Path]]:
    root = board("jetson_orin", tmp_path)
    settings = GovernorSettings(interval_s=0.05, min_dwell_s=0.3)
    agent = GovernedAgent(tmp_path, [write_tiny_package(tmp_path / "tiny")], settings, root)
    agent.start()
    try:
        yield agent, root
    finally:
        agent.stop()


async def test_every_action_is_visible_through_the_http_api(orin_agent) -> None:  # type: ignore[no-untyped-def]
    agent, root = orin_agent
    async with unix_session(agent) as http:
        governor = await wait_for_state(http, "normal")
        assert governor["actions"] == [] and governor["temperatures"][0]["celsius"] == 50.25
        async with http.post("/v2/models/tiny/infer", json=infer_body(priority=3)) as response:
            assert response.status == 200  # a low-priority request runs while cool

        write(root, TJ, 91000)  # hot
        governor = await wait_for_state(http, "hot")
        assert governor["state"] == "hot", governor
        assert {"shedding", "batch_cap", "downloads_paused", "low_power"} <= set(
            governor["actions"]
        )
        # shed: low priority gets 503 with Retry-After and the reason
        async with http.post("/v2/models/tiny/infer", json=infer_body(priority=3)) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "10"
            error = (await response.json())["error"]
            assert "governor" in error and "tj-thermal 91.0 °C" in error
        # default priority still runs, and batches are capped at 1 row
        answers = await asyncio.gather(
            *(http.post("/v2/models/tiny/infer", json=infer_body()) for _ in range(8))
        )
        assert [a.status for a in answers] == [200] * 8
        async with http.get("/metrics") as response:
            text = await response.text()
        assert 'edgeagent_governor_state{state="hot"} 1.0' in text
        assert "edgeagent_governor_max_batch_size 1.0" in text
        assert 'edgeagent_governor_action_active{action="shedding"} 1.0' in text
        assert 'edgeagent_governor_temperature_celsius{sensor="zone:tj-thermal"} 91.0' in text
        assert _batches_over(text, 1) == 0  # the engine honoured the cap

        write(root, TJ, 98000)  # critical: everything is shed
        await wait_for_state(http, "critical")
        async with http.post("/v2/models/tiny/infer", json=infer_body(priority=1)) as response:
            assert response.status == 503 and "Retry-After" in response.headers

        write(root, TJ, 45000)  # cool again: after the dwell, back to normal and serving
        governor = await wait_for_state(http, "normal")
        assert governor["state"] == "normal" and governor["throttled_seconds"] > 0
        async with http.post("/v2/models/tiny/infer", json=infer_body(priority=3)) as response:
            assert response.status == 200


def _batches_over(metrics_text: str, rows: int) -> float:
    """Batches larger than ``rows`` in the engine's batch-size histogram."""
    total = below = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("edgeagent_batch_size_count"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("edgeagent_batch_size_bucket") and f'le="{float(rows)}"' in line:
            below += float(line.rsplit(" ", 1)[1])
    return total - below


def write_busy_package(root: Path, layers: int = 24, width: int = 1024) -> Path:
    """The tiny package's interface around a compute-heavy network (a few ms per inference:
    one square weight matrix applied ``layers`` times), so serving it keeps the device busy."""
    import onnx
    from onnx import TensorProto, helper

    package = write_tiny_package(root, name="busy")
    model_file = package / "busy.fp32.onnx"
    rng = np.random.default_rng(0)
    weights = {
        "w_in": rng.standard_normal((192, width)) / 14,
        "w": rng.standard_normal((width, width)) / np.sqrt(width),
        "w_out": rng.standard_normal((width, 4)),
    }
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w_in"], ["h0"]),
    ]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "w"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"]))
    nodes.append(helper.make_node("MatMul", [f"h{layers}", "w_out"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "busy",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor(name, TensorProto.FLOAT, w.shape, w.astype(np.float32).flatten())
            for name, w in weights.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(model_file))
    rehash_files(package)
    return package


def calibrated_chip(utilisation: float, limit: float, ambient: float) -> tuple[float, float]:
    """(heat_c, tau_s) of a simulated chip that the load measured unthrottled
    (``utilisation``) would heat to 15 °C above ``limit``, however loaded the machine running
    the test is, and that heats at 25 °C per second of device time whatever its heat (the
    time constant grows with it): one batch moves it as much on a slow machine as on a fast
    one, and a batch the OS stretched to 40 ms by 1 °C, not the 4 °C at which no controller
    could hold a 1 °C bound."""
    heat = (limit + 15.0 - ambient) / utilisation
    return heat, heat / 25.0


@pytest.mark.slow
async def test_closed_loop_holds_the_simulated_chip_under_its_limit(tmp_path: Path) -> None:
    limit, ambient = 70.0, 40.0
    settings = GovernorSettings(
        simulate=True,
        sim_root=tmp_path / "sim",
        interval_s=0.2,
        min_dwell_s=1.0,
        sim_ambient_c=ambient,
        sim_heat_c=0.0,  # cold until the load is measured (below)
        sim_tau_s=2.0,
        sim_noise_c=0.0,
        sim_warm_c=limit - 10,
        sim_hot_c=limit,
        sim_critical_c=limit + 10,
    )
    agent = GovernedAgent(tmp_path, [write_busy_package(tmp_path / "busy")], settings, Path("/"))
    agent.start()
    simulator = agent.governor.simulator
    assert simulator is not None
    trace: list[tuple[float, float, float]] = []  # (t, °C, utilisation)
    try:
        async with unix_session(agent) as http:

            async def client() -> None:
                while time.monotonic() < end:
                    async with http.post("/v2/models/busy/infer", json=infer_body()) as reply:
                        await reply.read()

            # How busy this load keeps the device on this machine now, unthrottled: the chip
            # is sized to it, so that the same load overheats it on a fast or a loaded machine.
            probe = EngineLoad(agent.engine_load)
            end = time.monotonic() + 16.0
            clients = [asyncio.create_task(client()) for _ in range(6)]
            await asyncio.sleep(0.5)  # the clients' first requests are in
            probe.sample()
            await asyncio.sleep(1.5)
            unthrottled = probe.sample()
            assert unthrottled > 0.05, "the load hardly ran: nothing to throttle"
            simulator.heat_c, simulator.tau_s = calibrated_chip(unthrottled, limit, ambient)
            start = time.monotonic()
            end = start + 14.0
            while time.monotonic() < end:
                trace.append(
                    (time.monotonic() - start, simulator.temperature_c, agent.governor.utilisation)
                )
                await asyncio.sleep(0.1)
            await asyncio.gather(*clients)
            async with http.get("/v1/status") as response:
                governor = (await response.json())["governor"]
    finally:
        agent.stop()
    early = [u for t, _, u in trace if 0.5 < t < 1.5]
    # the control experiment: unthrottled, this load would settle far above the limit
    assert simulator.steady_state_c(max(early)) > limit + 5, (early, unthrottled)
    assert max(c for _, c, _ in trace) > limit - 10  # the load really heated the chip
    assert max(c for _, c, _ in trace) <= limit + 1.0  # ...and the governor held it
    assert governor["simulator"]["temperature_c"] <= limit + 1.0
    assert governor["duty_cycle"] < 1.0 and "pacing" in governor["actions"]
    late = [c for t, c, _ in trace if t > 8]
    assert min(late) > limit - 10  # held near the limit, not throttled to a standstill
