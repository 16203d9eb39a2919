"""Frigate's own zmq detector plugin (``tests/fixtures/frigate``: its file verbatim, only the
Frigate modules it imports stood in for) against the daemon with ``[zmq]`` enabled on an IPC
endpoint, as Frigate runs it with ``detectors: {remote: {type: zmq, endpoint: …}}``.

The served detector is the toy whose rows are known to the pixel (``toy_detector``): a 128×64
frame letterboxed into its 64×64 input gives a cat (0.9) and a dog (0.6) at known boxes, which
come back in Frigate's 20×6 rows as fractions of the frame."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from devtools.package import read_model_toml, write_model_toml
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.sections import ConfigError
from tests.support.hardware import FIXTURES, write_profile
from tests.support.helpers import REPO
from tests.support.toy_detector import CAT, DOG, write_toy_detector

FIXTURE = REPO / "tests" / "fixtures" / "frigate"
VERBATIM = {  # see tests/fixtures/frigate/README.md
    "detectors/plugins/zmq_ipc.py": "a7196d7827a05e66ee28611ac963b4bc"
    "b16a6f851eb43a55d5a659cbb1b05018",
    "detectors/detection_api.py": "454266e22834bc455d2ae34032d5d19c"
    "760aa3d96359664d4f986b49d10e0f79",
}
WIDTH, HEIGHT = 128, 64


@pytest.fixture(scope="module")
def frigate() -> Iterator[Any]:
    for path, digest in VERBATIM.items():
        data = (FIXTURE / "frigate" / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, f"{path} is not Frigate's file"
    sys.path.insert(0, str(FIXTURE))
    try:
        from frigate.detectors.detector_config import ModelConfig
        from frigate.detectors.plugins import zmq_ipc

        yield zmq_ipc, ModelConfig
    finally:
        sys.path.remove(str(FIXTURE))
        for name in [m for m in sys.modules if m == "frigate" or m.startswith("frigate.")]:
            del sys.modules[name]


def _config(tmp_path: Path, endpoint: str) -> str:
    return (
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
        f"[hardware]\nroot = '{FIXTURES / 'generic-x86_64'}'\n"
        f"profiles_dir = '{tmp_path / 'profiles'}'\nprofile = 'test'\n"
        f"[zmq]\nenabled = true\nendpoint = '{endpoint}'\nmodel = 'toy'\n"
    )


async def test_frigates_zmq_plugin_gets_the_agents_detections(tmp_path: Path, frigate) -> None:
    zmq_ipc, ModelConfig = frigate
    write_profile(tmp_path / "profiles", "test", ["onnxruntime:CPU:fp32"])
    root = write_toy_detector(tmp_path / "models" / "toy")
    data = read_model_toml(root)
    data["serving"] = {"plan": "fixed", "instances": 1}
    write_model_toml(root, data)
    endpoint = f"ipc://{tmp_path / 'zmq_detector'}"
    daemon = Daemon(parse_config(_config(tmp_path, endpoint)))
    await daemon.start()
    try:
        config = zmq_ipc.ZmqDetectorConfig(
            type="zmq",
            endpoint=endpoint,
            request_timeout_ms=20_000,  # a busy CI box; Frigate's default is 200
            model=ModelConfig(
                path="/config/model_cache/frigate.tflite", width=WIDTH, height=HEIGHT
            ),
        )
        frame = np.full((1, HEIGHT, WIDTH, 3), (30, 90, 150), np.uint8)  # Frigate's NHWC uint8

        def frigate_detects() -> tuple[bool, np.ndarray, np.ndarray]:
            detector = zmq_ipc.ZmqIpcDetector(config)  # asks whether the model is there
            good = detector.detect_raw(frame)
            wrong = detector.detect_raw(frame.astype(np.float32))  # a dtype it cannot take
            return detector._model_ready, good, wrong

        ready, rows, wrong = await asyncio.to_thread(frigate_detects)
        assert ready  # the agent's model answered Frigate's model request: no file was sent
        assert rows.shape == (20, 6) and rows.dtype == np.float32
        for row, box, (label, score) in zip(rows, (CAT, DOG), ((0, 0.9), (1, 0.6)), strict=False):
            x0, y0, x1, y1 = box
            expected = [label, score, y0 / HEIGHT, x0 / WIDTH, y1 / HEIGHT, x1 / WIDTH]
            np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-5)
        assert not rows[2:].any()  # the 0.2 row is below [zmq] min_score 0.4
        assert not wrong.any()  # refused, answered with zero rows as Frigate expects
        connector = aiohttp.UnixConnector(path=str(tmp_path / "agent.sock"))
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get("http://agent/v1/status") as response,
        ):
            shown = (await response.json())["zmq"]
        assert (shown["frames"], shown["refused"], shown["model"]) == (1, 1, "toy")
        assert "only uint8" in shown["last_error"]
    finally:
        await daemon.stop()
    assert not (tmp_path / "zmq_detector").exists()  # its socket is removed on stop


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("tcp://0.0.0.0:5555", "no authentication"),
        ("tcp://127.0.0.1", "needs a port"),
        ("udp://127.0.0.1:5555", "must be ipc://PATH or tcp://HOST:PORT"),
    ],
)
def test_an_endpoint_off_the_machine_or_malformed_is_refused(endpoint: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_config(f"[zmq]\nenabled = true\nendpoint = '{endpoint}'\n")
    assert parse_config("[zmq]\nendpoint = 'tcp://127.0.0.1:5555'\n").zmq.enabled is False
