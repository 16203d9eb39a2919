"""The zoo's trained detector served over HTTP finds the objects of held-out scenes, through
the agent's own route and through DeepStack's, as Frigate would post them."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests

from devtools.detection_scenes import HeldOut, load_heldout
from edgeagent.models.package import ModelPackage
from edgeagent.models.tasks.detection import Detections
from edgeagent.models.tasks.detection_map import mean_average_precision
from tests.integration.test_zoo import ZOO, zoo_package
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
