"""The hardware façade under the real serving engine: failover and power mode, no failed request."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from devtools.waiting import until
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from tests.support.hardware import (
    board_accelerators,
    install_flaky,
    write_multi_package,
)
from tests.support.helpers import serving_registry

ORT = "onnxruntime:CPUExecutionProvider:fp32"
OV = "openvino:CPU:fp32"


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


def _setup(tmp_path: Path, executor, candidates: list[str], limits=lambda: UNTHROTTLED):
    accelerators = board_accelerators(tmp_path, candidates, reprobe_backoff_s=60.0)
    registry = serving_registry(accelerators.open, executor=executor, limits=limits)
    registry.add(
        write_multi_package(
            tmp_path / "models" / "tiny", [("onnxruntime", "fp32"), ("openvino", "fp32")]
        )
    )
    return accelerators, registry


def _frames(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(9)
    return [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(count)]


async def test_device_failure_under_load_fails_no_request(tmp_path, executor, monkeypatch):
    flaky = install_flaky(monkeypatch)
    flaky.good_calls = 6  # the probe, the warm-up and a few batches, then the device is gone
    accelerators, registry = _setup(tmp_path, executor, [ORT, OV])
    await registry.load_all()
    try:
        model = registry.get("tiny")
        assert model.backend["runtime"] == "onnxruntime"
        frames = _frames(120)
        answers = []
        for start in range(0, len(frames), 20):  # waves of concurrent requests
            wave = frames[start : start + 20]
            answers += await asyncio.gather(*(model.infer({"input": f}) for f in wave))
        assert all(a["logits"].shape == (1, 4) for a in answers)
        assert model.backend == {"runtime": "openvino", "device": "CPU", "precision": "fp32"}
        status = accelerators.report()["models"]["tiny:1"]
        assert status["active"]["candidate"] == OV
        assert status["demotions"][0]["candidate"] == ORT
    finally:
        await registry.close()


async def test_governor_prefer_low_power_switches_the_candidate(tmp_path, executor):
    limits = {"now": UNTHROTTLED}
    _, registry = _setup(tmp_path, executor, [ORT, f"{OV}:low"], lambda: limits["now"])
    await registry.load_all()
    try:
        model = registry.get("tiny")
        frame = _frames(1)[0]
        expected = (await model.infer({"input": frame}))["logits"]
        assert model.backend["runtime"] == "onnxruntime"
        limits["now"] = ServingLimits(prefer_low_power=True, reason="hot: test")
        await model.infer({"input": frame})  # the engine reads the limits before the batch
        await until(lambda: model.backend["runtime"] == "openvino")
        answer = (await model.infer({"input": frame}))["logits"]
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)
    finally:
        await registry.close()
