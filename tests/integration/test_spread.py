"""One model on two simulated accelerators (issue 28): the hardware façade spreads it over both
devices, the faster one takes more, a device that goes away leaves the rotation while the other
answers every request, and comes back after its re-probe; the daemon shows it all over HTTP."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from devtools.package import read_model_toml, write_model_toml
from devtools.simulated_runtime import install_simulated
from devtools.waiting import until
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.hardware.instances import InstanceGroup
from edgeagent.hardware.service import Accelerators
from edgeagent.models.package import PackageError, load_package
from edgeagent.runtimes import RuntimeLoadError
from edgeagent.sections import ConfigError
from tests.support.hardware import FIXTURES, board_accelerators, write_profile
from tests.support.helpers import serving_registry, write_tiny_package

SIMS = ["onnxruntime:SIM0:fp32", "onnxruntime:SIM1:fp32"]


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


def accelerators(tmp_path: Path, **settings) -> Accelerators:
    return board_accelerators(tmp_path, SIMS, **settings)


def serving(root: Path, **values) -> Path:
    data = read_model_toml(root)
    data.setdefault("serving", {}).update(values)
    write_model_toml(root, data)
    return root


def frames(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(count)]


async def closed_loop(model, xs: list[np.ndarray], clients: int = 16) -> list:
    """Each client sends its next request when the last is answered; answers in ``xs`` order."""
    answers: list = [None] * len(xs)

    async def client(first: int) -> None:
        for i in range(first, len(xs), clients):
            answers[i] = (await model.infer({"input": xs[i]}))["logits"]

    await asyncio.gather(*(client(i) for i in range(clients)))
    return answers


async def test_the_faster_device_takes_more_and_a_lost_device_loses_no_request(
    tmp_path, executor, monkeypatch
):
    sim = install_simulated(monkeypatch, {"SIM0": 0.004, "SIM1": 0.012})
    hardware = accelerators(tmp_path, spread=2, reprobe_backoff_s=0.1)
    registry = serving_registry(hardware.open, executor=executor)
    registry.add(serving(write_tiny_package(tmp_path / "models" / "tiny"), max_batch_size=1))
    await registry.load_all()
    try:
        model = registry.get("tiny")
        group = model.session
        assert isinstance(group, InstanceGroup) and model.plan.instances == 2
        xs = frames(64)
        expected = [(await model.infer({"input": x}))["logits"] for x in xs[:4]]
        answers = await closed_loop(model, xs)
        for answer, want in zip(answers, expected, strict=False):  # real outputs, each its own
            np.testing.assert_allclose(answer, want, rtol=1e-5, atol=1e-6)
        shown = hardware.report()["models"]["tiny:1"]["instances"]
        assert [s["device"] for s in shown] == ["SIM0", "SIM1"]
        assert shown[0]["batches"] > shown[1]["batches"] >= 1  # 3× as fast: most, not all

        sim.unplug("SIM0")  # the fast device goes away under load
        answers = await closed_loop(model, frames(48))
        assert len(answers) == 48  # every request answered, by SIM1
        report = hardware.report()["models"]["tiny:1"]
        assert report["instances"][0]["available"] is False
        assert any(e["candidate"] == SIMS[0] for e in report["demotions"])
        assert sim.sim["SIM1"].batches > 0

        sim.plug("SIM0")  # back after its re-probe: in the rotation again
        await until(lambda: group.scheduler.instances[0].available, what="SIM0 re-probed")
        before = group.scheduler.instances[0].batches
        await closed_loop(model, frames(32))
        assert group.scheduler.instances[0].batches > before
    finally:
        await registry.close()


def test_the_devices_of_a_spread_and_its_refusals(tmp_path, monkeypatch):
    install_simulated(monkeypatch, {"SIM0": 0.0, "SIM1": 0.0})
    root = write_tiny_package(tmp_path / "models" / "tiny")
    package = load_package(root)
    named = accelerators(tmp_path, spread=["SIM1"]).open(package)
    assert [lane.device for lane in named.lanes] == ["SIM1"]  # the chooser's SIM0 is not named
    named.close()
    with pytest.raises(RuntimeLoadError, match=r"SIM7.*devices of profile test: SIM0, SIM1"):
        accelerators(tmp_path, spread=["SIM7"]).open(package)
    one = accelerators(tmp_path, spread=2).open(load_package(serving(root, spread=1)))
    assert not isinstance(one, InstanceGroup)  # model.toml [serving] spread wins
    one.close()
    for bad in ("spread = 0", "spread = []", 'spread = ["CPU", "CPU"]', "spread = true"):
        with pytest.raises(ConfigError, match=r"\[hardware\] spread"):
            parse_config(f"[hardware]\n{bad}\n")
    for bad in (0, [], ["NPU", ""], True):
        serving(root, spread=bad)
        with pytest.raises(PackageError, match="spread"):
            load_package(root)


async def test_the_daemon_serves_one_model_on_two_devices(tmp_path, monkeypatch):
    install_simulated(monkeypatch, {"SIM0": 0.002, "SIM1": 0.002})
    write_profile(tmp_path / "profiles", "test", SIMS)
    serving(write_tiny_package(tmp_path / "models" / "tiny"), plan="fixed", instances=1)
    daemon = Daemon(
        parse_config(
            f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
            f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
            f"[hardware]\nroot = '{FIXTURES / 'generic-x86_64'}'\n"
            f"profiles_dir = '{tmp_path / 'profiles'}'\nprofile = 'test'\nspread = 2\n"
        )
    )
    await daemon.start()
    connector = aiohttp.UnixConnector(path=str(tmp_path / "agent.sock"))
    try:
        async with aiohttp.ClientSession(connector=connector, base_url="http://agent") as http:

            async def infer(x: np.ndarray) -> dict:
                body = {"inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                    "data": x.ravel().tolist()}]}  # fmt: skip
                async with http.post("/v2/models/tiny/infer", json=body) as response:
                    assert response.status == 200, await response.text()
                    return await response.json()

            await asyncio.gather(*(infer(x) for x in frames(24)))
            async with http.get("/v1/status") as response:
                status = await response.json()
            version = status["models"]["tiny"]["versions"]["1"]
            assert version["plan"]["instances"] == 2
            shown = version["session"]["instances"]
            assert [s["device"] for s in shown] == ["SIM0", "SIM1"]
            assert sum(s["rows"] for s in shown) >= 24 and all(s["batches"] for s in shown)
            assert all(s["active"]["device"] in ("SIM0", "SIM1") for s in shown)
            assert [lane["device"] for lane in version["session"]["spread"]] == ["SIM0", "SIM1"]
            async with http.get("/metrics") as response:
                text = await response.text()
            assert 'edgeagent_execution_instance{device="SIM1",field="share"' in text
    finally:
        await daemon.stop()
