"""The zoo's trained detector served over HTTP finds the objects of held-out scenes, through
the agent's own route and through DeepStack's, as Frigate would post them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from devtools.detection_scenes import HeldOut, load_heldout
from devtools.package import set_fields
from edgeagent.cli import main
from edgeagent.models.package import ModelPackage
from edgeagent.models.tasks.detection import Detections
from edgeagent.models.tasks.detection_map import mean_average_precision
from tests.integration.test_zoo import ZOO, zoo_package
from tests.support.helpers import write_tiny_package
from tests.support.http_agent import TOKEN, AgentServer

NAME = "shapes_grid_mnv2"
SCENES = 60  # enough objects (about 150) for a stable figure, quick to post
MIN_SERVED_MAP = 0.85


@pytest.fixture(scope="module")
def package() -> ModelPackage:
    return zoo_package(NAME)


@pytest.fixture(scope="module")
def scenes(package: ModelPackage) -> HeldOut:
    return load_heldout(ZOO / NAME, SCENES)


@pytest.fixture(scope="module")
def agent(package: ModelPackage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    root = tmp_path_factory.mktemp("zoo-detector")
    server = AgentServer(root, [ZOO / NAME], deepstack_model=NAME).start()
    try:
        yield server
    finally:
        server.stop()


def detect(agent: AgentServer, png: bytes, min_score: float | None = None) -> dict:
    query = "" if min_score is None else f"?min_score={min_score}"
    response = requests.post(
        f"{agent.url}/v1/models/{NAME}/detect{query}",
        data=png,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "image/png"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def as_detections(rows: list[dict]) -> Detections:
    """The ``detections`` of a /detect answer as the mAP function takes them."""
    return Detections(
        np.asarray([r["box"] for r in rows], np.float32).reshape(-1, 4),
        np.asarray([r["score"] for r in rows], np.float32),
        np.asarray([r["index"] for r in rows], np.int64),
    )


def test_detect_finds_the_objects_of_held_out_scenes(
    agent: AgentServer, package: ModelPackage, scenes: HeldOut
) -> None:
    found = []
    for index in range(len(scenes.images)):
        answer = detect(agent, scenes.png(index))
        assert answer["image_size"] == [96, 96] and answer["model_name"] == NAME
        found.append(as_detections(answer["detections"]))
    served = mean_average_precision(found, scenes.boxes, scenes.labels, len(package.labels))
    assert served >= MIN_SERVED_MAP


def test_deepstack_answers_what_detect_answers(
    agent: AgentServer, package: ModelPackage, scenes: HeldOut
) -> None:
    """Frigate's request (multipart ``image``, ``api_key`` form field): the same objects, with
    integer pixel boxes and label names, as the agent's own route."""
    labels = package.labels
    for index in range(10):
        png = scenes.png(index)
        response = requests.post(
            agent.url + "/v1/vision/detection",
            data={"api_key": TOKEN},
            files={"image": png},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        expected = detect(agent, png, min_score=0.4)["detections"]  # DeepStack's default
        assert [p["label"] for p in predictions] == [d["label"] for d in expected]
        for prediction, detection in zip(predictions, expected, strict=True):
            corners = [prediction[k] for k in ("x_min", "y_min", "x_max", "y_max")]
            np.testing.assert_allclose(corners, detection["box"], atol=1.0)
            assert prediction["label"] in labels
        assert len(predictions) >= len(scenes.boxes[index]) - 1  # finds (nearly) every object


def test_cli_infer_on_a_detector_answers_boxes_like_detect(
    agent: AgentServer, scenes: HeldOut, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edgeagent infer` on a detector answers what /detect answers, in process and through
    the agent (it used to print top-k over the first output, as if boxes were classes)."""
    image = tmp_path / "scene.png"
    image.write_bytes(scenes.png(0))
    served = detect(agent, scenes.png(0))
    assert served["detections"], "the held-out scene has objects"
    remote = ["infer", NAME, str(image), "--socket", str(agent.socket), "--json"]
    assert main(remote) == 0
    (through,) = json.loads(capsys.readouterr().out)
    assert through["detections"] == served["detections"]
    assert through["image_size"] == [96, 96] and "top_k" not in through
    variant = ["--runtime", served["backend"], "--precision", served["precision"]]
    local = ["infer", NAME, str(image), "--models-dir", str(ZOO), "--json", *variant]
    assert main(local) == 0
    (here,) = json.loads(capsys.readouterr().out)
    assert [d["label"] for d in here["detections"]] == [d["label"] for d in served["detections"]]
    for mine, theirs in zip(here["detections"], served["detections"], strict=True):
        np.testing.assert_allclose(mine["box"], theirs["box"], atol=0.5)
    text_only = ["infer", NAME, str(image), "--models-dir", str(ZOO), *variant, "--top-k", "1"]
    assert main(text_only) == 0  # as text, the best box only
    text = capsys.readouterr().out.splitlines()
    assert text[1] == "  1 object(s) in 96x96:"
    best = here["detections"][0]
    assert text[2].startswith(f"  {best['score']:7.2%}  {best['label']}  [") and len(text) == 3


def test_cli_infer_refuses_a_model_of_another_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_tiny_package(tmp_path / "tiny")
    set_fields(root, {"task": "segmentation"})
    image = tmp_path / "x.png"
    image.write_bytes(b"")
    assert main(["infer", str(root), str(image), "--runtime", "onnxruntime"]) == 2
    assert "is a segmentation model" in capsys.readouterr().err
