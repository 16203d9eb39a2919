"""``edgeagent hub train`` on a detector: the zoo's grid detector, shown night-camera scenes it
was never trained on, gets its head retrained on the boxes reviewers drew at the hub, scored
before and after on the held-out ones, packaged with its own head and signed as a canary."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from PIL import Image

from devtools.detection_scenes import load_heldout, night
from devtools.sample_hub import SampleHub
from edgeagent.capture.service import sample_record
from edgeagent.cli import main
from edgeagent.engine.hooks import InferenceEvent
from edgeagent.models.package import load_package
from tests.integration.test_capture_hub import (  # noqa: F401  (hub: the fixture)
    ADMIN,
    BUILD_PYTHON,
    REPO,
    _device,
    _signed_canary,
    hub,
)

ZOO_DETECTOR = REPO / "zoo" / "shapes_grid_mnv2"
REVIEWED, UNREVIEWED = 40, 6
HEAD_CONVOLUTIONS = {"head.0.0.0", "head.0.1.0", "head.1.0.0", "head.1.1.0", "predict"}


def _jpeg(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


async def _captured_and_reviewed(tmp_path: Path, hub: SampleHub) -> None:  # noqa: F811
    """Night scenes captured on a device with an empty answer (the model saw nothing), then
    drawn by a reviewer; a few daytime scenes stay unreviewed, for the old head to teach."""
    scenes = load_heldout(ZOO_DETECTOR, REVIEWED + UNREVIEWED)
    images = np.concatenate([night(scenes.images[:REVIEWED]), scenes.images[REVIEWED:]])
    spool, _, uploader = _device(tmp_path, "dev-a", hub.url)
    truth = {}
    for index, pixels in enumerate(images):
        at = 1_700_000_000.0 + index
        event = InferenceEvent(
            "shapes_grid_mnv2",
            "1.0.0",
            "detection",
            "onnxruntime/fp32@cpu",
            b"",
            {"detections": []},
            at=at,
        )
        sample_id = f"{int(at * 1000):013d}-{index:016x}"  # fixed ids: the same split every run
        record = sample_record(event, "dev-a", sample_id, 1.0, (96, 96), 0)
        spool.write(sample_id, record, _jpeg(pixels))
        truth[sample_id] = index
    assert await uploader.run_once() == REVIEWED + UNREVIEWED
    labels = load_package(ZOO_DETECTOR).labels
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        for row in await hub.rows():
            index = truth[row["sample_id"]]
            if index >= REVIEWED:
                continue
            drawn = [
                {"label": labels[int(c)], "box": [round(float(v), 1) for v in box]}
                for box, c in zip(scenes.boxes[index], scenes.labels[index], strict=True)
            ]
            body = {"status": "corrected", "detections": drawn}
            async with http.post(f"{hub.url}/ui/samples/{row['id']}/review", json=body) as r:
                assert r.status == 200, await r.text()


@pytest.mark.slow
@pytest.mark.skipif(not BUILD_PYTHON.exists(), reason="no .venv-build (torch) in this checkout")
async def test_a_detector_head_learns_the_night_scenes_reviewers_drew(
    tmp_path: Path,
    hub: SampleHub,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    import onnx
    import onnx.numpy_helper

    await _captured_and_reviewed(tmp_path, hub)
    assert await asyncio.to_thread(main, ["hub", "keygen", str(tmp_path / "keys")]) == 0
    capsys.readouterr()
    out = tmp_path / "retrained"
    command = ["hub", "train", "--state-dir", str(hub.state), "--model", "shapes_grid_mnv2"]
    command += ["--package", str(ZOO_DETECTOR), "--out", str(out), "--steps", "150"]
    command += ["--heldout-percent", "30", "--torch-python", str(BUILD_PYTHON)]
    command += ["--variants", "graph", "--key", str(tmp_path / "keys" / "release.key")]
    command += ["--base-url", "http://h:1", "--release-out", str(tmp_path / "releases"), "--json"]
    assert await asyncio.to_thread(main, command) == 0
    summary = json.loads(capsys.readouterr().out)
    training = summary["training"]
    assert summary["train"] + summary["heldout"] == REVIEWED
    assert summary["unreviewed"] == training["unlabelled"] == UNREVIEWED
    assert training["layers"] == len(HEAD_CONVOLUTIONS)
    # The old head finds few of the night scenes' shapes; the retrained one many more.
    assert training["heldout_map50_after"] >= training["heldout_map50_before"] + 0.05, training

    package, old = load_package(out), load_package(ZOO_DETECTOR)
    assert (package.name, package.version, package.task) == (
        "shapes_grid_mnv2",
        "1.1.0",
        "detection",
    )
    assert package.detection == old.detection and package.labels == old.labels
    assert package.preprocess is not None and package.preprocess.letterbox
    before = {
        i.name: onnx.numpy_helper.to_array(i)
        for i in onnx.load(str(ZOO_DETECTOR / "shapes_grid_mnv2.fp32.onnx")).graph.initializer
    }
    after = onnx.load(str(package.variant("onnxruntime", "fp32").files[0])).graph.initializer
    changed = {
        i.name.rsplit(".", 1)[0]  # "predict.bias", "head.0.0.0.weight_bias" …
        for i in after
        if not np.array_equal(before[i.name], onnx.numpy_helper.to_array(i))
    }
    assert changed == HEAD_CONVOLUTIONS  # the head's weights and biases, nothing before it
    assert _signed_canary(tmp_path / "releases")["version"] == "1.1.0"


ZOO_DIGITS = REPO / "zoo" / "digits_mnv3"


@pytest.mark.parametrize(
    ("model", "head_from", "refusal"),
    [
        (ZOO_DIGITS / "digits_mnv3.fp32.onnx", ZOO_DETECTOR, "are not shapes_grid_mnv2's"),
        (ZOO_DETECTOR / "shapes_grid_mnv2.fp32.onnx", ZOO_DIGITS, "declares no detector"),
    ],
)
def test_a_head_from_a_package_that_does_not_fit_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    model: Path,
    head_from: Path,
    refusal: str,
) -> None:
    out = tmp_path / "package"
    command = ["package", str(model), "--out", str(out), "--head-from", str(head_from)]
    assert main([*command, "--variants", "graph"]) != 0
    assert refusal in capsys.readouterr().err and not out.exists()


@pytest.mark.skipif(not BUILD_PYTHON.exists(), reason="no .venv-build (torch) in this checkout")
def test_the_detector_trainer_refuses_a_classifier(tmp_path: Path) -> None:
    trainer = REPO / "edgeagent" / "hub" / "train" / "detector_head.py"
    command = [str(BUILD_PYTHON), str(trainer), str(ZOO_DIGITS), "--train", str(tmp_path)]
    done = subprocess.run([*command, "--out", str(tmp_path / "x.onnx")], capture_output=True)
    assert done.returncode == 2 and b"not an image detector" in done.stderr
    assert not (tmp_path / "x.onnx").exists()
