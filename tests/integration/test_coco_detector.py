"""The zoo's COCO detector, served by ``edgeagent run``, finds real objects in real photos.

The package is the one scripts/setup.sh's "COCO detector" step builds (scripts/coco_detector.sh:
TF.js COCO-SSD, SSD MobileNetV2 trained on COCO, packaged without torch). A copy of it is served
by a daemon that names it ``[server] deepstack_model``, and is asked the way camera users ask:
the DeepStack route over the Unix socket, and Home Assistant's own client (``deepstack-python``)
over TCP with the token as ``api_key``. Answers are checked against boxes drawn by hand
(tests/fixtures/coco_photo_boxes.toml), not against the model's own output.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import tomllib
from deepstack.core import DeepstackObject

from devtools.agent_process import Agent
from devtools.ports import free_port
from devtools.zoo import zoo_dir
from edgeagent.models.tasks.detection import iou_matrix
from tests.support.helpers import REPO

PACKAGE = zoo_dir() / "coco_ssd"
PHOTOS = REPO / "third-party-models" / "photos"
HAND_LABELS = REPO / "tests" / "fixtures" / "coco_photo_boxes.toml"
TOKEN = "coco-test-token"
BOUNDARY = "coco-test"


def hand_labelled(photo: str, label: str) -> list[float]:
    """The box drawn by hand round the (first) ``label`` object in ``photo``."""
    photos = tomllib.loads(HAND_LABELS.read_text(encoding="utf-8"))["photo"]
    objects = next(p["objects"] for p in photos if p["file"] == photo)
    return next(o["box"] for o in objects if o["label"] == label)


def iou(a: list[float], b: list[float]) -> float:
    return float(iou_matrix(np.asarray([a], np.float32), np.asarray([b], np.float32))[0, 0])


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Agent, int]]:
    if not (PACKAGE / "model.toml").is_file() or not PHOTOS.is_dir():
        pytest.skip(f"{PACKAGE} missing: scripts/setup.sh's step 'COCO detector' builds it")
    root = tmp_path_factory.mktemp("coco")
    shutil.copytree(PACKAGE, root / "models" / "coco_ssd")
    config = root / "agent.toml"
    config.write_text(
        f'[agent]\nmodels_dir = "{root / "models"}"\n'
        f'[server]\ntoken = "{TOKEN}"\ndeepstack_model = "coco_ssd"\n',
        encoding="utf-8",
    )
    port = free_port()
    running = Agent(root, config, port=port)
    try:
        yield running, port
    finally:
        assert running.stop() == 0


def _detect_over_socket(agent: Agent, photo: str) -> dict:
    """``POST /v1/vision/detection`` as Frigate's plugin posts it: multipart, one image."""
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="f"\r\n\r\n'
    body = head.encode() + (PHOTOS / photo).read_bytes() + f"\r\n--{BOUNDARY}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    _, answer = agent.client.request("POST", "/v1/vision/detection", body, headers)
    return json.loads(answer)


def _corners(prediction: dict) -> list[float]:
    return [prediction[k] for k in ("x_min", "y_min", "x_max", "y_max")]


@pytest.mark.parametrize(("photo", "label"), [("astronaut.png", "person"), ("chelsea.png", "cat")])
def test_the_deepstack_route_finds_the_object_a_person_boxed(
    agent: tuple[Agent, int], photo: str, label: str
) -> None:
    answer = _detect_over_socket(agent[0], photo)
    assert answer["success"] is True, answer
    best = answer["predictions"][0]
    assert best["label"] == label, answer["predictions"]
    assert iou(_corners(best), hand_labelled(photo, label)) >= 0.5, best


def test_home_assistants_client_finds_the_astronaut(agent: tuple[Agent, int]) -> None:
    _, port = agent
    client = DeepstackObject("127.0.0.1", port, api_key=TOKEN, timeout=30, min_confidence=0.4)
    found = client.detect((PHOTOS / "astronaut.png").read_bytes())
    people = [p for p in found if p["label"] == "person"]
    assert people, found
    assert iou(_corners(people[0]), hand_labelled("astronaut.png", "person")) >= 0.5, people
    # and nothing a person did not draw: the helmet and the shuttle model are no COCO objects
    assert [p["label"] for p in found] == ["person"], found
